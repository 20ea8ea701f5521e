"""DeepGEMM's quantization helpers on numpy: FP8 (e4m3fn) and FP4 (e2m1) casts with per-token/channel/block scales.

Same names, arguments and formulas as DeepGEMM's ``deep_gemm/utils/math.py`` (fp32 arithmetic, multiply by the
reciprocal of the scale); ``gran_k=32`` gives the Ascend MX recipe. Layout conversion lives in ``layout.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .formats import BF16_DTYPE, decode_e2m1, encode_e2m1, encode_e4m3, pack_fp4, unpack_fp4

__all__ = [
    "ceil_div", "align", "ceil_to_ue8m0", "pack_ue8m0_to_int", "unpack_ue8m0_from_int",
    "per_token_cast_to_fp8", "per_channel_cast_to_fp8", "per_block_cast_to_fp8", "per_custom_dims_cast_to_fp8",
    "per_token_cast_to_fp4", "cast_back_from_fp4", "transpose_packed_fp4",
]

# NOTES: DeepGEMM clamps the block amax at 1e-4 (as an fp32 tensor op) so all-zero blocks get a finite scale.
_AMAX_FLOOR = np.float32(1e-4)
_FP8_MAX = np.float32(448.0)
_FP4_MAX = np.float32(6.0)


def ceil_div(x: int, y: int) -> int:
    """ceil(x / y) for integers."""
    return (x + y - 1) // y


def align(x: int, y: int) -> int:
    """x rounded up to a multiple of y."""
    return ceil_div(x, y) * y


def ceil_to_ue8m0(x: np.ndarray) -> np.ndarray:
    """Round |x| up to a power of two representable as UE8M0: fp32 in [2^-126, 2^127], same shape.

    From the fp32 bits of |x|: exponent field, plus one if any mantissa bit is set, clamped to [1, 254].
    """
    x = np.asarray(x, dtype=np.float32)
    bits = np.abs(x).view(np.int32).astype(np.int64)
    exp = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0)
    exp = np.clip(exp, 1, 254)
    return (exp.astype(np.int32) << 23).view(np.float32)


def pack_ue8m0_to_int(x: np.ndarray) -> np.ndarray:
    """fp32 power-of-two scales [..., 4j] -> int32 [..., j]: byte i of each int32 is the exponent of scale 4j+i.

    This is CUDA DeepGEMM's packed form (the Ascend kernels take int16 pairs: see ``layout.py``).
    """
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"pack_ue8m0_to_int needs float32 scales, got {x.dtype=}")
    if x.ndim == 0 or x.shape[-1] % 4:
        raise ValueError(f"pack_ue8m0_to_int needs a last dim divisible by 4, got {x.shape=}")
    bits = np.ascontiguousarray(x).view(np.uint32)
    bad = (bits & np.uint32(0x807FFFFF)) != 0
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"pack_ue8m0_to_int: x[{idx}]={x[idx]!r} is not a non-negative power of two")
    exp = (bits >> 23).astype(np.uint8)
    return np.ascontiguousarray(exp).view("<i4").astype(np.int32)


def unpack_ue8m0_from_int(packed: np.ndarray) -> np.ndarray:
    """Inverse of ``pack_ue8m0_to_int``: int32 [..., j] -> fp32 [..., 4j]."""
    packed = np.asarray(packed)
    if packed.dtype != np.int32:
        raise TypeError(f"unpack_ue8m0_from_int needs int32, got {packed.dtype=}")
    exp = np.ascontiguousarray(packed).astype("<i4").view(np.uint8).astype(np.uint32)
    return (exp << 23).view(np.float32)


def _as_fp32(x: np.ndarray, name: str = "x") -> np.ndarray:
    # NOTES: bf16/fp16 inputs are exact in fp32, as torch's `.float()`; float64 is rounded to fp32 first.
    x = np.asarray(x)
    if x.dtype.kind != "f" and x.dtype != BF16_DTYPE:
        raise TypeError(f"{name} must be a floating-point array, got {name}.dtype={x.dtype}")
    return x.astype(np.float32)


def _check_gran(gran_k: object) -> int:
    if isinstance(gran_k, bool) or not isinstance(gran_k, (int, np.integer)):
        raise TypeError(f"gran_k must be an int, got {gran_k!r}")
    if gran_k <= 0:
        raise ValueError(f"gran_k must be positive, got {gran_k=}")
    return int(gran_k)


def _check_flags(**flags: object) -> None:
    # NOTES: bool("False") is True: a str (or an int) flag would silently pick the other scale format
    for name, value in flags.items():
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool, got {type(value).__name__}: {value!r}")


def _scale(amax: np.ndarray, fmt_max: np.float32, use_ue8m0: bool) -> np.ndarray:
    sf = np.maximum(amax, _AMAX_FLOOR) / fmt_max
    return ceil_to_ue8m0(sf) if use_ue8m0 else sf.astype(np.float32)


def _pack_sf(sf: np.ndarray) -> np.ndarray:
    # NOTES: DeepGEMM pads the scale count to a multiple of 4 with 1.0 before packing (byte 0x7F).
    pad = (-sf.shape[-1]) % 4
    if pad:
        sf = np.concatenate([sf, np.ones(sf.shape[:-1] + (pad,), dtype=np.float32)], axis=-1)
    return pack_ue8m0_to_int(sf)


def per_token_cast_to_fp8(
    x: np.ndarray, use_ue8m0: bool, gran_k: int = 128, use_packed_ue8m0: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """x [m, n] float -> (float8_e4m3fn [m, n], fp32 sf [m, ceil(n/gran_k)]); one scale per row per gran_k columns.

    sf = max(amax, 1e-4) / 448 (rounded up to a power of two when ``use_ue8m0``); codes = e4m3(x * (1/sf)).
    With ``use_packed_ue8m0`` the scales come back as CUDA-style int32 [m, ceil(ceil(n/gran_k)/4)].
    """
    x = _as_fp32(x)
    gran_k = _check_gran(gran_k)
    _check_flags(use_ue8m0=use_ue8m0, use_packed_ue8m0=use_packed_ue8m0)
    if x.ndim != 2:
        raise ValueError(f"per_token_cast_to_fp8 needs a 2-D x, got {x.shape=}")
    m, n = x.shape
    padded = np.zeros((m, align(n, gran_k)), dtype=np.float32)
    padded[:, :n] = x
    view = padded.reshape(m, padded.shape[1] // gran_k, gran_k)
    sf = _scale(np.abs(view).max(axis=2, initial=np.float32(0)), _FP8_MAX, use_ue8m0)
    codes = encode_e4m3(view * (np.float32(1.0) / sf)[:, :, None]).reshape(padded.shape)[:, :n]
    return np.ascontiguousarray(codes), (_pack_sf(sf) if use_packed_ue8m0 else sf)


def per_channel_cast_to_fp8(x: np.ndarray, use_ue8m0: bool, gran_k: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """x [m, n] float -> (float8_e4m3fn [m, n], fp32 sf [m/gran_k, n]); one scale per column per gran_k rows.

    Requires ``m % gran_k == 0``. Same formula as ``per_token_cast_to_fp8``.
    """
    x = _as_fp32(x)
    gran_k = _check_gran(gran_k)
    _check_flags(use_ue8m0=use_ue8m0)
    if x.ndim != 2:
        raise ValueError(f"per_channel_cast_to_fp8 needs a 2-D x, got {x.shape=}")
    m, n = x.shape
    if m % gran_k:
        raise ValueError(f"per_channel_cast_to_fp8 needs m % gran_k == 0, got {m=} {gran_k=}")
    view = x.reshape(m // gran_k, gran_k, n)
    sf = _scale(np.abs(view).max(axis=1, initial=np.float32(0)), _FP8_MAX, use_ue8m0)
    codes = encode_e4m3(view * (np.float32(1.0) / sf)[:, None, :]).reshape(m, n)
    return codes, sf


def per_block_cast_to_fp8(x: np.ndarray, use_ue8m0: bool, gran_k: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """x [m, n] float -> (float8_e4m3fn [m, n], fp32 sf [ceil(m/gran_k), ceil(n/gran_k)]); gran_k x gran_k tiles.

    x is zero-padded to whole tiles; the amax of each tile gives its scale (formula of ``per_token_cast_to_fp8``).
    """
    x = _as_fp32(x)
    gran_k = _check_gran(gran_k)
    _check_flags(use_ue8m0=use_ue8m0)
    if x.ndim != 2:
        raise ValueError(f"per_block_cast_to_fp8 needs a 2-D x, got {x.shape=}")
    m, n = x.shape
    mb, nb = ceil_div(m, gran_k), ceil_div(n, gran_k)
    padded = np.zeros((mb * gran_k, nb * gran_k), dtype=np.float32)
    padded[:m, :n] = x
    view = padded.reshape(mb, gran_k, nb, gran_k)
    sf = _scale(np.abs(view).max(axis=(1, 3), initial=np.float32(0)), _FP8_MAX, use_ue8m0)
    codes = encode_e4m3(view * (np.float32(1.0) / sf)[:, None, :, None]).reshape(mb * gran_k, nb * gran_k)
    return np.ascontiguousarray(codes[:m, :n]), sf


def per_custom_dims_cast_to_fp8(
    x: np.ndarray, dims: Sequence[int], use_ue8m0: bool
) -> tuple[np.ndarray, np.ndarray]:
    """x float [...] -> (float8_e4m3fn, fp32 sf): one scale per index of ``dims``; the amax runs over all other dims.

    sf keeps the shape of x with the reduced dims removed, then every size-1 dim is squeezed (torch's ``squeeze()``).
    """
    x = _as_fp32(x)
    _check_flags(use_ue8m0=use_ue8m0)
    if isinstance(dims, (int, np.integer)):
        dims = (dims,)
    dims = tuple(dims)
    if any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) for d in dims):
        raise TypeError(f"dims must be a sequence of ints, got {dims!r}")
    if any(not -x.ndim <= d < x.ndim for d in dims):
        raise ValueError(f"{dims=} out of range for {x.shape=}")
    kept = {int(d) % x.ndim for d in dims}
    reduced = tuple(i for i in range(x.ndim) if i not in kept)
    amax = np.abs(x).max(axis=reduced, keepdims=True, initial=np.float32(0))
    sf = _scale(amax, _FP8_MAX, use_ue8m0)
    codes = encode_e4m3(x * (np.float32(1.0) / sf))
    return codes, np.squeeze(sf)


def per_token_cast_to_fp4(
    x: np.ndarray, use_ue8m0: bool, gran_k: int = 128, use_packed_ue8m0: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """x [m, n] float (n even) -> (packed FP4 int8 [m, n/2], fp32 sf [m, ceil(n/gran_k)]).

    sf = max(amax, 1e-4) / 6 (power of two when ``use_ue8m0``); each v = x * (1/sf) gets the e2m1 code of
    ``formats.encode_e2m1`` (thresholds, ties to the smaller magnitude); codes 2i/2i+1 share a byte (low/high nibble).
    With ``use_packed_ue8m0`` the scales are padded to a multiple of 4 with 1.0 and packed into int32.
    """
    x = _as_fp32(x)
    gran_k = _check_gran(gran_k)
    _check_flags(use_ue8m0=use_ue8m0, use_packed_ue8m0=use_packed_ue8m0)
    if x.ndim != 2:
        raise ValueError(f"per_token_cast_to_fp4 needs a 2-D x, got {x.shape=}")
    m, n = x.shape
    if n % 2:
        raise ValueError(f"per_token_cast_to_fp4 needs an even n (two codes per byte), got {n=}")
    padded = np.zeros((m, align(n, gran_k)), dtype=np.float32)
    padded[:, :n] = x
    view = padded.reshape(m, padded.shape[1] // gran_k, gran_k)
    sf = _scale(np.abs(view).max(axis=2, initial=np.float32(0)), _FP4_MAX, use_ue8m0)
    codes = encode_e2m1(view * (np.float32(1.0) / sf)[:, :, None]).reshape(padded.shape)[:, :n]
    return pack_fp4(codes, axis=-1), (_pack_sf(sf) if use_packed_ue8m0 else sf)


def cast_back_from_fp4(
    packed: np.ndarray, sf: np.ndarray, gran_k: int = 128, use_packed_ue8m0: bool = False
) -> np.ndarray:
    """Packed FP4 int8 [m, n/2] and sf [m, ceil(n/gran_k)] (or int32 packed) -> fp32 [m, n] = value * its scale."""
    gran_k = _check_gran(gran_k)
    _check_flags(use_packed_ue8m0=use_packed_ue8m0)
    packed = np.asarray(packed)
    if packed.ndim != 2:
        raise ValueError(f"cast_back_from_fp4 needs a 2-D packed array, got {packed.shape=}")
    values = decode_e2m1(unpack_fp4(packed, axis=-1))
    m, n = values.shape
    sf = np.asarray(sf)
    if use_packed_ue8m0:
        sf = unpack_ue8m0_from_int(sf)
    elif sf.dtype != np.float32:
        raise TypeError(f"cast_back_from_fp4 needs fp32 sf (or int32 with use_packed_ue8m0), got {sf.dtype=}")
    num_sf = ceil_div(n, gran_k)
    if sf.ndim != 2 or sf.shape[0] != m or sf.shape[1] < num_sf:
        raise ValueError(f"cast_back_from_fp4: sf shape {sf.shape} does not cover [{m}, {num_sf}] ({n=} {gran_k=})")
    return values * np.repeat(sf[:, :num_sf], gran_k, axis=1)[:, :n]


def transpose_packed_fp4(a: np.ndarray) -> np.ndarray:
    """Packed FP4 int8 [m, n/2] -> int8 [n, m/2]: the codes of the transpose, repacked along its rows (m even)."""
    a = np.asarray(a)
    if a.dtype != np.int8 or a.ndim != 2:
        raise TypeError(f"transpose_packed_fp4 needs a 2-D int8 array, got {a.dtype=} {a.shape=}")
    if a.shape[0] % 2:
        raise ValueError(f"transpose_packed_fp4 needs an even row count, got {a.shape=}")
    return pack_fp4(unpack_fp4(a, axis=-1).T, axis=-1)

