"""The performance targets of the CPU stand-in, checked in one run against the peers a user would pick instead
(numpy, torch on the CPU and JAX, the latter two when installed): each line prints the target, the measured ratio,
the absolute figures of every library, and the stand-in's fraction of the machine's measured FMA (and AMX) peak.
CPU numbers only.

    python bench/perf_check.py                          # every row (a quiet machine; several minutes)
    python bench/perf_check.py --rows fp8-m16,threads --blocks 3 --calls 2
    python bench/perf_check.py --list

Rows and targets (same-run ratios):
  bf16-2048, bf16-4096x7168   BF16 GEMM vs numpy fp32 `a @ b.T`          >= 0.90x
                              ... vs JAX bf16 jnp.dot (fp32 accumulation) >= 1.2x
                              ... vs torch bf16 `a @ b.T`, default threads >= 1.2x  (issue 28)
                              ... vs torch at its best thread count       >= 1.0x  (issue 28)
                              ... fraction of the measured FMA peak       >= 0.65
                              ... fraction of the measured AMX peak       >= 0.6   (issue 28; AMX hosts only)
  fp8-2048, fp8-4096x7168     FP8 GEMM vs the best peer                   >= 1.5x  (issue 28)
  fp8-m128 (128x7168x2048)    vs the best peer >= 5x (issue 28); vs the best numpy >= 3.5x, vs JAX >= 1.5x
  fp8-m16  (16x7168x2048)     vs the best peer >= 5x (issue 28); vs the best numpy >= 5x,   vs JAX >= 3x
  threads                     BF16 4096x7168x2048, 2 threads vs 1         >= 1.85x
  startup, jit                start-up, dispatch and cold compiles (bench/jit_bench.py's rows, fresh cache):
                              FP8 GEMM new specialization <= 2 s, first in a fresh process <= 6 s (issue 28)
  jit-mixed                   cold compiles of the mixed kernels (tf32_hc_prenorm_gemm, mqa_logits,
                              paged_mqa_logits) <= 10 s (issue 28)
The numpy FP8 peer is the strongest numpy formulation (deep_gemm.testing.peers.numpy_fp8_gemm: 256-entry table
decode, in-place block scaling, fp32 matmul, cast to bf16); the naive astype formulation is printed beside it for
reference (--no-naive leaves it out). JAX (optional: pip install deep_gemm[peers]) runs the same problem through
jax.jit: decode + scale + jnp.dot for FP8, jnp.dot(..., preferred_element_type=float32) for BF16, each call waited
for with block_until_ready; without JAX its checks print as not measured. torch (optional: pip install
deep_gemm[torch]) is written as a torch user writes it: bf16 `a @ b.T` on CPU tensors; FP8 operands stay
float8_e4m3fn in memory and every call decodes them (cast to bf16, block scales applied) before `x @ w.T`. torch
is timed at its default thread count and at every other count from 1 to the usable CPUs, each as a library of its
own (its own steady state); "best thread count" is the one with the lowest median. The best peer of a row is, per
round, the fastest of numpy (LUT), JAX and torch at any thread count. Kernels compile on their first, untimed
call. Exit status 1 when a measured row misses its target. --json PATH also writes every row (target, value,
verdict, and every library's seconds per call, torch's columns included) as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np

import deep_gemm
from deep_gemm.testing import STEADY_PROTOCOL, SteadyTiming, bench_steady, generators, machine, peers
from deep_gemm.testing.bench import WARM_BLOCK_S

BF16 = ml_dtypes.bfloat16
LARGE_SHAPES = ((2048, 2048, 2048), (4096, 7168, 2048))
STANDIN = "stand-in"
WARM_MS = round(1000 * WARM_BLOCK_S)  # bench_steady's default
TORCH = "torch"


@dataclass
class Options:
    blocks: int = 5
    calls: int = 3
    naive: bool = True
    peak: machine.FmaPeak | None = None
    amx_peak: machine.FmaPeak | None = None  # the AMX-BF16 unit's, where the host has one (the Cube runs there)
    # the AVX512-BF16 dot products', where the host has them and no AMX (the Cube's bf16 path runs there)
    dpbf16_peak: machine.FmaPeak | None = None
    jit_root: Path | None = None


@dataclass
class Result:
    name: str
    target: str
    value: float  # the checked quantity (a ratio, a fraction or seconds); nan when not measured
    unit: str  # "x", "" (fraction), "s" or "us"
    passed: bool | None  # None: not measured (a peer is missing)
    detail: str
    times: dict[str, float] = field(default_factory=dict)  # seconds per call of every library timed for the row

    def line(self) -> str:
        verdict = {True: "PASS", False: "FAIL", None: "n/a "}[self.passed]
        if self.value != self.value:
            value = "      --"
        elif self.unit in ("x", ""):
            value = f"{self.value:7.2f}{self.unit or ' '}"
        elif self.unit == "us":
            value = f"{self.value:6.1f}us"
        else:
            value = f"{self.value:7.3f}{self.unit}"
        return f"{verdict}  {self.name:<64} target {self.target:<9} measured {value}  ({self.detail})"


def _gflops(shape, seconds: float) -> float:
    m, n, k = shape
    return 2.0 * m * n * k / seconds / 1e9


def _figures(timing: SteadyTiming, shape, peak: machine.FmaPeak | None) -> str:
    """'name ms GFLOP/s [fraction of peak]' for every library timed."""
    parts = []
    for name in timing.blocks:
        t = timing.median(name)
        gf = _gflops(shape, t)
        frac = f" {peak.fraction(gf):.2f} peak" if peak else ""
        parts.append(f"{_label(name)} {t * 1e3:.1f} ms {gf:.1f} GFLOP/s{frac}")
    return " | ".join(parts)


def _times(timing: SteadyTiming) -> dict[str, float]:
    return {_label(name): timing.median(name) for name in timing.blocks}


# ---------------------------------------------------------------------------------------------------------------
# torch: one library entry per thread count (peers.torch_variants)
# ---------------------------------------------------------------------------------------------------------------
def _torch_missing() -> str:
    return "torch not installed: pip install deep_gemm[torch]"


def _torch_threads(name: str) -> int:
    return peers.torch_default_threads() if name == TORCH else int(name[len(TORCH) + 1:-1])


def _label(name: str) -> str:
    """A library's name in the output: torch entries say their thread count."""
    if name == TORCH:
        return f"torch({peers.torch_default_threads()}t default)"
    if name.startswith(TORCH + "-"):
        return f"torch({_torch_threads(name)}t)"
    return name


