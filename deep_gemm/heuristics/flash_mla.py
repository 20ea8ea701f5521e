"""FlashMLA sparse attention's problem, config and cost model: sparse decode (flash_mla_with_kvcache) and sparse
prefill (flash_mla_sparse_fwd). Pure Python: (desc, arch) -> config, and the modelled chip time of a config.

What the kernels do (templates/lib/flash_mla.asc.j2, organised as FlashMLA's Ascend deep dive describes): one work
unit is one query token with its 64 heads on one AI core (1C2V); its selected tokens are walked in tiles of B_TOPK.
Per tile the two AIVs gather and dequantize half the tokens each (GM -> UB, one transfer per token: the co-located
layouts keep a token's values and scales together), the Cube runs Q K^T ([64, B_TOPK] over d_qk) and S V ([64, d_v]
over B_TOPK), FixPipe hands P and the O part to the AIVs, which run the online softmax (skip-scale threshold 6) and
keep O in UB. A unit's time is its tiles' time; units are dealt round-robin over the cores.

The cost model charges FlashMLA's O traffic rather than the stand-in's (O_DRAINS_PER_UNIT): O accumulates in L0C and
leaves it only on a rescale, i.e. once per unit, where the stand-in hands the O part to the AIVs every tile.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..arch import ArchSpec

# NOTES: the Ascend limits of FlashMLA's kernels (its tests/lib.py can_run_on_and_clamp): 64 query heads, d_qk 512
# (the V3.2 layout's 576 is accepted here as CUDA FlashMLA's shape: the stand-in computes it exactly), d_v 512.
H_Q = 64
D_V = 512
# NOTES: the deep dive's tile sizes along topk: 64 or 96; 64 is the one whose buffers fit with O in UB on both AIVs.
# d_qk 576 (the V3.2 shape): a 64-token bf16 K tile (72 KiB) overflows the 64 KiB L0B, so 48 tokens.
B_TOPK_CHOICES = (64, 48)
# NOTES: the skip-rescale threshold is 6, the value the FlashMLA Ascend prefill deep dive gives.
RESCALE_THRES = 6.0
FORMATS = ("v41_fp8", "v32_fp8", "v41_fp4", "bf16")
TOKEN_BYTES = {"v41_fp8": 528, "v32_fp8": 656, "v41_fp4": 288}


@dataclass(frozen=True)
class FlashMlaDesc:
    """One sparse-attention problem as the kernels see it: ``kind`` "decode" | "prefill"; main / extra token
    formats (extra "none" without an extra cache); d_qk; the core count."""

    kind: str
    main_format: str
    extra_format: str
    d_qk: int
    num_ai_cores: int


@dataclass(frozen=True)
class FlashMlaConfig:
    """The kernels' one tiling choice: tokens per tile."""

    b_topk: int

    def template_constants(self) -> dict[str, object]:
        return {k.upper(): v for k, v in asdict(self).items()}


def ub_bytes_needed(d_qk: int, b_topk: int) -> int:
    """One AIV's UB (lib/flash_mla.asc.j2's map): scores, O part, O, bf16 S and O, the token staging."""
    half_h = H_Q // 2
    return (half_h * b_topk * 4 + 2 * half_h * D_V * 4 + half_h * b_topk * 2 + half_h * D_V * 2
            + 672 + 1152 + 128 + d_qk * 4 + 2 * d_qk * 2)


def config_violations(desc: FlashMlaDesc, config: FlashMlaConfig, arch: ArchSpec) -> list[str]:
    """Why ``config`` cannot run ``desc`` on ``arch`` (empty: it can)."""
    problems = []
    if config.b_topk % 16:
        problems.append(f"b_topk={config.b_topk} must be a multiple of 16")
    need = ub_bytes_needed(desc.d_qk, config.b_topk)
    if need > arch.ub_bytes:
        problems.append(f"UB: {need} bytes > {arch.ub_bytes}")
    if (H_Q * desc.d_qk + config.b_topk * desc.d_qk + D_V * config.b_topk + H_Q * config.b_topk) * 2 > arch.l1_bytes:
        problems.append("L1 cannot hold Q, K, V^T and S")
    if config.b_topk * desc.d_qk * 2 > arch.l0b_bytes:
        problems.append("L0B cannot hold one bf16 K tile")
    return problems


def get_flash_mla_config(desc: FlashMlaDesc, arch: ArchSpec) -> FlashMlaConfig:
    """The first tile size whose buffers fit (B_TOPK_CHOICES in order)."""
    for b in B_TOPK_CHOICES:
        config = FlashMlaConfig(b_topk=b)
        if not config_violations(desc, config, arch):
            return config
    raise ValueError(f"no FlashMLA tiling fits {arch.name} for {desc}")


