#!/usr/bin/env python
"""JIT figures against the performance targets: start-up of a fresh process that calls one cached kernel, dispatch
of a loaded kernel, and cold compiles, for fp8_gemm, the mixed kernels (tf32_hc_prenorm_gemm, mqa_logits,
paged_mqa_logits: AIC and AIVs with cross-core flags) and the example vector add, for reference.

    python bench/jit_bench.py                 # every kernel, a fresh temporary cache
    python bench/jit_bench.py --kernels fp8_gemm --reps 1 --calls 500

Rows and targets (fp8_gemm; issue 28's):
  start-up: a fresh process runs `import deep_gemm` and its first call of a cached 2048^3 FP8 kernel; the checked
            figure is that wall time less one steady call of the same GEMM (the start-up cost, compute excluded;
            the raw wall is printed beside it), median of 3 processes       <= 0.3 s
  dispatch: one launch of a loaded kernel with no tiles (m = 0), median     <= 20 us
  compile:  cold compile of a new specialization (median of --reps)         <= 2 s
            the first one in a fresh process with a cold cache             <= 6 s
The mixed kernels have the compile rows only, each <= 10 s (issue 28): tf32_hc_prenorm_gemm (M = 16, N = 24,
K = 1024 + 64 i: K is compiled in), mqa_logits and paged_mqa_logits (attention_bench's operands on 32 - i logical
cores: NUM_AI_CORES is compiled in). The vector add keeps the bench's first targets (3 s and 8 s), and has no
start-up row.
Wall and CPU times are both printed: other processes share these cores, and CPU time is the steadier figure under
load. Each figure comes from its own child process with DG_JIT_CACHE_DIR set to a temporary directory. A cold first
compile runs with the warm-up helper (deep_gemm/jit/warmup.py: a second process compiles the kernel's device functions
on the other CPU) unless DG_JIT_WARMUP=0; its CPU time is printed beside the row, and the same compile without it.

    python bench/jit_bench.py --record-plans  # rewrite deep_gemm/jit/warmup_plans.json from cold compiles
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
from dataclasses import dataclass
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
        from deep_gemm.kernels.common import prepare_gemm

        def make(i):
            fp8.precompile_fp8_gemm(64, 1024 + 512 * i, 512)  # n is compiled in: one new kernel per i
            return prepare_gemm(fp8.FP8_GEMM, 64, 1024 + 512 * i, 512, "fp8", "fp8", "bf16", "k", "k", False, "nk")

        u8, i16, u16 = np.zeros(1, np.uint8), np.zeros(1, np.int16), np.zeros(1, np.uint16)

        def first_call(prepared):
            pass  # make() compiled (or loaded) it already

        def call(prepared):
            # m = 0: no tiles, so this times the launch itself (arguments bound by name and checked, per-core
            # buffers and flag rings included)
            prepared.launch(gm_a=u8, stride_a=1, gm_sfa=i16, stride_sfa=1, gm_b=u8, stride_b=1, gm_sfb=i16,
                            stride_sfb=1, gm_d=u16, stride_d=1, shape_m=0, shape_n=1024, shape_k=512, alpha=1.0)
    """),
    "hc_prenorm": textwrap.dedent("""
        import ml_dtypes
        import numpy as np
        from deep_gemm.kernels.hc_prenorm import launch_hc_prenorm

        def make(i):
            k = 1024 + 64 * i  # K is compiled in: one new kernel per i
            return (np.ones((16, k), ml_dtypes.bfloat16), np.ones((24, k), np.float32), np.empty((16, 24), np.float32),
                    np.empty(16, np.float32))

        def first_call(operands):
            launch_hc_prenorm(*operands, 0, False)  # a mixed kernel compiles (or loads) on its first launch

        call = first_call
    """),
}
# NOTES: the MQA-logits kernels compile NUM_AI_CORES in: specialization i runs on 32 - i logical cores (a user tuning
# set_num_ai_cores gets a new kernel the same way). Operands: attention_bench's (32 query rows, 2048 keys; the
# ragged kernel with per-key fp32 scales, the paged one over 4 sequences of ~512 tokens).
_MQA_SETUP = """
    import sys
    sys.path.insert(0, "bench")
    import numpy as np
    import attention_bench
    import deep_gemm

    _inputs = attention_bench.{inputs}(np.random.default_rng(0), {shape})

    def make(i):
        deep_gemm.set_num_ai_cores(32 - i)  # NUM_AI_CORES is compiled in: one new kernel per i
        return attention_bench.{stand_in}(*_inputs)  # (the paged schedule is built for the core count)

    def first_call(call):
        call()  # a mixed kernel compiles (or loads) on its first launch

    call = first_call
"""
SETUP["mqa_logits"] = textwrap.dedent(_MQA_SETUP.format(stand_in="stand_in_ragged", inputs="ragged_inputs",
                                                        shape="32, 2048"))
