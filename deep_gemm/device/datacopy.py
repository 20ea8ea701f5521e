"""GM <-> UB copies of an AIV (Ascend C ``DataCopy`` / ``DataCopyPad``: MTE2 brings GM into the UB, MTE3 writes the
UB back). No dtype conversion (that is Cast's job); GM is a flat 1-D array, as the kernels receive it.

DataCopy moves ``count`` contiguous elements; DataCopyPad moves ``num_rows`` rows of ``row_len`` elements that sit
``gm_stride`` elements apart in GM (a strided 2-D block) into / out of the rows of a 2-D UB tile, and on the way in
pads each copied row to the tile's width with ``pad_value``. Out-of-range copies raise IndexError (nothing written).
"""

from __future__ import annotations

from numba import njit, types
from numba.extending import overload

from ..jit.numba_setup import apply_numba_settings
from .cube import _data_ptr, _ptr_add
from .vector import _itemsize, _row_step, _unit_cols, like

# NOTES: must run before the first @njit below can compile (numba reads it when building its CPU target).
apply_numba_settings()


@njit(cache=True)
def DataCopy(dst, src, count):  # noqa: N802
    """DataCopy(dst, src, count): dst[i] = src[i] for i < count; GM -> UB or UB -> GM, 1-D tensors of one dtype."""
    if count < 0 or count > dst.size or count > src.size:
        raise IndexError("DataCopy: count exceeds a tensor", count, dst.size, src.size)
    for i in range(count):
        dst[i] = src[i]


def _data_copy_pad(dst, src, gm_offset, gm_stride, num_rows, row_len, pad_value):
    raise NotImplementedError("numba-only helper")


@overload(_data_copy_pad)
def _data_copy_pad_impl(dst, src, gm_offset, gm_stride, num_rows, row_len, pad_value):
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array)) or dst.dtype != src.dtype:
        return None
    if dst.ndim == 2 and src.ndim == 1:
        def gm_to_ub(dst, src, gm_offset, gm_stride, num_rows, row_len, pad_value):
            _check_block(src.size, dst.shape[0], dst.shape[1], gm_offset, gm_stride, num_rows, row_len)
            pad = like(dst, pad_value)
            if _unit_cols(dst) and src.strides[0] == _itemsize(src):
                # adjacent elements on both sides: pointer loops (vectorised; see vector.py)
                pd, ps, dr = _data_ptr(dst), _data_ptr(src), _row_step(dst)
                for r in range(num_rows):
                    d = _ptr_add(pd, r * dr)
                    g = _ptr_add(ps, gm_offset + r * gm_stride)
                    for j in range(row_len):
                        d[j] = g[j]
                    for j in range(row_len, dst.shape[1]):
                        d[j] = pad
                return
            for r in range(num_rows):
                base = gm_offset + r * gm_stride
                for j in range(row_len):
                    dst[r, j] = src[base + j]
                for j in range(row_len, dst.shape[1]):
                    dst[r, j] = pad
        return gm_to_ub
    if dst.ndim == 1 and src.ndim == 2:
        def ub_to_gm(dst, src, gm_offset, gm_stride, num_rows, row_len, pad_value):
            _check_block(dst.size, src.shape[0], src.shape[1], gm_offset, gm_stride, num_rows, row_len)
            if _unit_cols(src) and dst.strides[0] == _itemsize(dst):
                pd, ps, sr = _data_ptr(dst), _data_ptr(src), _row_step(src)
                for r in range(num_rows):
                    g = _ptr_add(pd, gm_offset + r * gm_stride)
                    u = _ptr_add(ps, r * sr)
                    for j in range(row_len):
                        g[j] = u[j]
                return
            for r in range(num_rows):
                base = gm_offset + r * gm_stride
                for j in range(row_len):
                    dst[base + j] = src[r, j]
        return ub_to_gm
    return None


