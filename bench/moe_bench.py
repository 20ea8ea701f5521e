"""CPU benchmark of the mega MoE layer on simulated ranks (one process per rank, deep_gemm.testing.spawn), in one
run: ``fp8_fp4_mega_moe`` (one call per rank) beside the unfused path a DeepEP + DeepGEMM user runs (expanded
dispatch, M-grouped FP8 x FP4 GEMM, SwiGLU + weight + FP8 cast, M-grouped GEMM, combine; deep_gemm.testing.mega_moe
``baseline_moe``) and beside the numpy code a user would write (the same dispatch and combine, the experts in
dequantised fp32 numpy), with the same-run ratios, and the modelled Ascend 950DT time per rank (estimate_mega_moe).
Each rank times the three paths in alternation, every call between two barriers; a row reports the slowest rank's
median. CPU numbers are CPU numbers on a shared machine; chip numbers are modelled.

    python bench/moe_bench.py                      # R=2 and R=4, small layers (a few minutes on 2 cores)
    python bench/moe_bench.py --calls 5 --ranks 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

# (ranks, experts, tokens per rank, top-k, hidden, intermediate, shared experts)
CONFIGS = [(2, 8, 64, 4, 512, 512, 1), (4, 16, 64, 6, 512, 512, 1), (2, 16, 256, 6, 512, 512, 1)]


def _rank(local_rank: int, num_ranks: int, config: tuple, calls: int) -> dict:
    import deep_gemm
    from deep_gemm.ep import SymmetricBuffer
    from deep_gemm.ep.buffer import ElasticBuffer
    from deep_gemm.testing import init_dist
    from deep_gemm.testing.mega_moe import baseline_moe, make_case, numpy_moe
    from deep_gemm.testing.numeric import calc_diff
    from deep_gemm.utils.formats import BF16_DTYPE

    rank, num_ranks, group = init_dist(local_rank, num_ranks)
    _, e, t, k, h, i, s = config
    case = make_case(rank, num_ranks, e, t, k, h, i, s)
    sym = deep_gemm.SymmBuffer(group, e, t, k, h, i, s)
    sym.x[:t], sym.x_sf[:t], sym.topk_idx[:t], sym.topk_weights[:t] = (
        case.x, case.x_sf, case.topk_idx, case.topk_weights)
    l1, l2 = deep_gemm.transform_weights_for_mega_moe(case.l1, case.l2)
    shared = deep_gemm.transform_weights_for_mega_moe(case.shared_l1, case.shared_l2) if s else (None, None)
    ep = ElasticBuffer(group, num_max_tokens_per_rank=t, hidden=h, num_topk=k)
    comb = SymmetricBuffer(group, (k + 1) * t * h * 2)
    y = np.empty((t, h), BF16_DTYPE)
    out = {}
    paths = {
        "fused": lambda: deep_gemm.fp8_fp4_mega_moe(y, l1, l2, sym, *shared),
        "unfused": lambda: out.__setitem__("unfused", baseline_moe(group, case, e, t, ep_buffer=ep,
                                                                   combine_buffer=comb)[0]),
        "numpy": lambda: out.__setitem__("numpy", numpy_moe(group, case, e, t, ep_buffer=ep)),
    }
    times = {name: [] for name in paths}
    for call in range(calls + 1):  # the first round warms up (loads the kernels)
        for name, fn in paths.items():
            group.barrier()
            t0 = time.perf_counter()
            fn()
            group.barrier()
            if call:
                times[name].append(time.perf_counter() - t0)
    f32 = y.astype(np.float64)
    return {"median": {n: statistics.median(v) for n, v in times.items()},
            "bitwise": bool(np.array_equal(y.view(np.uint16), out["unfused"].view(np.uint16))),
            "numpy_diff": calc_diff(f32, out["numpy"].astype(np.float64))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3, help="timed calls per path (after one warm-up round)")
    parser.add_argument("--ranks", type=int, default=None, help="only the configurations with this many ranks")
    args = parser.parse_args(argv)

    import deep_gemm
    from deep_gemm.testing import spawn
    from deep_gemm.testing.mega_moe import check_rank

    print("mega MoE on simulated ranks (loaded machine: other agents share its 2 CPUs); times are the slowest "
          "rank's median wall clock per call; chip times modelled (Ascend 950DT, 32 AI cores)")
    print(f"{'R':>2} {'E':>3} {'T':>4} {'K':>2} {'H':>5} {'I':>5} {'S':>2} | {'fused ms':>9} {'unfused ms':>10} "
          f"{'numpy ms':>9} | {'unfused/fused':>13} {'numpy/fused':>11} | {'bitwise':>7} {'numpy diff':>10} | "
          f"{'950DT us':>9} {'bound':>12}")
    for config in CONFIGS:
        r, e, t, k, h, i, s = config
        if args.ranks is not None and r != args.ranks:
            continue
        # NOTES: compile the GEMM specializations once in this process; the rank processes load them from disk.
        check_rank(0, 1, dict(E=e // r, T=min(t, 16), K=min(k, e // r), H=h, I=i, S=s))
        results = spawn(_rank, r, config, args.calls, timeout=3600)
        slow = {name: max(res["median"][name] for res in results) for name in ("fused", "unfused", "numpy")}
        est = deep_gemm.estimate_mega_moe(e, h, i, t, k, s, r, arch="950DT")
        bitwise = all(res["bitwise"] for res in results)
        diff = max(res["numpy_diff"] for res in results)
        print(f"{r:>2} {e:>3} {t:>4} {k:>2} {h:>5} {i:>5} {s:>2} | {1e3 * slow['fused']:>9.1f} "
              f"{1e3 * slow['unfused']:>10.1f} {1e3 * slow['numpy']:>9.1f} | {slow['unfused'] / slow['fused']:>13.2f} "
              f"{slow['numpy'] / slow['fused']:>11.2f} | {str(bitwise):>7} {diff:>10.2e} | {est.time_us:>9.1f} "
              f"{est.bound:>12}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
