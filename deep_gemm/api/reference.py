"""Reference GEMMs computed with numpy, the cross-check DeepGEMM-Ascend runs against ACLNN (``aclnn_*``) and
CUDA DeepGEMM against cuBLASLt (``cublaslt_*``, aliases of the BF16 ones).

Same arguments, checks and scale-factor handling as the kernels, but the math is a float64 matmul of exactly
decoded operands, so it shares no code path with the JIT kernels below the argument checks.
"""

from __future__ import annotations

import numpy as np

from ..utils.formats import bf16_bits_to_fp32, decode_e2m1, decode_e4m3, fp32_to_bf16_bits, unpack_fp4
from ..utils.layout import unpack_sf_from_required_layout
from . import gemm as _gemm
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
