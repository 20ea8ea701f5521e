"""Reference semantics of expert-parallel dispatch and combine (DeepEP's ``utils/refs.py``), in plain numpy and
without communication: each function takes every rank's inputs and computes what one rank gets, so a test can check
a real multi-process dispatch against it.

- ``dispatch(rank, xs, topk_idxs, topk_weights, num_max_tokens_per_rank, num_experts)``: what ``rank`` receives,
  not expanded, in ascending ``src_token_global_idx = src_rank * num_max_tokens_per_rank + t`` order (source rank,
  then token): ``(recv_x, recv_topk_idx, recv_topk_weights, recv_src_token_idx, num_recv_tokens_per_rank)``;
  ``recv_topk_idx`` is local to ``rank`` (expert - rank * E/R), -1 for an expert elsewhere or a -1 route.
  ``xs[r]`` is an array or an ``(x, sf)`` pair (FP8 dispatch: the rows of both move together).
- ``combine(y, topk_idx, num_experts, num_ranks, bias=None, reduce_in_local=True)``: the combined rows of one source
  rank from the per-route expert outputs ``y [T, K, H]``: optionally a grouped reduce per destination rank (the slots
  of one rank summed in fp32 in top-k order, rounded once, placed at that rank's last slot), then
  ``ordered_accumulate``: fp32 over the K slots in order from the bias (or zero), rounded once to ``y``'s dtype.
  ``reduce_in_local=True`` is an ElasticBuffer's combine with ``allow_multiple_reduction=True`` (the default; and
  any plain combine), ``reduce_in_local=False`` its expanded combine with ``allow_multiple_reduction=False`` (one
  reduction at the source over all top-k rows), as upstream's ``(True, False)`` and ``(False, False)`` recipes.
- ``ordered_accumulate(data [T, K, H], initial_value=None)``, ``grouped_reduce(data, group_id)``.
- ``generate_pre_combine_data(src_token_global_idx, num_max_tokens_per_rank, num_topk, hidden, num_ranks, seed=0)``:
  deterministic per-route bf16 rows (a sine of the route's seed), as DeepEP's tests build combine inputs.
"""

from __future__ import annotations

import math

import numpy as np

from ..utils.formats import BF16_DTYPE


def _split(x):
    return x if isinstance(x, tuple) else (x, None)


def dispatch(rank: int, xs: list, topk_idxs: list, topk_weights: list | None, num_max_tokens_per_rank: int,
             num_experts: int):
    num_ranks = len(xs)
    if num_experts % num_ranks:
        raise ValueError(f"num_experts must be a multiple of the rank count: {num_experts=} {num_ranks=}")
    num_local = num_experts // num_ranks
    lo, hi = rank * num_local, (rank + 1) * num_local
    parts: dict[str, list] = {"x": [], "sf": [], "idx": [], "w": [], "src": []}
    counts = []
    for src in range(num_ranks):
        x, sf = _split(xs[src])
        idx = np.asarray(topk_idxs[src])
        if idx.shape[0] > num_max_tokens_per_rank:
            raise ValueError(f"rank {src} has more tokens than num_max_tokens_per_rank: {idx.shape=}")
        mask = ((idx >= lo) & (idx < hi)).any(axis=1)
        tokens = np.nonzero(mask)[0]
        counts.append(tokens.size)
        parts["x"].append(x[tokens])
        if sf is not None:
            parts["sf"].append(sf[tokens])
        sent = idx[tokens]
        parts["idx"].append(np.where((sent >= lo) & (sent < hi), sent - lo, -1).astype(idx.dtype))
        if topk_weights is not None:
            parts["w"].append(np.asarray(topk_weights[src])[tokens])
        parts["src"].append((tokens + src * num_max_tokens_per_rank).astype(np.int32))
    recv_x = np.concatenate(parts["x"], axis=0)
    if parts["sf"]:
        recv_x = (recv_x, np.concatenate(parts["sf"], axis=0))
    recv_w = np.concatenate(parts["w"], axis=0) if topk_weights is not None else None
    return (recv_x, np.concatenate(parts["idx"], axis=0), recv_w, np.concatenate(parts["src"], axis=0),
            np.array(counts, np.int32))


def ordered_accumulate(data: np.ndarray, initial_value: np.ndarray | None = None) -> np.ndarray:
    """fp32 sum over axis 1 in order, starting from ``initial_value`` (fp32) or zero, one rounding to data's dtype."""
    acc = np.zeros((data.shape[0], data.shape[2]), np.float32) if initial_value is None else \
        np.array(initial_value, np.float32, copy=True)
    for k in range(data.shape[1]):
        acc += data[:, k, :].astype(np.float32)
    return acc.astype(data.dtype)


def grouped_reduce(data: np.ndarray, group_id: np.ndarray) -> np.ndarray:
    """Per token, the slots of each group summed in fp32 in slot order, rounded once, stored at the group's last
    slot; the other slots zero."""
    num_tokens, num_topk, hidden = data.shape
    out = np.zeros_like(data)
    for t in range(num_tokens):
        for g in np.unique(group_id[t]):
            slots = np.nonzero(group_id[t] == g)[0]
            acc = np.zeros(hidden, np.float32)
            for k in slots:
                acc += data[t, k].astype(np.float32)
            out[t, slots[-1]] = acc.astype(data.dtype)
    return out


def combine(y: np.ndarray, topk_idx: np.ndarray, num_experts: int, num_ranks: int, bias=None,
            reduce_in_local: bool = True) -> np.ndarray:
    y = np.asarray(y)
    if reduce_in_local:
        # NOTES: -1 routes form their own group (floor division), as upstream's; their rows are zero by contract.
        y = grouped_reduce(y, np.floor_divide(np.asarray(topk_idx), num_experts // num_ranks))
    if isinstance(bias, tuple):
        bias_sum = bias[0].astype(np.float32) + bias[1].astype(np.float32)
    else:
        bias_sum = None if bias is None else np.asarray(bias).astype(np.float32)
    return ordered_accumulate(y, bias_sum)


def generate_pre_combine_data(src_token_global_idx: np.ndarray, num_max_tokens_per_rank: int, num_topk: int,
                              hidden: int, num_ranks: int, seed: int = 0) -> np.ndarray:
    """bf16 ``[N, K, H]``: route (i, j) holds ``sin((s * P % S + 1) / S * (k + 1) + sin(seed))`` with
    ``s = src_token_global_idx[i] * K + j``, ``P = 131071``, ``S = num_ranks * num_max_tokens_per_rank * K``."""
    seeds = np.asarray(src_token_global_idx, np.int64)[:, None] * num_topk + np.arange(num_topk)[None, :]
    max_seed = num_ranks * num_max_tokens_per_rank * num_topk
    base = ((seeds * 131071 % max_seed).astype(np.float32) + 1) / np.float32(max_seed)
    cols = np.arange(1, hidden + 1, dtype=np.float32)
    return np.sin(base[..., None] * cols + np.float32(math.sin(float(seed)))).astype(np.float32).astype(BF16_DTYPE)
