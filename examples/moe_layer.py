"""An expert-parallel MoE layer (DeepSeek's Mega MoE) on two simulated ranks: each rank is a process, the ranks
share one POSIX shared-memory buffer, and the result is checked against the float64 reference.
Run: python examples/moe_layer.py"""
import ml_dtypes
import numpy as np

import deep_gemm
from deep_gemm.testing import calc_diff, init_dist, spawn
from deep_gemm.testing.mega_moe import make_case  # random FP8 tokens, routes and FP4 expert weights for one rank

E, T, K, H, I = 8, 48, 2, 512, 512  # experts, tokens per rank, top-k, hidden, intermediate


def layer(local_rank: int, num_ranks: int) -> float:
    rank, num_ranks, group = init_dist(local_rank, num_ranks)
    case = make_case(rank, num_ranks, E, T, K, H, I, num_shared_experts=0)
    sym = deep_gemm.SymmBuffer(group, E, T, K, H, I)  # collective: every rank maps every rank's buffer
    sym.x[:T], sym.x_sf[:T] = case.x, case.x_sf  # this rank's tokens (FP8, UE8M0 scale pairs) ...
    sym.topk_idx[:T], sym.topk_weights[:T] = case.topk_idx, case.topk_weights  # ... and their routes
    l1, l2 = deep_gemm.transform_weights_for_mega_moe(case.l1, case.l2)  # this rank's E / R experts
    y, ref = (np.empty((T, H), ml_dtypes.bfloat16) for _ in range(2))
    deep_gemm.fp8_fp4_mega_moe(y, l1, l2, sym)  # dispatch, L1, SwiGLU + FP8, L2, combine
    deep_gemm.aclnn_fp8_fp4_mega_moe(ref, l1, l2, sym)  # float64 reference of the same layer
    return calc_diff(y.astype(np.float64), ref.astype(np.float64))


if __name__ == "__main__":
    for rank, diff in enumerate(spawn(layer, 2)):
        print(f"rank {rank}: calc_diff vs float64 {diff:.2e}")
        assert diff < 1e-3
