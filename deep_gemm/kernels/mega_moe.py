"""Mega MoE on one rank of a simulated expert-parallel group, two ways with the same bits (docs/mega_moe.md):

- the fused kernel (family MEGA_MOE, templates/mega_moe.asc.j2, ``launch_fused``): every phase below in one mixed
  Cube + Vector launch, the GEMMs on the AIC, the rank barriers through flags in the symmetric buffer;
- the host pipeline: the phases below in numpy, on the rank's typed views of every rank's symmetric buffer, with
  api/mega_moe.py running the GEMM phases on the M-grouped Cube kernels in between.

Both use the workspace layout of heuristics/mega_moe.py; inputs arrive validated (api/mega_moe.py).

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
from .family import KernelFamily

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


# ---------------------------------------------------------------------------------------------------------------
# The fused kernel (templates/mega_moe.asc.j2): every phase above in one mixed launch per rank
# ---------------------------------------------------------------------------------------------------------------
# NOTES: a rank barrier that waits longer than this raises (MegaMoeBarrierTimeout) instead of hanging; every rank
# of a group must call within it. set_barrier_timeout() changes it (tests shorten it).
_barrier_timeout_s = 300.0
# Fused launches of this process (tests check the fused path really ran).
FUSED_LAUNCHES = 0
KERNEL_NAME = "mega_moe"


class MegaMoeBarrierTimeout(RuntimeError):
    """A rank barrier of the fused kernel timed out: some rank of the group did not call (or not in step)."""


def set_barrier_timeout(seconds: float) -> float:
    """Set the fused kernel's rank-barrier timeout (seconds, > 0); returns the previous value."""
    global _barrier_timeout_s
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise ValueError(f"seconds={seconds!r} must be a positive number")
    previous, _barrier_timeout_s = _barrier_timeout_s, float(seconds)
    return previous


@dataclass(frozen=True)
class FusedDesc:
    """What the fused kernel is specialized on: the GEMMs' widths (hidden, intermediate_hidden) and the core count;
    ranks, experts, top-k, tokens and the buffer's layout are runtime arguments (one build serves them all)."""

    hidden: int
    intermediate_hidden: int
    num_ai_cores: int

    def gemm_descs(self):
        from ..heuristics.config import GemmDesc

        common = dict(a_dtype="fp8", b_dtype="fp4", out_dtype="bf16", gemm_type="m_grouped_contiguous",
                      num_groups=1, num_ai_cores=self.num_ai_cores)
        h, i = self.hidden, self.intermediate_hidden
        return GemmDesc(m=BLOCK_M, n=2 * i, k=h, **common), GemmDesc(m=BLOCK_M, n=h, k=i, **common)


def _select_fused_config(desc: FusedDesc, arch):
    """The chip kernel's fixed tiling (heuristics.mega_moe.MEGA_MOE_CONFIG), not a per-shape choice; the Cube's
    results do not depend on it (device.mmad: one fp32 FMA chain along K per element)."""
    from dataclasses import replace

    from ..heuristics.mega_moe import MEGA_MOE_CONFIG

    return replace(MEGA_MOE_CONFIG, num_ai_cores=desc.num_ai_cores)


def _fused_constants(desc: FusedDesc, config, arch, *, cube_l0_bf16: bool) -> dict:
    from ..heuristics.capacity import check_buffer_capacity
    from .common import gemm_template_constants

    l1, l2 = desc.gemm_descs()
    constants = gemm_template_constants(l1, config, arch, compiled_dims="", cube_l0_bf16=cube_l0_bf16)
    check_buffer_capacity(l2, config, arch, resident_a=bool(constants["RESIDENT_A"]))
    constants.update(H=desc.hidden, I=desc.intermediate_hidden)
    return constants


# The kernel family (templates/mega_moe.asc.j2); its intrinsics come from deep_gemm.device.remote.
MEGA_MOE = KernelFamily(KERNEL_NAME, select_config=_select_fused_config, template_constants=_fused_constants,
                        device_module="deep_gemm.device.remote")


def prepare_fused(hidden: int, intermediate_hidden: int):
    """The prepared fused kernel for these GEMM widths on the current runtime target."""
    from .. import envs
    from .common import cube_l0_bf16, current_target

    num_ai_cores, arch = current_target()
    l0_bf16 = cube_l0_bf16("fp8", "fp4")
    desc = FusedDesc(int(hidden), int(intermediate_hidden), num_ai_cores)
    key = (desc, arch.name, envs.DG_SYNC_CHECK.get(), l0_bf16)
    prepared = MEGA_MOE.lookup(key)
    if prepared is None:
        prepared = MEGA_MOE.prepare(desc, arch=arch, options={"cube_l0_bf16": l0_bf16}, memo_key=key)
    return prepared


