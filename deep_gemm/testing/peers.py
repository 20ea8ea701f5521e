"""The GEMMs a user would otherwise write, as the benches' peers: the strongest numpy formulation (256-entry lookup
table decode, in-place block scaling, fp32 matmul, cast to bf16), the naive ``astype`` one for reference, JAX
(jit-compiled, when the optional ``peers`` extra is installed) and torch on the CPU (the optional ``torch`` extra;
oneDNN / MKL, on the AMX unit where the CPU has one), at its default thread count or a given one. Timing is the
benches' business, not this module's.
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


# ---------------------------------------------------------------------------------------------------------------
# torch on the CPU (optional: pip install deep_gemm[torch])
# ---------------------------------------------------------------------------------------------------------------
# NOTES: torch's thread count is process-wide; a bench that times torch at several counts gives each its own
# library entry whose every call sets its count first (torch_at_threads). The default is read once, before any
# peer changed it: the count a user's process starts with (torch picks the physical cores it may use).
_TORCH_DEFAULT_THREADS: int | None = None


def torch_version() -> str | None:
    """The installed torch's version, or None when torch cannot be imported."""
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__


def _torch():
    global _TORCH_DEFAULT_THREADS
    try:
        import torch
    except ImportError as exc:
        raise ImportError("torch is not installed; the torch peer needs `pip install deep_gemm[torch]`") from exc
    if _TORCH_DEFAULT_THREADS is None:
        _TORCH_DEFAULT_THREADS = torch.get_num_threads()
    return torch


def torch_default_threads() -> int:
    """torch's intra-op thread count as this process started with it (read on the first torch peer call)."""
    _torch()
    return _TORCH_DEFAULT_THREADS


def torch_thread_counts() -> list[int]:
    """The thread counts a bench tries torch at to find its best: 1 .. the CPUs this process may use."""
    import os

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return list(range(1, usable + 1))


def torch_at_threads(fn: Callable[[], object], threads: int) -> Callable[[], object]:
    """``fn`` with torch's intra-op thread count set to ``threads`` before every call (cheap when unchanged; the
    pool resizes on the first call after another count ran, which bench_steady's discarded calls absorb)."""
    torch = _torch()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an int >= 1, got threads={threads!r}")

    def call():
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        return fn()

    return call


def torch_variants(fn: Callable[[], object], name: str = "torch") -> dict[str, Callable[[], object]]:
    """The torch entries of a bench: ``name`` at torch's default thread count and ``f"{name}-{t}t"`` at every
    other count of torch_thread_counts(), each a separate library for bench_steady (its own steady state)."""
    default = torch_default_threads()
    out = {name: torch_at_threads(fn, default)}
    for t in torch_thread_counts():
        if t != default:
            out[f"{name}-{t}t"] = torch_at_threads(fn, t)
    return out


def torch_tensor(x: np.ndarray):
    """A CPU torch tensor over ``x``'s memory (bfloat16 / float8_e4m3fn as torch's own dtypes), zero-copy."""
    from .._torch import to_torch

    _torch()
    return to_torch(np.asarray(x))


def torch_decode_fp8(x, sf, k: int):
    """torch float8_e4m3fn [..., mn, k] and fp32 scales [..., mn, ceil(k/32)] -> bf16 [..., mn, k]: the FP8 codes
    cast to bf16 (exact), then multiplied by their block scales in bf16 (exact for power-of-two scales)."""
    torch = _torch()
    out = x.to(torch.bfloat16)
    scales = sf.to(torch.bfloat16)
    if k % 32 == 0:
        out.view(*out.shape[:-1], k // 32, 32).mul_(scales.unsqueeze(-1))
    else:
        out.mul_(scales.repeat_interleave(32, dim=-1)[..., :k])
    return out


def torch_bf16_gemm(a: np.ndarray, b: np.ndarray) -> Callable[[], object]:
    """A zero-argument call of torch's BF16 GEMM as a torch user writes it, ``a @ b.T`` on CPU bf16 tensors (a
    [m, k], b [n, k]; torch accumulates in fp32 and returns bf16 [m, n]), at whatever thread count torch has."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != BF16_DTYPE or b.dtype != BF16_DTYPE or a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise TypeError(f"torch_bf16_gemm needs bfloat16 a [m, k] and b [n, k], got {a.dtype=} {a.shape=} "
                        f"{b.dtype=} {b.shape=}")
    ta, tb = torch_tensor(a), torch_tensor(b)
    return lambda: ta @ tb.T


def torch_fp8_gemm(a: np.ndarray, sfa: np.ndarray, b: np.ndarray, sfb: np.ndarray) -> Callable[[], object]:
    """A zero-argument call of the FP8 GEMM as a torch user writes it: the operands stay float8_e4m3fn in memory
    and every call decodes them (torch_decode_fp8: cast to bf16, block scales applied), then ``x @ w.T`` (bf16,
    fp32 accumulation), bf16 [m, n]. Arguments as ``numpy_fp8_gemm``."""
    a, b = _fp8_codes("a", a), _fp8_codes("b", b)
    (m, k), (n, k_b) = a.shape, b.shape
    _check_k(a, b, k, k_b)
    sfa, sfb = _scales("sfa", sfa, m, k), _scales("sfb", sfb, n, k)
    ta, tsa = torch_tensor(np.ascontiguousarray(a).view(FP8_DTYPE)), torch_tensor(sfa)
    tb, tsb = torch_tensor(np.ascontiguousarray(b).view(FP8_DTYPE)), torch_tensor(sfb)
    return lambda: torch_decode_fp8(ta, tsa, k) @ torch_decode_fp8(tb, tsb, k).T
