"""GFLOP/s of the Cube stand-in (deep_gemm.device.cube): Mmad alone on L2-resident tiles, and L1 -> L0 packing
plus Mmad, on 1 and 2 threads, against numpy fp32 matmul and the machine's fp32 FMA peak measured in the same run.
CPU numbers only.

    python bench/cube_bench.py [--tiles 128x256x128,16x256x256] [--rounds 7]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial

import numpy as np
from numba import njit, prange

from deep_gemm.device import cube
from deep_gemm.jit.numba_setup import vector_width_bits
from deep_gemm.testing import measure_fma_peak

DEFAULT_TILES = "128x256x64,128x256x128,128x256x256,64x128x256,16x256x256,16x128x512"


# ---------------------------------------------------------------------------------------------------------------
# Drivers: each "core" (a prange iteration) owns its own L1/L0 buffers, as on the chip.
# ---------------------------------------------------------------------------------------------------------------
@njit(cache=True, parallel=True)
def _mmad_only(l0c, l0a, l0b, mad_m, mad_n, mad_k, reps):
    for core in prange(l0c.shape[0]):
        for _ in range(reps):
            cube.mmad(l0c[core], l0a[core], l0b[core], mad_m, mad_n, mad_k, False)


@njit(cache=True, parallel=True)
def _pack_mmad(l0c, l0a, l0b, l1a, l1b, sfa, sfb, mad_m, mad_n, mad_k, reps, with_sf):
    block_k = l1a.shape[2]
    for core in prange(l0c.shape[0]):
        for r in range(reps):
            k0 = (r * mad_k) % block_k
            cube.load_l0a(l0a[core], l1a[core], sfa[core], 0, k0, mad_m, mad_k, with_sf)
            cube.load_l0b(l0b[core], l1b[core], sfb[core], 0, k0, mad_n, mad_k, with_sf)
            cube.mmad(l0c[core], l0a[core], l0b[core], mad_m, mad_n, mad_k, k0 == 0)


def _blas_set_threads():
    """A setter for numpy's OpenBLAS thread count (found among the loaded libraries), or None."""
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "openblas" in line.lower() and line.strip().endswith(".so")}
    except OSError:
        return None
    for lib in sorted(libs):
        handle = ctypes.CDLL(lib)
        for name in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_", "openblas_set_num_threads"):
            fn = getattr(handle, name, None)
            if fn is not None:
                return lambda n, fn=fn: fn(ctypes.c_int(n))
    return None


def _round_robin(fns: dict[str, Callable[[], object]], flop: dict[str, float], rounds: int, threads: int):
    """Median GFLOP/s of each callable over ``rounds`` rounds that call them in turn (so drifts in machine load hit
    all of them alike): wall clock, and per CPU-second of the busy threads (process CPU time / threads)."""
    for fn in fns.values():
        fn()
    wall = {name: [] for name in fns}
    cpu = {name: [] for name in fns}
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(reversed(fns))
        for name in order:
            c0, w0 = time.process_time(), time.perf_counter()
            fns[name]()
            w1, c1 = time.perf_counter(), time.process_time()
            wall[name].append(flop[name] / (w1 - w0) / 1e9)
            cpu[name].append(flop[name] / max((c1 - c0) / threads, 1e-9) / 1e9)
    return ({k: statistics.median(v) for k, v in wall.items()}, {k: statistics.median(v) for k, v in cpu.items()})


