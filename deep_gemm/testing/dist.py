"""Simulated ranks on one machine: ``spawn`` starts R processes as torch.multiprocessing.spawn does for DeepEP and
DeepGEMM tests, ``init_dist`` gives each its (rank, num_ranks, group), as their tests' ``init_dist`` does.

    def test(local_rank, num_local_ranks, args):
        rank, num_ranks, group = deep_gemm.testing.init_dist(local_rank, num_local_ranks)
        buf = deep_gemm.ep.SymmetricBuffer(group, 1 << 20)
        ...
        return something_picklable

    results = deep_gemm.testing.spawn(test, 4, args)     # [result of rank 0, ..., rank 3]

(``fn`` and ``args`` are pickled to the ranks: a module-level function; in a script, call spawn under
``if __name__ == "__main__":``, as with multiprocessing.)

- ``spawn(fn, num_ranks, *args, timeout=600, start_method="spawn", backend=None)`` calls
  ``fn(rank, num_ranks, *args)`` in each of ``num_ranks`` fresh processes ("spawn" or "forkserver") and returns the
  ranks' return values. An exception in a rank is raised in the parent as ``RankFailedError`` (the rank's traceback
  in the message, the exception itself as ``__cause__`` when it pickles); a rank that dies (SIGKILL, segfault,
  ``os._exit``) makes the others' waits fail with ``RankFailedError`` within a poll (never a hang), and the parent
  kills any rank still alive after a grace period. Every /dev/shm segment of the run (``dg_<run id>_*``) is
  unlinked when spawn returns or raises; ``RankFailedError.prefix`` names the run's prefix.
- ``init_dist(local_rank, num_local_ranks, seed=0, backend=None, timeout=None)`` -> ``(rank, num_ranks, group)``:
  inside a spawned rank, ``backend=None`` (or "shm") gives the run's shared-memory group (no torch needed), and
  ``backend="gloo"`` initialises torch.distributed (through a file store of the run) and returns a gloo
  ProcessGroup, which every ``group=`` argument here accepts. Outside spawn, "gloo" reads the usual
  ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` (nodes) and ``RANK`` (node rank) as DeepEP's does, and
  ``backend=None`` with one rank gives a world of one. ``seed`` seeds numpy (and torch when imported).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import tempfile
import time
import traceback

from ..ep import _shm
from ..ep.group import (
    DEFAULT_TIMEOUT,
    STATUS_NEW,
    LocalGroup,
    RankFailedError,
    ShmGroup,
    as_group,
    control_nbytes,
    init_control,
    raise_abort,
    rank_status,
    read_abort,
    set_default_group,
)

GRACE_PERIOD = 30.0  # seconds the supervisor lets surviving ranks report after one failed, before killing them
_CONTEXT: dict = {}  # inside a spawned rank: what its bootstrap was told


class _RankResult:
    __slots__ = ("ok", "value", "error", "text")

    def __init__(self, ok, value=None, error=None, text=""):
        self.ok, self.value, self.error, self.text = ok, value, error, text


def _bootstrap(conn, context: dict, fn, args) -> None:
    """A rank's main: join the group, run ``fn``, report through ``conn`` (the parent watches the exit code)."""
    _CONTEXT.clear()
    _CONTEXT.update(context)
    rank, num_ranks = context["rank"], context["num_ranks"]
    # NOTES: a warm-up helper per compiling rank (jit/warmup.py) is a second process per rank: when the ranks and
    # their helpers would outnumber the CPUs, the helpers only compete with the ranks.
    from ..jit.warmup import share_cpus_with

    share_cpus_with(num_ranks)
    group = None
    try:
        group = ShmGroup(context["control"], context["prefix"], rank, num_ranks, context["timeout"],
                         parent_pid=context["parent_pid"])
        _CONTEXT["group"] = group
        set_default_group(group)
        value = fn(rank, num_ranks, *args)
        result = _RankResult(True, value)
    except BaseException as exc:  # noqa: BLE001 - everything a rank raises goes to the parent
        if group is not None:
            group.finish(False)
        result = _RankResult(False, None, exc, traceback.format_exc())
    else:
        group.finish(True)
    try:
        conn.send(result)
    except Exception as exc:  # an unpicklable value or exception: send its text
        conn.send(_RankResult(False, None, None, f"rank {rank}: result could not be sent: {exc!r}\n{result.text}"))
    conn.close()
    os._exit(0 if result.ok else 1)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code} without reporting"