# ---------------------------------------------------------------------------------------------------------------
# Cost model: per tile, the busiest of the core's pipes; per unit, its tiles and its epilogue; over the chip, the
# busiest core's units, bounded below by the L2 and HBM traffic

from .model import (  # noqa: E402
    FP4_DECODE_BYTES_PER_CYCLE,
    LAUNCH_S,
    MEMORY_FIGURES,
    UB_TO_L1_BYTES_PER_CYCLE,
    VECTOR_FP32_PER_CYCLE,
)

# NOTES: FixPipe drains fp32 at 32 elements per cycle (NPU arch 3510 spec; MemoryFigures' note in model.py), i.e.
# the deep dive's 128 B/cycle/AI core.
FIXPIPE_F32_PER_CYCLE = 32
# NOTES: vector passes per score element of the online softmax (lib/flash_mla.asc.j2: Muls by the scale, Add of the
# column mask, ReduceMax, Adds of the max, Exp, ReduceSum, Cast to bf16), one per O element of each accumulation of
# the O drained from L0C (Add), two per O element of a unit's epilogue (Muls by the denominator, Cast to bf16).
SOFTMAX_PASSES = 7
EPILOGUE_PASSES = 2
# NOTES: where O accumulates (FlashMLA docs/20260930-ascend-prefill-deep-dive.md, "Where Should the FA Output
# Accumulator Live?" and "skip-scale"): S V accumulates into O in L0C; only when a tile rescales (some row's max runs
# more than RESCALE_THRES past the max in use) does FixPipe bring O to the AIVs, which add it to the accumulator in
# UB, and the Cube clears O; skip-scale "reduces the volume of FixPipe copies and the amount of VF computation". The
# first tile's rescale finds O empty (nothing to drain); past it a rescale needs a row's max to grow by e^6, which
# the model takes as not happening: O leaves L0C once per unit, at its end. (The stand-in drains O every tile; see
# docs/flash_mla.md.)
O_DRAINS_PER_UNIT = 1
# NOTES: dequant passes per element on the AIVs: FP8 decode (Cast e4m3 -> fp32), the scale (Muls), the cast to bf16;
# FP4: its decode at FP4_DECODE_BYTES_PER_CYCLE (model.py, DeepGEMM-Ascend's rate) then Muls and the cast.
DEQUANT_PASSES = {"v41_fp8": 3, "v32_fp8": 3, "v41_fp4": 2, "bf16": 0}
# NOTES: the deep dive's ND2NZ of K in UB (one SIMD pass over the bf16 tile, "peak UB read and write throughput"):
# bf16 lanes per cycle = the fp32 rate twice (256 B vector registers).
ND2NZ_BF16_PER_CYCLE = 2 * VECTOR_FP32_PER_CYCLE
# NOTES: gather2: two tokens per MTE2 request (burst_count 2), the deep dive's answer to the 16-entry issue queue.
TOKENS_PER_REQUEST = 2


@dataclass(frozen=True)
class FlashMlaCost:
    """Modelled chip time of one FlashMLA call and its parts (seconds; per-pipe figures are the busiest core's)."""

    time_s: float
    bound: str
    cube_s: float
    fixpipe_s: float
    vector_s: float
    mte2_s: float
    mte3_s: float
    l2_s: float
    hbm_s: float
    launch_s: float
    flops: float
    num_units: int
    busiest_units: int
    tiles_per_unit: float


def token_bytes(fmt: str, d_qk: int) -> int:
    return 2 * d_qk if fmt == "bf16" else TOKEN_BYTES[fmt]


