"""FP8/FP4 GEMM launcher: D[m, n] (+)= alpha * (A * SFA) @ (B * SFB)^T with MX (1 x 32 UE8M0) scales, for
fp8 x fp8, fp4 x fp4 and fp8 x fp4 operands, through templates/fp8_gemm.asc.j2. Inputs arrive validated (api/).
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
    sf_view,
)

KERNEL_NAME = "fp8_gemm"

# NOTES: the dispatch fast path: a plain tuple key per call (no dataclass construction) -> the prepared kernel.
_fast: dict[tuple, PreparedGemm] = {}


def _prepare(m: int, n: int, k: int, a_dtype: str, b_dtype: str, out_dtype: str, major_a: str, major_b: str,
             with_accumulation: bool, compiled_dims: str, config: GemmConfig | None, gemm_type: str = "normal",
             num_groups: int = 1) -> PreparedGemm:
    num_ai_cores, arch = current_target()
    key = (m, n, k, a_dtype, b_dtype, out_dtype, major_a, major_b, with_accumulation, compiled_dims, num_ai_cores,
           arch.name, config, gemm_type, num_groups)
    prepared = _fast.get(key)
    if prepared is None:
        desc = GemmDesc(m=m, n=n, k=k, a_dtype=a_dtype, b_dtype=b_dtype, out_dtype=out_dtype, major_a=major_a,
                        major_b=major_b, with_accumulation=with_accumulation, num_ai_cores=num_ai_cores,
                        gemm_type=gemm_type, num_groups=num_groups)
        prepared = prepare_gemm(KERNEL_NAME, desc, compiled_dims, arch, config)
        _fast[key] = prepared
    return prepared


def launch_fp8_gemm(gm_a: np.ndarray, major_a: str, a_dtype: str, sfa: np.ndarray, gm_b: np.ndarray, major_b: str,
                    b_dtype: str, sfb: np.ndarray, d: np.ndarray, m: int, n: int, k: int, *,
                    with_accumulation: bool, alpha: float, compiled_dims: str,
                    config: GemmConfig | None = None, gemm_type: str = "normal", num_groups: int = 1,
                    grouped: GroupedLayout | None = None) -> GemmConfig:
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
    Reads runtime.get_num_ai_cores(), get_arch_spec(), get_dry_run(); env DG_PRINT_CONFIGS prints configs.
    """
    prepared = _prepare(int(m), int(n), int(k), a_dtype, b_dtype, out_dtype_of(d), major_a, major_b,
                        bool(with_accumulation), compiled_dims, config, gemm_type, int(num_groups))
    flat_a, stride_a = gm_view(gm_a, np.uint8)
    flat_b, stride_b = gm_view(gm_b, np.uint8)
    flat_sfa, stride_sfa = sf_view(sfa)
    flat_sfb, stride_sfb = sf_view(sfb)
    flat_d, stride_d = gm_view(d, out_storage_dtype(prepared.desc.out_dtype))
    args = (flat_a, stride_a, flat_sfa, stride_sfa, flat_b, stride_b, flat_sfb, stride_sfb, flat_d, stride_d,
            int(m), int(n), int(k), float(alpha))
    if gemm_type != "normal":
        args += grouped.kernel_args(with_sf=True)
    run_or_compile(prepared, args)
    return prepared.config


def precompile_fp8_gemm(m: int, n: int, k: int, a_dtype: str = "fp8", b_dtype: str = "fp8", out_dtype: str = "bf16",
                        major_a: str = "k", major_b: str = "k", with_accumulation: bool = False,
                        compiled_dims: str = "nk") -> GemmConfig:
    """Build and compile the kernel a launch_fp8_gemm call of this problem would use, without any data."""
    prepared = _prepare(m, n, k, a_dtype, b_dtype, out_dtype, major_a, major_b, with_accumulation, compiled_dims,
                        None)
    gm, sf = dummy_gm(np.uint8), dummy_gm(np.int16)
    compile_for(prepared, (gm, 1, sf, 1, gm, 1, sf, 1, dummy_gm(out_storage_dtype(out_dtype)), 1, m, n, k, 1.0))
    return prepared.config
