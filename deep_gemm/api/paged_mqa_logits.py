"""MQA logits of decode against a paged KV cache: ``get_paged_mqa_logits_metadata`` / ``fp8_fp4_paged_mqa_logits``
(and CUDA DeepGEMM's legacy name ``fp8_paged_mqa_logits``), plus ``build_paged_kv_cache``.

Checks, early returns and layout preparation only (the shared checks are api/mqa_logits.py's); the logits are
computed by the paged kernel of deep_gemm/kernels/mqa_logits.py. Every check runs before anything is written.
"""

from __future__ import annotations

import numbers

import ml_dtypes
import numpy as np

from .. import runtime
from ..heuristics.mqa import (
    MQA_FP4_HEAD_DIMS,
    MQA_HEAD_DIMS,
    PAGE_SIZES,
    paged_atom_tokens,
    paged_token_bytes,
    paged_units,
    split_units,
    storage_bytes,
)
from .checks import FP32, require_array
from .guard import api_call, protect
from .mqa_logits import (
    _INT32,
    _check_heads_dim,
    _check_int,
    _check_int_array,
    _check_q,
    _check_weights,
    _first_bad,
    _kind,
    _logits_dtype,
    _mx_sf,
    _new_logits,
    _pair,
    _rows_view,
)

# ---------------------------------------------------------------------------------------------------------------
# Paged MQA logits (decode)


def _check_context_lens(context_lens: object, name: str = "context_lens") -> np.ndarray:
    """context_lens -> int32 [B, next_n] (a 1-D [B] means next_n = 1)."""
    c = require_array(context_lens, name)
    if c.dtype.kind not in "iu":
        raise TypeError(f"{name}.dtype={c.dtype} must be an integer type (int32)")
    if c.ndim == 1:
        c = c[:, None]
    if c.ndim != 2:
        raise ValueError(f"{name}.shape={c.shape} must be [batch] or [batch, next_n]")
    if c.size and c.min() < 0:
        idx = tuple(int(i) for i in np.argwhere(c < 0)[0])
        raise ValueError(f"{name}[{idx}]={c[idx]} is negative")
    if c.size and c.max() >= 2**31:
        raise ValueError(f"{name} holds values outside int32")
    return np.ascontiguousarray(c, dtype=np.int32)


def _schedule(context_lens: np.ndarray, num_heads: int, num_cores: int) -> np.ndarray:
    """int32 [num_cores + 1, 2]: core c's first (atom, unit); the last row is (num_atoms, 0)."""
    batch, next_n = context_lens.shape
    atom = paged_atom_tokens(next_n, num_heads)
    units = np.asarray(paged_units(context_lens.tolist(), atom), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(units)])  # first unit of each atom, then the total
    first = np.asarray(split_units(int(starts[-1]), num_cores), dtype=np.int64)
    # the atom holding each core's first unit (atoms without units are passed over); the total -> (num_atoms, 0).
    # NOTES: one searchsorted for all cores: a call per core was a third of a batch-1 decode call's time.
    a = np.searchsorted(starts[1:], first, side="right")
    inside = a < len(units)
    meta = np.zeros((num_cores + 1, 2), dtype=np.int32)
    meta[:, 0] = np.where(inside, a, len(units))
    meta[:, 1] = np.where(inside, first - starts[np.minimum(a, len(units))], 0)
    return meta


def _check_indices(indices: object, num_tokens: int) -> np.ndarray:
    """The varlen mode's indices: int32 [T], non-negative (each query token's request; a request is a run of equal
    consecutive entries, as upstream)."""
    idx = _check_int_array(indices, "indices", (num_tokens,))
    if idx.size and idx.min() < 0:
        t = _first_bad(idx < 0)
        raise ValueError(f"indices[{t}]={idx[t]} is negative (indices holds each query token's request id)")
    return idx


def _check_varlen(idx: np.ndarray, ctx: np.ndarray, bt: np.ndarray, pages: np.ndarray) -> None:
    """What DeepGEMM's varlen kernels assume of a request (a run of equal consecutive indices): its tokens share
    the block table row of its first token (they read that row) and none sees past the context of its last token
    (the request's context). The kernel here reads each token's own row; these checks make the two agree."""
    num_tokens = idx.shape[0]
    if num_tokens == 0:
        return
    starts = np.flatnonzero(np.concatenate([[True], idx[1:] != idx[:-1]]))
    run = np.repeat(np.arange(starts.size), np.diff(np.append(starts, num_tokens)))
    first = starts[run]
    last = np.append(starts[1:], num_tokens)[run] - 1
    lens = ctx[:, 0]
    if (lens > lens[last]).any():
        t = _first_bad(lens > lens[last])
        raise ValueError(f"context_lens[{t}]={lens[t]} exceeds context_lens[{last[t]}]={lens[last[t]]}, the context of "
                         f"its request indices[{t}]={idx[t]} (the request's last token): a request's tokens see at "
                         f"most its context")
    used = np.arange(bt.shape[1])[None, :] < pages[:, None]
    bad = used & (bt != bt[first])
    if bad.any():
        t, p = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"block_table[{t}, {p}]={bt[t, p]} differs from block_table[{first[t]}, {p}]="
                         f"{bt[first[t], p]}: tokens of one request (indices[{t}]={idx[t]}, from token {first[t]}) "
                         f"share its block table row")


