"""What a GEMM problem is (``GemmDesc``) and what the heuristic chose for it (``GemmConfig``).

Pure data plus the capacity arithmetic in chip bytes; no numpy, no numba.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# Operand kinds and their storage bits on the chip.
DTYPE_BITS = {"bf16": 16, "fp8": 8, "fp4": 4}
OUT_DTYPE_BYTES = {"bf16": 2, "fp32": 4}
GEMM_TYPES = ("normal", "m_grouped_contiguous", "m_grouped_masked", "k_grouped_contiguous", "batched")


@dataclass(frozen=True)
class GemmDesc:
    """One GEMM problem D[m, n] (+)= A[m, k] @ B[n, k]^T, per group for the grouped kinds.

    ``m`` is the total rows for M-grouped kinds (``expected_m`` rows per group), ``k`` the total K for K-grouped.
    """

    m: int
    n: int
    k: int
    a_dtype: str = "fp8"
    b_dtype: str = "fp8"
    out_dtype: str = "bf16"
    gemm_type: str = "normal"
    num_groups: int = 1
    major_a: str = "k"  # "k" or "mn"
    major_b: str = "k"
    with_accumulation: bool = False
    num_ai_cores: int = 32

    @property
    def expected_m(self) -> int:
        if self.gemm_type in ("m_grouped_contiguous", "m_grouped_masked"):
            return max(1, -(-self.m // self.num_groups))
        return self.m

    @property
    def has_sf(self) -> bool:
        return self.a_dtype != "bf16"


@dataclass(frozen=True)
class GemmConfig:
    """The kernel config: tile sizes, stage counts and paths; every field is a template constant (UPPER_CASE)."""

    block_m: int
    block_n: int
    block_k: int
    mad_m: int
    mad_n: int
    mad_k: int
    num_l1_stages: int
    num_l0_stages: int = 2  # L0A/L0B double buffering
    num_l0c_stages: int = 2  # L0C double buffering (Mmad into one half while FixPipe drains the other)
    sf_k_blocks: int = 1  # K blocks whose scale factors one L1 SF chunk covers
    num_l1_sf_stages: int = 2
    num_ai_cores: int = 32
    swizzle_group_m: int = 4  # super-rows of M blocks in the tile order
    # NOTES: "cube" is the tiled GM -> L1 -> L0 -> Mmad path; "stream" is the small-M path that reads each B tile
    # exactly once and streams it (decode-style M); the stand-in picks it, the chip model treats both as Cube work.
    path: str = "cube"

    def to_dict(self) -> dict:
        return asdict(self)

    def template_constants(self) -> dict[str, object]:
        """UPPER_CASE names, one per field, as the templates read them."""
        return {key.upper(): value for key, value in asdict(self).items()}


def buffer_bytes(desc: GemmDesc, config: GemmConfig) -> dict[str, int]:
    """Bytes each on-chip buffer needs under ``config`` (chip layout, chip dtypes), keyed by buffer name."""
    a_bits, b_bits = DTYPE_BITS[desc.a_dtype], DTYPE_BITS[desc.b_dtype]
    l1 = config.num_l1_stages * (config.block_m * config.block_k * a_bits + config.block_n * config.block_k * b_bits)
    l1 //= 8
    if desc.has_sf:
        # One UE8M0 byte per 32 K elements per row, for A rows and B rows, per SF stage.
        sf_cols = config.sf_k_blocks * config.block_k // 32
        l1 += config.num_l1_sf_stages * (config.block_m + config.block_n) * sf_cols
    l0a = config.num_l0_stages * config.mad_m * config.mad_k * a_bits // 8
    l0b = config.num_l0_stages * config.mad_n * config.mad_k * b_bits // 8
    l0c = config.num_l0c_stages * config.mad_m * config.mad_n * 4
    ub = config.mad_m * config.mad_n * OUT_DTYPE_BYTES[desc.out_dtype]
    return {"L1": l1, "L0A": l0a, "L0B": l0b, "L0C": l0c, "UB": ub}
