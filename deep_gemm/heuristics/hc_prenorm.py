"""The HC pre-norm GEMM's problem, config and cost model: D = A @ B^T in HF32 (TF32) with the row sums of squares of
A, K split into partial sums. Pure Python: (desc, arch) -> config, the work plan of every core, and the modelled
chip time of a config.

What the kernel does (templates/tf32_hc_prenorm_gemm.asc.j2, organised as DeepGEMM-Ascend's TileLang kernel):
* K is split over groups of cores (split s = the cores s * cores_per_split ...; the 64-element K chunks dealt
  evenly), M in token blocks of 128 rows. A work unit is one core's share of one split over up to
  ``num_l0c_stages`` token blocks (token blocks j, j + cores_per_split, ... of a chunk): one fp32 accumulator of
  128 x block_n per token block, all resident in L0C while the unit walks its split's K in 256-wide hidden blocks.
* Per hidden block the AIC loads B (fp32, rounded to HF32) GM -> L1 -> L0B once, for every token block of the
  unit. Per token block the two AIVs load A from GM once (64 rows each, bf16), widen it to fp32 on the Vector
  unit, add the row sums of its squares to the unit's running sums, and hand the fp32 tile to the AIC (UB -> L1 on
  the chip); the AIC loads it L1 -> L0A and runs the Cube into that token block's accumulator. So A crosses HBM
  once and B once per unit, not once per M block.
* After the unit's K range: FixPipe writes each accumulator (fp32) and the AIVs the row sums. The splits are summed
  in split order: on the chip through ordered store phases (split 0 stores, the others add: one phase per split in
  deterministic mode, split 0 then all the others concurrently otherwise, a cross-core barrier after a phase).
  The stand-in keeps the same order with a GM workspace and one reduction phase after SyncAll() (state crosses a
  SyncAll() only through GM on the CPU).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..arch import ArchSpec
from .model import (
    AIVS_PER_CORE,
    LAUNCH_S,
    MAD_ISSUE_CYCLES,
    MEMORY_FIGURES,
    UB_TO_L1_BYTES_PER_CYCLE,
    MemoryFigures,
    _copy_s,
    _Links,
)

# NOTES: the tiling of DeepGEMM-Ascend's kernel (deep_gemm/tilelang_ops/hc_prenorm.py): token blocks of 128 rows
# (64 per AIV), hidden (K) blocks of 256, MADs of 64 in K, N padded to the 16-row fractal; the L0C holds as many
# 128 x block_n fp32 accumulators as fit (16 for N = 24). N <= 128 here (DeepGEMM's limit; the chip's kernel takes
# N <= 64, where the four 64-K slices of B stay in L0B for a hidden block; above that the stand-in reloads them).
MAX_N = 128
K_CHUNK = 64
BLOCK_M = 128
BLOCK_K = 256
MAD_K = 64
# UB ring of the AIVs: A's bf16 codes (GM -> UB) and the widened fp32 tiles handed to the AIC. The chip's kernel has
# 3 and 2; the stand-in has 2 and 2 (its UB held the squares until they moved into one VF, CastReduceSumSquares,
# as the chip's; a third codes stage would fit now, and changes nothing on the CPU, where the stages run in turn).
NUM_LOAD_STAGES = 2
NUM_CAST_STAGES = 2
# NOTES: the Vector unit's time for one AIV half tile (64 rows x 256 of A: widen to fp32, square, add, row sums,
# store the fp32 tile): 640 cycles, the latency DeepGEMM-Ascend's kernel declares for that SIMD block
# (T.SimdVF(latency=640)). It runs over all 64 rows whatever the valid count; shorter hidden blocks pro rata.
VF_CYCLES_PER_HALF_TILE = 640
# NOTES: HF32 Cube: the fp32 fractal is 16 x 8 (C0 = 32 B / 4 B, ascend_hardware.md A3), so one cycle is a
# 16 x 16 x 8 block: half the BF16 rate. A MAD holds the Cube at least MAD_ISSUE_CYCLES["bf16"] (the K-tile sweep).
HF32_C0 = 8
HF32_FLOPS_FRACTION = 0.5
# NOTES: FixPipe drains fp32 at 32 elements per cycle (NPU arch 3510 spec, ascend_memory_latency.md).
FIXPIPE_F32_PER_CYCLE = 32
# NOTES: a cross-core barrier between store phases (ascend_sync_inter_arrive / wait): each core writes its flag to
# GM and reads the others'; we charge two loaded GM latencies (MemoryFigures.gm_latency_s, the 8 KB ND2NZ copy).
BARRIER_GM_TRIPS = 2
# NOTES: SyncAll() before the stand-in's reduction phase (no chip counterpart: the chip's splits add in place).
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
    reduce_splits: bool  # sum the splits into D in split order (kernel-side split with more than one split)
    num_ai_cores: int  # the launch grid: the target's cores, fewer when there are fewer units (get_hc_prenorm_config)
    cores_per_split: int = 1  # cores sharing one split's token blocks
    num_l0c_stages: int = 16  # token blocks (fp32 accumulators) resident in L0C per unit
    keep_l0b: bool = True  # the hidden block's four 64-K slices of B stay in L0B for every token block
    block_k: int = BLOCK_K
    mad_k: int = MAD_K
    num_load_stages: int = NUM_LOAD_STAGES
    num_cast_stages: int = NUM_CAST_STAGES

    def template_constants(self) -> dict[str, object]:
        return {key.upper(): value for key, value in asdict(self).items()}


@dataclass(frozen=True)
class HcPrenormCost:
    """Modelled chip time of one config and its parts (seconds). ``cube_s`` ... ``ub_to_l1_s``: the busiest core's
    pipe busy times; ``fill_s`` what the first token block exposes, ``store_s`` the store phases (FixPipe out,
    barriers), ``hbm_s`` / ``l2_s`` the chip's traffic."""

    time_s: float
    cube_s: float
    mte1_s: float
    mte2_s: float  # the AIC's GM -> L1 copies of B
    aiv_mte2_s: float  # one AIV's GM -> UB copies of A
    vector_s: float
    ub_to_l1_s: float
    fixpipe_s: float
    hbm_s: float
    l2_s: float
    fill_s: float
    store_s: float
    reduce_s: float  # the stand-in's SyncAll() + reduction phase: 0 (the chip adds the splits in its store phases)
    launch_s: float
    bound: str
    num_units: int
    num_waves: int  # units of the busiest core
    active_cores: int
    hbm_bytes: int
    l2_bytes: int
    flops: float


