"""The CPU sweep on a Dask distributed cluster (the optional ``distributed`` extra): one task per shape, run on the
workers, rows streamed back to the client and written to the same results.csv as the single-process sweep.

Imported only for ``--scheduler`` / ``--local-cluster``; without them the sweep never imports dask. The worker side
(``run_shape_task``) needs deep_gemm installed on the worker; the bench modules are uploaded by the client.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from _sweep_csv import describe_error, new_row
from shapes import gemm_flops

EXTRA_HINT = ('--scheduler and --local-cluster need Dask distributed, the optional "distributed" extra: '
              'pip install -e ".[distributed]" in a checkout of deep_gemm, or pip install "dask[distributed]"')
# The worker resource each timed task holds: start workers with --resources timing=1 (one timed task at a time).
RESOURCE = "timing"
# Uploaded to every worker (and to workers that join or restart later), in import order.
BENCH_MODULES = ("shapes.py", "_sweep_csv.py", "_sweep_ceiling.py", "_sweep_cpu.py", "_sweep_dask.py")
# NOTES: the retry count for a task that raised (a shape's own errors are rows, so this catches worker-side
# failures outside them); a worker that dies mid-task is a separate path: the scheduler reschedules the task on
# another worker up to distributed.scheduler.allowed-failures times (default 3), then the row is "failed".
TASK_RETRIES = 2


def require_distributed():
    """Import and return ``distributed``, or raise RuntimeError saying which extra to install."""
    try:
        import distributed
    except ImportError as e:
        raise RuntimeError(f"{EXTRA_HINT} ({type(e).__name__}: {e})") from None
    return distributed


# ---------------------------------------------------------------------------------------------------------------
# Worker side: one process-wide setup (cache dir, this machine's roofline), then one shape per task
# ---------------------------------------------------------------------------------------------------------------

_WORKER: dict = {}


def timing_lock_path() -> Path:
    """One lock file per host, shared by every worker (and every sweep) on it."""
    return Path(tempfile.gettempdir()) / "deep_gemm-sweep-timing.lock"


@contextlib.contextmanager
def host_timing_lock() -> Iterator[None]:
    """Hold this host's timing lock: no two timings (or ceiling measurements) of workers on one host overlap, even
    when several workers share the host (a local cluster). The OS releases it when a worker dies.

    NOTES: Dask's worker resources stop one worker running two timed tasks; this lock covers several workers on
    one machine, which resources cannot see."""
    try:
        import fcntl
    except ImportError:  # not POSIX: resources alone
        yield
        return
    with open(timing_lock_path(), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def worker_cache_dir(shared: str | None, host: str, worker_name: str) -> tuple[str, str]:
    """(DG_JIT_CACHE_DIR for this worker, where it came from): the user's shared directory (--worker-cache-dir), else
    the worker's own environment's DG_JIT_CACHE_DIR, else a directory of its own under the user cache directory,
    named by host and worker name (stable across runs for workers started with --name, and local clusters)."""
    if shared:
        return shared, "shared (--worker-cache-dir)"
    own = os.environ.get("DG_JIT_CACHE_DIR")
    if own:
        return own, "the worker's DG_JIT_CACHE_DIR"
    from platformdirs import user_cache_dir

    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{host}-{worker_name}").strip("_")
    return str(Path(user_cache_dir("deep_gemm")) / "sweep-workers" / safe), "per worker"


def cache_dir_problem(path: str) -> str | None:
    """Why ``path`` cannot be a kernel cache root on this machine, or None: deep_gemm keeps cache/ and tmp/ inside
    it and builds in tmp/, so both are created (as deep_gemm would) and a file written and removed in tmp/.

    NOTES: deep_gemm itself falls back to the user cache directory when its root is unusable (a warning in the
    worker's log): for --worker-cache-dir that silently splits the shared cache, so the sweep refuses instead."""
    root = Path(path).expanduser()
    try:
        for sub in ("cache", "tmp"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=root / "tmp", prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")
    return None


def check_worker_cache_dir(path: str, where: str = "") -> None:
    """Raise ValueError naming --worker-cache-dir and ``path`` when it cannot be a kernel cache root here."""
    problem = cache_dir_problem(path)
    if problem is not None:
        raise ValueError(f"--worker-cache-dir {path}: not usable as the workers' kernel cache{where} ({problem}); "
                         "give a directory every worker can create and write")


def _worker_setup(opts: dict, worker_name: str) -> dict:
    """Once per worker process and sweep: choose its kernel cache, then measure its machine (under the host lock).

    NOTES: workers sharing a host (a local cluster) share one measurement per sweep (a file keyed by the sweep's
    token in the temp directory): it is the same machine, and measuring it once per worker only made the others
    wait for the lock (~2 minutes per worker on the loaded 2-core machine)."""
    token = opts.get("token", "")
    if _WORKER.get("token") == token and "machine" in _WORKER:
        return _WORKER["machine"]
    import json

    from _sweep_ceiling import machine_identity, measure_machine

    host = machine_identity()["host"]
    cache_dir, cache_from = worker_cache_dir(opts.get("worker_cache_dir"), host, worker_name)
    if opts.get("worker_cache_dir"):  # a worker that joined after the client checked them all
        check_worker_cache_dir(cache_dir, f" on worker {worker_name} ({host})")
    # NOTES: set before this process builds its first kernel (deep_gemm reads it at each lookup).
    os.environ["DG_JIT_CACHE_DIR"] = cache_dir
    shared = Path(tempfile.gettempdir()) / f"deep_gemm-sweep-machine-{token}.json"
    with host_timing_lock():
        start = time.perf_counter()
        try:
            machine = json.loads(shared.read_text())
            machine["measured_by"] = "another worker on this host"
        except (OSError, ValueError):
            machine = measure_machine(ceiling_gflops=opts.get("ceiling_gflops"),
                                      bandwidth_gbs=opts.get("bandwidth_gbs"),
                                      samples=opts.get("ceiling_samples", 3),
                                      max_wait_s=opts.get("ceiling_wait_s", 30.0))
            with contextlib.suppress(OSError):
                shared.write_text(json.dumps(machine))
            machine["measured_by"] = "this worker"
    machine.update(jit_cache_dir=cache_dir, jit_cache=cache_from, pid=os.getpid(),
                   setup_s=time.perf_counter() - start)
    _WORKER.update(token=token, machine=machine)
    return machine


def run_shape_task(task: tuple, runner, arch: str, num_ai_cores: int, opts: dict) -> tuple[dict, dict]:
    """One shape on this worker: build its kernel (outside the host lock, so compiles on several workers overlap),
    then time it holding the host lock. Returns (row, meta); the row is normalised by this worker's ceiling."""
    from _sweep_cpu import mem_available_bytes, run_shape, shape_rng
    from distributed import get_worker

    worker = get_worker()
    machine = _worker_setup(opts, str(worker.name))
    dtype, m, n, k = task
    start = time.perf_counter()
    compile_s, compile_error = 0.0, None
    try:
        compile_s = runner.build(dtype, m, n, k)
    except Exception as e:  # noqa: BLE001 (the timed call raises it again and records it in the row)
        compile_error = describe_error(e)
    row = new_row("cpu", dtype, m, n, k, arch=arch, num_ai_cores=num_ai_cores,
                  peak_flops=machine["peak_gflops"] * 1e9, bandwidth_bytes_s=machine["bandwidth_gbs"] * 1e9)
    row.update(host=machine["host"], cpu_model=machine["cpu_model"])
    max_mem = opts.get("max_mem_gb")
    with host_timing_lock(), runner.scope():
        waited = time.perf_counter() - start - compile_s
        run_shape(row, runner, shape_rng(opts.get("seed", 0), *task), min_repeats=opts["min_repeats"],
                  max_repeats=opts["max_repeats"], target_s=opts["target_s"], spread_tol=opts["spread_tol"],
                  mem_budget_bytes=None if max_mem is None else max_mem * 2**30, mem_available=mem_available_bytes,
                  light_warmup_gflop=opts.get("light_warmup_gflop"))
    meta = {"worker": str(worker.name), "address": worker.address, "host": machine["host"],
            "seconds": time.perf_counter() - start, "compile_s": compile_s, "flops": gemm_flops(m, n, k),
            "lock_wait_s": max(0.0, waited), "compile_error": compile_error, "machine": machine}
    return row, meta


# ---------------------------------------------------------------------------------------------------------------
# Client side
# ---------------------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Ignore SIGINT while the local cluster's processes start, so they inherit "ignored": a Ctrl-C at the terminal
    (sent to the whole process group) then reaches only the client, which closes the cluster itself, instead of
    every worker printing a KeyboardInterrupt traceback."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


# NOTES: Dask's loggers and those of the event loop under it. A cluster that is closing logs comm errors with their
# tracebacks (a worker's heartbeat to a scheduler that already left, a stream closed mid-message) that say nothing
# about the sweep: a user who pressed Ctrl-C saw them after "interrupted", and a test reading stderr failed on them.
QUIET_LOGGERS = ("distributed", "tornado", "asyncio", "bokeh")
# The flag file a local cluster's worker processes check (set in their environment by connect()).
QUIET_FLAG_ENV = "DEEP_GEMM_SWEEP_QUIET_FLAG"


class QuietWhenClosing(logging.Filter):
    """Drops the QUIET_LOGGERS' records once the client starts closing: ``closing`` set in this process, or the
    ``flag`` file present (how the client tells its local workers; a file, so no message has to reach a busy or
    half-closed worker)."""

    def __init__(self, flag: str | None = None) -> None:
        super().__init__()
        self.flag = flag
        self.closing = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.split(".", 1)[0] not in QUIET_LOGGERS:
            return True
        return not (self.closing or (self.flag is not None and os.path.exists(self.flag)))


def _all_handlers() -> list[logging.Handler]:
    # NOTES: a filter on a logger does not see the records its children propagate; one on each handler does.
    loggers = [logging.getLogger(), *(lg for lg in list(logging.Logger.manager.loggerDict.values())
                                      if isinstance(lg, logging.Logger))]
    handlers = {id(h): h for lg in loggers for h in lg.handlers}
    if logging.lastResort is not None:
        handlers[id(logging.lastResort)] = logging.lastResort
    return list(handlers.values())


def install_quiet_filter(flag: str | None = None) -> QuietWhenClosing:
    """Add a QuietWhenClosing filter to every handler of this process; remove_quiet_filter takes it off again."""
    quiet = QuietWhenClosing(flag)
    for handler in _all_handlers():
        handler.addFilter(quiet)
    return quiet


def remove_quiet_filter(quiet: QuietWhenClosing) -> None:
    for handler in _all_handlers():
        handler.removeFilter(quiet)


def dask_setup(worker) -> None:
    """Preload hook of a local cluster's worker processes (connect() names this module): quiet once the client's
    flag file appears."""
    flag = os.environ.get(QUIET_FLAG_ENV)
    if flag:
        install_quiet_filter(flag)


def connect(scheduler: str | None, local_workers: int | None, *, wait_s: float = 120.0,
            quiet_flag: str | None = None):
    """(client, cluster or None): a LocalCluster of ``local_workers`` worker processes (one thread each, resource
    timing=1), or a client of the scheduler at ``scheduler``; waits for at least one worker. A local cluster's
    workers go quiet (QuietWhenClosing) once the file ``quiet_flag`` exists."""
    require_distributed()
    from distributed import Client, LocalCluster

    cluster = None
    if local_workers is not None:
        quiet = {} if quiet_flag is None else {"preload": [__name__], "env": {QUIET_FLAG_ENV: quiet_flag}}
        with _sigint_ignored():
            cluster = LocalCluster(n_workers=local_workers, threads_per_worker=1, processes=True,
                                   resources={RESOURCE: 1}, dashboard_address=None, silence_logs=logging.ERROR,
                                   **quiet)
        client = Client(cluster)
    else:
        client = Client(scheduler, timeout=30)
    try:
        client.wait_for_workers(1, timeout=wait_s)
    except Exception:
        client.close()
        if cluster is not None:
            cluster.close()
        raise
    return client, cluster


def _workers_info(client) -> dict:
    # NOTES: newer distributed lists only the first few workers unless asked for all (n_workers=-1).
    try:
        return client.scheduler_info(n_workers=-1)["workers"]
    except TypeError:
        return client.scheduler_info()["workers"]


def check_resources(client) -> list[str]:
    """The addresses of workers offering the timing resource; RuntimeError if none does (tasks would wait forever)."""
    workers = _workers_info(client)
    with_resource = [addr for addr, w in workers.items() if w.get("resources", {}).get(RESOURCE, 0) >= 1]
    if not with_resource:
        raise RuntimeError(f"none of the {len(workers)} Dask workers offers the resource {RESOURCE}=1: start them with"
                           f" dask worker SCHEDULER --nthreads <cores> --resources {RESOURCE}=1")
    return with_resource


def assign_groups(groups: dict[tuple, list], cost, workers: list[str]) -> dict[tuple, str]:
    """Each kernel group to one worker (longest group first, to the least-loaded worker), so a kernel is compiled
    once per worker; Dask may still move a task (its worker died, or stealing), which costs one more compile."""
    load = dict.fromkeys(workers, 0.0)
    out = {}
    for key, tasks in sorted(groups.items(), key=lambda item: -sum(cost(t) for t in item[1])):
        target = min(load, key=load.get)
        out[key] = target
        load[target] += sum(cost(t) for t in tasks)
    return out


class _Progress:
    """tqdm over GFLOP, with shapes done, per-worker throughput and tqdm's ETA in the postfix."""

    def __init__(self, bar, total_shapes: int) -> None:
        self.bar = bar
        self.total_shapes = total_shapes
        self.done = 0
        self.start = time.perf_counter()
        self.per_worker: dict[str, float] = {}

    def step(self, task: tuple, worker: str | None) -> None:
        flops = gemm_flops(*task[1:])
        self.done += 1
        if worker is not None:
            self.per_worker[worker] = self.per_worker.get(worker, 0.0) + flops
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        rates = ", ".join(f"{w} {f / elapsed / 1e9:.3g}" for w, f in sorted(self.per_worker.items()))
        self.bar.set_postfix_str(f"{self.done}/{self.total_shapes} shapes; GFLOP/s per worker: {rates}")
        self.bar.update(flops)


def run_cpu_dask(args, tasks: list[tuple], writer, info: dict, *, runner, arch: str, num_ai_cores: int, cost,
                 kernel_key, plan, progress, written: list, walls: list) -> list:
    """Time ``tasks`` on the cluster ``args`` names, writing each row to ``writer`` as it arrives and appending its
    task to ``written``; fills ``info`` (the summary's machine["cpu"]) with the workers' machines and counts.
    ``plan(tasks, machines)`` picks the tasks to run once the number of hosts is known (--budget-hours);
    ``progress(total_flops)`` makes the tqdm bar; ``walls`` gets each shape's {"task", "seconds" (on the worker,
    compile included, waiting for the host lock not), "compile_s", "worker"}.

    A shape is one task holding the timing resource; tasks are grouped by kernel and each group is sent to one
    worker (a loose restriction). KeyboardInterrupt cancels what is pending and propagates (rows written stay)."""
    from _sweep_plan import kernel_groups
    from distributed import as_completed

    token = uuid.uuid4().hex[:12]
    quiet_flag = Path(tempfile.gettempdir()) / f"deep_gemm-sweep-closing-{token}"
    quiet = install_quiet_filter()
    futures = []
    try:
        client, cluster = connect(args.scheduler, args.local_cluster, quiet_flag=str(quiet_flag))
    except BaseException:
        remove_quiet_filter(quiet)
        raise
    try:
        workers = check_resources(client)
        hosts = {w["host"] for a, w in _workers_info(client).items() if a in workers}
        # NOTES: timings on one host take turns (host_timing_lock), so the budget scales with hosts, not workers.
        tasks = plan(tasks, len(hosts))
        here = Path(__file__).resolve().parent
        for name in BENCH_MODULES:
            client.upload_file(str(here / name), load=False)
        shared_cache = None if args.worker_cache_dir is None else str(args.worker_cache_dir)
        if shared_cache is not None:
            # NOTES: checked where it is used, on each worker, before any shape runs (the client may not see the
            # workers' file systems); the sweep's own check covered the client's machine for a local cluster.
            problems = client.run(cache_dir_problem, shared_cache)
            bad = {addr: why for addr, why in problems.items() if why is not None}
            if bad:
                addr, why = next(iter(sorted(bad.items())))
                raise ValueError(f"--worker-cache-dir {shared_cache}: not usable as the kernel cache of "
                                 f"{len(bad)} of {len(problems)} workers (worker {addr}: {why}); give a directory "
                                 "every worker can create and write")
        opts = {"token": token,
                "worker_cache_dir": shared_cache,
                "ceiling_gflops": args.ceiling_gflops, "bandwidth_gbs": args.bandwidth_gbs, "seed": args.seed,
                "min_repeats": args.repeats, "max_repeats": args.max_repeats, "target_s": args.target_seconds,
                "spread_tol": args.spread_tol, "max_mem_gb": args.max_mem_gb,
                "light_warmup_gflop": args.light_warmup_gflop}
        groups = kernel_groups(tasks, kernel_key)
        owner = assign_groups(groups, cost, workers)
        by_key = {}
        for key, group in groups.items():
            for task in group:
                dtype, m, n, k = task
                future = client.submit(run_shape_task, task, runner, arch, num_ai_cores, opts,
                                       key=f"sweep-{dtype}-{m}x{n}x{k}-{token}", resources={RESOURCE: 1},
                                       workers=[owner[key]], allow_other_workers=True, retries=TASK_RETRIES,
                                       pure=False)
                by_key[future.key] = task
                futures.append(future)
        info.update(scheduler=client.scheduler.address, workers_at_start=len(workers), kernel_groups=len(groups),
                    workers={})
        print(f"dask: {len(tasks)} shapes in {len(groups)} kernel groups on {len(workers)} workers "
              f"({client.scheduler.address})", file=sys.stderr, flush=True)
        bar = progress(sum(gemm_flops(*t[1:]) for t in tasks))
        report = _Progress(bar, len(tasks))
        for future in as_completed(futures):
            task = by_key[future.key]
            try:
                row, meta = future.result()
            except Exception as e:  # noqa: BLE001 (a task that failed for good, e.g. KilledWorker: a failed row)
                dtype, m, n, k = task
                row = new_row("cpu", dtype, m, n, k, arch=arch, num_ai_cores=num_ai_cores,
                              peak_flops=float("nan"), bandwidth_bytes_s=float("nan"))
                row.update(status="failed", error=describe_error(e))
                meta = None
            writer.write(row)
            written.append(task)
            if meta is not None:
                _account(info["workers"], meta)
                walls.append({"task": list(task), "seconds": meta["seconds"] - meta["lock_wait_s"],
                              "compile_s": meta["compile_s"], "worker": meta["worker"]})
            report.step(task, None if meta is None else meta["worker"])
        bar.close()
    finally:
        # Quiet from here on: in this process at once, in a local cluster's workers once the flag file exists.
        quiet.closing = True
        with contextlib.suppress(OSError):
            quiet_flag.touch()
        closed = _close(client, cluster, futures)
        # NOTES: after the close: a worker still measuring its machine when the client stopped writes the file late.
        with contextlib.suppress(OSError):  # the client and a local cluster share the temp directory
            (Path(tempfile.gettempdir()) / f"deep_gemm-sweep-machine-{token}.json").unlink(missing_ok=True)
        if closed:
            remove_quiet_filter(quiet)
            with contextlib.suppress(OSError):
                quiet_flag.unlink(missing_ok=True)
        else:
            # NOTES: a close that timed out goes on in the background (and may still log): stay quiet until exit.
            atexit.register(lambda: quiet_flag.unlink(missing_ok=True))
    return written


def _close(client, cluster, futures) -> bool:
    """Cancel ``futures``, close the client and the local cluster; False if a step failed or timed out.

    NOTES: a worker busy in a shape is stopped by its nanny (asked, then killed after a few seconds), so a close
    takes seconds; the bounds are for a machine too loaded to close even so."""
    with contextlib.suppress(Exception):
        client.cancel(futures, force=True)
    closed = True
    for close in (client.close, *(() if cluster is None else (cluster.close,))):
        try:
            close(timeout=30)
        except Exception:  # noqa: BLE001 (closing what is left; the rows are written)
            closed = False
    return closed


def _account(workers: dict, meta: dict) -> None:
    entry = workers.setdefault(meta["worker"], {
        **{k: meta["machine"].get(k) for k in ("host", "cpu_model", "cpu_count", "peak_gflops", "fma_peak_gflops",
                                                 "fma_below_ceiling", "bandwidth_gbs", "ridge", "ceiling_sizes",
                                                 "ceiling_samples", "ceiling_loads", "ceiling_load_threshold",
                                                 "jit_cache_dir", "jit_cache", "setup_s", "measured_by")},
        "shapes": 0, "seconds": 0.0, "compile_s": 0.0, "lock_wait_s": 0.0, "gflop": 0.0})
    entry["shapes"] += 1
    entry["seconds"] += meta["seconds"] - meta["lock_wait_s"]
    entry["lock_wait_s"] += meta["lock_wait_s"]
    entry["compile_s"] += meta["compile_s"]
    entry["gflop"] += meta["flops"] / 1e9
