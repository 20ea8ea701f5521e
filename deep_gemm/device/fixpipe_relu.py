"""FixPipe L0C -> UB with its ReLU stage on: what the MQA-logits kernels hand the AIVs (lib/mqa.asc.j2). The 950's
FixPipe applies a ReLU to the accumulator on its way out and converts fp32 -> bf16 on the fly (F322BF16), so the
AIVs receive the ReLU'd scores already halved in size; DeepGEMM-Ascend's MQA-logits kernel drains every MAD tile
this way (its copy_l0c_to_ub with the bf16 quant mode and the ReLU flag set).
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from ..jit.numba_setup import apply_numba_settings
from ._bits import round_bf16
from .cube import _data_ptr, _ptr_add
from .vector import _row_step, _unit_cols

# NOTES: must run before the first @njit below can compile (numba reads it when building its CPU target).
apply_numba_settings()


@njit(cache=True, inline="always")
def _relu_bf16_lane(value):
    """bf16 bits (RNE) of relu(value): value < 0 -> +0; NaN -> quiet NaN with its sign; -0.0 stays -0.0."""
    return round_bf16(np.float32(0.0) if value < np.float32(0.0) else value)


def _relu_rows(pu, stride_u, pc, ldc, rows, cols):
    """UB rows (uint16 bf16 bits, or fp32) = relu(L0C rows) (numba-only)."""
    raise NotImplementedError("numba-only helper")


@overload(_relu_rows)
def _relu_rows_impl(pu, stride_u, pc, ldc, rows, cols):
    if not isinstance(pu, types.CPointer) or pu.dtype not in (types.float32, types.uint16):
        return None
    if pu.dtype == types.uint16:
        def rows_bf16(pu, stride_u, pc, ldc, rows, cols):
            for i in range(rows):
                dst = _ptr_add(pu, i * stride_u)
                src = _ptr_add(pc, i * ldc)
                for j in range(cols):
                    dst[j] = _relu_bf16_lane(src[j])
        return rows_bf16

    def rows_f32(pu, stride_u, pc, ldc, rows, cols):
        for i in range(rows):
            dst = _ptr_add(pu, i * stride_u)
            src = _ptr_add(pc, i * ldc)
            for j in range(cols):
                v = src[j]
                dst[j] = np.float32(0.0) if v < np.float32(0.0) else v
    return rows_f32


@njit(cache=True)
def FixpipeToUBRelu(ub, l0c, num_rows, num_cols):  # noqa: N802
    """FixpipeToUB with FixPipe's ReLU: ub[i, j] = relu(l0c[i, j]) for i < num_rows, j < num_cols, rounded to bf16
    (RNE, F322BF16) into a uint16 UB tile or copied into an fp32 one. relu(x) = x < 0 ? +0 : x (NaN and -0.0 pass,
    as the AIVs' Relu). Raises IndexError when the block exceeds either tile; the rest of the UB tile is not
    touched."""
    if num_rows > ub.shape[0] or num_cols > ub.shape[1] or num_rows > l0c.shape[0] or num_cols > l0c.shape[1]:
        raise IndexError("FixpipeToUBRelu: the block exceeds the UB or L0C tile", num_rows, num_cols)
    if num_rows <= 0 or num_cols <= 0:
        return
    if not (_unit_cols(ub) and _unit_cols(l0c)):
        raise ValueError("FixpipeToUBRelu: both tiles need adjacent columns (UB and L0C tiles always have them)")
    _relu_rows(_data_ptr(ub), _row_step(ub), _data_ptr(l0c), _row_step(l0c), num_rows, num_cols)


__all__ = ["FixpipeToUBRelu"]
