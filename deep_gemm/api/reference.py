"""Reference GEMMs computed with numpy, the cross-check DeepGEMM-Ascend runs against ACLNN (``aclnn_*``) and
CUDA DeepGEMM against cuBLASLt (``cublaslt_*``, aliases of the BF16 ones).

Same arguments, checks and scale-factor handling as the kernels, but the math is a float64 matmul of exactly
decoded operands, so it shares no code path with the JIT kernels below the argument checks. The grouped, batched
and einsum references loop over groups in numpy (one float64 matmul per group, rounded once into d).
"""

from __future__ import annotations

import numpy as np

from ..utils.formats import bf16_bits_to_fp32, decode_e2m1, decode_e4m3, fp32_to_bf16_bits, unpack_fp4
from ..utils.layout import unpack_sf_from_required_layout
from . import einsum as _einsum
from . import gemm as _gemm
from . import grouped as _grouped
from .checks import Operand, check_alpha, require_array, transposed


def _decode(op: Operand) -> np.ndarray:
    """The operand's values as float64 [MN, K] (before scaling)."""
    if op.kind == "bf16":
        return bf16_bits_to_fp32(op.array.view(np.uint16)).astype(np.float64)
    if op.kind == "fp8":
        return decode_e4m3(op.array.view(np.uint8)).astype(np.float64)
    axis = 1 if op.major == "k" else 0
    return decode_e2m1(unpack_fp4(op.array.view(np.uint8), axis=axis)).astype(np.float64)


def _dequantize(op: Operand, sf_phys: np.ndarray) -> np.ndarray:
    scales = unpack_sf_from_required_layout(sf_phys.T, op.mn, op.k).astype(np.float64)
    values = _decode(op)
    return values * np.repeat(scales, 32, axis=1)[:, : op.k]


def _store(d: np.ndarray, out_kind: str, acc: np.ndarray, c: np.ndarray | None, alpha: float) -> None:
    result = alpha * acc
    if c is not None:
        result = result + (bf16_bits_to_fp32(c.view(np.uint16)) if out_kind == "bf16" else c).astype(np.float64)
    result32 = result.astype(np.float32)
    if out_kind == "bf16":
        d.view(np.uint16)[...] = fp32_to_bf16_bits(result32)
    else:
        d[...] = result32


def aclnn_fp8_fp4_gemm_nt(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, disable_ue8m0_cast=False):
    """Reference for ``fp8_fp4_gemm_nt``: D = C + dequant(A) @ dequant(B)^T in float64, rounded once into d."""
    p = _gemm.check_fp8_fp4_problem(a, b, d, c, recipe, recipe_a, recipe_b, disable_ue8m0_cast)
    if p.m == 0 or p.n == 0:
        return
    _store(p.d, p.out_kind, _dequantize(p.op_a, p.sfa) @ _dequantize(p.op_b, p.sfb).T, p.c, 1.0)


def aclnn_fp8_fp4_gemm_nn(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, disable_ue8m0_cast=False):
    b_arr, sfb = _gemm._split_pair(b, "b")
    aclnn_fp8_fp4_gemm_nt(a, (b_arr.T, transposed(sfb)), d, c, recipe, recipe_a, recipe_b, disable_ue8m0_cast)


def aclnn_fp8_fp4_gemm_tn(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, disable_ue8m0_cast=False):
    a_arr, sfa = _gemm._split_pair(a, "a")
    b_arr, sfb = _gemm._split_pair(b, "b")
    aclnn_fp8_fp4_gemm_nt((a_arr.T, transposed(sfa)), (b_arr.T, transposed(sfb)), d, c, recipe, recipe_a, recipe_b,
                          disable_ue8m0_cast)


def aclnn_fp8_fp4_gemm_tt(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, disable_ue8m0_cast=False):
    a_arr, sfa = _gemm._split_pair(a, "a")
    aclnn_fp8_fp4_gemm_nt((a_arr.T, transposed(sfa)), b, d, c, recipe, recipe_a, recipe_b, disable_ue8m0_cast)


