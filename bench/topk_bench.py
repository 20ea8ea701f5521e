"""CPU benchmark of deep_gemm.topk (DeepSelect's top-k, the sparse-attention indexer's selection step) beside the code
a user would otherwise write, in one run: numpy (the bf16 logits widened to float32, np.argpartition and
np.take_along_axis: numpy has no bf16 partition) and torch.topk on the CPU where installed (bf16 in, sorted=False,
torch's default thread count). Each library is timed in its own steady state (deep_gemm.testing.bench_steady);
ratios are same-run. CPU numbers only; the machine these rows come from is usually shared (say so beside a time).

    python bench/topk_bench.py --quick             # two indexer rows (a minute)
    python bench/topk_bench.py                     # 64..2048 rows x 8k..64k columns, k = 512 and 2048
    python bench/topk_bench.py --rows 2048 --cols 65536 --k 2048 --no-torch
"""

from __future__ import annotations

import argparse

import numpy as np

# (rows, columns, k): the indexer's top-k over its logits (DeepSeek-V3.2 selects 2048 tokens per query)
ROWS = [(64, 8192), (64, 65536), (512, 16384), (2048, 8192), (2048, 65536)]
KS = (512, 2048)
QUICK = [(256, 32768, 512), (256, 32768, 2048)]


def _inputs(rng, rows: int, cols: int):
    import ml_dtypes

    return rng.standard_normal((rows, cols), dtype=np.float32).astype(ml_dtypes.bfloat16)


def _numpy_topk(x, k):
    xf = x.astype(np.float32)
    idx = np.argpartition(xf, xf.shape[1] - k, axis=1)[:, xf.shape[1] - k:]
    return np.take_along_axis(xf, idx, axis=1), idx


def _check(x, k, values, ref_values) -> None:
    """Same multiset of selected values per row as numpy's (which indices win a tie may differ)."""
    got = np.sort(values.astype(np.float32), axis=1)
    want = np.sort(ref_values, axis=1)
    if not np.array_equal(got, want):
        raise SystemExit(f"deep_gemm.topk disagrees with numpy on {x.shape} k={k}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="two rows: 256 x 32768, k = 512 and 2048")
    parser.add_argument("--rows", type=int, nargs="*", help="row counts (with --cols and --k)")
    parser.add_argument("--cols", type=int, nargs="*", help="column counts")
    parser.add_argument("--k", type=int, nargs="*", help="top-k values")
    parser.add_argument("--no-torch", action="store_true", help="leave torch.topk out")
    parser.add_argument("--blocks", type=int, default=3, help="timing rounds per library (default 3)")
    args = parser.parse_args()

    import deep_gemm
    from deep_gemm.testing.bench import bench_steady

    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            torch = None
    if args.rows:
        cases = [(r, c, k) for r in args.rows for c in (args.cols or [32768]) for k in (args.k or [512])]
    elif args.quick:
        cases = QUICK
    else:
        cases = [(r, c, k) for r, c in ROWS for k in KS]
    rng = np.random.default_rng(0)
    print(f"deep_gemm.topk on {deep_gemm.get_num_ai_cores()} AI cores (x2 AIVs) vs numpy argpartition"
          f"{' and torch.topk (' + str(torch.get_num_threads()) + ' threads)' if torch else ''}; bf16 input, "
          f"int32 indices, CPU times (median of {args.blocks} blocks)")
    header = f"{'rows':>6} {'cols':>7} {'k':>5} {'deep_gemm ms':>13} {'numpy ms':>9} {'x numpy':>8}"
    if torch:
        header += f" {'torch ms':>9} {'x torch':>8}"
    print(header)
    for rows, cols, k in cases:
        x = _inputs(rng, rows, cols)
        values, _ = deep_gemm.topk(x, k, indices_type=np.int32)
        _check(x, k, values, _numpy_topk(x, k)[0])
        fns = {"deep_gemm": lambda x=x, k=k: deep_gemm.topk(x, k, indices_type=np.int32),
               "numpy": lambda x=x, k=k: _numpy_topk(x, k)}
        if torch:
            t = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
            fns["torch"] = lambda t=t, k=k: torch.topk(t, k, dim=1, sorted=False)
        timing = bench_steady(fns, num_blocks=args.blocks, calls_per_block=2)
        line = (f"{rows:>6} {cols:>7} {k:>5} {timing.median('deep_gemm') * 1e3:>13.2f} "
                f"{timing.median('numpy') * 1e3:>9.2f} {timing.speedup('deep_gemm', 'numpy'):>8.2f}")
        if torch:
            line += f" {timing.median('torch') * 1e3:>9.2f} {timing.speedup('deep_gemm', 'torch'):>8.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
