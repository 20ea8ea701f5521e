"""CPU benchmark of the GEMM stand-in kernels beside the numpy baseline a user would write, timed in the same run
(interleaved): BF16 -> fp32 ``a @ b.T``; FP8/FP4 -> decode codes, apply the block scales, then ``a @ b.T``.
One aligned line per shape with both times, both GFLOP/s, the ratio and the chosen config. CPU numbers only.

    python bench/gemm_bench.py --dtype fp8 --shapes 16x7168x2048 128x7168x2048 2048x2048x2048
    python bench/gemm_bench.py --dtype bf16 --cores 32 --pairs 5
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

DEFAULT_SHAPES = ["16x4096x2048", "128x4096x2048", "1024x1024x1024", "2048x2048x2048"]


def parse_shape(text: str) -> tuple[int, int, int]:
    m, n, k = (int(p) for p in text.lower().split("x"))
    if min(m, n, k) < 1:
        raise argparse.ArgumentTypeError(f"shape must be MxNxK with positive ints, got {text!r}")
    return m, n, k


def _fp8_data(rng, mn: int, k: int):
    """(uint8 codes [mn, k], int16 required-layout scales [ceil(k/64), mn], fp32 scales [mn, ceil(k/32)])."""
    codes = rng.integers(0, 256, size=(mn, k), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0  # no NaN codes
    blocks = -(-k // 32)
    exps = rng.integers(118, 121, size=(mn, blocks), dtype=np.uint16)
    padded = np.zeros((mn, blocks + blocks % 2), np.uint16)
    padded[:, :blocks] = exps
    sf = np.ascontiguousarray((padded[:, 0::2] | (padded[:, 1::2] << 8)).T).view(np.int16)
    return codes, sf, np.ldexp(np.float32(1), exps.astype(np.int32) - 127).astype(np.float32)


def bench_shape(dtype: str, m: int, n: int, k: int, num_pairs: int, rng):
    """(stand-in seconds, numpy seconds, config) of one shape, timed interleaved."""
    from deep_gemm.device import FP8_E4M3_VALUES
    from deep_gemm.kernels.bf16_gemm import launch_bf16_gemm
    from deep_gemm.kernels.fp8_gemm import launch_fp8_gemm
    from deep_gemm.testing import bench_paired

    d = np.empty((m, n), np.uint16)
    if dtype == "bf16":
        a32 = rng.standard_normal((m, k), dtype=np.float32)
        b32 = rng.standard_normal((n, k), dtype=np.float32)
        a_bits = (a32.view(np.uint32) >> 16).astype(np.uint16)  # truncation is fine for timing
        b_bits = (b32.view(np.uint32) >> 16).astype(np.uint16)

        def kernel():
            return launch_bf16_gemm(a_bits, "k", b_bits, "k", d, m, n, k, with_accumulation=False, alpha=1.0,
                                    compiled_dims="nk")

        def baseline():
            return a32 @ b32.T
    else:
        a_codes, sfa, sa = _fp8_data(rng, m, k)
        b_codes, sfb, sb = _fp8_data(rng, n, k)

        def kernel():
            return launch_fp8_gemm(a_codes, "k", "fp8", sfa, b_codes, "k", "fp8", sfb, d, m, n, k,
                                   with_accumulation=False, alpha=1.0, compiled_dims="nk")

        def baseline():
            a = FP8_E4M3_VALUES[a_codes] * np.repeat(sa, 32, axis=1)[:, :k]
            b = FP8_E4M3_VALUES[b_codes] * np.repeat(sb, 32, axis=1)[:, :k]
            return a @ b.T

    start = time.perf_counter()
    config = kernel()  # build + compile (or load) once, outside the timing
    setup = time.perf_counter() - start
    timing = bench_paired(kernel, baseline, num_pairs=num_pairs, num_warmups=1)
    return timing.median_a, timing.median_b, config, setup


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=("bf16", "fp8"), default="fp8")
    parser.add_argument("--shapes", nargs="*", type=parse_shape, default=[parse_shape(s) for s in DEFAULT_SHAPES])
    parser.add_argument("--cores", type=int, default=None, help="logical AI cores (default: the runtime's)")
    parser.add_argument("--pairs", type=int, default=5, help="interleaved timing pairs per shape")
    args = parser.parse_args(argv)

    from deep_gemm import runtime

    rng = np.random.default_rng(0)
    with runtime.runtime_scope(num_ai_cores=args.cores):
        cores = runtime.get_num_ai_cores()
        print(f"{args.dtype} GEMM, {cores} logical AI cores; CPU times (median of {args.pairs} interleaved pairs)")
        print(f"{'shape':>18} {'stand-in ms':>12} {'GFLOP/s':>8} {'numpy ms':>10} {'GFLOP/s':>8} {'ratio':>6} "
              f"{'setup s':>8}  config")
        for m, n, k in args.shapes:
            t_kernel, t_numpy, c, setup = bench_shape(args.dtype, m, n, k, args.pairs, rng)
            flops = 2.0 * m * n * k
            print(f"{f'{m}x{n}x{k}':>18} {t_kernel * 1e3:12.3f} {flops / t_kernel / 1e9:8.1f} "
                  f"{t_numpy * 1e3:10.3f} {flops / t_numpy / 1e9:8.1f} {t_numpy / t_kernel:6.2f} {setup:8.1f}  "
                  f"block {c.block_m}x{c.block_n}x{c.block_k} mad {c.mad_m}x{c.mad_n}x{c.mad_k} "
                  f"L1x{c.num_l1_stages} {c.path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
