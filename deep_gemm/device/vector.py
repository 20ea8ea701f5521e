"""The Vector unit of an AIV (PIPE_V): elementwise, tensor-scalar, compare / select and reduction instructions on
Unified Buffer (UB) tensors, named after their Ascend C APIs. Casts live in cast.py, GM <-> UB copies in datacopy.py.

A UB tensor is a 1-D or 2-D numpy array (a ``LocalTensor`` or a view of one). Like Ascend C, every instruction takes
``count``: it touches the first ``count`` elements of ``dst`` in row-major order (all elements: rows * cols) and reads
the sources at the same (row, col). Sources and ``dst`` must have the same shape; a bad shape or count raises
ValueError. Arithmetic is in the dtype of ``dst`` (fp32 for the epilogues), one rounding per instruction, no
fast-math: NaN and Inf propagate as numpy's ufuncs propagate them.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.core.errors import TypingError
from numba.extending import overload

from ..jit import enums
from ..jit.numba_setup import apply_numba_settings
from ._bits import decode_bf16
from .cube import _data_ptr, _ptr_add
from .cube_fma import LANES
from .vector_rows import row_sums_f32

# NOTES: must run before the first @njit below can compile (numba reads it when building its CPU target).
apply_numba_settings()

CMP_LT, CMP_GT, CMP_EQ, CMP_LE, CMP_GE, CMP_NE = (enums.lookup("CMPMODE", n) for n in ("LT", "GT", "EQ", "LE", "GE",
                                                                                          "NE"))
SEL_TENSOR_SCALAR = enums.lookup("SELMODE", "VSEL_TENSOR_SCALAR_MODE")
SEL_TENSOR_TENSOR = enums.lookup("SELMODE", "VSEL_TENSOR_TENSOR_MODE")
REDUCE_AR = enums.lookup("ReducePattern", "AR")
REDUCE_RA = enums.lookup("ReducePattern", "RA")


# ---------------------------------------------------------------------------------------------------------------
# Shared plumbing (numba-only helpers, not template-callable)


def as_rows(x):
    """A 2-D view of a UB tensor: a 1-D tensor becomes one row (numba-only)."""
    raise NotImplementedError("numba-only helper")


@overload(as_rows)
def _as_rows_impl(x):
    if isinstance(x, types.Array) and x.ndim == 2:
        return lambda x: x
    if isinstance(x, types.Array) and x.ndim == 1:
        return lambda x: x[np.newaxis, :]
    return None


def like(arr, value):
    """``value`` converted to the element type of ``arr`` (numba-only): scalars enter an instruction in dst's dtype,
    so an fp32 instruction never computes in fp64."""
    raise NotImplementedError("numba-only helper")


@overload(like)
def _like_impl(arr, value):
    if not isinstance(arr, types.Array):
        return None
    dtype = arr.dtype
    return lambda arr, value: dtype(value)


def operand(src):
    """A tensor as 2-D rows, a scalar as itself (numba-only: Select's tensor and scalar modes)."""
    raise NotImplementedError("numba-only helper")


@overload(operand)
def _operand_impl(src):
    if isinstance(src, types.Array):
        return lambda src: as_rows(src)
    if isinstance(src, (types.Number, types.Boolean)):
        return lambda src: src
    return None


def is_tensor(x):
    """True when ``x`` is an array (a compile-time constant in numba code)."""
    return isinstance(x, np.ndarray)


@overload(is_tensor)
def _is_tensor_impl(x):
    value = isinstance(x, types.Array)
    return lambda x: value


def check_operand_shape(d, b):
    """check_same_shape for a tensor operand, nothing for a scalar (numba-only)."""
    raise NotImplementedError("numba-only helper")


@overload(check_operand_shape)
def _check_operand_shape_impl(d, b):
    if isinstance(b, types.Array):
        return lambda d, b: check_same_shape(d, b)
    return lambda d, b: None


def element(src, i, j):
    """``src[i, j]`` of a 2-D tensor, or ``src`` itself for a scalar (numba-only: Select's tensor/scalar modes)."""
    raise NotImplementedError("numba-only helper")


@overload(element)
def _element_impl(src, i, j):
    if isinstance(src, types.Array):
        return lambda src, i, j: src[i, j]
    if isinstance(src, (types.Number, types.Boolean)):
        return lambda src, i, j: src
    return None


@njit(cache=True, inline="always")
def check_count(d, count):
    """(full rows, columns of the last partial row) that ``count`` elements of the 2-D ``d`` cover."""
    if count < 0 or count > d.shape[0] * d.shape[1]:
        raise ValueError("vector instruction: count exceeds the dst tensor", count, d.shape[0] * d.shape[1])
    cols = d.shape[1]
    if count == d.shape[0] * cols:  # the whole tensor (the usual count): no division
        return d.shape[0], 0
    return count // cols, count % cols


@njit(cache=True, inline="always")
def check_same_shape(d, s):
    if d.shape[0] != s.shape[0] or d.shape[1] != s.shape[1]:
        raise ValueError("vector instruction: source and dst shapes differ", s.shape[0], s.shape[1], d.shape[0],
                         d.shape[1])


@njit(cache=True, inline="always")
def _unit_cols(x):
    """True when a 2-D tensor's columns are adjacent elements (the pointer loops below apply)."""
    return x.shape[1] <= 1 or x.strides[1] == _itemsize(x)


def _itemsize(x):
    """Bytes per element of an array or of a numpy dtype class (np.float32, ...), as a compile-time constant
    (numba-only)."""
    raise NotImplementedError("numba-only helper")


@overload(_itemsize)
def _itemsize_impl(x):
    size = x.dtype.bitwidth // 8
    return lambda x: size


def _same_place(x, y):
    """True when two 2-D tensors of one dtype start at the same address with the same row stride (in place;
    numba-only)."""
    raise NotImplementedError("numba-only helper")


@overload(_same_place)
def _same_place_impl(x, y):
    if x.dtype != y.dtype:
        return lambda x, y: False
    return lambda x, y: x.ctypes.data == y.ctypes.data and x.strides[0] == y.strides[0]


@njit(cache=True, inline="always")
def _row_step(x):
    """Elements from one row of a 2-D tensor to the next (its row stride in elements)."""
    # NOTES: a numba array's itemsize is a run-time field: divide by the dtype's constant size instead (a shift)
    return x.strides[0] // _itemsize(x)


@njit(cache=True, inline="always")
def _apart_or_same(x, y):
    """True when two 2-D tensors with adjacent columns either are the same place (start and row stride) or share no
    byte: then an instruction may read a block of the source before writing the destination and still give the
    element loop's result."""
    if x.strides[0] < 0 or y.strides[0] < 0:
        return False
    xa, ya = x.ctypes.data, y.ctypes.data
    if xa == ya and x.strides[0] == y.strides[0]:
        return True
    x_end = xa + (x.shape[0] - 1) * x.strides[0] + x.shape[1] * _itemsize(x)
    y_end = ya + (y.shape[0] - 1) * y.strides[0] + y.shape[1] * _itemsize(y)
    return x.size == 0 or y.size == 0 or x_end <= ya or y_end <= xa


# NOTES: the loops below address memory through raw pointers when every operand's columns are adjacent (the
# usual UB tile or view): plain 2-D indexing carries numba's negative-index wraparound and the runtime column
# stride, which keep LLVM from vectorising a row; through pointers each row is a plain loop LLVM turns into SIMD
# (with its own run-time overlap checks, so in-place and aliased operands keep their sequential meaning). Per
# element the arithmetic is the same either way: results are bitwise identical.
@njit(cache=True, inline="always")
def _row1(pd, ps, n, fn, value):
    for j in range(n):
        pd[j] = fn(ps[j], value)


@njit(cache=True, inline="always")
def _row2(pd, pa, pb, n, fn):
    for j in range(n):
        pd[j] = fn(pa[j], pb[j])


@njit(cache=True, inline="always")
def _map1(dst, src, count, fn, scalar):
    d = as_rows(dst)
    s = as_rows(src)
    check_same_shape(d, s)
    full, rest = check_count(d, count)
    value = like(d, scalar)
    if _unit_cols(d) and _unit_cols(s):
        pd, ps = _data_ptr(d), _data_ptr(s)
        dr, sr = _row_step(d), _row_step(s)
        if _same_place(d, s):
            # in place: one pointer, so LLVM needs no overlap check (which an exact overlap would fail)
            for i in range(full + 1):
                q = _ptr_add(pd, i * dr)
                _row1(q, q, d.shape[1] if i < full else rest, fn, value)
            return
        for i in range(full + 1):
            _row1(_ptr_add(pd, i * dr), _ptr_add(ps, i * sr), d.shape[1] if i < full else rest, fn, value)
        return
    for i in range(full):
        for j in range(d.shape[1]):
            d[i, j] = fn(s[i, j], value)
    for j in range(rest):
        d[full, j] = fn(s[full, j], value)


@njit(cache=True, inline="always")
def _map2(dst, src0, src1, count, fn):
    d = as_rows(dst)
    a = as_rows(src0)
    b = as_rows(src1)
    check_same_shape(d, a)
    check_same_shape(d, b)
    full, rest = check_count(d, count)
    if _unit_cols(d) and _unit_cols(a) and _unit_cols(b):
        pd, pa, pb = _data_ptr(d), _data_ptr(a), _data_ptr(b)
        dr, ar, br = _row_step(d), _row_step(a), _row_step(b)
        if _same_place(d, a):
            for i in range(full + 1):
                q = _ptr_add(pd, i * dr)
                _row2(q, q, _ptr_add(pb, i * br), d.shape[1] if i < full else rest, fn)
            return
        for i in range(full + 1):
            _row2(_ptr_add(pd, i * dr), _ptr_add(pa, i * ar), _ptr_add(pb, i * br), d.shape[1] if i < full else rest,
                  fn)
        return
    for i in range(full):
        for j in range(d.shape[1]):
            d[i, j] = fn(a[i, j], b[i, j])
    for j in range(rest):
        d[full, j] = fn(a[full, j], b[full, j])


@njit(cache=True, inline="always")
def _add(x, y):
    return x + y


@njit(cache=True, inline="always")
def _sub(x, y):
    return x - y


@njit(cache=True, inline="always")
def _mul(x, y):
    return x * y


@njit(cache=True, inline="always")
def _div(x, y):
    return x / y


@njit(cache=True, inline="always")
def _max(x, y):
    # NOTES: numpy.maximum's NaN rule: a NaN in either operand gives NaN.
    return x if (x > y or x != x) else y


@njit(cache=True, inline="always")
def _min(x, y):
    return x if (x < y or x != x) else y


@njit(cache=True, inline="always")
def _abs(x, unused):
    return abs(x)


@njit(cache=True, inline="always")
def _exp(x, unused):
    return math.exp(x)


@njit(cache=True, inline="always")
def _relu(x, zero):
    return zero if x < zero else x


# ---------------------------------------------------------------------------------------------------------------
# Elementwise: tensor op tensor


@njit(cache=True)
def Add(dst, src0, src1, count):  # noqa: N802
    """Add(dst, src0, src1, count): dst = src0 + src1 on the first ``count`` elements (one rounding)."""
    _map2(dst, src0, src1, count, _add)


@njit(cache=True)
def Sub(dst, src0, src1, count):  # noqa: N802
    """Sub(dst, src0, src1, count): dst = src0 - src1 on the first ``count`` elements."""
    _map2(dst, src0, src1, count, _sub)


@njit(cache=True)
def Mul(dst, src0, src1, count):  # noqa: N802
    """Mul(dst, src0, src1, count): dst = src0 * src1 on the first ``count`` elements."""
    _map2(dst, src0, src1, count, _mul)


@njit(cache=True)
def Div(dst, src0, src1, count):  # noqa: N802
    """Div(dst, src0, src1, count): dst = src0 / src1 (IEEE division, correctly rounded; float tensors)."""
    _map2(dst, src0, src1, count, _div)


@njit(cache=True)
def Max(dst, src0, src1, count):  # noqa: N802
    """Max(dst, src0, src1, count): dst = max(src0, src1) elementwise; NaN in either gives NaN (numpy.maximum)."""
    _map2(dst, src0, src1, count, _max)


@njit(cache=True)
def Min(dst, src0, src1, count):  # noqa: N802
    """Min(dst, src0, src1, count): dst = min(src0, src1) elementwise; NaN in either gives NaN (numpy.minimum)."""
    _map2(dst, src0, src1, count, _min)


# ---------------------------------------------------------------------------------------------------------------
# Tensor op scalar, unary, fill


@njit(cache=True)
def Adds(dst, src, scalar, count):  # noqa: N802
    """Adds(dst, src, scalar, count): dst = src + scalar (the scalar first converted to dst's dtype)."""
    _map1(dst, src, count, _add, scalar)


@njit(cache=True)
def Muls(dst, src, scalar, count):  # noqa: N802
    """Muls(dst, src, scalar, count): dst = src * scalar (the scalar first converted to dst's dtype)."""
    _map1(dst, src, count, _mul, scalar)


def _axpy_source(dst, src):
    """Nothing for a supported (dst, src) dtype pair of Axpy, the same dtype or fp32 dst with bf16 (uint16 bits) src;
    any other pair fails to compile with a TypingError naming both (numba-only)."""
    raise NotImplementedError("numba-only helper")


@overload(_axpy_source)
def _axpy_source_impl(dst, src):
    if src.dtype == dst.dtype or (dst.dtype == types.float32 and src.dtype == types.uint16):
        return lambda dst, src: None
    raise TypingError(f"Axpy: src {src.dtype} into dst {dst.dtype}: src must have dst's dtype, or be bf16 (uint16 "
                      f"bits) into fp32")


def _widened(x):
    """An Axpy source element as an fp32 / dst-dtype value: bf16 bits (uint16) widened exactly, others as they are
    (numba-only)."""
    raise NotImplementedError("numba-only helper")


@overload(_widened)
def _widened_impl(x):
    if x == types.uint16:
        return lambda x: decode_bf16(x)
    return lambda x: x


@njit(cache=True)
def Axpy(dst, src, scalar, count):  # noqa: N802
    """Axpy(dst, src, scalar, count): dst = dst + src * scalar (the scalar first converted to dst's dtype; the
    product is rounded, then the sum: two roundings, no fused multiply-add). The weighted sums of the AIVs (e.g.
    the MQA logits' reduction over heads) accumulate with it in a fixed order.

    Mixed precision (as Ascend C's Axpy with a half src into a float dst): an fp32 dst takes a bf16 src (uint16
    bits), each element widened exactly in the lane, so dst = dst + fp32(src) * scalar gives the bits of a Cast to
    fp32 followed by an fp32 Axpy, without the widened copy."""
    d = as_rows(dst)
    s = as_rows(src)
    _axpy_source(d, s)
    check_same_shape(d, s)
    full, rest = check_count(d, count)
    value = like(d, scalar)
    if _unit_cols(d) and _unit_cols(s):
        pd, ps = _data_ptr(d), _data_ptr(s)
        dr, sr = _row_step(d), _row_step(s)
        for i in range(full + 1):
            n = d.shape[1] if i < full else rest
            qd, qs = _ptr_add(pd, i * dr), _ptr_add(ps, i * sr)
            for j in range(n):
                qd[j] = _add(qd[j], _mul(_widened(qs[j]), value))
        return
    for i in range(full):
        for j in range(d.shape[1]):
            d[i, j] = _add(d[i, j], _mul(_widened(s[i, j]), value))
    for j in range(rest):
        d[full, j] = _add(d[full, j], _mul(_widened(s[full, j]), value))


@njit(cache=True)
def Maxs(dst, src, scalar, count):  # noqa: N802
    """Maxs(dst, src, scalar, count): dst = max(src, scalar); a NaN element stays NaN."""
    _map1(dst, src, count, _max, scalar)


@njit(cache=True)
def Mins(dst, src, scalar, count):  # noqa: N802
    """Mins(dst, src, scalar, count): dst = min(src, scalar); a NaN element stays NaN."""
    _map1(dst, src, count, _min, scalar)


@njit(cache=True)
def Abs(dst, src, count):  # noqa: N802
    """Abs(dst, src, count): dst = |src| (clears the sign bit of floats, NaN included)."""
    _map1(dst, src, count, _abs, 0)


@njit(cache=True)
def Exp(dst, src, count):  # noqa: N802
    """Exp(dst, src, count): dst = e^src in dst's dtype (libm expf for fp32: within 1 ulp of the correctly rounded
    result; not bit-identical to numpy's own SIMD exp). exp(-inf) = 0, exp(NaN) = NaN, overflow gives Inf."""
    _map1(dst, src, count, _exp, 0)


@njit(cache=True)
def Relu(dst, src, count):  # noqa: N802
    """Relu(dst, src, count): dst = src < 0 ? 0 : src (NaN and -0.0 pass through unchanged)."""
    _map1(dst, src, count, _relu, 0)


@njit(cache=True)
def Duplicate(dst, scalar, count):  # noqa: N802
    """Duplicate(dst, scalar, count): the first ``count`` elements of dst = scalar (converted to dst's dtype).

    NOTES: its own row loops rather than _map1's (a fill reads no source: no second operand to check, no aliasing
    cases to tell apart): a cold first call compiles in 0.30 s instead of 0.45."""
    d = as_rows(dst)
    full, rest = check_count(d, count)
    value = like(d, scalar)
    if _unit_cols(d):
        pd, dr = _data_ptr(d), _row_step(d)
        for i in range(full + 1):
            q = _ptr_add(pd, i * dr)
            for j in range(d.shape[1] if i < full else rest):
                q[j] = value
        return
    for i in range(full):
        for j in range(d.shape[1]):
            d[i, j] = value
    for j in range(rest):
        d[full, j] = value


# ---------------------------------------------------------------------------------------------------------------
# Compare + Select


@njit(cache=True, inline="always")
def _compare(x, y, mode):
    if mode == CMP_LT:
        return x < y
    if mode == CMP_GT:
        return x > y
    if mode == CMP_EQ:
        return x == y
    if mode == CMP_LE:
        return x <= y
    if mode == CMP_GE:
        return x >= y
    if mode == CMP_NE:
        return x != y
    raise ValueError("Compare: unknown CMPMODE", mode)


@njit(cache=True)
def Compare(dst_mask, src0, src1, cmp_mode, count):  # noqa: N802
    """Compare(dst_mask, src0, src1, CMPMODE::X, count): bit e of the uint8 ``dst_mask`` (byte e // 8, bit e % 8, e
    the row-major element index) = src0[e] X src1[e] for e < count; the other bits of the touched bytes are cleared.

    CMPMODE: LT, GT, EQ, LE, GE, NE with IEEE rules (any comparison with NaN is false, except NE which is true).
    """
    a = as_rows(src0)
    b = as_rows(src1)
    check_same_shape(a, b)
    full, rest = check_count(a, count)
    if dst_mask.size * 8 < count:
        raise ValueError("Compare: dst_mask holds fewer bits than count", dst_mask.size * 8, count)
    for byte in range((count + 7) // 8):
        dst_mask[byte] = 0
    cols = a.shape[1]
    for e in range(count):
        i = e // cols
        j = e - i * cols
        if _compare(a[i, j], b[i, j], cmp_mode):
            dst_mask[e >> 3] |= np.uint8(1 << (e & 7))


@njit(cache=True)
def Select(dst, sel_mask, src0, src1, sel_mode, count):  # noqa: N802
    """Select(dst, sel_mask, src0, src1, SELMODE::X, count): dst[e] = bit e of sel_mask ? src0[e] : src1[e].

    SELMODE::VSEL_TENSOR_TENSOR_MODE: src1 is a tensor shaped like dst; VSEL_TENSOR_SCALAR_MODE: src1 is a scalar
    (converted to dst's dtype). The mask layout is Compare's.
    """
    d = as_rows(dst)
    a = as_rows(src0)
    check_same_shape(d, a)
    full, rest = check_count(d, count)
    if sel_mask.size * 8 < count:
        raise ValueError("Select: sel_mask holds fewer bits than count", sel_mask.size * 8, count)
    if sel_mode != (SEL_TENSOR_TENSOR if is_tensor(src1) else SEL_TENSOR_SCALAR):
        raise ValueError("Select: SELMODE does not match src1 (a tensor needs VSEL_TENSOR_TENSOR_MODE, a scalar "
                         "VSEL_TENSOR_SCALAR_MODE)", sel_mode)
    b = operand(src1)
    check_operand_shape(d, b)
    cols = d.shape[1]
    for e in range(count):
        i = e // cols
        j = e - i * cols
        if (sel_mask[e >> 3] >> (e & 7)) & 1:
            d[i, j] = a[i, j]
        else:
            d[i, j] = like(d, element(b, i, j))


# ---------------------------------------------------------------------------------------------------------------
# Reductions over a 2-D tensor: per row (ReducePattern::AR, reduce the last axis) or per column (::RA)


@njit(cache=True, inline="always")
def _reduce(dst, src, pattern, is_max):
    if src.ndim != 2 or dst.ndim != 1:
        raise ValueError("Reduce: src must be 2-D and dst 1-D")
    rows, cols = src.shape
    if pattern == REDUCE_AR:
        if dst.shape[0] < rows:
            raise ValueError("Reduce AR: dst needs one element per row", dst.shape[0], rows)
        first = 0 if is_max else _row_sums_by_blocks(dst, src, rows, cols)
        for i in range(first, rows):
            acc = src[i, 0]
            for j in range(1, cols):
                acc = _max(acc, src[i, j]) if is_max else acc + src[i, j]
            dst[i] = acc
    elif pattern == REDUCE_RA:
        if dst.shape[0] < cols:
            raise ValueError("Reduce RA: dst needs one element per column", dst.shape[0], cols)
        for j in range(cols):
            dst[j] = src[0, j]
        for i in range(1, rows):
            for j in range(cols):
                dst[j] = _max(dst[j], src[i, j]) if is_max else dst[j] + src[i, j]
    else:
        raise ValueError("Reduce: unknown ReducePattern", pattern)


def _row_sums_by_blocks(dst, src, rows, cols):
    """ReduceSum AR's first rows (a multiple of LANES) where explicit SIMD applies; returns how many rows it summed,
    0 when none (numba-only)."""
    raise NotImplementedError("numba-only helper")


@overload(_row_sums_by_blocks)
def _row_sums_by_blocks_impl(dst, src, rows, cols):
    if not (src.dtype == dst.dtype == types.float32):
        return lambda dst, src, rows, cols: 0

    def impl(dst, src, rows, cols):
        if cols < LANES or dst.strides[0] != _itemsize(dst) or not _unit_cols(src) \
                or not _apart_or_same(as_rows(dst), src):
            return 0
        # LANES rows at a time, transposed in registers (vector_rows.row_sums_f32), the last columns added per row in
        # order after them: the additions of the element loop, in its order
        pd, ps, ld = _data_ptr(dst), _data_ptr(src), _row_step(src)
        vcols = cols - cols % LANES
        done = rows - rows % LANES
        for i0 in range(0, done, LANES):
            row_sums_f32(_ptr_add(pd, i0), _ptr_add(ps, i0 * ld), ld, cols)
            for i in range(i0, i0 + LANES):
                acc = dst[i]
                for j in range(vcols, cols):
                    acc = acc + src[i, j]
                dst[i] = acc
        return done

    return impl


@njit(cache=True)
def ReduceMax(dst, src, pattern):  # noqa: N802
    """ReduceMax(dst, src, ReducePattern::AR | RA): the maximum of each row (AR: dst[rows]) or of each column (RA:
    dst[cols]) of the 2-D ``src`` (>= 1 row and column). A NaN in a row (column) makes its result NaN."""
    _reduce(dst, src, pattern, True)


@njit(cache=True)
def ReduceSum(dst, src, pattern):  # noqa: N802
    """ReduceSum(dst, src, ReducePattern::AR | RA): the sum of each row (AR) or column (RA) of the 2-D ``src``,
    accumulated in src's dtype in index order (src[.., 0] + src[.., 1] + ...), one rounding per addition."""
    _reduce(dst, src, pattern, False)
