"""DeepEP's ElasticBuffer on simulated ranks: ``get_dispatch_layout``, ``dispatch`` (plain or expanded into the
psum layout the M-grouped GEMMs take) and ``combine``, with DeepEP's signatures, on numpy arrays or CPU tensors.

    buffer = deep_gemm.ep.ElasticBuffer(group, num_max_tokens_per_rank=T, hidden=H, num_topk=K)
    recv_x, recv_topk_idx, recv_topk_weights, handle, event = buffer.dispatch(
        x, topk_idx=topk_idx, topk_weights=topk_weights, num_experts=E, expert_alignment=256, do_expand=True)
    # recv_x [M, H] (or (fp8, sf)): expert e's rows at [align(psum[e-1], 256), psum[e]), psum =
    # handle.psum_num_recv_tokens_per_expert (int32 [E/R]) = the grouped_layout of m_grouped_*_contiguous
    y, combined_topk_weights, event = buffer.combine(expert_out_bf16 [M, H], handle)

Semantics are DeepEP's reference functions (deep_gemm/ep/reference.py), bitwise: received tokens in ascending
``src_token_global_idx = src_rank * num_max_tokens_per_rank + t``; ``recv_topk_idx`` local to the rank, -1 for an
expert elsewhere (or a -1 route); expanded rows expert by expert, within an expert in received order (a token's
slots in top-k order), alignment padding zero; combine (expanded) sums a token's local rows in fp32 in top-k order
and rounds once on the expert's rank, then the source sums the ranks' rows in fp32 in top-k order (a rank counted at
its last slot of the token) from the bias and rounds once (DeepEP's default ``allow_multiple_reduction=True``).
With ``ElasticBuffer(..., allow_multiple_reduction=False)`` an expanded combine reduces once: every expanded row
goes back unreduced and the source sums all of a token's top-k rows in fp32 in top-k order from the bias, rounding
once (upstream's reference ``combine(..., reduce_in_local=False)``); it takes no ``topk_weights`` (as DeepEP's
expanded send). A plain combine's rows are already one per (token, rank), so it is the same under both settings
(one scale-up domain here: no hybrid mode). Combine never multiplies by weights (as DeepEP's);
``combined_topk_weights[t, k]`` is what the owner of slot k sent back (0 for a -1 slot).

Movement: on one host every row is a store by the sending rank into the receiving rank's symmetric buffer (numpy
gathers straight into the peer's mapped segment: the UBMEM remote store), then a barrier; across hosts the group's
all-to-all. Events, SM/QP counts, streams and CPU-sync flags are accepted and have nothing to do on the CPU.
"""

from __future__ import annotations

import numpy as np

from .._torch import accepts_torch
from ..utils.formats import BF16_DTYPE
from ..utils.math import align
from ..utils.tma import get_tma_aligned_size
from ._checks import array, positive_int
from .group import as_group
from .transport import Transport, region_bytes

TOPK_IDX_DTYPE = np.dtype(np.int64)  # DeepEP's topk_idx_t


