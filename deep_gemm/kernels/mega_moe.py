"""Mega MoE on one rank of a simulated expert-parallel group: the rank's typed views of every rank's symmetric buffer
and the communication and vector phases of the kernel, on the workspace layout of heuristics/mega_moe.py. Inputs
arrive validated (api/mega_moe.py), which also runs the GEMM phases on the Cube kernels.

Phases, in the Ascend kernel's order (each rank runs them on its own process; a store into ``views.all_*[r]`` is
the UB remote store into rank r's buffer; each cell of the remote regions has one writer, so no atomics):
  ``dispatch_metadata``   AIV0: count routes per (destination rank, local expert), store (weight bits << 32) |
                          token * K + k into the destination's src_token_metadata, publish the count (arrival bit);
  -- rank barrier --
  ``plan_pool``           read the received counts, zero them for the next call, lay the routes out as 256-row
                          blocks per local expert (ascending source rank, then source order: DeepEP's order);
  ``pull_rows``           AIV1: the FP8 rows and scales of one ring wave from the source ranks' x / x_sf;
  ``swiglu_quant``        AIV1's L1 epilogue: clamp, SwiGLU, times the route weight, UE8M0 scale per 32, e4m3;
  ``push_rows``           AIV1: each bf16 L2 row into its source rank's combine_input[top-k slot][token];
  -- rank barrier --
  ``combine_reduce``      both AIVs: per token, fp32 over the valid slots in slot order, then the shared slot,
                          one bf16 rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..heuristics.mega_moe import BLOCK_M, MX_SF_DIVISOR, MegaMoeDesc, workspace_layout
from ..utils.formats import FP8_DTYPE, bf16_bits_to_fp32, fp32_to_bf16_bits

# The arrival bit of a published count (upstream's kCountArrivalBit): a received cell without it was never written.
ARRIVAL_BIT = 1 << 24
# NOTES: the UE8M0 scale of a 32-channel group (simd/mega_moe.hpp): amax below 1e-4 is taken as 1e-4, then
# ceil_pow2(amax / 448) computed on the bits: the exponent of amax, plus one when its mantissa exceeds 1.75 (adding
# 0x1FFFFF carries into the exponent exactly then), minus 8 (448 = 1.75 * 2^8).
AMAX_FLOOR = np.float32(1e-4)
E4M3_MAX = np.float32(448.0)
_MANTISSA_CARRY = np.uint32(0x1FFFFF)
_EXPONENT_MASK = np.uint32(0x7F800000)


@dataclass
class RankViews:
    """Typed numpy views of the symmetric buffer, for one rank: ``all_<field>`` is [num_ranks, ...] over every rank's
    buffer (a store into row r is a remote store into rank r), ``<field>`` is this rank's row."""

    desc: MegaMoeDesc
    rank: int
    fields: dict

    @classmethod
    def of(cls, desc: MegaMoeDesc, rank: int, all_bytes: np.ndarray) -> RankViews:
        fields, _ = workspace_layout(desc)
        views = cls(desc, rank, fields)
        for name, f in fields.items():
            rows = all_bytes[:, f.offset:f.offset + f.nbytes].view(np.dtype(f.dtype))
            arr = rows.reshape((all_bytes.shape[0],) + f.shape)
            setattr(views, f"all_{name}", arr)
            setattr(views, name, arr[rank])
        return views


# ---------------------------------------------------------------------------------------------------------------
# Dispatch
# ---------------------------------------------------------------------------------------------------------------
def dispatch_metadata(v: RankViews, num_tokens: int) -> None:
    """Ship this rank's routes to the experts' ranks: per destination rank and local expert, the (weight, token_topk)
    words in (token, k) order into its src_token_metadata[expert, this rank], and the count with the arrival bit
    into its expert_recv_count[this rank, expert]. Routes with index -1 go nowhere."""
    d = v.desc
    local = d.num_local_experts
    idx = v.topk_idx[:num_tokens].reshape(-1)
    weights = np.ascontiguousarray(v.topk_weights[:num_tokens]).reshape(-1)
    routed = np.flatnonzero(idx >= 0)
    experts = idx[routed]
    order = np.argsort(experts, kind="stable")  # grouped by expert, (token, k) order inside each
    routed, experts = routed[order], experts[order]
    counts = np.bincount(experts, minlength=d.num_experts).astype(np.int64)
    words = (weights.view(np.uint32)[routed].astype(np.int64) << 32) | routed.astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)])
    for dst in range(d.num_ranks):
        for le in range(local):
            e = dst * local + le
            n = int(counts[e])
            if n:
                v.all_src_token_metadata[dst, le, v.rank, :n] = words[starts[e]:starts[e + 1]]
        v.all_expert_recv_count[dst, v.rank, :] = counts[dst * local:(dst + 1) * local] | ARRIVAL_BIT


