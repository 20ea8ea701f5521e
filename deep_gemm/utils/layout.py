"""Scale factors into the layout the Ascend kernels read: int16 UE8M0 pairs, MN-major, one row per M (or N) index.

An int16 at logical [..., r, p] (physical [..., p, r]) holds the exponent byte of K-block 2p (low byte) and 2p+1
(high byte, 0 when the K-block count is odd) of row r; a K-block is 32 elements and its scale is 2^(byte - 127).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import ml_dtypes
import numpy as np

from .math import align, ceil_div

__all__ = [
    "transform_sf_into_required_layout", "transform_k_grouped_sf_into_required_layout",
    "unpack_sf_from_required_layout", "is_required_sf_layout", "rebalance_sf_exponents",
]

# NOTES: MX recipe: one scale per 32 K elements; two of them share an int16 (64 K elements per column).
_SF_BLOCK_K = 32
_SF_PAIR_K = 64
# NOTES: grouped layouts align each group's start to 256 rows (M-grouped) or 256 K elements (K-grouped).
_GROUP_ALIGNMENT = 256
_MAX_GRAN_MN = 128


def _ue8m0_table() -> np.ndarray:
    table = np.empty(256, dtype=np.float32)
    table[:255] = np.ldexp(1.0, np.arange(255) - 127)  # byte 0 -> 2^-127 (an fp32 subnormal), exact
    table[255] = np.nan  # E8M0 0xFF is NaN
    table.flags.writeable = False
    return table


_UE8M0_TABLE = _ue8m0_table()


# ------------------------------------------------------------------------------------------------------------------
# Argument checks


def _check_int(name: str, value: object, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {name}={value}")
    return int(value)


def _parse_recipe(recipe: object, is_sfa: bool | None) -> tuple[int, int]:
    """(gran_mn, gran_k) from a 3-tuple recipe (gran_m of A, gran_n of B, gran_k) or a per-operand 2-tuple."""
    if not isinstance(recipe, (tuple, list)) or len(recipe) not in (2, 3):
        raise TypeError(
            f"recipe must be a 3-tuple (gran_m, gran_n, gran_k) or a 2-tuple (gran_mn, gran_k), got {recipe!r}"
        )
    for g in recipe:
        if isinstance(g, bool) or not isinstance(g, (int, np.integer)):
            raise TypeError(f"recipe entries must be ints, got {recipe=}")
    if is_sfa is not None and not isinstance(is_sfa, (bool, np.bool_)):
        raise TypeError(f"is_sfa must be a bool or None, got {is_sfa!r}")
    if len(recipe) == 2:
        gran_mn, gran_k = int(recipe[0]), int(recipe[1])
    else:
        if is_sfa is None and recipe[0] != recipe[1]:
            raise ValueError(f"is_sfa must be given to pick the MN granularity of {recipe=}")
        gran_mn, gran_k = int(recipe[0] if (is_sfa is None or is_sfa) else recipe[1]), int(recipe[2])
    if not (1 <= gran_mn <= _MAX_GRAN_MN and gran_mn & (gran_mn - 1) == 0):
        raise ValueError(f"gran_mn must be a power of two in [1, {_MAX_GRAN_MN}], got {gran_mn=} ({recipe=} {is_sfa=})")
    if gran_k not in (32, 128):
        raise ValueError(f"gran_k must be 32 (MX) or 128 (fp32 scales of the CUDA recipes), got {gran_k=} ({recipe=})")
    return gran_mn, gran_k


_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)


def _ue8m0_codes_as_fp32(codes: np.ndarray) -> np.ndarray:
    """UE8M0 exponent bytes as the fp32 powers of two they encode (byte e -> 2^(e - 127), exact for e >= 1)."""
    return (codes.astype(np.uint32) << 23).view(np.float32)


def _unpack_int32_ue8m0(sf: np.ndarray, k: int, gran_k: int) -> np.ndarray:
    """CUDA DeepGEMM's int32-packed UE8M0 scales [..., MN, ceil(K / (4 gran_k))] (4 exponent bytes per element, the
    first in the low byte; any strides, e.g. its MN-major TMA-aligned layout) as fp32 [..., MN, ceil(K / gran_k)]."""
    need = ceil_div(k, gran_k * 4)
    if sf.shape[-1] != need:
        raise ValueError(f"int32 packed UE8M0 sf shape {sf.shape}: the last dim must be ceil(k / (4 * gran_k)) = "
                         f"{need} ({k=} {gran_k=})")
    return _ue8m0_codes_as_fp32(np.ascontiguousarray(sf).view(np.uint8)[..., :ceil_div(k, gran_k)])


def _check_sf(
    sf: object, mn: int, k: int, gran_mn: int, gran_k: int, num_groups: int | None, disable_ue8m0_cast: bool
) -> np.ndarray:
    if not isinstance(sf, np.ndarray):
        raise TypeError(f"sf must be a numpy array, got {type(sf).__name__}")
    if sf.dtype == _E8M0:  # torch's and OCP's MX scale type: one exponent byte per scale
        sf = _ue8m0_codes_as_fp32(sf.view(np.uint8))
    elif sf.dtype == np.int32:
        sf = _unpack_int32_ue8m0(sf, k, gran_k)
    if sf.dtype not in (np.dtype(np.float32), np.dtype(np.int16)):
        raise TypeError(f"sf must be float32, float8_e8m0fnu, int32 (4 packed UE8M0 bytes, CUDA DeepGEMM's form) or "
                        f"int16 (packed UE8M0 pairs), got {sf.dtype=}")
    if num_groups is None:
        if sf.ndim != 2:
            raise ValueError(f"sf must be 2-D (3-D needs num_groups), got {sf.shape=}")
    else:
        num_groups = _check_int("num_groups", num_groups, minimum=1)
        if sf.ndim != 3 or sf.shape[0] != num_groups:
            raise ValueError(f"sf must be 3-D with {num_groups=} groups, got {sf.shape=}")
    is_fp32 = sf.dtype == np.float32
    if is_fp32 and disable_ue8m0_cast:
        raise ValueError("fp32 sf must be converted into UE8M0 on Ascend: disable_ue8m0_cast=True is not supported")
    if not is_fp32 and gran_k != _SF_BLOCK_K:
        raise ValueError(f"int16 sf (packed UE8M0 pairs) requires gran_k=32, got {gran_k=}")
    expected = (ceil_div(mn, gran_mn), ceil_div(k, gran_k) if is_fp32 else ceil_div(k, _SF_PAIR_K))
    if sf.shape[-2:] != expected:
        raise ValueError(
            f"sf shape {sf.shape} does not match {mn=} {k=} {gran_mn=} {gran_k=} {sf.dtype=}: "
            f"the last two dims must be {expected}"
        )
    return sf


def _check_psum(psum_layout: object, limit: int, limit_name: str) -> np.ndarray:
    psum = np.asarray(psum_layout)
    if psum.ndim != 1 or psum.size == 0:
        raise ValueError(f"psum_layout must be a non-empty 1-D array of group ends, got shape {psum.shape}")
    if psum.dtype.kind not in "iu":
        raise TypeError(f"psum_layout must hold integers, got {psum.dtype=}")
    psum = psum.astype(np.int64)
    prev_end = 0
    for g, end in enumerate(psum.tolist()):
        start = align(prev_end, _GROUP_ALIGNMENT)
        # NOTES: an empty group repeats the previous total (its start, align(prev_end), may lie past it).
        if end < start and end != prev_end:
            raise ValueError(
                f"psum_layout[{g}]={end} is below its group's start {start} (= align(psum_layout[{g - 1}], 256)); "
                f"psum_layout={psum.tolist()}"
                if g
                else f"psum_layout[0]={end} must be >= 0"
            )
        prev_end = end
    if psum[-1] > limit:
        raise ValueError(f"psum_layout[-1]={psum[-1]} exceeds {limit_name}={limit}")
    return psum


def _pad_ranges(psum: np.ndarray, unit: int, limit: int, tail: bool = False) -> list[tuple[int, int]]:
    """Each group's padding [psum[g], align(psum[g], 256)) in units of ``unit`` elements, clipped to ``limit``; with
    ``tail`` the last group's range runs on to ``limit`` (everything past the last group belongs to no group).

    NOTES: upstream leaves the rows past the last group uninitialised on purpose (a gap, like the padding)."""
    ranges = []
    ends = psum.tolist()
    for g, end in enumerate(ends):
        hi = limit if tail and g == len(ends) - 1 else min(align(end, _GROUP_ALIGNMENT) // unit, limit)
        lo = ceil_div(end, unit)
        if lo < hi:
            ranges.append((lo, hi))
    return ranges


def is_required_sf_layout(sf: object, mn: int, k: int, num_groups: int | None = None) -> bool:
    """True if ``sf`` is already the kernels' layout: int16 [(G,) mn, ceil(k/64)] with strides (1, mn) elements."""
    if not isinstance(sf, np.ndarray) or sf.dtype != np.int16:
        return False
    lead = () if num_groups is None else (num_groups,)
    if sf.shape != lead + (mn, ceil_div(k, _SF_PAIR_K)):
        return False
    # NOTES: numpy's contiguity flags ignore the strides of length-1 dims, as the kernel's address math does.
    return bool(np.swapaxes(sf, -1, -2).flags.c_contiguous)