SETUP["paged_mqa_logits"] = textwrap.dedent(_MQA_SETUP.format(stand_in="stand_in_paged", inputs="paged_inputs",
                                                              shape="4, 512"))

# Recorded for the warm-up plans only (--record-plans; no rows): the other kernel families, each call small. The
# grouped GEMMs are fp8_gemm / bf16_gemm kernels with other constants (their plans are merged with the dense ones).
PLAN_SETUP = {
    "bf16_gemm": """
        import ml_dtypes
        import numpy as np
        import deep_gemm
        from deep_gemm.testing import grouped_layouts

        bf16 = lambda *shape: np.random.default_rng(0).standard_normal(shape).astype(ml_dtypes.bfloat16)

        def make(i):
            return None

        def first_call(_):
            deep_gemm.bf16_gemm_nt(bf16(64, 512), bf16(256, 512), np.empty((64, 256), ml_dtypes.bfloat16))
            psum, _, m = grouped_layouts([100, 60])
            deep_gemm.m_grouped_bf16_gemm_nt_contiguous(bf16(m, 512), bf16(2, 256, 512),
                                                        np.empty((m, 256), ml_dtypes.bfloat16), psum)
            deep_gemm.m_grouped_bf16_gemm_nt_masked(bf16(2, 32, 512), bf16(2, 256, 512),
                                                    np.empty((2, 32, 256), ml_dtypes.bfloat16),
                                                    np.array([32, 5], np.int32), 32)
            psum_k, _, k_total = grouped_layouts([256, 256])
            deep_gemm.k_grouped_bf16_gemm_tn_contiguous(bf16(k_total, 48), bf16(k_total, 256),
                                                        np.zeros((2, 48, 256), np.float32), [256, 256], psum_k)
    """,
    "fp8_grouped": """
        import ml_dtypes
        import numpy as np
        import deep_gemm
        from deep_gemm.testing import grouped_layouts
        from deep_gemm.utils import per_token_cast_to_fp8

        rng = np.random.default_rng(0)
        fp8 = lambda *shape: per_token_cast_to_fp8(rng.standard_normal(shape).astype(np.float32), use_ue8m0=True,
                                                   gran_k=32)
        stack = lambda pairs: tuple(np.stack(t) for t in zip(*pairs))

        def make(i):
            return None

        def first_call(_):
            experts = stack([fp8(256, 512) for _ in range(2)])
            psum, _, m = grouped_layouts([100, 60])
            deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous(fp8(m, 512), experts,
                                                           np.empty((m, 256), ml_dtypes.bfloat16), psum)
            deep_gemm.m_grouped_fp8_fp4_gemm_nt_masked(stack([fp8(32, 512) for _ in range(2)]), experts,
                                                       np.empty((2, 32, 256), ml_dtypes.bfloat16),
                                                       np.array([32, 5], np.int32), 32)
    """,
    "sparse_attention": """
        import runpy

        def make(i):
            return None

        def first_call(_):
            runpy.run_path("examples/sparse_attention.py")  # paged MQA logits (fp32), topk, FlashMLA decode
    """,
    "flash_mla_prefill": """
        import ml_dtypes
        import numpy as np
        import deep_gemm

        rng = np.random.default_rng(0)

        def make(i):
            return None

        def first_call(_):
            q = (rng.standard_normal((4, 64, 512)) * 0.1).astype(ml_dtypes.bfloat16)
            kv = (rng.standard_normal((200, 1, 512)) * 0.1).astype(ml_dtypes.bfloat16)
            idx = np.stack([rng.permutation(200)[:128] for _ in range(4)]).astype(np.int32)[:, None, :]
            deep_gemm.flash_mla_sparse_fwd(q, kv, idx, 512 ** -0.5)
    """,
}
PLAN_SETUP = {name: textwrap.dedent(code) for name, code in PLAN_SETUP.items()}

