"""Process groups for simulated ranks: one interface over shared memory (no torch), over a torch.distributed
ProcessGroup (gloo, CPU), and for a world of one rank.

Interface every group offers (``as_group`` turns what a user passes as ``group`` into one of them):

- ``rank``, ``num_ranks`` (attributes); ``size()``, ``get_rank()``, ``get_world_size()``;
- ``barrier(timeout=None)``: every rank arrives, or ``RankFailedError`` (a peer crashed, was killed, finished
  without arriving, or the timeout passed) -- never a hang;
- ``all_gather_object(obj) -> list`` and ``broadcast_object(obj, src=0)``: small picklable objects;
- ``same_host``: True when every rank can map the others' /dev/shm segments (symmetric buffers need it);
- ``prefix``: the run's segment prefix (``dg_<id>_``) and ``new_segment_name(kind)``, the same on every rank when
  called in the same collective order;
- ``all_to_all_bytes(blocks) -> list``: rank r's ``blocks[d]`` (uint8 arrays) arrive as rank d's ``out[r]``; used
  where data cannot go through shared memory (ranks on several hosts).

``ShmGroup`` is the group of ranks started by ``deep_gemm.testing.spawn``: a control segment holds per-rank status,
heartbeat and barrier words (each written by one rank only, so no cross-process atomics are needed: a store of an
aligned 8-byte word is atomic on x86-64 and stores are seen in program order) and a mailbox per rank. The supervisor
in the parent raises the abort word when a rank dies; every wait checks it.
"""

from __future__ import annotations

import os
import pickle
import socket
import threading
import time

import numpy as np

from . import _shm


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists. NOTES: not ``os.getppid() == pid``: under forkserver a rank's parent is the
    fork server, not the process that called spawn."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


DEFAULT_TIMEOUT = 300.0  # seconds a barrier waits (DeepEP's num_cpu_timeout_secs default)
HEARTBEAT_PERIOD = 0.5  # seconds between a rank's heartbeat stores
# NOTES: a last resort only (spawn's supervisor sees a dead rank within a poll): a rank inside one long call that
# holds the GIL (an LLVM compile on a loaded machine) must not be taken for dead.
HEARTBEAT_TIMEOUT = 900.0  # a running rank whose heartbeat is older than this is taken as dead

# Control segment layout (int64 words)
_MAGIC = 0x44474550  # "DGEP"
_HEADER_WORDS = 64  # [0] magic, [1] num_ranks, [2] abort, [3] failed rank, [8:40] reason text (256 bytes)
_REASON_WORD, _REASON_BYTES = 8, 256
_RANK_WORDS = 8  # per rank: [0] status, [1] heartbeat ns, [2] barrier epoch, [3] mailbox length
_MAILBOX_BYTES = 4 << 20  # per rank; tmpfs pages are only allocated when touched

STATUS_NEW, STATUS_RUNNING, STATUS_DONE, STATUS_FAILED = 0, 1, 2, 3


class RankFailedError(RuntimeError):
    """A rank of the group failed (crashed, was killed, timed out or left early); the others raise this instead of
    waiting forever. ``failed_rank`` is the rank blamed first (-1 if unknown)."""

    def __init__(self, message: str, failed_rank: int = -1):
        super().__init__(message)
        self.failed_rank = failed_rank

    def __reduce__(self):
        return (RankFailedError, (str(self), self.failed_rank))


def control_nbytes(num_ranks: int) -> int:
    return 8 * (_HEADER_WORDS + _RANK_WORDS * num_ranks) + _MAILBOX_BYTES * num_ranks


def init_control(buf, num_ranks: int) -> None:
    """Write the header of a fresh control segment (the supervisor does this before starting the ranks)."""
    words = np.frombuffer(buf, np.int64, _HEADER_WORDS)
    words[1] = num_ranks
    words[3] = -1
    words[0] = _MAGIC


def raise_abort(buf, failed_rank: int, reason: str) -> None:
    """Raise the abort word of a control segment (first reason wins): every waiting rank then fails."""
    words = np.frombuffer(buf, np.int64, _HEADER_WORDS)
    if words[2]:
        return
    text = reason.encode("utf-8", "replace")[: _REASON_BYTES - 1]
    raw = np.frombuffer(buf, np.uint8, _REASON_BYTES, offset=8 * _REASON_WORD)
    raw[:] = 0
    raw[: len(text)] = np.frombuffer(text, np.uint8)
    words[3] = failed_rank
    words[2] = 1