def spawn(fn, num_ranks: int, *args, timeout: float = 600.0, start_method: str = "spawn",
          backend: str | None = None, rank_timeout: float | None = None) -> list:
    """Run ``fn(rank, num_ranks, *args)`` on ``num_ranks`` processes; the list of their return values.

    ``timeout``: seconds for the whole run (then every rank is killed and ``RankFailedError`` raised);
    ``rank_timeout``: seconds one barrier waits (default ``timeout``); ``backend``: what ``init_dist``
    gives inside the ranks when called with ``backend=None`` ("shm" default, or "gloo")."""
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, int) or not 0 < num_ranks < 256:
        raise ValueError(f"spawn needs 0 < num_ranks < 256: {num_ranks=}")
    if start_method not in ("spawn", "forkserver"):
        raise ValueError(f"start_method must be 'spawn' or 'forkserver' (fork would share the parent's threads): "
                         f"{start_method=}")
    if backend not in (None, "shm", "gloo"):
        raise ValueError(f"backend must be None, 'shm' or 'gloo': {backend=}")
    if not callable(fn):
        raise TypeError(f"spawn needs a callable: {fn=}")

    # Run state: a control segment under a fresh prefix, a file store for gloo
    ctx = multiprocessing.get_context(start_method)
    prefix = _shm.new_run_prefix()
    control = f"{prefix}ctl"
    mm = store_dir = None
    procs, conns, results = [], [], [None] * num_ranks
    first_failure: tuple[int, str] | None = None
    try:
        mm = _shm.create(control, control_nbytes(num_ranks))
        init_control(mm, num_ranks)
        store_dir = tempfile.mkdtemp(prefix=prefix)
        context = dict(num_ranks=num_ranks, prefix=prefix, control=control, parent_pid=os.getpid(),
                       timeout=float(rank_timeout if rank_timeout is not None else timeout),
                       backend=backend or "shm", store=os.path.join(store_dir, "gloo_store"))

        # Launch
        for rank in range(num_ranks):
            parent_end, child_end = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_bootstrap, args=(child_end, dict(context, rank=rank), fn, args),
                               name=f"deep_gemm-rank{rank}", daemon=True)
            proc.start()
            child_end.close()
            procs.append(proc)
            conns.append(parent_end)

        # Supervise: collect reports, notice deaths, abort the group on the first failure
        deadline = time.monotonic() + timeout
        kill_at = None
        pending = set(range(num_ranks))
        control_named = True
        while pending:
            # NOTES: once every rank has mapped the control segment its name is not needed: unlinking it now leaves
            # nothing in /dev/shm even if this process is killed before its finally block runs.
            if control_named and (rank_status(mm, num_ranks) != STATUS_NEW).all():
                _shm.unlink(control)
                control_named = False
            ready = multiprocessing.connection.wait([conns[r] for r in pending], timeout=0.05)
            for conn in ready:
                rank = conns.index(conn)
                try:
                    results[rank] = conn.recv()
                except (EOFError, OSError):
                    procs[rank].join(5)
                    results[rank] = _RankResult(False, text=f"rank {rank} {_describe_exit(procs[rank].exitcode)}")
                pending.discard(rank)
                if not results[rank].ok and first_failure is None:
                    first_failure = (rank, results[rank].text.strip().splitlines()[-1] if results[rank].text else "")
            for rank in list(pending):
                if not procs[rank].is_alive() and not conns[rank].poll():
                    procs[rank].join()
                    results[rank] = _RankResult(False, text=f"rank {rank} {_describe_exit(procs[rank].exitcode)}")
                    pending.discard(rank)
                    if first_failure is None:
                        first_failure = (rank, results[rank].text)
            if first_failure is not None and kill_at is None:
                raise_abort(mm, first_failure[0], f"rank {first_failure[0]} failed ({first_failure[1]})")
                kill_at = time.monotonic() + GRACE_PERIOD
            now = time.monotonic()
            if pending and (now > deadline or (kill_at is not None and now > kill_at)):
                why = f"spawn timed out after {timeout} s" if now > deadline else "did not stop after a peer failed"
                if first_failure is None:
                    first_failure = (min(pending), why)
                raise_abort(mm, first_failure[0], why)
                for rank in pending:
                    procs[rank].kill()
                    procs[rank].join()
                    results[rank] = _RankResult(False, None, None, f"rank {rank} killed by the supervisor: {why}")
                pending.clear()
        # NOTES: reports arrive in any order: a rank that failed only because a peer aborted the group may report
        # first. The abort word names the rank that raised it first (first writer wins), the root cause.
        aborted, culprit, _ = read_abort(mm)
        if (aborted and first_failure is not None and culprit != first_failure[0] and 0 <= culprit < num_ranks
                and results[culprit] is not None and not results[culprit].ok):
            text = results[culprit].text
            first_failure = (culprit, text.strip().splitlines()[-1] if text else "")
        for proc in procs:
            proc.join(5)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in conns:
            conn.close()
        _shm.unlink_all(prefix)
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass
        if store_dir is not None:
            shutil.rmtree(store_dir, ignore_errors=True)

    # Results
    if first_failure is None and all(r is not None and r.ok for r in results):
        return [r.value for r in results]
    failed = first_failure[0] if first_failure is not None else -1
    lines = [f"rank {failed} of {num_ranks} failed; what each rank reported:"]
    for rank, r in enumerate(results):
        lines.append(f"--- rank {rank}: " + ("ok" if r is not None and r.ok else (r.text.rstrip() if r else "?")))
    error = RankFailedError("\n".join(lines), failed)
    error.prefix = prefix
    error.rank_errors = [None if r is None or r.ok else (r.error or r.text) for r in results]
    cause = results[failed].error if 0 <= failed < num_ranks and results[failed] is not None else None
    raise error from cause