# Per kernel: the targets of its new-specialization and first-in-a-fresh-process compiles (seconds), and whether it
# has the warm-load and dispatch rows.
TARGETS = {"vadd": (3.0, 8.0, True), "fp8_gemm": (2.0, 6.0, True), "hc_prenorm": (10.0, 10.0, False),
           "mqa_logits": (10.0, 10.0, False), "paged_mqa_logits": (10.0, 10.0, False)}

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
import resource
from deep_gemm.jit import warmup
from deep_gemm.jit.compile import wait_native_builds
warmup.stop_all(); wait_native_builds()
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({{"first": first, "wall": walls, "cpu": cpus, "stats": stats(),
                  "children_cpu": usage.ru_utime + usage.ru_stime}}))
"""

WARM = """
import sys, time
t_start = time.perf_counter()
{setup}
from deep_gemm.jit import stats
t_setup, c_setup = time.perf_counter(), time.process_time()
kernel = make(0); first_call(kernel)
t_loaded = time.perf_counter()
import json
print(json.dumps({{"imports": t_setup - t_start, "load": t_loaded - t_setup, "load_cpu": time.process_time() - c_setup,
                  "numba_loaded": "numba" in sys.modules, "stats": stats()}}))
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

# One cold compile with deep_gemm.jit.warmup.Recorder on: the device functions each kernel's code asks for, in order
# (record_plans runs it with the helper off: nothing else compiles beside it).
RECORD = """
import json
{setup}
from deep_gemm.jit import warmup
with warmup.Recorder() as recorder:
    kernel = make(0); first_call(kernel)
print(json.dumps(recorder.plans))
"""


# The FP8 operands of an M = N = K = {size} call, made with numpy and ml_dtypes only (a child script's lines, before
# `import deep_gemm`; startup_bench.py uses them too).
FP8_OPERANDS = """m = n = k = {size}
rng = np.random.default_rng(0)
def operand(mn):
    codes = rng.integers(0, 256, size=(mn, k), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0
    sf = np.ldexp(np.float32(1), rng.integers(-9, -6, size=(mn, k // 32))).astype(np.float32)
    return codes.view(ml_dtypes.float8_e4m3fn), sf
a, b = operand(m), operand(n)
d = np.empty((m, n), ml_dtypes.bfloat16)
"""

# NOTES: the operands are made before the clock starts (with numpy and ml_dtypes only, which a user's process has
# anyway); the clock then covers `import deep_gemm` and the first call, and a second call gives the compute alone.
STARTUP = """
import json, sys, time
import numpy as np
import ml_dtypes
""" + FP8_OPERANDS + """t0, c0 = time.perf_counter(), time.process_time()
import deep_gemm
t1 = time.perf_counter()
deep_gemm.fp8_gemm_nt(a, b, d)
t2, c2 = time.perf_counter(), time.process_time()
deep_gemm.fp8_gemm_nt(a, b, d)
t3 = time.perf_counter()
from deep_gemm.jit import stats
print(json.dumps({{"import": t1 - t0, "first": t2 - t1, "wall": t2 - t0, "cpu": c2 - c0, "steady": t3 - t2,
                  "numba_loaded": "numba" in sys.modules, "stats": stats()}}))
"""

STARTUP_SIZE = 2048


@dataclass
class Row:
    """One checked figure: its name, target text, measured value (unit "s" or "us"), verdict and details."""

    name: str
    target: str
    value: float
    unit: str
    passed: bool
    detail: str

    def line(self) -> str:
        value = f"{self.value:8.3f} s" if self.unit == "s" else f"{self.value:8.1f} us"
        return (f"{'PASS' if self.passed else 'FAIL'}  {self.name:<64} target {self.target:<10} measured {value}  "
                f"({self.detail})")