@dataclass(frozen=True)
class Pool:
    """This rank's received routes, laid out as the L1 pool: ``expert_rows[e]`` routes of local expert e, expert e
    starting at ``expert_start[e]`` (a multiple of 256); per pool row its source rank, token_topk index and route
    weight (rows of no route: -1, -1, 0); ``blocks``: (local expert, first pool row, rows) of every 256-row block."""

    expert_rows: np.ndarray
    expert_start: np.ndarray
    num_rows: int
    src_rank: np.ndarray
    token_topk: np.ndarray
    weight: np.ndarray
    blocks: list


def plan_pool(v: RankViews) -> Pool:
    """Read the counts every source rank published (each must carry its arrival bit), zero them for the next call,
    and lay the routes out: per local expert, source rank 0's routes first, each in its source's order."""
    d = v.desc
    raw = v.expert_recv_count.astype(np.int64)
    if np.any((raw & ARRIVAL_BIT) == 0):
        missing = np.argwhere((raw & ARRIVAL_BIT) == 0)[0]
        raise RuntimeError(f"mega MoE: rank {v.rank} has no count from source rank {missing[0]} for local expert "
                           f"{missing[1]}: the ranks' calls are out of step")
    counts = raw & (ARRIVAL_BIT - 1)  # [src rank, local expert]
    v.expert_recv_count[...] = 0
    expert_rows = counts.sum(axis=0)
    padded = -(-expert_rows // BLOCK_M) * BLOCK_M
    expert_start = np.concatenate([[0], np.cumsum(padded)[:-1]]).astype(np.int64)
    num_rows = int(padded.sum())
    src_rank = np.full(num_rows, -1, np.int64)
    token_topk = np.full(num_rows, -1, np.int64)
    weight = np.zeros(num_rows, np.float32)
    blocks = []
    for le in range(d.num_local_experts):
        row = int(expert_start[le])
        for src in range(d.num_ranks):
            n = int(counts[src, le])
            if n:
                words = v.src_token_metadata[le, src, :n]
                src_rank[row:row + n] = src
                token_topk[row:row + n] = words & 0xFFFFFFFF
                weight[row:row + n] = (words >> 32).astype(np.uint32).view(np.float32)
                row += n
        for b0 in range(0, int(expert_rows[le]), BLOCK_M):
            blocks.append((le, int(expert_start[le]) + b0, min(BLOCK_M, int(expert_rows[le]) - b0)))
    return Pool(expert_rows.astype(np.int64), expert_start, num_rows, src_rank, token_topk, weight, blocks)


def ring_waves(pool: Pool, num_ring_blocks: int) -> list[list]:
    """The pool's blocks in waves of at most ``num_ring_blocks`` (the L1 / L2 activation rings' capacity)."""
    return [pool.blocks[i:i + num_ring_blocks] for i in range(0, len(pool.blocks), num_ring_blocks)]


def wave_layout(v: RankViews, pool: Pool, wave: list) -> tuple[np.ndarray, np.ndarray, int]:
    """(ring row of every block's first row, psum layout [E_local] of the wave for the M-grouped GEMM, rows used):
    block i sits at ring rows [256 i, 256 i + rows); an expert's blocks in one wave are consecutive."""
    local = v.desc.num_local_experts
    psum = np.zeros(local, np.int32)
    firsts = np.arange(len(wave), dtype=np.int64) * BLOCK_M
    ends = {}
    for i, (le, _, rows) in enumerate(wave):
        ends[le] = int(firsts[i]) + rows
    total = 0
    for le in range(local):
        if le in ends:
            total = ends[le]
        psum[le] = total
    return firsts, psum, len(wave) * BLOCK_M


def pull_rows(v: RankViews, pool: Pool, wave: list, firsts: np.ndarray) -> None:
    """Copy the wave's routed rows (FP8 codes and int16 scale pairs) from their source ranks into the L1 ring;
    ring rows past a block's routes are zeroed (their GEMM rows are not used)."""
    k = v.desc.num_topk
    for (_, p0, rows), r0 in zip(wave, firsts, strict=True):
        src = pool.src_rank[p0:p0 + rows]
        tok = pool.token_topk[p0:p0 + rows] // k
        v.l1_acts[r0:r0 + rows] = v.all_x[src, tok]
        v.l1_acts_sf[r0:r0 + rows] = v.all_x_sf[src, tok]
        v.l1_acts[r0 + rows:r0 + BLOCK_M] = 0
        v.l1_acts_sf[r0 + rows:r0 + BLOCK_M] = 0


def push_rows(v: RankViews, pool: Pool, wave: list, firsts: np.ndarray, out_bits: np.ndarray) -> None:
    """Each bf16 L2 row of the wave into its source rank's combine_input[k][token] (uint16 bits)."""
    k = v.desc.num_topk
    for (_, p0, rows), r0 in zip(wave, firsts, strict=True):
        src = pool.src_rank[p0:p0 + rows]
        tt = pool.token_topk[p0:p0 + rows]
        v.all_combine_input[src, tt % k, tt // k] = out_bits[r0:r0 + rows]


# ---------------------------------------------------------------------------------------------------------------
# Vector epilogues
# ---------------------------------------------------------------------------------------------------------------
def ue8m0_exponents(amax: np.ndarray) -> np.ndarray:
    """UE8M0 exponent byte (uint8) of ceil_pow2(max(amax, 1e-4) / 448) for fp32 ``amax`` >= 0, on the bits."""
    bits = np.maximum(amax.astype(np.float32), AMAX_FLOOR).view(np.uint32)
    exp = ((bits + _MANTISSA_CARRY) & _EXPONENT_MASK) >> np.uint32(23)
    return (exp.astype(np.int64) - 8).clip(0, 254).astype(np.uint8)


def swiglu_quant(h_bits: np.ndarray, weights: np.ndarray, clamp: float, interleaved: bool) -> tuple[np.ndarray,
                                                                                                    np.ndarray]:
    """The L1 epilogue on bf16 L1 rows ``h_bits`` (uint16 [M, 2I]): gate / up from interleaved 128-column halves of
    each 256-column block (``interleaved``, the transformed weights' order) or the two halves [gate | up];
    gate = min(gate, clamp), up = min(max(up, -clamp), clamp); v = gate * up / (1 + exp(0 - gate)) * weight (fp32,
    in this order); per 32 channels a UE8M0 scale (``ue8m0_exponents``) and e4m3 codes of v / scale (RNE, saturated).
    Returns (float8_e4m3fn [M, I], int16 [M, I / 64] exponent pairs, even group in the low byte)."""
    m, two_i = h_bits.shape
    i = two_i // 2
    h = bf16_bits_to_fp32(h_bits)
    if interleaved:
        blocks = h.reshape(m, i // 128, 2, 128)
        gate, up = blocks[:, :, 0].reshape(m, i), blocks[:, :, 1].reshape(m, i)
    else:
        gate, up = h[:, :i], h[:, i:]
    c = np.float32(clamp)
    gate = np.minimum(gate, c)
    up = np.minimum(np.maximum(up, -c), c)
    with np.errstate(over="ignore"):
        den = np.float32(1.0) + np.exp(np.float32(0.0) - gate)
    val = gate * up
    val = val / den
    val = val * weights.astype(np.float32)[:, None]
    groups = val.reshape(m, i // 32, 32)
    exps = ue8m0_exponents(np.abs(groups).max(axis=2))
    inv = (np.uint32(254) - exps.astype(np.uint32)) << np.uint32(23)  # 2^(127 - e): 1 / scale, exact
    scaled = groups * inv.view(np.float32)[:, :, None]
    codes = np.clip(scaled, -E4M3_MAX, E4M3_MAX).astype(FP8_DTYPE).reshape(m, i)
    pairs = exps.reshape(m, i // MX_SF_DIVISOR, 2).astype(np.uint16)
    sf = (pairs[:, :, 0] | (pairs[:, :, 1] << np.uint16(8))).view(np.int16)
    return codes, sf


def combine_reduce(v: RankViews, num_tokens: int, has_shared: bool) -> np.ndarray:
    """y bf16 bits [num_tokens, H]: per token, fp32 over the valid top-k slots in slot order, then the shared slot,
    one RNE rounding."""
    k = v.desc.num_topk
    valid = v.topk_idx[:num_tokens] >= 0
    acc = np.zeros((num_tokens, v.desc.hidden), np.float32)
    for slot in range(k):
        rows = np.flatnonzero(valid[:, slot])
        acc[rows] += bf16_bits_to_fp32(v.combine_input[slot, rows])
    if has_shared:
        acc += bf16_bits_to_fp32(v.combine_input[k, :num_tokens])
    return fp32_to_bf16_bits(acc)
