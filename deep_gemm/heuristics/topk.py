"""The top-k kernel's problem and config (templates/topk.asc.j2): how many blocks (AIVs) run it, the UB tile of the
row scan, the candidate slack before a compaction and the top-k capacity tier. Pure Python: (desc, arch) -> config.

The kernel is a Vector kernel (no Cube): one block per AIV, rows dealt cyclically over the blocks; each row is read
once through the UB and reduced by a threshold filter with periodic radix-select compactions (DeepSelect's
algorithm; its Ascend kernel is a one-row-per-block ``__vector__`` kernel too).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..arch import ArchSpec
from .model import AIVS_PER_CORE

# NOTES: DeepSelect's top-k tiers (its launchers instantiate the kernel for topk <= 512, <= 1024 and <= 4096); the
# tier sizes the candidate buffers, so a smaller k takes a smaller UB plan.
TOPK_TIERS = (512, 1024, 4096)
MAX_TOPK = TOPK_TIERS[-1]
# Input tile per UB stage (elements), two stages. DeepSelect's Ascend plan streams 16 Ki-element blocks in three
# stages; we take 4 Ki (8-16 KiB): every candidate buffer of the 4096 tier then still fits the 910B2's 192 KiB UB.
TILE = 4096
# Candidates appended before a compaction: DeepSelect's deep-dive takes B2 = k (B = B2 = 1024 for k = 512); its
# Ascend plans use 1536-4096. At least 1024 keeps the compactions of a small k rare.
MIN_FILTER_B2 = 1024
RADIX_BINS = 256
HIST_SIZE = 4 * RADIX_BINS  # device/select.py RadixSelect's scratch
NUM_STAGES = 2
# Elements sampled (strided over a long row) for its starting threshold; each lands in its own 32-byte UB block
# (a strided MTE2 copy of single elements). DeepSelect instead warms up on the first pages of its shuffled order.
SAMPLE = 1024
SAMPLE_BLOCK_BYTES = 32


@dataclass(frozen=True)
class TopkDesc:
    """One call: ``num_rows`` rows of ``vocab`` elements (``dtype`` "bf16" | "fp32"), ``topk`` per row, indices of
    ``idx_dtype`` ("int32" | "int64"), on ``num_ai_cores`` AI cores."""

    num_rows: int
    vocab: int
    topk: int
    dtype: str
    idx_dtype: str
    num_ai_cores: int = 32


@dataclass(frozen=True)
class TopkConfig:
    """The kernel's choice; every field is a template constant (UPPER_CASE)."""

    num_ai_cores: int  # launched blocks: the AIVs (AIVS_PER_CORE per AI core)
    max_topk: int
    tile: int
    filter_b2: int
    sample: int = SAMPLE

    def template_constants(self) -> dict[str, object]:
        return {key.upper(): value for key, value in asdict(self).items()}


def ub_bytes_needed(dtype: str, idx_dtype: str, max_topk: int, tile: int, filter_b2: int, sample: int) -> int:
    """The UB the kernel allocates (templates/topk.asc.j2 UB_USED): input stages, candidates, sort scratch,
    histogram and state, the sample and its keys, output rows."""
    bits = 2 if dtype == "bf16" else 4
    idx = 4 if idx_dtype == "int32" else 8
    cand = max_topk + filter_b2 + tile
    return (NUM_STAGES * tile * bits + cand * 8 + max_topk * 8 + HIST_SIZE * 4 + 32
            + sample * (SAMPLE_BLOCK_BYTES + 4) + max_topk * (bits + idx))


def get_topk_config(desc: TopkDesc, arch: ArchSpec) -> TopkConfig:
    """The tier of ``desc.topk`` and the first UB plan that fits, in order of preference: the candidate slack from
    the tier down to MIN_FILTER_B2 / 2 (a smaller slack only means more compactions), then half the sample, then
    half the tile; one block per AIV."""
    tier = next(t for t in TOPK_TIERS if desc.topk <= t)
    for tile in (TILE, TILE // 2):
        for sample in (SAMPLE, SAMPLE // 2):
            b2 = max(MIN_FILTER_B2, tier)
            while b2 >= MIN_FILTER_B2 // 2:
                if ub_bytes_needed(desc.dtype, desc.idx_dtype, tier, tile, b2, sample) <= arch.ub_bytes:
                    return TopkConfig(num_ai_cores=AIVS_PER_CORE * desc.num_ai_cores, max_topk=tier, tile=tile,
                                      filter_b2=b2, sample=sample)
                b2 //= 2
    raise ValueError(f"no top-k UB plan fits {arch.name}'s {arch.ub_bytes} B UB for {desc}")