def aclnn_bf16_gemm_nt(a, b, d, c=None, alpha=None):
    """Reference for ``bf16_gemm_nt``: D = C + alpha * A @ B^T in float64, rounded once into d."""
    op_a, op_b, d, c, out_kind = _gemm.check_bf16_problem(a, b, d, c)
    alpha_f = check_alpha(alpha)
    if op_a.mn == 0 or op_b.mn == 0:
        return
    _store(d, out_kind, _decode(op_a) @ _decode(op_b).T, c, alpha_f)


def aclnn_bf16_gemm_nn(a, b, d, c=None, alpha=None):
    aclnn_bf16_gemm_nt(a, transposed(require_array(b, "b")), d, c, alpha)


def aclnn_bf16_gemm_tn(a, b, d, c=None, alpha=None):
    aclnn_bf16_gemm_nt(transposed(require_array(a, "a")), transposed(require_array(b, "b")), d, c, alpha)


def aclnn_bf16_gemm_tt(a, b, d, c=None, alpha=None):
    aclnn_bf16_gemm_nt(transposed(require_array(a, "a")), b, d, c, alpha)


# CUDA DeepGEMM's names for the vendor-library GEMMs
cublaslt_gemm_nt = aclnn_bf16_gemm_nt
cublaslt_gemm_nn = aclnn_bf16_gemm_nn
cublaslt_gemm_tn = aclnn_bf16_gemm_tn
cublaslt_gemm_tt = aclnn_bf16_gemm_tt


# Grouped, batched and einsum references: the same checked plans as the kernels, run per group in float64


def aclnn_m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d, grouped_layout, recipe=None, recipe_a=None, recipe_b=None,
                                               compiled_dims="nk", disable_ue8m0_cast=False, use_psum_layout=True,
                                               ensure_zero_padding=True, expected_m_for_psum_layout=None):
    """Reference for ``m_grouped_fp8_fp4_gemm_nt_contiguous`` (float64 per group)."""
    _grouped.run_m_grouped(_grouped.plan_m_grouped_contiguous(
        a, b, d, grouped_layout, kinds=("fp8", "fp4"), nn=False, recipe=recipe, recipe_a=recipe_a,
        recipe_b=recipe_b, compiled_dims=compiled_dims, disable_ue8m0_cast=disable_ue8m0_cast,
        use_psum_layout=use_psum_layout, ensure_zero_padding=ensure_zero_padding,
        expected_m_for_psum_layout=expected_m_for_psum_layout), reference=True)


def aclnn_m_grouped_fp8_fp4_gemm_nn_contiguous(a, b, d, grouped_layout, recipe=None, recipe_a=None, recipe_b=None,
                                               compiled_dims="nk", disable_ue8m0_cast=False, use_psum_layout=True,
                                               ensure_zero_padding=True, expected_m_for_psum_layout=None):
    """Reference for ``m_grouped_fp8_fp4_gemm_nn_contiguous`` (float64 per group)."""
    _grouped.run_m_grouped(_grouped.plan_m_grouped_contiguous(
        a, b, d, grouped_layout, kinds=("fp8", "fp4"), nn=True, recipe=recipe, recipe_a=recipe_a,
        recipe_b=recipe_b, compiled_dims=compiled_dims, disable_ue8m0_cast=disable_ue8m0_cast,
        use_psum_layout=use_psum_layout, ensure_zero_padding=ensure_zero_padding,
        expected_m_for_psum_layout=expected_m_for_psum_layout), reference=True)


def aclnn_m_grouped_bf16_gemm_nt_contiguous(a, b, d, grouped_layout, compiled_dims="nk", use_psum_layout=True,
                                            ensure_zero_padding=True, expected_m_for_psum_layout=None):
    """Reference for ``m_grouped_bf16_gemm_nt_contiguous`` (float64 per group)."""
    _grouped.run_m_grouped(_grouped.plan_m_grouped_contiguous(
        a, b, d, grouped_layout, kinds=("bf16",), nn=False, compiled_dims=compiled_dims,
        use_psum_layout=use_psum_layout, ensure_zero_padding=ensure_zero_padding,
        expected_m_for_psum_layout=expected_m_for_psum_layout), reference=True)