def run(code: str, cache_dir: str, **env_vars: str) -> dict:
    env = dict(os.environ, DG_JIT_CACHE_DIR=cache_dir, **env_vars)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def record_plans(setups: list[str], out: Path | None = None) -> Path:
    """Rewrite ``out`` (deep_gemm/jit/warmup_plans.json) from one cold compile of each setup (SETUP's or
    PLAN_SETUP's; each in a fresh child process with an empty cache; the helper off). Returns the file written.

    NOTES: a kernel several setups compile (dense and grouped GEMMs) gets the union; the entries a later setup adds
    go in front, so that the helper, which starts from the end, works for the first setup's variant first."""
    from deep_gemm.jit import warmup

    out = warmup.PLANS_FILE if out is None else out
    plans: dict[str, list] = {}
    for name in setups:
        with tempfile.TemporaryDirectory(prefix="dg-jit-plan-") as cache_dir:
            recorded = run(RECORD.format(setup={**SETUP, **PLAN_SETUP}[name]), cache_dir, DG_JIT_WARMUP="0")
        for kernel, entries in recorded.items():
            known = plans.setdefault(kernel, [])
            plans[kernel] = [e for e in entries if e not in known] + known
        print(f"{name}: " + ", ".join(f"{k} {len(v)} entries" for k, v in recorded.items()), flush=True)
    about = ("deep_gemm.jit.warmup's plans: per kernel, the device functions (module, qualname, argument types) its "
             "code asks numba to compile, in that order. Written by python bench/jit_bench.py --record-plans.")
    kernels_text = ",\n".join(f"  {json.dumps(k)}: [\n" + ",\n".join(f"   {json.dumps(e)}" for e in v) + "\n  ]"
                               for k, v in sorted(plans.items()))
    text = f'{{\n "about": {json.dumps(about)},\n "plans": {{\n{kernels_text}\n }}\n}}\n'
    assert json.loads(text)["plans"] == plans
    out.write_text(text)
    return out


def startup_row(cache_dir: str, runs: int = 3, size: int = STARTUP_SIZE) -> Row:
    """Fresh process: `import deep_gemm` + first call of a cached size^3 FP8 kernel (one untimed child fills the
    cache first), median over ``runs`` processes of (that wall - one steady call)."""
    code = STARTUP.format(size=size)
    run(code, cache_dir)  # compiles (or loads) the kernel into this cache: not timed
    results = [run(code, cache_dir) for _ in range(runs)]
    overheads = [r["wall"] - r["steady"] for r in results]
    med = {key: statistics.median(r[key] for r in results) for key in ("import", "first", "wall", "cpu", "steady")}
    value = statistics.median(overheads)
    detail = (f"median of {runs} processes: wall {med['wall']:.3f} s = import deep_gemm {med['import']:.3f} s + "
              f"first call {med['first']:.3f} s (cpu {med['cpu']:.3f} s); steady call {med['steady']:.3f} s; "
              f"numba imported: {results[0]['numba_loaded']}; native library loaded: "
              f"{results[0]['stats'].get('native_load', 0)}; compiles: {results[0]['stats'].get('numba_compile', 0)}")
    return Row(f"start-up: import + first call, cached FP8 {size}^3 (wall - compute)", "<= 0.3 s", value, "s",
               value <= 0.3, detail)


