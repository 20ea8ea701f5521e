"""Modelled Ascend chip time of a GEMM: ``estimate_gemm`` and ``python -m deep_gemm.estimate M N K``.

A prediction from the cost model in ``deep_gemm.heuristics.model`` for the config the heuristic would pick;
nothing is run or measured. No numpy arrays, no numba.
"""

from __future__ import annotations

import argparse
import numbers
from dataclasses import dataclass

from ..arch import ARCHS, ArchSpec
from ..arch import get_arch as get_arch_spec
from ..heuristics.config import (
    DTYPE_BITS,
    DTYPE_PAIRS,
    GEMM_TYPES,
    OUT_DTYPE_BYTES,
    GemmConfig,
    GemmDesc,
    cube_dtype,
    layout_problem,
)
from ..heuristics.select import get_best_config_and_cost
from ._target import MAX_SIZE, check_size, resolve_target, short

DTYPES = tuple(DTYPE_BITS)


@dataclass(frozen=True)
class GemmEstimate:
    """Modelled (not measured) chip time of one GEMM call and what binds it.

    ``utilization`` is the achieved FLOP rate over the arch's peak (all its AI cores) for the pair's Cube dtype
    (fp8 x fp4 runs at the FP8 rate). The ``*_us`` fields are each resource's busy time on the critical path.
    """

    m: int
    n: int
    k: int
    a_dtype: str
    b_dtype: str
    out_dtype: str
    gemm_type: str
    num_groups: int
    arch: str
    num_ai_cores: int
    time_us: float
    tflops: float
    utilization: float
    bound: str
    config: GemmConfig
    cube_us: float
    mte1_us: float
    mte2_us: float
    fixpipe_us: float
    vector_us: float
    l2_us: float
    hbm_us: float
    fill_us: float
    launch_us: float
    num_tiles: int
    num_waves: int
    flops: float
    l2_bytes: int
    hbm_bytes: int
    peak_tflops: float

    def __str__(self) -> str:
        c = self.config
        groups = f" x {self.num_groups} groups" if self.gemm_type != "normal" else ""
        lines = [
            f"modelled Ascend {self.arch} ({self.num_ai_cores} AI cores), {self.gemm_type}{groups}: "
            f"M={self.m} N={self.n} K={self.k} {self.a_dtype}x{self.b_dtype} -> {self.out_dtype}",
            f"  time {self.time_us:.2f} us (modelled), {self.tflops:.1f} TFLOPS = "
            f"{100 * self.utilization:.1f} % of the {self.peak_tflops:.1f} TFLOPS peak; bound: {self.bound}",
            f"  config: block {c.block_m}x{c.block_n}x{c.block_k}, mad {c.mad_m}x{c.mad_n}x{c.mad_k}, "
            f"L1 stages {c.num_l1_stages}, path {c.path}; {self.num_tiles} tiles in {self.num_waves} waves",
            f"  per resource (us): cube {self.cube_us:.2f}, mte1 {self.mte1_us:.2f}, mte2 {self.mte2_us:.2f}, "
            f"fixpipe {self.fixpipe_us:.2f}, vector {self.vector_us:.2f}, l2 {self.l2_us:.2f}, hbm {self.hbm_us:.2f}, "
            f"fill+drain {self.fill_us:.2f}, launch {self.launch_us:.2f}",
            f"  traffic: L2 -> L1 {self.l2_bytes / 1e6:.1f} MB, HBM {self.hbm_bytes / 1e6:.1f} MB",
        ]
        return "\n".join(lines)


# NOTES: the kernels index every dim as a uint32 (templates/*.asc.j2), so larger sizes are not GEMMs this library
# (or DeepGEMM-Ascend) can run; modelling them would only mislead.
# NOTES: GM addresses are 64-bit (int64 strides and offsets): no operand can be larger than this many bytes.
MAX_TENSOR_BYTES = 2**63 - 1


def _check_addressable(m: int, n: int, k: int, a_dtype: str, b_dtype: str, out_dtype: str, gemm_type: str,
                       num_groups: int) -> None:
    """Refuse a problem whose A, B or D could not exist: more bytes than a 64-bit address space holds."""
    groups_b = 1 if gemm_type == "normal" else num_groups
    groups_a = num_groups if gemm_type == "batched" else 1
    groups_d = num_groups if gemm_type in ("batched", "k_grouped_contiguous") else 1
    sizes = {
        "A": groups_a * m * k * DTYPE_BITS[a_dtype] // 8,
        "B": groups_b * n * k * DTYPE_BITS[b_dtype] // 8,
        "D": groups_d * m * n * OUT_DTYPE_BYTES[out_dtype],
    }
    for name, size in sizes.items():
        if size > MAX_TENSOR_BYTES:
            raise ValueError(
                f"{name} of {m=} {n=} {k=} {num_groups=} ({gemm_type}) would take {size:.3g} bytes, more than a "
                f"64-bit address space: not a physical GEMM"
            )


