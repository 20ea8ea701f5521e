"""Fixpipe (L0C -> GM): the epilogue that scales the fp32 accumulator by alpha, optionally adds it to D, and
rounds to the output dtype (fp32 -> bf16 round-to-nearest-even, or fp32 as is) while writing only the valid region.
Also InitGlobalMemory, the GM fill that stores like it.

NOTES: compiled without fast-math, so ``d + alpha * acc`` is one fp32 multiply then one fp32 add (never fused),
exactly as a numpy reference computes it, and NaN / Inf pass through.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from ..jit.numba_setup import apply_numba_settings
from ._bits import bits_to_f32, f32_to_bits, round_bf16
from .cube import _data_ptr, _ptr_add
from .vector import _row_step, _unit_cols

# NOTES: must run before the first @njit below can compile (numba reads it when building its CPU target).
apply_numba_settings()


@njit(cache=True)
def f32_to_bf16_bits(x):
    """bf16 bits (uint16) of the float32 ``x``, rounded to nearest even; NaN -> quiet NaN 0x7FC0 with x's sign.

    Bit-exact with ml_dtypes.bfloat16: ties to even, overflow rounds to +-Inf, Inf stays Inf.
    """
    bits = f32_to_bits(x)
    if (bits & 0x7FFFFFFF) > 0x7F800000:
        return np.uint16(((bits >> 16) & 0x8000) | 0x7FC0)
    # NOTES: adding 0x7FFF plus the kept LSB carries into bit 16 exactly when the dropped half is > 0.5 ulp, or
    # == 0.5 ulp with an odd kept LSB: round half to even. int64 arithmetic, so the carry never wraps.
    lsb = (bits >> 16) & 1
    return np.uint16((np.int64(bits) + 0x7FFF + lsb) >> 16)


@njit(cache=True)
def bf16_bits_to_f32(bits):
    """float32 value of bf16 bits (exact)."""
    return bits_to_f32(np.uint32(bits) << 16)


def _store_out(gm_d, index, value, with_accumulation):
    """Store one fp32 result into D (typed per D's dtype by the overload below)."""
    raise NotImplementedError("numba-only helper")


@overload(_store_out)
def _store_out_impl(gm_d, index, value, with_accumulation):
    if not isinstance(gm_d, types.Array):
        return None
    if gm_d.dtype == types.uint16:

        def store_bf16(gm_d, index, value, with_accumulation):
            if with_accumulation:
                value = bf16_bits_to_f32(gm_d[index]) + value
            gm_d[index] = f32_to_bf16_bits(value)

        return store_bf16
    if gm_d.dtype == types.float32:

        def store_f32(gm_d, index, value, with_accumulation):
            if with_accumulation:
                value = gm_d[index] + value
            gm_d[index] = value

        return store_f32
    return None


@njit(cache=True, inline="always")
def _round_bf16_lanes(value):
    """f32_to_bf16_bits without branches (a select for NaN, in 32-bit lanes: _bits.emit_round_bf16), so a row loop
    of it vectorizes at full width; same bits."""
    return round_bf16(np.float32(value))


@njit(cache=True)
def _fixpipe_rows_bf16(pd, stride_d, pc, ldc, rows, cols, scale, with_accumulation):
    """D rows (uint16 bf16 bits at pd[i * stride_d + j]) from L0C rows (fp32 at pc[i * ldc + j])."""
    for i in range(rows):
        dst = _ptr_add(pd, i * stride_d)
        src = _ptr_add(pc, i * ldc)
        if with_accumulation:
            for j in range(cols):
                dst[j] = _round_bf16_lanes(bits_to_f32(np.uint32(dst[j]) << np.uint32(16)) + scale * src[j])
        else:
            for j in range(cols):
                dst[j] = _round_bf16_lanes(scale * src[j])


@njit(cache=True)
def _fixpipe_rows_f32(pd, stride_d, pc, ldc, rows, cols, scale, with_accumulation):
    """D rows (fp32 at pd[i * stride_d + j]) from L0C rows (fp32 at pc[i * ldc + j])."""
    for i in range(rows):
        dst = _ptr_add(pd, i * stride_d)
        src = _ptr_add(pc, i * ldc)
        if with_accumulation:
            for j in range(cols):
                dst[j] = dst[j] + scale * src[j]
        else:
            for j in range(cols):
                dst[j] = scale * src[j]


@njit(cache=True)
def Fixpipe(gm_d, stride_d, l0c, row0, col0, num_rows, num_cols, m, n, alpha, with_accumulation):  # noqa: N802
    """Fixpipe L0C -> GM (asc_copy_l0c2gm with F322BF16 / no quantization, NZ -> ND).

    gm_d: flat D storage, uint16 (bf16 bits) or float32, element (r, c) at gm_d[r * stride_d + c].
    l0c: fp32 [>= num_rows, >= num_cols], the accumulator of the output tile at (row0, col0).
    Writes D[row0 + i, col0 + j] for i < num_rows, j < num_cols inside the m x n output:
    round_out(alpha * acc), or round_out(D + alpha * acc) with_accumulation (one rounding to bf16).
    """
    rows = min(num_rows, m - row0)
    cols = min(num_cols, n - col0)
    scale = np.float32(alpha)
    if rows <= 0 or cols <= 0:
        return
    last = (row0 + rows - 1) * stride_d + col0 + cols  # one past D's last element written
    if l0c.strides[1] != 4 or gm_d.strides[0] != gm_d.itemsize or row0 < 0 or col0 < 0 or last > gm_d.size:
        # Not the layout the kernels pass (a column-strided L0C view, a strided D): element by element, checked
        for i in range(rows):
            base = (row0 + i) * stride_d + col0
            for j in range(cols):
                _store_out(gm_d, base + j, scale * l0c[i, j], with_accumulation)
        return
    # NOTES: pointers (no wraparound selects) and the accumulate test outside the row loops: each row vectorizes
    pd = _ptr_add(_data_ptr(gm_d), row0 * stride_d + col0)
    _fixpipe_rows(pd, stride_d, _data_ptr(l0c), l0c.strides[0] // 4, rows, cols, scale, bool(with_accumulation))


def _fixpipe_rows(pd, stride_d, pc, ldc, rows, cols, scale, with_accumulation):
    """Dispatch on D's storage dtype (numba-only)."""
    raise NotImplementedError("numba-only helper")


@overload(_fixpipe_rows)
def _fixpipe_rows_impl(pd, stride_d, pc, ldc, rows, cols, scale, with_accumulation):
    if not isinstance(pd, types.CPointer):
        return None
    if pd.dtype == types.uint16:
        return lambda pd, stride_d, pc, ldc, rows, cols, scale, with_accumulation: _fixpipe_rows_bf16(
            pd, stride_d, pc, ldc, rows, cols, scale, with_accumulation)
    if pd.dtype == types.float32:
        return lambda pd, stride_d, pc, ldc, rows, cols, scale, with_accumulation: _fixpipe_rows_f32(
            pd, stride_d, pc, ldc, rows, cols, scale, with_accumulation)
    return None


@njit(cache=True)
def InitGlobalMemory(gm, size, value):  # noqa: N802
    """InitGlobalMemory(gm, size, value): the first ``size`` elements of a GM tensor = ``value``, stored as D stores
    it (uint16 storage: the bf16 bits of fp32(value), rounded to nearest even; float32 as is). How a kernel clears an
    output region its tiles never write (the M-grouped padding rows). Raises IndexError when size exceeds the tensor
    (nothing written)."""
    if size < 0 or size > gm.size:
        raise IndexError("InitGlobalMemory: size exceeds the tensor", size, gm.size)
    v = np.float32(value)
    for i in range(size):
        _store_out(gm, i, v, False)


def _ub_rows(pu, stride_u, pc, ldc, rows, cols):
    """UB rows (fp32, or uint16 bf16 bits rounded to nearest even, at pu[i * stride_u + j]) from L0C rows (fp32 at
    pc[i * ldc + j]) (numba-only)."""
    raise NotImplementedError("numba-only helper")


@overload(_ub_rows)
def _ub_rows_impl(pu, stride_u, pc, ldc, rows, cols):
    if not isinstance(pu, types.CPointer) or pu.dtype not in (types.float32, types.uint16):
        return None
    if pu.dtype == types.uint16:
        def rows_bf16(pu, stride_u, pc, ldc, rows, cols):
            _fixpipe_rows_bf16(pu, stride_u, pc, ldc, rows, cols, np.float32(1.0), False)
        return rows_bf16

    def rows_f32(pu, stride_u, pc, ldc, rows, cols):
        for i in range(rows):
            dst = _ptr_add(pu, i * stride_u)
            src = _ptr_add(pc, i * ldc)
            for j in range(cols):
                dst[j] = src[j]
    return rows_f32


def _store_ub(ub, i, j, value):
    """Store one fp32 accumulator into a UB tile of fp32 (as is) or uint16 (bf16 bits, RNE) (numba-only)."""
    raise NotImplementedError("numba-only helper")


@overload(_store_ub)
def _store_ub_impl(ub, i, j, value):
    if not isinstance(ub, types.Array):
        return None
    if ub.dtype == types.uint16:
        def store_bf16(ub, i, j, value):
            ub[i, j] = f32_to_bf16_bits(value)
        return store_bf16
    if ub.dtype == types.float32:
        def store_f32(ub, i, j, value):
            ub[i, j] = value
        return store_f32
    return None


@njit(cache=True)
def FixpipeToUB(ub, l0c, num_rows, num_cols):  # noqa: N802
    """Fixpipe L0C -> UB (Ascend 950's asc_copy_l0c2ub, NZ -> ND): hand an accumulator tile to an AIV.

    ub: 2-D UB tile, fp32 (copied exactly) or uint16 (bf16 bits, F322BF16: round to nearest even).
    l0c: fp32 [>= num_rows, >= num_cols]. Writes ub[i, j] = l0c[i, j] for i < num_rows, j < num_cols; the rest of
    the UB tile is not touched. Raises IndexError when the block exceeds either tile.
    """
    if num_rows > ub.shape[0] or num_cols > ub.shape[1] or num_rows > l0c.shape[0] or num_cols > l0c.shape[1]:
        raise IndexError("FixpipeToUB: the block exceeds the UB or L0C tile", num_rows, num_cols)
    if _unit_cols(ub) and _unit_cols(l0c):
        # adjacent columns on both sides (every hand-off's tiles): a row is one pointer loop (vectorised)
        _ub_rows(_data_ptr(ub), _row_step(ub), _data_ptr(l0c), _row_step(l0c), num_rows, num_cols)
        return
    for i in range(num_rows):
        for j in range(num_cols):
            _store_ub(ub, i, j, l0c[i, j])