def aclnn_m_grouped_bf16_gemm_nn_contiguous(a, b, d, grouped_layout, compiled_dims="nk", use_psum_layout=True,
                                            ensure_zero_padding=True, expected_m_for_psum_layout=None):
    """Reference for ``m_grouped_bf16_gemm_nn_contiguous`` (float64 per group)."""
    _grouped.run_m_grouped(_grouped.plan_m_grouped_contiguous(
        a, b, d, grouped_layout, kinds=("bf16",), nn=True, compiled_dims=compiled_dims,
        use_psum_layout=use_psum_layout, ensure_zero_padding=ensure_zero_padding,
        expected_m_for_psum_layout=expected_m_for_psum_layout), reference=True)


def aclnn_m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked_m, expected_m, recipe=None, recipe_a=None, recipe_b=None,
                                           compiled_dims="nk", disable_ue8m0_cast=False):
    """Reference for ``m_grouped_fp8_fp4_gemm_nt_masked`` (float64 per group, rows < masked_m[g] only)."""
    _grouped.run_m_grouped(_grouped.plan_m_grouped_masked(
        a, b, d, masked_m, expected_m, kinds=("fp8", "fp4"), recipe=recipe, recipe_a=recipe_a, recipe_b=recipe_b,
        compiled_dims=compiled_dims, disable_ue8m0_cast=disable_ue8m0_cast), reference=True)


def aclnn_m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m, compiled_dims="nk"):
    """Reference for ``m_grouped_bf16_gemm_nt_masked`` (float64 per group, rows < masked_m[g] only)."""
    _grouped.run_m_grouped(_grouped.plan_m_grouped_masked(
        a, b, d, masked_m, expected_m, kinds=("bf16",), compiled_dims=compiled_dims), reference=True)


def aclnn_k_grouped_fp8_gemm_tn_contiguous(a, b, d, ks_cpu, grouped_layout, c=None, recipe=(1, 1, 32),
                                           compiled_dims="mn", use_psum_layout=True):
    """Reference for ``k_grouped_fp8_gemm_tn_contiguous`` (float64 per group)."""
    _grouped.run_k_grouped(_grouped.plan_k_grouped(
        a, b, d, ks_cpu, grouped_layout, c, kind="fp8", recipe=recipe, compiled_dims=compiled_dims,
        use_psum_layout=use_psum_layout), reference=True)


def aclnn_k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks_cpu, grouped_layout, c=None, compiled_dims="mn",
                                            use_psum_layout=True):
    """Reference for ``k_grouped_bf16_gemm_tn_contiguous`` (float64 per group)."""
    _grouped.run_k_grouped(_grouped.plan_k_grouped(
        a, b, d, ks_cpu, grouped_layout, c, kind="bf16", compiled_dims=compiled_dims,
        use_psum_layout=use_psum_layout), reference=True)


def aclnn_fp8_bmm(a, b, d, c=None, recipe=(1, 1, 32), compiled_dims="nk"):
    """Reference for ``fp8_bmm`` (float64 per batch)."""
    _einsum._run(_einsum.plan_fp8_bmm(a, b, d, c, recipe, compiled_dims), True)


def aclnn_bf16_bmm(a, b, d, c=None, compiled_dims="nk"):
    """Reference for ``bf16_bmm`` (float64 per batch)."""
    _einsum._run(_einsum.plan_bf16_bmm(a, b, d, c, compiled_dims), True)


def aclnn_einsum(expr, a, b, d, c=None, use_cublaslt=False):
    """Reference for ``einsum`` (float64 per h)."""
    _einsum._run(_einsum.plan_einsum(expr, a, b, d, c, use_cublaslt), True)


def aclnn_fp8_einsum(expr, a, b, d, c=None, recipe=(1, 1, 32)):
    """Reference for ``fp8_einsum`` (float64 per h)."""
    _einsum._run(_einsum.plan_fp8_einsum(expr, a, b, d, c, recipe), True)