def estimate_gemm(
    m: int,
    n: int,
    k: int,
    a_dtype: str = "fp8",
    b_dtype: str = "fp8",
    *,
    num_groups: int = 1,
    gemm_type: str = "normal",
    out_dtype: str = "bf16",
    arch: str | ArchSpec | None = None,
    num_ai_cores: int | None = None,
    group_sizes: list[int] | None = None,
    ks: list[int] | None = None,
) -> GemmEstimate:
    """Modelled chip time of D[m, n] = A[m, k] @ B[n, k]^T with the config ``get_best_config`` would pick.

    dtypes: "bf16" | "fp8" | "fp4" (pairs bf16 x bf16, fp8 x fp8, fp8 x fp4, fp4 x fp4). ``gemm_type``:
    "normal"; "m_grouped_contiguous" / "m_grouped_masked" (m = total rows over ``num_groups`` groups, each
    with its own B); "k_grouped_contiguous" (k = total K, one M x N output per group); "batched"
    (``num_groups`` independent m x n x k GEMMs). ``arch`` and ``num_ai_cores`` default to
    ``deep_gemm.runtime`` (``get_arch_spec``, ``get_num_ai_cores``; env DG_NPU_ARCH, DG_NUM_AI_CORES).
    ``out_dtype``: "bf16", "fp32", or "fp8" for the FP8Quantization epilogue (n % 64 == 0): FixPipe hands the
    fp32 tiles to the AIVs' UB, the AIVs quantize them, D leaves as FP8 codes plus one scale byte per 32 columns.

    The actual layout of one call instead of the num_groups shortcut: ``group_sizes`` (M-grouped contiguous: the
    real rows of each group; masked: masked_m) with m = their sum, or ``ks`` (K-grouped: each group's K) with
    k = their sum; num_groups is then len(layout) (or left at 1). Empty groups cost nothing and the others are
    modelled at their mean size (``heuristics.config.layout_problem``), as the grouped kernels plan their config.
    """
    # Argument checks
    m, n, k = check_size("m", m), check_size("n", n), check_size("k", k)
    num_groups = check_size("num_groups", num_groups)
    for name, value in (("a_dtype", a_dtype), ("b_dtype", b_dtype)):
        if value not in DTYPES:
            raise ValueError(f"{name}={value!r}; allowed: {DTYPES}")
    if (a_dtype, b_dtype) not in DTYPE_PAIRS:
        raise ValueError(f"a_dtype={a_dtype!r} b_dtype={b_dtype!r} is not a supported pair; allowed: {DTYPE_PAIRS}")
    if out_dtype not in OUT_DTYPE_BYTES:
        raise ValueError(f"out_dtype={out_dtype!r}; allowed: {tuple(OUT_DTYPE_BYTES)}")
    if gemm_type not in GEMM_TYPES:
        raise ValueError(f"gemm_type={gemm_type!r}; allowed: {GEMM_TYPES}")
    if gemm_type == "normal" and num_groups != 1:
        raise ValueError(f"num_groups={num_groups} must be 1 for gemm_type='normal'")
    if gemm_type in ("m_grouped_contiguous", "m_grouped_masked") and m < num_groups:
        raise ValueError(f"m={m} must be >= num_groups={num_groups} for {gemm_type} (m is the total rows)")
    if gemm_type == "k_grouped_contiguous" and k < num_groups:
        raise ValueError(f"k={k} must be >= num_groups={num_groups} for {gemm_type} (k is the total K)")
    model_m, model_k, model_groups = m, k, num_groups
    for name, layout, kinds, total, total_name in (
            ("group_sizes", group_sizes, ("m_grouped_contiguous", "m_grouped_masked"), m, "m"),
            ("ks", ks, ("k_grouped_contiguous",), k, "k")):
        if layout is None:
            continue
        if gemm_type not in kinds:
            raise ValueError(f"{name} is a layout of gemm_type in {kinds}, got gemm_type={gemm_type!r}")
        if not isinstance(layout, (list, tuple)) or not all(
                isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in layout):
            raise TypeError(f"{name} must be a list of ints, got {layout!r}")
        if num_groups not in (1, len(layout)):
            raise ValueError(f"num_groups={num_groups} disagrees with len({name})={len(layout)}")
        if sum(layout) != total:
            raise ValueError(f"{total_name}={total} must be the sum of {name}={list(layout)} ({sum(layout)})")
        num_groups = len(layout)
        model_m, model_k, model_groups = layout_problem(gemm_type, m, k, group_sizes, ks)

    _check_addressable(m, n, k, a_dtype, b_dtype, out_dtype, gemm_type, num_groups)

    spec, cores = resolve_target(arch, num_ai_cores)
    for name, value in (("a_dtype", a_dtype), ("b_dtype", b_dtype)):
        if value != "bf16" and not spec.has_fp8:
            raise ValueError(f"{name}={value!r} is not supported on arch {spec.name} (bf16 only); allowed: ('bf16',)")

    # Model
    desc = GemmDesc(model_m, n, model_k, a_dtype, b_dtype, out_dtype, gemm_type, model_groups, num_ai_cores=cores)
    config, cost = get_best_config_and_cost(desc, spec)
    peak = spec.peak_flops(cube_dtype(a_dtype, b_dtype))
    flops_per_s = cost.flops / cost.time_s
    return GemmEstimate(
        m=m, n=n, k=k, a_dtype=a_dtype, b_dtype=b_dtype, out_dtype=out_dtype, gemm_type=gemm_type,
        num_groups=num_groups, arch=spec.name, num_ai_cores=cores,
        time_us=cost.time_s * 1e6, tflops=flops_per_s / 1e12, utilization=flops_per_s / peak, bound=cost.bound,
        config=config, cube_us=cost.cube_s * 1e6, mte1_us=cost.mte1_s * 1e6, mte2_us=cost.mte2_s * 1e6,
        fixpipe_us=cost.fixpipe_s * 1e6, vector_us=cost.vector_s * 1e6, l2_us=cost.l2_s * 1e6, hbm_us=cost.hbm_s * 1e6,
        fill_us=cost.fill_s * 1e6, launch_us=cost.launch_s * 1e6, num_tiles=cost.num_tiles,
        num_waves=cost.num_waves, flops=cost.flops, l2_bytes=cost.l2_bytes, hbm_bytes=cost.hbm_bytes,
        peak_tflops=peak / 1e12,
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m deep_gemm.estimate M N K --dtype fp8``: print the modelled chip time of one GEMM."""
    parser = _OneLineErrorParser(
        prog="python -m deep_gemm.estimate",
        description="Modelled Ascend chip time of D[M, N] = A[M, K] @ B[N, K]^T (a prediction, not a measurement).",
    )
    parser.add_argument("m", type=_cli_int("M"), help="rows of A and D (total rows for M-grouped kinds)")
    parser.add_argument("n", type=_cli_int("N"), help="rows of B, columns of D")
    parser.add_argument("k", type=_cli_int("K"), help="reduction size (total K for k_grouped_contiguous)")
    parser.add_argument("--dtype", default="fp8", choices=DTYPES, help="A dtype (and B's unless --b-dtype)")
    parser.add_argument("--b-dtype", default=None, choices=DTYPES, help="B dtype (default: --dtype)")
    parser.add_argument("--out-dtype", default="bf16", choices=tuple(OUT_DTYPE_BYTES))
    parser.add_argument("--arch", default=None, help=f"one of {tuple(ARCHS)} (default: DG_NPU_ARCH / runtime)")
    parser.add_argument("--cores", type=_cli_int("--cores"), default=None,
                        help="AI cores to schedule on (default: all)")
    parser.add_argument("--gemm-type", default="normal", choices=GEMM_TYPES)
    parser.add_argument("--groups", type=_cli_int("--groups"), default=1,
                        help="groups / batches for the grouped kinds")
    parser.add_argument("--group-sizes", default=None,
                        help="M-grouped: comma-separated real rows (or masked_m) per group, summing to M")
    parser.add_argument("--ks", default=None, help="K-grouped: comma-separated K per group, summing to K")
    args = parser.parse_args(argv)
    try:
        layouts = {}
        for name in ("group_sizes", "ks"):
            text = getattr(args, name)
            if text is not None:
                try:
                    layouts[name] = [int(v) for v in text.split(",")]
                except ValueError:
                    raise ValueError(f"--{name.replace('_', '-')} must be comma-separated ints, got {text!r}") from None
        est = estimate_gemm(
            args.m, args.n, args.k, args.dtype, args.b_dtype or args.dtype, num_groups=args.groups,
            gemm_type=args.gemm_type, out_dtype=args.out_dtype, arch=args.arch, num_ai_cores=args.cores, **layouts,
        )
    except (ValueError, TypeError) as e:
        parser.error(str(e))
    print(est)
    return 0


class _OneLineErrorParser(argparse.ArgumentParser):
    """argparse with bad input reported on one line (no usage block, no traceback), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _cli_int(name: str):
    """argparse type: a decimal integer, the message naming the argument (no traceback for huge or odd text)."""

    def parse(text: str) -> int:
        digits = text.strip()
        if digits.lstrip("+-").isdigit() and len(digits) > 40:
            raise argparse.ArgumentTypeError(f"{name}={short(text)} exceeds {MAX_SIZE} (2^32 - 1)")
        try:
            return int(digits, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a decimal integer, got {short(text)}") from None

    parse.__name__ = name
    return parse



# Published rows ----------------------------------------------------------------------------------------------

# Source: DeepGEMM-Ascend README (release 2026-09-30): Ascend 950DT, CANN 9.20, bench_msprof, cold L2 (a buffer of
# twice the L2 size zeroed before each of 30 timed runs, after 10 warm-ups). The vendor's figures, not reproduced.
# (kind, A x B dtypes, M, N, K, microseconds, TFLOPS, GB/s or None), in the README's order; the M = 128 rows last.
# NOTES: the reference (shared published_results.md) has no M-grouped rows; an M-grouped row would be kind
# "m_grouped_contiguous" with its group count.
PUBLISHED: tuple[tuple[str, str, int, int, int, float, float, float | None], ...] = (
    ("dense", "fp4xfp4", 4096, 7168, 16384, 565.6, 1701, None),
    ("dense", "fp8xfp4", 4096, 7168, 16384, 1117.8, 861, None),
    ("dense", "fp8xfp8", 4096, 7168, 16384, 1117.6, 861, None),
    ("dense", "bf16xbf16", 4096, 7168, 16384, 2229.9, 431, None),
    ("dense", "fp8xfp8", 4096, 2112, 7168, 156.9, 790, 319),
    ("dense", "fp8xfp8", 4096, 576, 7168, 54.6, 619, 689),
    ("dense", "fp8xfp8", 4096, 24576, 1536, 362.2, 854, 137),
    ("dense", "fp8xfp8", 4096, 32768, 512, 164.3, 837, 129),
    ("dense", "fp8xfp8", 4096, 7168, 16384, 1117.6, 861, 186),
    ("dense", "fp8xfp8", 4096, 4096, 7168, 282.9, 850, 234),
    ("dense", "fp8xfp8", 4096, 7168, 2048, 143.4, 838, 181),
    ("dense", "fp8xfp8", 128, 2112, 7168, 15.0, 258, 1205),
    ("dense", "fp8xfp8", 128, 32768, 512, 10.4, 415, 1829),
    ("dense", "fp8xfp8", 128, 7168, 16384, 54.8, 549, 2456),
)
_GEMM_TYPES = {"dense": "normal"}
_SOURCE = "DeepGEMM-Ascend README 2026-09-30 (950DT, CANN 9.20, bench_msprof, cold L2)"


def published_checks(arch: str = "950DT"):
    """The published dense (and M-grouped, when the vendor publishes them) rows beside the model on ``arch`` with
    all its AI cores, the config ``get_best_config`` picks."""
    from .published import PublishedCheck

    spec = get_arch_spec(arch)
    rows = []
    for kind, dtypes, m, n, k, us, _tflops, _gbs in PUBLISHED:
        a_dtype, b_dtype = dtypes.split("x")
        desc = GemmDesc(m, n, k, a_dtype, b_dtype, gemm_type=_GEMM_TYPES[kind], num_ai_cores=spec.num_ai_cores)
        config, cost = get_best_config_and_cost(desc, spec)
        terms = (("cube", cost.cube_s * 1e6), ("mte2", cost.mte2_s * 1e6), ("l2", cost.l2_s * 1e6),
                 ("hbm", cost.hbm_s * 1e6), ("fill", cost.fill_s * 1e6), ("launch", cost.launch_s * 1e6),
                 ("overhead", cost.copy_overhead_s * 1e6))
        rows.append(PublishedCheck(
            family="bf16_gemm_nt" if a_dtype == "bf16" else "fp8_fp4_gemm_nt",
            problem=f"{kind} {dtypes} M={m} N={n} K={k}", published_us=us, modelled_us=cost.time_s * 1e6,
            bound=cost.bound, source=_SOURCE, terms=terms))
    return rows
