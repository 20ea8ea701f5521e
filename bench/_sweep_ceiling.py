"""This machine's roofline for the CPU sweep: who it is (host, CPU model), a robust numpy fp32 ceiling (the best of
several samples, taken when the load average is low when it gets low), the FMA peak of all threads (a numba
micro-benchmark of independent FMAs) and the copy bandwidth.

Measures only; the sweep decides which figure normalises its rows (the numpy ceiling, or --ceiling-gflops).
"""

from __future__ import annotations

import os
import platform
import socket
import time
from collections.abc import Callable, Iterable

import numpy as np

# NOTES: 128 fp32 accumulators per thread = 16 AVX2 (8 AVX-512) vector registers of independent FMA chains, enough to
# cover the FMA latency (4-5 cycles) on two FMA ports; fewer lanes measured latency, not throughput (64 lanes gave
# 0.8x of 128 on the project's machine).
FMA_LANES = 128


def machine_identity() -> dict:
    """{"host": hostname, "cpu_model": the CPU's model name (/proc/cpuinfo, else platform), "cpu_count": logical}."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"host": socket.gethostname(), "cpu_model": model or platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count() or 1}


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


def _fma_kernel():
    """The numba FMA micro-kernel, compiled on first use (numba is a dependency of deep_gemm anyway)."""
    from numba import njit, prange

    lanes = FMA_LANES

    @njit(parallel=True, fastmath=True, cache=False)
    def fma_chains(n_iter, n_threads):
        out = np.zeros(n_threads, np.float32)
        for t in prange(n_threads):
            acc = np.empty(lanes, np.float32)
            for j in range(lanes):
                acc[j] = np.float32(1.0) + np.float32(t * 1e-7 + j * 1e-9)
            x = np.float32(0.9999999)
            y = np.float32(1e-8)
            for _ in range(n_iter):
                for j in range(lanes):
                    acc[j] = acc[j] * x + y
            s = np.float32(0.0)
            for j in range(lanes):
                s += acc[j]
            out[t] = s
        return out

    return fma_chains


def measure_fma_peak(n_iter: int = 1 << 20, repeats: int = 100) -> dict:
    """The machine's fp32 FMA peak: ``FMA_LANES`` independent multiply-add chains per thread on every numba thread
    (one per logical CPU by default), ``n_iter`` steps each, 2 FLOP per FMA, best of ``repeats`` runs.

    NOTES: short runs, many of them, of a fixed size: a parallel run lasts as long as its slowest thread, so on a
    shared machine a long run always contains someone else's time slice and reads low (0.5 s runs read 20-35
    GFLOP/s under a load of 8 where ~3 ms runs found 160), and sizing the run from a timed probe fails the same
    way. 2^20 steps are ~3 ms per thread at AVX2 speed, whatever the thread count.

    Returns {"fma_peak_gflops", "threads", "lanes"}; an upper bound no GEMM on this machine can beat."""
    import numba

    kernel = _fma_kernel()
    threads = numba.get_num_threads()
    kernel(10, threads)  # compile
    best = min(_timed(lambda: kernel(n_iter, threads)) for _ in range(repeats))
    return {"fma_peak_gflops": 2 * FMA_LANES * n_iter * threads / best / 1e9, "threads": threads,
            "lanes": FMA_LANES}


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