def read_abort(buf) -> tuple[bool, int, str]:
    words = np.frombuffer(buf, np.int64, _HEADER_WORDS)
    if not words[2]:
        return False, -1, ""
    raw = bytes(np.frombuffer(buf, np.uint8, _REASON_BYTES, offset=8 * _REASON_WORD))
    return True, int(words[3]), raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def rank_status(buf, num_ranks: int) -> np.ndarray:
    return np.frombuffer(buf, np.int64, _RANK_WORDS * num_ranks, offset=8 * _HEADER_WORDS)[::_RANK_WORDS].copy()


def _host_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


class _GroupBase:
    rank: int
    num_ranks: int
    prefix: str

    def size(self) -> int:
        return self.num_ranks

    def get_rank(self) -> int:
        return self.rank

    def get_world_size(self) -> int:
        return self.num_ranks

    def new_segment_name(self, kind: str) -> str:
        self._seq = getattr(self, "_seq", 0) + 1
        return f"{self.prefix}{kind}{self._seq}"

    def broadcast_object(self, obj, src: int = 0):
        if not 0 <= src < self.num_ranks:
            raise ValueError(f"broadcast source out of range: {src=} num_ranks={self.num_ranks}")
        return self.all_gather_object(obj if self.rank == src else None)[src]

    def all_to_all_bytes(self, blocks: list) -> list:
        if len(blocks) != self.num_ranks:
            raise ValueError(f"all_to_all_bytes takes one block per rank: {len(blocks)=} num_ranks={self.num_ranks}")
        gathered = self.all_gather_object([bytes(np.ascontiguousarray(b).view(np.uint8)) for b in blocks])
        return [np.frombuffer(gathered[src][self.rank], np.uint8) for src in range(self.num_ranks)]


class LocalGroup(_GroupBase):
    """A world of one rank (a process that never joined a group)."""

    same_host = True

    def __init__(self):
        self.rank, self.num_ranks = 0, 1
        self.prefix = _shm.new_run_prefix()

    def barrier(self, timeout: float | None = None) -> None:
        return None

    def all_gather_object(self, obj) -> list:
        return [pickle.loads(pickle.dumps(obj))]

    def __repr__(self) -> str:
        return "LocalGroup(rank=0, num_ranks=1)"


