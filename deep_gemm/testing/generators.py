"""Test data in DeepGEMM-Ascend's style: random FP8/FP4 codes with per-32-block power-of-two scales, bf16 randn.

Operands are [mn, k] logically, stored K-major (C-contiguous) or MN-major (``x.T.copy().T``).
"""

from __future__ import annotations

import numpy as np

from ..utils.formats import BF16_DTYPE, FP8_DTYPE, pack_fp4
from ..utils.math import ceil_div

# NOTES: DeepGEMM-Ascend's generators draw per-block scales from these sets (FP8: 2^-9..2^-7, FP4: 1/4..1).
FP8_SF_CHOICES = (2.0**-9, 2.0**-8, 2.0**-7)
FP4_SF_CHOICES = (0.25, 0.5, 1.0)
_FP8_NON_NAN_CODES = np.array([c for c in range(256) if c not in (0x7F, 0xFF)], dtype=np.uint8)


def _check(mn: int, k: int, major: str) -> None:
    for name, v in (("mn", mn), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name} must be a non-negative int, got {name}={v!r}")
    if major not in ("k", "mn"):
        raise ValueError(f"major must be 'k' or 'mn', got {major=}")


def _store(x: np.ndarray, major: str) -> np.ndarray:
    return x if major == "k" else x.T.copy().T


def random_fp8_codes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """float8_e4m3fn array of ``shape`` with codes uniform over the 254 non-NaN e4m3 codes (C-contiguous)."""
    return rng.choice(_FP8_NON_NAN_CODES, size=shape).astype(np.uint8).view(FP8_DTYPE)


def random_fp4_codes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """uint8 e2m1 codes in [0, 16) of ``shape`` (unpacked)."""
    return rng.integers(0, 16, size=shape, dtype=np.uint8)


def random_sf(rng: np.random.Generator, mn: int, k: int, choices: tuple[float, ...] = FP8_SF_CHOICES) -> np.ndarray:
    """fp32 [mn, ceil(k/32)]: one power-of-two scale per row per 32-element K-block, drawn from ``choices``."""
    return rng.choice(np.asarray(choices, dtype=np.float32), size=(mn, ceil_div(k, 32)))


def fp8_operand(rng: np.random.Generator, mn: int, k: int, major: str = "k") -> tuple[np.ndarray, np.ndarray]:
    """(float8_e4m3fn [mn, k] in ``major`` storage, fp32 sf [mn, ceil(k/32)] from {2^-9, 2^-8, 2^-7})."""
    _check(mn, k, major)
    return _store(random_fp8_codes(rng, (mn, k)), major), random_sf(rng, mn, k, FP8_SF_CHOICES)


def fp4_operand(rng: np.random.Generator, mn: int, k: int, major: str = "k") -> tuple[np.ndarray, np.ndarray]:
    """(packed FP4 int8, fp32 sf [mn, ceil(k/32)] from {0.25, 0.5, 1}) for a logical [mn, k] operand.

    K-major: int8 [mn, k/2] packed along K (k even). MN-major: int8 [mn/2, k] packed along MN (mn even), stored
    as the C-contiguous [k, mn/2] transposed (DeepGEMM's "logical length doubled along the packed axis").
    """
    _check(mn, k, major)
    packed_len = k if major == "k" else mn
    if packed_len % 2:
        raise ValueError(f"packed FP4 needs an even length along the packed axis: {mn=} {k=} {major=}")
    codes = random_fp4_codes(rng, (mn, k))
    packed = pack_fp4(codes, axis=-1 if major == "k" else 0)
    return _store(packed, major), random_sf(rng, mn, k, FP4_SF_CHOICES)


def bf16_operand(rng: np.random.Generator, mn: int, k: int, major: str = "k") -> np.ndarray:
    """bfloat16 [mn, k] of standard normal values in ``major`` storage."""
    _check(mn, k, major)
    return _store(rng.standard_normal((mn, k), dtype=np.float32).astype(BF16_DTYPE), major)


def grouped_layouts(group_sizes, alignment: int = 256, extra_rows: int = 0) -> tuple[np.ndarray, np.ndarray, int]:
    """Both M-grouped contiguous layouts of groups with ``group_sizes`` rows: (psum int32 [G], per-row int32 [M],
    M). Group g starts at the running total aligned to ``alignment``; the rows between groups (and ``extra_rows``
    at the end) are padding (-1 in the per-row layout)."""
    sizes = [int(s) for s in group_sizes]
    if any(s < 0 for s in sizes) or not sizes:
        raise ValueError(f"group_sizes must be a non-empty list of non-negative ints, got {group_sizes!r}")
    psum, starts, total = [], [], 0
    for s in sizes:
        start = -(-total // alignment) * alignment
        starts.append(start)
        if s:
            total = start + s
        psum.append(total)
    m = total + int(extra_rows)
    per_row = np.full(m, -1, np.int32)
    for g, (start, s) in enumerate(zip(starts, sizes, strict=True)):
        per_row[start:start + s] = g
    return np.array(psum, np.int32), per_row, m