def model_flash_mla(desc: FlashMlaDesc, config: FlashMlaConfig, arch: ArchSpec, *, num_units: int,
                    main_tokens: float, extra_tokens: float = 0.0, unique_bytes: float | None = None) -> FlashMlaCost:
    """The modelled time of ``num_units`` query tokens (64 heads each) attending to ``main_tokens`` (and
    ``extra_tokens``) selected tokens each on average; ``unique_bytes``: the distinct cache bytes they read (HBM;
    default: every selected token distinct)."""
    b = config.b_topk
    clock = arch.clock_hz
    d, dv = desc.d_qk, D_V
    tiles_main = -(-main_tokens // b) if main_tokens else 0
    tiles_extra = -(-extra_tokens // b) if extra_tokens else 0
    tiles = tiles_main + tiles_extra
    # Cube: Q K^T [64, B] over d_qk and S V [64, d_v] over B, bf16 fractals (16 x 16 x 16 per cycle)
    cube = (H_Q // 16) * (b // 16) * (-(-d // 16)) + (H_Q // 16) * (dv // 16) * (b // 16)
    # FixPipe: P to the AIVs every tile; O stays in L0C across the tiles that skip the rescale (O_DRAINS_PER_UNIT)
    fixpipe = H_Q * b / FIXPIPE_F32_PER_CYCLE
    half_h, half_b = H_Q // 2, b // 2  # each of the two AIVs: half the heads, half the tokens

    def vector(fmt: str) -> float:
        deq = DEQUANT_PASSES[fmt] * half_b * d / VECTOR_FP32_PER_CYCLE
        if fmt == "v41_fp4":
            deq += half_b * (d // 2) / FP4_DECODE_BYTES_PER_CYCLE
        return SOFTMAX_PASSES * half_h * b / VECTOR_FP32_PER_CYCLE + deq + half_b * d / ND2NZ_BF16_PER_CYCLE

    def mte2(fmt: str) -> float:
        # the core's gather (both AIVs): request issue (gather2) or the bytes at the core's MTE2 rate
        issue = half_b / TOKENS_PER_REQUEST * MEMORY_FIGURES.copy_issue_s * clock
        nbytes = b * token_bytes(fmt, d) / (MEMORY_FIGURES.mte2_bytes_per_s(arch) / clock)
        return max(issue, nbytes)

    # MTE3 of each AIV: its half of K (bf16) and of S into L1 (UB -> L1, DeepGEMM-Ascend's rate)
    mte3 = (half_b * d * 2 + half_h * b * 2) / UB_TO_L1_BYTES_PER_CYCLE
    per_tile = {}
    tile_cycles = 0.0
    for fmt, n in ((desc.main_format, tiles_main), (desc.extra_format, tiles_extra)):
        if not n:
            continue
        parts = {"cube": cube, "fixpipe": fixpipe, "vector": vector(fmt), "mte2": mte2(fmt), "mte3": mte3}
        for k, v in parts.items():
            per_tile[k] = per_tile.get(k, 0.0) + n * v
        tile_cycles += n * max(parts.values())
    # the unit's end: FixPipe drains O from L0C (fp32, 32 heads to each AIV), each AIV adds it to its O in UB
    # and normalises it; the drain runs while the AIVs finish the unit's last softmax, so the slower of the two
    drain_fixpipe = O_DRAINS_PER_UNIT * H_Q * dv / FIXPIPE_F32_PER_CYCLE
    drain_vector = (O_DRAINS_PER_UNIT + EPILOGUE_PASSES) * half_h * dv / VECTOR_FP32_PER_CYCLE
    epilogue = max(drain_fixpipe, drain_vector)
    busiest = -(-num_units // desc.num_ai_cores)
    core_s = busiest * (tile_cycles + epilogue) / clock
    # L2: every gathered token, Q and out; HBM: the distinct cache bytes, Q and out (cold L2)
    qo = num_units * H_Q * (d + dv) * 2
    extra_bytes = extra_tokens * token_bytes(desc.extra_format, d) if extra_tokens else 0.0
    gathered = num_units * (main_tokens * token_bytes(desc.main_format, d) + extra_bytes)
    l2_s = (gathered + qo) / arch.l2_bytes_per_s
    hbm_s = ((gathered if unique_bytes is None else unique_bytes) + qo) / arch.hbm_bytes_per_s
    # the first tile's gather is exposed once (the pipeline fills), then the busiest core, the traffic bounds
    fill_s = MEMORY_FIGURES.gm_latency_s
    time_s = LAUNCH_S + fill_s + max(core_s, l2_s, hbm_s)
    terms = {k: busiest * v / clock for k, v in per_tile.items()}
    terms["vector"] = terms.get("vector", 0.0) + busiest * drain_vector / clock
    terms["fixpipe"] = terms.get("fixpipe", 0.0) + busiest * drain_fixpipe / clock
    busy = dict(terms, l2=l2_s, hbm=hbm_s)
    bound = max(busy, key=busy.get) if busy else "latency"
    flops = 2.0 * H_Q * num_units * (main_tokens + extra_tokens) * (d + dv)
    return FlashMlaCost(time_s=time_s, bound=bound, cube_s=terms.get("cube", 0.0),
                        fixpipe_s=terms.get("fixpipe", 0.0), vector_s=terms.get("vector", 0.0),
                        mte2_s=terms.get("mte2", 0.0), mte3_s=terms.get("mte3", 0.0), l2_s=l2_s, hbm_s=hbm_s,
                        launch_s=LAUNCH_S + fill_s, flops=flops, num_units=num_units, busiest_units=busiest,
                        tiles_per_unit=tiles)

