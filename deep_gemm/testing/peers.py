"""The GEMMs a user would otherwise write, as the benches' peers: the strongest numpy formulation (256-entry lookup
table decode, in-place block scaling, fp32 matmul, cast to bf16), the naive ``astype`` one for reference, and JAX
(jit-compiled, when the optional ``peers`` extra is installed). Timing is the benches' business, not this module's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..utils.formats import BF16_DTYPE, E2M1_DECODE_TABLE, E4M3_DECODE_TABLE, FP8_DTYPE, is_fp8
from ..utils.math import ceil_div

# NOTES: a packed FP4 byte holds code 2i in its low nibble and 2i+1 in its high one; decoding each nibble through
# its own 256-entry table keeps the decode one gather per output element, like the FP8 table.
_FP4_LOW_TABLE = E2M1_DECODE_TABLE[np.arange(256) & 0xF].astype(np.float32)
_FP4_HIGH_TABLE = E2M1_DECODE_TABLE[np.arange(256) >> 4].astype(np.float32)


# ---------------------------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------------------------
def _fp8_codes(name: str, x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if is_fp8(x):
        x = x.view(np.uint8)
    if x.dtype != np.uint8 or x.ndim != 2:
        raise TypeError(f"{name} must be 2-D float8_e4m3fn or uint8 codes, got {name}.dtype={x.dtype} "
                        f"{name}.shape={x.shape}")
    return x


def _fp4_packed(name: str, x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)) or x.ndim != 2:
        raise TypeError(f"{name} must be 2-D K-major packed FP4 (int8 [mn, k/2]), got {name}.dtype={x.dtype} "
                        f"{name}.shape={x.shape}")
    return x.view(np.uint8)


def _scales(name: str, sf: np.ndarray, mn: int, k: int) -> np.ndarray:
    sf = np.asarray(sf)
    if sf.dtype != np.float32:
        raise TypeError(f"{name} must be float32 per-32-block scales, got {name}.dtype={sf.dtype}")
    expected = (mn, ceil_div(k, 32))
    if sf.shape != expected:
        raise ValueError(f"{name}.shape={sf.shape} != {expected} for {mn=} {k=}")
    return sf


def _check_k(a: np.ndarray, b: np.ndarray, k_a: int, k_b: int) -> None:
    if k_a != k_b:
        raise ValueError(f"A and B need the same K, got A.shape={a.shape} B.shape={b.shape}")


# ---------------------------------------------------------------------------------------------------------------
# numpy
# ---------------------------------------------------------------------------------------------------------------
def scale_blocks_inplace(x: np.ndarray, sf: np.ndarray) -> np.ndarray:
    """x fp32 [mn, k] (C-contiguous) *= sf fp32 [mn, ceil(k/32)] per 32-column block, in place; returns x."""
    if not x.flags.c_contiguous:
        raise ValueError(f"scale_blocks_inplace needs a C-contiguous x, got x.strides={x.strides}")
    mn, k = x.shape
    full = k // 32
    if full:
        # NOTES: a reshape of the full-block columns is a view only when no tail follows them.
        if full * 32 == k:
            x.reshape(mn, full, 32)[...] *= sf[:, :full, None]
        else:
            x[:, : full * 32] *= np.repeat(sf[:, :full], 32, axis=1)
    if full * 32 != k:
        x[:, full * 32:] *= sf[:, full:full + 1]
    return x


def decode_fp8_lut(codes: np.ndarray, sf: np.ndarray) -> np.ndarray:
    """FP8 [mn, k] (float8_e4m3fn or uint8 codes, any strides) and fp32 sf [mn, ceil(k/32)] -> fp32 [mn, k]:
    ``E4M3_DECODE_TABLE[codes]`` then the block scales applied in place. Exact (power-of-two scales)."""
    codes = _fp8_codes("codes", codes)
    mn, k = codes.shape
    sf = _scales("sf", sf, mn, k)
    # NOTES: the gather follows the codes' memory order; MN-major codes would make the in-place reshape a copy.
    return scale_blocks_inplace(np.ascontiguousarray(E4M3_DECODE_TABLE[codes]), sf)


def decode_fp4_lut(packed: np.ndarray, sf: np.ndarray) -> np.ndarray:
    """K-major packed FP4 int8 [mn, k/2] and fp32 sf [mn, ceil(k/32)] -> fp32 [mn, k]: each byte's two nibbles
    decoded through two 256-entry tables, then the block scales applied in place."""
    packed = _fp4_packed("packed", packed)
    mn, half = packed.shape
    sf = _scales("sf", sf, mn, 2 * half)
    x = np.empty((mn, 2 * half), np.float32)
    x[:, 0::2] = _FP4_LOW_TABLE[packed]
    x[:, 1::2] = _FP4_HIGH_TABLE[packed]
    return scale_blocks_inplace(x, sf)


def numpy_fp8_gemm(a: np.ndarray, sfa: np.ndarray, b: np.ndarray, sfb: np.ndarray) -> np.ndarray:
    """The strongest numpy FP8 GEMM: bf16 [m, n] = (decode_fp8_lut(a, sfa) @ decode_fp8_lut(b, sfb).T) in fp32.
    a [m, k], b [n, k]: float8_e4m3fn or uint8 codes; sfa/sfb fp32 [mn, ceil(k/32)]."""
    a32, b32 = decode_fp8_lut(a, sfa), decode_fp8_lut(b, sfb)
    _check_k(a, b, a32.shape[1], b32.shape[1])
    return (a32 @ b32.T).astype(BF16_DTYPE)


def numpy_fp4_gemm(a: np.ndarray, sfa: np.ndarray, b: np.ndarray, sfb: np.ndarray) -> np.ndarray:
    """The strongest numpy FP4 GEMM: bf16 [m, n] from K-major packed a int8 [m, k/2], b int8 [n, k/2] and fp32
    scales [mn, ceil(k/32)]: table decode, in-place scaling, fp32 matmul, cast."""
    a32, b32 = decode_fp4_lut(a, sfa), decode_fp4_lut(b, sfb)
    _check_k(a, b, a32.shape[1], b32.shape[1])
    return (a32 @ b32.T).astype(BF16_DTYPE)


def numpy_fp8_gemm_naive(a: np.ndarray, sfa: np.ndarray, b: np.ndarray, sfb: np.ndarray) -> np.ndarray:
    """The first numpy FP8 GEMM one writes (for reference beside the strongest): ``astype(np.float32)`` of the
    float8 array times ``np.repeat``-ed scales, fp32 matmul, cast to bf16. Same arguments as ``numpy_fp8_gemm``."""

    def decode(name, codes, sf):
        codes = _fp8_codes(name, codes)
        mn, k = codes.shape
        sf = _scales(f"sf{name}", sf, mn, k)
        return codes.view(FP8_DTYPE).astype(np.float32) * np.repeat(sf, 32, axis=1)[:, :k]

    a32, b32 = decode("a", a, sfa), decode("b", b, sfb)
    _check_k(a, b, a32.shape[1], b32.shape[1])
    return (a32 @ b32.T).astype(BF16_DTYPE)


# ---------------------------------------------------------------------------------------------------------------
# JAX (optional: pip install deep_gemm[peers])
# ---------------------------------------------------------------------------------------------------------------
def jax_version() -> str | None:
    """The installed JAX's version, or None when JAX cannot be imported."""
    try:
        import jax
    except ImportError:
        return None
    return jax.__version__


