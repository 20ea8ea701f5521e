#!/usr/bin/env python
"""JIT figures: cold compile of a new specialization, loading a cached kernel in a fresh process, and the dispatch
overhead of a loaded kernel, for the example vector add and (when its template exists) fp8_gemm.

    python bench/jit_bench.py                 # both kernels, a fresh temporary cache
    python bench/jit_bench.py --kernels vadd --reps 5

Targets (the JIT's brief): cold compile <= 3 s median, warm load <= 0.3 s, dispatch <= 50 us. Wall and CPU times
are both printed: other processes share these cores, and CPU time is the steadier figure under load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_DEVICE = "deep_gemm.jit.example_device"

# Each kernel: how to build specialization i (a distinct cache key) and a launcher call for dispatch timing.
SETUP = {
    "vadd": textwrap.dedent(f"""
        import numpy as np
        from deep_gemm.jit import build

        def make(i):
            return build("vadd", {{"NUM_AI_CORES": 8, "TILE": 8 * (i + 1), "SCALE": 2.0}}, template="examples/vadd",
                         device_module={EXAMPLE_DEVICE!r})

        x = np.ones(8, np.float32); y = np.ones(8, np.float32); z = np.zeros(8, np.float32)
        u = np.zeros(1, np.uint8)

        def first_call(k):
            k(u, x, y, z, 8)

        def call(k):
            k(u, x, y, z, 8)
    """),
    "fp8_gemm": textwrap.dedent("""
        import numpy as np
        from deep_gemm.kernels import fp8_gemm as fp8

        def make(i):
            fp8.precompile_fp8_gemm(64, 1024 + 512 * i, 512)  # n is compiled in: one new kernel per i
            prepared = fp8._prepare(64, 1024 + 512 * i, 512, "fp8", "fp8", "bf16", "k", "k", False, "nk", None)
            return prepared.kernel

        u8, i16, u16 = np.zeros(1, np.uint8), np.zeros(1, np.int16), np.zeros(1, np.uint16)

        def first_call(kernel):
            pass  # make() compiled (or loaded) it already

        def call(kernel):
            # m = 0: no tiles, so this times the launch itself (per-core buffers and flag rings included)
            kernel(u8, 1, i16, 1, u8, 1, i16, 1, u16, 1, 0, 1024, 512, 1.0)
    """),
}

COLD = """
import json, statistics, time
t_start = time.perf_counter()
{setup}
from deep_gemm.jit import stats
# warm-up: the first specialization pays numba's per-process initialisation
t0, c0 = time.perf_counter(), time.process_time()
kernel = make(0); first_call(kernel)
first = (time.perf_counter() - t0, time.process_time() - c0)
walls, cpus = [], []
for i in range(1, {reps} + 1):
    t0, c0 = time.perf_counter(), time.process_time()
    kernel = make(i); first_call(kernel)
    walls.append(time.perf_counter() - t0); cpus.append(time.process_time() - c0)
print(json.dumps({{"first": first, "wall": walls, "cpu": cpus, "stats": stats()}}))
"""

WARM = """
import time
t_start = time.perf_counter()
import numba
t_numba = time.perf_counter()
{setup}
from deep_gemm.jit import stats
t_setup, c_setup = time.perf_counter(), time.process_time()
kernel = make(0); first_call(kernel)
t_loaded = time.perf_counter()
import json
print(json.dumps({{"import_numba": t_numba - t_start, "imports": t_setup - t_numba, "load": t_loaded - t_setup,
                  "load_cpu": time.process_time() - c_setup, "stats": stats()}}))
"""

DISPATCH = """
import json, time
{setup}
kernel = make(0); first_call(kernel); call(kernel)
times = []
for _ in range({calls}):
    t0 = time.perf_counter(); call(kernel); times.append(time.perf_counter() - t0)
times.sort()
print(json.dumps({{"min": times[0], "median": times[len(times) // 2], "p90": times[int(len(times) * 0.9)]}}))
"""


def run(code: str, cache_dir: str) -> dict:
    env = dict(os.environ, DG_JIT_CACHE_DIR=cache_dir)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_kernel(name: str, reps: int, calls: int, root: Path) -> None:
    setup = SETUP[name]
    cache_dir = str(root / name)
    cold = run(COLD.format(setup=setup, reps=reps), cache_dir)
    warm = [run(WARM.format(setup=setup), cache_dir) for _ in range(3)]
    dispatch = run(DISPATCH.format(setup=setup, calls=calls), cache_dir)
    med_wall, med_cpu = statistics.median(cold["wall"]), statistics.median(cold["cpu"])
    best_warm = min(warm, key=lambda w: w["load"])
    print(f"{name}")
    print(f"  cold compile, new specialization (median of {reps}): {med_wall:6.2f} s wall {med_cpu:6.2f} s cpu "
          f"[target <= 3 s]   (first in a fresh process: {cold['first'][0]:.2f} s wall, {cold['first'][1]:.2f} s cpu)")
    print(f"  warm load in a fresh process (best of 3): build + first call {best_warm['load']:6.3f} s wall "
          f"{best_warm['load_cpu']:6.3f} s cpu [target <= 0.3 s]   (import numba {best_warm['import_numba']:.3f} s, "
          f"other imports "
          f"{best_warm['imports']:.3f} s; compiles: {best_warm['stats'].get('numba_compile', 0)})")
    print(f"  dispatch of a loaded kernel: median {dispatch['median'] * 1e6:7.1f} us, "
          f"min {dispatch['min'] * 1e6:.1f} us, "
          f"p90 {dispatch['p90'] * 1e6:.1f} us [target <= 50 us]")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", nargs="+", default=["vadd", "fp8_gemm"], choices=sorted(SETUP))
    parser.add_argument("--reps", type=int, default=3, help="distinct specializations compiled cold")
    parser.add_argument("--calls", type=int, default=2000, help="calls timed for the dispatch figure")
    args = parser.parse_args()
    kernels = [k for k in args.kernels if k != "fp8_gemm" or (REPO / "templates" / "fp8_gemm.asc.j2").is_file()]
    with tempfile.TemporaryDirectory(prefix="dg-jit-bench-") as root:
        print(f"deep_gemm JIT bench ({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
              f"launcher {os.environ.get('DG_JIT_LAUNCHER', 'threads')})")
        t0 = time.perf_counter()
        for name in kernels:
            bench_kernel(name, args.reps, args.calls, Path(root))
        print(f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
