"""The HC pre-norm GEMM's problem, config and cost model: D = A @ B^T in HF32 (TF32) with the row sums of squares of
A, K split into partial sums. Pure Python: (desc, arch) -> config, and the modelled chip time of a config.

What the modelled kernel does (templates/tf32_hc_prenorm_gemm.asc.j2): work units (M block, K split); per unit the
AIC streams A (bf16) and B (fp32, HF32 on the Cube) through L1 and FixPipes the fp32 partial tile to GM, while the
core's two AIVs read the same A rows and reduce their squares. With a kernel-side split (no ``num_splits`` from the
caller) the partials go to a GM workspace and, after SyncAll(), the AIVs sum them in split order into D.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..arch import ArchSpec
from .model import AIVS_PER_CORE, LAUNCH_S, MEMORY_FIGURES, VECTOR_FP32_PER_CYCLE

# NOTES: fixed tiling of the Cube part. N <= 128 is one N block (DeepGEMM allows n <= 128); MAD 128 x 128 x 64 in
# fp32 L0 halves is exactly L0A's 64 KiB double-buffered; two L1 stages of 128 x 256 bf16 A + 128 x 256 fp32 B are
# 384 KiB of the 512 KiB L1. K is split in 64-element chunks (DeepGEMM's k % 64 == 0).
MAX_N = 128
K_CHUNK = 64
BLOCK_K = 256
MAD_K = 64
NUM_L1_STAGES = 2
BLOCK_M_CANDIDATES = (16, 32, 64, 128)
SPLIT_CANDIDATES = (1, 2, 4, 8, 16, 32)
# K columns of A one AIV squares per UB pass (bf16 codes + fp32 values + fp32 squares of HALF_M rows fit the UB).
SQR_CHUNK = 256
# NOTES: HF32 Cube rate: no published 950 figure; we take half the BF16 rate (fp32 operands move twice the bytes
# through L0). The kernel is HBM-bound at every DeepSeek shape (N = 24: ~24 FLOP per byte of A), so this figure
# moves no modelled time there (bench/attention_bench.py prints the bound).
HF32_FLOPS_FRACTION = 0.5
# NOTES: SyncAll() between the partial and the reduction phase: no published figure; judged like LAUNCH_S (a
# grid-wide handshake through GM), 1 us.
SYNC_ALL_S = 1.0e-6


@dataclass(frozen=True)
class HcPrenormDesc:
    """One call: A [m, k] bf16, B [n, k] fp32; ``num_splits`` the caller's split count (0: none, D is [m, n]);
    ``deterministic``: the kernel-side split count must not depend on the core count."""

    m: int
    n: int
    k: int
    num_splits: int = 0
    num_ai_cores: int = 32
    deterministic: bool = False


@dataclass(frozen=True)
class HcPrenormConfig:
    """The kernel's choice; every field is a template constant (UPPER_CASE)."""

    block_m: int
    block_n: int
    num_splits: int  # K splits the kernel computes (the caller's, or its own when the caller gave none)
    reduce_splits: bool  # sum the splits into D after SyncAll() (kernel-side split with more than one split)
    num_ai_cores: int
    block_k: int = BLOCK_K
    mad_k: int = MAD_K
    num_l1_stages: int = NUM_L1_STAGES
    sqr_chunk: int = SQR_CHUNK

    def template_constants(self) -> dict[str, object]:
        consts = {key.upper(): value for key, value in asdict(self).items()}
        consts.update(MAD_M=self.block_m, MAD_N=self.block_n)
        return consts


@dataclass(frozen=True)
class HcPrenormCost:
    """Modelled chip time of one config and its parts (seconds)."""

    time_s: float
    cube_s: float
    mte2_s: float
    vector_s: float
    hbm_s: float
    l2_s: float
    reduce_s: float
    launch_s: float
    bound: str
    num_units: int
    num_waves: int
    hbm_bytes: int
    flops: float


def split_bounds(k: int, num_splits: int, split: int) -> tuple[int, int]:
    """[k_begin, k_end) of K split ``split``: the k / 64 chunks dealt evenly, none empty when num_splits <= k / 64."""
    chunks = k // K_CHUNK
    return split * chunks // num_splits * K_CHUNK, (split + 1) * chunks // num_splits * K_CHUNK