def torch_names(names) -> list[str]:
    return [n for n in names if n == TORCH or n.startswith(TORCH + "-")]


def best_torch(timing: SteadyTiming) -> str:
    """The torch entry (thread count) with the lowest median."""
    return min(torch_names(timing.blocks), key=timing.median)


def _torch_rows(label: str, what: str, timing: SteadyTiming, has_torch: bool, default_target: float,
                best_target: float, detail: str) -> list[Result]:
    """'vs torch at its default threads' and 'vs torch at its best thread count' rows."""
    name_default = f"{label} vs {what}, default threads"
    name_best = f"{label} vs {what}, best thread count"
    if not has_torch:
        return [_missing(name_default, default_target, _torch_missing()),
                _missing(name_best, best_target, _torch_missing())]
    best = best_torch(timing)
    return [_check(name_default, default_target, timing.speedup(STANDIN, over=TORCH), detail),
            _check(name_best, best_target, timing.speedup(STANDIN, over=best),
                   f"best: {_torch_threads(best)} thread(s); {detail}")]


def _check(name: str, target: float, value: float, detail: str, unit: str = "x") -> Result:
    text = f">= {target:.2f}{unit}"
    return Result(name, text, value, unit, value >= target, detail)


def _missing(name: str, target: float, why: str) -> Result:
    return Result(name, f">= {target:.2f}x", float("nan"), "x", None, why)


def _jax_missing() -> str:
    return "JAX not installed: pip install deep_gemm[peers]"