def run(tiles: list[tuple[int, int, int]], rounds: int) -> None:
    import numba

    rng = np.random.default_rng(0)
    set_blas_threads = _blas_set_threads()
    print(f"# host: {vector_width_bits()}-bit vectors, micro-tile {cube.MR}x{cube.NR}, KC={cube.KC}, "
          f"numba {numba.__version__}, numba threads {numba.get_num_threads()}, OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}; medians of {rounds} rounds; "
          f"load average {os.getloadavg()[0]:.2f}")
    peak = measure_fma_peak(threads=2) if (os.cpu_count() or 1) >= 2 else measure_fma_peak(threads=1)
    print(f"# measured fp32 FMA peak (deep_gemm.testing.measure_fma_peak): {peak.gflops_one_thread:.1f} GFLOP/s on 1 "
          f"thread, {peak.gflops:.1f} on {peak.threads}; {peak.vector_bits}-bit FMAs")

    # numpy ceilings, same run (NOTES: a @ b.T with two distinct arrays: a @ a.T would take numpy's syrk path)
    big = 2048
    a = rng.standard_normal((big, big), dtype=np.float32)
    b = rng.standard_normal((big, big), dtype=np.float32)
    for threads in (1, 2):
        if set_blas_threads is None and threads == 1:
            continue
        if set_blas_threads is not None:
            set_blas_threads(threads)
        w, c = _round_robin({"np": lambda: a @ b.T}, {"np": 2.0 * big**3}, rounds, threads)
        print(f"numpy fp32 a @ b.T {big}^3, {threads} thread(s): {w['np']:7.1f} GFLOP/s wall "
              f"({c['np']:.1f} per CPU-second per thread)")
    if set_blas_threads is not None:
        set_blas_threads(2)

    print(f"{'tile MxNxK':>14} {'thr':>3} {'mmad':>13} {'pack+mmad':>13} {'pack_sf+mmad':>13} {'numpy tile':>13}"
          "   GFLOP/s wall [per CPU-second per thread]; numpy tile: a @ b.T of one tile, 1 thread")
    for mad_m, mad_n, mad_k in tiles:
        block_k = 2 * mad_k
        for threads in (1, 2):
            numba.set_num_threads(threads)
            cores = threads
            l0a = np.zeros((cores, cube.l0a_size(mad_m, mad_k)), np.float32)
            l0b = np.zeros((cores, cube.l0b_size(mad_n, mad_k)), np.float32)
            l0c = np.zeros((cores, mad_m, mad_n), np.float32)
            l1a = rng.standard_normal((cores, mad_m, block_k), dtype=np.float32)
            l1b = rng.standard_normal((cores, mad_n, block_k), dtype=np.float32)
            sfa = rng.integers(120, 135, (cores, mad_m, block_k // 32), dtype=np.uint8)
            sfb = rng.integers(120, 135, (cores, mad_n, block_k // 32), dtype=np.uint8)
            flop_tile = 2.0 * mad_m * mad_n * mad_k
            reps = max(4, int(1e8 / flop_tile))
            flop = flop_tile * reps * cores
            fns = {
                "mmad": partial(_mmad_only, l0c, l0a, l0b, mad_m, mad_n, mad_k, reps),
                "pack": partial(_pack_mmad, l0c, l0a, l0b, l1a, l1b, sfa, sfb, mad_m, mad_n, mad_k, reps, False),
                "pack_sf": partial(_pack_mmad, l0c, l0a, l0b, l1a, l1b, sfa, sfb, mad_m, mad_n, mad_k, reps, True),
            }
            flops = dict.fromkeys(fns, flop)
            if threads == 1 and set_blas_threads is not None:
                ta, tb = l1a[0, :, :mad_k].copy(), l1b[0, :, :mad_k].copy()
                fns["numpy"] = partial(_numpy_tiles, ta, tb, reps)
                flops["numpy"] = flop_tile * reps
                set_blas_threads(1)
            wall, cpu = _round_robin(fns, flops, rounds, threads)
            if set_blas_threads is not None:
                set_blas_threads(2)
            cols = [f"{wall[x]:6.1f} [{cpu[x]:4.0f}]" if x in wall else f"{'-':>13}"
                    for x in ("mmad", "pack", "pack_sf", "numpy")]
            print(f"{f'{mad_m}x{mad_n}x{mad_k}':>14} {threads:>3} " + " ".join(f"{c:>13}" for c in cols), flush=True)



def _numpy_tiles(ta: np.ndarray, tb: np.ndarray, reps: int) -> list[np.ndarray]:
    """numpy's matmul of one tile ``reps`` times (the one-thread BLAS row)."""
    return [ta @ tb.T for _ in range(reps)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiles", default=DEFAULT_TILES, help="comma-separated MxNxK mad tiles")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per figure (median reported)")
    args = parser.parse_args(argv)
    tiles = []
    for item in args.tiles.split(","):
        try:
            m, n, k = (int(x) for x in item.lower().split("x"))
        except ValueError:
            parser.error(f"bad tile {item!r}: expected MxNxK")
        tiles.append((m, n, k))
    if os.cpu_count() and os.cpu_count() < 2:
        print("# note: fewer than 2 CPUs; the 2-thread rows share one core", file=sys.stderr)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    run(tiles, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
