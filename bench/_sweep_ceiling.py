"""This machine's roofline for the CPU sweep: who it is (host, CPU model), a robust numpy fp32 ceiling (the best of
several samples, taken when the load average is low when it gets low), the FMA peak of all threads (deep_gemm.testing's
micro-benchmark of independent FMAs, many short runs) and the copy bandwidth.

Measures only; the sweep decides which figure normalises its rows (the numpy ceiling, or --ceiling-gflops).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterable

import numpy as np

# NOTES: the FMA peak is deep_gemm.testing's (the one perf_check reports), run as many short runs: a parallel run
# lasts as long as its slowest thread, so on a shared machine a long run always contains someone else's time slice
# (under a load of 10 on 2 cores, 0.2 s runs read 48 GFLOP/s where 3 ms runs found 290).
FMA_RUN_SECONDS = 0.005
FMA_REPEATS = 60


def machine_identity() -> dict:
    """{"host": hostname, "cpu_model": the CPU's model name (/proc/cpuinfo, else platform), "cpu_count": logical}."""
    from deep_gemm.testing.machine import cpu_model

    return {"host": socket.gethostname(), "cpu_model": cpu_model(), "cpu_count": os.cpu_count() or 1}


def load_average() -> float | None:
    """The 1-minute load average, or None where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def wait_for_low_load(threshold: float, max_wait_s: float, *, poll_s: float = 1.0,
                      load: Callable[[], float | None] = load_average,
                      sleep: Callable[[float], None] = time.sleep) -> tuple[float | None, float]:
    """Wait until the 1-minute load average is below ``threshold`` or ``max_wait_s`` has passed; return (the load
    seen last or None without a load average, seconds waited). Never raises: a machine that stays busy is measured
    busy, and says so."""
    waited = 0.0
    current = load()
    while current is not None and current >= threshold and waited + poll_s <= max_wait_s:
        sleep(poll_s)
        waited += poll_s
        current = load()
    return current, waited


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def numpy_ceiling_sample(sizes: Iterable[int], repeats: int = 3) -> dict[int, float]:
    """Best fp32 GFLOP/s of numpy's ``a @ b.T`` (its BLAS, all threads) per square size, best of ``repeats``."""
    rng = np.random.default_rng(0)
    per_size: dict[int, float] = {}
    for size in sizes:
        a = rng.random((size, size), dtype=np.float32)
        b = rng.random((size, size), dtype=np.float32)
        out = np.empty((size, size), np.float32)
        np.matmul(a, b.T, out=out)  # warm-up: BLAS threads, page faults
        best = min(_timed(lambda a=a, b=b, out=out: np.matmul(a, b.T, out=out)) for _ in range(repeats))
        per_size[size] = 2 * size**3 / best / 1e9
    return per_size


def measure_ceiling(sizes: Iterable[int] = (1024, 2048, 3072, 4096), *, samples: int = 3,
                    load_threshold: float | None = None, max_wait_s: float = 30.0,
                    sample_fn: Callable[[list[int]], dict[int, float]] | None = None,
                    load: Callable[[], float | None] = load_average,
                    sleep: Callable[[float], None] = time.sleep) -> dict:
    """The robust CPU ceiling: ``samples`` numpy samples (each the best per size of 3 runs), each taken after waiting
    for the 1-minute load average to drop below ``load_threshold`` (default: a quarter of the logical CPUs, at least
    0.5), ``max_wait_s`` of waiting in all; the ceiling is the best sample.

    NOTES: other processes only ever slow a sample down, so the best of several spaced samples is the least
    disturbed; a ceiling measured busy is what made rows read 1.15 "of peak". The loads are returned so the summary
    can say how quiet the machine was.

    Returns {"peak_gflops", "per_size" (best per size over samples), "samples" (best of each sample), "loads"
    (load average before each sample), "load_threshold", "sizes"}."""
    sizes = list(sizes)
    if samples < 1:
        raise ValueError(f"samples={samples} must be >= 1")
    threshold = load_threshold if load_threshold is not None else max(0.5, 0.25 * (os.cpu_count() or 1))
    sample_fn = sample_fn or numpy_ceiling_sample
    per_size: dict[int, float] = {}
    bests, loads = [], []
    budget = max_wait_s
    for _ in range(samples):
        seen, waited = wait_for_low_load(threshold, budget, load=load, sleep=sleep)
        budget -= waited
        loads.append(seen)
        got = sample_fn(sizes)
        bests.append(max(got.values()))
        for size, gflops in got.items():
            per_size[size] = max(per_size.get(size, 0.0), gflops)
    return {"peak_gflops": max(bests), "per_size": per_size, "samples": bests, "loads": loads,
            "load_threshold": threshold, "sizes": sizes}


def measure_fma_peak(seconds: float = FMA_RUN_SECONDS, repeats: int = FMA_REPEATS) -> dict:
    """The machine's fp32 FMA peak (deep_gemm.testing.measure_fma_peak: independent vector FMA chains on every CPU
    thread at once), best of ``repeats`` runs of about ``seconds``. Returns {"fma_peak_gflops" (all threads),
    "fma_peak_one_thread_gflops", "threads", "vector_bits"}; an upper bound no GEMM on this machine can beat."""
    from deep_gemm.testing.machine import measure_fma_peak as fma_peak

    got = fma_peak(seconds=seconds, repeats=repeats)
    return {"fma_peak_gflops": got.gflops, "fma_peak_one_thread_gflops": got.gflops_one_thread,
            "threads": got.threads, "vector_bits": got.vector_bits}


def measure_bandwidth(nbytes: int = 256 << 20, repeats: int = 5) -> dict:
    """Best copy bandwidth of one large numpy copy (np.copyto), counted as bytes read + bytes written, in GB/s."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.zeros_like(src)
    np.copyto(dst, src)
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(repeats))
    return {"bandwidth_gbs": 2 * src.nbytes / best / 1e9, "copy_bytes": src.nbytes}


def measure_machine(*, ceiling_gflops: float | None = None, bandwidth_gbs: float | None = None,
                    sizes: Iterable[int] = (1024, 2048, 3072, 4096), samples: int = 3, max_wait_s: float = 30.0,
                    fma: bool = True) -> dict:
    """Everything a row is normalised by, for the machine this runs on: identity, ceiling (given or measured),
    FMA peak (unless ``fma`` is False or the ceiling is given), bandwidth (given or measured), ridge."""
    info = machine_identity()
    if ceiling_gflops is not None:
        info.update(peak_gflops=ceiling_gflops, ceiling_sizes="given")
    else:
        got = measure_ceiling(sizes, samples=samples, max_wait_s=max_wait_s)
        info.update(peak_gflops=got["peak_gflops"], ceiling_sizes=got["sizes"],
                    ceiling_per_size={str(s): g for s, g in got["per_size"].items()},
                    ceiling_samples=got["samples"], ceiling_loads=got["loads"],
                    ceiling_load_threshold=got["load_threshold"])
        if fma:
            info["fma_peak_gflops"] = measure_fma_peak()["fma_peak_gflops"]
            # NOTES: no fp32 GEMM beats independent FMAs; a ceiling above the FMA peak means the FMA runs were
            # disturbed (the FMA runs need both threads quiet at once, a numpy sample only its best size).
            info["fma_below_ceiling"] = info["fma_peak_gflops"] < info["peak_gflops"]
    info["bandwidth_gbs"] = bandwidth_gbs if bandwidth_gbs is not None else measure_bandwidth()["bandwidth_gbs"]
    info["ridge"] = info["peak_gflops"] / info["bandwidth_gbs"]
    return info