class ShmGroup(_GroupBase):
    """The ranks of one ``deep_gemm.testing.spawn`` run, coordinated through its control segment."""

    same_host = True

    def __init__(self, control_name: str, prefix: str, rank: int, num_ranks: int, timeout: float = DEFAULT_TIMEOUT,
                 parent_pid: int | None = None):
        if not 0 <= rank < num_ranks:
            raise ValueError(f"rank out of range: {rank=} {num_ranks=}")
        self.rank, self.num_ranks, self.prefix, self.timeout = rank, num_ranks, prefix, float(timeout)
        self._parent_pid = parent_pid
        self._mm = _shm.attach(control_name, control_nbytes(num_ranks))
        self._header = np.frombuffer(self._mm, np.int64, _HEADER_WORDS)
        if self._header[0] != _MAGIC or self._header[1] != num_ranks:
            raise RuntimeError(f"control segment {control_name!r} is not a {num_ranks}-rank group")
        self._ranks = np.frombuffer(self._mm, np.int64, _RANK_WORDS * num_ranks,
                                    offset=8 * _HEADER_WORDS).reshape(num_ranks, _RANK_WORDS)
        mail_off = 8 * (_HEADER_WORDS + _RANK_WORDS * num_ranks)
        self._mail = np.frombuffer(self._mm, np.uint8, _MAILBOX_BYTES * num_ranks,
                                   offset=mail_off).reshape(num_ranks, _MAILBOX_BYTES)
        self._epoch = 0
        self._closed = False
        self._ranks[rank, 1] = time.monotonic_ns()
        self._ranks[rank, 0] = STATUS_RUNNING
        self._beat = threading.Thread(target=self._heartbeat, name=f"deep_gemm-ep-heartbeat-{rank}", daemon=True)
        self._beat.start()

    def __repr__(self) -> str:
        return f"ShmGroup(rank={self.rank}, num_ranks={self.num_ranks}, prefix={self.prefix!r})"

    def __reduce__(self):
        raise TypeError("a ShmGroup belongs to its rank's process and cannot be pickled")

    # Liveness
    def _heartbeat(self) -> None:
        while not self._closed:
            self._ranks[self.rank, 1] = time.monotonic_ns()
            time.sleep(HEARTBEAT_PERIOD)

    def abort(self, reason: str) -> None:
        """Make every rank's next (or current) wait fail with ``reason``, blaming this rank."""
        raise_abort(self._mm, self.rank, f"rank {self.rank}: {reason}")

    def finish(self, ok: bool) -> None:
        """Record this rank's end (the bootstrap calls it); peers still waiting for it then fail clearly."""
        # NOTES: the abort word before the status. A peer that sees this rank's FAILED status fails in turn and
        # aborts the group too; the first abort word wins and names the rank to blame. With the status first, such a
        # peer could write it before this rank did, and the run blamed the peer (seen under load: "rank 2 of 3 failed"
        # for rank 1's exception).
        if not ok:
            self.abort("failed")
        self._ranks[self.rank, 0] = STATUS_DONE if ok else STATUS_FAILED
        self._closed = True

    def check(self, waiting_for: str = "") -> None:
        """Raise ``RankFailedError`` if the group was aborted or a peer is known dead."""
        # NOTES: the statuses before the abort word. A rank writes its abort word before its FAILED status (finish),
        # so once a FAILED status is seen the word is set and names the rank that failed first. Read the other way
        # round, a peer that failed only because of that rank could be the first FAILED found and take the blame.
        statuses = [int(self._ranks[peer, 0]) for peer in range(self.num_ranks)]
        aborted, failed, reason = read_abort(self._mm)
        if aborted:
            raise RankFailedError(f"rank {self.rank}: aborting {waiting_for}because {reason}", failed)
        if STATUS_FAILED in statuses:
            peer = statuses.index(STATUS_FAILED)
            raise RankFailedError(f"rank {self.rank}: rank {peer} failed", peer)
        if self._parent_pid is not None and not _alive(self._parent_pid):
            raise RankFailedError(f"rank {self.rank}: the launching process exited", -1)
        now = time.monotonic_ns()
        for peer, status in enumerate(statuses):
            beat = int(self._ranks[peer, 1])
            if status == STATUS_RUNNING and peer != self.rank and now - beat > HEARTBEAT_TIMEOUT * 1e9:
                raise RankFailedError(f"rank {self.rank}: rank {peer} stopped beating for {HEARTBEAT_TIMEOUT} s", peer)

    # Collectives
    def barrier(self, timeout: float | None = None) -> None:
        """Every rank's n-th barrier waits for every rank's n-th (each rank writes only its own epoch word)."""
        self._epoch += 1
        epoch = self._epoch
        self._ranks[self.rank, 2] = epoch
        self._wait(lambda: int(self._ranks[:, 2].min()) >= epoch, f"barrier {epoch}", timeout)

    def _wait(self, ready, what: str, timeout: float | None) -> None:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        pause = 2e-5
        while not ready():
            self.check(f"{what} ")
            # NOTES: a peer's status before its epoch. A rank writes its last epoch before it says DONE, so an epoch
            # read after DONE is final; read the other way round, the peer could arrive, pass this barrier (this
            # rank is there already) and finish between the two reads, and be blamed for a barrier it reached (seen
            # once: 8 ranks on 2 CPUs, "rank 0 finished without reaching barrier 33" with every rank ok).
            done = [p for p in range(self.num_ranks)
                    if self._ranks[p, 0] == STATUS_DONE and self._ranks[p, 2] < self._epoch]
            if done:
                raise RankFailedError(f"rank {self.rank}: rank {done[0]} finished without reaching {what}", done[0])
            if time.monotonic() > deadline:
                late = [p for p in range(self.num_ranks) if self._ranks[p, 2] < self._epoch]
                if not late:
                    continue  # the last of them arrived after ready() was read
                message = f"rank {self.rank}: {what} timed out; ranks not arrived: {late}"
                raise_abort(self._mm, self.rank, message)
                raise RankFailedError(message, late[0])
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

    def all_gather_object(self, obj) -> list:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) > _MAILBOX_BYTES:
            raise ValueError(f"object too large for the group's mailbox: {len(data)=} bytes > {_MAILBOX_BYTES}")
        self._mail[self.rank, : len(data)] = np.frombuffer(data, np.uint8)
        self._ranks[self.rank, 3] = len(data)
        self.barrier()
        out = [pickle.loads(self._mail[p, : int(self._ranks[p, 3])].tobytes()) for p in range(self.num_ranks)]
        self.barrier()
        return out


