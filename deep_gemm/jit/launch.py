"""Run a translated kernel over its logical AI cores on the CPU threads: a tiny persistent worker pool.

The kernel entry is a ``nogil`` numba function ``entry(first_core, core_step, *args)`` that runs the cores
first_core, first_core + core_step, ... one after the other. A launch on T threads is one job of T parts (part i
runs ``entry(i, T, *args)``); the calling thread and the pool's workers claim parts until none is left, so a part's
logical cores, and so the result, never depend on which thread ran it.

NOTES: this replaces a numba ``parallel=True`` wrapper (still generated as ``<entry>_prange``, DG_JIT_LAUNCHER=prange)
because numba re-optimizes and re-generates every linked callee in each library that links it: the parfor adds
two such libraries (the gufunc and its wrapper) and tripled the compile time of a GEMM specialization. A Python
handoff costs ~20-40 us, about what numba's workqueue layer costs, and does not degrade when other processes load
the CPU (OpenMP's spinning barrier took milliseconds there).

Guarantees (the reliability contract):
- A launch either completes (every part ran) or raises; nothing a later launch does or sees depends on an earlier
  one: each launch is its own ``_Job`` object with its own completion count, never a slot shared by launches.
- Ctrl-C: a kernel part is native code that Python cannot stop halfway. In a cancellable call (jit/interrupt.py:
  a long one) the parts all run on workers while the main thread waits, and a SIGINT sets the kernels' cancel flag:
  they stop at their next tile, the launch raises KeyboardInterrupt and the call restores its outputs. Otherwise, on
  the main thread, SIGINT is held for the few milliseconds of a launch and delivered to the previous handler
  (KeyboardInterrupt by default) once every part has finished: the caller gets KeyboardInterrupt with a complete
  output. Either way the pool survives.
- Several Python threads may launch at once: their jobs share the pool's workers, and each caller also runs parts
  of its own job, so no launch waits for another one to finish and every CPU thread stays in use.
"""

from __future__ import annotations

import functools
import os
import queue
import sys
import threading

from . import interrupt


def num_threads() -> int:
    """CPU threads kernels use: numba's thread count (NUMBA_NUM_THREADS, numba.set_num_threads) without starting
    numba's own thread pool."""
    numba = sys.modules.get("numba")
    if numba is not None:
        parallel = sys.modules.get("numba.np.ufunc.parallel")
        if parallel is not None and getattr(parallel, "_is_initialized", False):
            return max(1, numba.get_num_threads())
        return max(1, int(numba.config.NUMBA_NUM_THREADS))
    return _cpu_count()


@functools.cache
def _cpu_count() -> int:
    """os.cpu_count(), read once: on Linux each call reads /sys (about 7 us, a quarter of a launch's dispatch)."""
    return max(1, os.cpu_count() or 1)


class _Job:
    """One launch: parts 0..parts-1, part i running ``fn(i, parts, *args)``, claimed by whichever thread is free."""

    __slots__ = ("fn", "args", "parts", "error", "_done", "_next", "_pending", "_lock")

    def __init__(self, fn, args: tuple, parts: int):
        self.fn = fn
        self.args = args
        self.parts = parts
        self.error: BaseException | None = None
        # NOTES: a lock held until the last part ends (cheaper to make than an Event: dispatch is microseconds).
        self._done = threading.Lock()
        self._done.acquire()
        self._next = 0
        self._pending = parts
        self._lock = threading.Lock()

    def wait(self) -> None:
        """Return once every part has finished."""
        self._done.acquire()
        self._done.release()

    def claim(self) -> int:
        """The next unclaimed part, or -1 when every part is taken."""
        with self._lock:
            part = self._next
            if part >= self.parts:
                return -1
            self._next = part + 1
            return part

    def run(self, part: int) -> None:
        try:
            self.fn(part, self.parts, *self.args)
        except BaseException as e:  # noqa: BLE001 - handed to the launching thread
            if self.error is None:
                self.error = e
        finally:
            with self._lock:
                self._pending -= 1
                last = self._pending == 0
            if last:
                self._done.release()

    def run_all(self) -> None:
        """Run parts on this thread until none is left unclaimed."""
        while (part := self.claim()) >= 0:
            self.run(part)


def _worker_loop(jobs: queue.SimpleQueue) -> None:
    while True:
        job = jobs.get()
        # NOTES: a job whose parts the caller (or another worker) already took claims -1 here and is dropped.
        part = job.claim()
        if part >= 0:
            job.run(part)


class CoreLauncher:
    """Runs ``entry(i, T, *args)`` for i in 0..T-1 on up to T threads (the caller takes parts too) and returns when
    all have finished; the first exception of any part is re-raised on the caller."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._lock = threading.Lock()

    def _ensure(self, count: int) -> None:
        if len(self._workers) >= count:
            return
        with self._lock:
            while len(self._workers) < count:
                thread = threading.Thread(target=_worker_loop, args=(self._jobs,),
                                          name=f"deep_gemm-core-{len(self._workers) + 1}", daemon=True)
                thread.start()
                self._workers.append(thread)

    def launch(self, entry, num_cores: int, args: tuple) -> None:
        threads = min(num_threads(), num_cores)
        call = interrupt.current()
        if call is not None and call.cancellable:
            self._launch_cancellable(entry, threads, args, call)
            return
        if threads <= 1:
            # NOTES: one native call: Python handles a SIGINT only after it returns, so it is atomic already.
            entry(0, 1, *args)
            return
        job = _Job(entry, args, threads)
        with interrupt.HeldSigint():
            try:
                self._ensure(threads - 1)
                for _ in range(threads - 1):
                    self._jobs.put(job)
                job.run_all()
            finally:
                # NOTES: whatever happened above, no part of this job may still run once launch returns.
                job.run_all()
                job.wait()
                job.args = ()  # stale queue entries must not keep the caller's arrays alive
        if job.error is not None:
            raise job.error

    def _launch_cancellable(self, entry, threads: int, args: tuple, call) -> None:
        """A launch of a cancellable call (jit/interrupt.py): every part runs on a worker while this thread waits,
        so a SIGINT is handled at once (it sets the kernels' cancel flag; they stop at their next tile)."""
        job = _Job(entry, args, threads)
        self._ensure(threads)
        call.in_launch = True
        try:
            for _ in range(threads):
                self._jobs.put(job)
        finally:
            # NOTES: a lock wait returns to Python for each signal (the handler runs, then the wait goes on).
            job.wait()
            call.in_launch = False
            job.args = ()
        if job.error is not None:
            raise job.error
        call.raise_if_cancelled()

    def _reset_after_fork(self) -> None:
        self._jobs = queue.SimpleQueue()
        self._workers = []
        self._lock = threading.Lock()


LAUNCHER = CoreLauncher()
if hasattr(os, "register_at_fork"):
    # NOTES: threads do not survive fork; a forked child (multiprocessing) starts an empty pool.
    os.register_at_fork(after_in_child=LAUNCHER._reset_after_fork)
