"""Vector-unit casts (Ascend C ``Cast``) with the chip's rounding: fp32 -> bf16 round-to-nearest-even, fp32 -> FP8
e4m3 round-to-nearest-even with saturation, fp32 -> UE8M0 exponent bytes, and the exact widenings back to fp32.

The stand-in holds bf16 as uint16 bits and FP8 / UE8M0 as uint8 codes, so the destination's dtype picks the format
(uint16: bf16, uint8: e4m3); UE8M0 shares uint8 with e4m3 and has its own entry point, CastToUE8M0. Decodes are the
GM -> L1 path's (_bits.py), bf16 rounding is Fixpipe's (fixpipe.py), so every path of the stand-in rounds alike.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.core.errors import TypingError
from numba.extending import overload

from ..jit import enums
from ..jit.numba_setup import apply_numba_settings
from ._bits import bits_to_f32, decode_bf16, decode_e4m3, f32_to_bits
from .cube import _data_ptr, _ptr_add
from .cube_fma import LANES
from .fixpipe import _round_bf16_lanes
from .vector import _relu, _row_step, _unit_cols, as_rows, check_count, check_same_shape
from .vector_rows import row_square_sums_f32

# NOTES: must run before the first @njit below can compile (numba reads it when building its CPU target).
apply_numba_settings()

CAST_NONE, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, CAST_TRUNC = (
    enums.lookup("RoundMode", n) for n in ("CAST_NONE", "CAST_RINT", "CAST_FLOOR", "CAST_CEIL", "CAST_ROUND",
                                           "CAST_TRUNC"))
E4M3_MAX_CODE = 0x7E  # 448.0


@njit(cache=True)
def f32_to_e4m3_sat(x):
    """FP8 e4m3fn code (uint8) of the float32 ``x``: round to nearest even, |x| >= 448 (Inf included) saturates to
    +-448 (code 0x7E / 0xFE), NaN -> 0x7F with x's sign. Equals ml_dtypes' cast of clip(x, -448, 448)."""
    bits = f32_to_bits(np.float32(x))
    sign = np.uint32((bits >> 24) & 0x80)
    mag = bits & np.uint32(0x7FFFFFFF)
    if mag > 0x7F800000:
        return np.uint8(sign | 0x7F)
    if mag >= 0x43E00000:  # 448.0
        return np.uint8(sign | E4M3_MAX_CODE)
    if mag < 0x3C800000:  # below 2^-6, the smallest normal: code = RNE(|x| * 2^9), 0..8 (8 is 2^-6 itself)
        v = np.float32(abs(np.float32(x))) * np.float32(512.0)
        q = np.uint32(v)
        frac = v - np.float32(q)
        if frac > 0.5 or (frac == 0.5 and (q & 1) == 1):
            q += 1
        return np.uint8(sign | q)
    # NOTES: keep 3 of fp32's 23 mantissa bits with round-half-even (add 0x7FFFF + the kept LSB, truncate), then
    # re-bias the exponent from 127 to 7. A carry out of the mantissa bumps the exponent, as it should; < 448 here,
    # so the result never passes 0x7E.
    rounded = (mag + np.uint32(0x7FFFF) + ((mag >> 20) & 1)) >> 20
    return np.uint8(sign | (rounded - np.uint32(120 << 3)))


@njit(cache=True)
def f32_to_ue8m0(x, round_mode):
    """UE8M0 exponent byte of |x| (float32): CAST_CEIL rounds up to a power of two (biased exponent + 1 when any
    mantissa bit is set, clamped to [1, 254]: deep_gemm.utils.ceil_to_ue8m0); CAST_TRUNC / CAST_FLOOR take the
    exponent field as it is (DeepGEMM-Ascend's transform_sf of exact powers of two)."""
    bits = f32_to_bits(np.float32(x)) & np.uint32(0x7FFFFFFF)
    exp = np.int64(bits >> 23)
    if round_mode == CAST_CEIL:
        if bits & 0x7FFFFF:
            exp += 1
        return np.uint8(min(max(exp, 1), 254))
    if round_mode == CAST_TRUNC or round_mode == CAST_FLOOR:
        return np.uint8(exp)
    raise ValueError("CastToUE8M0: round_mode must be CAST_CEIL, CAST_FLOOR or CAST_TRUNC", round_mode)


def _check_cast_mode(src, dst, round_mode):
    """Raise ValueError when Cast's round mode is not one the (src, dst) dtype pair supports (numba-only)."""
    raise NotImplementedError("numba-only helper")


@overload(_check_cast_mode)
def _check_cast_mode_impl(src, dst, round_mode):
    if src.dtype == types.float32 and dst.dtype == types.uint16:
        def to_bf16(src, dst, round_mode):
            if round_mode != CAST_RINT:
                raise ValueError("Cast fp32 -> bf16 supports RoundMode::CAST_RINT only", round_mode)
        return to_bf16
    if src.dtype == types.float32 and dst.dtype == types.uint8:
        def to_e4m3(src, dst, round_mode):
            if round_mode != CAST_RINT:
                raise ValueError("Cast fp32 -> fp8 e4m3 supports RoundMode::CAST_RINT only", round_mode)
        return to_e4m3
    return lambda src, dst, round_mode: None


def _convert(src_value, out):
    """One element of Cast (numba-only; the overload picks the conversion from the value's type and ``out``, the
    destination array or pointer; the round mode is checked once per instruction by _check_cast_mode)."""
    raise NotImplementedError("numba-only helper")


@overload(_convert)
def _convert_impl(src_value, out):
    dst = out.dtype
    if src_value == types.float32 and dst == types.uint16:
        # NOTES: the branchless form of f32_to_bf16_bits (a select for NaN, so a row loop vectorises): same bits
        return lambda src_value, out: _round_bf16_lanes(src_value)
    if src_value == types.float32 and dst == types.uint8:
        return lambda src_value, out: f32_to_e4m3_sat(src_value)
    if src_value == types.uint8 and dst == types.float32:
        return lambda src_value, out: decode_e4m3(src_value)
    if src_value == types.uint16 and dst == types.float32:
        return lambda src_value, out: decode_bf16(src_value)
    if src_value == dst:
        return lambda src_value, out: src_value
    return None


@njit(cache=True, inline="always")
def _cast_row(pd, ps, n):
    for j in range(n):
        pd[j] = _convert(ps[j], pd)


@njit(cache=True)
def Cast(dst, src, round_mode, count):  # noqa: N802
    """Cast(dst, src, RoundMode::X, count) on the first ``count`` elements; the format comes from the dtypes:

    fp32 -> uint16 (bf16 bits), CAST_RINT: round to nearest even (Fixpipe's rounding; NaN -> quiet NaN, overflow ->
    Inf). fp32 -> uint8 (e4m3 codes), CAST_RINT: round to nearest even, saturating at +-448, NaN -> 0x7F | sign.
    uint8 e4m3 codes -> fp32 and uint16 bf16 bits -> fp32: exact (any mode; CAST_NONE by convention).
    Same dtype: a copy. Shapes as for the vector instructions (vector.py).
    """
    d = as_rows(dst)
    s = as_rows(src)
    check_same_shape(d, s)
    full, rest = check_count(d, count)
    _check_cast_mode(s, d, round_mode)
    if _unit_cols(d) and _unit_cols(s):
        # NOTES: pointer rows, as vector.py's loops (every UB tile and view has adjacent columns): the widenings and
        # the bf16 rounding vectorise; 2-D indexing kept them scalar (the MQA AIVs widen H rows of scores per query
        # row). LLVM checks overlap at run time, so aliased operands keep their sequential meaning.
        pd, ps = _data_ptr(d), _data_ptr(s)
        dr, sr = _row_step(d), _row_step(s)
        for i in range(full + 1):
            _cast_row(_ptr_add(pd, i * dr), _ptr_add(ps, i * sr), d.shape[1] if i < full else rest)
        return
    for i in range(full):
        for j in range(d.shape[1]):
            d[i, j] = _convert(s[i, j], d)
    for j in range(rest):
        d[full, j] = _convert(s[full, j], d)


def _widening(dst, src):
    """Nothing when (dst, src) is (fp32, uint16 bf16 bits); any other pair fails to compile with a TypingError
    (numba-only)."""
    raise NotImplementedError("numba-only helper")


@overload(_widening)
def _widening_impl(dst, src):
    if dst.dtype == types.float32 and src.dtype == types.uint16:
        return lambda dst, src: None
    raise TypingError(f"CastReduceSumSquares widens bf16 (uint16 bits) to fp32, got src {src.dtype} -> dst "
                      f"{dst.dtype}")


@njit(cache=True)
def CastReduceSumSquares(dst, src, sums, chunk):  # noqa: N802
    """CastReduceSumSquares(dst, src, sums, chunk): the HC pre-norm AIVs' VF: widen the bf16 tile ``src`` (uint16
    bits, 2-D) into the fp32 tile ``dst`` (exact, as Cast) and, ``chunk`` columns at a time, add each row's sum of
    squares to ``sums`` (1-D fp32, >= one element per row): sums[i] = sums[i] + (dst[i, c0]^2 + dst[i, c0 + 1]^2 +
    ...), each square and addition rounded to fp32, in column order. The bits of Cast, then per chunk Mul into a
    squares tile, ReduceSum AR and Add; in one pass, a block of rows at a time while it is in L1, the squares never
    stored (the chip widens, squares and sums a half tile in one SIMD VF, in registers; Ascend C has no such API)."""
    d = as_rows(dst)
    s = as_rows(src)
    check_same_shape(d, s)
    _widening(d, s)
    rows, cols = d.shape
    if sums.ndim != 1 or sums.shape[0] < rows or chunk < 1:
        raise ValueError("CastReduceSumSquares: sums needs one element per row and chunk >= 1", sums.shape[0], rows,
                         chunk)
    blk = np.empty(LANES, np.float32)
    if _unit_cols(d) and _unit_cols(s) and sums.strides[0] == 4:
        pd, ps, pb = _data_ptr(d), _data_ptr(s), _data_ptr(blk)
        dr, sr = _row_step(d), _row_step(s)
        for i0 in range(0, rows, LANES):
            block = min(LANES, rows - i0)
            for c0 in range(0, cols, chunk):
                n = min(chunk, cols - c0)
                for i in range(i0, i0 + block):
                    _cast_row(_ptr_add(pd, i * dr + c0), _ptr_add(ps, i * sr + c0), n)
                vn = n - n % LANES if block == LANES else 0
                if vn:
                    # LANES rows' first vn columns, transposed in registers: each row's squares in column order
                    row_square_sums_f32(pb, _ptr_add(pd, i0 * dr + c0), dr, n)
                for i in range(i0, i0 + block):
                    acc = blk[i - i0] if vn else d[i, c0] * d[i, c0]
                    for j in range(c0 + (vn if vn else 1), c0 + n):
                        acc = acc + d[i, j] * d[i, j]
                    sums[i] = sums[i] + acc
        return
    for c0 in range(0, cols, chunk):
        n = min(chunk, cols - c0)
        for i in range(rows):
            acc = np.float32(0.0)
            for j in range(c0, c0 + n):
                v = decode_bf16(s[i, j])
                d[i, j] = v
                acc = v * v if j == c0 else acc + v * v
            sums[i] = sums[i] + acc


def _head_sum_operands(dst, src, scale, weights):
    """Nothing for the head sum's operand dtypes (dst, scale, weights fp32; src bf16 as uint16 bits); any other
    fails to compile with a TypingError naming them (numba-only)."""
    raise NotImplementedError("numba-only helper")


@overload(_head_sum_operands)
def _head_sum_operands_impl(dst, src, scale, weights):
    if (dst.dtype, src.dtype, scale.dtype, weights.dtype) == (types.float32, types.uint16, types.float32,
                                                               types.float32):
        return lambda dst, src, scale, weights: None
    raise TypingError(f"CastAxpyRows / CastMulReluAxpyRows: dst {dst.dtype}, src {src.dtype}, scale "
                      f"{scale.dtype}, weights {weights.dtype}: need fp32, bf16 (uint16 bits), fp32, fp32")


@njit(cache=True, inline="always")
def _scaled_relu(v, scale):
    """A widened score times its key's scale (rounded), ReLU'd with Relu's rule (below zero gives +0.0; NaN, -0.0
    pass)."""
    return _relu(v * scale, np.float32(0.0))


@njit(cache=True, inline="always")
def _head_value(q, psc, j, scaled):
    """Score j of the head row at ``q`` as fp32: the bf16 bits widened (exact), with ``scaled`` _scaled_relu'd by
    psc[j] (the scale is read only then)."""
    v = decode_bf16(q[j])
    return _scaled_relu(v, psc[j]) if scaled else v


@njit(cache=True)
def _axpy_rows_core(pd, ps, sr, psc, pw, ws, rows, count, scaled):
    """The head sum on pointers: dst row at pd, bf16 rows at ps (row step sr), scale row at psc, weight h at
    pw[h * ws]; ``scaled`` a run-time flag, so CastAxpyRows and CastMulReluAxpyRows share this one compile (each had
    its own copy of these loops: ~0.5 s of numba's inlining each, cold; the ragged MQA logits, S=32 with 16k keys,
    took 10.45-10.65 ms a call either way).

    NOTES: four heads per pass over the row, the partial sum held in a register between them: the row is read and
    written once per four heads (one per head in an Axpy chain) and each score once, never widened into a tile. The
    additions stay in head order, so the bits are the chain's."""
    w0 = pw[0]
    for j in range(count):
        pd[j] = _head_value(ps, psc, j, scaled) * w0
    h = 1
    while h + 4 <= rows:
        q0, q1 = _ptr_add(ps, h * sr), _ptr_add(ps, (h + 1) * sr)
        q2, q3 = _ptr_add(ps, (h + 2) * sr), _ptr_add(ps, (h + 3) * sr)
        w1, w2, w3, w4 = pw[h * ws], pw[(h + 1) * ws], pw[(h + 2) * ws], pw[(h + 3) * ws]
        for j in range(count):
            acc = pd[j] + _head_value(q0, psc, j, scaled) * w1
            acc = acc + _head_value(q1, psc, j, scaled) * w2
            acc = acc + _head_value(q2, psc, j, scaled) * w3
            pd[j] = acc + _head_value(q3, psc, j, scaled) * w4
        h += 4
    while h < rows:
        q, wh = _ptr_add(ps, h * sr), pw[h * ws]
        for j in range(count):
            pd[j] = pd[j] + _head_value(q, psc, j, scaled) * wh
        h += 1


@njit(cache=True, inline="always")
def _axpy_rows(dst, src, scale, weights, count, scaled):
    d = as_rows(dst)
    s = as_rows(src)
    sc = as_rows(scale)
    w = as_rows(weights)
    _head_sum_operands(d, s, sc, w)
    rows, cols = s.shape
    if d.shape[0] != 1 or d.shape[1] != cols or sc.shape[0] != 1 or sc.shape[1] != cols:
        raise ValueError("head sum: dst and scale must be one row as wide as src", d.shape[0], d.shape[1],
                         sc.shape[0], sc.shape[1], cols)
    if rows < 1 or w.shape[0] != 1 or w.shape[1] < rows:
        raise ValueError("head sum: src needs a row at least and weights one element per src row", rows,
                         w.shape[0], w.shape[1])
    if count < 0 or count > cols:
        raise ValueError("head sum: count exceeds the row", count, cols)
    if _unit_cols(d) and _unit_cols(s) and _unit_cols(sc):
        ws = w.strides[1] // 4 if w.shape[1] > 1 else 1
        # NOTES: `rows > 0 and scaled` (rows >= 1 here) is a run-time bool: a literal would compile the core twice
        _axpy_rows_core(_data_ptr(d), _data_ptr(s), _row_step(s), _data_ptr(sc), _data_ptr(w), ws, rows, count,
                        rows > 0 and scaled)
        return
    for j in range(count):
        acc = np.float32(0.0)
        for h in range(rows):
            v = _scaled_relu(decode_bf16(s[h, j]), sc[0, j]) if scaled else decode_bf16(s[h, j])
            acc = v * w[0, 0] if h == 0 else acc + v * w[0, h]
        d[0, j] = acc


@njit(cache=True)
def CastAxpyRows(dst, src, weights, count):  # noqa: N802
    """CastAxpyRows(dst, src, weights, count): the MQA AIVs' head-reduction VF: the weighted sum of the bf16 rows
    of ``src`` (uint16 bits, [H, n]) into the fp32 row ``dst`` ([1, n] or n) on its first ``count`` columns, in head
    order: dst = fp32(src[0]) * w[0], then dst = dst + fp32(src[h]) * w[h] for h = 1 .. H - 1 (``weights``: fp32,
    one row of >= H). The bits of Cast, Muls and one mixed-precision Axpy per head; in one pass, the partial sums in
    registers (the chip multiply-accumulates a register of scores per head inside one VF; Ascend C's Axpy API would
    issue H instructions)."""
    _axpy_rows(dst, src, dst, weights, count, False)


@njit(cache=True)
def CastMulReluAxpyRows(dst, src, scale, weights, count):  # noqa: N802
    """CastMulReluAxpyRows(dst, src, scale, weights, count): CastAxpyRows with a per-column fp32 scale and a ReLU
    applied to each widened score before it is weighted: v = relu(fp32(src[h]) * scale) (``scale``: one fp32 row
    as wide as src), dst = v_0 * w[0], then dst = dst + v_h * w[h] in head order. The bits of Cast, Mul, Relu,
    Muls and one Axpy per head (CUDA DeepGEMM's fp32 per-key scale form of the MQA logits), in one pass."""
    _axpy_rows(dst, src, scale, weights, count, True)


@njit(cache=True)
def CastToUE8M0(dst, src, round_mode, count):  # noqa: N802
    """Cast(dst, src, ...) to fp8_e8m0_t: the UE8M0 exponent byte (uint8 ``dst``) of each fp32 ``src`` element, see
    f32_to_ue8m0 for the modes (CAST_CEIL: the power of two at or above |x|, as the per-token cast's scales)."""
    d = as_rows(dst)
    s = as_rows(src)
    check_same_shape(d, s)
    full, rest = check_count(d, count)
    for i in range(full):
        for j in range(d.shape[1]):
            d[i, j] = f32_to_ue8m0(s[i, j], round_mode)
    for j in range(rest):
        d[full, j] = f32_to_ue8m0(s[full, j], round_mode)


@njit(cache=True)
def CastFromUE8M0(dst, src, count):  # noqa: N802
    """Cast(dst, src, ...) from fp8_e8m0_t: the fp32 power of two 2^(e - 127) of each UE8M0 exponent byte (uint8
    ``src``), exact (e = 0 gives the fp32 subnormal 2^-127; e = 255 gives NaN, e8m0's NaN)."""
    d = as_rows(dst)
    s = as_rows(src)
    check_same_shape(d, s)
    full, rest = check_count(d, count)
    for i in range(full):
        for j in range(d.shape[1]):
            d[i, j] = _ue8m0_value(s[i, j])
    for j in range(rest):
        d[full, j] = _ue8m0_value(s[full, j])


@njit(cache=True, inline="always")
def _ue8m0_value(e):
    if e == 255:
        return bits_to_f32(np.uint32(0x7FC00000))
    if e == 0:
        return bits_to_f32(np.uint32(0x00400000))
    return bits_to_f32(np.uint32(e) << 23)