class TorchGroup(_GroupBase):
    """A torch.distributed ProcessGroup (gloo on CPU) behind the same interface: rendezvous and barriers through
    torch, data through shared memory when every rank is on this host (``same_host``), else through gloo."""

    def __init__(self, process_group):
        import torch.distributed as dist

        self._dist, self.process_group = dist, process_group
        self.rank = dist.get_rank(process_group)
        self.num_ranks = dist.get_world_size(process_group)
        hosts = self.all_gather_object(_host_id())
        self.same_host = len(set(hosts)) == 1
        self.prefix = self.broadcast_object(_shm.new_run_prefix())

    def __repr__(self) -> str:
        return f"TorchGroup(rank={self.rank}, num_ranks={self.num_ranks}, same_host={self.same_host})"

    def barrier(self, timeout: float | None = None) -> None:
        """With ``timeout``, gloo's monitored barrier: a rank that never arrives fails the others after ``timeout``
        seconds (naming it) instead of the group's own timeout."""
        try:
            if timeout is None:
                self._dist.barrier(group=self.process_group)
            else:
                import datetime

                self._dist.monitored_barrier(group=self.process_group, timeout=datetime.timedelta(seconds=timeout))
        except RuntimeError as exc:
            raise RankFailedError(f"rank {self.rank}: torch.distributed barrier failed: {exc}") from exc

    def all_gather_object(self, obj) -> list:
        out = [None] * self.num_ranks
        try:
            self._dist.all_gather_object(out, obj, group=self.process_group)
        except RuntimeError as exc:
            raise RankFailedError(f"rank {self.rank}: torch.distributed all_gather_object failed: {exc}") from exc
        return out

    def all_to_all_bytes(self, blocks: list) -> list:
        import torch

        if len(blocks) != self.num_ranks:
            raise ValueError(f"all_to_all_bytes takes one block per rank: {len(blocks)=} num_ranks={self.num_ranks}")
        flat = [np.ascontiguousarray(b).reshape(-1).view(np.uint8) for b in blocks]
        send_sizes = torch.tensor([f.size for f in flat], dtype=torch.int64)
        recv_sizes = torch.empty_like(send_sizes)
        try:
            self._dist.all_to_all_single(recv_sizes, send_sizes, group=self.process_group)
            send = torch.from_numpy(np.concatenate(flat) if flat else np.zeros(0, np.uint8))
            recv = torch.empty(int(recv_sizes.sum()), dtype=torch.uint8)
            self._dist.all_to_all_single(recv, send, recv_sizes.tolist(), send_sizes.tolist(),
                                         group=self.process_group)
        except RuntimeError as exc:
            raise RankFailedError(f"rank {self.rank}: torch.distributed all_to_all failed: {exc}") from exc
        out, start, data = [], 0, recv.numpy()
        for n in recv_sizes.tolist():
            out.append(data[start:start + n])
            start += n
        return out


_DEFAULT: list = []  # the group init_dist made in this process (or that spawn's bootstrap registered)


def set_default_group(group) -> None:
    _DEFAULT[:] = [group]


def get_default_group():
    return _DEFAULT[0] if _DEFAULT else None


def _is_torch_group(group) -> bool:
    torch_dist = __import__("sys").modules.get("torch.distributed")
    return torch_dist is not None and isinstance(group, torch_dist.ProcessGroup)


def as_group(group=None):
    """What upstream takes as ``group`` -> one of this module's groups: None (this process's default group, else a
    world of one), a ``ShmGroup`` / ``TorchGroup`` / ``LocalGroup``, or a torch.distributed ProcessGroup."""
    if group is None:
        group = get_default_group()
        if group is None:
            group = LocalGroup()
            set_default_group(group)
        return group
    if isinstance(group, _GroupBase):
        return group
    if _is_torch_group(group):
        cache = _TORCH_GROUPS.get(id(group))
        if cache is None or cache[0] is not group:
            cache = _TORCH_GROUPS[id(group)] = (group, TorchGroup(group))
        return cache[1]
    raise TypeError(f"group must be None, a deep_gemm.ep group or a torch.distributed ProcessGroup: {type(group)=}")


_TORCH_GROUPS: dict[int, tuple] = {}
