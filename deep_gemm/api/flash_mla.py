"""FlashMLA's sparse attention with FlashMLA's public names and signatures: ``get_mla_metadata``,
``flash_mla_with_kvcache`` (sparse decode on the co-located FP8 KV cache) and ``flash_mla_sparse_fwd`` (sparse
prefill on bf16 q / kv). Checks (the Ascend limits of FlashMLA's kernels), early returns, dispatch; no compute here.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .checks import BF16, FP32, require_array
from .guard import api_call, protect

# NOTES: FlashMLA's Ascend limits (its tests/lib.py can_run_on_and_clamp): h_q == 64, d_qk == 512, a page size other
# than 1, an FP8 main cache, an FP8 or FP4 extra cache, s_q == 1 for the decode kernel (FlashMLA's test folds s_q
# into the batch; so does this call, which is exact: every query token is independent). Beyond them, CUDA FlashMLA's
# V3.2 shapes (d_qk 576: the 656-byte cache; prefill d_qk 576) are accepted, computed exactly the same way.
H_Q = 64
D_V = 512
LAYOUT_OF_TOKEN_BYTES = {528: "v41_fp8", 656: "v32_fp8", 288: "v41_fp4"}
D_QK_OF_LAYOUT = {"v41_fp8": 512, "v32_fp8": 576, "v41_fp4": 512}
_BYTE_DTYPES = ("uint8", "int8", "float8_e4m3fn")


@dataclasses.dataclass
class FlashMLASchedMeta:
    """FlashMLA's scheduler metadata: empty until the first flash_mla_with_kvcache call, which records the call's
    configuration; later calls with the same object must agree with it (as FlashMLA requires)."""

    @dataclasses.dataclass
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        topk: int | None
        extra_page_block_size: int | None
        extra_topk: int | None

    have_initialized: bool = False
    config: Config | None = None
    tile_scheduler_metadata: np.ndarray | None = None
    num_splits: np.ndarray | None = None


def get_mla_metadata(*args, **kwargs) -> tuple[FlashMLASchedMeta, None]:
    """(an empty FlashMLASchedMeta, None), as FlashMLA returns: the arguments are accepted and ignored (the old
    interface's); the metadata is filled by the first flash_mla_with_kvcache call."""
    return FlashMLASchedMeta(), None


# ---------------------------------------------------------------------------------------------------------------
# Argument checks shared by both calls

def _int32(x, name: str, shape: tuple[int, ...]) -> np.ndarray:
    x = require_array(x, name)
    if x.dtype != np.int32:
        raise TypeError(f"{name} must be int32, got {x.dtype=}")
    if x.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {x.shape=}")
    return np.ascontiguousarray(x)


def _sink(attn_sink, h_q: int) -> np.ndarray | None:
    if attn_sink is None:
        return None
    attn_sink = require_array(attn_sink, "attn_sink")
    if attn_sink.dtype != FP32 or attn_sink.shape != (h_q,):
        raise ValueError(f"attn_sink must be float32 [h_q={h_q}], got {attn_sink.dtype=} {attn_sink.shape=}")
    return np.ascontiguousarray(attn_sink)


def _scale(x, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a float, got {type(x).__name__}: {x!r}")
    if not np.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x!r}")
    return float(x)


def _paged_cache(cache, name: str) -> tuple[np.ndarray, str, int, int, int]:
    """(flat uint8 bytes, layout, num_tokens, page size, page bytes) of a [num_blocks, page, 1, token bytes] cache."""
    cache = require_array(cache, name)
    if cache.dtype.name not in _BYTE_DTYPES:
        raise TypeError(f"{name} must hold bytes ({'/'.join(_BYTE_DTYPES)}), got {cache.dtype=}")
    if cache.ndim != 4 or cache.shape[2] != 1:
        raise ValueError(f"{name} must be [num_blocks, page_block_size, 1, bytes_per_token], got {cache.shape=}")
    num_blocks, page, _, token = cache.shape
    if token not in LAYOUT_OF_TOKEN_BYTES:
        raise ValueError(f"{name}: {token} bytes per token is none of the layouts {LAYOUT_OF_TOKEN_BYTES}")
    if page == 1:
        raise ValueError(f"{name}: page_block_size 1 is not supported (FlashMLA's Ascend kernels need > 1)")
    if num_blocks and (cache.strides[3] != 1 or cache.strides[1] != token or cache.strides[0] < page * token):
        raise ValueError(f"{name} must be contiguous within each page block (strides (>= {page * token}, {token}, "
                         f"*, 1)), got {cache.strides=}")
    page_bytes = cache.strides[0] if num_blocks > 1 else page * token
    if page_bytes % 4:
        raise ValueError(f"{name}: the page block stride {page_bytes} must be a multiple of 4 bytes (the fp32 fields)")
    span = (num_blocks - 1) * page_bytes + page * token if num_blocks else 0
    flat = np.lib.stride_tricks.as_strided(cache.view(np.uint8), shape=(span,), strides=(1,))
    return flat, LAYOUT_OF_TOKEN_BYTES[token], num_blocks * page, page, page_bytes


def _check_meta(meta, config: FlashMLASchedMeta.Config) -> None:
    if not isinstance(meta, FlashMLASchedMeta):
        raise TypeError(f"tile_scheduler_metadata must be the FlashMLASchedMeta of get_mla_metadata(), got "
                        f"{type(meta).__name__}")
    if meta.have_initialized and meta.config != config:
        raise ValueError(f"the call disagrees with tile_scheduler_metadata ({meta.config} vs {config}); use one "
                         f"FlashMLASchedMeta per configuration")


# ---------------------------------------------------------------------------------------------------------------
# Sparse decode

@api_call
def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v: int, tile_scheduler_metadata,
                           num_splits=None, softmax_scale: float | None = None, causal: bool = False,
                           is_fp8_kvcache: bool = False, indices=None, attn_sink=None, extra_k_cache=None,
                           extra_indices_in_kvcache=None, topk_length=None, extra_topk_length=None):
    """FlashMLA's sparse decode: (out bf16 [b, s_q, h_q, 512], lse float32 [b, h_q, s_q]).

    q: bf16 [b, s_q, 64, d_qk]; k_cache: bytes [num_blocks, page, 1, token bytes], the token layout by its size: 528
    (V4.1 FP8: 512 e4m3 then 16 UE8M0 exponents per 32 dims, d_qk 512) or 656 (V3.2: 512 e4m3 NoPE, 4 fp32 scales,
    64 bf16 RoPE, d_qk 576); indices: int32 [b, s_q, topk], block * page + slot, -1 (or outside the cache) for none;
    topk_length: int32 [b] (only the first topk_length[i] indices count); attn_sink: float32 [64] (out *= 1 / (1 +
    exp(sink - lse)); lse unchanged); extra_k_cache (528 B FP8 or 288 B FP4 tokens next to a V4.1 main cache) with
    extra_indices_in_kvcache [b, s_q, extra_topk] and extra_topk_length [b]: more tokens in the same softmax.
    softmax_scale defaults to d_qk ** -0.5. block_table / cache_seqlens are not read (sparse mode). A head with no
    valid token gets out 0 and lse +inf. Only sparse decode (indices given) is implemented. Reads
    runtime.get_num_ai_cores(), get_arch_spec().
    """
    # Argument checks (nothing is written before they all pass)
    q = require_array(q, "q")
    if q.dtype != BF16 or q.ndim != 4:
        raise TypeError(f"q must be bfloat16 [b, s_q, h_q, d_qk], got {q.dtype=} {q.shape=}")
    b, s_q, h_q, d_qk = q.shape
    if indices is None:
        raise ValueError("indices is None: dense decode (block_table / cache_seqlens) is not implemented here; "
                         "only FlashMLA's sparse decode is")
    if h_q != H_Q:
        raise ValueError(f"h_q={h_q}: FlashMLA's Ascend decode kernel takes h_q == {H_Q} only")
    if num_splits is not None:
        raise ValueError(f"num_splits must be None (FlashMLA's interface), got {num_splits!r}")
    if causal:
        raise ValueError("causal must be False when sparse attention is enabled (indices given)")
    if not is_fp8_kvcache:
        raise ValueError("is_fp8_kvcache must be True when sparse attention is enabled (the FP8 main cache)")
    if head_dim_v != D_V:
        raise ValueError(f"head_dim_v={head_dim_v!r} must be {D_V}")
    cache, layout, num_tokens, page, page_bytes = _paged_cache(k_cache, "k_cache")
    if layout == "v41_fp4":
        raise ValueError("k_cache: the FP4 (288-byte) layout is allowed only as extra_k_cache, next to an FP8 cache")
    if d_qk != D_QK_OF_LAYOUT[layout]:
        raise ValueError(f"q's d_qk={d_qk} does not match the {layout} cache (d_qk {D_QK_OF_LAYOUT[layout]})")
    idx = require_array(indices, "indices")
    if idx.ndim != 3 or idx.shape[:2] != (b, s_q):
        raise ValueError(f"indices must be [b={b}, s_q={s_q}, topk], got {idx.shape=}")
    topk = idx.shape[2]
    idx = _int32(idx, "indices", (b, s_q, topk))
    t_len = None if topk_length is None else _int32(topk_length, "topk_length", (b,))
    sink = _sink(attn_sink, h_q)
    scale = d_qk ** -0.5 if softmax_scale is None else _scale(softmax_scale, "softmax_scale")
    extra = None
    if (extra_k_cache is None) != (extra_indices_in_kvcache is None):
        raise ValueError("extra_k_cache and extra_indices_in_kvcache come together (both or neither)")
    if extra_topk_length is not None and extra_k_cache is None:
        raise ValueError("extra_topk_length needs extra_k_cache")
    extra_page = extra_topk = None
    if extra_k_cache is not None:
        e_cache, e_layout, e_tokens, extra_page, e_page_bytes = _paged_cache(extra_k_cache, "extra_k_cache")
        allowed = ("v32_fp8",) if layout == "v32_fp8" else ("v41_fp8", "v41_fp4")
        if e_layout not in allowed:
            raise ValueError(f"extra_k_cache: the {e_layout} layout cannot extend a {layout} cache ({allowed=})")
        e_idx = require_array(extra_indices_in_kvcache, "extra_indices_in_kvcache")
        if e_idx.ndim != 3 or e_idx.shape[:2] != (b, s_q):
            raise ValueError(f"extra_indices_in_kvcache must be [b={b}, s_q={s_q}, extra_topk], got {e_idx.shape=}")
        extra_topk = e_idx.shape[2]
        e_idx = _int32(e_idx, "extra_indices_in_kvcache", (b, s_q, extra_topk))
        e_len = None if extra_topk_length is None else _int32(extra_topk_length, "extra_topk_length", (b,))
        extra = (e_cache, e_layout, e_idx.reshape(b * s_q, extra_topk),
                 None if e_len is None else np.repeat(e_len, s_q), e_tokens, extra_page, e_page_bytes)
    config = FlashMLASchedMeta.Config(b, s_q, h_q, page, 1, bool(causal), bool(is_fp8_kvcache), topk, extra_page,
                                      extra_topk)
    _check_meta(tile_scheduler_metadata, config)
    if not tile_scheduler_metadata.have_initialized:
        tile_scheduler_metadata.have_initialized = True
        tile_scheduler_metadata.config = config

    # Early return: no query token
    out = np.zeros((b, s_q, h_q, D_V), BF16)
    lse = np.full((b, h_q, s_q), np.inf, np.float32)
    if b * s_q == 0:
        return out, lse

    # Dispatch: s_q folded into the batch (one unit per query token); a main-only call runs the kernel whose
    # extra cache has the main layout, with no extra token (one compiled kernel for both)
    protect(out, lse, work=4.0 * b * s_q * h_q * (topk + (extra_topk or 0)) * (d_qk + D_V))
    from ..kernels.flash_mla import fold_lse, launch_flash_mla

    units = b * s_q
    if extra is None:
        extra = (None, layout, np.zeros((units, 0), np.int32), None, 0, page, 0)
    out_bits = out.reshape(units * h_q, D_V).view(np.uint16)
    q_bits = np.ascontiguousarray(q).reshape(units * h_q, d_qk).view(np.uint16)
    stats = launch_flash_mla("decode", q_bits, cache, layout, idx.reshape(units, topk),
                             None if t_len is None else np.repeat(t_len, s_q), num_tokens, page, page_bytes,
                             out_bits, scale, sink, extra=extra)
    lse_flat, _ = fold_lse(stats)
    lse[...] = lse_flat.reshape(b, s_q, h_q).transpose(0, 2, 1)
    return out, lse