@njit(cache=True, inline="always")
def _check_block(gm_size, ub_rows, ub_cols, gm_offset, gm_stride, num_rows, row_len):
    if num_rows < 0 or row_len < 0 or gm_offset < 0 or gm_stride < 0:
        raise IndexError("DataCopyPad: negative offset, stride, rows or row length", gm_offset, gm_stride, num_rows,
                         row_len)
    if num_rows > ub_rows or row_len > ub_cols:
        raise IndexError("DataCopyPad: the block exceeds the UB tile", num_rows, row_len, ub_rows, ub_cols)
    if num_rows > 0 and row_len > 0 and gm_offset + (num_rows - 1) * gm_stride + row_len > gm_size:
        raise IndexError("DataCopyPad: the block exceeds the GM tensor", gm_offset, gm_stride, num_rows, row_len,
                         gm_size)


@njit(cache=True)
def DataCopyPad(dst, src, gm_offset, gm_stride, num_rows, row_len, pad_value):  # noqa: N802
    """DataCopyPad(dst, src, gm_offset, gm_stride, num_rows, row_len, pad_value): a strided GM block <-> UB rows.

    GM -> UB (dst a 2-D UB tile, src flat GM): dst[r, j] = src[gm_offset + r * gm_stride + j] for r < num_rows,
    j < row_len, and dst[r, row_len:] = pad_value (Ascend C's right padding); rows >= num_rows are not touched.
    UB -> GM (dst flat GM, src a 2-D UB tile): dst[gm_offset + r * gm_stride + j] = src[r, j] for the same r, j; GM
    outside the block is not touched and ``pad_value`` is unused.
    """
    _data_copy_pad(dst, src, gm_offset, gm_stride, num_rows, row_len, pad_value)


@njit(cache=True)
def DataCopyBursts(dst, src, gm_offset, gm_stride, num_rows, row_len, num_bursts, burst_stride,  # noqa: N802
                   dst_row_step, dst_col_step):
    """DataCopyBursts(dst, src, gm_offset, gm_stride, num_rows, row_len, num_bursts, burst_stride, dst_row_step,
    dst_col_step): GM -> UB, one copy of ``num_bursts`` strided GM blocks that lie apart (DataCopyParams' block count
    and source stride; e.g. the pages of a paged cache).

    Burst b is the [num_rows, row_len] block of flat GM ``src`` at gm_offset + b * burst_stride (rows gm_stride
    elements apart; 0 repeats one row), written to the UB tile ``dst`` from (b * dst_row_step, b * dst_col_step):
    dst[b * dst_row_step + r, b * dst_col_step + j] = src[gm_offset + b * burst_stride + r * gm_stride + j].
    ``burst_stride`` may be any integer; the rest of ``dst`` is not touched. Raises IndexError, writing nothing,
    when a burst leaves ``src`` or ``dst``."""
    if dst.ndim != 2 or src.ndim != 1:
        raise IndexError("DataCopyBursts: dst must be a 2-D UB tile and src flat GM")
    if num_rows < 0 or row_len < 0 or num_bursts < 0 or gm_stride < 0 or dst_row_step < 0 or dst_col_step < 0:
        raise IndexError("DataCopyBursts: negative rows, row length, bursts, GM stride or destination steps",
                         num_rows, row_len, num_bursts, gm_stride)
    if num_rows == 0 or row_len == 0:
        return
    for b in range(num_bursts):
        start = gm_offset + b * burst_stride
        if start < 0 or start + (num_rows - 1) * gm_stride + row_len > src.size:
            raise IndexError("DataCopyBursts: a burst leaves the GM tensor (burst, start, GM size)", b, start,
                             src.size)
        if b * dst_row_step + num_rows > dst.shape[0] or b * dst_col_step + row_len > dst.shape[1]:
            raise IndexError("DataCopyBursts: a burst leaves the UB tile (burst, rows, columns)", b, dst.shape[0],
                             dst.shape[1])
    for b in range(num_bursts):
        start = gm_offset + b * burst_stride
        r0, c0 = b * dst_row_step, b * dst_col_step
        for r in range(num_rows):
            g = start + r * gm_stride
            for j in range(row_len):
                dst[r0 + r, c0 + j] = src[g + j]
