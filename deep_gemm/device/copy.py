"""GM -> L1 copies (MTE2, Ascend C ``DataCopy`` with ND -> NZ) that decode FP8 / FP4 / BF16 codes to fp32, and the
scale-factor copy. The stand-in's L1 tile is always "rows x K" fp32, so MN-major operands are transposed here.

GM operands arrive as flat 1-D views of their physical 2-D storage plus the outer (row) stride in elements, like
DeepGEMM-Ascend's ``gm_ptr{outer_stride, addr}``; every element of a row is contiguous (unit last stride).
An L1 of fp32 receives decoded values; an L1 of codes (uint8 FP8, uint16 BF16: what the GEMM kernels use, like the
chip's L1) receives the codes as stored, decoded later by the L1 -> L0 loads (device/cube.py).
NOTES: decode is integer bit manipulation in 32-bit lanes (_bits.emit_decode, no table gather), so LLVM vectorizes
each row's loop. The public functions turn their arrays into pointers and call one pointer-based core each, so the
heavy loops compile (and cache) once per L1 dtype whatever the views' layouts.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from ..jit.numba_setup import apply_numba_settings
from ._bits import bits_to_f32, decode_e2m1, emit_decode, f32_to_bits, widen_to_i32
from .cube import _data_ptr, _ptr_add

# NOTES: must run before the first @njit below can compile (numba reads it when building its CPU target).
apply_numba_settings()


def _e4m3fn_table() -> np.ndarray:
    """fp32 value of every FP8 e4m3fn code (bias 7, no infinities; 0x7F / 0xFF are NaN)."""
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = codes & 0x7
    value = np.where(exp == 0, man / 8.0 * 2.0**-6, (1.0 + man / 8.0) * 2.0 ** (exp - 7.0))
    # NOTES: NaN codes decode to a quiet NaN of the same sign, as the Cube would propagate them. The stand-in's
    # intrinsics compile without the no-NaN fast-math flag, so a NaN input shows up as NaN in its output rows/columns.
    value = np.where((exp == 0xF) & (man == 0x7), np.nan, value)
    return np.copysign(value, sign).astype(np.float32)


def _e2m1_table() -> np.ndarray:
    """fp32 value of every FP4 e2m1 code (bias 1; all 16 codes finite: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives)."""
    codes = np.arange(16)
    sign = np.where(codes & 0x8, -1.0, 1.0)
    exp = (codes >> 1) & 0x3
    man = codes & 0x1
    value = np.where(exp == 0, man * 0.5, (1.0 + man / 2.0) * 2.0 ** (exp - 1.0))
    return (sign * value).astype(np.float32)


# Reference tables (tests and host code); the device code decodes with the bit tricks below, checked against them.
FP8_E4M3_VALUES = _e4m3fn_table()
FP4_E2M1_VALUES = _e2m1_table()


@intrinsic
def _l1_value(typingctx, code, pd):
    """``f(code, pd)``: the value an L1 buffer whose data pointer is ``pd`` stores for GM ``code``: the fp32 decode
    for an fp32 L1 (an 8-bit code is FP8 e4m3, a 16-bit one BF16 bits), the code itself for an L1 of codes (uint8
    FP8 / uint16 BF16, decoded later by the L1 -> L0 loads, as the chip's L1 holds the operand's own dtype)."""
    if not isinstance(code, types.Integer) or not isinstance(pd, types.CPointer) or code.bitwidth not in (8, 16):
        return None
    kind = "e4m3" if code.bitwidth == 8 else "bf16"
    if pd.dtype == types.float32:
        def codegen(context, builder, signature, args):
            return emit_decode(builder, widen_to_i32(builder, args[0]), kind)

        return types.float32(code, pd), codegen
    if isinstance(pd.dtype, types.Integer) and pd.dtype.bitwidth == code.bitwidth:
        def codegen_raw(context, builder, signature, args):
            return args[0]

        return pd.dtype(code, pd), codegen_raw
    return None


@njit(cache=True)
def _zero_fill_core(pd, ld, num_rows, num_cols, rows, cols):
    """Zero K columns >= cols of rows < rows, and every column of rows >= rows (L1 element (r, c) at pd[r*ld+c])."""
    for r in range(num_rows):
        dst = _ptr_add(pd, r * ld)
        c0 = cols if r < rows else 0
        for c in range(c0, num_cols):
            dst[c] = 0


@njit(cache=True)
def _copy_codes_core(pd, ld, ps, stride, is_mn_major, mn0, k0, rows, cols):
    """FP8 (uint8) or BF16 (uint16) codes from GM into an L1 tile of codes or of decoded fp32 (see _l1_value)."""
    if is_mn_major:
        # NOTES: rows of GM run along MN: read 8 MN rows per K step so each L1 row is written 1 cache line at a time.
        for i0 in range(0, rows, 8):
            ib = min(8, rows - i0)
            for j in range(cols):
                src = _ptr_add(ps, (k0 + j) * stride + mn0 + i0)
                for i in range(ib):
                    pd[(i0 + i) * ld + j] = _l1_value(src[i], pd)
    else:
        for i in range(rows):
            src = _ptr_add(ps, (mn0 + i) * stride + k0)
            dst = _ptr_add(pd, i * ld)
            for j in range(cols):
                dst[j] = _l1_value(src[j], pd)


@njit(cache=True)
def _copy_fp4_core(pd, ld, ps, stride, is_mn_major, mn0, k0, rows, cols):
    if is_mn_major:
        for j in range(cols):
            base = (k0 + j) * stride
            for i in range(rows):
                e = mn0 + i
                pd[i * ld + j] = decode_e2m1(ps[base + (e >> 1)] >> ((e & 1) << 2))
    else:
        for i in range(rows):
            base = (mn0 + i) * stride
            dst = _ptr_add(pd, i * ld)
            j = 0
            if k0 & 1 and cols > 0:
                dst[0] = decode_e2m1(ps[base + (k0 >> 1)] >> 4)
                j = 1
            # Whole bytes: two elements each (even element in the low nibble)
            src = _ptr_add(ps, base + ((k0 + j) >> 1))
            pairs = (cols - j) >> 1
            out = _ptr_add(dst, j)
            for t in range(pairs):
                byte = src[t]
                out[2 * t] = decode_e2m1(byte)
                out[2 * t + 1] = decode_e2m1(byte >> 4)
            j += 2 * pairs
            if j < cols:
                dst[j] = decode_e2m1(ps[base + ((k0 + j) >> 1)])


@njit(cache=True, inline="always")
def _l1_args(l1, mn0, k0, mn, k):
    """(pointer, row stride in elements, valid rows, valid K columns) of an L1 tile with unit K stride."""
    if l1.ndim != 2 or (l1.shape[1] > 1 and l1.strides[1] != l1.itemsize):
        raise ValueError("GM -> L1 copy: the L1 tile must be 2-D with unit K stride")
    rows = min(l1.shape[0], max(mn - mn0, 0))
    cols = min(l1.shape[1], max(k - k0, 0))
    return _data_ptr(l1), l1.strides[0] // l1.itemsize, rows, cols


@njit(cache=True)
def copy_gm_to_l1_fp8(l1, gm, stride, is_mn_major, mn0, k0, mn, k):
    """DataCopy GM -> L1 of FP8 e4m3fn codes (asc_copy_gm2l1_nd2nz), decoded to fp32 rows x K.

    l1: [rows, cols] (one L1 stage, unit K stride), fp32 (decoded here) or uint8 (the codes themselves, decoded by
    load_l0a / load_l0b). gm: flat uint8 codes; K-major: code (r, kk) at gm[r * stride + kk]; MN-major: at
    gm[kk * stride + r]. Fills l1[i, j] = value(mn0 + i, k0 + j); rows >= mn and K >= k become 0 (code 0 = +0.0).
    """
    pd, ld, rows, cols = _l1_args(l1, mn0, k0, mn, k)
    _copy_codes_core(pd, ld, _data_ptr(gm), stride, bool(is_mn_major), mn0, k0, rows, cols)
    _zero_fill_core(pd, ld, l1.shape[0], l1.shape[1], rows, cols)


@njit(cache=True)
def copy_gm_to_l1_fp4(l1, gm, stride, is_mn_major, mn0, k0, mn, k):
    """DataCopy GM -> L1 of packed FP4 e2m1 codes (two per byte, even element in the low nibble), decoded to fp32.

    l1: fp32 [rows, cols]. gm: flat uint8 bytes, ``stride`` in bytes; K-major: element (r, kk) in byte
    gm[r * stride + kk // 2]; MN-major: element (r, kk) in byte gm[kk * stride + r // 2]. Zero beyond mn / k.
    """
    pd, ld, rows, cols = _l1_args(l1, mn0, k0, mn, k)
    _copy_fp4_core(pd, ld, _data_ptr(gm), stride, bool(is_mn_major), mn0, k0, rows, cols)
    _zero_fill_core(pd, ld, l1.shape[0], l1.shape[1], rows, cols)


@njit(cache=True)
def copy_gm_to_l1_bf16(l1, gm, stride, is_mn_major, mn0, k0, mn, k):
    """DataCopy GM -> L1 of BF16 bit patterns (uint16), widened exactly to fp32 (bits << 16).

    Layouts as in copy_gm_to_l1_fp8, with gm a flat uint16 array and ``stride`` in elements; l1 fp32 (widened
    here) or uint16 (the bits, widened by load_l0a / load_l0b).
    """
    pd, ld, rows, cols = _l1_args(l1, mn0, k0, mn, k)
    _copy_codes_core(pd, ld, _data_ptr(gm), stride, bool(is_mn_major), mn0, k0, rows, cols)
    _zero_fill_core(pd, ld, l1.shape[0], l1.shape[1], rows, cols)


@njit(cache=True, inline="always")
def round_to_hf32(x):
    """The value the Cube's HF32 mode gives the fp32 ``x``: the 23-bit mantissa rounded to 10 bits (TF32's), round to
    nearest, ties to even (SetHF32TransMode's default, NEAREST_EVEN); a carry may raise the exponent, up to Inf.
    Inf and NaN pass through unchanged."""
    bits = f32_to_bits(x)
    if (bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000):
        return x
    bits = (bits + np.uint32(0xFFF) + ((bits >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
    return bits_to_f32(bits)


@njit(cache=True)
def _copy_hf32_core(pd, ld, ps, stride, is_mn_major, mn0, k0, rows, cols):
    if is_mn_major:
        for j in range(cols):
            src = _ptr_add(ps, (k0 + j) * stride + mn0)
            for i in range(rows):
                pd[i * ld + j] = round_to_hf32(src[i])
    else:
        for i in range(rows):
            src = _ptr_add(ps, (mn0 + i) * stride + k0)
            dst = _ptr_add(pd, i * ld)
            for j in range(cols):
                dst[j] = round_to_hf32(src[j])


@njit(cache=True)
def copy_gm_to_l1_tf32(l1, gm, stride, is_mn_major, mn0, k0, mn, k):
    """DataCopy GM -> L1 of an fp32 operand the Cube reads in HF32 mode (SetHF32Mode(true)): each value rounded to
    TF32's 10-bit mantissa, round to nearest even (round_to_hf32).

    l1: fp32 [rows, cols]; gm: flat float32, layouts as in copy_gm_to_l1_fp8 (``stride`` in elements). Zero beyond
    mn / k. NOTES: the chip rounds as Mmad reads each operand; rounding is per element and idempotent, so rounding
    once on the way into L1 gives the Cube the same values and keeps the MAD loop the BF16 kernels' own.
    """
    pd, ld, rows, cols = _l1_args(l1, mn0, k0, mn, k)
    _copy_hf32_core(pd, ld, _data_ptr(gm), stride, bool(is_mn_major), mn0, k0, rows, cols)
    _zero_fill_core(pd, ld, l1.shape[0], l1.shape[1], rows, cols)


@njit(cache=True)
def copy_gm_to_l1_sf(sf_l1, gm_sf, sf_stride, mn0, k0, mn, k):
    """Scale-factor copy GM -> L1 (copy_gm_to_l1_mx): int16 UE8M0 pairs -> one exponent byte per row per 32-K block.

    sf_l1: uint8 [rows, cols]; column j is the 32-K block k0 // 32 + j (k0 a multiple of 32). gm_sf: flat int16, the
    required layout [ceil(K / 64), MN] with row stride ``sf_stride``: the int16 at (p, r) holds block 2p in its low
    byte and block 2p + 1 in its high byte. Rows >= mn and blocks past ceil(k / 32) become 0.
    """
    rows = min(sf_l1.shape[0], max(mn - mn0, 0))
    # NOTES: the GM scales view as uint8 [ceil(K/64), 2 * MN] (little-endian: byte 2r + h of row p is block 2p + h
    # of row r); pointers keep the loops free of negative-index checks.
    _copy_sf_core(_data_ptr(sf_l1), sf_l1.strides[0], sf_l1.strides[1], sf_l1.shape[0], sf_l1.shape[1],
                  _data_ptr(gm_sf.view(np.uint8)), sf_stride * 2, mn0, k0 // 32, (k + 31) // 32, rows)


@njit(cache=True)
def _copy_sf_core(pd, rs, cs, num_rows, num_cols, ps, gm_row_bytes, mn0, kb0, num_k_blocks, rows):
    for j in range(num_cols):
        kb = kb0 + j
        dst = _ptr_add(pd, j * cs)
        if kb < num_k_blocks:
            src = _ptr_add(ps, (kb >> 1) * gm_row_bytes + 2 * mn0 + (kb & 1))
            for i in range(rows):
                dst[i * rs] = src[2 * i]
        else:
            for i in range(rows):
                dst[i * rs] = 0
        for i in range(rows, num_rows):
            dst[i * rs] = 0


@njit(cache=True, inline="always")
def _check_bursts(gm_size, gm_offset, stride, row_bytes, num_bursts, burst_rows, burst_stride, rows):
    """IndexError unless every GM byte the bursts' first ``rows`` rows read lies in [0, gm_size)."""
    if num_bursts < 0 or burst_rows <= 0 or stride < 0 or rows < 0 or rows > num_bursts * burst_rows:
        raise IndexError("burst copy GM -> L1: bad bursts, burst rows, row stride or rows", num_bursts, burst_rows,
                         stride, rows)
    for b in range(num_bursts):
        n = min(burst_rows, rows - b * burst_rows)
        if n > 0 and row_bytes > 0:
            start = gm_offset + b * burst_stride
            if start < 0 or start + (n - 1) * stride + row_bytes > gm_size:
                raise IndexError("burst copy GM -> L1: a burst leaves the GM tensor (burst, start, GM size)", b,
                                 start, gm_size)


@njit(cache=True)
def copy_gm_to_l1_fp8_bursts(l1, gm, gm_offset, stride, num_bursts, burst_rows, burst_stride, rows, k):
    """DataCopy GM -> L1 of FP8 codes in ``num_bursts`` bursts (DataCopyParams' block count and source stride): one
    copy of several row blocks that lie apart in GM, such as the pages of a paged cache.

    Burst b is ``burst_rows`` K-major rows (``stride`` bytes apart) from gm[gm_offset + b * burst_stride:], landing in
    L1 rows [b * burst_rows, (b + 1) * burst_rows): l1[i, j] = value(gm[gm_offset + (i // burst_rows) * burst_stride
    + (i % burst_rows) * stride + j]) for i < rows, j < k; rows >= rows and K >= k become 0. ``burst_stride`` (the
    bursts' distance in bytes) may be any integer, negative too. l1: fp32 (decoded) or uint8 (the codes). Raises
    IndexError, writing nothing, when a burst leaves ``gm``.
    """
    pd, ld, nrows, cols = _l1_args(l1, 0, 0, rows, k)
    _check_bursts(gm.size, gm_offset, stride, cols, num_bursts, burst_rows, burst_stride, nrows)
    ps = _data_ptr(gm)
    for b in range(num_bursts):
        n = min(burst_rows, nrows - b * burst_rows)
        if n > 0:
            _copy_codes_core(_ptr_add(pd, b * burst_rows * ld), ld, _ptr_add(ps, gm_offset + b * burst_stride),
                             stride, False, 0, 0, n, cols)
    _zero_fill_core(pd, ld, l1.shape[0], l1.shape[1], nrows, cols)


@njit(cache=True)
def copy_gm_to_l1_fp4_bursts(l1, gm, gm_offset, stride, num_bursts, burst_rows, burst_stride, rows, k):
    """copy_gm_to_l1_fp8_bursts for packed FP4 e2m1 codes (two per byte, even element in the low nibble), decoded to
    fp32: l1[i, j] = e2m1 element j of the row at gm[gm_offset + (i // burst_rows) * burst_stride + (i % burst_rows)
    * stride:] for i < rows, j < k (``stride``, ``burst_stride`` in bytes); zero beyond rows / k."""
    pd, ld, nrows, cols = _l1_args(l1, 0, 0, rows, k)
    _check_bursts(gm.size, gm_offset, stride, (cols + 1) // 2, num_bursts, burst_rows, burst_stride, nrows)
    ps = _data_ptr(gm)
    for b in range(num_bursts):
        n = min(burst_rows, nrows - b * burst_rows)
        if n > 0:
            _copy_fp4_core(_ptr_add(pd, b * burst_rows * ld), ld, _ptr_add(ps, gm_offset + b * burst_stride), stride,
                           False, 0, 0, n, cols)
    _zero_fill_core(pd, ld, l1.shape[0], l1.shape[1], nrows, cols)