# ---------------------------------------------------------------------------------------------------------------
# Sparse prefill

@api_call
def flash_mla_sparse_fwd(q, kv, indices, sm_scale: float, d_v: int = 512, attn_sink=None, topk_length=None):
    """FlashMLA's sparse prefill: (out bf16 [s_q, h_q, 512], max_logits float32 [s_q, h_q], lse float32 [s_q, h_q]).

    q: bf16 [s_q, 64, d_qk]; kv: bf16 [s_kv, 1, d_qk], C-contiguous (as the Ascend kernel needs); d_qk 512 (576
    accepted: CUDA FlashMLA's V3.2 shape); indices: int32 [s_q, 1, topk], < 0 or >= s_kv for none; topk_length:
    int32 [s_q] (only indices[i, :, :topk_length[i]] count); attn_sink: float32 [64] (out *= exp(lse) / (exp(lse) +
    exp(sink)); max_logits and lse unchanged). A head with no valid token: out 0, max_logits -inf, lse +inf.
    Reads runtime.get_num_ai_cores(), get_arch_spec().
    """
    # Argument checks (nothing is written before they all pass)
    q = require_array(q, "q")
    kv = require_array(kv, "kv")
    if q.dtype != BF16 or q.ndim != 3:
        raise TypeError(f"q must be bfloat16 [s_q, h_q, d_qk], got {q.dtype=} {q.shape=}")
    if kv.dtype != BF16 or kv.ndim != 3:
        raise TypeError(f"kv must be bfloat16 [s_kv, h_kv, d_qk], got {kv.dtype=} {kv.shape=}")
    s_q, h_q, d_qk = q.shape
    s_kv, h_kv, d_kv = kv.shape
    if h_q != H_Q:
        raise ValueError(f"h_q={h_q}: FlashMLA's Ascend prefill kernel takes h_q == {H_Q} only")
    if d_qk not in (512, 576):
        raise ValueError(f"d_qk={d_qk} must be 512 (the Ascend kernel) or 576 (CUDA FlashMLA's V3.2 shape)")
    if h_kv != 1 or d_kv != d_qk:
        raise ValueError(f"kv must be [s_kv, 1, d_qk={d_qk}], got {kv.shape=}")
    if not kv.flags.c_contiguous:
        raise ValueError(f"kv must be contiguous (FlashMLA's Ascend kernel), got strides {kv.strides}")
    if d_v != D_V:
        raise ValueError(f"d_v={d_v!r} must be {D_V}")
    idx = require_array(indices, "indices")
    if idx.ndim != 3 or idx.shape[:2] != (s_q, 1):
        raise ValueError(f"indices must be [s_q={s_q}, h_kv=1, topk], got {idx.shape=}")
    topk = idx.shape[2]
    idx = _int32(idx, "indices", (s_q, 1, topk))
    t_len = None if topk_length is None else _int32(topk_length, "topk_length", (s_q,))
    sink = _sink(attn_sink, h_q)
    scale = _scale(sm_scale, "sm_scale")

    # Early return: no query token, or no index at all
    out = np.zeros((s_q, h_q, D_V), BF16)
    max_logits = np.full((s_q, h_q), -np.inf, np.float32)
    lse = np.full((s_q, h_q), np.inf, np.float32)
    if s_q == 0 or topk == 0 or s_kv == 0:
        return out, max_logits, lse

    # Dispatch
    protect(out, max_logits, lse, work=2.0 * s_q * h_q * topk * (d_qk + D_V))
    from ..kernels.flash_mla import fold_lse, launch_flash_mla

    stats = launch_flash_mla("prefill", np.ascontiguousarray(q).reshape(s_q * h_q, d_qk).view(np.uint16),
                             kv.reshape(-1).view(np.uint8), "bf16", idx.reshape(s_q, topk), t_len, s_kv, 1,
                             2 * d_qk, out.reshape(s_q * h_q, D_V).view(np.uint16), scale, sink)
    lse_flat, ml = fold_lse(stats)
    lse[...] = lse_flat.reshape(s_q, h_q)
    max_logits[...] = ml.reshape(s_q, h_q)
    return out, max_logits, lse
