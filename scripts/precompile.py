"""Warm the kernel cache for a list of GEMM shapes: build and compile every kernel in parallel worker processes
(deep_gemm.testing.par_compile), so later runs (tests, benches, services) only load them.

    python scripts/precompile.py --dtype fp8 --shapes 128x7168x2048 4096x4096x4096
    python scripts/precompile.py --dtype bf16 --shapes-file shapes.txt --cores 24 --arch 910B2 --workers 2

Shapes are MxNxK (one per line in --shapes-file; '#' starts a comment). Env: DG_JIT_CACHE_DIR picks the cache,
DG_TEST_MAX_WORKERS the default worker count.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time


def parse_shape(text: str) -> tuple[int, int, int]:
    """'MxNxK' -> (m, n, k), each a positive int."""
    parts = text.lower().replace(",", "x").split("x")
    try:
        m, n, k = (int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must be MxNxK with positive ints, got {text!r}") from None
    if min(m, n, k) < 1:
        raise argparse.ArgumentTypeError(f"shape must be MxNxK with positive ints, got {text!r}")
    return m, n, k


def read_shapes(path: str) -> list[tuple[int, int, int]]:
    shapes = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                shapes.append(parse_shape(line))
    return shapes


def jobs(shapes, dtype: str, out_dtype: str, major_a: str, major_b: str, with_accumulation: bool,
         compiled_dims: str) -> list:
    """One picklable precompile callable per shape."""
    from deep_gemm.kernels.bf16_gemm import precompile_bf16_gemm
    from deep_gemm.kernels.fp8_gemm import precompile_fp8_gemm

    out = []
    for m, n, k in shapes:
        if dtype == "bf16":
            out.append(functools.partial(precompile_bf16_gemm, m, n, k, out_dtype, major_a, major_b,
                                         with_accumulation, compiled_dims))
        else:
            a_dtype, b_dtype = {"fp8": ("fp8", "fp8"), "fp4": ("fp4", "fp4"), "fp8xfp4": ("fp8", "fp4")}[dtype]
            out.append(functools.partial(precompile_fp8_gemm, m, n, k, a_dtype, b_dtype, out_dtype, major_a,
                                         major_b, with_accumulation, compiled_dims))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="*", type=parse_shape, default=[], help="MxNxK shapes")
    parser.add_argument("--shapes-file", help="file with one MxNxK per line")
    parser.add_argument("--dtype", choices=("bf16", "fp8", "fp4", "fp8xfp4"), default="fp8")
    parser.add_argument("--out-dtype", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--major-a", choices=("k", "mn"), default="k")
    parser.add_argument("--major-b", choices=("k", "mn"), default="k")
    parser.add_argument("--with-accumulation", action="store_true")
    parser.add_argument("--compiled-dims", default="nk", help="letters of 'mnk' baked into the kernels")
    parser.add_argument("--cores", type=int, default=None, help="logical AI cores (default: the runtime's)")
    parser.add_argument("--arch", default=None, help="950DT, 950PR or 910B2 (default: the runtime's)")
    parser.add_argument("--workers", type=int, default=None, help="worker processes (default: DG_TEST_MAX_WORKERS "
                                                                  "or the CPU count)")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    args = parser.parse_args(argv)
    if set(args.compiled_dims) - set("mnk"):
        parser.error(f"--compiled-dims must use letters of 'mnk', got {args.compiled_dims!r}")
    shapes = list(args.shapes) + (read_shapes(args.shapes_file) if args.shapes_file else [])
    if not shapes:
        parser.error("no shapes: pass --shapes and/or --shapes-file")

    from deep_gemm import runtime
    from deep_gemm.testing.par_compile import par_compile

    start = time.perf_counter()
    with runtime.runtime_scope(num_ai_cores=args.cores, arch=args.arch):
        configs = par_compile(jobs(shapes, args.dtype, args.out_dtype, args.major_a, args.major_b,
                                   args.with_accumulation, args.compiled_dims),
                              max_workers=args.workers, progress=not args.quiet)
        cores, arch = runtime.get_num_ai_cores(), runtime.get_npu_arch()
    for (m, n, k), config in zip(shapes, configs, strict=True):
        print(f"{args.dtype} {m}x{n}x{k}: block {config.block_m}x{config.block_n}x{config.block_k} "
              f"mad {config.mad_m}x{config.mad_n}x{config.mad_k} L1 stages {config.num_l1_stages} "
              f"path {config.path}")
    print(f"precompiled {len(shapes)} kernels for {cores} AI cores ({arch}) in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
