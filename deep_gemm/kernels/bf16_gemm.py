"""BF16 GEMM launcher: D[m, n] (+)= alpha * A @ B^T with bf16 operands and fp32 accumulation, through
templates/bf16_gemm.asc.j2. Inputs arrive validated (api/).
"""

from __future__ import annotations

import numpy as np

from ..heuristics.config import GemmConfig, GemmDesc
from .common import (
    GroupedLayout,
    PreparedGemm,
    compile_for,
    current_target,
    dummy_gm,
    gm_view,
    out_dtype_of,
    out_storage_dtype,
    prepare_gemm,
    run_or_compile,
)

KERNEL_NAME = "bf16_gemm"

_fast: dict[tuple, PreparedGemm] = {}


def _prepare(m: int, n: int, k: int, out_dtype: str, major_a: str, major_b: str, with_accumulation: bool,
             compiled_dims: str, config: GemmConfig | None, gemm_type: str = "normal",
             num_groups: int = 1) -> PreparedGemm:
    num_ai_cores, arch = current_target()
    key = (m, n, k, out_dtype, major_a, major_b, with_accumulation, compiled_dims, num_ai_cores, arch.name, config,
           gemm_type, num_groups)
    prepared = _fast.get(key)
    if prepared is None:
        desc = GemmDesc(m=m, n=n, k=k, a_dtype="bf16", b_dtype="bf16", out_dtype=out_dtype, major_a=major_a,
                        major_b=major_b, with_accumulation=with_accumulation, num_ai_cores=num_ai_cores,
                        gemm_type=gemm_type, num_groups=num_groups)
        prepared = prepare_gemm(KERNEL_NAME, desc, compiled_dims, arch, config)
        _fast[key] = prepared
    return prepared


def launch_bf16_gemm(gm_a: np.ndarray, major_a: str, gm_b: np.ndarray, major_b: str, d: np.ndarray, m: int, n: int,
                     k: int, *, with_accumulation: bool, alpha: float, compiled_dims: str,
                     config: GemmConfig | None = None, gemm_type: str = "normal", num_groups: int = 1,
                     grouped: GroupedLayout | None = None) -> GemmConfig:
    """Run (or, in dry-run mode, only build and compile) the BF16 GEMM kernel; returns its GemmConfig.

    gm_a / gm_b: uint16 bf16 bits (or ml_dtypes.bfloat16) with unit last stride: K-major [MN, >= K], MN-major
    [K, >= MN]. d: [M, >= N] float32 or uint16 bf16 bits, written only in d[:m, :n]: round(alpha * acc), or
    round(d + alpha * acc) with_accumulation. compiled_dims: letters of "mnk" baked into the kernel.
    ``config`` overrides the heuristic. M-grouped kinds: as ``launch_fp8_gemm`` (``grouped`` places the groups;
    gm_b holds every group's B, ``grouped.group_stride_b`` elements apart).
    Reads runtime.get_num_ai_cores(), get_arch_spec(), get_dry_run().
    """
    prepared = _prepare(int(m), int(n), int(k), out_dtype_of(d), major_a, major_b, bool(with_accumulation),
                        compiled_dims, config, gemm_type, int(num_groups))
    flat_a, stride_a = gm_view(gm_a, np.uint16)
    flat_b, stride_b = gm_view(gm_b, np.uint16)
    flat_d, stride_d = gm_view(d, out_storage_dtype(prepared.desc.out_dtype))
    args = (flat_a, stride_a, flat_b, stride_b, flat_d, stride_d, int(m), int(n), int(k), float(alpha))
    if gemm_type != "normal":
        args += grouped.kernel_args(with_sf=False)
    run_or_compile(prepared, args)
    return prepared.config


def precompile_bf16_gemm(m: int, n: int, k: int, out_dtype: str = "bf16", major_a: str = "k", major_b: str = "k",
                         with_accumulation: bool = False, compiled_dims: str = "nk") -> GemmConfig:
    """Build and compile the kernel a launch_bf16_gemm call of this problem would use, without any data."""
    prepared = _prepare(m, n, k, out_dtype, major_a, major_b, with_accumulation, compiled_dims, None)
    gm = dummy_gm(np.uint16)
    compile_for(prepared, (gm, 1, gm, 1, dummy_gm(out_storage_dtype(out_dtype)), 1, m, n, k, 1.0))
    return prepared.config