def init_dist(local_rank: int = 0, num_local_ranks: int = 1, seed: int = 0, backend: str | None = None,
              timeout: float | None = None):
    """``(rank, num_ranks, group)`` for this process, as DeepEP's and DeepGEMM's test ``init_dist`` return."""
    import numpy as np

    np.random.seed(seed)
    torch = __import__("sys").modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)
    inside = bool(_CONTEXT)
    if inside and (local_rank, num_local_ranks) != (_CONTEXT["rank"], _CONTEXT["num_ranks"]):
        raise ValueError(f"init_dist inside a spawned rank takes its own rank and size: {local_rank=} "
                         f"{num_local_ranks=}, spawned as rank {_CONTEXT['rank']} of {_CONTEXT['num_ranks']}")
    backend = backend or (_CONTEXT.get("backend") if inside else None) or "shm"
    if backend not in ("shm", "gloo"):
        raise ValueError(f"backend must be None, 'shm' or 'gloo': {backend=}")

    # Shared-memory group (no torch)
    if backend == "shm":
        if inside:
            return _CONTEXT["rank"], _CONTEXT["num_ranks"], _CONTEXT["group"]
        if num_local_ranks != 1:
            raise ValueError(f"a shared-memory group of {num_local_ranks} ranks is made by deep_gemm.testing.spawn; "
                             f"outside it use backend='gloo' or one rank")
        group = as_group(None) if local_rank == 0 else None
        if group is None or not isinstance(group, LocalGroup):
            group = LocalGroup()
            set_default_group(group)
        return 0, 1, group

    # torch.distributed with gloo
    import datetime

    import torch.distributed as dist

    if inside:  # the run's own file store: the environment's cluster variables are not this run's
        num_nodes, node_rank, init_method = 1, 0, f"file://{_CONTEXT['store']}"
    else:
        num_nodes, node_rank = int(os.getenv("WORLD_SIZE", "1")), int(os.getenv("RANK", "0"))
        init_method = f"tcp://{os.getenv('MASTER_ADDR', '127.0.0.1')}:{int(os.getenv('MASTER_PORT', '8361'))}"
    wait = timeout if timeout is not None else (_CONTEXT["timeout"] if inside else DEFAULT_TIMEOUT)
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=init_method, world_size=num_nodes * num_local_ranks,
                                rank=node_rank * num_local_ranks + local_rank,
                                timeout=datetime.timedelta(seconds=wait))
    group = dist.new_group(list(range(num_nodes * num_local_ranks)), backend="gloo")
    return dist.get_rank(), dist.get_world_size(), group