@api_call
def get_paged_mqa_logits_metadata(context_lens, num_heads, indices=None):
    """The paged kernel's schedule: int32 [num_ai_cores + 1, 2], row c the (query atom, 256-key unit) where core c's
    share of the work starts, the last row the end (num_atoms, 0). A unit is one atom (the query tokens of a batch
    row taken together: min(next_n, 128 // num_heads)) against 256 keys; an atom has ceil(max context / 256) units;
    the shares differ by at most one unit.

    context_lens: int32 [B] or [B, next_n] (each query token's context length). num_heads: the q heads (a multiple
    of 4 in [4, 64]). The row count records the core count (runtime.get_num_ai_cores()); fp8_fp4_paged_mqa_logits
    refuses metadata built for another. ``indices`` (the varlen mode, DeepGEMM-Ascend's form): int32 [T], the request
    of each of the T query tokens, with context_lens [T, 1] (or [T]); every token is then its own atom (the schedule
    is that of T rows with next_n = 1). An int in its place is taken as CUDA DeepGEMM's num_sms (which must equal the
    core count).
    """
    ctx = _check_context_lens(context_lens)
    if isinstance(num_heads, bool) or not isinstance(num_heads, numbers.Integral):
        raise TypeError(f"num_heads must be an int, got {type(num_heads).__name__}: {num_heads!r}")
    _check_heads_dim(int(num_heads), MQA_HEAD_DIMS[0], "get_paged_mqa_logits_metadata")
    cores = runtime.get_num_ai_cores()
    if isinstance(indices, numbers.Integral) and not isinstance(indices, bool):
        # CUDA DeepGEMM's call (context_lens, block_kv, num_sms): its core count, which must be this one's
        if int(indices) != cores:
            raise ValueError(f"num_sms={indices} (CUDA DeepGEMM's third argument) differs from the {cores} AI cores "
                             f"the kernels run on (set_num_ai_cores)")
        indices = None
    if indices is not None:
        if ctx.shape[1] != 1:
            raise ValueError(f"context_lens.shape={np.shape(context_lens)}: with indices (varlen mode) it must be "
                             f"[num_tokens, 1] (one context length per query token)")
        _check_indices(indices, ctx.shape[0])
    return _schedule(ctx, int(num_heads), cores)


def _check_block_table(block_table: object, batch: int, pages: np.ndarray, num_blocks: int,
                       name: str = "block_table") -> np.ndarray:
    """int32 [B, max_blocks]; row b's first pages[b] entries must name pages of the cache."""
    bt = require_array(block_table, name)
    if bt.dtype.kind not in "iu":
        raise TypeError(f"{name}.dtype={bt.dtype} must be an integer type (int32)")
    if bt.ndim != 2 or bt.shape[0] != batch:
        raise ValueError(f"{name}.shape={bt.shape} must be [batch={batch}, max_blocks]")
    need = int(pages.max()) if pages.size else 0
    if need > bt.shape[1]:
        b = int(np.argmax(pages))
        raise ValueError(f"{name}.shape={bt.shape}: row {b} needs {need} pages for its context")
    used = np.arange(bt.shape[1])[None, :] < pages[:, None]
    bad = used & ((bt < 0) | (bt >= num_blocks))
    if bad.any():
        b, p = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name}[{b}, {p}]={bt[b, p]} points past the cache's {num_blocks} pages")
    return np.ascontiguousarray(bt, dtype=np.int32)


def _cache_kind(kv_cache: np.ndarray, head_dim: int, ascend: bool) -> str:
    """The cache's value dtype, from its token width (values plus scales)."""
    width = kv_cache.shape[-1]
    for kind in ("fp8", "fp4"):
        if width == paged_token_bytes(kind, head_dim, ascend):
            return kind
    layout = "Ascend" if ascend else "CUDA DeepGEMM"
    want = [paged_token_bytes(k, head_dim, ascend) for k in ("fp8", "fp4")]
    raise ValueError(f"kv_cache.shape={kv_cache.shape}: the {layout} layout with head_dim={head_dim} has {want[0]} "
                     f"(FP8) or {want[1]} (FP4) bytes per token")


