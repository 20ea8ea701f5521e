"""GM -> L1 copies (MTE2, Ascend C ``DataCopy`` with ND -> NZ) that decode FP8 / FP4 / BF16 codes to fp32, and the
scale-factor copy. The stand-in's L1 tile is always "rows x K" fp32, so MN-major operands are transposed here.

GM operands arrive as flat 1-D views of their physical 2-D storage plus the outer (row) stride in elements, like
DeepGEMM-Ascend's ``gm_ptr{outer_stride, addr}``; every element of a row is contiguous (unit last stride).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..jit.numba_setup import apply_numba_settings
from ._bits import bits_to_f32

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


FP8_E4M3_VALUES = _e4m3fn_table()
FP4_E2M1_VALUES = _e2m1_table()


@njit(cache=True)
def _valid_extent(l1, mn0, k0, mn, k):
    """Rows and K columns of the L1 tile that hold real data (the rest is zero-filled)."""
    rows = min(l1.shape[0], max(mn - mn0, 0))
    cols = min(l1.shape[1], max(k - k0, 0))
    return rows, cols


@njit(cache=True)
def _zero_fill(l1, rows, cols):
    """Zero K columns >= cols of rows < rows, and every column of rows >= rows."""
    for r in range(rows):
        for c in range(cols, l1.shape[1]):
            l1[r, c] = 0.0
    for r in range(rows, l1.shape[0]):
        for c in range(l1.shape[1]):
            l1[r, c] = 0.0


@njit(cache=True)
def copy_gm_to_l1_fp8(l1, gm, stride, is_mn_major, mn0, k0, mn, k):
    """DataCopy GM -> L1 of FP8 e4m3fn codes (asc_copy_gm2l1_nd2nz), decoded to fp32 rows x K.

    l1: fp32 [rows, cols] (one L1 stage). gm: flat uint8 codes; K-major: code (r, kk) at gm[r * stride + kk];
    MN-major: at gm[kk * stride + r]. Fills l1[i, j] = value(mn0 + i, k0 + j); rows >= mn and K >= k become 0.
    """
    rows, cols = _valid_extent(l1, mn0, k0, mn, k)
    if is_mn_major:
        for j in range(cols):
            base = (k0 + j) * stride + mn0
            for i in range(rows):
                l1[i, j] = FP8_E4M3_VALUES[gm[base + i]]
    else:
        for i in range(rows):
            base = (mn0 + i) * stride + k0
            for j in range(cols):
                l1[i, j] = FP8_E4M3_VALUES[gm[base + j]]
    _zero_fill(l1, rows, cols)


@njit(cache=True)
def copy_gm_to_l1_fp4(l1, gm, stride, is_mn_major, mn0, k0, mn, k):
    """DataCopy GM -> L1 of packed FP4 e2m1 codes (two per byte, even element in the low nibble), decoded to fp32.

    l1: fp32 [rows, cols]. gm: flat uint8 bytes, ``stride`` in bytes; K-major: element (r, kk) in byte
    gm[r * stride + kk // 2]; MN-major: element (r, kk) in byte gm[kk * stride + r // 2]. Zero beyond mn / k.
    """
    rows, cols = _valid_extent(l1, mn0, k0, mn, k)
    if is_mn_major:
        for j in range(cols):
            base = (k0 + j) * stride
            for i in range(rows):
                e = mn0 + i
                l1[i, j] = FP4_E2M1_VALUES[(gm[base + (e >> 1)] >> ((e & 1) << 2)) & 0xF]
    else:
        for i in range(rows):
            base = (mn0 + i) * stride
            for j in range(cols):
                e = k0 + j
                l1[i, j] = FP4_E2M1_VALUES[(gm[base + (e >> 1)] >> ((e & 1) << 2)) & 0xF]
    _zero_fill(l1, rows, cols)


@njit(cache=True)
def copy_gm_to_l1_bf16(l1, gm, stride, is_mn_major, mn0, k0, mn, k):
    """DataCopy GM -> L1 of BF16 bit patterns (uint16), widened exactly to fp32 (bits << 16).

    Layouts as in copy_gm_to_l1_fp8, with gm a flat uint16 array and ``stride`` in elements.
    """
    rows, cols = _valid_extent(l1, mn0, k0, mn, k)
    if is_mn_major:
        for j in range(cols):
            base = (k0 + j) * stride + mn0
            for i in range(rows):
                l1[i, j] = bits_to_f32(np.uint32(gm[base + i]) << 16)
    else:
        for i in range(rows):
            base = (mn0 + i) * stride + k0
            for j in range(cols):
                l1[i, j] = bits_to_f32(np.uint32(gm[base + j]) << 16)
    _zero_fill(l1, rows, cols)


@njit(cache=True)
def copy_gm_to_l1_sf(sf_l1, gm_sf, sf_stride, mn0, k0, mn, k):
    """Scale-factor copy GM -> L1 (copy_gm_to_l1_mx): int16 UE8M0 pairs -> one exponent byte per row per 32-K block.

    sf_l1: uint8 [rows, cols]; column j is the 32-K block k0 // 32 + j (k0 a multiple of 32). gm_sf: flat int16, the
    required layout [ceil(K / 64), MN] with row stride ``sf_stride``: the int16 at (p, r) holds block 2p in its low
    byte and block 2p + 1 in its high byte. Rows >= mn and blocks past ceil(k / 32) become 0.
    """
    rows = min(sf_l1.shape[0], max(mn - mn0, 0))
    num_k_blocks = (k + 31) // 32
    kb0 = k0 // 32
    for j in range(sf_l1.shape[1]):
        kb = kb0 + j
        if kb < num_k_blocks:
            base = (kb >> 1) * sf_stride + mn0
            shift = (kb & 1) << 3
            for i in range(rows):
                sf_l1[i, j] = np.uint8((gm_sf[base + i] >> shift) & 0xFF)
        else:
            for i in range(rows):
                sf_l1[i, j] = 0
        for i in range(rows, sf_l1.shape[0]):
            sf_l1[i, j] = 0
