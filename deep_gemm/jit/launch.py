"""Run a translated kernel over its logical AI cores on the CPU threads: a tiny persistent worker pool.

The kernel entry is a ``nogil`` numba function ``entry(first_core, core_step, *args)`` that runs the cores
first_core, first_core + core_step, ... one after the other; thread i of T runs ``entry(i, T, *args)``.
NOTES: this replaces a numba ``parallel=True`` wrapper (still generated as ``<entry>_prange``, DG_JIT_LAUNCHER=prange)
because numba re-optimizes and re-generates every linked callee in each library that links it: the parfor adds
two such libraries (the gufunc and its wrapper) and tripled the compile time of a GEMM specialization. A Python
handoff costs ~20-40 us, about what numba's workqueue layer costs, and does not degrade when other processes load
the CPU (OpenMP's spinning barrier took milliseconds there).
"""

from __future__ import annotations

import os
import sys
import threading


def num_threads() -> int:
    """CPU threads kernels use: numba's thread count (NUMBA_NUM_THREADS, numba.set_num_threads) without starting
    numba's own thread pool."""
    numba = sys.modules.get("numba")
    if numba is not None:
        parallel = sys.modules.get("numba.np.ufunc.parallel")
        if parallel is not None and getattr(parallel, "_is_initialized", False):
            return max(1, numba.get_num_threads())
        return max(1, int(numba.config.NUMBA_NUM_THREADS))
    return max(1, os.cpu_count() or 1)


class _Worker:
    def __init__(self, index: int):
        self.index = index
        self.job = None
        self.error: BaseException | None = None
        self.go = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"deep_gemm-core-{index}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            self.go.wait()
            self.go.clear()
            fn, args = self.job
            try:
                fn(*args)
            except BaseException as e:  # noqa: BLE001 - handed to the launching thread
                self.error = e
            self.job = None
            self.done.set()


class CoreLauncher:
    """Runs ``entry(i, T, *args)`` for i in 0..T-1 on T threads (the caller is thread 0) and waits for all."""

    def __init__(self):
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()

    def _ensure(self, count: int) -> list[_Worker]:
        while len(self._workers) < count:
            self._workers.append(_Worker(len(self._workers) + 1))
        return self._workers[:count]

    def launch(self, entry, num_cores: int, args: tuple) -> None:
        threads = min(num_threads(), num_cores)
        # NOTES: a second Python thread launching while the pool is busy runs its cores itself (correct, serial).
        if threads <= 1 or not self._lock.acquire(blocking=False):
            entry(0, 1, *args)
            return
        try:
            workers = self._ensure(threads - 1)
            for worker in workers:
                worker.error = None
                worker.done.clear()
                worker.job = (entry, (worker.index, threads, *args))
                worker.go.set()
            try:
                entry(0, threads, *args)
            finally:
                for worker in workers:
                    worker.done.wait()
            for worker in workers:
                if worker.error is not None:
                    raise worker.error
        finally:
            self._lock.release()

    def _reset_after_fork(self) -> None:
        self._workers = []
        self._lock = threading.Lock()


LAUNCHER = CoreLauncher()
if hasattr(os, "register_at_fork"):
    # NOTES: threads do not survive fork; a forked child (multiprocessing) starts an empty pool.
    os.register_at_fork(after_in_child=LAUNCHER._reset_after_fork)
