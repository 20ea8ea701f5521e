"""CPU benchmark of the grouped GEMMs (MoE shapes) beside the numpy code a user would otherwise write, in one run:
a Python loop over the groups that decodes each group's FP8 operands, applies the block scales and multiplies.
Per row: the stand-in's time, the numpy loop's, their ratio, the dense FP8 kernel on the same total rows (one
weight) and the grouped call's throughput relative to it, and the modelled Ascend 950DT time of the grouped call
(``estimate_gemm`` with the call's actual layout). CPU numbers are CPU numbers; chip numbers are modelled.

    python bench/grouped_bench.py --quick                     # small MoE-like shapes (minutes on 2 cores)
    python bench/grouped_bench.py                             # DeepSeek-V3-like shapes (long: hours on 2 cores)
    python bench/grouped_bench.py --kinds masked --pairs 3
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

# DeepSeek-V3-like MoE shapes. Contiguous (prefill/training): groups x rows per group, (N, K) of the expert GEMMs.
CONTIGUOUS = [(g, rows, n, k) for g in (4, 8) for rows in (4096, 8192)
              for n, k in ((4096, 7168), (7168, 2048), (6144, 7168), (7168, 3072))]
# Masked (decode): groups, max rows per group (masked_m drawn from 1..max), (N, K).
MASKED = [(g, rows, n, k) for g in (8, 16, 32) for rows in (16, 64) for n, k in ((4096, 7168), (7168, 2048))]
QUICK_CONTIGUOUS = [(4, 256, 1024, 1024), (8, 512, 2048, 1024), (4, 1024, 2048, 2048)]
QUICK_MASKED = [(8, 16, 2048, 1024), (16, 16, 2048, 2048), (8, 64, 2048, 1024)]


def _fp8_stack(rng, g: int, mn: int, k: int):
    """(float8 codes [g, mn, k], fp32 power-of-two scales [g, mn, k/32]) without NaN codes."""
    import ml_dtypes

    codes = rng.integers(0, 256, size=(g, mn, k), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0
    exps = rng.integers(118, 121, size=(g, mn, -(-k // 32)))
    sf = np.ldexp(np.float32(1), exps - 127).astype(np.float32)
    return codes.view(ml_dtypes.float8_e4m3fn), sf


def _decode(values, codes, sf, k):
    """What a user writes: FP8 codes -> fp32 through a table, times the repeated block scales."""
    return values[codes.view(np.uint8)] * np.repeat(sf, 32, axis=-1)[..., :k]


def _row(kind, shape, t_grouped, t_numpy, t_dense, flops, est_us, note=""):
    g, rows, n, k = shape
    dense = "" if t_dense is None else f"{t_dense * 1e3:10.1f} {t_dense / t_grouped:7.2f}"
    print(f"{kind:>10} {f'{g}x{rows} {n}x{k}':>22} {t_grouped * 1e3:10.1f} {flops / t_grouped / 1e9:7.1f} "
          f"{t_numpy * 1e3:10.1f} {t_numpy / t_grouped:7.2f} {dense:>18} {est_us:10.1f}  {note}", flush=True)


def bench_contiguous(shape, num_pairs: int, rng) -> None:
    import ml_dtypes

    import deep_gemm
    from deep_gemm.device import FP8_E4M3_VALUES
    from deep_gemm.testing import bench, bench_paired, grouped_layouts

    g, rows, n, k = shape
    # Routing: group sizes drawn around ``rows`` (one group empty when there are 8), each padded to 256 rows
    sizes = [int(s) for s in rng.integers(rows // 2, rows * 3 // 2, size=g)]
    if g >= 8:
        sizes[3] = 0
    psum, per_row, m = grouped_layouts(sizes)
    a, sfa = _fp8_stack(rng, 1, m, k)
    a, sfa = a[0], sfa[0]
    b, sfb = _fp8_stack(rng, g, n, k)
    d = np.empty((m, n), ml_dtypes.bfloat16)
    starts = [int(np.argmax(per_row == i)) for i in range(g)]

    def grouped():
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, psum)

    def numpy_loop():
        out = np.zeros((m, n), np.float32)
        for i in range(g):
            if sizes[i]:
                s, e = starts[i], starts[i] + sizes[i]
                out[s:e] = _decode(FP8_E4M3_VALUES, a[s:e], sfa[s:e], k) @ _decode(FP8_E4M3_VALUES, b[i], sfb[i], k).T
        return out

    start = time.perf_counter()
    grouped()  # build + compile (or load) outside the timing
    setup = time.perf_counter() - start
    timing = bench_paired(grouped, numpy_loop, num_pairs=num_pairs, num_warmups=0)
    real = sum(sizes)
    d_dense = np.empty((real, n), ml_dtypes.bfloat16)
    a_dense = (np.ascontiguousarray(a[per_row >= 0]), np.ascontiguousarray(sfa[per_row >= 0]))
    dense_call = lambda: deep_gemm.fp8_gemm_nt(a_dense, (b[0], sfb[0]), d_dense)  # noqa: E731
    t_dense = bench(dense_call, num_warmups=1, num_tests=num_pairs)
    est = deep_gemm.estimate_gemm(real, n, k, gemm_type="m_grouped_contiguous", group_sizes=sizes)
    _row("contiguous", shape, timing.median_a, timing.median_b, t_dense, 2.0 * real * n * k, est.time_us,
         f"sizes={sizes} setup {setup:.1f}s")


def bench_masked(shape, num_pairs: int, rng) -> None:
    import ml_dtypes

    import deep_gemm
    from deep_gemm.device import FP8_E4M3_VALUES
    from deep_gemm.testing import bench_paired

    g, max_m, n, k = shape
    masked_m = rng.integers(1, max_m + 1, size=g).astype(np.int32)
    a, sfa = _fp8_stack(rng, g, max_m, k)
    b, sfb = _fp8_stack(rng, g, n, k)
    d = np.empty((g, max_m, n), ml_dtypes.bfloat16)
    expected = max(1, int(round(float(masked_m.mean()))))

    def grouped():
        deep_gemm.m_grouped_fp8_gemm_nt_masked((a, sfa), (b, sfb), d, masked_m, expected)

    def numpy_loop():
        out = np.zeros((g, max_m, n), np.float32)
        for i in range(g):
            r = int(masked_m[i])
            out[i, :r] = _decode(FP8_E4M3_VALUES, a[i, :r], sfa[i, :r], k) @ _decode(FP8_E4M3_VALUES, b[i], sfb[i],
                                                                                       k).T
        return out

    start = time.perf_counter()
    grouped()
    setup = time.perf_counter() - start
    timing = bench_paired(grouped, numpy_loop, num_pairs=num_pairs, num_warmups=0)
    real = int(masked_m.sum())
    est = deep_gemm.estimate_gemm(real, n, k, gemm_type="m_grouped_masked", group_sizes=masked_m.tolist())
    _row("masked", shape, timing.median_a, timing.median_b, None, 2.0 * real * n * k, est.time_us,
         f"masked_m max {int(masked_m.max())}, sum {real}; setup {setup:.1f}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small MoE-like shapes instead of DeepSeek-V3's")
    parser.add_argument("--kinds", nargs="*", choices=("contiguous", "masked"), default=["contiguous", "masked"])
    parser.add_argument("--pairs", type=int, default=3, help="interleaved timing pairs per row")
    parser.add_argument("--limit", type=int, default=None, help="run only the first N rows of each kind")
    parser.add_argument("--cores", type=int, default=None, help="logical AI cores (default: the runtime's)")
    args = parser.parse_args(argv)

    from deep_gemm import runtime

    rng = np.random.default_rng(0)
    with runtime.runtime_scope(num_ai_cores=args.cores):
        print(f"FP8 grouped GEMMs, {runtime.get_num_ai_cores()} logical AI cores; CPU times are medians of "
              f"{args.pairs} interleaved pairs (stand-in vs numpy loop); chip times modelled "
              f"({runtime.get_npu_arch()})")
        print(f"{'kind':>10} {'groups x rows N x K':>22} {'grouped ms':>10} {'GFLOP/s':>7} {'numpy ms':>10} "
              f"{'speedup':>7} {'dense ms':>10} {'g/dense':>7} {'chip us':>10}")
        for kind in args.kinds:
            shapes = {"contiguous": QUICK_CONTIGUOUS if args.quick else CONTIGUOUS,
                      "masked": QUICK_MASKED if args.quick else MASKED}[kind]
            for shape in shapes[:args.limit]:
                (bench_contiguous if kind == "contiguous" else bench_masked)(shape, args.pairs, rng)
    return 0


if __name__ == "__main__":
    sys.exit(main())
