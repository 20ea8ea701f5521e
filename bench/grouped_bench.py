"""CPU benchmark of the grouped GEMMs (MoE shapes) beside the numpy code a careful user would otherwise write, in
one run: a Python loop over the groups that decodes each group's FP8 operands through the 256-entry table, scales
them in place and multiplies in fp32 (deep_gemm.testing.peers' decode, the strongest numpy formulation), and torch
on the CPU when installed, as a torch user writes it: the FP8 weights stay FP8 in memory and every call decodes
them and the activations to bf16 (block scales applied), then torch.nn.functional.grouped_mm over the groups
(contiguous; on the real rows with offsets, the layout torch's op takes) or a loop of matmuls over each group's
masked rows (masked), timed at torch's default thread count and at every other count (each its own library).
Per row: the stand-in's time, the numpy loop's, torch's at its default and at its best thread count, the speedups
(over numpy, over torch at its defaults, over the best peer: per round the fastest of numpy and torch at any thread
count), the issue's target (none is set for the grouped rows), the dense FP8 kernel on the same total rows (one
weight) and the grouped call's throughput relative to it, and the modelled Ascend 950DT time of the grouped call
(``estimate_gemm`` with the call's actual layout). Every library of a row is timed in one ``bench_steady`` run (the
steady-state protocol printed at the start). CPU numbers are CPU numbers; chip numbers are modelled.

    python bench/grouped_bench.py --quick                     # small MoE-like shapes (minutes on 2 cores)
    python bench/grouped_bench.py                             # DeepSeek-V3-like shapes (hours on 2 cores)
    python bench/grouped_bench.py --limit 1 --blocks 3 --calls 1   # one full-size row of each kind
    python bench/grouped_bench.py --kinds masked --blocks 7
"""

from __future__ import annotations

import argparse
import os
import statistics
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

GROUPED, NUMPY, DENSE, TORCH = "deep_gemm grouped", "numpy loop", "deep_gemm dense", "torch"
# NOTES: issue 28's target table sets no target for the grouped GEMMs; the rows print the best-peer ratio anyway.
TARGET = "none set"


