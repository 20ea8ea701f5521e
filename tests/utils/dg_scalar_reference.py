"""Scalar, loop-based references for the format and quantization tests, written independently of deep_gemm.utils.

They use Python floats, ``struct`` and ``math`` (not numpy bit views or ml_dtypes), so a shared mistake is unlikely.
"""

from __future__ import annotations

import math
import struct

import numpy as np


def f32_bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def bits_f32(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b))[0]


def f32(v: float) -> float:
    """Round a Python float to the nearest fp32 value."""
    return bits_f32(f32_bits(v))


def e4m3_value(code: int) -> float:
    """Value of an e4m3fn code by the textbook formula (NaN for S.1111.111)."""
    s = -1.0 if code >> 7 else 1.0
    e, m = (code >> 3) & 15, code & 7
    if e == 15 and m == 7:
        return math.nan
    if e == 0:
        return s * math.ldexp(m, -9)
    return s * math.ldexp(8 + m, e - 10)


# Ascending non-negative finite e4m3 values; index == code for codes 0x00..0x7E.
_E4M3_POS = [e4m3_value(c) for c in range(0x7F)]


def e4m3_encode(v: float) -> int:
    """Round-to-nearest-even to an e4m3fn code; |v| past the 448/480 midpoint (464, exclusive) -> NaN code."""
    if math.isnan(v):
        return 0x7F
    sign = 0x80 if math.copysign(1.0, v) < 0 else 0
    a = abs(v)
    if a > 464.0:
        return sign | 0x7F
    # Binary search the two neighbours among the positive values.
    lo, hi = 0, len(_E4M3_POS) - 1
    if a >= _E4M3_POS[hi]:
        return sign | hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _E4M3_POS[mid] <= a:
            lo = mid
        else:
            hi = mid
    dl, dh = a - _E4M3_POS[lo], _E4M3_POS[hi] - a
    code = lo if dl < dh else hi if dh < dl else (lo if lo % 2 == 0 else hi)
    return sign | code


_E2M1_POS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1_encode(v: float) -> int:
    """Nearest e2m1 magnitude with ties to the smaller one, saturating at 6; sign only on a non-zero code."""
    a = abs(v)
    best = 0
    for i, q in enumerate(_E2M1_POS):
        if abs(a - q) < abs(a - _E2M1_POS[best]):
            best = i
    return best | (8 if (v < 0 and best) else 0)


def e2m1_value(code: int) -> float:
    return (-1.0 if code & 8 else 1.0) * _E2M1_POS[code & 7]


def ceil_pow2_ue8m0(x: float) -> float:
    """Smallest power of two >= |x|, clamped to [2^-126, 2^127] (via math.frexp)."""
    a = abs(x)
    if math.isnan(a) or math.isinf(a):
        return math.ldexp(1.0, 127)
    if a == 0.0:
        return math.ldexp(1.0, -126)
    m, e = math.frexp(a)  # a = m * 2^e, 0.5 <= m < 1
    p = e - 1 if m == 0.5 else e
    return math.ldexp(1.0, min(max(p, -126), 127))


def quantize_blocks(x: np.ndarray, blocks, fmt_max: float, use_ue8m0: bool, encode) -> tuple[dict, dict]:
    """Scalar DeepGEMM quantizer: for each block (a list of (i, j) index tuples) -> scale, then codes per element.

    Arithmetic in fp32 step by step: amax, clamp(1e-4), / fmt_max, optional ceil to UE8M0, 1/sf, x * (1/sf).
    """
    codes, scales = {}, {}
    for key, idxs in blocks.items():
        amax = 0.0
        for idx in idxs:
            amax = max(amax, abs(float(x[idx])))
        sf = f32(max(amax, f32(1e-4)) / fmt_max)
        if use_ue8m0:
            sf = ceil_pow2_ue8m0(sf)
        inv = f32(1.0 / sf)
        scales[key] = sf
        for idx in idxs:
            codes[idx] = encode(f32(float(x[idx]) * inv))
    return codes, scales
