"""What a GEMM problem is (``GemmDesc``) and what the heuristic chose for it (``GemmConfig``).

Pure data plus the capacity arithmetic in chip bytes; no numpy, no numba.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..arch import ArchSpec

# Operand kinds and their storage bits on the chip.
DTYPE_BITS = {"bf16": 16, "fp8": 8, "fp4": 4}
# NOTES: "fp8" is D in float8_e4m3fn with the FP8Quantization epilogue: one UE8M0 scale per row per 32 columns
# (another N / 32 bytes per row), computed by the AIVs from the fp32 tiles the AIC hands them (a mixed kernel).
OUT_DTYPE_BYTES = {"bf16": 2, "fp32": 4, "fp8": 1}
EPILOGUE_UB_STAGES = 2  # fp32 half MAD tiles per AIV in flight (lib/mixed.asc.j2's NUM_UB_STAGES)
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
    # NOTES: "cube" is the tiled GM -> L1 -> L0 -> Mmad path; "stream" is the small-M path (decode-style M): one
    # M-block covers the rows, A stays resident in L1 when it fits, and each B tile is read exactly once.
    path: str = "cube"

    def to_dict(self) -> dict:
        return asdict(self)

    def template_constants(self) -> dict[str, object]:
        """UPPER_CASE names, one per field, as the templates read them."""
        return {key.upper(): value for key, value in asdict(self).items()}


def cube_operand_bits(desc: GemmDesc) -> tuple[int, int]:
    """Bits per element of A and B as they sit in L1 and L0 on the chip.

    NOTES: for fp8 x fp4 the AIVs decode B to FP8 (UB -> L1) before the Cube sees it, as DeepGEMM-Ascend's
    dequant kernel does; every other pair keeps its GM format.
    """
    a_bits, b_bits = DTYPE_BITS[desc.a_dtype], DTYPE_BITS[desc.b_dtype]
    if desc.a_dtype == "fp8" and desc.b_dtype == "fp4":
        b_bits = 8
    return a_bits, b_bits


def buffer_bytes(desc: GemmDesc, config: GemmConfig) -> dict[str, int]:
    """Bytes each on-chip buffer needs under ``config`` (chip layout, chip dtypes), keyed by buffer name."""
    a_bits, b_bits = cube_operand_bits(desc)
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
    if desc.out_dtype == "fp8":
        ub = fp8_epilogue_ub_bytes(config.mad_m, config.mad_n)
    return {"L1": l1, "L0A": l0a, "L0B": l0b, "L0C": l0c, "UB": ub}


def fp8_epilogue_ub_bytes(mad_m: int, mad_n: int) -> int:
    """UB bytes one AIV needs for the FP8-output epilogue (templates/lib/epilogue.asc.j2's layout): the fp32 hand-off
    stages of half a MAD tile, |x|, the e4m3 codes and the per-32-column scale tables, each 32-byte aligned."""
    half, groups = mad_m // 2, mad_n // 32

    def a32(x: int) -> int:
        return -(-x // 32) * 32

    tile = a32(half * mad_n * 4)
    return (EPILOGUE_UB_STAGES + 1) * tile + a32(half * mad_n) + 2 * a32(groups * half * 4) + 2 * a32(groups * half) \
        + a32(32 * 4)


def stream_l1_bytes(desc: GemmDesc, config: GemmConfig, depth: int | None = None) -> int:
    """L1 bytes of the stream path with A resident: BLOCK_M rows x all of K (``depth``, default ``desc.k``) of A
    and its scales, plus the B stages and B's scale ring (same arithmetic as ``device.capacity``)."""
    a_bits, b_bits = cube_operand_bits(desc)
    k_padded = -(-(desc.k if depth is None else depth) // config.block_k) * config.block_k
    nbytes = config.block_m * k_padded * a_bits // 8
    nbytes += config.num_l1_stages * config.block_n * config.block_k * b_bits // 8
    if desc.has_sf:
        nbytes += config.block_m * (k_padded // 32)
        nbytes += config.num_l1_sf_stages * config.block_n * config.sf_k_blocks * config.block_k // 32
    return nbytes


# Operand pairs the Cube accepts (A dtype, B dtype); fp4 x fp8 is rejected as upstream (A is the wider one).
DTYPE_PAIRS = (("bf16", "bf16"), ("fp8", "fp8"), ("fp8", "fp4"), ("fp4", "fp4"))
MAJORS = ("k", "mn")
PATHS = ("cube", "stream")
# NOTES: DeepGEMM-Ascend caps BLOCK_M/BLOCK_N at 512 (BF16, FP8) and at 256 when an operand is FP4.
MAX_BLOCK_MN = {"bf16": 512, "fp8": 512, "fp4": 256}
# M-grouped contiguous layouts align each group to 256 rows and use BLOCK_M 256 (runtime mk alignment).
M_GROUPED_BLOCK_M = 256
SF_K_GRANULE = 64  # K elements per packed int16 UE8M0 pair; MX MADs step K in these units


def cube_dtype(a_dtype: str, b_dtype: str) -> str:
    """The dtype whose Cube rate a pair runs at: the wider operand (fp8 x fp4 runs at the FP8 rate)."""
    return a_dtype if DTYPE_BITS[a_dtype] >= DTYPE_BITS[b_dtype] else b_dtype


def k_alignment(desc: GemmDesc) -> int:
    """K granule (elements) of MAD_K and BLOCK_K: one 32 B fractal row of the narrowest operand, 64 with scales."""
    narrow_bits = min(DTYPE_BITS[desc.a_dtype], DTYPE_BITS[desc.b_dtype])
    align = 32 * 8 // narrow_bits
    return max(align, SF_K_GRANULE) if desc.has_sf else align


def mn_alignment(dtype: str, major: str, frac_mn: int = 16) -> int:
    """M (or N) granule of an operand's MAD tile: 16 rows, or 32 B of elements for an MN-major (transposed) load."""
    return max(frac_mn, 32 * 8 // DTYPE_BITS[dtype]) if major == "mn" else frac_mn


def check_desc(desc: GemmDesc) -> None:
    """Raise ValueError/TypeError naming the field if ``desc`` is not a GEMM the kernels accept."""
    for name in ("m", "n", "k", "num_groups", "num_ai_cores"):
        value = getattr(desc, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r}")
        if value < 1:
            raise ValueError(f"{name}={value} must be >= 1")
    if (desc.a_dtype, desc.b_dtype) not in DTYPE_PAIRS:
        raise ValueError(
            f"a_dtype={desc.a_dtype!r} b_dtype={desc.b_dtype!r} is not a supported pair; allowed: {DTYPE_PAIRS}"
        )
    if desc.out_dtype not in OUT_DTYPE_BYTES:
        raise ValueError(f"out_dtype={desc.out_dtype!r}; allowed: {tuple(OUT_DTYPE_BYTES)}")
    if desc.gemm_type not in GEMM_TYPES:
        raise ValueError(f"gemm_type={desc.gemm_type!r}; allowed: {GEMM_TYPES}")
    if desc.gemm_type == "normal" and desc.num_groups != 1:
        raise ValueError(f"num_groups={desc.num_groups} must be 1 for gemm_type='normal'")
    if desc.out_dtype == "fp8" and (desc.with_accumulation or desc.n % 64):
        raise ValueError(f"FP8 output (the FP8Quantization epilogue) needs N % 64 == 0 and no accumulation: "
                         f"n={desc.n} with_accumulation={desc.with_accumulation}")
    if desc.major_a not in MAJORS or desc.major_b not in MAJORS:
        raise ValueError(f"major_a={desc.major_a!r} major_b={desc.major_b!r}; allowed: {MAJORS}")


def config_violations(desc: GemmDesc, config: GemmConfig, arch: ArchSpec) -> list[str]:
    """Every capacity or alignment rule ``config`` breaks for ``desc`` on ``arch`` (empty list: legal).

    Rules: each buffer of ``buffer_bytes`` fits the arch; MAD M/N multiples of 16 (32 B of elements for an
    MN-major operand) dividing the block; MAD K a multiple of 32 B of elements (and of 64 with scale factors)
    dividing BLOCK_K; BLOCK_M x BLOCK_N fp32 fits L0C; at least 2 L1 stages, 2 L0 stages, 2 L0C stages.
    """
    c = config
    bad: list[str] = []
    capacity = {"L1": arch.l1_bytes, "L0A": arch.l0a_bytes, "L0B": arch.l0b_bytes, "L0C": arch.l0c_bytes,
                "UB": arch.ub_bytes}
    for name, used in buffer_bytes(desc, c).items():
        if used > capacity[name]:
            bad.append(f"{name} needs {used} B > {capacity[name]} B")
    if c.block_m * c.block_n * 4 > arch.l0c_bytes:
        bad.append(f"block_m*block_n*4 = {c.block_m * c.block_n * 4} B > L0C {arch.l0c_bytes} B")
    am = mn_alignment(desc.a_dtype, desc.major_a, arch.frac_mn)
    an = mn_alignment(desc.b_dtype, desc.major_b, arch.frac_mn)
    for name, value, align in (("mad_m", c.mad_m, am), ("mad_n", c.mad_n, an)):
        if value < align or value % align:
            bad.append(f"{name}={value} is not a positive multiple of {align}")
    if c.mad_m and c.block_m % c.mad_m:
        bad.append(f"block_m={c.block_m} is not a multiple of mad_m={c.mad_m}")
    if c.mad_n and c.block_n % c.mad_n:
        bad.append(f"block_n={c.block_n} is not a multiple of mad_n={c.mad_n}")
    ka = k_alignment(desc)
    if c.mad_k < ka or c.mad_k % ka:
        bad.append(f"mad_k={c.mad_k} is not a positive multiple of {ka}")
    if c.mad_k and c.block_k % c.mad_k:
        bad.append(f"block_k={c.block_k} is not a multiple of mad_k={c.mad_k}")
    if c.num_l1_stages < 2 or c.num_l0_stages < 2 or c.num_l0c_stages < 2:
        bad.append(f"stages L1={c.num_l1_stages} L0={c.num_l0_stages} L0C={c.num_l0c_stages}: each must be >= 2")
    if desc.has_sf and (c.sf_k_blocks < 1 or c.num_l1_sf_stages < 1):
        bad.append(f"sf_k_blocks={c.sf_k_blocks} num_l1_sf_stages={c.num_l1_sf_stages} must be >= 1")
    if not 1 <= c.num_ai_cores <= arch.num_ai_cores:
        bad.append(f"num_ai_cores={c.num_ai_cores} not in [1, {arch.num_ai_cores}]")
    if c.path not in PATHS:
        bad.append(f"path={c.path!r} not in {PATHS}")
    if desc.out_dtype == "fp8" and (c.mad_n % 64 or c.mad_m % 2):
        bad.append(f"mad_n={c.mad_n} must be a multiple of 64 (and mad_m={c.mad_m} even) for FP8 output: each MAD "
                   "tile covers whole pairs of 32-column scale groups, its rows split between the two AIVs")
    if desc.gemm_type == "m_grouped_contiguous" and c.block_m != M_GROUPED_BLOCK_M:
        bad.append(f"block_m={c.block_m} must be {M_GROUPED_BLOCK_M} for m_grouped_contiguous")
    return bad


def layout_problem(gemm_type: str, m: int, k: int, group_sizes=None, ks=None) -> tuple[int, int, int]:
    """(m, k, num_groups) a GemmDesc models for an actual grouped layout (the desc-level view of it).

    ``group_sizes`` (M-grouped kinds: each group's real rows, or masked_m) or ``ks`` (K-grouped: each group's K):
    empty groups are dropped (the schedule gives them no tile) and the rest are modelled at their mean size, so
    m (k) becomes the real total and num_groups the count of non-empty groups. Without a layout, (m, k, None).
    Raises ValueError naming the argument for negative sizes or a layout with no work.
    """
    sizes, name = (group_sizes, "group_sizes") if group_sizes is not None else (ks, "ks")
    if sizes is None:
        return m, k, None
    sizes = [int(s) for s in sizes]
    bad = [i for i, s in enumerate(sizes) if s < 0]
    if bad:
        raise ValueError(f"{name}[{bad[0]}]={sizes[bad[0]]} is negative")
    live = [s for s in sizes if s]
    if not live:
        raise ValueError(f"{name}={sizes} has no non-empty group: nothing to model")
    if name == "ks":
        return m, sum(live), len(live)
    return sum(live), k, len(live)