# ------------------------------------------------------------------------------------------------------------------
# Conversion


def _first_bad_fp32(sf: np.ndarray, bits: np.ndarray, ignore_rows: list, ignore_cols: list) -> None:
    """Raise ValueError naming the first scale of ``sf`` (``bits``: its uint32 view) that is not an exact non-negative
    power of two, outside the ignored rows and columns."""
    # NOTES: sign and mantissa bits must be 0 (what the kernel's transform asserts); exponent 0xFF (Inf) would be
    # the E8M0 NaN byte. +0.0 passes: it encodes byte 0, i.e. 2^-127, exactly as on the chip. The common case in
    # two reductions, no temporary: the OR of every word has no sign or mantissa bit, and the largest word is below
    # the first exponent-0xFF one. (With the exponent bytes shifted straight into uint8 below, B's 7168 x 64 scales of
    # the 128x7168x2048 FP8 GEMM take 207-217 us right after a launch, 236-276 us as a shift, a mask and two maxima.)
    if not bits.size or (not int(np.bitwise_or.reduce(bits, axis=None)) & 0x807FFFFF
                         and int(bits.max()) < 0x7F800000):
        return
    bad = ((bits & np.uint32(0x807FFFFF)) != 0) | ((bits >> np.uint32(23)) == 0xFF)
    for lo, hi in ignore_rows:
        bad[..., lo:hi, :] = False
    for lo, hi in ignore_cols:
        bad[..., lo:hi] = False
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        value = sf[idx]
        raise ValueError(
            f"fp32 sf must hold exact non-negative powers of two (sign and mantissa bits 0, no Inf/NaN): "
            f"sf[{', '.join(map(str, idx))}]={float(value)!r} (bits 0x{int(bits[idx]):08x})"
        )