@api_call
def fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
                             indices=None, use_ascend_kv_layout=False, logits_dtype=ml_dtypes.bfloat16):
    """Weighted-ReLU MQA logits of decode against a paged KV cache:

        logits[b * next_n + t, j] = sum_h relu(q[b, t, h, :] . kv[j, :] * kv_scale[j]) * weights[b * next_n + t, h]

    for j < context_lens[b, t], key j of batch row b in page block_table[b, j // page_size], slot j % page_size.
    q: float8_e4m3fn [B, next_n, H, D], or a pair (values, sf): FP8 or packed FP4 int8 [B, next_n, H, D / 2] with
    UE8M0 scales per 32 of head_dim (fp32 [B, next_n, H, D / 32], int16 [B, next_n, H, ceil(D / 64)] or int32
    [B, next_n, H]) or None; D 32 (FP8 only), 64 or 128. kv_cache: uint8 [num_blocks, page_size (32, 64 or 128), 1,
    token_bytes], C-contiguous:
    use_ascend_kv_layout=True: each token's values then its UE8M0 exponents (one per 32 of head_dim), token_bytes =
    D (FP4: D / 2) + D / 32; False (CUDA DeepGEMM's): a page's values, then the page's 4-byte scales (fp32 for FP8,
    packed UE8M0 for FP4), token_bytes = D (D / 2) + 4 (build_paged_kv_cache writes either). weights: bf16 / fp32
    [B * next_n, H]; context_lens: int32 [B] or [B, next_n], each <= max_context_len; block_table: int32
    [B, max_blocks]; schedule_meta: get_paged_mqa_logits_metadata(context_lens, H) for the current core count.

    ``indices`` (the varlen mode of DeepGEMM-Ascend and CUDA DeepGEMM): int32 [T], the request of each query token,
    with q [T, 1, H, D], weights [T, H], context_lens [T, 1] (each token's own context) and block_table [T,
    max_blocks] (each token's row; the tokens of a request, a run of equal consecutive indices, share their first
    token's row and see at most its last token's context: both refused otherwise). The result is bitwise that of the
    same call without indices (every token its own batch row). A bool in its place is taken as CUDA DeepGEMM's
    positional clean_logits (False only, as upstream).

    Returns logits [B * next_n, max_context_len] of ``logits_dtype`` (bfloat16, the default, or float32: the sums
    before the bf16 rounding; numpy, ml_dtypes or torch dtypes), row stride padded to 512 bytes; entries at or past a
    token's context are left as allocated (as upstream, there is no clean_logits here).
    """
    # CUDA DeepGEMM's positional clean_logits in the indices slot
    if isinstance(indices, (bool, np.bool_)):
        if indices:
            raise ValueError("clean_logits=True is not supported by the paged MQA logits (as in CUDA DeepGEMM)")
        indices = None
    if not isinstance(use_ascend_kv_layout, (bool, np.bool_)):
        raise TypeError(f"use_ascend_kv_layout must be a bool, got {use_ascend_kv_layout!r}")
    ascend = bool(use_ascend_kv_layout)
    out_dtype = _logits_dtype(logits_dtype)

    # q, weights, context
    if isinstance(q, np.ndarray):
        q = (q, None)
    qv, q_sf, q_kind, num_heads, head_dim = _check_q(q, paged=True)
    batch, next_n = qv.shape[:2]
    rows = batch * next_n
    w = _check_weights(weights, rows, num_heads)
    ctx = _check_context_lens(context_lens)
    if ctx.shape[0] != batch or ctx.shape[1] not in (1, next_n) or (ctx.shape[1] == 1 and next_n != 1):
        raise ValueError(f"context_lens.shape={ctx.shape} must be [batch={batch}, next_n={next_n}] (or [batch] when "
                         f"next_n == 1)")
    max_context_len = _check_int(max_context_len, "max_context_len")
    if ctx.size and ctx.max() > max_context_len:
        b, t = (int(i) for i in np.argwhere(ctx > max_context_len)[0])
        raise ValueError(f"context_lens[{b}, {t}]={ctx[b, t]} exceeds max_context_len={max_context_len}")

    # The cache and the block table
    cache = require_array(kv_cache, "kv_cache")
    if cache.dtype != np.uint8:
        raise TypeError(f"kv_cache.dtype={cache.dtype} must be uint8")
    if cache.ndim != 4 or cache.shape[2] != 1 or cache.shape[1] not in PAGE_SIZES:
        raise ValueError(f"kv_cache.shape={cache.shape} must be [num_blocks, page_size in {PAGE_SIZES}, 1, "
                         f"token_bytes]")
    if not cache.flags.c_contiguous:
        raise ValueError(f"kv_cache.strides={cache.strides} must be C-contiguous (each page one block of bytes)")
    kv_kind = _cache_kind(cache, head_dim, ascend)
    num_blocks, page_size = cache.shape[:2]
    pages = -(-ctx.max(axis=1) // page_size) if ctx.size else np.zeros(batch, np.int64)
    bt = _check_block_table(block_table, batch, pages, num_blocks)
    if indices is not None:
        # Varlen mode: T tokens, one per row
        if next_n != 1:
            raise ValueError(f"q[0].shape={qv.shape}: with indices (varlen mode) q must be [num_tokens, 1, num_heads, "
                             f"head_dim]")
        _check_varlen(_check_indices(indices, batch), ctx, bt, pages)

    # The schedule must be this call's, for this core count
    meta = require_array(schedule_meta, "schedule_meta")
    cores = runtime.get_num_ai_cores()
    if meta.dtype != _INT32 or meta.ndim != 2 or meta.shape[1] != 2:
        raise TypeError(f"schedule_meta must be int32 [num_ai_cores + 1, 2], got {meta.dtype} {meta.shape}")
    if meta.shape[0] != cores + 1:
        raise ValueError(f"schedule_meta.shape={meta.shape} was built for {meta.shape[0] - 1} AI cores; this call runs "
                         f"on {cores} (rebuild it with get_paged_mqa_logits_metadata after set_num_ai_cores)")
    want = _schedule(np.broadcast_to(ctx, (batch, next_n)), num_heads, cores)
    if not np.array_equal(meta, want):
        c = int(np.argwhere((meta != want).any(axis=1))[0][0])
        raise ValueError(f"schedule_meta[{c}]={meta[c].tolist()} is not the schedule of these context_lens and "
                         f"num_heads={num_heads} (expected {want[c].tolist()}): rebuild it with "
                         f"get_paged_mqa_logits_metadata")
    sfq = None if q_sf is None else _mx_sf(q_sf, rows * num_heads, head_dim, "q[1]", (batch, next_n, num_heads))

    # Output, early return
    logits = _new_logits(rows, max_context_len, out_dtype)
    if rows == 0 or max_context_len == 0 or not ctx.any():
        return logits

    # Dispatch
    protect(work=2.0 * rows * num_heads * head_dim * max_context_len)
    from ..kernels.mqa_logits import launch_paged_mqa_logits

    launch_paged_mqa_logits(_rows_view(qv, rows * num_heads, qv.shape[-1]), sfq, cache, bt,
                            np.ascontiguousarray(np.broadcast_to(ctx, (batch, next_n))).reshape(-1), meta,
                            w, logits, batch=batch, next_n=next_n, num_heads=num_heads,
                            head_dim=head_dim, q_dtype=q_kind, kv_dtype=kv_kind, page_size=page_size,
                            ascend_kv_layout=ascend)
    return logits


@api_call
def fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
                         clean_logits=False, indices=None):
    """CUDA DeepGEMM's legacy name of fp8_fp4_paged_mqa_logits (its layout: use_ascend_kv_layout=False)."""
    if clean_logits:
        raise ValueError("clean_logits=True is not supported by the paged MQA logits (as in CUDA DeepGEMM)")
    return fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
                                    indices=indices)


