"""CPU benchmark of the GEMM stand-in kernels beside the peers a user would write, timed in the same run: numpy
(BF16 -> fp32 ``a @ b.T``; FP8/FP4 -> the strongest numpy formulation, deep_gemm.testing.peers.numpy_fp8_gemm /
numpy_fp4_gemm: table decode, in-place block scaling, fp32 matmul, cast to bf16), JAX when installed (jit-compiled)
and torch on the CPU when installed (bf16 ``a @ b.T``; FP8 kept FP8 in memory and decoded to bf16 every call; no
FP4 peer), at its default thread count and at its best one (every count 1 .. the usable CPUs timed as a library of
its own), all from deep_gemm.testing.peers. One aligned line per shape with every library's time and GFLOP/s, the
stand-in's ratio to each and to the best peer, and the chosen config. CPU numbers only.

    python bench/gemm_bench.py --dtype fp8 --shapes 16x7168x2048 128x7168x2048 2048x2048x2048
    python bench/gemm_bench.py --dtype bf16 --cores 32 --blocks 5
    python bench/gemm_bench.py --dtype fp4 --shapes 128x7168x2048 --no-jax
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from deep_gemm.testing import STEADY_PROTOCOL

DEFAULT_SHAPES = ["16x4096x2048", "128x4096x2048", "1024x1024x1024", "2048x2048x2048"]


def parse_shape(text: str) -> tuple[int, int, int]:
    try:
        m, n, k = (int(p) for p in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must be MxNxK with positive ints, got {text!r}") from None
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


def bench_shape(dtype: str, m: int, n: int, k: int, num_blocks: int, num_calls: int, rng, with_jax: bool,
                with_torch: bool = False):
    """({library: seconds}, {peer: stand-in speedup}, config, setup seconds) of one shape (bench_steady). With
    torch, the speedups also hold "torch" (default threads), "torch best" (the thread count with the lowest median,
    named in seconds["torch best threads"]) and "best peer" (per round the fastest of every peer)."""
    from deep_gemm.kernels.bf16_gemm import launch_bf16_gemm
    from deep_gemm.kernels.fp8_gemm import launch_fp8_gemm
    from deep_gemm.testing import bench_steady, peers
    from deep_gemm.utils.formats import BF16_DTYPE

    d = np.empty((m, n), np.uint16)
    if dtype == "bf16":
        a32 = rng.standard_normal((m, k), dtype=np.float32)
        b32 = rng.standard_normal((n, k), dtype=np.float32)
        a_bits = (a32.view(np.uint32) >> 16).astype(np.uint16)  # truncation is fine for timing
        b_bits = (b32.view(np.uint32) >> 16).astype(np.uint16)
        a32, b32 = (a_bits.astype(np.uint32) << 16).view(np.float32), (b_bits.astype(np.uint32) << 16).view(np.float32)

        def kernel():
            return launch_bf16_gemm(a_bits, "k", b_bits, "k", d, m, n, k, with_accumulation=False, alpha=1.0,
                                    compiled_dims="nk")

        fns = {"numpy": lambda: a32 @ b32.T}
        if with_jax:
            fns["jax"] = peers.jax_bf16_gemm(a_bits.view(BF16_DTYPE), b_bits.view(BF16_DTYPE))
        if with_torch:
            fns.update(peers.torch_variants(peers.torch_bf16_gemm(a_bits.view(BF16_DTYPE), b_bits.view(BF16_DTYPE))))
    elif dtype == "fp8":
        a_codes, sfa, sa = _fp8_data(rng, m, k)
        b_codes, sfb, sb = _fp8_data(rng, n, k)

        def kernel():
            return launch_fp8_gemm(a_codes, "k", "fp8", sfa, b_codes, "k", "fp8", sfb, d, m, n, k,
                                   with_accumulation=False, alpha=1.0, compiled_dims="nk")

        fns = {"numpy": lambda: peers.numpy_fp8_gemm(a_codes, sa, b_codes, sb)}
        if with_jax:
            fns["jax"] = peers.jax_fp8_gemm(a_codes, sa, b_codes, sb)
        if with_torch:
            fns.update(peers.torch_variants(peers.torch_fp8_gemm(a_codes, sa, b_codes, sb)))
    else:  # fp4, through the public API (packed int8 [mn, k/2], fp32 scales)
        import deep_gemm
        from deep_gemm.testing import generators

        if k % 2:
            raise ValueError(f"fp4 needs an even K, got {k=}")
        (a4, sa), (b4, sb) = generators.fp4_operand(rng, m, k), generators.fp4_operand(rng, n, k)
        out = d.view(BF16_DTYPE)

        def kernel():
            return deep_gemm.fp8_fp4_gemm_nt((a4, sa), (b4, sb), out)

        fns = {"numpy": lambda: peers.numpy_fp4_gemm(a4, sa, b4, sb)}
        if with_jax:
            fns["jax"] = peers.jax_fp4_gemm(a4, sa, b4, sb)

    start = time.perf_counter()
    config = kernel()  # build + compile (or load) once, outside the timing
    setup = time.perf_counter() - start
    timing = bench_steady({"stand-in": kernel, **fns}, num_blocks, num_calls)
    seconds = {name: timing.median(name) for name in timing.blocks}
    speedups = {peer: timing.speedup("stand-in", over=peer) for peer in fns}
    torch_names = [name for name in fns if name == "torch" or name.startswith("torch-")]
    if torch_names:
        best = min(torch_names, key=timing.median)
        seconds["torch best"], speedups["torch best"] = seconds[best], speedups[best]
        seconds["torch best threads"] = peers.torch_default_threads() if best == "torch" else int(best[6:-1])
    speedups["best peer"] = timing.speedup("stand-in", over=list(fns))
    return seconds, speedups, config, setup


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__ + "\n" + STEADY_PROTOCOL.replace("CALLS", "--calls")
                                     .replace("BLOCKS", "--blocks"),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", choices=("bf16", "fp8", "fp4"), default="fp8")
    parser.add_argument("--shapes", nargs="*", type=parse_shape, default=[parse_shape(s) for s in DEFAULT_SHAPES])
    parser.add_argument("--cores", type=int, default=None, help="logical AI cores (default: the runtime's)")
    parser.add_argument("--blocks", type=int, default=5, help="rounds of blocks per shape (median reported)")
    parser.add_argument("--calls", type=int, default=3, help="timed calls per block (after the block's discarded ones)")
    parser.add_argument("--no-jax", action="store_true", help="leave JAX out even when it is installed")
    parser.add_argument("--no-torch", action="store_true", help="leave torch out even when it is installed")
    args = parser.parse_args(argv)
    for flag, value in (("--blocks", args.blocks), ("--calls", args.calls)):
        if value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")

    from deep_gemm import runtime
    from deep_gemm.testing import peers

    jax = None if args.no_jax else peers.jax_version()
    torch = None if args.no_torch or args.dtype == "fp4" else peers.torch_version()
    rng = np.random.default_rng(0)
    with runtime.runtime_scope(num_ai_cores=args.cores):
        cores = runtime.get_num_ai_cores()
        print(f"{args.dtype} GEMM, {cores} logical AI cores; CPU times, median over {args.blocks} blocks of "
              f"{args.calls} steady calls per library (see --help); JAX "
              + (jax or ("left out" if args.no_jax else "not installed (pip install deep_gemm[peers])")) + "; torch "
              + (f"{torch} (default {peers.torch_default_threads()} threads, also timed at "
                 f"{', '.join(map(str, peers.torch_thread_counts()))})" if torch else
                 "left out" if args.no_torch else "-- (no FP4 peer)" if args.dtype == "fp4" else
                 "not installed (pip install deep_gemm[torch])"))
        jax_cols = f" {'jax ms':>10} {'GFLOP/s':>8} {'vs jax':>6}" if jax else ""
        torch_cols = f" {'torch ms':>10} {'vs torch':>8} {'torch best':>13} {'vs best':>7}" if torch else ""
        print(f"{'shape':>18} {'stand-in ms':>12} {'GFLOP/s':>8} {'numpy ms':>10} {'GFLOP/s':>8} {'vs np':>6}"
              f"{jax_cols}{torch_cols} {'vs peers':>8} {'setup s':>8}  config")
        for m, n, k in args.shapes:
            secs, speedups, c, setup = bench_shape(args.dtype, m, n, k, args.blocks, args.calls, rng, jax is not None,
                                                   torch is not None)
            flops = 2.0 * m * n * k
            line = (f"{f'{m}x{n}x{k}':>18} {secs['stand-in'] * 1e3:12.3f} {flops / secs['stand-in'] / 1e9:8.1f} "
                    f"{secs['numpy'] * 1e3:10.3f} {flops / secs['numpy'] / 1e9:8.1f} {speedups['numpy']:6.2f}")
            if jax:
                line += f" {secs['jax'] * 1e3:10.3f} {flops / secs['jax'] / 1e9:8.1f} {speedups['jax']:6.2f}"
            if torch:
                best = f"{secs['torch best'] * 1e3:.3f}@{secs['torch best threads']}t"
                line += (f" {secs['torch'] * 1e3:10.3f} {speedups['torch']:8.2f} {best:>13} "
                         f"{speedups['torch best']:7.2f}")
            line += f" {speedups['best peer']:8.2f}"
            print(f"{line} {setup:8.1f}  block {c.block_m}x{c.block_n}x{c.block_k} mad {c.mad_m}x{c.mad_n}x"
                  f"{c.mad_k} L1x{c.num_l1_stages} {c.path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
