"""The Cube stand-in: L1 -> L0A/L0B loads (UE8M0 block scales folded in) and Mmad into L0C, as Numba device
functions; a register-tiled fp32 FMA micro-kernel does the work. Not here: GM -> L1 decode (copy.py), FixPipe.

Contract (all ``@njit(cache=True)``, callable from generated kernels; sizes in elements):
- ``l0a_size(mad_m, mad_k)`` / ``l0b_size(mad_n, mad_k)``: elements of one L0A / L0B buffer (either L0 dtype).
- ``load_l0a(l0a, l1a, sf_l1a, row0, k0, mad_m, mad_k, with_sf)``: l1a[row0:row0+mad_m, k0:k0+mad_k] (times
  2^(e-127), e = sf_l1a[row, k // 32], when with_sf) into the contiguous 1-D buffer l0a: fp32, or bf16 bits (the
  values must be exact in bf16) as uint16 (the AMX path below) or int16 (the AVX512-BF16 path: the same layouts,
  another Mmad). ``load_l0b`` the same for B. Fast path: unit K stride
  in L1, mad_k a multiple of 8 (with scales also k0 % 8 == 0); else scalar.
- ``mmad(l0c, l0a, l0b, mad_m, mad_n, mad_k, init)``: l0c[:mad_m, :mad_n] (= if init, else +=) A @ B^T. fp32 L0:
  one fp32 FMA chain per element along K. Any mad_m works at full speed from 4 rows up, so the small-M "stream"
  path uses the same call (mad_m = 16 runs as 6 + 6 + 4-row tiles; each B panel chunk comes from memory once).
  uint16 L0: TDPBF16PS on the host's AMX unit, fp32 accumulation in 32-K steps (see "The AMX path"); int16 L0:
  VDPBF16PS register blocks, fp32 accumulation in K pairs (device/cube_dpbf16.py).
The fp32 L0 layouts are private (only these functions read or write them):
- L0A: rows x K, [mad_m][mad_k] (a scaled copy; the micro-kernel broadcasts A from it).
- L0B: K-major panels of NR rows (16 on AVX2, the Cube fractal's width), [ceil(mad_n / NR)][mad_k][NR], rows past
  mad_n zero. Packing transposes 8 rows x 16 (or 8) K columns in registers.
NOTES: the micro-kernel is LLVM IR emitted by an ``@intrinsic``: MR x NR of L0C in MR * NR / LANES vector
accumulators updated with ``llvm.fma`` (AVX2: 6 x 16 in 12 ymm). Unlike numba's SLP vectorizer on scalar code
(which spilled the 6 x 16 tile), its code does not depend on vectorizer settings or fastmath flags.
The micro-kernel and its LLVM IR helpers live in device/cube_fma.py, the AMX path in device/cube_amx.py, the
AVX512-BF16 path in device/cube_dpbf16.py; this module holds the contract above.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload, register_jitable

from ..jit.numba_setup import apply_numba_settings
from .cube_amx import (
    AMX_CONFIG,
    AMX_K,
    AMX_SUPPORTED,
    AMX_T,
    _amx_block,
    _amx_load_config,
    _copy16_bf16,
    _copy32_bf16,
    _ptr_as_f32,
    _ptr_as_u16,
    _round_up,
    _to_bf16_bits,
    _vnni16x32,
    _vnni16x32_e8,
    _vnni16x32_unscaled,
)
from .cube_dpbf16 import DPBF16_SUPPORTED, _mmad_dpbf16_core

# NOTES: the register tile's constants and the pointer helpers stay importable from here (the other device modules,
# tests, testing/machine.py).
from .cube_fma import (
    KC,
    LANES,  # noqa: F401
    MR,  # noqa: F401
    NR,
    UE8M0_SCALES,
    _copy8_scaled,
    _copy16_scaled,
    _data_ptr,
    _l1_to_f32,
    _microkernel,
    _microkernel_tail,
    _ptr_add,
    _row_tile,
    _transpose8x8_scaled,
    _transpose8x16_scaled,
)

# NOTES: must run before the first @njit below can compile (numba reads it when building its CPU target).
apply_numba_settings()

# ---------------------------------------------------------------------------------------------------------------
# The Cube contract
# NOTES: each public function checks its arguments, turns its arrays into pointers plus strides and calls one
# pointer-based core. The cores have a single signature whatever the layouts of the caller's views, so numba
# compiles (and caches) the heavy code once; each new layout combination only compiles a thin wrapper.
# ---------------------------------------------------------------------------------------------------------------


@njit(cache=True)
def l0a_size(mad_m, mad_k):
    """Elements of one L0A buffer for a mad_m x mad_k tile (Ascend L0A, 64 KiB on the chip): enough for the fp32
    layout and for the bf16 (AMX) layout's 16-row x 32-K padding. Plain arithmetic, so its py_func also sizes a mixed
    kernel's local memory when the kernel is translated (translate/mixed.py local_allocation)."""
    return -(-mad_m // AMX_T) * AMX_T * (-(-mad_k // AMX_K) * AMX_K)


@njit(cache=True)
def l0b_size(mad_n, mad_k):
    """Elements of one L0B buffer for a mad_n x mad_k tile (Ascend L0B, 64 KiB): NR-row panels (fp32) or 16-row
    panels (bf16), K padded to 32 (plain arithmetic, as l0a_size)."""
    return ((mad_n + NR - 1) // NR) * NR * (-(-mad_k // AMX_K) * AMX_K)


# The Cube's unit for an L0 buffer, from its element type (_l0_unit): fp32 FMA, AMX (uint16), AVX512-BF16 (int16).
_UNIT_FMA = 0
_UNIT_AMX = 1
_UNIT_DPBF16 = 2


def _l0_unit(l0):
    """The unit of an L0 buffer's element type: _UNIT_FMA (4-byte elements, read as fp32), _UNIT_AMX (uint16),
    _UNIT_DPBF16 (int16), -1 for any other type (numba-only; a constant of the type)."""
    raise NotImplementedError("numba-only helper")


@overload(_l0_unit)
def _l0_unit_impl(l0):
    unit = -1
    if l0.dtype == types.uint16:
        unit = _UNIT_AMX
    elif l0.dtype == types.int16:
        unit = _UNIT_DPBF16
    elif getattr(l0.dtype, "bitwidth", 0) == 32:
        unit = _UNIT_FMA
    return register_jitable(lambda l0: unit)


@njit(cache=True, inline="always")
def _check_load(l0, l1, sf_l1, row0, k0, rows, mad_k, with_sf, size):
    if row0 < 0 or k0 < 0 or rows < 0 or mad_k < 0:
        raise ValueError("cube load: negative row0, k0 or tile size")
    if row0 + rows > l1.shape[0] or k0 + mad_k > l1.shape[1]:
        raise ValueError("cube load: the tile exceeds the L1 buffer")
    if l0.size < size:
        raise ValueError("cube load: the L0 buffer is smaller than l0a_size / l0b_size")
    unit = _l0_unit(l0)
    if unit < 0:
        raise ValueError("cube load: the L0 buffer must be fp32 or uint16 / int16 (bf16 bits)")
    if l0.strides[0] != l0.itemsize:
        raise ValueError("cube load: the L0 buffer must be contiguous")
    if unit == _UNIT_AMX and not AMX_SUPPORTED:
        raise ValueError("cube load: a bf16 (uint16) L0 buffer needs the AMX path, which this CPU or kernel lacks")
    if unit == _UNIT_DPBF16 and not DPBF16_SUPPORTED:
        raise ValueError("cube load: a bf16 (int16) L0 buffer needs the AVX512-BF16 path, which this CPU or LLVM "
                         "lacks")
    if with_sf and rows > 0 and mad_k > 0:
        if row0 + rows > sf_l1.shape[0] or (k0 + mad_k - 1) // 32 >= sf_l1.shape[1]:
            raise ValueError("cube load: the tile exceeds the L1 scale-factor buffer")


@njit(cache=True)
def _sf_scale(psf, sf_rs, sf_cs, row, k, with_sf):
    """2^(e-127) of L1 row ``row``, K column ``k`` (1 without scales); e at psf[row * sf_rs + (k // 32) * sf_cs]."""
    if with_sf:
        return UE8M0_SCALES[psf[row * sf_rs + (k // 32) * sf_cs]]
    return np.float32(1.0)


@njit(cache=True)
def _load_a_core(pd, ps, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_m, mad_k, with_sf):
    """L0A[i * mad_k + kk] = L1[row0 + i, k0 + kk] * scale, L1 element (r, c) at ps[r * ld + c * cs]."""
    if not with_sf and cs == 1:
        # NOTES: unscaled: 16-wide chunks with no scale test (the loop below tests for a new scale per chunk: 76 ps
        # an element on a 64 x 64 fp32 tile, the HC pre-norm GEMM's L0A), then element by element
        kw = mad_k - mad_k % 16
        for i in range(mad_m):
            src = _ptr_add(ps, (row0 + i) * ld + k0)
            dst = _ptr_add(pd, i * mad_k)
            for kk in range(0, kw, 16):
                _copy16_scaled(_ptr_add(dst, kk), _ptr_add(src, kk), np.float32(1.0))
            for kk in range(kw, mad_k):
                dst[kk] = _l1_to_f32(src[kk]) * np.float32(1.0)
        return
    # NOTES: the 8-wide vector path needs unit K stride and, with scales, no 32-K block straddling 8 columns.
    kv = 0 if cs != 1 or (with_sf and k0 % 8 != 0) else mad_k - mad_k % 8
    # NOTES: 16 lanes at a time where a 16-chunk never straddles a 32-K scale block (k0 % 16 == 0), then 8
    kw = 0 if cs != 1 or k0 % 16 != 0 else mad_k - mad_k % 16
    for i in range(mad_m):
        row = row0 + i
        src = _ptr_add(ps, row * ld + k0 * cs)
        dst = _ptr_add(pd, i * mad_k)
        s = np.float32(1.0)
        for kk in range(0, kw, 16):
            if with_sf and (kk == 0 or (k0 + kk) % 32 == 0):
                s = _sf_scale(psf, sf_rs, sf_cs, row, k0 + kk, with_sf)
            _copy16_scaled(_ptr_add(dst, kk), _ptr_add(src, kk), s)
        for kk in range(kw, kv, 8):
            if with_sf and (kk == 0 or (k0 + kk) % 32 == 0):
                s = _sf_scale(psf, sf_rs, sf_cs, row, k0 + kk, with_sf)
            _copy8_scaled(_ptr_add(dst, kk), _ptr_add(src, kk), s)
        for kk in range(kv, mad_k):
            dst[kk] = _l1_to_f32(src[kk * cs]) * _sf_scale(psf, sf_rs, sf_cs, row, k0 + kk, with_sf)


@njit(cache=True, inline="always")
def _row_scales8(psf, r, sf_rs, sf_cs, k):
    """2^(e-127) of L1 rows r .. r + 7 at K column k (the 32-K block k // 32)."""
    e = _ptr_add(psf, r * sf_rs + (k // 32) * sf_cs)
    return (UE8M0_SCALES[e[0]], UE8M0_SCALES[e[sf_rs]], UE8M0_SCALES[e[2 * sf_rs]], UE8M0_SCALES[e[3 * sf_rs]],
            UE8M0_SCALES[e[4 * sf_rs]], UE8M0_SCALES[e[5 * sf_rs]], UE8M0_SCALES[e[6 * sf_rs]],
            UE8M0_SCALES[e[7 * sf_rs]])


@njit(cache=True)
def _load_b_core(pd, ps, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_n, mad_k, with_sf):
    """L0B panel p, K step kk, lane j = L1[row0 + p * NR + j, k0 + kk] * scale (0 past mad_n); strides as above."""
    kv = 0 if cs != 1 or (with_sf and k0 % 8 != 0) else mad_k - mad_k % 8
    kw = 0 if cs != 1 or k0 % 16 != 0 else mad_k - mad_k % 16
    num_panels = (mad_n + NR - 1) // NR
    for p in range(num_panels):
        panel = _ptr_add(pd, p * mad_k * NR)
        for g in range(0, NR, 8):
            r0 = p * NR + g  # first of these 8 rows, relative to row0
            k_scalar = 0
            if r0 + 8 <= mad_n:
                # 8 full rows: 8 x 8 in-register transposes, scales fetched once per 32-K block
                k_scalar = kv
                src = _ptr_add(ps, (row0 + r0) * ld + k0)
                dst = _ptr_add(panel, g)
                r = row0 + r0
                s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(1.0)
                # 16 K columns per transpose where a 16-chunk never straddles a 32-K scale block, then 8
                for kk in range(0, kw, 16):
                    if with_sf and (kk == 0 or (k0 + kk) % 32 == 0):
                        s0, s1, s2, s3, s4, s5, s6, s7 = _row_scales8(psf, r, sf_rs, sf_cs, k0 + kk)
                    _transpose8x16_scaled(
                        _ptr_add(dst, kk * NR), NR, _ptr_add(src, kk), ld, s0, s1, s2, s3, s4, s5, s6, s7
                    )
                for kk in range(kw, kv, 8):
                    if with_sf and (kk == 0 or (k0 + kk) % 32 == 0):
                        s0, s1, s2, s3, s4, s5, s6, s7 = _row_scales8(psf, r, sf_rs, sf_cs, k0 + kk)
                    _transpose8x8_scaled(
                        _ptr_add(dst, kk * NR), NR, _ptr_add(src, kk), ld, s0, s1, s2, s3, s4, s5, s6, s7
                    )
            if r0 >= mad_n:
                # 8 rows wholly past mad_n: the last panel's zero padding, a plain store loop (vectorised)
                for kk in range(mad_k):
                    zero_row = _ptr_add(panel, kk * NR + g)
                    for rr in range(8):
                        zero_row[rr] = np.float32(0.0)
                continue
            # Scalar rest: the K tail, and a group of rows that straddles mad_n (zeros past it)
            for rr in range(8):
                row = r0 + rr
                for kk in range(k_scalar, mad_k):
                    v = np.float32(0.0)
                    if row < mad_n:
                        k = k0 + kk
                        v = _l1_to_f32(ps[(row0 + row) * ld + k * cs]) * _sf_scale(psf, sf_rs, sf_cs, row0 + row, k,
                                                                                   with_sf)
                    panel[kk * NR + g + rr] = v


@njit(cache=True)
def _load_a_bf16_core(pd, ps, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_m, mad_k, with_sf):
    """bf16 L0A: pd[i * kp + kk] = bf16(L1[row0 + i, k0 + kk] * scale), kp = round_up(mad_k, 32), K pad zero."""
    kp = _round_up(mad_k, AMX_K)
    # NOTES: whole 32-K steps through _copy32_bf16 where each sits in one scale block, then 16 at a time where a
    # 16-chunk does, then element by element
    kw = 0 if cs != 1 or (with_sf and k0 % 32 != 0) else mad_k - mad_k % 32
    kh = kw if cs != 1 or k0 % 16 != 0 else mad_k - mad_k % 16
    for i in range(mad_m):
        row = row0 + i
        src = _ptr_add(ps, row * ld + k0 * cs)
        dst = _ptr_add(pd, i * kp)
        for kk in range(0, kw, 32):
            e = psf[row * sf_rs + ((k0 + kk) // 32) * sf_cs] if with_sf else np.uint8(127)
            _copy32_bf16(_ptr_add(dst, kk), _ptr_add(src, kk), e, UE8M0_SCALES[e])
        for kk in range(kw, kh, 16):
            _copy16_bf16(_ptr_add(dst, kk), _ptr_add(src, kk), _sf_scale(psf, sf_rs, sf_cs, row, k0 + kk, with_sf))
        for kk in range(kh, mad_k):
            dst[kk] = _to_bf16_bits(_l1_to_f32(src[kk * cs]) * _sf_scale(psf, sf_rs, sf_cs, row, k0 + kk, with_sf))
        for kk in range(mad_k, kp):
            dst[kk] = 0


@njit(cache=True)
def _load_b_bf16_core(pd, ps, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_n, mad_k, with_sf):
    """bf16 L0B: panel p, K pair q, lane j, half t at pd[p * kp * 16 + q * 32 + 2 * j + t] = bf16(L1[row0 + p * 16
    + j, k0 + 2 q + t] * scale), 0 past mad_n and past mad_k."""
    kp = _round_up(mad_k, AMX_K)
    # NOTES: whole 32-K steps of 16 rows go through the in-register transpose when each step sits in one scale block
    fast = cs == 1 and (not with_sf or k0 % 32 == 0)
    scales = np.empty(AMX_T, dtype=np.float32)
    psc = _data_ptr(scales)
    num_panels = (mad_n + AMX_T - 1) // AMX_T
    for p in range(num_panels):
        panel = _ptr_add(pd, p * kp * AMX_T)
        r0 = p * AMX_T
        kv = mad_k - mad_k % AMX_K if fast and r0 + AMX_T <= mad_n else 0
        for kk in range(0, kv, AMX_K):
            src = _ptr_add(ps, (row0 + r0) * ld + k0 + kk)
            if with_sf:
                if _vnni16x32_e8(_ptr_add(panel, kk * AMX_T), src, ld,
                                 _ptr_add(psf, (row0 + r0) * sf_rs + ((k0 + kk) // 32) * sf_cs), sf_rs):
                    continue
                for j in range(AMX_T):
                    scales[j] = _sf_scale(psf, sf_rs, sf_cs, row0 + r0 + j, k0 + kk, with_sf)
                _vnni16x32(_ptr_add(panel, kk * AMX_T), src, ld, psc)
            else:
                _vnni16x32_unscaled(_ptr_add(panel, kk * AMX_T), src, ld)
        for j in range(AMX_T):
            row = r0 + j
            for kk in range(kv, kp):
                v = np.uint16(0)
                if row < mad_n and kk < mad_k:
                    k = k0 + kk
                    v = _to_bf16_bits(_l1_to_f32(ps[(row0 + row) * ld + k * cs])
                                      * _sf_scale(psf, sf_rs, sf_cs, row0 + row, k, with_sf))
                panel[(kk // 2) * 2 * AMX_T + 2 * j + kk % 2] = v


@njit(cache=True)
def _mmad_amx_core(pc, ldc, csc, pa, pb, mad_m, mad_n, mad_k, init):
    """The Cube on the AMX unit: C element (i, j) at pc[i * ldc + j * csc]; A, B in the bf16 L0 layouts. Blocks of
    2 x 2 C tiles (32 x 32); a block that is partial (or a strided L0C) goes through a scratch tile so no element
    of L0C outside mad_m x mad_n is read or written."""
    kp = _round_up(mad_k, AMX_K)
    nk = kp // AMX_K
    _amx_load_config(_data_ptr(AMX_CONFIG))
    scratch = np.empty((2 * AMX_T, 2 * AMX_T), dtype=np.float32)
    psc = _data_ptr(scratch)
    for i0 in range(0, mad_m, 2 * AMX_T):
        rows = min(2 * AMX_T, mad_m - i0)
        tm = (rows + AMX_T - 1) // AMX_T
        pa_i = _ptr_add(pa, i0 * kp)
        for j0 in range(0, mad_n, 2 * AMX_T):
            cols = min(2 * AMX_T, mad_n - j0)
            tn = (cols + AMX_T - 1) // AMX_T
            pb_j = _ptr_add(pb, (j0 // AMX_T) * kp * AMX_T)
            if csc == 1 and rows == tm * AMX_T and cols == tn * AMX_T:
                _amx_block(tm, tn, nk, pa_i, kp, pb_j, kp * AMX_T, _ptr_add(pc, i0 * ldc + j0), ldc, init)
                continue
            if not init:
                for i in range(rows):
                    for j in range(cols):
                        scratch[i, j] = pc[(i0 + i) * ldc + (j0 + j) * csc]
            _amx_block(tm, tn, nk, pa_i, kp, pb_j, kp * AMX_T, psc, 2 * AMX_T, init)
            for i in range(rows):
                for j in range(cols):
                    pc[(i0 + i) * ldc + (j0 + j) * csc] = scratch[i, j]


@njit(cache=True, inline="always")
def _sf_args(sf_l1):
    """Pointer and element strides of the uint8 scale buffer."""
    return _data_ptr(sf_l1), sf_l1.strides[0], sf_l1.strides[1]


# NOTES: the L0 element type picks the path when numba types the call (an itemsize test would be a run-time one:
# numba keeps an array's itemsize in the array, so every kernel would compile and carry both paths).
def _load_a_path(l0a, pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_m, mad_k, with_sf):
    """L1 -> L0A on the path of l0a's element type: bf16 bits (the AMX layout, uint16 or int16) or fp32
    (numba-only)."""
    raise NotImplementedError("numba-only helper")


@overload(_load_a_path)
def _load_a_path_impl(l0a, pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_m, mad_k, with_sf):
    if l0a.dtype in (types.uint16, types.int16):
        def bf16(l0a, pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_m, mad_k, with_sf):
            _load_a_bf16_core(_ptr_as_u16(l0a), pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_m, mad_k, with_sf)
        return bf16

    def f32(l0a, pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_m, mad_k, with_sf):
        _load_a_core(_ptr_as_f32(l0a), pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_m, mad_k, with_sf)
    return f32


def _load_b_path(l0b, pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_n, mad_k, with_sf):
    """L1 -> L0B on the path of l0b's element type (numba-only)."""
    raise NotImplementedError("numba-only helper")


@overload(_load_b_path)
def _load_b_path_impl(l0b, pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_n, mad_k, with_sf):
    if l0b.dtype in (types.uint16, types.int16):
        def bf16(l0b, pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_n, mad_k, with_sf):
            _load_b_bf16_core(_ptr_as_u16(l0b), pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_n, mad_k, with_sf)
        return bf16

    def f32(l0b, pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_n, mad_k, with_sf):
        _load_b_core(_ptr_as_f32(l0b), pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_n, mad_k, with_sf)
    return f32


def _mmad_path(l0c, l0a, l0b, mad_m, mad_n, mad_k, init):
    """The Cube on the path of the L0 element type: AMX for uint16 bf16 bits, AVX512-BF16 for int16 bf16 bits, FMA
    for fp32 (numba-only)."""
    raise NotImplementedError("numba-only helper")


@overload(_mmad_path)
def _mmad_path_impl(l0c, l0a, l0b, mad_m, mad_n, mad_k, init):
    if l0a.dtype == types.uint16:
        def amx(l0c, l0a, l0b, mad_m, mad_n, mad_k, init):
            _mmad_amx_core(_data_ptr(l0c), l0c.strides[0] // 4, l0c.strides[1] // 4, _ptr_as_u16(l0a),
                           _ptr_as_u16(l0b), mad_m, mad_n, mad_k, init)
        return amx
    if l0a.dtype == types.int16:
        def dpbf16(l0c, l0a, l0b, mad_m, mad_n, mad_k, init):
            _mmad_dpbf16_core(_data_ptr(l0c), l0c.strides[0] // 4, l0c.strides[1] // 4, _ptr_as_u16(l0a),
                              _ptr_as_u16(l0b), mad_m, mad_n, mad_k, init)
        return dpbf16

    def fma(l0c, l0a, l0b, mad_m, mad_n, mad_k, init):
        _mmad_core(_data_ptr(l0c), l0c.strides[0] // 4, l0c.strides[1] // 4, _ptr_as_f32(l0a), _ptr_as_f32(l0b),
                   mad_m, mad_n, mad_k, init)
    return fma


@njit(cache=True)
def load_l0a(l0a, l1a, sf_l1a, row0, k0, mad_m, mad_k, with_sf):
    """LoadData L1 -> L0A (asc_copy_l12l0a; asc_copy_l12l0a_mx with scales).

    l0a: contiguous 1-D [>= l0a_size(mad_m, mad_k)], fp32 or bf16 bits (uint16: the AMX path, int16: the
    AVX512-BF16 path); l1a: [block_m, block_k] (rows x K; any strides, unit K stride is the fast path) of fp32
    values, or of codes decoded here: uint8 FP8 e4m3fn, uint16 BF16 bits; sf_l1a: uint8 UE8M0 exponents
    [block_m, block_k // 32] (read only when with_sf).
    Packs l1a[row0:row0+mad_m, k0:k0+mad_k] (rows x K), each value times 2^(e-127) of its 32-K block when with_sf
    (exact: a power of two).
    """
    _check_load(l0a, l1a, sf_l1a, row0, k0, mad_m, mad_k, with_sf, l0a_size(mad_m, mad_k))
    psf, sf_rs, sf_cs = _sf_args(sf_l1a)
    ld, cs = l1a.strides[0] // l1a.itemsize, l1a.strides[1] // l1a.itemsize
    _load_a_path(l0a, _data_ptr(l1a), ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_m, mad_k, with_sf)


@njit(cache=True)
def load_l0b(l0b, l1b, sf_l1b, row0, k0, mad_n, mad_k, with_sf):
    """LoadData L1 -> L0B (asc_copy_l12l0b; asc_copy_l12l0b_mx with scales).

    l0b: contiguous 1-D [>= l0b_size(mad_n, mad_k)], fp32 or bf16 bits (as l0a); l1b: [block_n, block_k] (rows x
    K; fp32, uint8 FP8 or uint16 BF16 codes, as load_l0a); sf_l1b: uint8 [block_n, block_k // 32] (read only when
    with_sf). Packs l1b[row0:row0+mad_n, k0:k0+mad_k], times 2^(e-127) per 32-K block when with_sf, into K-major
    panels of NR rows (transposed 8 x 8 blocks at a time; the bf16 layouts: see "The AMX path").
    """
    _check_load(l0b, l1b, sf_l1b, row0, k0, mad_n, mad_k, with_sf, l0b_size(mad_n, mad_k))
    psf, sf_rs, sf_cs = _sf_args(sf_l1b)
    ld, cs = l1b.strides[0] // l1b.itemsize, l1b.strides[1] // l1b.itemsize
    _load_b_path(l0b, _data_ptr(l1b), ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_n, mad_k, with_sf)


@njit(cache=True)
def _mmad_core(pc, ldc, csc, pa, pb, mad_m, mad_n, mad_k, init):
    """The Cube on pointers: C element (i, j) at pc[i * ldc + j * csc]; A, B in the packed L0 layouts."""
    if csc != 1:
        # Column-strided L0C (not a layout the kernels use): plain loops, same K order (multiply, then add).
        for i in range(mad_m):
            for j in range(mad_n):
                b = _ptr_add(pb, (j // NR) * mad_k * NR + j % NR)
                acc = np.float32(0.0) if init else pc[i * ldc + j * csc]
                for kk in range(mad_k):
                    acc += pa[i * mad_k + kk] * b[kk * NR]
                pc[i * ldc + j * csc] = acc
        return
    full_panels = mad_n // NR
    for kc0 in range(0, mad_k, KC):
        kc = min(KC, mad_k - kc0)
        first = init and kc0 == 0
        for p in range(full_panels):
            pbp = _ptr_add(pb, p * mad_k * NR + kc0 * NR)
            i0 = 0
            while i0 < mad_m:
                mr = _row_tile(i0, mad_m)
                _microkernel(mr, kc, _ptr_add(pa, i0 * mad_k + kc0), mad_k, pbp, _ptr_add(pc, i0 * ldc + p * NR),
                             ldc, first)
                i0 += mr
        if mad_n % NR != 0:
            _mmad_partial_panel(pc, ldc, pa, pb, mad_m, mad_n, mad_k, kc0, kc, first)


@njit(cache=True)
def _mmad_partial_panel(pc, ldc, pa, pb, mad_m, mad_n, mad_k, kc0, kc, first):
    """The last, partial B panel (mad_n % NR != 0): C columns past mad_n are neither read nor written (masked).

    NOTES: was a scratch C tile (allocated, copied in and out element by element per row tile): with the HC pre-norm
    GEMM's N = 24 every Mmad took that path. A masked-off lane never faults, but one that lands on unmapped memory
    (an L0C exactly mad_n wide, its last row) is slow: the kernels' L0C tiles are BLOCK_N wide, so theirs never do."""
    p = mad_n // NR
    cols = mad_n - p * NR
    pbp = _ptr_add(pb, p * mad_k * NR + kc0 * NR)
    i0 = 0
    while i0 < mad_m:
        mr = _row_tile(i0, mad_m)
        _microkernel_tail(mr, cols, kc, _ptr_add(pa, i0 * mad_k + kc0), mad_k, pbp, _ptr_add(pc, i0 * ldc + p * NR),
                          ldc, first)
        i0 += mr


@njit(cache=True)
def mmad(l0c, l0a, l0b, mad_m, mad_n, mad_k, init):
    """Mmad (asc_mmad / asc_mmad_mx): the Cube. l0c[:mad_m, :mad_n] = (init) or += A @ B^T, fp32 accumulation.

    l0c: fp32 2-D [>= mad_m, >= mad_n] (any strides; a view is fine); l0a / l0b: contiguous buffers filled by
    load_l0a / load_l0b with the same mad sizes. Any mad_m >= 1 runs at full speed from 4 rows up (small-M / stream
    path included: each B panel chunk is read from memory once and from L1 by every row tile). fp32 L0: each C
    element is one fp32 FMA chain along K; bf16 (uint16) L0: TDPBF16PS over 32-K steps from k = 0 (the AMX path);
    bf16 (int16) L0: VDPBF16PS over K pairs from k = 0 (the AVX512-BF16 path). Either way results do not depend
    on tiling, threads or core count. With init, L0C is written without being read.
    """
    if mad_m < 0 or mad_n < 0 or mad_k < 0:
        raise ValueError("mmad: negative tile size")
    if mad_m > l0c.shape[0] or mad_n > l0c.shape[1]:
        raise ValueError("mmad: L0C is smaller than mad_m x mad_n")
    if l0a.size < l0a_size(mad_m, mad_k) or l0b.size < l0b_size(mad_n, mad_k):
        raise ValueError("mmad: L0A / L0B smaller than l0a_size / l0b_size")
    unit = _l0_unit(l0a)
    if unit < 0 or unit != _l0_unit(l0b):
        raise ValueError("mmad: L0A and L0B must both be fp32, both uint16 or both int16 (bf16 bits)")
    if l0a.strides[0] != l0a.itemsize or l0b.strides[0] != l0b.itemsize:
        raise ValueError("mmad: L0A / L0B must be contiguous")
    if unit == _UNIT_AMX and not AMX_SUPPORTED:
        raise ValueError("mmad: bf16 (uint16) L0 buffers need the AMX path, which this CPU or kernel lacks")
    if unit == _UNIT_DPBF16 and not DPBF16_SUPPORTED:
        raise ValueError("mmad: bf16 (int16) L0 buffers need the AVX512-BF16 path, which this CPU or LLVM lacks")
    if mad_m == 0 or mad_n == 0:
        return
    if mad_k == 0:
        if init:
            l0c[:mad_m, :mad_n] = 0.0
        return
    _mmad_path(l0c, l0a, l0b, mad_m, mad_n, mad_k, bool(init))
