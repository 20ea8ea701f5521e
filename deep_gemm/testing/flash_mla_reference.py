"""FlashMLA sparse attention in float64 numpy, the references the kernels are tested against, with FlashMLA's
semantics (its tests/ref.py): invalid indices (-1, < 0 or >= the token count, or past topk_length) attend to
nothing; a query head with no valid token ("lonely") gets out 0 and lse +inf; the attention sink scales the output by
1 / (1 + exp(sink - lse)) and leaves lse and max_logits alone. Also the cache quantisers and dequantisers of the
three token layouts and FlashMLA's allclose check (its tests/lib.py contract, our own code).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..utils.formats import decode_e4m3

BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)

# NOTES: the three token layouts (bytes per token): V3.2 656 (512 e4m3 NoPE, 4 fp32 scales per 128, 64 bf16 RoPE),
# V4.1 FP8 528 (512 e4m3 of 448 NoPE + 64 RoPE, 16 UE8M0 exponents per 32), V4.1 FP4 288 (256 bytes of e2m1
# pairs, even element low, 32 e4m3 scales per 16).
TOKEN_BYTES = {"v32_fp8": 656, "v41_fp8": 528, "v41_fp4": 288}
HEAD_DIMS = {"v32_fp8": 576, "v41_fp8": 512, "v41_fp4": 512}
# NOTES: FlashMLA's tests name the layouts by an enum (quant.KVCacheLayout / FP8KVCacheLayout); its member names
# are accepted too (a member itself through its .name).
LAYOUT_ALIASES = {"V32_FP8Sparse": "v32_fp8", "V41_FP8Sparse": "v41_fp8", "MODEL1_FP8Sparse": "v41_fp8",
                  "V41_FP4Sparse": "v41_fp4"}
_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)


# ---------------------------------------------------------------------------------------------------------------
# Quantisers (bf16 / fp32 [num_blocks, page, 1, d] -> uint8 [num_blocks, page, 1, bytes]) and dequantisers

def _ue8m0_scale(amax: np.ndarray) -> np.ndarray:
    """2^ceil(log2(max(amax / 448, 1e-4))) in fp32 (the FP8 layouts' power-of-two scales)."""
    x = np.maximum(amax.astype(np.float32) / np.float32(448.0), np.float32(1e-4))
    return np.exp2(np.ceil(np.log2(x))).astype(np.float32)


def _to_e4m3_codes(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(E4M3).view(np.uint8)


def _e2m1_codes(x: np.ndarray) -> np.ndarray:
    """Nearest e2m1 code (ties to the even code, saturating at +-6; NaN -> 0) of fp32 ``x``, as uint8."""
    x = np.asarray(x, np.float32)
    sign = np.signbit(x).astype(np.uint8) << 3
    a = np.minimum(np.nan_to_num(np.abs(x), nan=0.0, posinf=6.0), 6.0)
    mids = (_E2M1[:-1] + _E2M1[1:]) / 2
    code = np.searchsorted(mids, a, side="right").astype(np.uint8)
    lower = np.searchsorted(mids, a, side="left").astype(np.uint8)
    tie = np.isin(a, mids)
    code = np.where(tie, lower + (lower & 1), code).astype(np.uint8)
    return sign | code


def _layout(layout) -> str:
    name = getattr(layout, "name", layout)
    name = LAYOUT_ALIASES.get(name, name)
    if name not in TOKEN_BYTES:
        raise ValueError(f"layout must be one of {sorted(TOKEN_BYTES)} (or {sorted(LAYOUT_ALIASES)}), got {layout!r}")
    return name


def quantize_k_cache(k_cache: np.ndarray, layout: str) -> np.ndarray:
    """The uint8 cache [num_blocks, page, 1, TOKEN_BYTES[layout]] of ``k_cache`` [num_blocks, page, 1, d] (bf16 or
    fp32 values; d = HEAD_DIMS[layout]), as FlashMLA's tests/quant.py quantize_k_cache builds it."""
    layout = _layout(layout)
    k = np.asarray(k_cache)
    d = HEAD_DIMS[layout]
    if k.ndim != 4 or k.shape[2] != 1 or k.shape[3] != d:
        raise ValueError(f"k_cache must be [num_blocks, page, 1, {d}] for {layout}, got {k.shape}")
    nb, page = k.shape[:2]
    x = k[:, :, 0, :].astype(np.float32)
    out = np.zeros((nb, page, TOKEN_BYTES[layout]), np.uint8)
    if layout == "v32_fp8":
        for t in range(4):
            blk = x[..., t * 128:(t + 1) * 128]
            s = _ue8m0_scale(np.abs(blk).max(axis=-1))
            out[..., t * 128:(t + 1) * 128] = _to_e4m3_codes(blk / s[..., None])
            out[..., 512 + 4 * t:516 + 4 * t] = s[..., None].view(np.uint8)
        out[..., 528:] = x[..., 512:].astype(BF16).view(np.uint8).reshape(nb, page, 128)
    elif layout == "v41_fp8":
        for t in range(16):
            blk = x[..., t * 32:(t + 1) * 32]
            s = _ue8m0_scale(np.abs(blk).max(axis=-1))
            out[..., t * 32:(t + 1) * 32] = _to_e4m3_codes(blk / s[..., None])
            out[..., 512 + t] = (s.view(np.uint32) >> 23).astype(np.uint8)
    else:
        tiles = x.reshape(nb, page, 32, 16)
        amax = np.nan_to_num(np.abs(tiles), nan=np.inf).max(axis=-1)
        scale = np.clip(amax / np.float32(6.0), np.float32(2.0 ** -9), np.float32(448.0)).astype(E4M3)
        scale = np.where(np.isinf(amax), np.float32(np.nan), scale.astype(np.float32)).astype(E4M3)
        codes = _e2m1_codes(tiles / scale.astype(np.float32)[..., None]).reshape(nb, page, 512)
        out[..., :256] = codes[..., 0::2] | (codes[..., 1::2] << 4)
        out[..., 256:] = scale.view(np.uint8)
    return out.reshape(nb, page, 1, -1)


def dequantize_k_cache(cache: np.ndarray, layout: str) -> np.ndarray:
    """The bf16 values [num_blocks, page, 1, d] a cache of ``layout`` stores (FlashMLA's dequantize_k_cache: the
    V3.2 NoPE scaled in fp32 and rounded to bf16; the V4.1 products exact in bf16)."""
    layout = _layout(layout)
    c = np.ascontiguousarray(cache).view(np.uint8)
    nb, page = c.shape[:2]
    c = c.reshape(nb, page, -1)[..., :TOKEN_BYTES[layout]]
    values = decode_e4m3(np.arange(256, dtype=np.uint8)).astype(np.float32)
    if layout == "v32_fp8":
        nope = values[c[..., :512]].reshape(nb, page, 4, 128)
        s = np.ascontiguousarray(c[..., 512:528]).view(np.float32)
        out = np.concatenate([(nope * s[..., None]).reshape(nb, page, 512),
                              np.ascontiguousarray(c[..., 528:656]).view(BF16).astype(np.float32)], axis=-1)
    elif layout == "v41_fp8":
        s = np.exp2(c[..., 512:528].astype(np.float32) - 127)
        out = (values[c[..., :512]].reshape(nb, page, 16, 32) * s[..., None]).reshape(nb, page, 512)
    else:
        lo, hi = c[..., :256] & 15, c[..., :256] >> 4
        codes = np.stack([lo, hi], axis=-1).reshape(nb, page, 512)
        v = np.where(codes & 8, -_E2M1[codes & 7], _E2M1[codes & 7])
        s = values[c[..., 256:288]]
        out = (v.reshape(nb, page, 32, 16) * s[..., None]).reshape(nb, page, 512)
    return out.astype(BF16).reshape(nb, page, 1, -1)


def abs_indices2indices_in_kvcache(abs_indices: np.ndarray, block_table: np.ndarray, page_size: int) -> np.ndarray:
    """Logical token indices [b, s_q, topk] (-1: none) -> the kernels' cache indices block * page + slot."""
    abs_indices = np.asarray(abs_indices)
    invalid = abs_indices < 0
    a = np.where(invalid, 0, abs_indices)
    b = np.arange(abs_indices.shape[0])[:, None, None]
    out = block_table[b, a // page_size] * page_size + a % page_size
    return np.where(invalid, -1, out).astype(np.int32)


# ---------------------------------------------------------------------------------------------------------------
# Attention references

def _attend(q: np.ndarray, kv: np.ndarray, valid: np.ndarray, sm_scale: float, d_v: int, sink: np.ndarray | None):
    """q [n, h, d], kv [n, t, d] (gathered, float64), valid [n, t] -> out [n, h, d_v], max_logits, lse [n, h]."""
    kv = np.where(valid[..., None], kv, 0.0)
    p = np.einsum("nhd,ntd->nht", q, kv) * sm_scale
    p = np.where(valid[:, None, :], p, -np.inf)
    max_logits = p.max(axis=-1, initial=-np.inf)
    safe = np.where(np.isfinite(max_logits), max_logits, 0.0)
    with np.errstate(divide="ignore"):
        lse = safe + np.log(np.exp(p - safe[..., None]).sum(axis=-1))
    lonely = ~np.isfinite(lse)
    e = np.exp(p - np.where(lonely, 0.0, lse)[..., None])
    out = np.einsum("nht,ntd->nhd", e, kv[..., :d_v])
    if sink is not None:
        with np.errstate(over="ignore", invalid="ignore"):
            factor = 1.0 / (1.0 + np.exp(sink.astype(np.float64)[None, :] - lse))
        out = out * np.where(lonely, 0.0, factor)[..., None]
    out[lonely] = 0.0
    lse = np.where(lonely, np.inf, lse)
    return out, max_logits, lse


def ref_sparse_prefill(q, kv, indices, sm_scale: float, d_v: int = 512, attn_sink=None, topk_length=None):
    """flash_mla_sparse_fwd in float64: q [s_q, h_q, d_qk], kv [s_kv, 1, d_qk], indices [s_q, 1, topk] ->
    (out [s_q, h_q, d_v] float64, max_logits [s_q, h_q], lse [s_q, h_q])."""
    q = np.asarray(q).astype(np.float64)
    kv = np.asarray(kv).astype(np.float64)[:, 0, :]
    idx = np.asarray(indices)[:, 0, :].astype(np.int64)
    s_q, topk = idx.shape
    valid = (idx >= 0) & (idx < kv.shape[0])
    if topk_length is not None:
        valid &= np.arange(topk)[None, :] < np.asarray(topk_length)[:, None]
    g = kv[np.where(valid, idx, 0)]
    return _attend(q, g, valid, sm_scale, d_v, None if attn_sink is None else np.asarray(attn_sink))


def _gather_cache(cache_values: np.ndarray, idx: np.ndarray, length):
    """cache values [blocks, page, 1, d] (float64), cache indices [n, topk] -> gathered [n, topk, d], valid."""
    flat = cache_values.reshape(-1, cache_values.shape[-1])
    idx = idx.astype(np.int64)
    valid = (idx >= 0) & (idx < flat.shape[0])
    if length is not None:
        valid &= np.arange(idx.shape[1])[None, :] < np.asarray(length)[:, None]
    g = flat[np.where(valid, idx, 0)]
    return np.nan_to_num(g, nan=0.0), valid


def ref_sparse_decode(q, cache_values, indices, sm_scale: float, d_v: int = 512, attn_sink=None, topk_length=None,
                      extra_cache_values=None, extra_indices=None, extra_topk_length=None):
    """flash_mla_with_kvcache's sparse decode in float64 on dequantized caches (dequantize_k_cache): q [b, s_q, h_q,
    d], indices [b, s_q, topk] (block * page + slot), topk_length [b] -> (out [b, s_q, h_q, d_v], lse [b, h_q, s_q])."""
    q = np.asarray(q).astype(np.float64)
    b, s_q, h_q, d = q.shape
    n = b * s_q

    def rows(x):
        return None if x is None else np.repeat(np.asarray(x), s_q)

    g, valid = _gather_cache(np.asarray(cache_values).astype(np.float64), np.asarray(indices).reshape(n, -1),
                             rows(topk_length))
    if extra_cache_values is not None:
        g1, v1 = _gather_cache(np.asarray(extra_cache_values).astype(np.float64),
                               np.asarray(extra_indices).reshape(n, -1), rows(extra_topk_length))
        g, valid = np.concatenate([g, g1], axis=1), np.concatenate([valid, v1], axis=1)
    out, _, lse = _attend(q.reshape(n, h_q, d), g, valid, sm_scale, d_v,
                          None if attn_sink is None else np.asarray(attn_sink))
    return out.reshape(b, s_q, h_q, d_v), lse.reshape(b, s_q, h_q).transpose(0, 2, 1)


# ---------------------------------------------------------------------------------------------------------------
# FlashMLA's comparison (its tests' check_is_allclose contract)

def cos_diff(x: np.ndarray, y: np.ndarray) -> float:
    """1 - 2 sum(x y) / sum(x^2 + y^2) in float64 (0 when both are all zero)."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    den = float((x * x + y * y).sum())
    return 0.0 if den == 0 else 1.0 - 2.0 * float((x * y).sum()) / den


def check_allclose(name: str, ans, ref, abs_tol: float, rel_tol: float, cos_diff_tol: float | None = None) -> None:
    """Raise AssertionError unless ``ans`` matches ``ref`` as FlashMLA's tests require: +-inf and NaN at the same
    places; every other element within abs_tol or rel_tol; the cosine difference within cos_diff_tol."""
    ans = np.asarray(ans, np.float64).copy()
    ref = np.asarray(ref, np.float64).copy()
    assert ans.shape == ref.shape, f"{name}: shape {ans.shape} != {ref.shape}"
    for kind, mask_of in (("+inf", lambda x: x == np.inf), ("-inf", lambda x: x == -np.inf), ("nan", np.isnan)):
        ma, mr = mask_of(ans), mask_of(ref)
        assert np.array_equal(ma, mr), f"{name}: {kind} at {int(ma.sum())} places in ans, {int(mr.sum())} in ref"
        ans[ma] = 0.0
        ref[mr] = 0.0
    err = np.abs(ans - ref)
    rel = err / (np.abs(ref) + 1e-6)
    bad = (err >= abs_tol) & (rel >= rel_tol)
    assert not bad.any(), (f"{name}: {int(bad.sum())} of {bad.size} elements off; max abs err {err.max():.3g}, "
                           f"max rel err {np.where(err >= abs_tol, rel, 0).max():.3g}")
    if cos_diff_tol is not None:
        cd = cos_diff(ans, ref)
        assert abs(cd) <= cos_diff_tol, f"{name}: cos_diff {cd:.3g} > {cos_diff_tol}"