# ---------------------------------------------------------------------------------------------------------------
# GEMM rows: every library of a row is timed in one bench_steady run
# ---------------------------------------------------------------------------------------------------------------
def row_bf16(rng, shape, opts: Options) -> list[Result]:
    m, n, k = shape
    a, b = generators.bf16_operand(rng, m, k), generators.bf16_operand(rng, n, k)
    d = np.empty((m, n), BF16)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    fns: dict[str, Callable] = {STANDIN: lambda: deep_gemm.bf16_gemm_nt(a, b, d), "numpy": lambda: a32 @ b32.T}
    if peers.jax_version():
        fns["jax"] = peers.jax_bf16_gemm(a, b)
    has_torch = peers.torch_version() is not None
    if has_torch:
        fns.update(peers.torch_variants(peers.torch_bf16_gemm(a, b)))
    timing = bench_steady(fns, opts.blocks, opts.calls)
    detail = _figures(timing, shape, opts.peak)
    label = f"BF16 {m}x{n}x{k}"
    out = [_check(f"{label} vs numpy fp32 a @ b.T", 0.90, timing.speedup(STANDIN, over="numpy"), detail)]
    if "jax" in fns:
        out.append(_check(f"{label} vs JAX jnp.dot (fp32 acc)", 1.2, timing.speedup(STANDIN, over="jax"), detail))
    else:
        out.append(_missing(f"{label} vs JAX jnp.dot (fp32 acc)", 1.2, _jax_missing()))
    out += _torch_rows(label, "torch bf16 a @ b.T", timing, has_torch, 1.2, 1.0, detail)
    gf = _gflops(shape, timing.median(STANDIN))
    if opts.peak is not None:
        out.append(Result(f"{label} fraction of the FMA peak", ">= 0.65", opts.peak.fraction(gf), "",
                          opts.peak.fraction(gf) >= 0.65,
                          f"stand-in {gf:.1f} GFLOP/s of {opts.peak.gflops:.1f} measured on {opts.peak.threads} "
                          f"threads{_amx_fraction(opts, gf)}{_dpbf16_fraction(opts, gf)}"))
    amx_name = f"{label} fraction of the measured AMX-BF16 peak"
    if opts.amx_peak is not None:
        frac = opts.amx_peak.fraction(gf)
        out.append(Result(amx_name, ">= 0.60", frac, "", frac >= 0.6,
                          f"stand-in {gf:.1f} GFLOP/s of {opts.amx_peak.gflops:.1f} measured on "
                          f"{opts.amx_peak.threads} threads"))
    else:
        why = "no AMX-BF16 on this host" if not machine.amx_present() else "AMX peak not measured (--peak-seconds 0)"
        out.append(Result(amx_name, ">= 0.60", float("nan"), "", None, why))
    for res in out:
        res.times = _times(timing)
    return out


def _amx_fraction(opts: Options, gflops: float) -> str:
    """'; x of the AMX-BF16 peak (...)' when that peak was measured."""
    if opts.amx_peak is None:
        return ""
    return f"; {opts.amx_peak.fraction(gflops):.2f} of the AMX-BF16 peak ({opts.amx_peak.gflops:.1f} GFLOP/s)"


def _dpbf16_fraction(opts: Options, gflops: float) -> str:
    """'; x of the AVX512-BF16 peak (...)' when that peak was measured."""
    if opts.dpbf16_peak is None:
        return ""
    return (f"; {opts.dpbf16_peak.fraction(gflops):.2f} of the AVX512-BF16 peak ({opts.dpbf16_peak.gflops:.1f} "
            f"GFLOP/s)")


def row_fp8(rng, shape, opts: Options, numpy_target: float | None, jax_target: float | None,
            best_target: float | None) -> list[Result]:
    m, n, k = shape
    (a, sfa), (b, sfb) = generators.fp8_operand(rng, m, k), generators.fp8_operand(rng, n, k)
    d = np.empty((m, n), BF16)
    fns: dict[str, Callable] = {
        STANDIN: lambda: deep_gemm.fp8_gemm_nt((a, sfa), (b, sfb), d),
        "numpy": lambda: peers.numpy_fp8_gemm(a, sfa, b, sfb),
    }
    if opts.naive:
        fns["numpy-astype"] = lambda: peers.numpy_fp8_gemm_naive(a, sfa, b, sfb)
    has_jax = peers.jax_version() is not None
    if has_jax:
        fns["jax"] = peers.jax_fp8_gemm(a, sfa, b, sfb)
    has_torch = peers.torch_version() is not None
    if has_torch:
        fns.update(peers.torch_variants(peers.torch_fp8_gemm(a, sfa, b, sfb)))
    timing = bench_steady(fns, opts.blocks, opts.calls)
    detail = _figures(timing, shape, opts.peak)
    label = f"FP8 {m}x{n}x{k}"
    out = []
    if best_target is not None:
        best = ["numpy"] + (["jax"] if has_jax else []) + torch_names(fns)
        missing = [why for why, present in ((_jax_missing(), has_jax), (_torch_missing(), has_torch)) if not present]
        res = _check(f"{label} vs best peer (numpy LUT, JAX, torch any threads)", best_target,
                     timing.speedup(STANDIN, over=best), "; ".join(missing + [detail]))
        out.append(res)
    if numpy_target is not None:
        out.append(_check(f"{label} vs numpy (LUT decode + scale + matmul)", numpy_target,
                          timing.speedup(STANDIN, over="numpy"), detail))
    if jax_target is not None:
        if has_jax:
            out.append(_check(f"{label} vs JAX (jit decode + scale + dot)", jax_target,
                              timing.speedup(STANDIN, over="jax"), detail))
        else:
            out.append(_missing(f"{label} vs JAX (jit decode + scale + dot)", jax_target, _jax_missing()))
    for res in out:
        res.times = _times(timing)
    return out


