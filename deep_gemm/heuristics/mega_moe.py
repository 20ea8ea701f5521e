"""Mega MoE's problem, its fixed kernel tiling, the symmetric-buffer (workspace) layout and the cost model of one call
per rank. Pure Python: no numpy arrays, no numba.

What the modelled kernel does (DeepGEMM-Ascend 0.1.0's ``fp8_fp4_mega_moe``, one persistent mixed kernel per rank on
every AI core): AIV0 builds the dispatch metadata, stores it into the destination ranks' buffers and converts the FP4
weights to FP8 for the Cube; AIV1 pulls the routed FP8 rows from the source ranks, runs the SwiGLU + top-k weight +
FP8 requantisation epilogue of L1 and pushes the bf16 L2 rows back into the source ranks' combine slots; the AIC runs
L1 (gate/up) and L2 (down) over 256-row blocks of each local expert's routes, and the shared experts over the rank's
own tokens; a rank barrier separates dispatch from compute and compute from the combine reduce.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..arch import ArchSpec
from .config import GemmConfig, GemmDesc
from .model import AIVS_PER_CORE, LAUNCH_S, MEMORY_FIGURES, VECTOR_FP32_PER_CYCLE, model_gemm

# NOTES: the kernel's tiling is fixed, not chosen per shape (DeepGEMM-Ascend mega_moe.hpp): BLOCK_M = BLOCK_N = 256
# (the m-blocks of each expert's routes and the weights' gate/up interleave), MAD 128 x 128 x 256 (FP8), 3 A stages
# in L1. Our GemmConfig carries one stage count for both operands, so the model uses the A count (3; upstream keeps
# 4 B stages): fewer bytes in flight, never an optimistic figure.
BLOCK_M = 256
BLOCK_N = 256
BLOCK_K = 256
MEGA_MOE_CONFIG = GemmConfig(block_m=BLOCK_M, block_n=BLOCK_N, block_k=BLOCK_K, mad_m=128, mad_n=128, mad_k=256,
                             num_l1_stages=3)
# Upstream's hard requirements (csrc/apis/mega_moe.hpp): the core count the kernel is written for, the rank field
# width, the top-k and shared-expert limits, the 24-bit route index.
NUM_AI_CORES = 32
MAX_RANKS = 256
MAX_TOPK = 32
MAX_SHARED_EXPERTS = 2
MAX_ROUTES = 2**24
MIN_INTERMEDIATE = 512
BUFFER_ALIGNMENT = 2 * 2**20  # the symmetric buffer is a multiple of 2 MiB
FIELD_ALIGNMENT = 512  # each workspace field starts on a 512 B boundary (one GM request)
MX_SF_DIVISOR = 64  # K elements per int16 pair of UE8M0 scales

# NOTES: the vendor's DeepEP-Ascend EP8 figures over the 950's UB links (seed article, shared reference
# mega_moe_and_ep.md): dispatch 373-375 GB/s and combine 345-347 GB/s per rank; the lower ends. [M, vendor]
DISPATCH_BYTES_PER_S = 373e9
COMBINE_BYTES_PER_S = 345e9
# NOTES: a rank barrier is a remote atomic add into every peer's signal word, then a wait for R arrivals; no published
# figure for its latency. Judged like LAUNCH_S (a handshake, here across chips), 2 us; one value for every shape, not
# fitted per row. The kernel has two: after the dispatch metadata, before the combine reduce.
RANK_BARRIER_S = 2.0e-6
NUM_RANK_BARRIERS = 2
# Vector passes per L1 output element of the SwiGLU-quant epilogue (simd/mega_moe.hpp's order): the gate clamp, the
# up clamp (two), 0 - gate, exp, + 1, the division, * up, * the route weight, |x|, the 32-wide max, the scale
# multiply and the e4m3 cast; the per-32 scale arithmetic is 1/32 of that and ignored.
SWIGLU_VECTOR_OPS = 13
# Combine reduce: per input element one add (fp32) after a bf16 -> fp32 cast; the final cast per output element.
COMBINE_VECTOR_OPS = 2
# The reduce overlaps the tail when the combine input exceeds this many bytes (upstream's switch).
COMBINE_OVERLAP_BYTES = 32 * 2**20


@dataclass(frozen=True)
class MegaMoeDesc:
    """One mega MoE configuration: ``num_ranks`` ranks, ``num_experts`` routed experts over them (E / R local),
    ``num_shared_experts``, ``num_max_tokens_per_rank`` (T), ``num_topk`` (K), ``hidden`` (H), ``intermediate_hidden``
    (I). This is the tuple upstream's JIT specializes on."""

    num_ranks: int
    num_experts: int
    num_shared_experts: int
    num_max_tokens_per_rank: int
    num_topk: int
    hidden: int
    intermediate_hidden: int

    @property
    def num_local_experts(self) -> int:
        return self.num_experts // self.num_ranks

    @property
    def num_max_m_blocks(self) -> int:
        """Upper bound of the 256-row blocks one rank's local experts receive: every route plus one tail per expert."""
        r, t, k = self.num_ranks, self.num_max_tokens_per_rank, self.num_topk
        return -(-(r * t * k) // BLOCK_M) + self.num_local_experts

    @property
    def num_ring_blocks(self) -> int:
        """m-blocks the L1 / L2 activation rings hold: 4 per core for H <= 4096, 1 per core beyond."""
        per_core = 4 if self.hidden // 256 <= 16 else 1
        return min(self.num_max_m_blocks, per_core * NUM_AI_CORES)


def check_mega_moe_desc(d: MegaMoeDesc) -> None:
    """Upstream's configuration checks (csrc/apis/mega_moe.hpp); ValueError naming the value."""
    if not 0 < d.num_ranks < MAX_RANKS:
        raise ValueError(f"num_ranks={d.num_ranks} must be in [1, {MAX_RANKS - 1}] (the rank is an 8-bit field)")
    if d.num_experts < 1 or d.num_experts % d.num_ranks:
        raise ValueError(f"num_experts={d.num_experts} must be a positive multiple of num_ranks={d.num_ranks}")
    if not 0 < d.num_topk <= MAX_TOPK:
        raise ValueError(f"num_topk={d.num_topk} must be in [1, {MAX_TOPK}]")
    if d.num_topk > d.num_experts:
        raise ValueError(f"num_topk={d.num_topk} must be <= num_experts={d.num_experts}")
    if not 0 <= d.num_shared_experts <= MAX_SHARED_EXPERTS:
        raise ValueError(f"num_shared_experts={d.num_shared_experts} must be in [0, {MAX_SHARED_EXPERTS}]")
    if d.hidden < 256 or d.hidden % 256:
        raise ValueError(f"hidden={d.hidden} must be a positive multiple of 256")
    if d.intermediate_hidden < MIN_INTERMEDIATE or d.intermediate_hidden % 256:
        raise ValueError(f"intermediate_hidden={d.intermediate_hidden} must be a multiple of 256 "
                         f"and >= {MIN_INTERMEDIATE}")
    if d.num_max_tokens_per_rank < 1:
        raise ValueError(f"num_max_tokens_per_rank={d.num_max_tokens_per_rank} must be >= 1")
    routes = d.num_ranks * d.num_max_tokens_per_rank * d.num_topk
    if routes >= MAX_ROUTES:
        raise ValueError(f"num_ranks * num_max_tokens_per_rank * num_topk = {routes} must be < 2^24 "
                         f"(R={d.num_ranks} T={d.num_max_tokens_per_rank} K={d.num_topk})")


# ---------------------------------------------------------------------------------------------------------------
# Workspace (symmetric buffer) layout
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Field:
    """One workspace field: its byte offset in the rank's buffer, numpy dtype name and shape."""

    name: str
    offset: int
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        size = {"uint8": 1, "int16": 2, "int32": 4, "int64": 8, "float32": 4, "uint16": 2}[self.dtype]
        n = 1
        for s in self.shape:
            n *= s
        return n * size


def workspace_layout(d: MegaMoeDesc) -> tuple[dict[str, Field], int]:
    """The fields of one rank's symmetric buffer in order, and its total size (a multiple of 2 MiB).

    ``sync``: the rank-barrier epochs and signals; ``expert_recv_count[src rank, local expert]``: routes a source rank
    sends to each local expert (written by the source, one writer per cell; bit 24 marks arrival);
    ``src_token_metadata[local expert, src rank, slot]``: (top-k weight bits << 32) | token * K + k, written by the
    source; ``x`` / ``x_sf`` / ``topk_idx`` / ``topk_weights``: the rank's inputs (upstream's views);
    ``l1_acts`` (+ SF) and ``l2_acts`` (+ SF): the activation rings; ``shared_l2_acts`` (+ SF); ``combine_input[slot,
    token]``: the bf16 rows pushed back, slot K for the shared experts.
    """
    r, e, s = d.num_ranks, d.num_experts, d.num_shared_experts
    t, k, h, i = d.num_max_tokens_per_rank, d.num_topk, d.hidden, d.intermediate_hidden
    ring = d.num_ring_blocks * BLOCK_M
    specs = [
        ("sync", "int64", (2 * r + 8,)),
        ("expert_recv_count", "int32", (r, e // r)),
        ("src_token_metadata", "int64", (e // r, r, t)),
        ("x", "uint8", (t, h)),
        ("x_sf", "int16", (t, h // MX_SF_DIVISOR)),
        ("topk_idx", "int64", (t, k)),
        ("topk_weights", "float32", (t, k)),
        ("l1_acts", "uint8", (ring, h)),
        ("l1_acts_sf", "int16", (ring, h // MX_SF_DIVISOR)),
        ("l2_acts", "uint8", (ring, i)),
        ("l2_acts_sf", "int16", (ring * i // MX_SF_DIVISOR,)),
        ("shared_l2_acts", "uint8", (t, max(1, s) * i)),
        ("shared_l2_acts_sf", "int16", (t * max(1, s) * i // MX_SF_DIVISOR,)),
        ("combine_input", "uint16", (k + (1 if s else 0), t, h)),
    ]
    fields: dict[str, Field] = {}
    offset = 0
    for name, dtype, shape in specs:
        f = Field(name, offset, dtype, shape)
        fields[name] = f
        offset = -(-(offset + f.nbytes) // FIELD_ALIGNMENT) * FIELD_ALIGNMENT
    return fields, -(-offset // BUFFER_ALIGNMENT) * BUFFER_ALIGNMENT


# ---------------------------------------------------------------------------------------------------------------
# Cost model
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MegaMoeCost:
    """Modelled chip time of one call on one rank and its parts (seconds). ``gemm_s``: the AIC's four GEMM phases
    back to back (routed L1, L2; shared L1, L2), each the GEMM model's time under the kernel's fixed tiling;
    ``link_s``: the pull and push bytes over the UB link; ``aiv1_s``: the epilogue and combine vector work; the
    three overlap. ``prologue_s``: metadata, rank barrier and the first block's pull; ``tail_s``: the last block's
    push, the second barrier and the exposed combine reduce."""

    time_s: float
    bound: str
    gemm_s: float
    phases_s: tuple[tuple[str, float], ...]
    link_s: float
    pull_s: float
    push_s: float
    aiv1_s: float
    prologue_s: float
    tail_s: float
    launch_s: float
    flops: float
    weight_bytes: int
    routed_rows_per_expert: int


def model_mega_moe(d: MegaMoeDesc, arch: ArchSpec, num_ai_cores: int, num_tokens: int | None = None) -> MegaMoeCost:
    """Modelled time of one call per rank with ``num_tokens`` tokens on every rank (default T_max), routes spread
    evenly over the experts (each local expert receives R * T * K / E rows), on ``num_ai_cores`` cores of ``arch``."""
    t = d.num_max_tokens_per_rank if num_tokens is None else num_tokens
    r, k, h, i, s = d.num_ranks, d.num_topk, d.hidden, d.intermediate_hidden, d.num_shared_experts
    local = d.num_local_experts
    clock = arch.clock_hz
    cfg = GemmConfig(**dict(MEGA_MOE_CONFIG.to_dict(), num_ai_cores=num_ai_cores))
    rows_per_expert = round(r * t * k / d.num_experts)

    # AIC: the four GEMM phases in one persistent kernel, so one launch for all of them. With one AIV (AIV0) decoding
    # FP4 weights (AIV1 runs the epilogue and the communication), the decode takes twice the GEMM model's
    # two-AIV figure.
    phases = []
    for name, m, n, kk, b_dtype, groups in (("l1", rows_per_expert, 2 * i, h, "fp4", local),
                                             ("l2", rows_per_expert, h, i, "fp4", local),
                                             ("shared_l1", t, 2 * i, h, "fp8", s),
                                             ("shared_l2", t, h, i, "fp8", s)):
        if not m or not groups:
            continue
        desc = GemmDesc(m, n, kk, "fp8", b_dtype, "bf16", "batched" if groups > 1 else "normal", groups,
                        num_ai_cores=num_ai_cores)
        c = model_gemm(desc, cfg, arch, MEMORY_FIGURES)
        phase = max(c.time_s - LAUNCH_S, AIVS_PER_CORE * c.vector_s + c.fill_s)
        phases.append((name, phase))
    gemm_s = sum(p for _, p in phases)

    # UB link: the pull of each route's FP8 row and its scales (one UE8M0 byte per 32), the push of its bf16 row.
    routes = t * k
    row_in = h + h // 32
    pull_s = routes * row_in / DISPATCH_BYTES_PER_S
    push_s = routes * h * 2 / COMBINE_BYTES_PER_S
    link_s = pull_s + push_s

    # AIV1: the SwiGLU-quant epilogue over every routed and shared row (one AIV per core), and the combine reduce on
    # both AIVs (fp32 over K + [S > 0] slots).
    lanes = VECTOR_FP32_PER_CYCLE * clock * num_ai_cores
    slots = k + (1 if s else 0)
    epilogue_s = (routes + s * t) * i * SWIGLU_VECTOR_OPS / lanes
    reduce_vector_s = t * h * (slots * COMBINE_VECTOR_OPS) / (lanes * AIVS_PER_CORE)
    combine_bytes = t * slots * h * 2
    reduce_mem_s = (combine_bytes + t * h * 2) / arch.hbm_bytes_per_s
    reduce_s = max(reduce_vector_s, reduce_mem_s)
    aiv1_s = epilogue_s + reduce_s

    # Exposed ends: before the first MAD, the metadata stores, a barrier and the first block's pull (one copy issue
    # and the loaded GM latency, then its bytes); after the last, its push, the second barrier and the reduce (all of
    # it below upstream's overlap threshold, else the last block's share).
    first_rows = min(BLOCK_M, max(rows_per_expert, 1))
    figures = MEMORY_FIGURES
    prologue_s = (RANK_BARRIER_S + figures.copy_issue_s + figures.gm_latency_s
                  + first_rows * row_in / DISPATCH_BYTES_PER_S)
    exposed_reduce = reduce_s if combine_bytes <= COMBINE_OVERLAP_BYTES else reduce_s * min(1.0, BLOCK_M / t)
    tail_s = RANK_BARRIER_S * (NUM_RANK_BARRIERS - 1) + first_rows * h * 2 / COMBINE_BYTES_PER_S + exposed_reduce

    busy = {"cube": gemm_s, "link": link_s, "vector": aiv1_s}
    bound = max(busy, key=busy.__getitem__)
    if bound == "cube":  # name what the GEMM phases mostly waited on
        bound = "cube/weights" if rows_per_expert < BLOCK_M else "cube"
    time_s = round(LAUNCH_S + prologue_s + max(busy.values()) + tail_s, 15)
    flops = 2.0 * (routes + s * t) * h * i * 3
    weight_bytes = local * 3 * h * i // 2 + local * 3 * h * i // 32 + s * (3 * h * i + 3 * h * i // 32)
    return MegaMoeCost(
        time_s=time_s, bound=bound, gemm_s=gemm_s, phases_s=tuple(phases), link_s=link_s, pull_s=pull_s,
        push_s=push_s, aiv1_s=aiv1_s, prologue_s=prologue_s, tail_s=tail_s, launch_s=LAUNCH_S, flops=flops,
        weight_bytes=weight_bytes, routed_rows_per_expert=rows_per_expert,
    )