def _fp8_stack(rng, g: int, mn: int, k: int):
    """(float8 codes [g, mn, k], fp32 power-of-two scales [g, mn, k/32]) without NaN codes."""
    import ml_dtypes

    codes = rng.integers(0, 256, size=(g, mn, k), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0
    exps = rng.integers(118, 121, size=(g, mn, -(-k // 32)))
    sf = np.ldexp(np.float32(1), exps - 127).astype(np.float32)
    return codes.view(ml_dtypes.float8_e4m3fn), sf


def _steady(fns: dict, opts) -> tuple:
    """bench_steady over ``fns``, and each library's median process CPU seconds per call (every thread of this
    process; the warm-up call left out). CPU time is what the call costs the machine whoever else runs on it, so it
    compares the grouped and dense kernels (both ours, whose idle threads sleep) where a loaded machine's wall clock
    cannot; numpy's figure would include OpenBLAS threads spinning after a call and is not used."""
    from deep_gemm.testing import bench_steady

    cpu = {name: [] for name in fns}

    def counted(name, fn):
        def call():
            start = time.process_time()
            fn()
            cpu[name].append(time.process_time() - start)
        return call

    timing = bench_steady({name: counted(name, fn) for name, fn in fns.items()}, opts.blocks, opts.calls)
    return timing, {name: statistics.median(times[1:]) for name, times in cpu.items()}


def _torch_names(names) -> list[str]:
    return [n for n in names if n == TORCH or n.startswith(TORCH + "-")]


def _torch_fns(make) -> dict:
    """The torch entries of a row (default threads and every other count), or {} without torch."""
    from deep_gemm.testing import peers

    return peers.torch_variants(make()) if peers.torch_version() else {}


def row_figures(timing, flops: float) -> dict:
    """The figures of one row: every library's ms, the speedups over numpy, torch (default threads), torch at its
    best thread count and the best peer, and the stand-in's GFLOP/s."""
    t_grouped = timing.median(GROUPED)
    out = {"grouped_ms": t_grouped * 1e3, "gflops": flops / t_grouped / 1e9, "numpy_ms": timing.median(NUMPY) * 1e3,
           "x_numpy": timing.speedup(GROUPED, NUMPY), "torch_ms": None, "torch_best_ms": None,
           "torch_best_threads": None, "x_torch": None, "x_torch_best": None}
    torch_names = _torch_names(timing.blocks)
    if torch_names:
        from deep_gemm.testing import peers

        best = min(torch_names, key=timing.median)
        out.update(torch_ms=timing.median(TORCH) * 1e3, torch_best_ms=timing.median(best) * 1e3,
                   torch_best_threads=peers.torch_default_threads() if best == TORCH else int(best[6:-1]),
                   x_torch=timing.speedup(GROUPED, TORCH), x_torch_best=timing.speedup(GROUPED, best))
    out["x_best_peer"] = timing.speedup(GROUPED, [NUMPY] + torch_names)
    return out


def _row(kind, shape, timing, cpu, flops, est_us, note=""):
    g, rows, n, k = shape
    f = row_figures(timing, flops)
    dense = ""
    if DENSE in timing.blocks:
        dense = (f"{timing.median(DENSE) * 1e3:10.1f} {timing.speedup(GROUPED, DENSE):7.2f} "
                 f"{cpu[DENSE] / cpu[GROUPED]:7.2f}")

    def num(value, fmt):
        return "-" if value is None else format(value, fmt)

    best_t = "" if f["torch_best_threads"] is None else f"@{f['torch_best_threads']}t"
    print(f"{kind:>10} {f'{g}x{rows} {n}x{k}':>22} {f['grouped_ms']:10.1f} {f['gflops']:7.1f} "
          f"{f['numpy_ms']:10.1f} {num(f['torch_ms'], '.1f'):>9} {num(f['torch_best_ms'], '.1f') + best_t:>12} "
          f"{f['x_numpy']:7.2f} {num(f['x_torch'], '.2f'):>7} {f['x_best_peer']:7.2f} {TARGET:>8} {dense:>26} "
          f"{est_us:10.1f} {os.getloadavg()[0]:5.1f}  {note}", flush=True)


def bench_contiguous(shape, opts, rng) -> None:
    import ml_dtypes

    import deep_gemm
    from deep_gemm.testing import grouped_layouts
    from deep_gemm.testing.peers import decode_fp8_lut

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
    padding = per_row < 0
    out = np.empty((m, n), ml_dtypes.bfloat16)

    def grouped():
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, psum)

    def numpy_loop():
        # NOTES: the same contract as the grouped call: every group's rows, the padding rows zeroed.
        out[padding] = 0
        for i in range(g):
            if sizes[i]:
                s, e = starts[i], starts[i] + sizes[i]
                out[s:e] = decode_fp8_lut(a[s:e], sfa[s:e]) @ decode_fp8_lut(b[i], sfb[i]).T

    real = sum(sizes)
    d_dense = np.empty((real, n), ml_dtypes.bfloat16)
    a_dense = (np.ascontiguousarray(a[per_row >= 0]), np.ascontiguousarray(sfa[per_row >= 0]))

    def dense():
        deep_gemm.fp8_gemm_nt(a_dense, (b[0], sfb[0]), d_dense)

    def torch_grouped():
        # NOTES: torch's grouped op takes the real rows back to back (offsets, no padding): the layout a torch MoE
        # has. Weights and activations stay FP8 and are decoded every call, as a torch user with FP8 weights does.
        import torch

        from deep_gemm.testing import peers

        ta, tsa = peers.torch_tensor(a_dense[0]), peers.torch_tensor(a_dense[1])
        tb, tsb = peers.torch_tensor(b), peers.torch_tensor(sfb)
        offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32)
        grouped_mm = getattr(torch.nn.functional, "grouped_mm", None)

        def call():
            x, w = peers.torch_decode_fp8(ta, tsa, k), peers.torch_decode_fp8(tb, tsb, k)
            if grouped_mm is not None:
                return grouped_mm(x, w.transpose(-2, -1), offs=offs)
            ends = offs.tolist()
            return torch.cat([x[s:e] @ w[i].T for i, (s, e) in enumerate(zip([0] + ends[:-1], ends, strict=True))])

        return call

    start = time.perf_counter()
    grouped()  # build + compile (or load) outside the timing
    dense()
    setup = time.perf_counter() - start
    timing, cpu = _steady({GROUPED: grouped, NUMPY: numpy_loop, **_torch_fns(torch_grouped), DENSE: dense}, opts)
    est = deep_gemm.estimate_gemm(real, n, k, gemm_type="m_grouped_contiguous", group_sizes=sizes)
    _row("contiguous", shape, timing, cpu, 2.0 * real * n * k, est.time_us, f"sizes={sizes} setup {setup:.1f}s")


def bench_masked(shape, opts, rng) -> None:
    import ml_dtypes

    import deep_gemm
    from deep_gemm.testing.peers import decode_fp8_lut

    g, max_m, n, k = shape
    masked_m = rng.integers(1, max_m + 1, size=g).astype(np.int32)
    a, sfa = _fp8_stack(rng, g, max_m, k)
    b, sfb = _fp8_stack(rng, g, n, k)
    d = np.empty((g, max_m, n), ml_dtypes.bfloat16)
    out = np.empty((g, max_m, n), ml_dtypes.bfloat16)
    expected = max(1, int(round(float(masked_m.mean()))))

    def grouped():
        deep_gemm.m_grouped_fp8_gemm_nt_masked((a, sfa), (b, sfb), d, masked_m, expected)

    def numpy_loop():
        # NOTES: the host knows masked_m here (a numpy user has to); rows past it are not written, as in the kernel.
        for i, r in enumerate(masked_m.tolist()):
            if r:
                out[i, :r] = decode_fp8_lut(a[i, :r], sfa[i, :r]) @ decode_fp8_lut(b[i], sfb[i]).T

    def torch_loop():
        # NOTES: a loop of matmuls over each group's masked rows (the host knows masked_m, as for numpy); every
        # call decodes the FP8 weights and activations to bf16 (block scales applied).
        from deep_gemm.testing import peers

        ta, tsa = peers.torch_tensor(a), peers.torch_tensor(sfa)
        tb, tsb = peers.torch_tensor(b), peers.torch_tensor(sfb)
        tout = peers.torch_tensor(np.empty((g, max_m, n), ml_dtypes.bfloat16))
        rows = masked_m.tolist()

        def call():
            w = peers.torch_decode_fp8(tb, tsb, k)
            for i, r in enumerate(rows):
                if r:
                    tout[i, :r] = peers.torch_decode_fp8(ta[i, :r], tsa[i, :r], k) @ w[i].T
            return tout

        return call

    start = time.perf_counter()
    grouped()
    setup = time.perf_counter() - start
    timing, cpu = _steady({GROUPED: grouped, NUMPY: numpy_loop, **_torch_fns(torch_loop)}, opts)
    real = int(masked_m.sum())
    est = deep_gemm.estimate_gemm(real, n, k, gemm_type="m_grouped_masked", group_sizes=masked_m.tolist())
    _row("masked", shape, timing, cpu, 2.0 * real * n * k, est.time_us,
         f"masked_m max {int(masked_m.max())}, sum {real}, expected_m {expected}; setup {setup:.1f}s")


def main(argv: list[str] | None = None) -> int:
    from deep_gemm.testing import STEADY_PROTOCOL

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + "\n\n" +
                                     STEADY_PROTOCOL.replace("CALLS", "--calls").replace("BLOCKS", "--blocks"),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small MoE-like shapes instead of DeepSeek-V3's")
    parser.add_argument("--kinds", nargs="*", choices=("contiguous", "masked"), default=["contiguous", "masked"])
    parser.add_argument("--blocks", type=int, default=5, help="rounds of blocks per row (bench_steady)")
    parser.add_argument("--calls", type=int, default=3, help="timed calls per block (after the block's discarded ones)")
    parser.add_argument("--limit", type=int, default=None, help="run only the first N rows of each kind")
    parser.add_argument("--cores", type=int, default=None, help="logical AI cores (default: the runtime's)")
    opts = parser.parse_args(argv)

    from deep_gemm import runtime
    from deep_gemm.testing import describe_machine, peers

    rng = np.random.default_rng(0)
    with runtime.runtime_scope(num_ai_cores=opts.cores):
        print(f"# machine: {describe_machine()}")
        print(f"# load average at start {os.getloadavg()[0]:.2f} (other processes skew every row; the 'load' "
              "column is the 1-minute load average after the row)")
        print("# " + STEADY_PROTOCOL.replace("CALLS", str(opts.calls)).replace("BLOCKS", str(opts.blocks))
              .replace("\n", "\n# "))
        if peers.torch_version():
            print(f"# torch {peers.torch_version()}: default {peers.torch_default_threads()} threads, also timed at "
                  f"{', '.join(str(t) for t in peers.torch_thread_counts())} (best = lowest median)")
        else:
            print("# torch not installed (pip install deep_gemm[torch]): its columns print as '-'")
        print(f"# FP8 grouped GEMMs, {runtime.get_num_ai_cores()} logical AI cores; numpy loop = per-group LUT decode "
              f"+ in-place scaling + fp32 matmul; x numpy / x torch = numpy / grouped and torch (default threads) / "
              f"grouped time, x best = over the best peer; g/dense = dense / grouped time (the throughput ratio on "
              f"the same real rows), cpu g/d = the same ratio of process CPU time per call; chip times modelled "
              f"({runtime.get_npu_arch()})")
        print(f"{'kind':>10} {'groups x rows N x K':>22} {'grouped ms':>10} {'GFLOP/s':>7} {'numpy ms':>10} "
              f"{'torch ms':>9} {'torch best':>12} {'x numpy':>7} {'x torch':>7} {'x best':>7} {'target':>8} "
              f"{'dense ms':>10} {'g/dense':>7} {'cpu g/d':>7} {'chip us':>10} {'load':>5}")
        for kind in opts.kinds:
            shapes = {"contiguous": QUICK_CONTIGUOUS if opts.quick else CONTIGUOUS,
                      "masked": QUICK_MASKED if opts.quick else MASKED}[kind]
            for shape in shapes[:opts.limit]:
                (bench_contiguous if kind == "contiguous" else bench_masked)(shape, opts, rng)
    return 0


if __name__ == "__main__":
    sys.exit(main())
