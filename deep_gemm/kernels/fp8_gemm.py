"""FP8/FP4 GEMM launcher: D[m, n] (+)= alpha * (A * SFA) @ (B * SFB)^T with MX (1 x 32 UE8M0) scales, for
fp8 x fp8, fp4 x fp4 and fp8 x fp4 operands, dense or M-grouped, through templates/fp8_gemm.asc.j2 (the kernel
family FP8_GEMM). Inputs arrive validated (api/).
"""

from __future__ import annotations

import numpy as np

from ..heuristics.config import GemmConfig
from .common import GroupedLayout, gemm_family, gm_view, out_args, out_dtype_of, prepare_gemm, sf_view

FP8_GEMM = gemm_family("fp8_gemm")


def launch_fp8_gemm(gm_a: np.ndarray, major_a: str, a_dtype: str, sfa: np.ndarray, gm_b: np.ndarray, major_b: str,
                    b_dtype: str, sfb: np.ndarray, d: np.ndarray, m: int, n: int, k: int, *,
                    with_accumulation: bool, alpha: float, compiled_dims: str,
                    config: GemmConfig | None = None, gemm_type: str = "normal", num_groups: int = 1,
                    grouped: GroupedLayout | None = None, sfd: np.ndarray | None = None,
                    l0_bf16: bool = True) -> GemmConfig:
    """Run (or, in dry-run mode, only build and compile) the FP8/FP4 GEMM kernel; returns its GemmConfig.

    gm_a / gm_b: uint8 physical storage with unit last stride: K-major [MN, >= K] (fp8) or [MN, >= K/2] (packed
    fp4), MN-major [K, >= MN] or [K, >= MN/2]. a_dtype / b_dtype in {"fp8", "fp4"} (fp8xfp8, fp4xfp4, fp8xfp4).
    sfa / sfb: int16 [ceil(K/64), MN] required layout (UE8M0 pairs). d: [M, >= N] float32 or uint16 bf16 bits,
    written only in d[:m, :n]: round(alpha * acc), or round(d + alpha * acc) with_accumulation.
    compiled_dims: letters of "mnk" baked into the kernel. ``config`` overrides the heuristic (tests, benches).
    M-grouped kinds (``gemm_type`` "m_grouped_contiguous", "m_grouped_masked", "batched"): ``grouped`` says where
    the groups' rows are; gm_b / sfb hold every group's B one after another (``grouped.group_stride_b`` /
    ``group_stride_sfb`` elements apart); m and ``num_groups`` describe the problem to the heuristic only
    (total real rows and the groups that have any).
    FP8 output (the FP8Quantization epilogue): d uint8 e4m3 codes [M, >= N] and ``sfd`` int16 [M, N/64] with
    strides (1, M), N % 64 == 0, no accumulation, alpha 1; the kernel is a mixed one (lib/epilogue.asc.j2).
    Reads runtime.get_num_ai_cores(), get_arch_spec(), get_dry_run(); env DG_PRINT_CONFIGS prints configs,
    DG_SYNC_CHECK builds the checker's kernels. ``l0_bf16`` False keeps the fp32 FMA Cube even where the AMX one
    would run (scales that leave operand values subnormal: api.checks.rebalance_scales).
    """
    prepared = prepare_gemm(FP8_GEMM, int(m), int(n), int(k), a_dtype, b_dtype, out_dtype_of(d), major_a, major_b,
                            bool(with_accumulation), compiled_dims, config, gemm_type, int(num_groups), l0_bf16)
    flat_a, stride_a = gm_view(gm_a, np.uint8)
    flat_b, stride_b = gm_view(gm_b, np.uint8)
    flat_sfa, stride_sfa = sf_view(sfa)
    flat_sfb, stride_sfb = sf_view(sfb)
    grouped_args = grouped.kernel_args(with_sf=True) if gemm_type != "normal" else {}
    prepared.launch(gm_a=flat_a, stride_a=stride_a, gm_sfa=flat_sfa, stride_sfa=stride_sfa, gm_b=flat_b,
                    stride_b=stride_b, gm_sfb=flat_sfb, stride_sfb=stride_sfb,
                    **out_args(d, prepared.desc.out_dtype, sfd), shape_m=m, shape_n=n, shape_k=k, alpha=alpha,
                    **grouped_args)
    return prepared.config


def precompile_fp8_gemm(m: int, n: int, k: int, a_dtype: str = "fp8", b_dtype: str = "fp8", out_dtype: str = "bf16",
                        major_a: str = "k", major_b: str = "k", with_accumulation: bool = False,
                        compiled_dims: str = "nk", gemm_type: str = "normal", num_groups: int = 1) -> GemmConfig:
    """Build and compile the kernel a launch_fp8_gemm call of this problem would use, without any data (the
    argument types come from the template's entry signature)."""
    prepared = prepare_gemm(FP8_GEMM, m, n, k, a_dtype, b_dtype, out_dtype, major_a, major_b, with_accumulation,
                            compiled_dims, None, gemm_type, num_groups)
    prepared.precompile()
    return prepared.config