def model_hc_prenorm(desc: HcPrenormDesc, config: HcPrenormConfig, arch: ArchSpec) -> HcPrenormCost:
    """Modelled time of ``config`` on ``arch``: the partial phase (per core: the busiest of Cube, the AIC's MTE2 and
    the AIVs' squares, over its waves of units; for the chip: HBM and L2 traffic), then the reduction phase."""
    m, n, k, s, cores = desc.m, desc.n, desc.k, config.num_splits, config.num_ai_cores
    bm = config.block_m
    m_blocks = -(-m // bm)
    units = m_blocks * s
    waves = -(-units // cores)
    k_unit = -(-(k // K_CHUNK) // s) * K_CHUNK
    rows = min(bm, m)
    mte2 = MEMORY_FIGURES.mte2_bytes_per_s(arch)
    cube_s = 2 * bm * config.block_n * k_unit / (arch.bf16_flops_per_cycle * HF32_FLOPS_FRACTION * arch.clock_hz)
    mte2_s = (rows * k_unit * 2 + n * k_unit * 4) / mte2
    # Each AIV: its half of the rows through its own MTE2, then Cast, Mul and the row reduction on the Vector unit
    half = -(-rows // AIVS_PER_CORE)
    vector_s = half * k_unit * 2 / mte2 + 3 * half * k_unit / (VECTOR_FP32_PER_CYCLE * arch.clock_hz)
    core_s = waves * max(cube_s, mte2_s, vector_s)
    out_bytes = s * m * (n + 1) * 4
    hbm_bytes = m * k * 2 + n * k * 4 + out_bytes
    l2_bytes = 2 * m * k * 2 + m_blocks * n * k * 4 + out_bytes
    hbm_s = hbm_bytes / arch.hbm_bytes_per_s
    l2_s = l2_bytes / arch.l2_bytes_per_s
    reduce_s = 0.0
    if config.reduce_splits:
        red_bytes = out_bytes + m * (n + 1) * 4
        reduce_s = SYNC_ALL_S + red_bytes / min(arch.l2_bytes_per_s, AIVS_PER_CORE * cores * mte2)
        hbm_bytes += m * (n + 1) * 4
    phase_s = max(core_s, hbm_s, l2_s)
    parts = {"cube": waves * cube_s, "mte2": waves * mte2_s, "vector": waves * vector_s, "hbm": hbm_s, "l2": l2_s}
    bound = max(parts, key=lambda key: parts[key])
    if LAUNCH_S + reduce_s > phase_s:
        bound = "latency"
    return HcPrenormCost(
        time_s=LAUNCH_S + phase_s + reduce_s, cube_s=waves * cube_s, mte2_s=waves * mte2_s,
        vector_s=waves * vector_s, hbm_s=hbm_s, l2_s=l2_s, reduce_s=reduce_s, launch_s=LAUNCH_S, bound=bound,
        num_units=units, num_waves=waves, hbm_bytes=hbm_bytes, flops=2.0 * m * n * k,
    )


def _configs(desc: HcPrenormDesc, cores: int, splits: tuple[int, ...]) -> list[HcPrenormConfig]:
    block_n = -(-desc.n // 16) * 16
    out = []
    for s in splits:
        for bm in BLOCK_M_CANDIDATES:
            if bm > 16 and bm // 2 >= desc.m:  # a smaller block already covers every row
                continue
            out.append(HcPrenormConfig(block_m=bm, block_n=block_n, num_splits=s,
                                       reduce_splits=desc.num_splits == 0 and s > 1, num_ai_cores=cores))
    return out


def _best(configs: list[HcPrenormConfig], desc: HcPrenormDesc, arch: ArchSpec) -> HcPrenormConfig:
    # NOTES: ties (equal modelled time within 0.1 %) go to the earlier candidate: fewer splits, then smaller blocks.
    best, best_t = None, math.inf
    for c in configs:
        t = model_hc_prenorm(desc, c, arch).time_s
        if t < best_t * 0.999:
            best, best_t = c, t
    return best


def get_hc_prenorm_config(desc: HcPrenormDesc, arch: ArchSpec) -> HcPrenormConfig:
    """The fastest config under the cost model. The caller's ``num_splits`` is kept; without it the kernel picks its
    own split count, and in deterministic mode picks it for the arch's full core count, so the partial sums (and D,
    bit for bit) do not depend on how many logical cores run the kernel."""
    chunks = desc.k // K_CHUNK
    if desc.num_splits:
        splits = (desc.num_splits,)
    else:
        splits = tuple(s for s in SPLIT_CANDIDATES if s <= chunks)
        if desc.deterministic:
            full = HcPrenormDesc(desc.m, desc.n, desc.k, 0, arch.num_ai_cores, True)
            splits = (_best(_configs(full, arch.num_ai_cores, splits), full, arch).num_splits,)
    return _best(_configs(desc, desc.num_ai_cores, splits), desc, arch)
