"""Mega MoE test and bench helpers: a random EP case per rank (inputs, routing, this rank's expert weights), the
unfused baseline a DeepEP + DeepGEMM user runs (expanded dispatch, M-grouped FP8 x FP4 GEMM, SwiGLU + weight + FP8
cast, M-grouped GEMM, combine), and the plain numpy MoE layer a user would write. Call inside spawned ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..utils.formats import BF16_DTYPE, FP8_DTYPE, bf16_bits_to_fp32, fp32_to_bf16_bits
from ..utils.layout import transform_sf_into_required_layout
from ..utils.math import per_token_cast_to_fp4, per_token_cast_to_fp8


@dataclass
class MoeCase:
    """One rank's share of an EP MoE layer: ``x`` (FP8 [T, H]), ``x_sf`` (int16 UE8M0 pairs [T, H/64], row-major as
    the symmetric buffer's view), ``topk_idx`` (int64 [T, K], -1 routes), ``topk_weights`` (f32 [T, K]); this rank's
    routed weights ``l1`` = (packed FP4 [E/R, 2I, H/2], int16 scales [E/R, 2I, H/64]), ``l2`` ([E/R, H, I/2], ..);
    the shared experts' ``shared_l1`` (FP8 [2 S I, H], scales), ``shared_l2`` ([H, S I], ..) or None."""

    x: np.ndarray
    x_sf: np.ndarray
    topk_idx: np.ndarray
    topk_weights: np.ndarray
    l1: tuple
    l2: tuple
    shared_l1: tuple | None
    shared_l2: tuple | None


def _sf_pairs(sf: np.ndarray, mn: int, k: int, groups: int | None = None) -> np.ndarray:
    """fp32 power-of-two scales per 32 -> int16 UE8M0 pairs, C-contiguous [(G,) mn, k/64]."""
    req = transform_sf_into_required_layout(sf, mn, k, (1, 1, 32), num_groups=groups, is_sfa=True)
    return np.ascontiguousarray(req)


