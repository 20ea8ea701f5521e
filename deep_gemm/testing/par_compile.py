"""Parallel precompilation: run zero-argument callables (typically GEMM calls or precompile_* functions) under
``deep_gemm.dry_run()`` in worker processes, so their kernels are built and compiled into the disk cache in
parallel; later calls in any process then load them. Nothing here runs a kernel.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed

from .. import envs, runtime


def _init_worker(num_ai_cores: int, arch: str, workers: int) -> None:
    # NOTES: workers are spawned (numba's threads do not survive fork), so the parent's runtime settings are
    # replayed here; environment variables (DG_JIT_CACHE_DIR ...) are inherited by the spawn itself. Workers that
    # with a warm-up helper each (jit/warmup.py) would outnumber the CPUs compile without one.
    from ..jit.warmup import share_cpus_with

    share_cpus_with(workers)
    runtime.set_npu_arch(arch)
    runtime.set_num_ai_cores(num_ai_cores)


def _run_dry(fn: Callable[[], object]) -> object:
    from ..jit.compile import wait_native_builds

    with runtime.dry_run():
        result = fn()
    # NOTES: a pool worker ends without running atexit handlers: its kernels' native libraries are finished here.
    wait_native_builds()
    return result


def _default_workers() -> int:
    configured = envs.DG_TEST_MAX_WORKERS.get()
    return configured if configured is not None else (os.cpu_count() or 1)


def par_compile(callables: Iterable[Callable[[], object]], *, max_workers: int | None = None,
                progress: bool = True) -> list[object]:
    """Run each zero-arg callable under ``deep_gemm.dry_run()`` in worker processes; return their results in order.

    Callables and results must be picklable (module-level functions, ``functools.partial`` of them). Workers use
    the caller's AI-core count and NPU arch. ``max_workers`` defaults to env DG_TEST_MAX_WORKERS, else the CPU
    count; with one worker the callables run in this process. ``progress`` reports completions on stderr (tqdm
    when installed). Raises RuntimeError naming every failed callable after all have finished.
    """
    callables = list(callables)
    for i, fn in enumerate(callables):
        if not callable(fn):
            raise TypeError(f"par_compile needs callables, got item {i}: {fn!r}")
    if max_workers is not None and (isinstance(max_workers, bool) or not isinstance(max_workers, int)
                                    or max_workers < 1):
        raise ValueError(f"max_workers must be a positive int or None, got {max_workers=!r}")
    if not callables:
        return []
    workers = min(max_workers or _default_workers(), len(callables))
    results: list[object] = [None] * len(callables)
    errors: list[tuple[int, BaseException]] = []
    report = _Progress(len(callables), progress)
    if workers == 1:
        for i, fn in enumerate(callables):
            try:
                results[i] = _run_dry(fn)
            except Exception as e:  # noqa: BLE001 - collected and re-raised below with every failure named
                errors.append((i, e))
            report.step()
    else:
        context = multiprocessing.get_context("spawn")
        initargs = (runtime.get_num_ai_cores(), runtime.get_npu_arch(), workers)
        with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker, initargs=initargs) as pool:
            futures = {pool.submit(_run_dry, fn): i for i, fn in enumerate(callables)}
            for future in as_completed(futures):
                i = futures[future]
                try:
                    results[i] = future.result()
                except Exception as e:  # noqa: BLE001 - collected and re-raised below with every failure named
                    errors.append((i, e))
                report.step()
    report.close()
    if errors:
        errors.sort(key=lambda item: item[0])
        lines = [f"  [{i}] {callables[i]!r}: {type(e).__name__}: {e}" for i, e in errors]
        raise RuntimeError(f"par_compile: {len(errors)} of {len(callables)} callables failed:\n" + "\n".join(lines))
    return results


class _Progress:
    """Completion counter on stderr: a tqdm bar when tqdm is installed, else one line per completion."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled, self.start = total, 0, enabled, time.perf_counter()
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=total, desc="par_compile", unit="kernel", file=sys.stderr)

    def step(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.enabled:
            elapsed = time.perf_counter() - self.start
            print(f"par_compile: {self.done}/{self.total} done ({elapsed:.1f} s)", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