def _jax():
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as exc:
        raise ImportError("JAX is not installed; the JAX peer needs `pip install deep_gemm[peers]`") from exc
    return jax, jnp


def jax_bf16_gemm(a: np.ndarray, b: np.ndarray) -> Callable[[], object]:
    """A zero-argument call of JAX's BF16 GEMM on a [m, k], b [n, k] (bfloat16) placed on JAX's CPU device once:
    ``jax.jit(lambda a, b: jnp.dot(a, b.T, preferred_element_type=jnp.float32))``, waited for with
    ``block_until_ready``. Returns fp32 [m, n] (a jax.Array)."""
    jax, jnp = _jax()
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != BF16_DTYPE or b.dtype != BF16_DTYPE or a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise TypeError(f"jax_bf16_gemm needs bfloat16 a [m, k] and b [n, k], got {a.dtype=} {a.shape=} "
                        f"{b.dtype=} {b.shape=}")
    fn = jax.jit(lambda x, y: jnp.dot(x, y.T, preferred_element_type=jnp.float32))
    da, db = jax.device_put(a), jax.device_put(b)
    return lambda: fn(da, db).block_until_ready()


def _jax_scale(jnp, x, sf, k: int):
    """x fp32 [mn, k] times its per-32-block scales sf [mn, ceil(k/32)] (k a multiple of 32 or not)."""
    mn = x.shape[0]
    blocks = sf.shape[1]
    pad = blocks * 32 - k
    if pad:
        x = jnp.pad(x, ((0, 0), (0, pad)))
    return (x.reshape(mn, blocks, 32) * sf[:, :, None]).reshape(mn, blocks * 32)[:, :k]