# Work plan (shared by the model, the kernel's launcher and the tests) -------------------------------------------


def split_bounds(k: int, num_splits: int, split: int) -> tuple[int, int]:
    """[k_begin, k_end) of K split ``split``: the k / 64 chunks dealt evenly, none empty when num_splits <= k / 64."""
    chunks = k // K_CHUNK
    return split * chunks // num_splits * K_CHUNK, (split + 1) * chunks // num_splits * K_CHUNK


def num_token_blocks(m: int, config: HcPrenormConfig) -> int:
    return -(-m // config.block_m)


def num_units(m: int, config: HcPrenormConfig) -> int:
    """Work units: chunk-major, then split, then core within the split; core c runs units c, c + P, ..."""
    per_chunk = config.cores_per_split * config.num_l0c_stages
    chunks = -(-num_token_blocks(m, config) // per_chunk)
    return chunks * config.num_splits * config.cores_per_split


def unit_plan(m: int, config: HcPrenormConfig, u: int) -> tuple[int, int, int]:
    """(split, first token block, token blocks) of unit ``u``; its token blocks are first, first + cores_per_split,
    ... (0 token blocks: a tail unit with nothing to do)."""
    cps, stages = config.cores_per_split, config.num_l0c_stages
    chunk, rest = divmod(u, config.num_splits * cps)
    split, j = divmod(rest, cps)
    first = chunk * cps * stages + j
    blocks = num_token_blocks(m, config)
    count = 0 if first >= blocks else min(stages, -(-(blocks - first) // cps))
    return split, first, count


# Config --------------------------------------------------------------------------------------------------------


def _low_bit(x: int) -> int:
    return x & -x


def _kernel_splits(m: int, k: int, cores: int, stages: int) -> int:
    """DeepGEMM-Ascend's split count: the largest power of two within the token blocks' room in L0C over the cores
    (cores * stages / token blocks), the hidden blocks' and the cores' largest power-of-two factors."""
    token_blocks = -(-m // BLOCK_M)
    hidden_blocks = -(-k // BLOCK_K)
    limit = min(max(1, cores * stages // token_blocks), _low_bit(hidden_blocks), _low_bit(cores))
    return 1 << (limit.bit_length() - 1)


def _stages(n: int, arch: ArchSpec) -> int:
    block_n = -(-n // 16) * 16
    return max(1, arch.l0c_bytes // (BLOCK_M * block_n * 4))


def get_hc_prenorm_config(desc: HcPrenormDesc, arch: ArchSpec) -> HcPrenormConfig:
    """The chip kernel's config. The caller's ``num_splits`` is kept; without it the kernel picks its own split count
    (DeepGEMM-Ascend's rule), in deterministic mode for the arch's full core count, so the partial sums (and D, bit for
    bit) do not depend on how many logical cores run the kernel."""
    block_n = -(-desc.n // 16) * 16
    stages = _stages(desc.n, arch)
    cores = desc.num_ai_cores
    if desc.num_splits:
        splits = desc.num_splits
    else:
        split_cores = arch.num_ai_cores if desc.deterministic else cores
        splits = _kernel_splits(desc.m, desc.k, split_cores, stages)
    token_blocks = -(-desc.m // BLOCK_M)
    cps = max(1, min(cores // splits, token_blocks))
    keep_l0b = BLOCK_K // MAD_K * block_n * MAD_K * 4 <= arch.l0b_bytes
    # NOTES: a launch grid of no more cores than there are units (decode: 16 splits of one token block on 32 cores).
    # The chip model is unchanged (a core without a unit is neither active nor the busiest; the stand-in's reduction
    # phase is not modelled), and so are the bits (each unit's work and the split order of the sum do not depend on
    # the grid); the stand-in no longer sets up sub-cores that have nothing to do, twice (both phases).
    units = -(-token_blocks // (cps * stages)) * splits * cps
    return HcPrenormConfig(block_m=BLOCK_M, block_n=block_n, num_splits=splits,
                           reduce_splits=desc.num_splits == 0 and splits > 1, num_ai_cores=max(1, min(cores, units)),
                           cores_per_split=cps, num_l0c_stages=stages, keep_l0b=keep_l0b)


# Model ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UnitWork:
    """What one unit moves and computes on its core, counted as the kernel does it (tests/api/test_hc_work_model.py
    checks these against a dry run of the template): bytes GM -> L1 (B), GM -> UB (A, per AIV), UB -> L1 (the fp32
    A tiles), L1 -> L0 (A, B), FixPipe elements, MADs, vector half-tile passes, and the pipe seconds."""

    b_gm_bytes: int
    a_gm_bytes: tuple[int, int]
    a_ub_to_l1_bytes: int
    l0a_bytes: int
    l0b_bytes: int
    fixpipe_elems: int
    mads: int
    half_tiles: tuple[int, int]
    pipes: dict
    fill_s: float


def unit_work(desc: HcPrenormDesc, config: HcPrenormConfig, arch: ArchSpec, u: int,
              links_a: _Links | None = None, links_b: _Links | None = None) -> UnitWork:
    """The work of unit ``u`` (zero for a tail unit with no token blocks); with ``links_*`` its pipe times too."""
    m, n, k = desc.m, desc.n, desc.k
    c, clock, half = config, arch.clock_hz, config.block_m // AIVS_PER_CORE
    split, first, count = unit_plan(m, c, u)
    k_begin, k_end = split_bounds(k, c.num_splits, split)
    rows = [min(c.block_m, m - (first + i * c.cores_per_split) * c.block_m) for i in range(count)]
    b_gm = a_ub_l1 = l0a = l0b = mads = 0
    a_gm = [0, 0]
    halves = [0, 0]
    pipe = dict.fromkeys(("cube", "mte1", "mte2", "aiv_mte2", "vector", "ub_to_l1", "fixpipe"), 0.0)
    fill_s = 0.0
    for k0 in range(k_begin, k_end, c.block_k) if count else ():
        kk = min(c.block_k, k_end - k0)
        k_mads = -(-kk // c.mad_k)
        b_bytes = n * kk * 4
        b_gm += b_bytes
        stage_l0b = c.block_n * kk * 4
        if c.keep_l0b:
            l0b += stage_l0b
        b_s = _copy_s(links_b, b_bytes, n, links_b.hbm_frac_b, links_b.slow_b)[0] if links_b else 0.0
        steady = 0.0
        for r in rows:
            parts = (min(half, r), max(0, r - half))
            st = dict.fromkeys(pipe, 0.0)
            for v, rv in enumerate(parts):
                if rv:
                    a_gm[v] += rv * kk * 2
                    halves[v] += 1
            a_ub_l1 += r * kk * 4
            l0a += r * kk * 4
            halves_with_rows = sum(1 for rv in parts if rv)
            reload_b = 0 if c.keep_l0b else halves_with_rows * stage_l0b  # B's slices per MAD of each half
            l0b += reload_b
            mads += halves_with_rows * k_mads
            if links_a:
                # per AIV (AIV0 carries the larger half): its A copy, its Vector pass, its UB -> L1 copy (the chip
                # copies the whole 64-row half tile)
                st["aiv_mte2"] = _copy_s(links_a, parts[0] * kk * 2, parts[0], 1.0, links_a.slow_a)[0]
                st["vector"] = VF_CYCLES_PER_HALF_TILE * kk / BLOCK_K / clock
                st["ub_to_l1"] = half * kk * 4 / UB_TO_L1_BYTES_PER_CYCLE / clock
                st["mte1"] = (r * kk * 4 + reload_b) / arch.l1_to_l0_bytes_per_cycle / clock
                fractal = -(-r // arch.frac_mn) * -(-n // arch.frac_mn) * -(-kk // HF32_C0)
                st["cube"] = max(fractal, k_mads * MAD_ISSUE_CYCLES["bf16"]) / clock
                for key in st:
                    pipe[key] += st[key]
                steady += max(st.values())
                if not fill_s:
                    # the first token block's chain (A copy's issue and latency, then each pipe in turn) beyond its
                    # slowest pipe, which the steady state counts
                    chain = links_a.issue_s + links_a.latency_s + sum(st.values())
                    fill_s = max(b_s, chain) - max(st.values())
        pipe["mte2"] += b_s
        pipe["_core"] = pipe.get("_core", 0.0) + max(b_s, steady)
    fix = sum(rows) * n  # FixPipe writes the valid rows and columns of each accumulator
    if links_a:
        pipe["fixpipe"] = fix / FIXPIPE_F32_PER_CYCLE / clock + (links_a.issue_s + links_a.latency_s if count else 0.0)
    return UnitWork(b_gm, (a_gm[0], a_gm[1]), a_ub_l1, l0a, l0b, fix, mads, (halves[0], halves[1]), pipe, fill_s)


def _links(desc: HcPrenormDesc, config: HcPrenormConfig, arch: ArchSpec, active: int, hbm_frac_b: float,
           f: MemoryFigures) -> tuple[_Links, _Links]:
    """GM conditions of one core's copies: the AIVs' A copies (from HBM, shared by 2 * active AIVs) and the AIC's B
    copies (a fraction from HBM, the rest from L2, shared by the active AICs)."""
    rate = f.mte2_bytes_per_s(arch)
    half = config.block_m // AIVS_PER_CORE
    a_inflight = max(1, config.num_load_stages - 1) * half * config.block_k * 2
    b_inflight = config.block_n * config.block_k * 4  # the pipelined hidden loop: one B block ahead
    aivs = AIVS_PER_CORE * active
    sharers_b = min(active, config.cores_per_split)
    links_a = _Links(rate, a_inflight, arch.hbm_bytes_per_s / aivs, arch.l2_bytes_per_s / aivs, f.gm_latency_s,
                     f.copy_issue_s, 1.0, 1.0, 1.0, 1.0, f)
    links_b = _Links(rate, b_inflight, arch.hbm_bytes_per_s / active, arch.l2_bytes_per_s / active, f.gm_latency_s,
                     f.copy_issue_s, 1.0, hbm_frac_b, 1.0, f.same_address_factor(sharers_b), f)
    return links_a, links_b


def model_hc_prenorm(desc: HcPrenormDesc, config: HcPrenormConfig, arch: ArchSpec,
                     figures: MemoryFigures = MEMORY_FIGURES) -> HcPrenormCost:
    """Modelled chip time of ``config``: launch + the busiest core (its first token block's fill, then per hidden
    block the slower of B's copy and its token blocks' slowest pipes), or the chip's HBM / L2 traffic if slower, + the
    store phases of its units (FixPipe of the accumulators, a barrier after a phase)."""
    m, n, k = desc.m, desc.n, desc.k
    c, cores = config, config.num_ai_cores
    units = num_units(m, c)
    live = [u for u in range(units) if unit_plan(m, c, u)[2]]
    active = min(cores, len({u % cores for u in live})) or 1

    # Chip traffic (cold L2): A once (the AIVs), B once, D and the row sums out once (after the splits' adds in L2).
    b_reads = sum(unit_work(desc, c, arch, u).b_gm_bytes for u in live)
    out_bytes = m * (n + 1) * 4
    outputs = c.num_splits * out_bytes  # every split's store (adds in L2 after the first)
    hbm_bytes = m * k * 2 + n * k * 4 + (out_bytes if c.num_splits == 1 or c.reduce_splits else outputs)
    l2_bytes = m * k * 2 + b_reads + outputs * (2 if c.reduce_splits else 1)
    hbm_frac_b = min(1.0, n * k * 4 / max(1, b_reads))
    links_a, links_b = _links(desc, c, arch, active, hbm_frac_b, figures)

    # The busiest core: core 0 runs units 0, P, 2P, ... (the first of each round has the most token blocks)
    busiest = [u for u in range(0, units, cores)]
    pipe = {}
    core_s = fill_s = store_one = 0.0
    for u in busiest:
        w = unit_work(desc, c, arch, u, links_a, links_b)
        for key, value in w.pipes.items():
            pipe[key] = pipe.get(key, 0.0) + value
        core_s += w.pipes.get("_core", 0.0)
        fill_s = fill_s or w.fill_s
        store_one = max(store_one, w.pipes["fixpipe"])
    core_s += fill_s

    # Store phases per round of units (one unit per core): split 0 stores, the others add (one phase per split in
    # deterministic mode, all at once otherwise); a barrier after each phase but the last of the last round
    # (DeepGEMM-Ascend's rule). A phase takes the storing core's FixPipe or the L2's share of the phase's bytes.
    rounds = len(busiest)
    if c.reduce_splits and desc.deterministic:
        phase_splits = [1] * c.num_splits
        barriers = rounds * c.num_splits
    elif c.reduce_splits:
        phase_splits = [1, c.num_splits - 1]
        barriers = 2 * rounds - 1
    else:
        phase_splits, barriers = [c.num_splits], 0
    store_s = barriers * BARRIER_GM_TRIPS * figures.gm_latency_s
    for splits_in_phase in phase_splits:
        store_s += max(store_one * rounds, splits_in_phase * out_bytes / arch.l2_bytes_per_s)

    hbm_s = hbm_bytes / arch.hbm_bytes_per_s
    l2_s = l2_bytes / arch.l2_bytes_per_s
    time_s = round(LAUNCH_S + max(core_s, hbm_s, l2_s) + store_s, 15)
    parts = {"cube": pipe.get("cube", 0.0), "mte1": pipe.get("mte1", 0.0), "mte2": pipe.get("mte2", 0.0),
             "aiv_mte2": pipe.get("aiv_mte2", 0.0), "vector": pipe.get("vector", 0.0),
             "ub_to_l1": pipe.get("ub_to_l1", 0.0), "hbm": hbm_s, "l2": l2_s}
    bound = max(parts, key=parts.__getitem__)
    if LAUNCH_S + fill_s + store_s > parts[bound]:
        bound = "latency"
    return HcPrenormCost(
        time_s=time_s, cube_s=parts["cube"], mte1_s=parts["mte1"], mte2_s=parts["mte2"],
        aiv_mte2_s=parts["aiv_mte2"], vector_s=parts["vector"], ub_to_l1_s=parts["ub_to_l1"],
        fixpipe_s=pipe.get("fixpipe", 0.0), hbm_s=hbm_s, l2_s=l2_s, fill_s=fill_s, store_s=store_s, reduce_s=0.0,
        launch_s=LAUNCH_S, bound=bound, num_units=len(live), num_waves=rounds, active_cores=active,
        hbm_bytes=int(hbm_bytes), l2_bytes=int(l2_bytes), flops=2.0 * m * n * k,
    )