def _to_required(
    sf: np.ndarray, mn: int, k: int, gran_mn: int, gran_k: int,
    pad_rows: list[tuple[int, int]], pad_k_blocks: list[tuple[int, int]], pad_k_cols: list[tuple[int, int]],
) -> np.ndarray:
    num_blocks, num_pairs = ceil_div(k, _SF_BLOCK_K), ceil_div(k, _SF_PAIR_K)
    lead = sf.shape[:-2]
    rows_in = sf.shape[-2]

    # Exponent bytes per (input row, 32-block), zero past the last block; C-contiguous (viewed as pairs below)
    if sf.dtype == np.float32:
        bits = sf.view(np.uint32)
        _first_bad_fp32(sf, bits, pad_rows, pad_k_cols)
        exp = np.empty(bits.shape, np.uint8)  # the exponent bytes (the sign is 0), without a uint32 temporary
        np.right_shift(bits, np.uint32(23), out=exp, casting="unsafe")
        if gran_k != _SF_BLOCK_K:
            exp = np.repeat(exp, gran_k // _SF_BLOCK_K, axis=-1)
        if exp.shape[-1] == num_blocks == 2 * num_pairs:
            exps = exp  # a new array already: the padding below may zero parts of it
        else:
            exps = np.zeros(lead + (rows_in, 2 * num_pairs), dtype=np.uint8)
            exps[..., :num_blocks] = exp[..., :num_blocks]
    else:
        exps = np.zeros(lead + (rows_in, 2 * num_pairs), dtype=np.uint8)
        bits = sf.view(np.uint16)
        exps[..., 0::2] = bits & 0xFF
        exps[..., 1::2] = bits >> 8
        exps[..., num_blocks:] = 0  # the high byte of an odd tail carries no block

    # Grouped padding is forced to 0 (its garbage was not validated)
    for lo, hi in pad_rows:
        exps[..., lo:hi, :] = 0
    for lo, hi in pad_k_blocks:
        exps[..., lo:hi] = 0

    # Pairs: even block in the low byte, odd block in the high byte (a row's bytes read as little-endian uint16)
    pairs = exps.view("<u2").astype(np.uint16, copy=False)
    if gran_mn > 1:
        pairs = np.repeat(pairs, gran_mn, axis=-2)[..., :mn, :]

    # NOTES: built as C-contiguous [..., pairs, MN] and returned transposed: logical [..., MN, pairs], strides (1, MN)
    physical = np.ascontiguousarray(np.swapaxes(pairs, -1, -2)).view(np.int16)
    return np.swapaxes(physical, -1, -2)


def transform_sf_into_required_layout(
    sf: np.ndarray,
    mn: int,
    k: int,
    recipe: tuple[int, int, int] | tuple[int, int],
    num_groups: int | None = None,
    is_sfa: bool | None = None,
    disable_ue8m0_cast: bool = False,
    psum_layout: np.ndarray | Sequence[int] | None = None,
) -> np.ndarray:
    """Scale factors -> the Ascend kernels' layout: int16 [(G,) mn, ceil(k/64)], strides (1, mn) (MN-major).

    sf: fp32 [(G,) ceil(mn/gran_mn), ceil(k/gran_k)] of exact powers of two (gran_k 32, or 128 for the CUDA
    recipes (1, 128, 128) / (1, 1, 128): each 128-scale then covers four 32-blocks), or int16 packed pairs
    [(G,) ceil(mn/gran_mn), ceil(k/64)] (gran_k 32). ``recipe`` = (gran_m of A, gran_n of B, gran_k) with
    ``is_sfa`` choosing the MN granularity (or a 2-tuple (gran_mn, gran_k)); gran_mn > 1 is expanded by repetition.
    ``psum_layout`` (M-grouped, int [G] cumulative row ends, group starts aligned to 256): rows of no group (each
    group's padding, and every row past the last group's end) are zeroed and not validated. An int16 input already
    in the required layout (gran_mn 1) is returned as is; otherwise the result is a new array and ``sf`` is never
    modified.
    """
    # Argument checks
    mn, k = _check_int("mn", mn), _check_int("k", k)
    gran_mn, gran_k = _parse_recipe(recipe, is_sfa)
    if not isinstance(disable_ue8m0_cast, (bool, np.bool_)):
        raise TypeError(f"disable_ue8m0_cast must be a bool, got {type(disable_ue8m0_cast).__name__}: "
                        f"{disable_ue8m0_cast!r}")
    sf = _check_sf(sf, mn, k, gran_mn, gran_k, num_groups, disable_ue8m0_cast)
    pad_rows: list[tuple[int, int]] = []
    if psum_layout is not None:
        if num_groups is not None:
            raise ValueError(f"psum_layout applies to the M-grouped (2-D) sfa; got it with {num_groups=}")
        psum = _check_psum(psum_layout, mn, "mn")
        pad_rows = _pad_ranges(psum, gran_mn, sf.shape[-2], tail=True)

    # Fast path: nothing to convert
    if gran_mn == 1 and is_required_sf_layout(sf, mn, k, num_groups):
        if all(not sf[..., lo:hi, :].any() for lo, hi in pad_rows):
            return sf

    return _to_required(sf, mn, k, gran_mn, gran_k, pad_rows, [], [])


def transform_k_grouped_sf_into_required_layout(
    sf: np.ndarray,
    mn: int,
    k: int,
    recipe: tuple[int, int, int] | tuple[int, int],
    is_sfa: bool | None,
    psum_layout: np.ndarray | Sequence[int],
) -> np.ndarray:
    """K-grouped scale factors -> int16 [mn, ceil(k/64)], strides (1, mn), like ``transform_sf_into_required_layout``.

    k is the total (padded) K; ``psum_layout`` is int [G], the cumulative K end of each group, group starts aligned
    to 256. Each group's padding K-blocks [ceil(psum[g]/32), align(psum[g], 256)/32) are zeroed and not validated;
    blocks past the last group's padding are kept as given and not validated either (no group reads them).
    """
    # Argument checks
    mn, k = _check_int("mn", mn), _check_int("k", k)
    gran_mn, gran_k = _parse_recipe(recipe, is_sfa)
    sf = _check_sf(sf, mn, k, gran_mn, gran_k, None, False)
    if psum_layout is None:
        raise ValueError("K-grouped scale factors need psum_layout (the cumulative K end of each group)")
    psum = _check_psum(psum_layout, k, "k")
    pad_k_blocks = _pad_ranges(psum, _SF_BLOCK_K, ceil_div(k, _SF_BLOCK_K))
    # NOTES: fp32 columns wholly inside a padding range, or past the last group (no launch reads them; they are
    # kept as given), are skipped by validation; int16 bytes are never validated.
    pad_k_cols = _pad_ranges(psum, gran_k, sf.shape[-1], tail=True) if sf.dtype == np.float32 else []
    return _to_required(sf, mn, k, gran_mn, gran_k, [], pad_k_blocks, pad_k_cols)


def unpack_sf_from_required_layout(sf: np.ndarray, mn: int, k: int) -> np.ndarray:
    """int16 [..., mn, ceil(k/64)] (any strides) -> fp32 [..., mn, ceil(k/32)]: the scale 2^(byte-127) of each 32-block.

    Byte 0 gives 2^-127, byte 0xFF gives NaN. For tests and debugging.
    """
    mn, k = _check_int("mn", mn), _check_int("k", k)
    if not isinstance(sf, np.ndarray) or sf.dtype != np.int16:
        raise TypeError(f"sf must be an int16 numpy array, got {getattr(sf, 'dtype', type(sf).__name__)}")
    num_blocks, num_pairs = ceil_div(k, _SF_BLOCK_K), ceil_div(k, _SF_PAIR_K)
    if sf.ndim < 2 or sf.shape[-2:] != (mn, num_pairs):
        raise ValueError(f"sf shape {sf.shape} does not end in ({mn}, {num_pairs}) for {mn=} {k=}")
    bits = sf.view(np.uint16)
    exps = np.empty(sf.shape[:-1] + (2 * num_pairs,), dtype=np.uint8)
    exps[..., 0::2] = bits & 0xFF
    exps[..., 1::2] = bits >> 8
    return _UE8M0_TABLE[exps[..., :num_blocks]]


# ------------------------------------------------------------------------------------------------------------------
# Exact power-of-two rebalancing of A and B exponents (how the stand-in applies MX scales as the chip does)

# NOTES: the largest UE8M0 byte e for which every code of the operand's dtype times 2^(e - 127) is a finite fp32:
# FP8 e4m3 peaks at 448 = 1.75 * 2^8 (1.75 * 2^(e - 119) finite for e <= 246), FP4 e2m1 at 6 = 1.5 * 2^2
# (e <= 252). Every byte >= 0 keeps the product exact on the low side: FP8 codes are multiples of 2^-9 and FP4
# codes of 2^-1, so the scaled value's lowest bit stays >= 2^-136 > 2^-149 (exact even when subnormal).
_MAX_EXACT_BYTE = {"fp8": 246, "fp4": 252}
# NOTES: the smallest byte for which every nonzero code scales to a normal fp32 (2^-9 * 2^(e - 127) >= 2^-126;
# 0.5 * 2^(e - 127) >= 2^-126): preferred when a shift is needed anyway, since subnormal operands are slow on CPUs.
_MIN_NORMAL_BYTE = {"fp8": 10, "fp4": 2}
_NAN_BYTE = 255
# NOTES: largest code magnitude (448, 6) and the exponent of the lowest bit a nonzero code can have (2^-9, 2^-1).
_MAX_CODE = {"fp8": 448.0, "fp4": 6.0}
_LOW_BIT = {"fp8": -9, "fp4": -1}


def _block_exponents(sf_phys: np.ndarray, num_blocks: int) -> np.ndarray:
    """int16 [num_blocks, MN]: the UE8M0 byte of every (32-K block, row) of C-contiguous int16 [ceil(K/64), MN]."""
    num_pairs, mn = sf_phys.shape
    pairs = sf_phys.view(np.uint8).reshape(num_pairs, mn, 2)  # little-endian: [..., 0] is block 2p, [..., 1] 2p + 1
    return np.swapaxes(pairs, 1, 2).reshape(2 * num_pairs, mn)[:num_blocks].astype(np.int16)


def _pack_block_exponents(exps: np.ndarray, num_pairs: int) -> np.ndarray:
    """Inverse of _block_exponents: int16 [num_blocks, MN] bytes -> C-contiguous int16 [num_pairs, MN]."""
    full = np.zeros((2 * num_pairs, exps.shape[1]), dtype=np.uint16)
    full[: exps.shape[0]] = exps
    return (full[0::2] | (full[1::2] << 8)).view(np.int16)


def _exponent_span(exps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per block (row of ``exps``): the lowest and highest byte, ignoring the E8M0 NaN byte 255 (a block of only
    NaN bytes gets lo = 255, hi = -1: no constraint)."""
    is_nan = exps == _NAN_BYTE
    return np.where(is_nan, _NAN_BYTE, exps).min(axis=1), np.where(is_nan, -1, exps).max(axis=1)


class SubnormalOperandsError(ValueError):
    """rebalance_sf_exponents(require_normal=True) found no split keeping every scaled operand value normal (the
    fp32 FMA Cube can still apply the scales exactly: call again without require_normal)."""


def rebalance_sf_exponents(
    sfa: np.ndarray, sfb: np.ndarray, k: int, kind_a: str, kind_b: str, max_out_shift: int = 127,
    require_normal: bool = False,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Move exponents between A, B (per 32-K block) and the output scale so the stand-in's fp32 math is exact.

    sfa / sfb: C-contiguous int16 [ceil(k/64), M] / [ceil(k/64), N], the kernels' scale layout. kind_a / kind_b:
    "fp8" or "fp4". Returns (sfa, sfb, out_shift): the caller multiplies alpha by 2^out_shift (at most
    ``max_out_shift``, what keeps alpha finite in fp32).

    The chip scales a block's product by 2^(ea + eb - 254); the stand-in multiplies each operand by its own scale,
    then sums in fp32 FMAs, so an operand scaled past fp32 (FP8 x 2^127) turned into Inf even when its products are
    small, and a sum that overflowed kept the sign of the first product to overflow. Here:
    - per K block kb, c_kb is added to every A byte and subtracted from every B byte: products stay bit-identical
      while every scaled operand value stays an exact, finite fp32 (normal when possible);
    - when the sum could overflow fp32, s = out_shift is taken off every B byte and put on alpha: the fp32 sum is
      the same up to the exact factor 2^-s and the epilogue's alpha * acc overflows to +-Inf with the sum's sign.
    Ordinary scales need neither: the very arrays passed in are returned with out_shift 0 (bitwise the same D).
    NaN bytes (255) are left as they are. Raises ValueError naming the K block and rows when no exact split exists:
    the bytes of one K-block column of sfa or sfb span too wide a range, or the sum can overflow while other
    blocks' products are so small that a shift of the output would lose them.
    ``require_normal``: every nonzero scaled operand value must also be a normal fp32 (the AMX and AVX512-BF16
    Cubes read bf16 subnormals as zero); raises SubnormalOperandsError when no split gives that.
    """
    num_blocks = ceil_div(k, _SF_BLOCK_K)
    if num_blocks == 0 or sfa.shape[1] == 0 or sfb.shape[1] == 0:
        return sfa, sfb, 0
    ha, hb = _MAX_EXACT_BYTE[kind_a], _MAX_EXACT_BYTE[kind_b]
    code_bound = math.log2(_MAX_CODE[kind_a] * _MAX_CODE[kind_b] * num_blocks * _SF_BLOCK_K)
    # Fast path (ordinary scales, one pass over the bytes): no byte past its limit (so no NaN byte either) and
    # even the largest pair of bytes cannot make a sum reach 2^126
    max_a, max_b = int(sfa.view(np.uint8).max()), int(sfb.view(np.uint8).max())
    normal = not require_normal or (int(sfa.view(np.uint8).min()) >= _MIN_NORMAL_BYTE[kind_a]
                                    and int(sfb.view(np.uint8).min()) >= _MIN_NORMAL_BYTE[kind_b])
    if normal and max_a <= ha and max_b <= hb and max_a + max_b - 2 * 127 + code_bound < 126:
        return sfa, sfb, 0

    ea, eb = _block_exponents(sfa, num_blocks), _block_exponents(sfb, num_blocks)
    lo_a, hi_a = _exponent_span(ea)
    lo_b, hi_b = _exponent_span(eb)
    live = (hi_a >= 0) & (hi_b >= 0)  # blocks with a non-NaN scale on both sides
    if not live.any():
        return sfa, sfb, 0

    # One K-block column of sfa (or sfb) spanning more than its dtype allows: no split can help
    for name, kind, exps, lo, hi, limit in (("sfa", kind_a, ea, lo_a, hi_a, ha), ("sfb", kind_b, eb, lo_b, hi_b, hb)):
        wide = np.flatnonzero((hi - lo > limit) & live)
        if wide.size:
            kb = int(wide[0])
            row = int(np.argmax(np.where(exps[kb] == _NAN_BYTE, -1, exps[kb])))
            raise ValueError(
                f"{name}: the scales of K block {kb} (K {kb * _SF_BLOCK_K}..{(kb + 1) * _SF_BLOCK_K - 1}) span "
                f"2^{int(lo[kb]) - 127}..2^{int(hi[kb]) - 127} (max at {name}[{row}, {kb}]), wider than the 2^{limit} "
                f"the stand-in can apply exactly to {kind} values in fp32: narrow the exponent range within this block"
            )

    # Output shift: needed when |sum| could reach 2^126 (sum of k products of the largest codes)
    log2_bound = int((hi_a + hi_b)[live].max()) - 2 * 127 + code_bound
    shift = max(0, math.ceil(log2_bound) - 126)
    if shift and shift > max_out_shift:
        raise ValueError(
            f"sfa/sfb: scales up to 2^{int(hi_a.max()) - 127} x 2^{int(hi_b.max()) - 127} give sums up to "
            f"2^{log2_bound:.1f}, beyond what the stand-in can carry through its fp32 accumulator and alpha "
            f"(at most 2^{max_out_shift + 126}): lower the scales (or alpha)"
        )
    if shift:
        # NOTES: the lowest bit of any product must stay >= 2^-149 after the shift, or the fp32 sum would differ.
        low = int((lo_a + lo_b)[live].min()) - 2 * 127 + _LOW_BIT[kind_a] + _LOW_BIT[kind_b]
        if low - shift < -149:
            kb = int(np.flatnonzero(live & (lo_a + lo_b == (lo_a + lo_b)[live].min()))[0])
            raise ValueError(
                f"sfa/sfb: sums may overflow fp32 (scales up to 2^{int(hi_a.max()) - 127} x "
                f"2^{int(hi_b.max()) - 127}) while K block {kb} has scales as small as 2^{int(lo_a[kb]) - 127} x "
                f"2^{int(lo_b[kb]) - 127}: the stand-in's single fp32 accumulator cannot hold both exactly; "
                "narrow the range of the scales"
            )

    # Feasible shifts per block: A bytes in [0, ha] after +c, B bytes in [0, hb] after -c - shift
    lower = np.maximum(-lo_a, hi_b - shift - hb)
    upper = np.minimum(ha - hi_a, lo_b - shift)
    bad = np.flatnonzero(live & (lower > upper))
    if bad.size:
        kb = int(bad[0])
        row_a = int(np.argmax(np.where(ea[kb] == _NAN_BYTE, -1, ea[kb])))
        row_b = int(np.argmax(np.where(eb[kb] == _NAN_BYTE, -1, eb[kb])))
        raise ValueError(
            f"sfa/sfb: the scales of K block {kb} (K {kb * _SF_BLOCK_K}..{(kb + 1) * _SF_BLOCK_K - 1}) cannot be "
            f"applied exactly: sfa[:, {kb}] spans 2^{int(lo_a[kb]) - 127}..2^{int(hi_a[kb]) - 127} (max at "
            f"sfa[{row_a}, {kb}]), sfb[:, {kb}] spans 2^{int(lo_b[kb]) - 127}..2^{int(hi_b[kb]) - 127} (max at "
            f"sfb[{row_b}, {kb}]); the stand-in needs one power-of-two split c with every {kind_a} A value x "
            f"2^(ea + c) and every {kind_b} B value x 2^(eb - c) exact and finite in fp32 (exponents within "
            f"[-127, {ha - 127}] and [-127, {hb - 127}]): narrow the exponent range within this K block"
        )
    # Prefer c = 0, then shifts that keep every nonzero operand value normal, then any exact shift
    norm_lower = np.maximum(lower, _MIN_NORMAL_BYTE[kind_a] - lo_a)
    norm_upper = np.minimum(upper, lo_b - shift - _MIN_NORMAL_BYTE[kind_b])
    if require_normal:
        bad = np.flatnonzero(live & (norm_lower > norm_upper))
        if bad.size:
            kb = int(bad[0])
            raise SubnormalOperandsError(
                f"sfa/sfb: in K block {kb} no power-of-two split keeps every scaled operand value normal "
                f"(sfa[:, {kb}] 2^{int(lo_a[kb]) - 127}..2^{int(hi_a[kb]) - 127}, sfb[:, {kb}] "
                f"2^{int(lo_b[kb]) - 127}..2^{int(hi_b[kb]) - 127})"
            )
        lower, upper = norm_lower, norm_upper
    c = np.where(norm_lower <= norm_upper, np.clip(0, norm_lower, np.maximum(norm_lower, norm_upper)),
                 np.clip(0, lower, np.maximum(lower, upper)))
    c = np.where(((lower <= 0) & (upper >= 0)) | ~live, 0, c).astype(np.int16)
    if not c.any() and not shift:
        return sfa, sfb, 0
    ea = np.where(ea == _NAN_BYTE, ea, ea + c[:, None])
    eb = np.where(eb == _NAN_BYTE, eb, eb - c[:, None] - shift)
    return _pack_block_exponents(ea, sfa.shape[0]), _pack_block_exponents(eb, sfb.shape[0]), shift