def row_threads(rng, opts: Options) -> list[Result]:
    import numba

    m, n, k = shape = LARGE_SHAPES[1]
    name = f"BF16 {m}x{n}x{k} 2 threads vs 1"
    threads = numba.config.NUMBA_NUM_THREADS
    if threads < 2:
        return [Result(name, ">= 1.85x", float("nan"), "x", False, f"numba has {threads} thread(s)")]
    a, b = generators.bf16_operand(rng, m, k), generators.bf16_operand(rng, n, k)
    d = np.empty((m, n), BF16)

    def run_with(num_threads: int) -> Callable:
        def run():
            numba.set_num_threads(num_threads)
            try:
                deep_gemm.bf16_gemm_nt(a, b, d)
            finally:
                numba.set_num_threads(threads)

        return run

    timing = bench_steady({"2 threads": run_with(2), "1 thread": run_with(1)}, opts.blocks, opts.calls)
    detail = _figures(timing, shape, opts.peak)
    if opts.peak is not None:
        one = _gflops(shape, timing.median("1 thread"))
        detail += f"; 1 thread = {one / opts.peak.gflops_one_thread:.2f} of the 1-thread peak"
    return [_check(name, 1.85, timing.speedup("2 threads", over="1 thread"), detail)]


# ---------------------------------------------------------------------------------------------------------------
# JIT rows (bench/jit_bench.py's, in a temporary cache shared by the rows of this run)
# ---------------------------------------------------------------------------------------------------------------
def _jit_bench():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import jit_bench

    return jit_bench


def _from_jit(row) -> Result:
    return Result(row.name, row.target, row.value, row.unit, row.passed, row.detail)


def row_startup(opts: Options) -> list[Result]:
    jb = _jit_bench()
    return [_from_jit(jb.startup_row(str(opts.jit_root / "startup")))]


def row_jit(opts: Options) -> list[Result]:
    jb = _jit_bench()
    rows = jb.kernel_rows("fp8_gemm", 3, 2000, opts.jit_root)
    return [_from_jit(r) for r in rows if "warm load" not in r.name]


def row_jit_mixed(opts: Options) -> list[Result]:
    jb = _jit_bench()
    return [_from_jit(r) for name in ("hc_prenorm", "mqa_logits", "paged_mqa_logits")
            for r in jb.kernel_rows(name, 1, 1, opts.jit_root)]