def jax_fp8_gemm(a: np.ndarray, sfa: np.ndarray, b: np.ndarray, sfb: np.ndarray) -> Callable[[], object]:
    """A zero-argument call of the FP8 GEMM as a JAX user writes it: one jit-compiled function doing the decode
    (``astype(jnp.float32)`` of float8_e4m3fn), the block scaling and ``jnp.dot`` with fp32 accumulation, cast to
    bf16; operands placed on the device once, the result waited for. Arguments as ``numpy_fp8_gemm``."""
    jax, jnp = _jax()
    a, b = _fp8_codes("a", a), _fp8_codes("b", b)
    (m, k), (n, k_b) = a.shape, b.shape
    _check_k(a, b, k, k_b)
    sfa, sfb = _scales("sfa", sfa, m, k), _scales("sfb", sfb, n, k)

    def gemm(x, sx, y, sy):
        x = _jax_scale(jnp, x.astype(jnp.float32), sx, k)
        y = _jax_scale(jnp, y.astype(jnp.float32), sy, k)
        return jnp.dot(x, y.T, preferred_element_type=jnp.float32).astype(jnp.bfloat16)

    fn = jax.jit(gemm)
    args = [jax.device_put(v) for v in (a.view(FP8_DTYPE), sfa, b.view(FP8_DTYPE), sfb)]
    return lambda: fn(*args).block_until_ready()


def jax_fp4_gemm(a: np.ndarray, sfa: np.ndarray, b: np.ndarray, sfb: np.ndarray) -> Callable[[], object]:
    """A zero-argument call of the FP4 GEMM in JAX: jit-compiled nibble unpack, 16-entry table decode, block
    scaling and ``jnp.dot`` (fp32 accumulation), cast to bf16. Arguments as ``numpy_fp4_gemm``."""
    jax, jnp = _jax()
    a, b = _fp4_packed("a", a), _fp4_packed("b", b)
    m, n, k = a.shape[0], b.shape[0], 2 * a.shape[1]
    _check_k(a, b, k, 2 * b.shape[1])
    sfa, sfb = _scales("sfa", sfa, m, k), _scales("sfb", sfb, n, k)
    table = E2M1_DECODE_TABLE.astype(np.float32)

    def decode(p, sf, lut):
        codes = jnp.stack([p & 0xF, p >> 4], axis=-1).reshape(p.shape[0], k)
        return _jax_scale(jnp, lut[codes], sf, k)

    def gemm(x, sx, y, sy, lut):
        return jnp.dot(decode(x, sx, lut), decode(y, sy, lut).T, preferred_element_type=jnp.float32).astype(
            jnp.bfloat16)

    fn = jax.jit(gemm)
    args = [jax.device_put(v) for v in (a, sfa, b, sfb, table)]
    return lambda: fn(*args).block_until_ready()