def kernel_rows(name: str, reps: int, calls: int, root: Path) -> list[Row]:
    """Cold compile (new specialization; first in a fresh process with a cold cache), warm load and dispatch rows
    of one kernel, each from child processes sharing the cache directory root/name."""
    setup = SETUP[name]
    new_target, first_target, loaded_rows = TARGETS[name]
    cache_dir = str(root / name)
    cold = run(COLD.format(setup=setup, reps=reps), cache_dir)
    med_wall, med_cpu = statistics.median(cold["wall"]), statistics.median(cold["cpu"])
    first_wall, first_cpu = cold["first"]
    helpers = cold["stats"].get("warmup_start", 0)
    reference = ""
    if helpers:  # the same first compile without the helper, right after (a cache of its own), for comparison
        off = run(COLD.format(setup=setup, reps=0), str(root / f"{name}-no-helper"), DG_JIT_WARMUP="0")
        reference = f"; without the helper (DG_JIT_WARMUP=0, the next child) {off['first'][0]:.3f} s"
    compiles = [
        Row(f"{name}: cold compile, new specialization (median of {reps})", f"<= {new_target:g} s", med_wall, "s",
            med_wall <= new_target, f"{med_cpu:.2f} s cpu"),
        Row(f"{name}: cold compile, first in a fresh process, cold cache", f"<= {first_target:g} s", first_wall, "s",
            first_wall <= first_target,
            f"{first_cpu:.2f} s cpu; warm-up helpers started: {helpers}; child processes "
            f"{cold['children_cpu']:.2f} s cpu over the child's run (the helpers, the C compiler){reference}"),
    ]
    if not loaded_rows:
        return compiles
    warm = [run(WARM.format(setup=setup), cache_dir) for _ in range(3)]
    dispatch = run(DISPATCH.format(setup=setup, calls=calls), cache_dir)
    best_warm = min(warm, key=lambda w: w["load"])
    us = dispatch["median"] * 1e6
    return compiles + [
        Row(f"{name}: warm load in a fresh process (best of 3)", "<= 0.3 s", best_warm["load"], "s",
            best_warm["load"] <= 0.3,
            f"build + first call after the imports; {best_warm['load_cpu']:.3f} s cpu; imports "
            f"{best_warm['imports']:.3f} s; numba imported: {best_warm['numba_loaded']}; native library loaded: "
            f"{best_warm['stats'].get('native_load', 0)}; compiles: {best_warm['stats'].get('numba_compile', 0)}"),
        Row(f"{name}: dispatch of a loaded kernel (median of {calls})", "<= 20 us", us, "us", us <= 20,
            f"min {dispatch['min'] * 1e6:.1f} us, p90 {dispatch['p90'] * 1e6:.1f} us"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", nargs="+", default=list(SETUP), choices=sorted(SETUP))
    parser.add_argument("--reps", type=int, default=3, help="distinct specializations compiled cold")
    parser.add_argument("--calls", type=int, default=2000, help="calls timed for the dispatch figure")
    parser.add_argument("--startup-runs", type=int, default=3,
                        help="fresh processes timed for the start-up row (0: skip it)")
    parser.add_argument("--startup-size", type=int, default=STARTUP_SIZE,
                        help="M = N = K of the cached FP8 kernel the start-up row calls")
    parser.add_argument("--record-plans", action="store_true",
                        help="rewrite deep_gemm/jit/warmup_plans.json from cold compiles of --kernels, then exit")
    args = parser.parse_args(argv)
    for flag, value, low in (("--reps", args.reps, 1), ("--calls", args.calls, 1),
                             ("--startup-runs", args.startup_runs, 0), ("--startup-size", args.startup_size, 32)):
        if value < low:
            parser.error(f"{flag} must be >= {low}, got {value}")
    templates = {"fp8_gemm": "fp8_gemm.asc.j2", "hc_prenorm": "tf32_hc_prenorm_gemm.asc.j2",
                 "mqa_logits": "mqa_logits.asc.j2", "paged_mqa_logits": "paged_mqa_logits.asc.j2"}
    kernels = [k for k in args.kernels if k not in templates or (REPO / "templates" / templates[k]).is_file()]
    if args.record_plans:
        print(f"wrote {record_plans(kernels + list(PLAN_SETUP))}")
        return 0
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="dg-jit-bench-") as root:
        print(f"deep_gemm JIT bench ({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
              f"launcher {os.environ.get('DG_JIT_LAUNCHER', 'threads')})")
        t0 = time.perf_counter()
        for name in kernels:
            for row in kernel_rows(name, args.reps, args.calls, Path(root)):
                rows.append(row)
                print(row.line(), flush=True)
        if "fp8_gemm" in kernels and args.startup_runs:
            row = startup_row(str(Path(root) / "fp8_gemm"), args.startup_runs, args.startup_size)
            rows.append(row)
            print(row.line(), flush=True)
        print(f"# load average {os.getloadavg()[0]:.2f}; ({time.perf_counter() - t0:.0f} s)")
    failed = [r.name for r in rows if not r.passed]
    print(f"# {len(rows) - len(failed)}/{len(rows)} rows met their target" +
          (f"; missed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