def _fp4_weights(rng: np.random.Generator, groups: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    w, sf = [], []
    for _ in range(groups):
        packed, s = per_token_cast_to_fp4(rng.standard_normal((n, k), np.float32) / np.float32(np.sqrt(k)),
                                          use_ue8m0=True, gran_k=32)
        w.append(packed)
        sf.append(s)
    return np.stack(w), _sf_pairs(np.stack(sf), n, k, groups)


def _fp8_rows(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    codes, sf = per_token_cast_to_fp8(values, use_ue8m0=True, gran_k=32)
    return codes, _sf_pairs(sf, values.shape[0], values.shape[1])


def make_case(rank: int, num_ranks: int, num_experts: int, num_tokens: int, num_topk: int, hidden: int,
              intermediate_hidden: int, num_shared_experts: int, seed: int = 0, masked_fraction: float = 0.1,
              empty_expert: int | None = None) -> MoeCase:
    """Rank ``rank``'s random case: distinct experts per token (``masked_fraction`` of the routes -1), positive
    weights; ``empty_expert`` (global index) is never routed to."""
    rng = np.random.default_rng([seed, rank])
    h, i, k = hidden, intermediate_hidden, num_topk
    x, x_sf = _fp8_rows(rng.standard_normal((num_tokens, h), np.float32))
    experts = np.arange(num_experts) if empty_expert is None else np.delete(np.arange(num_experts), empty_expert)
    idx = np.zeros((num_tokens, k), np.int64)
    for t in range(num_tokens):
        idx[t] = rng.permutation(experts)[:k]
    idx[rng.random(idx.shape) < masked_fraction] = -1
    weights = rng.random((num_tokens, k), np.float32) + np.float32(0.1)
    local = num_experts // num_ranks
    wrng = np.random.default_rng([seed, 1000 + rank])
    l1, l2 = _fp4_weights(wrng, local, 2 * i, h), _fp4_weights(wrng, local, h, i)
    shared_l1 = shared_l2 = None
    if num_shared_experts:
        si = num_shared_experts * i
        srng = np.random.default_rng([seed, 2000 + rank])
        shared_l1 = _fp8_rows(srng.standard_normal((2 * si, h), np.float32) / np.float32(np.sqrt(h)))
        shared_l2 = _fp8_rows(srng.standard_normal((h, si), np.float32) / np.float32(np.sqrt(si)))
    return MoeCase(x, x_sf, idx, weights, l1, l2, shared_l1, shared_l2)


# ---------------------------------------------------------------------------------------------------------------
# The unfused baseline
# ---------------------------------------------------------------------------------------------------------------
def swiglu_apply_weight_to_fp8(h: np.ndarray, weights: np.ndarray, clamp: float = float("inf")):
    """The baseline's SwiGLU + route weight + per-token FP8 cast on bf16 L1 rows [M, 2I] ([gate | up]): the
    kernel's operation order (gate*up / (1 + exp(0 - gate)) * weight in fp32, gate clamped from above, up on both
    sides), then ``per_token_cast_to_fp8`` with UE8M0 scales per 32. Returns (FP8 [M, I], int16 pairs [M, I/64])."""
    v = bf16_bits_to_fp32(np.ascontiguousarray(h).view(np.uint16))
    i = v.shape[1] // 2
    c = np.float32(clamp)
    gate, up = np.minimum(v[:, :i], c), np.minimum(np.maximum(v[:, i:], -c), c)
    with np.errstate(over="ignore"):
        den = np.float32(1.0) + np.exp(np.float32(0.0) - gate)
    val = gate * up / den * np.asarray(weights, np.float32)[:, None]
    return _fp8_rows(val)


def _grouped(a, sfa, b, sfb, layout, n):
    from ..api.m_grouped import m_grouped_fp8_fp4_gemm_nt_contiguous

    out = np.empty((a.shape[0], n), BF16_DTYPE)
    sfb_mn = np.ascontiguousarray(sfb.transpose(0, 2, 1)).transpose(0, 2, 1)
    m_grouped_fp8_fp4_gemm_nt_contiguous((a, np.ascontiguousarray(sfa.T).T), (b, sfb_mn), out, layout)
    return out


def _dense(a, sfa, b, sfb):
    from ..api.gemm import fp8_gemm_nt

    out = np.empty((a.shape[0], b.shape[0]), BF16_DTYPE)
    fp8_gemm_nt((a, np.ascontiguousarray(sfa.T).T), (b, np.ascontiguousarray(sfb.T).T), out)
    return out


def baseline_moe(group, case: MoeCase, num_experts: int, num_max_tokens_per_rank: int,
                 clamp: float = float("inf"), ep_buffer=None, combine_buffer=None) -> tuple[np.ndarray, np.ndarray]:
    """The unfused layer on this rank: DeepEP expanded FP8 dispatch (deep_gemm.ep.ElasticBuffer, alignment 256),
    M-grouped FP8 x FP4 L1, ``swiglu_apply_weight_to_fp8``, M-grouped L2, the shared experts on the rank's tokens,
    then a single-reduction combine: every expanded row stored into its source rank's [K + 1, T, H] slots and
    DeepEP's ``ordered_accumulate`` (fp32 in top-k order, shared slot last, one rounding). Returns (y bf16 [T, H],
    received routes per local expert). ``ep_buffer`` / ``combine_buffer`` (an ElasticBuffer and a SymmetricBuffer
    of this function's size) may be passed to reuse them."""
    from ..ep import SymmetricBuffer
    from ..ep.buffer import ElasticBuffer
    from ..ep.reference import ordered_accumulate

    t, k = case.topk_idx.shape
    h = case.x.shape[1]
    i = case.l1[0].shape[1] // 2
    t_max = num_max_tokens_per_rank
    has_shared = case.shared_l1 is not None
    slots = k + (1 if has_shared else 0)
    buf = ep_buffer or ElasticBuffer(group, num_max_tokens_per_rank=t_max, hidden=h, num_topk=k)
    comb = combine_buffer or SymmetricBuffer(group, slots * t_max * h * 2)
    mine = comb.local[:slots * t_max * h * 2].view(np.uint16).reshape(slots, t_max, h)
    mine[...] = 0

    (recv_x, recv_sf), _, recv_w, handle, _ = buf.dispatch(
        (case.x, case.x_sf), topk_idx=case.topk_idx, topk_weights=case.topk_weights, num_experts=num_experts,
        num_max_tokens_per_rank=t_max, expert_alignment=256, do_expand=True)
    layout = handle.grouped_layout
    out = None
    if recv_x.shape[0]:
        h1 = _grouped(recv_x, recv_sf, case.l1[0], case.l1[1], layout, 2 * i)
        acts, acts_sf = swiglu_apply_weight_to_fp8(h1, recv_w, clamp)
        out = _grouped(acts, acts_sf, case.l2[0], case.l2[1], layout, h).view(np.uint16)
    shared = None
    if has_shared and t:
        hs = _dense(case.x, case.x_sf, *case.shared_l1)
        acts, acts_sf = swiglu_apply_weight_to_fp8(hs, np.ones(t, np.float32), clamp)
        shared = _dense(acts, acts_sf, *case.shared_l2).view(np.uint16)
    comb.barrier()  # every rank's slots are zero before anyone stores into them
    if out is not None:
        meta = handle.recv_src_metadata
        every = comb.all[:, :slots * t_max * h * 2].view(np.uint16).reshape(-1, slots, t_max, h)
        for slot in range(k):
            rows = meta[:, 2 + slot]
            ok = rows >= 0
            src = meta[ok, 1]
            tok = meta[ok, 0] - src * t_max
            every[src, slot, tok] = out[rows[ok]]
    if shared is not None:
        mine[k, :t] = shared
    comb.barrier()
    data = mine[:, :t].transpose(1, 0, 2).view(BF16_DTYPE)
    y = ordered_accumulate(np.ascontiguousarray(data))
    comb.barrier()  # nobody clears its slots while a peer may still store
    return y, np.asarray(handle.num_unaligned_recv_tokens_per_expert, np.int64)


# ---------------------------------------------------------------------------------------------------------------
# What a user would write in numpy
# ---------------------------------------------------------------------------------------------------------------
def numpy_moe_local(x: np.ndarray, x_sf: np.ndarray, rows_of_expert: list, l1: tuple, l2: tuple,
                    weights: list) -> list:
    """The plain numpy expert computation a user would write for one rank's received rows: dequantise the FP8 rows
    and the FP4 weights to fp32, ``x @ w1.T``, SwiGLU times the route weight, ``@ w2.T``; one fp32 [n_e, H] per
    local expert (no requantisation, no communication)."""
    from ..utils.formats import decode_e2m1, decode_e4m3, unpack_fp4

    def scales(sf, shape):
        bits = np.ascontiguousarray(sf).view(np.uint16)
        e = np.stack([bits & 0xFF, bits >> 8], axis=-1).reshape(*sf.shape[:-1], -1).astype(np.int32)
        return np.repeat(np.ldexp(np.float32(1), e - 127).astype(np.float32), 32, axis=-1)[..., :shape]

    outs = []
    for e, rows in enumerate(rows_of_expert):
        xe = decode_e4m3(x[rows].view(np.uint8)) * scales(x_sf[rows], x.shape[1])
        w1 = decode_e2m1(unpack_fp4(l1[0][e].view(np.uint8), axis=-1)) * scales(l1[1][e], x.shape[1])
        w2 = decode_e2m1(unpack_fp4(l2[0][e].view(np.uint8), axis=-1)) * scales(l2[1][e], l2[0].shape[2] * 2)
        hh = xe @ w1.T
        i = hh.shape[1] // 2
        gate, up = hh[:, :i], hh[:, i:]
        act = gate * up / (1 + np.exp(-gate)) * weights[e][:, None]
        outs.append(act @ w2.T)
    return outs


def to_bf16(values: np.ndarray) -> np.ndarray:
    return fp32_to_bf16_bits(np.asarray(values, np.float32)).view(BF16_DTYPE)


# ---------------------------------------------------------------------------------------------------------------
# One rank of a test run
# ---------------------------------------------------------------------------------------------------------------
def check_rank(local_rank: int, num_ranks: int, config: dict) -> dict:
    """Inside ``deep_gemm.testing.spawn``: run the fused call (twice, the second time with other routes on the
    same buffer), the baseline and the float64 reference on this rank's case; return what the parent asserts on.
    ``config``: E, T (T_max), K, H, I, S, and optionally ``tokens`` (per-rank token counts), ``clamp``,
    ``empty_expert``."""
    import deep_gemm

    from .dist import init_dist
    from .numeric import calc_diff

    rank, num_ranks, group = init_dist(local_rank, num_ranks)
    e, t_max, k, h, i, s = (config[key] for key in ("E", "T", "K", "H", "I", "S"))
    n = config.get("tokens", [t_max] * num_ranks)[rank]
    clamp = config.get("clamp")
    sym = deep_gemm.SymmBuffer(group, e, t_max, k, h, i, s)
    stats = np.zeros(e // num_ranks, np.int32)
    out = {"bitwise": [], "diff": [], "recv": []}
    for call in range(2):
        case = make_case(rank, num_ranks, e, n, k, h, i, s, seed=call, empty_expert=config.get("empty_expert"))
        sym.x[:n], sym.x_sf[:n] = case.x, case.x_sf
        sym.topk_idx[:n], sym.topk_weights[:n] = case.topk_idx, case.topk_weights
        l1, l2 = deep_gemm.transform_weights_for_mega_moe(case.l1, case.l2)
        shared = deep_gemm.transform_weights_for_mega_moe(case.shared_l1, case.shared_l2) if s else (None, None)
        y = np.empty((n, h), BF16_DTYPE)
        deep_gemm.fp8_fp4_mega_moe(y, l1, l2, sym, *shared, stats, activation_clamp=clamp)
        yb, recv = baseline_moe(group, case, e, t_max, float("inf") if clamp is None else clamp)
        yr = np.empty_like(y)
        deep_gemm.aclnn_fp8_fp4_mega_moe(yr, l1, l2, sym, *shared, activation_clamp=clamp)
        out["bitwise"].append(bool(np.array_equal(y.view(np.uint16), yb.view(np.uint16))))
        out["diff"].append(calc_diff(y.astype(np.float64), yr.astype(np.float64)) if n else 0.0)
        out["recv"].append(recv)
    out["stats"] = stats
    out["finite"] = bool(np.isfinite(y.astype(np.float32)).all())
    return out


__all__ = ["MoeCase", "make_case", "swiglu_apply_weight_to_fp8", "baseline_moe", "numpy_moe_local", "to_bf16",
           "check_rank", "FP8_DTYPE"]


def numpy_moe(group, case: MoeCase, num_experts: int, num_max_tokens_per_rank: int, ep_buffer=None) -> np.ndarray:
    """The layer as a numpy user writes it on top of a DeepEP-style buffer: expanded FP8 dispatch, the experts in
    plain numpy (``numpy_moe_local``: dequantised fp32 matmuls, no requantisation), the shared experts likewise,
    DeepEP's combine with the shared output as its bias. Returns y bf16 [T, H]."""
    from ..ep.buffer import ElasticBuffer
    from ..utils.formats import decode_e4m3

    t, k = case.topk_idx.shape
    h = case.x.shape[1]
    buf = ep_buffer or ElasticBuffer(group, num_max_tokens_per_rank=num_max_tokens_per_rank, hidden=h, num_topk=k)
    (recv_x, recv_sf), _, recv_w, handle, _ = buf.dispatch(
        (case.x, case.x_sf), topk_idx=case.topk_idx, topk_weights=case.topk_weights, num_experts=num_experts,
        num_max_tokens_per_rank=num_max_tokens_per_rank, expert_alignment=1, do_expand=True)
    psum = handle.grouped_layout
    starts = np.concatenate([[0], psum[:-1]])
    rows = [np.arange(int(a), int(b)) for a, b in zip(starts, psum, strict=True)]
    outs = numpy_moe_local(recv_x, recv_sf, rows, case.l1, case.l2, [recv_w[r] for r in rows])
    expert_out = np.zeros((recv_x.shape[0], h), np.float32)
    for r, o in zip(rows, outs, strict=True):
        expert_out[r] = o
    bias = None
    if case.shared_l1 is not None and t:
        def deq(codes, sf):
            bits = sf.view(np.uint16)
            e = np.stack([bits & 0xFF, bits >> 8], axis=-1).reshape(sf.shape[0], -1).astype(np.int32)
            return decode_e4m3(codes.view(np.uint8)) * np.repeat(np.ldexp(np.float32(1), e - 127), 32, axis=1)

        hs = deq(case.x, case.x_sf) @ deq(*case.shared_l1).T
        i = hs.shape[1] // 2
        act = hs[:, :i] * hs[:, i:] / (1 + np.exp(-hs[:, :i]))
        bias = to_bf16(act @ deq(*case.shared_l2).T)
    y, _, _ = buf.combine(to_bf16(expert_out), handle, bias=bias)
    return y