class EventOverlap:
    """DeepEP's event wrapper: there are no streams on the CPU, every call has finished when it returns."""

    def __init__(self, event=None):
        self.event = event

    def current_stream_wait(self) -> None:
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class EPHandle:
    """What ``dispatch`` returns to replay (cached dispatch) and reverse (combine) one routing. Fields as DeepEP's:
    ``psum_num_recv_tokens_per_expert`` (int32 [E/R]; expanded: aligned start + real count per expert, i.e. the
    GEMMs' psum ``grouped_layout``; plain: inclusive sum of aligned counts), ``num_recv_tokens_per_expert_list``
    (aligned counts), ``num_unaligned_recv_tokens_per_expert`` (expanded only),
    ``psum_num_recv_tokens_per_scaleup_rank`` (int32 [R], inclusive, per source rank), ``recv_src_metadata``
    (int32 [N, 2 + K]: source global token index, source rank, then per top-k slot the expanded row or -1),
    ``dst_buffer_slot_idx`` (int32 [T, R]: where each of this rank's tokens landed in its block of each rank's
    receive area, -1 if not sent), ``topk_idx`` (this rank's routing)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    @property
    def grouped_layout(self) -> np.ndarray:
        """The psum layout for ``m_grouped_*_gemm_*_contiguous`` (expanded dispatch)."""
        return self.psum_num_recv_tokens_per_expert

    def __repr__(self) -> str:
        return (f"EPHandle(do_expand={self.do_expand}, num_experts={self.num_experts}, "
                f"num_recv_tokens={self.num_recv_tokens}, num_expanded_tokens={self.num_expanded_tokens})")


def _byte_rows(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    width = int(np.prod(a.shape[1:], dtype=np.int64)) * a.dtype.itemsize
    return a.view(np.uint8).reshape(a.shape[0], width)


def _check_topk(topk_idx, num_tokens: int, num_experts: int) -> np.ndarray:
    topk_idx = array(topk_idx, "topk_idx", 2)
    if topk_idx.dtype.kind not in "iu":
        raise TypeError(f"topk_idx must be an integer array (int64): {topk_idx.dtype=}")
    if topk_idx.shape[0] != num_tokens:
        raise ValueError(f"topk_idx must have one row per token: {topk_idx.shape=} {num_tokens=}")
    if topk_idx.size and (topk_idx.min() < -1 or topk_idx.max() >= num_experts):
        raise ValueError(f"topk_idx must lie in [-1, num_experts): min={topk_idx.min()} max={topk_idx.max()} "
                         f"{num_experts=}")
    return topk_idx.astype(TOPK_IDX_DTYPE)


class ElasticBuffer:
    """DeepEP's ElasticBuffer (constructor collective, like every dispatch and combine). ``num_bytes`` (or
    ``num_max_tokens_per_rank`` with ``hidden`` and ``num_topk``) sizes the symmetric buffer up front; otherwise the
    first call sizes it, and a call needing more grows it collectively."""

    def __init__(self, group=None, num_bytes: int | None = None, num_cpu_bytes: int = 0,
                 num_max_tokens_per_rank: int = 0, hidden: int = 0, num_topk: int = 0,
                 use_fp8_dispatch: bool = False, deterministic: bool = False, allow_hybrid_mode: bool = True,
                 allow_multiple_reduction: bool = True, prefer_overlap_with_compute: bool = True, sl_idx: int = 3,
                 num_allocated_qps: int = 0, num_cpu_timeout_secs: int = 300, num_gpu_timeout_secs: int = 100,
                 explicitly_destroy: bool = False):
        if not isinstance(allow_multiple_reduction, (bool, np.bool_)):
            raise TypeError(f"allow_multiple_reduction must be a bool: {allow_multiple_reduction=}")
        self.group = as_group(group)
        self.rank_idx, self.num_ranks = self.group.rank, self.group.num_ranks
        self.num_max_tokens_per_rank = int(num_max_tokens_per_rank)
        self.deterministic = True  # NOTES: the CPU order is always the sorted (deterministic) one
        self.allow_multiple_reduction = bool(allow_multiple_reduction)
        self.explicitly_destroy = explicitly_destroy
        if num_bytes is None and num_max_tokens_per_rank and hidden and num_topk:
            num_bytes = 2 * self.get_buffer_size_hint(num_max_tokens_per_rank, hidden, num_topk, self.num_ranks,
                                                      allow_multiple_reduction=self.allow_multiple_reduction)
        self.transport = Transport(self.group, int(num_bytes or 0))

    @staticmethod
    def get_buffer_size_hint(num_max_tokens_per_rank: int, hidden: int, num_topk: int, num_ranks: int,
                             sf_bytes_per_token: int | None = None, allow_multiple_reduction: bool = True) -> int:
        """Bytes one region needs for bf16 dispatch (FP8 with fp32 scales per 128 fits too) and combine (without
        multiple reduction an expanded combine returns up to ``num_topk`` rows per token, as DeepEP's buffer)."""
        sf = 4 * -(-hidden // 128) if sf_bytes_per_token is None else sf_bytes_per_token
        need = region_bytes(num_ranks, num_max_tokens_per_rank, [2 * hidden, sf, 8 * num_topk, 4 * num_topk, 4])
        if not allow_multiple_reduction:
            need = max(need, region_bytes(num_ranks, num_max_tokens_per_rank * max(num_topk, 1), [2 * hidden]))
        return need

    @property
    def rank(self) -> int:
        return self.rank_idx

    def get_logical_domain_size(self) -> tuple[int, int]:
        return 1, self.num_ranks

    get_physical_domain_size = get_logical_domain_size

    def barrier(self) -> None:
        self.group.barrier()

    def capture(self) -> EventOverlap:
        return EventOverlap()

    def destroy(self) -> None:
        self.transport.close()

    # Layout
    def _get_dispatch_layout(self, topk_idx, num_experts: int, previous_event=None, async_finish: bool = False,
                             allocate_on_comm_stream: bool = False):
        """``(num_tokens_per_rank int32 [R], None, num_tokens_per_expert int32 [E], is_token_in_rank bool [T, R],
        event)`` for this rank's routing (local: no communication)."""
        num_experts = positive_int(num_experts, "num_experts")
        if num_experts % self.num_ranks:
            raise ValueError(f"num_experts must be a multiple of the rank count: {num_experts=} "
                             f"num_ranks={self.num_ranks}")
        topk_idx = _check_topk(topk_idx, getattr(topk_idx, "shape", (0,))[0], num_experts)
        num_local = num_experts // self.num_ranks
        owner = np.where(topk_idx >= 0, topk_idx // num_local, -1)
        is_token_in_rank = (owner[:, :, None] == np.arange(self.num_ranks)).any(axis=1)
        valid = topk_idx[topk_idx >= 0]
        num_tokens_per_expert = np.bincount(valid, minlength=num_experts).astype(np.int32)
        num_tokens_per_rank = is_token_in_rank.sum(axis=0).astype(np.int32)
        return num_tokens_per_rank, None, num_tokens_per_expert, is_token_in_rank, EventOverlap()

    get_dispatch_layout = accepts_torch(_get_dispatch_layout)

    # Dispatch
    def _dispatch(self, x, topk_idx=None, topk_weights=None, cumulative_local_expert_recv_stats=None,
                  num_experts: int | None = None, num_max_tokens_per_rank: int | None = None,
                  expert_alignment: int | None = None, num_sms: int = 0, num_qps: int = 0, previous_event=None,
                  previous_event_before_epilogue=None, async_with_compute_stream: bool = False,
                  allocate_on_comm_stream: bool = False, handle: EPHandle | None = None, do_handle_copy: bool = True,
                  do_cpu_sync: bool | None = None, do_expand: bool = False, do_zero_padding: bool = False,
                  use_tma_aligned_col_major_sf: bool = False):
        """``(recv_x, recv_topk_idx, recv_topk_weights, handle, event)``; expanded: ``recv_x`` [M, H] in the psum
        layout, ``recv_topk_idx`` None, ``recv_topk_weights`` [M] (the route's weight; 0 in padding)."""
        # Argument checks (nothing is sent before they pass)
        x, sf = x if isinstance(x, tuple) else (x, None)
        x = array(x, "x", 2)
        num_tokens, hidden = x.shape
        if sf is not None:
            sf = array(sf, "x[1] (scales)", 2)
            if sf.shape[0] != num_tokens:
                raise ValueError(f"the scales must have one row per token: {sf.shape=} {x.shape=}")
        if handle is not None:
            if topk_idx is not None:
                raise ValueError("a cached dispatch (handle=...) takes topk_idx=None: the handle holds the routing")
            for name, given, cached in (("num_experts", num_experts, handle.num_experts),
                                        ("expert_alignment", expert_alignment, handle.expert_alignment),
                                        ("num_max_tokens_per_rank", num_max_tokens_per_rank,
                                         handle.num_max_tokens_per_rank)):
                if given is not None and given != cached:
                    raise ValueError(f"{name} differs from the handle's: {given} != {cached}")
            topk_idx, num_experts = handle.topk_idx, handle.num_experts
            expert_alignment, num_max_tokens_per_rank = handle.expert_alignment, handle.num_max_tokens_per_rank
            do_expand = handle.do_expand
        if topk_idx is None:
            raise ValueError("dispatch needs topk_idx (or a cached handle)")
        num_experts = positive_int(num_experts, "num_experts")
        if num_experts % self.num_ranks:
            raise ValueError(f"num_experts must be a multiple of the rank count: {num_experts=} "
                             f"num_ranks={self.num_ranks}")
        expert_alignment = positive_int(1 if expert_alignment is None else expert_alignment, "expert_alignment")
        t_max = num_max_tokens_per_rank or self.num_max_tokens_per_rank
        if not t_max:
            t_max = max(self.group.all_gather_object(num_tokens))
        t_max = positive_int(t_max, "num_max_tokens_per_rank")
        if num_tokens > t_max:
            raise ValueError(f"more tokens than num_max_tokens_per_rank: {x.shape=} {t_max=}")
        topk_idx_in = topk_idx
        topk_idx = _check_topk(topk_idx, num_tokens, num_experts)
        num_topk = topk_idx.shape[1]
        if topk_weights is not None:
            topk_weights = array(topk_weights, "topk_weights", 2)
            if topk_weights.shape != topk_idx.shape or topk_weights.dtype != np.float32:
                raise ValueError(f"topk_weights must be float32 shaped like topk_idx: {topk_weights.shape=} "
                                 f"{topk_weights.dtype=} {topk_idx.shape=}")
        num_local = num_experts // self.num_ranks
        stats = cumulative_local_expert_recv_stats
        if stats is not None:
            stats = array(stats, "cumulative_local_expert_recv_stats", 1)
            if stats.shape != (num_local,) or stats.dtype.kind != "i":
                raise ValueError(f"cumulative_local_expert_recv_stats must be int [{num_local}]: {stats.shape=} "
                                 f"{stats.dtype=}")
        if do_zero_padding and not do_expand:
            raise ValueError("do_zero_padding needs do_expand=True")

        # Routing: per destination rank, the tokens with an expert there (ascending) and their local top-k
        owner = np.where(topk_idx >= 0, topk_idx // num_local, -1)
        sends, send_tokens = [], []
        x_rows, sf_rows = _byte_rows(x), (None if sf is None else _byte_rows(sf))
        w_rows = None if topk_weights is None else _byte_rows(topk_weights)
        for dst in range(self.num_ranks):
            tokens = np.nonzero((owner == dst).any(axis=1))[0]
            send_tokens.append(tokens)
            local = np.where(owner[tokens] == dst, topk_idx[tokens] - dst * num_local, -1).astype(TOPK_IDX_DTYPE)
            src = (tokens + self.rank_idx * t_max).astype(np.int32)
            fields = [(x_rows, tokens)] + ([] if sf is None else [(sf_rows, tokens)])
            fields += [(_byte_rows(local), None), (_byte_rows(src[:, None]), None)]
            fields += [] if w_rows is None else [(w_rows, tokens)]
            sends.append(fields)
        row_bytes = [x_rows.shape[1]] + ([] if sf is None else [sf_rows.shape[1]]) + [8 * num_topk, 4]
        row_bytes += [] if w_rows is None else [4 * num_topk]

        # Exchange (remote stores into each destination's buffer, then a barrier)
        received = self.transport.exchange(0, t_max, row_bytes, sends)

        # Received rows in source order
        def gather(i, dtype, tail):
            parts = [r[i] for r in received]
            data = np.concatenate(parts, axis=0) if parts else np.zeros((0, row_bytes[i]), np.uint8)
            return np.ascontiguousarray(data).view(dtype).reshape(-1, *tail)

        i = 0
        recv_x = gather(i, x.dtype, (hidden,))
        if sf is not None:
            i += 1
            recv_sf = gather(i, sf.dtype, (sf.shape[1],))
        recv_topk_idx = gather(i + 1, TOPK_IDX_DTYPE, (num_topk,))
        recv_src = gather(i + 2, np.int32, ())
        recv_w = None if w_rows is None else gather(i + 3, np.float32, (num_topk,))
        recv_counts = np.array([r[0].shape[0] for r in received], np.int32)
        num_recv = int(recv_counts.sum())

        # Per local expert counts, aligned counts and the psum layout
        counts = np.bincount(recv_topk_idx[recv_topk_idx >= 0], minlength=num_local).astype(np.int64)
        aligned = np.array([align(int(c), expert_alignment) for c in counts], np.int64)
        starts = np.concatenate([[0], np.cumsum(aligned)[:-1]]).astype(np.int64)
        meta = np.full((num_recv, 2 + num_topk), -1, np.int32)
        meta[:, 0] = recv_src
        meta[:, 1] = np.repeat(np.arange(self.num_ranks), recv_counts)
        slot_idx = np.full((num_tokens, self.num_ranks), -1, np.int32)
        for dst, tokens in enumerate(send_tokens):
            slot_idx[tokens, dst] = np.arange(tokens.size, dtype=np.int32)  # within the source's block at dst
        if do_expand:
            j, k = np.nonzero(recv_topk_idx >= 0)  # row-major: token order, then slot order
            expert = recv_topk_idx[j, k]
            order = np.argsort(expert, kind="stable")
            j, k, expert = j[order], k[order], expert[order]
            first = np.searchsorted(expert, np.arange(num_local))
            rows = starts[expert] + np.arange(expert.size) - first[expert]
            num_expanded = int(aligned.sum())
            out_x = np.zeros((num_expanded, hidden), x.dtype)
            out_x[rows] = recv_x[j]
            if sf is not None:
                if use_tma_aligned_col_major_sf:
                    pad = get_tma_aligned_size(num_expanded, sf.dtype.itemsize)
                    out_sf = np.zeros((sf.shape[1], pad), sf.dtype).T[:num_expanded]
                else:
                    out_sf = np.zeros((num_expanded, sf.shape[1]), sf.dtype)
                out_sf[rows] = recv_sf[j]
                recv_sf = out_sf
            if recv_w is not None:
                out_w = np.zeros(num_expanded, np.float32)
                out_w[rows] = recv_w[j, k]
                recv_w = out_w
            meta[j, 2 + k] = rows
            recv_x, ret_topk_idx = out_x, None
            psum = (starts + counts).astype(np.int32)
        else:
            num_expanded = num_recv
            ret_topk_idx = recv_topk_idx
            psum = np.cumsum(aligned).astype(np.int32)
            if sf is not None and use_tma_aligned_col_major_sf:
                pad = get_tma_aligned_size(num_recv, sf.dtype.itemsize)
                out_sf = np.zeros((sf.shape[1], pad), sf.dtype).T[:num_recv]
                out_sf[:] = recv_sf
                recv_sf = out_sf
        if stats is not None:
            stats += counts.astype(stats.dtype)

        if handle is None:
            handle = EPHandle(
                do_expand=bool(do_expand), num_experts=num_experts, expert_alignment=expert_alignment,
                num_max_tokens_per_rank=t_max, num_sms=num_sms,
                topk_idx=topk_idx if do_handle_copy or topk_idx is not topk_idx_in else topk_idx_in,
                num_recv_tokens=num_recv, num_expanded_tokens=num_expanded,
                num_recv_tokens_per_expert_list=[int(c) for c in aligned],
                psum_num_recv_tokens_per_scaleup_rank=np.cumsum(recv_counts).astype(np.int32),
                psum_num_recv_tokens_per_expert=psum,
                num_unaligned_recv_tokens_per_expert=counts.astype(np.int32) if do_expand else None,
                recv_src_metadata=meta, dst_buffer_slot_idx=slot_idx,
                token_metadata_at_forward=None, channel_linked_list=None,
                recv_topk_idx=recv_topk_idx, recv_counts=recv_counts, send_tokens=send_tokens, hidden=hidden)
        out = recv_x if sf is None else (recv_x, recv_sf)
        return out, ret_topk_idx, recv_w, handle, EventOverlap()

    dispatch = accepts_torch(_dispatch)

    # Combine
    def _combine(self, x, handle: EPHandle, topk_weights=None, bias=None, num_sms: int = 0, num_qps: int = 0,
                 previous_event=None, previous_event_before_epilogue=None, async_with_compute_stream: bool = False,
                 allocate_on_comm_stream: bool = False):
        """``(combined_x [T, H], combined_topk_weights [T, K] or None, event)``: the reverse of ``handle``'s
        dispatch, ``x`` one row per received token (plain) or per expanded row (expanded); the buffer's
        ``allow_multiple_reduction`` picks the expanded reduction (see the module docstring)."""
        # Argument checks
        if not isinstance(handle, EPHandle):
            raise TypeError(f"combine needs the EPHandle dispatch returned: {type(handle).__name__}")
        x = array(x, "x", 2)
        rows_expected = handle.num_expanded_tokens if handle.do_expand else handle.num_recv_tokens
        if x.shape[0] != rows_expected:
            raise ValueError(f"combine's x must have {rows_expected} rows (the handle's "
                             f"{'expanded' if handle.do_expand else 'received'} tokens): {x.shape=}")
        if x.dtype not in (BF16_DTYPE, np.dtype(np.float32), np.dtype(np.float16)):
            raise TypeError(f"combine's x must be bf16 (or fp16/fp32): {x.dtype=}")
        num_recv, num_topk = handle.recv_topk_idx.shape
        num_tokens, hidden = handle.topk_idx.shape[0], x.shape[1]
        if topk_weights is not None:
            want = (handle.num_expanded_tokens,) if handle.do_expand else (num_recv, num_topk)
            topk_weights = array(topk_weights, "topk_weights", len(want))
            if topk_weights.shape != want or topk_weights.dtype != np.float32:
                raise ValueError(f"combine's topk_weights must be float32 {list(want)}: {topk_weights.shape=} "
                                 f"{topk_weights.dtype=}")
        biases = () if bias is None else (bias if isinstance(bias, tuple) else (bias,))
        if len(biases) > 2:
            raise ValueError(f"bias takes at most two arrays: {len(biases)=}")
        biases = tuple(array(b, "bias", 2) for b in biases)
        for b in biases:
            if b.shape != (num_tokens, hidden):
                raise ValueError(f"bias must be [{num_tokens}, {hidden}]: {b.shape=}")
        if handle.do_expand and not self.allow_multiple_reduction:
            if topk_weights is not None:
                raise ValueError("an expanded combine without multiple reduction takes topk_weights=None (as "
                                 "DeepEP's: the rows go back unreduced, weights only with allow_multiple_reduction)")
            return self._combine_single_reduction(x, handle, biases) + (EventOverlap(),)

        # Local reduce: one row per received token (expanded: its local rows summed in fp32 in top-k order)
        local = handle.recv_topk_idx >= 0
        if handle.do_expand:
            rows = handle.recv_src_metadata[:, 2:]
            acc = np.zeros((num_recv, hidden), np.float32)
            for k in range(num_topk):
                valid = rows[:, k] >= 0
                acc[valid] += x[rows[valid, k]].astype(np.float32)
            partial = acc.astype(x.dtype)
            weights = None
            if topk_weights is not None:
                weights = np.where(rows >= 0, topk_weights[np.maximum(rows, 0)], np.float32(0)).astype(np.float32)
        else:
            partial = np.ascontiguousarray(x)
            weights = None if topk_weights is None else np.where(local, topk_weights, np.float32(0))

        # Exchange back: each received token's row (and weights) into its source rank's buffer
        bounds = np.concatenate([[0], np.cumsum(handle.recv_counts)])
        p_rows, w_rows = _byte_rows(partial), None if weights is None else _byte_rows(weights)
        sends = []
        for src in range(self.num_ranks):
            part = slice(int(bounds[src]), int(bounds[src + 1]))
            sends.append([(p_rows[part], None)] + ([] if w_rows is None else [(w_rows[part], None)]))
        row_bytes = [p_rows.shape[1]] + ([] if w_rows is None else [4 * num_topk])
        received = self.transport.exchange(1, handle.num_max_tokens_per_rank, row_bytes, sends)

        # Ordered fp32 accumulation over the top-k slots, a rank counted at its last slot of the token
        num_local = handle.num_experts // self.num_ranks
        owner = np.where(handle.topk_idx >= 0, handle.topk_idx // num_local, -1)
        pos = np.full((self.num_ranks, num_tokens), -1, np.int64)
        for r, tokens in enumerate(handle.send_tokens):
            pos[r, tokens] = np.arange(tokens.size)
        back = [np.ascontiguousarray(f[0]).view(x.dtype).reshape(-1, hidden) for f in received]
        acc = np.zeros((num_tokens, hidden), np.float32)
        if len(biases) == 1:
            acc = biases[0].astype(np.float32)
        elif len(biases) == 2:
            acc = biases[0].astype(np.float32) + biases[1].astype(np.float32)
        for k in range(num_topk):
            later = owner[:, k + 1:] == owner[:, k: k + 1]
            last = (owner[:, k] >= 0) & ~later.any(axis=1)
            acc[~last] += np.float32(0)
            for r in range(self.num_ranks):
                tokens = np.nonzero(last & (owner[:, k] == r))[0]
                if tokens.size:
                    acc[tokens] += back[r][pos[r, tokens]].astype(np.float32)
        combined = acc.astype(x.dtype)
        combined_w = None
        if w_rows is not None:
            w_back = [np.ascontiguousarray(f[1]).view(np.float32).reshape(-1, num_topk) for f in received]
            combined_w = np.zeros((num_tokens, num_topk), np.float32)
            for k in range(num_topk):
                for r in range(self.num_ranks):
                    tokens = np.nonzero(owner[:, k] == r)[0]
                    combined_w[tokens, k] = w_back[r][pos[r, tokens], k]
        return combined, combined_w, EventOverlap()

    def _combine_single_reduction(self, x: np.ndarray, handle: EPHandle, biases: tuple):
        """Expanded combine with ``allow_multiple_reduction=False``: every expanded row goes back unreduced (a
        received token's rows in top-k order), and the source sums all of a token's top-k rows once, in fp32 in
        top-k order from the bias (a -1 slot adds zero), one rounding."""
        num_topk = handle.recv_topk_idx.shape[1]
        num_tokens, hidden = handle.topk_idx.shape[0], x.shape[1]
        rows = handle.recv_src_metadata[:, 2:]

        # Exchange back: per source rank, its received tokens' rows on this rank, token by token in top-k order
        x_rows = _byte_rows(x)
        bounds = np.concatenate([[0], np.cumsum(handle.recv_counts)])
        sends = []
        for src in range(self.num_ranks):
            block = rows[int(bounds[src]): int(bounds[src + 1])]
            sends.append([(x_rows, block[block >= 0].astype(np.int64))])
        received = self.transport.exchange(1, handle.num_max_tokens_per_rank * num_topk, [x_rows.shape[1]], sends)

        # Where each (token, slot) row landed: rank r's rows follow its tokens in order, then their slots on r
        num_local = handle.num_experts // self.num_ranks
        owner = np.where(handle.topk_idx >= 0, handle.topk_idx // num_local, -1)
        back = [np.ascontiguousarray(f[0]).view(x.dtype).reshape(-1, hidden) for f in received]
        offsets = np.concatenate([[0], np.cumsum([b.shape[0] for b in back])]).astype(np.int64)
        every = np.concatenate(back + [np.zeros((1, hidden), x.dtype)], axis=0)  # last row: the zero of a -1 slot
        where = np.full((num_tokens, num_topk), offsets[-1], np.int64)
        for r, tokens in enumerate(handle.send_tokens):
            i, k = np.nonzero(owner[tokens] == r)  # row-major, as the sender's block[block >= 0]
            if i.size != back[r].shape[0]:
                raise RuntimeError(f"rank {r} sent {back[r].shape[0]} rows back for {i.size} routes")
            where[tokens[i], k] = offsets[r] + np.arange(i.size)

        acc = np.zeros((num_tokens, hidden), np.float32)
        if len(biases) == 1:
            acc = biases[0].astype(np.float32)
        elif len(biases) == 2:
            acc = biases[0].astype(np.float32) + biases[1].astype(np.float32)
        for k in range(num_topk):
            acc += every[where[:, k]].astype(np.float32)
        return acc.astype(x.dtype), None

    combine = accepts_torch(_combine)