ROWS: dict[str, Callable[[np.random.Generator, Options], list[Result]]] = {
    "bf16-2048": lambda rng, o: row_bf16(rng, LARGE_SHAPES[0], o),
    "bf16-4096x7168": lambda rng, o: row_bf16(rng, LARGE_SHAPES[1], o),
    "fp8-2048": lambda rng, o: row_fp8(rng, LARGE_SHAPES[0], o, None, None, 1.5),
    "fp8-4096x7168": lambda rng, o: row_fp8(rng, LARGE_SHAPES[1], o, None, None, 1.5),
    "fp8-m128": lambda rng, o: row_fp8(rng, (128, 7168, 2048), o, 3.5, 1.5, 5.0),
    "fp8-m16": lambda rng, o: row_fp8(rng, (16, 7168, 2048), o, 5.0, 3.0, 5.0),
    "threads": lambda rng, o: row_threads(rng, o),
    "startup": lambda rng, o: row_startup(o),
    "jit": lambda rng, o: row_jit(o),
    "jit-mixed": lambda rng, o: row_jit_mixed(o),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__ + "\n" + STEADY_PROTOCOL.replace("CALLS", "--calls")
                                     .replace("BLOCKS", "--blocks"),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="", help="comma-separated row names or prefixes (default: all)")
    parser.add_argument("--blocks", type=int, default=5, help="rounds of blocks per row (median reported)")
    parser.add_argument("--calls", type=int, default=3,
                        help=f"timed calls per block (after {WARM_MS} ms of discarded ones)")
    parser.add_argument("--no-naive", action="store_true", help="leave out the naive numpy astype FP8 reference")
    parser.add_argument("--peak-seconds", type=float, default=0.2,
                        help="seconds per FMA-peak run (best of 5 runs; 0 skips the peak and the fractions)")
    parser.add_argument("--list", action="store_true", help="list the row names and exit")
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="also write every row (and every library's seconds per call) to PATH as JSON")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(ROWS))
        return 0
    for flag, value in (("--blocks", args.blocks), ("--calls", args.calls)):
        if value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    if args.peak_seconds < 0:
        parser.error(f"--peak-seconds must be >= 0, got {args.peak_seconds}")
    wanted = [w for w in args.rows.split(",") if w]
    names = [r for r in ROWS if not wanted or any(r.startswith(w) for w in wanted)]
    if not names:
        parser.error(f"no row matches {args.rows!r}; see --list")

    print(f"# deep_gemm perf check; load average {os.getloadavg()[0]:.2f} (other processes skew every row)")
    print(f"# machine: {machine.describe_machine()}")
    torch_text = (f"torch {peers.torch_version()} (default {peers.torch_default_threads()} threads; also timed at "
                  f"{', '.join(str(t) for t in peers.torch_thread_counts())})" if peers.torch_version()
                  else "torch not installed (pip install deep_gemm[torch]): its rows print as not measured")
    print(f"# AI cores {deep_gemm.get_num_ai_cores()} ({deep_gemm.get_npu_arch()}); JAX "
          f"{peers.jax_version() or 'not installed'}; {torch_text}; protocol: {args.blocks} rounds of blocks of "
          f"{WARM_MS} ms of discarded calls (at least one) + {args.calls} timed calls per library, blocks "
          f"alternated, median over blocks (see --help)")
    opts = Options(blocks=args.blocks, calls=args.calls, naive=not args.no_naive)
    if args.peak_seconds > 0:
        opts.peak = machine.measure_fma_peak(seconds=args.peak_seconds)
        print(f"# measured FMA peak: {opts.peak.gflops:.1f} GFLOP/s on {opts.peak.threads} threads "
              f"({opts.peak.gflops_one_thread:.1f} on one, {opts.peak.gflops_per_cpu_second:.1f} per CPU-second of "
              f"a thread; fp32 {opts.peak.vector_bits}-bit FMAs, {machine.NUM_ACCUMULATORS} independent chains "
              f"per thread); fractions below are of the {opts.peak.threads}-thread wall figure")
        opts.amx_peak = machine.measure_amx_peak(seconds=args.peak_seconds)
        if opts.amx_peak is not None:
            print(f"# measured AMX-BF16 peak: {opts.amx_peak.gflops:.1f} GFLOP/s on {opts.amx_peak.threads} threads "
                  f"({opts.amx_peak.gflops_one_thread:.1f} on one; the Cube's own TDPBF16PS block on L1-resident "
                  f"tiles): BF16 and FP8 operands run on this unit (DG_CUBE_AMX), so the stand-in may exceed the "
                  f"FMA peak; the fraction rows also give the fraction of this one. Threads sharing one tile unit "
                  f"(measured: threads / all-threads speedup): {machine.tile_unit_sharing(opts.amx_peak):.1f}")
        else:
            print(f"# {machine.describe_amx()}")
            opts.dpbf16_peak = machine.measure_dpbf16_peak(seconds=args.peak_seconds)
        if opts.dpbf16_peak is not None:
            print(f"# measured AVX512-BF16 peak: {opts.dpbf16_peak.gflops:.1f} GFLOP/s on {opts.dpbf16_peak.threads} "
                  f"threads ({opts.dpbf16_peak.gflops_one_thread:.1f} on one; the Cube's own VDPBF16PS micro-kernel "
                  f"on L1-resident operands): BF16 and FP8 operands run on it (DG_CUBE_DPBF16), so the stand-in may "
                  f"exceed the FMA peak; the BF16 fraction rows also give the fraction of this one")
    print("# (each kernel is compiled or loaded on its first, untimed call)", flush=True)
    rng = np.random.default_rng(0)
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="dg-perf-check-") as jit_root:
        opts.jit_root = Path(jit_root)
        for name in names:
            start = time.perf_counter()
            for res in ROWS[name](rng, opts):
                results.append(res)
                print(res.line(), flush=True)
            print(f"#   ({name}: {time.perf_counter() - start:.0f} s)", flush=True)
    failed = [r.name for r in results if r.passed is False]
    missing = [r.name for r in results if r.passed is None]
    measured = len(results) - len(missing)
    print(f"# load average {os.getloadavg()[0]:.2f}")
    if args.json:
        record = {"machine": machine.describe_machine(), "load_average": os.getloadavg()[0],
                  "torch": peers.torch_version(), "jax": peers.jax_version(), "blocks": args.blocks,
                  "calls": args.calls, "warm_ms": WARM_MS, "rows": [asdict(r) for r in results]}
        Path(args.json).write_text(json.dumps(record, indent=1, allow_nan=True) + "\n")
        print(f"# rows written to {args.json}")
    print(f"# {measured - len(failed)}/{measured} measured rows met their target"
          + (f"; missed: {', '.join(failed)}" if failed else "")
          + (f"; not measured: {', '.join(missing)}" if missing else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