@dataclass
class FusedWorkspace:
    """One rank's private scratch of the fused kernel (pool metadata, the GEMMs' operands and outputs)."""

    pool_src: np.ndarray
    pool_tt: np.ndarray
    pool_w: np.ndarray
    group_start: np.ndarray
    group_rows: np.ndarray
    a1: np.ndarray
    sfa1: np.ndarray
    h: np.ndarray
    scratch: np.ndarray
    a2: np.ndarray
    sfa2: np.ndarray
    o: np.ndarray
    status: np.ndarray
    counts: np.ndarray

    @classmethod
    def of(cls, d: MegaMoeDesc, num_ai_cores: int) -> FusedWorkspace:
        p, h, i, local = d.num_max_m_blocks * BLOCK_M, d.hidden, d.intermediate_hidden, d.num_local_experts
        return cls(np.zeros(p, np.int32), np.zeros(p, np.int32), np.zeros(p, np.float32), np.zeros(local, np.int32),
                   np.zeros(local, np.int32), np.zeros(p * h, np.uint8), np.zeros(h // MX_SF_DIVISOR * p, np.int16),
                   np.zeros(p * 2 * i, np.uint16), np.zeros(num_ai_cores * 2 * 4 * i, np.float32),
                   np.zeros(p * i, np.uint8), np.zeros(i // MX_SF_DIVISOR * p, np.int16),
                   np.zeros(p * h, np.uint16), np.zeros(8, np.int64), np.zeros(d.num_experts, np.int64))


def launch_fused(all_bytes: np.ndarray, rank: int, moe: MegaMoeDesc, ws: FusedWorkspace, w1: tuple, w2: tuple,
                 y: np.ndarray, num_tokens: int, clamp: float, stats: np.ndarray | None) -> None:
    """One fused launch on this rank. ``all_bytes``: the symmetric buffer, uint8 [R, row bytes] (C-contiguous);
    ``w1`` / ``w2``: (packed FP4 codes uint8 flat [E/R * N * K/2], scales int16 flat [E/R, K/64, N] required
    layout) of L1 / L2; y: bf16 [num_tokens, H]. Raises MegaMoeBarrierTimeout (or RuntimeError for counts out of
    step) from the kernel's status."""
    global FUSED_LAUNCHES
    prepared = prepare_fused(moe.hidden, moe.intermediate_hidden)
    fields, _ = workspace_layout(moe)
    flat = all_bytes.reshape(-1)
    ws.status[:] = 0
    stats_arg = stats.reshape(-1) if stats is not None else np.zeros(moe.num_local_experts, np.int32)
    prepared.launch(
        gm_all_i64=flat.view(np.int64), gm_all_i32=flat.view(np.int32), gm_all_i16=flat.view(np.int16),
        gm_all_u8=flat, gm_all_u16=flat.view(np.uint16), gm_b1=w1[0], gm_sfb1=w1[1], gm_b2=w2[0], gm_sfb2=w2[1],
        gm_pool_src=ws.pool_src, gm_pool_tt=ws.pool_tt, gm_pool_w=ws.pool_w, gm_group_start=ws.group_start,
        gm_group_rows=ws.group_rows, gm_a1=ws.a1, gm_sfa1=ws.sfa1, gm_h=ws.h, gm_scratch=ws.scratch, gm_a2=ws.a2,
        gm_sfa2=ws.sfa2, gm_sfa2_bits=ws.sfa2.view(np.uint16), gm_o=ws.o, gm_y=y.reshape(-1).view(np.uint16),
        gm_stats=stats_arg, gm_status=ws.status, my_rank=int(rank), num_tokens=int(num_tokens),
        clamp=float(clamp), barrier_timeout_ns=int(_barrier_timeout_s * 1e9), has_stats=int(stats is not None),
        gm_counts=ws.counts, num_ranks=moe.num_ranks, e_local=moe.num_local_experts, num_topk=moe.num_topk,
        t_max=moe.num_max_tokens_per_rank, has_shared=int(moe.num_shared_experts > 0),
        pool_rows=moe.num_max_m_blocks * BLOCK_M, rank_bytes=all_bytes.shape[1],
        off_sync=fields["sync"].offset, off_recv=fields["expert_recv_count"].offset,
        off_meta=fields["src_token_metadata"].offset, off_x=fields["x"].offset, off_xsf=fields["x_sf"].offset,
        off_idx=fields["topk_idx"].offset, off_w=fields["topk_weights"].offset,
        off_comb=fields["combine_input"].offset)
    FUSED_LAUNCHES += 1
    status, detail, which = (int(v) for v in ws.status[:3])
    if status == 1:
        raise MegaMoeBarrierTimeout(
            f"mega MoE (fused kernel): rank {rank}'s rank barrier {which} of 2 timed out after "
            f"{_barrier_timeout_s:g} s waiting for rank {detail}: every rank of the group must call "
            f"fp8_fp4_mega_moe together; the symmetric buffer is out of step now (make a new SymmBuffer)")
    if status == 2:
        raise RuntimeError(f"mega MoE (fused kernel): rank {rank} has no count from source rank {detail}: the ranks' "
                           f"calls are out of step")
