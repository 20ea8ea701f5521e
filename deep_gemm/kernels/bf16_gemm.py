"""BF16 GEMM launcher: D[m, n] (+)= alpha * A @ B^T with bf16 operands and fp32 accumulation, dense or M-grouped,
through templates/bf16_gemm.asc.j2 (the kernel family BF16_GEMM). Inputs arrive validated (api/).
"""

from __future__ import annotations

import numpy as np

from ..heuristics.config import GemmConfig
from .common import GroupedLayout, gemm_family, gm_view, out_args, out_dtype_of, prepare_gemm

BF16_GEMM = gemm_family("bf16_gemm")


def launch_bf16_gemm(gm_a: np.ndarray, major_a: str, gm_b: np.ndarray, major_b: str, d: np.ndarray, m: int, n: int,
                     k: int, *, with_accumulation: bool, alpha: float, compiled_dims: str,
                     config: GemmConfig | None = None, gemm_type: str = "normal", num_groups: int = 1,
                     grouped: GroupedLayout | None = None, sfd: np.ndarray | None = None) -> GemmConfig:
    """Run (or, in dry-run mode, only build and compile) the BF16 GEMM kernel; returns its GemmConfig.

    gm_a / gm_b: uint16 bf16 bits (or ml_dtypes.bfloat16) with unit last stride: K-major [MN, >= K], MN-major
    [K, >= MN]. d: [M, >= N] float32 or uint16 bf16 bits, written only in d[:m, :n]: round(alpha * acc), or
    round(d + alpha * acc) with_accumulation. compiled_dims: letters of "mnk" baked into the kernel.
    ``config`` overrides the heuristic. M-grouped kinds: as ``launch_fp8_gemm`` (``grouped`` places the groups;
    gm_b holds every group's B, ``grouped.group_stride_b`` elements apart).
    FP8 output (the FP8Quantization epilogue): d uint8 e4m3 codes and ``sfd``, as ``launch_fp8_gemm``.
    Reads runtime.get_num_ai_cores(), get_arch_spec(), get_dry_run(); env DG_SYNC_CHECK.
    """
    prepared = prepare_gemm(BF16_GEMM, int(m), int(n), int(k), "bf16", "bf16", out_dtype_of(d), major_a, major_b,
                            bool(with_accumulation), compiled_dims, config, gemm_type, int(num_groups))
    flat_a, stride_a = gm_view(gm_a, np.uint16)
    flat_b, stride_b = gm_view(gm_b, np.uint16)
    grouped_args = grouped.kernel_args(with_sf=False) if gemm_type != "normal" else {}
    prepared.launch(gm_a=flat_a, stride_a=stride_a, gm_b=flat_b, stride_b=stride_b,
                    **out_args(d, prepared.desc.out_dtype, sfd), shape_m=m, shape_n=n, shape_k=k, alpha=alpha,
                    **grouped_args)
    return prepared.config


def precompile_bf16_gemm(m: int, n: int, k: int, out_dtype: str = "bf16", major_a: str = "k", major_b: str = "k",
                         with_accumulation: bool = False, compiled_dims: str = "nk", gemm_type: str = "normal",
                         num_groups: int = 1) -> GemmConfig:
    """Build and compile the kernel a launch_bf16_gemm call of this problem would use, without any data (the
    argument types come from the template's entry signature)."""
    prepared = prepare_gemm(BF16_GEMM, m, n, k, "bf16", "bf16", out_dtype, major_a, major_b, with_accumulation,
                            compiled_dims, None, gemm_type, num_groups)
    prepared.precompile()
    return prepared.config
