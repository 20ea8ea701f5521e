"""Numpy reference for the GEMMs: dequantize FP8/FP4 operands exactly, multiply in float64.

D_ref = C + alpha * A @ B^T over dequantized operands (what DeepGEMM's and DeepGEMM-Ascend's tests compare to).
"""

from __future__ import annotations

import numpy as np

from ..utils.formats import E2M1_DECODE_TABLE, E4M3_DECODE_TABLE, is_fp8, unpack_fp4
from ..utils.layout import unpack_sf_from_required_layout
from ..utils.math import ceil_div


def _expand_sf(sf: np.ndarray, mn: int, k: int, gran_mn: int, gran_k: int) -> np.ndarray:
    """Scales [ceil(mn/gran_mn), ceil(k/gran_k)] (fp32) or the int16 required layout -> float64 [mn, k]."""
    sf = np.asarray(sf)
    if sf.dtype == np.int16:
        if (gran_mn, gran_k) != (1, 32):
            raise ValueError(f"int16 (required-layout) sf implies gran_mn=1 gran_k=32, got {gran_mn=} {gran_k=}")
        sf = unpack_sf_from_required_layout(sf, mn, k)
    elif sf.dtype != np.float32:
        raise TypeError(f"sf must be float32 or int16, got {sf.dtype=}")
    for name, g in (("gran_mn", gran_mn), ("gran_k", gran_k)):
        if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or g <= 0:
            raise ValueError(f"{name} must be a positive int, got {g!r}")
    expected = (ceil_div(mn, gran_mn), ceil_div(k, gran_k))
    if sf.shape != expected:
        raise ValueError(f"sf shape {sf.shape} != {expected} for {mn=} {k=} {gran_mn=} {gran_k=}")
    rows = np.arange(mn) // gran_mn
    cols = np.arange(k) // gran_k
    return sf.astype(np.float64)[rows[:, None], cols[None, :]]


def dequantize_fp8(codes: np.ndarray, sf: np.ndarray, gran_mn: int = 1, gran_k: int = 32) -> np.ndarray:
    """FP8 operand [mn, k] (float8_e4m3fn, or its uint8 codes; any strides) and its scales -> float64 [mn, k].

    value[r, c] = e4m3(codes[r, c]) * sf[r // gran_mn, c // gran_k]; sf is fp32 or the int16 required layout.
    """
    codes = np.asarray(codes)
    if is_fp8(codes):
        codes = codes.view(np.uint8)
    if codes.dtype != np.uint8 or codes.ndim != 2:
        raise TypeError(f"dequantize_fp8 needs 2-D float8_e4m3fn or uint8 codes, got {codes.dtype=} {codes.shape=}")
    mn, k = codes.shape
    return E4M3_DECODE_TABLE[codes].astype(np.float64) * _expand_sf(sf, mn, k, gran_mn, gran_k)


def dequantize_fp4(
    packed: np.ndarray, sf: np.ndarray, gran_mn: int = 1, gran_k: int = 32, packed_axis: int = -1
) -> np.ndarray:
    """Packed FP4 operand (int8, two e2m1 codes per byte) and its scales -> float64 [mn, k].

    ``packed_axis=-1``: K-major, packed shape [mn, k/2]; ``packed_axis=0`` (or -2): MN-major, packed shape
    [mn/2, k] (DeepGEMM's logical view of MN-major FP4 storage [k, mn/2]).
    """
    packed = np.asarray(packed)
    if packed.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)) or packed.ndim != 2:
        raise TypeError(f"dequantize_fp4 needs 2-D int8 packed FP4, got {packed.dtype=} {packed.shape=}")
    if packed_axis not in (-1, 1, 0, -2):
        raise ValueError(f"packed_axis must be -1/1 (K-major) or 0/-2 (MN-major), got {packed_axis=}")
    codes = unpack_fp4(packed, axis=packed_axis)
    mn, k = codes.shape
    return E2M1_DECODE_TABLE[codes].astype(np.float64) * _expand_sf(sf, mn, k, gran_mn, gran_k)


def reference_gemm(
    a_f: np.ndarray, b_f: np.ndarray, c: np.ndarray | None = None, alpha: float | None = None
) -> np.ndarray:
    """float64 [m, n] = C + alpha * A @ B^T for A [m, k], B [n, k] (any float dtype incl. bfloat16; alpha None = 1)."""
    a64, b64 = np.asarray(a_f).astype(np.float64), np.asarray(b_f).astype(np.float64)
    if a64.ndim != 2 or b64.ndim != 2 or a64.shape[1] != b64.shape[1]:
        raise ValueError(f"reference_gemm needs A [m, k] and B [n, k], got {a64.shape=} {b64.shape=}")
    out = a64 @ b64.T
    if alpha is not None:
        out *= float(alpha)
    if c is not None:
        c64 = np.asarray(c).astype(np.float64)
        if c64.shape != out.shape:
            raise ValueError(f"reference_gemm: C shape {c64.shape} != {out.shape}")
        out += c64
    return out