@api_call
def build_paged_kv_cache(kv, block_table, num_blocks, page_size=64, context_lens=None, use_ascend_kv_layout=False):
    """The uint8 paged cache fp8_fp4_paged_mqa_logits reads, from dense keys and a block table.

    kv: (values, sf): values float8_e4m3fn [B, L, D] or packed FP4 int8 [B, L, D / 2]; sf: for FP8 in CUDA
    DeepGEMM's layout an fp32 scale per key [B, L]; otherwise UE8M0 scales per 32 of head_dim (fp32 [B, L, D / 32]
    powers of two, or int16 pairs [B, L, D / 64]). block_table: int32 [B, max_blocks]: key j of row b goes to page
    block_table[b, j // page_size], slot j % page_size. context_lens (int [B], default L): the keys of each row to
    write. Returns uint8 [num_blocks, page_size, 1, token_bytes] (layouts: see fp8_fp4_paged_mqa_logits); pages no
    row uses are zero. A page named by two rows is refused.
    """
    values, sf = _pair(kv, "kv")
    kind = _kind(values, "kv[0]")
    if values.ndim != 3:
        raise ValueError(f"kv[0].shape={values.shape} must be [batch, keys, head_dim storage]")
    batch, length = values.shape[:2]
    head_dim = values.shape[2] * (2 if kind == "fp4" else 1)
    if head_dim not in (MQA_FP4_HEAD_DIMS if kind == "fp4" else MQA_HEAD_DIMS):
        raise ValueError(f"kv[0].shape={values.shape}: head_dim={head_dim} must be one of "
                         f"{MQA_FP4_HEAD_DIMS if kind == 'fp4' else MQA_HEAD_DIMS} ({kind})")
    page_size = _check_int(page_size, "page_size", 1)
    if page_size not in PAGE_SIZES:
        raise ValueError(f"page_size={page_size} must be one of {PAGE_SIZES}")
    num_blocks = _check_int(num_blocks, "num_blocks")
    if not isinstance(use_ascend_kv_layout, (bool, np.bool_)):
        # NOTES: bool("False") is True: a string would silently pick the Ascend layout
        raise TypeError(f"use_ascend_kv_layout must be a bool, got {type(use_ascend_kv_layout).__name__}: "
                        f"{use_ascend_kv_layout!r}")
    ascend = bool(use_ascend_kv_layout)
    lens = np.full(batch, length, np.int64) if context_lens is None else \
        _check_context_lens(context_lens, "context_lens")[:, 0].astype(np.int64)
    if lens.shape != (batch,):
        raise ValueError(f"context_lens.shape={np.shape(context_lens)} must be [batch={batch}]")
    if lens.size and lens.max() > length:
        b = int(np.argmax(lens))
        raise ValueError(f"context_lens[{b}]={lens[b]} exceeds the {length} keys of kv")
    pages = -(-lens // page_size)
    bt = _check_block_table(block_table, batch, pages, num_blocks)
    owner = {}
    for b in range(batch):
        for p in range(int(pages[b])):
            blk = int(bt[b, p])
            if blk in owner:
                raise ValueError(f"block_table[{b}, {p}]={blk} is also block_table{owner[blk]}: a page holds the keys "
                                 f"of one row")
            owner[blk] = [b, p]
    d_storage = storage_bytes(kind, head_dim)

    # Scales: the per-key fp32 (CUDA FP8) or UE8M0 exponent bytes per 32 of head_dim
    token_scale = kind == "fp8" and not ascend
    if token_scale:
        if sf is None or sf.dtype != FP32 or sf.shape != (batch, length):
            raise ValueError(f"kv[1] must be fp32 [batch, keys] = {(batch, length)} (a scale per key) for FP8 in CUDA "
                             f"DeepGEMM's layout, got {None if sf is None else (sf.dtype, sf.shape)}")
        scale_bytes = np.ascontiguousarray(sf).view(np.uint8).reshape(batch, length, 4)
    else:
        if sf is None:
            raise ValueError("kv[1]: UE8M0 scales per 32 of head_dim are required for this layout and dtype")
        packed = _mx_sf(sf, batch * length, head_dim, "kv[1]", (batch, length))  # int16 [D / 64, B * L]
        # the exponent bytes of each key (head_dim 32: the low byte of its one int16)
        exps = np.ascontiguousarray(packed.T).view(np.uint8).reshape(batch * length, -1)[:, :head_dim // 32]
        exps = exps.reshape(batch, length, head_dim // 32)
        scale_bytes = exps if ascend else np.concatenate(
            [exps, np.full((batch, length, 4 - head_dim // 32), 127, np.uint8)], axis=-1)

    token = paged_token_bytes(kind, head_dim, ascend)
    cache = np.zeros((num_blocks, page_size, 1, token), np.uint8)
    flat = cache.reshape(num_blocks, page_size * token)
    codes = values.view(np.uint8)
    for b in range(batch):
        for p in range(int(pages[b])):
            j0, j1 = p * page_size, min((p + 1) * page_size, int(lens[b]))
            page = flat[int(bt[b, p])]
            if ascend:
                rows = page.reshape(page_size, token)
                rows[:j1 - j0, :d_storage] = codes[b, j0:j1]
                rows[:j1 - j0, d_storage:] = scale_bytes[b, j0:j1]
            else:
                page[:page_size * d_storage].reshape(page_size, d_storage)[:j1 - j0] = codes[b, j0:j1]
                page[page_size * d_storage:].reshape(page_size, 4)[:j1 - j0] = scale_bytes[b, j0:j1]
    return cache
