"""Number formats deep_gemm reads and writes: FP8 e4m3fn codes, packed FP4 e2m1 codes, bf16 bits.

Decode tables, encoders, FP4 nibble packing and dtype predicates, on numpy + ml_dtypes. No GEMM logic here.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = [
    "FP8_DTYPE", "BF16_DTYPE", "PACKED_FP4_DTYPE", "E4M3_MAX", "E2M1_MAX",
    "E4M3_DECODE_TABLE", "E2M1_DECODE_TABLE", "E2M1_THRESHOLDS",
    "is_fp8", "is_packed_fp4", "is_bf16",
    "fp8_codes", "encode_e4m3", "decode_e4m3", "encode_e2m1", "decode_e2m1",
    "pack_fp4", "unpack_fp4", "fp32_to_bf16_bits", "bf16_bits_to_fp32", "round_to_tf32",
]

FP8_DTYPE = np.dtype(ml_dtypes.float8_e4m3fn)
BF16_DTYPE = np.dtype(ml_dtypes.bfloat16)
# NOTES: DeepGEMM marks packed FP4 operands by the int8 dtype (torch.int8, "kPackedFP4").
PACKED_FP4_DTYPE = np.dtype(np.int8)

E4M3_MAX = 448.0
E2M1_MAX = 6.0


def _build_e4m3_table() -> np.ndarray:
    # Decoded from the bit fields (1 sign, 4 exponent with bias 7, 3 mantissa), not through ml_dtypes, so the
    # tests can check the two against each other. e4m3fn has no infinities; S.1111.111 are the only NaNs.
    table = np.empty(256, dtype=np.float32)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exp = (code >> 3) & 0xF
        man = code & 0x7
        if exp == 0xF and man == 0x7:
            value = float("nan")
        elif exp == 0:
            value = sign * man * 2.0**-9  # subnormal: man/8 * 2^(1-7)
        else:
            value = sign * (1.0 + man / 8.0) * 2.0 ** (exp - 7)
        table[code] = value
    table.flags.writeable = False
    return table


def _build_e2m1_table() -> np.ndarray:
    # 1 sign, 2 exponent with bias 1, 1 mantissa: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (code 0x8 is -0.0).
    table = np.empty(16, dtype=np.float32)
    for code in range(16):
        sign = -1.0 if code & 0x8 else 1.0
        exp = (code >> 1) & 0x3
        man = code & 0x1
        mag = man * 0.5 if exp == 0 else (1.0 + man / 2.0) * 2.0 ** (exp - 1)
        table[code] = sign * mag
    table.flags.writeable = False
    return table


E4M3_DECODE_TABLE: np.ndarray = _build_e4m3_table()
"""fp32 [256]: the value of each e4m3fn code; 0x7F and 0xFF decode to NaN."""
E2M1_DECODE_TABLE: np.ndarray = _build_e2m1_table()
"""fp32 [16]: the value of each e2m1 code; code 0x8 is -0.0."""
E2M1_THRESHOLDS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=np.float32)
"""The magnitude code of |v| is the number of thresholds |v| is strictly greater than (ties go to the smaller)."""
E2M1_THRESHOLDS.flags.writeable = False


def _dtype_of(x: object) -> np.dtype | None:
    # NOTES: scalar types such as np.int8 carry a `dtype` descriptor of their own; only instances use the attribute.
    dtype = x if isinstance(x, type) else getattr(x, "dtype", x)
    try:
        return np.dtype(dtype)
    except TypeError:
        return None


def is_fp8(x: object) -> bool:
    """True for an array (or dtype) of ml_dtypes.float8_e4m3fn."""
    return _dtype_of(x) == FP8_DTYPE


def is_packed_fp4(x: object) -> bool:
    """True for an array (or dtype) of int8: packed FP4 e2m1, two codes per byte (DeepGEMM's convention)."""
    return _dtype_of(x) == PACKED_FP4_DTYPE


def is_bf16(x: object) -> bool:
    """True for an array (or dtype) of ml_dtypes.bfloat16."""
    return _dtype_of(x) == BF16_DTYPE


def fp8_codes(x: np.ndarray) -> np.ndarray:
    """View a float8_e4m3fn array as its uint8 codes (same shape and strides, no copy)."""
    if not is_fp8(x):
        raise TypeError(f"expected a float8_e4m3fn array, got {getattr(x, 'dtype', type(x).__name__)}")
    return x.view(np.uint8)


def encode_e4m3(x: np.ndarray) -> np.ndarray:
    """fp32 (or any float) -> float8_e4m3fn with round-to-nearest-even; values beyond the format become NaN.

    This is torch's and ml_dtypes' ``.to(float8_e4m3fn)`` (no saturation): |x| >= 464 rounds past 448 to NaN.
    """
    x = np.asarray(x)
    if x.dtype.kind != "f" and x.dtype not in (BF16_DTYPE,):
        raise TypeError(f"encode_e4m3 needs a floating-point array, got {x.dtype=}")
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(np.float32).astype(FP8_DTYPE)


def decode_e4m3(codes: np.ndarray) -> np.ndarray:
    """uint8 codes (or a float8_e4m3fn array) -> fp32 values, exact (NaN codes 0x7F/0xFF give NaN)."""
    codes = np.asarray(codes)
    if is_fp8(codes):
        codes = codes.view(np.uint8)
    if codes.dtype != np.uint8:
        raise TypeError(f"decode_e4m3 needs uint8 codes or float8_e4m3fn, got {codes.dtype=}")
    return E4M3_DECODE_TABLE[codes]


def encode_e2m1(x: np.ndarray) -> np.ndarray:
    """fp32 values -> uint8 e2m1 codes in [0, 16) with DeepGEMM's quantizer rule.

    Magnitude code = number of ``E2M1_THRESHOLDS`` that |x| is strictly greater than (so |x| > 6 saturates to 6
    and ties go to the smaller magnitude); the sign bit 0x8 is set only for x < 0 with a non-zero code.
    NaN compares false against every threshold and encodes as 0.
    """
    x = np.asarray(x)
    if x.dtype.kind != "f" and x.dtype != BF16_DTYPE:
        raise TypeError(f"encode_e2m1 needs a floating-point array, got {x.dtype=}")
    x = x.astype(np.float32)
    mag = np.abs(x)
    code = np.zeros(x.shape, dtype=np.uint8)
    for t in E2M1_THRESHOLDS:
        code += mag > t
    code |= ((x < 0) & (code != 0)).astype(np.uint8) << 3
    return code


def decode_e2m1(codes: np.ndarray) -> np.ndarray:
    """uint8 codes in [0, 16) -> fp32 values, exact."""
    codes = np.asarray(codes)
    if codes.dtype.kind not in "ui":
        raise TypeError(f"decode_e2m1 needs integer codes, got {codes.dtype=}")
    if codes.size and (codes.min() < 0 or codes.max() > 15):
        raise ValueError(f"e2m1 codes must be in [0, 16), got min={codes.min()} max={codes.max()}")
    return E2M1_DECODE_TABLE[codes.astype(np.intp)]


def pack_fp4(codes: np.ndarray, axis: int = -1) -> np.ndarray:
    """uint8 e2m1 codes [..., 2n, ...] -> int8 [..., n, ...] packed along ``axis``, C-contiguous.

    Byte i holds code 2i in its low nibble and code 2i+1 in its high nibble.
    """
    codes = np.asarray(codes)
    if codes.dtype.kind not in "ui":
        raise TypeError(f"pack_fp4 needs integer codes, got {codes.dtype=}")
    if codes.ndim == 0:
        raise ValueError(f"pack_fp4 needs at least one axis, got {codes.shape=}")
    axis = _norm_axis(axis, codes.ndim)
    if codes.shape[axis] % 2:
        raise ValueError(f"pack_fp4: the packed axis must have even length, got {codes.shape=} {axis=}")
    if codes.size and (codes.min() < 0 or codes.max() > 15):
        raise ValueError(f"pack_fp4: codes must be in [0, 16), got min={codes.min()} max={codes.max()}")
    moved = np.moveaxis(codes.astype(np.uint8), axis, -1)
    packed = (moved[..., 0::2] | (moved[..., 1::2] << 4)).astype(np.uint8)
    return np.ascontiguousarray(np.moveaxis(packed, -1, axis)).view(np.int8)


def unpack_fp4(packed: np.ndarray, axis: int = -1) -> np.ndarray:
    """int8 (or uint8) packed FP4 [..., n, ...] -> uint8 codes [..., 2n, ...] along ``axis``, C-contiguous."""
    packed = np.asarray(packed)
    if packed.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
        raise TypeError(f"unpack_fp4 needs int8 or uint8 packed bytes, got {packed.dtype=}")
    if packed.ndim == 0:
        raise ValueError(f"unpack_fp4 needs at least one axis, got {packed.shape=}")
    axis = _norm_axis(axis, packed.ndim)
    moved = np.moveaxis(packed.view(np.uint8), axis, -1)
    codes = np.empty(moved.shape[:-1] + (2 * moved.shape[-1],), dtype=np.uint8)
    codes[..., 0::2] = moved & 0xF
    codes[..., 1::2] = moved >> 4
    return np.ascontiguousarray(np.moveaxis(codes, -1, axis))


def fp32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> uint16 bf16 bits, round-to-nearest-even (bit-exact with ml_dtypes' cast).

    Overflow rounds to +-inf; every NaN becomes the quiet NaN 0x7FC0 with its sign kept.
    """
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"fp32_to_bf16_bits needs float32, got {x.dtype=}")
    bits = x.view(np.uint32)
    # NOTES: adding 0x7FFF plus the lowest kept bit, then truncating, is RNE on the dropped 16 bits; uint32
    # arithmetic cannot overflow here because only NaN patterns are close enough to 2^32, and they are replaced.
    rounded = ((bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        rounded = np.where(nan, ((bits >> 16) & 0x8000).astype(np.uint16) | np.uint16(0x7FC0), rounded)
    return rounded


def round_to_tf32(x: np.ndarray) -> np.ndarray:
    """fp32 -> fp32 holding the TF32 value: the mantissa rounded to 10 bits, round to nearest, ties to even.

    The Cube's HF32 mode in its default rounding (SetHF32TransMode NEAREST_EVEN), which tf32_hc_prenorm_gemm
    applies to its fp32 operand; Inf and NaN pass through, a carry past the largest finite value gives +-Inf.
    """
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"round_to_tf32 needs float32, got {x.dtype=}")
    bits = x.view(np.uint32)
    # NOTES: the same add-and-truncate as fp32_to_bf16_bits, on the low 13 bits; Inf/NaN are kept as they are.
    rounded = (bits + (np.uint32(0xFFF) + ((bits >> 13) & 1))) & np.uint32(0xFFFFE000)
    special = (bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    return np.where(special, bits, rounded).astype(np.uint32).view(np.float32)


def bf16_bits_to_fp32(bits: np.ndarray) -> np.ndarray:
    """uint16 bf16 bits (or a bfloat16 array) -> fp32, exact."""
    bits = np.asarray(bits)
    if is_bf16(bits):
        bits = bits.view(np.uint16)
    if bits.dtype != np.uint16:
        raise TypeError(f"bf16_bits_to_fp32 needs uint16 bits or bfloat16, got {bits.dtype=}")
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _norm_axis(axis: int, ndim: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{axis=} is out of range for {ndim=}")
    return int(axis) % ndim
