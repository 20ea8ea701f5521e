"""Cost model of one GEMM kernel config on an Ascend AI-core chip: its predicted time and what binds it.

Pure arithmetic on (GemmDesc, GemmConfig, ArchSpec); no numpy, no numba. It predicts, it never measures.

The kernel modelled is the persistent Cube GEMM of DeepGEMM-Ascend (and of our templates): core ``c`` of ``P``
takes output tiles ``c, c+P, ...`` of the scheduler's order (super-rows of 4 M-blocks, chunks of one wave with N
XOR-ed by M, snake over the chunks; row-major on the small-M "stream" path); per tile it walks K in BLOCK_K steps
through an L1 ring (MTE2: GM -> L1), loads MAD slices into double-buffered L0A/L0B (MTE1), runs the Cube into a
double-buffered L0C and drains it through FixPipe. Every rate and size comes from the ArchSpec unless noted:

* Cube: fractal-aligned work, ceil(tm/16) * ceil(tn/16) * ceil(K/C0) cycles per tile. One cycle is a
  16 x 16 x C0 block, C0 = one 32 B fractal row of the pair's Cube dtype (16 BF16, 32 FP8, 64 FP4 elements):
  that is ``flops_per_cycle`` (8192 BF16 FLOP per core, x2 FP8, x4 FP4) at ``clock_hz``. A MAD never takes less
  than its issue time (``MAD_ISSUE_CYCLES``: DeepGEMM-Ascend's figures), which only tiny MADs reach.
* MTE1 (L1 -> L0): the bytes of every L0 load at ``l1_to_l0_bytes_per_cycle`` plus the UE8M0 scale bytes at
  ``sf_l1_to_l0_bytes_per_cycle``; an A (B) slice is reloaded per N-MAD (M-MAD) only when it cannot stay in
  its two L0 slots, as the kernel does.
* MTE2 (GM -> L1): the tile's operand and scale bytes at ``gm_to_l1_bytes_per_cycle`` per core.
* FixPipe: the tile's fp32 accumulator (4 B per element out of L0C) at ``fixpipe_bytes_per_cycle``.
* Vector (fp8 x fp4 only): the AIVs decode B from FP4 to FP8 and copy it UB -> L1 (DeepGEMM-Ascend's rates,
  ``FP4_DECODE_BYTES_PER_CYCLE``, ``UB_TO_L1_BYTES_PER_CYCLE``; B then sits in L1/L0 as FP8).
* Within a core these pipes overlap (every stage is double-buffered): a tile costs the slowest of them.
* Waves and tail: ceil(tiles / P) waves. The busiest core runs ceil(tiles / P) tiles and is taken to draw the
  heaviest ones (M/N tail tiles are lighter: fractal-aligned extents). A wave costs the larger of that core's
  tile and the wave's L2 reads: every GM -> L1 byte of every core is an L2 read and the chip serves
  ``l2_bytes_per_s``; the tail wave has fewer tiles, so fewer bytes, and often runs at the Cube's pace.
* L2 reuse and HBM: cold L2 (the published runs flush it): A, B and scales come from HBM once, D goes out (and
  C comes in when accumulating), at ``hbm_bytes_per_s``. The swizzle keeps a super-row of A hot across its
  N-chunks; B is walked once per super-row, and when B does not fit ``l2_bytes`` beside that super-row the
  later walks re-read the part L2 could not keep (the snake starts each walk where the last one ended, on the
  part still cached). This is what binds small M: B's bytes over HBM bandwidth.
* Stream path (expected_m <= 64): row-major tiles; A stays resident in L1 when its panel fits and a core
  reuses it (more N tiles than cores); each panel load sits between pipe barriers, so it is not overlapped.
* Fill (before the first MAD): the first wave's distinct first-stage blocks from cold HBM (and each core's
  stage through its MTE2), then the first L0 slices through MTE1. Drain (after the last MAD): the last MAD tile
  through FixPipe and out of UB.
* Launch: ``LAUNCH_S``, the one time constant that is not a hardware figure: starting a MIX kernel on every
  AI core and the end-of-kernel synchronisation. One value for every shape, not fitted per row.

Total: max(fill + sum over waves of max(tile, wave L2 reads), all L2 reads, all HBM bytes) + drain + launch,
each over its bandwidth. ``bound`` names the resource with the largest busy time ("latency" when fill, drain and
launch exceed it).
"""

from __future__ import annotations

from dataclasses import dataclass

from .arch import ArchSpec
from .config import (
    DTYPE_BITS,
    M_GROUPED_BLOCK_M,
    OUT_DTYPE_BYTES,
    GemmConfig,
    GemmDesc,
    cube_dtype,
    cube_operand_bits,
    k_alignment,
    stream_l1_bytes,
)

# NOTES: msprof task times of small Ascend kernels do not go below a few microseconds: the task launch, the
# block start on every AI core and the final synchronisation. 2 us is our assumption for a MIX (AIC + 2 AIV)
# kernel; it is the only time constant of the model that is not a hardware figure.
LAUNCH_S = 2.0e-6

# NOTES: hardware figures the ArchSpec does not carry, from DeepGEMM-Ascend's heuristics.hpp (950 rates):
# the least time a MAD instruction holds the Cube pipe (its K-tile sweep: 64 cycles BF16, 116 FP8, 40 FP4;
# only MADs of a few fractals ever reach it), and the AIV rates of the fp8 x fp4 kernel, which decodes B from
# FP4 to FP8 (64 B/cycle per AIV) and copies it UB -> L1 (128 B/cycle per AIV), on both AIVs of a core.
MAD_ISSUE_CYCLES = {"bf16": 64, "fp8": 116, "fp4": 40}
FP4_DECODE_BYTES_PER_CYCLE = 64
UB_TO_L1_BYTES_PER_CYCLE = 128
AIVS_PER_CORE = 2

RESOURCES = ("cube", "mte1", "mte2", "fixpipe", "vector", "l2", "hbm")
_PIPES = ("cube", "mte1", "mte2", "fixpipe", "vector")  # per-core pipes, overlapped within a core


@dataclass(frozen=True)
class GemmCost:
    """Modelled chip time of one config and its parts, in seconds. A per-resource time is that resource's busy
    time on the critical path (the busiest core's pipes; the whole chip's L2 and HBM traffic)."""

    time_s: float
    cube_s: float
    mte1_s: float
    mte2_s: float
    fixpipe_s: float
    vector_s: float  # AIV FP4 -> FP8 decode of B (fp8 x fp4 only)
    l2_s: float
    hbm_s: float
    fill_s: float  # pipeline fill (before the first MAD) + drain (after the last)
    launch_s: float
    bound: str  # the resource with the largest time, or "latency" when fill + launch exceed it
    num_tiles: int
    num_waves: int
    l2_bytes: int
    hbm_bytes: int
    flops: float  # useful FLOPs (2 * m * n * k over every group)


@dataclass(frozen=True)
class Region:
    """The per-group problem every GEMM kind reduces to; ``count`` identical regions run one after another."""

    count: int
    rows: int  # M of one region
    cols: int  # N of one region
    depth: int  # K of one region
    full_m_tiles: bool  # M-grouped contiguous: padding rows are computed, every tile is BLOCK_M tall


def regions(desc: GemmDesc) -> Region:
    """The region of ``desc`` (all groups modelled alike: ``expected_m`` rows, or k / num_groups K).

    normal: one m x n x k. m_grouped_contiguous: num_groups groups of expected_m rows, each aligned to 256
    (BLOCK_M 256, padding rows computed), each with its own B. m_grouped_masked: num_groups groups of
    expected_m rows, own B. k_grouped_contiguous: num_groups m x n outputs over k / num_groups each.
    batched: num_groups independent m x n x k problems.
    """
    g = desc.num_groups
    if desc.gemm_type == "m_grouped_contiguous":
        rows = -(-desc.expected_m // M_GROUPED_BLOCK_M) * M_GROUPED_BLOCK_M
        return Region(g, rows, desc.n, desc.k, True)
    if desc.gemm_type == "m_grouped_masked":
        return Region(g, desc.expected_m, desc.n, desc.k, False)
    if desc.gemm_type == "k_grouped_contiguous":
        return Region(g, desc.m, desc.n, -(-desc.k // g), False)
    if desc.gemm_type == "batched":
        return Region(g, desc.m, desc.n, desc.k, False)
    return Region(1, desc.m, desc.n, desc.k, False)


def useful_flops(desc: GemmDesc) -> float:
    """2 * M * N * K summed over groups: M total rows (M-grouped), K total (K-grouped), per batch (batched)."""
    scale = desc.num_groups if desc.gemm_type == "batched" else 1
    return 2.0 * desc.m * desc.n * desc.k * scale


def round_up(x: int, a: int) -> int:
    """``x`` rounded up to a multiple of ``a`` (pure Python: the heuristics import no numpy)."""
    return -(-x // a) * a


def _tile_costs(desc: GemmDesc, c: GemmConfig, arch: ArchSpec, tm: int, tn: int, depth: int,
                a_resident: bool) -> tuple[dict[str, float], float]:
    """Per-core pipe cycles of one tm x tn tile over K = ``depth``, and the bytes it reads GM -> L1 (via L2)."""
    a_bits, b_bits = cube_operand_bits(desc)  # as in L1 / L0
    cdt = cube_dtype(desc.a_dtype, desc.b_dtype)
    c0 = arch.c0_bytes * 8 // DTYPE_BITS[cdt]
    kpad = round_up(depth, k_alignment(desc))
    fm = arch.frac_mn

    # Cube: fractal-aligned work (16 x 16 x C0 per cycle), never less than the MADs' issue floor.
    m_mads, n_mads = -(-tm // c.mad_m), -(-tn // c.mad_n)
    k_mads = max(1, c.block_k // c.mad_k)  # MADs per K-block
    num_mads = m_mads * n_mads * -(-kpad // c.mad_k)
    cube = max(-(-tm // fm) * -(-tn // fm) * -(-kpad // c0), num_mads * MAD_ISSUE_CYCLES[cdt])

    # MTE1 (L1 -> L0): an A (B) slice is reloaded per N-MAD (M-MAD) only when it cannot stay in its 2 L0 slots.
    a_loads = 1 if (k_mads <= 2 or n_mads == 1) else n_mads
    b_loads = 1 if (n_mads * k_mads <= 2 or m_mads == 1) else m_mads
    mte1 = (tm * a_loads * a_bits + tn * b_loads * b_bits) * kpad / 8 / arch.l1_to_l0_bytes_per_cycle
    sf_gm = 0.0
    if desc.has_sf:
        # One UE8M0 byte per 32 K elements per row, with every L0 load of the rows it scales.
        mte1 += (tm * a_loads + tn * b_loads) * kpad / 32 / arch.sf_l1_to_l0_bytes_per_cycle
        sf_gm = ((0 if a_resident else tm) + tn) * kpad / 32

    # MTE2 (GM -> L1) in GM bytes; resident A was loaded once, with the core's first tile.
    a_gm = 0.0 if a_resident else tm * kpad * DTYPE_BITS[desc.a_dtype] / 8
    b_gm = tn * kpad * DTYPE_BITS[desc.b_dtype] / 8
    gm = a_gm + b_gm + sf_gm
    mte2 = gm / arch.gm_to_l1_bytes_per_cycle

    fix = tm * tn * 4 / arch.fixpipe_bytes_per_cycle  # the fp32 accumulator out of L0C
    vector = 0.0
    if DTYPE_BITS[desc.b_dtype] < b_bits:  # fp8 x fp4: the AIVs decode B to FP8, then copy it UB -> L1
        decoded = tn * kpad * b_bits / 8
        vector = max(b_gm / FP4_DECODE_BYTES_PER_CYCLE, decoded / UB_TO_L1_BYTES_PER_CYCLE) / AIVS_PER_CORE
    return {"cube": cube, "mte1": mte1, "mte2": mte2, "fixpipe": fix, "vector": vector}, gm


def keeps_a_resident(desc: GemmDesc, config: GemmConfig, arch: ArchSpec) -> bool:
    """Whether the stream path keeps BLOCK_M x K of A (and its scales) in L1: when it fits beside the B stages
    and a core reuses the panel (more N tiles than cores), as DeepGEMM-Ascend's FP8 kernel decides.

    NOTES: loading the panel sits between pipe barriers (not overlapped); without reuse it only costs time.
    """
    r = regions(desc)
    num_n_blocks = -(-r.cols // config.block_n)
    return (config.path == "stream" and num_n_blocks > config.num_ai_cores
            and stream_l1_bytes(desc, config, r.depth) <= arch.l1_bytes)


def model_gemm(desc: GemmDesc, config: GemmConfig, arch: ArchSpec) -> GemmCost:
    """Modelled chip time of ``desc`` run with ``config`` on ``arch`` (the module docstring lists every term)."""
    c = config
    r = regions(desc)
    cores = c.num_ai_cores
    clock = arch.clock_hz
    a_bytes, b_bytes = DTYPE_BITS[desc.a_dtype] / 8, DTYPE_BITS[desc.b_dtype] / 8  # in GM
    out_bytes = OUT_DTYPE_BYTES[desc.out_dtype]
    kpad = round_up(r.depth, k_alignment(desc))
    sf_row = kpad / 32 if desc.has_sf else 0.0  # scale bytes per operand row

    # Tiles of one region: full tiles plus the last M-block row and N-block column, fractal-aligned.
    mb, nb = -(-r.rows // c.block_m), -(-r.cols // c.block_n)
    tail_m = c.block_m if r.full_m_tiles else round_up(r.rows - (mb - 1) * c.block_m, arch.frac_mn)
    tail_n = round_up(r.cols - (nb - 1) * c.block_n, arch.frac_mn)
    tiles_per_region = mb * nb
    num_tiles = tiles_per_region * r.count
    a_resident = keeps_a_resident(desc, c, arch)

    kinds = []  # (core cycles = slowest pipe, pipe cycles, GM bytes, count)
    for tm, tn, count in ((c.block_m, c.block_n, (mb - 1) * (nb - 1)), (tail_m, c.block_n, nb - 1),
                          (c.block_m, tail_n, mb - 1), (tail_m, tail_n, 1)):
        if count:
            pipes, gm = _tile_costs(desc, c, arch, tm, tn, r.depth, a_resident)
            kinds.append((max(pipes.values()), pipes, gm, count * r.count))
    kinds.sort(key=lambda kind: -kind[0])
    l2_bytes = sum(gm * count for _, _, gm, count in kinds)

    # Waves over the AI cores. The busiest core runs ceil(tiles / P) tiles and is taken to draw the heaviest
    # ones: exact when tails are few (the static round-robin order gives some core only full tiles), an upper
    # bound otherwise. A wave costs the larger of that core's tile and the wave's L2 reads (P tiles like it;
    # the tail wave has fewer tiles, so fewer bytes); pipes within a core overlap (double-buffered stages).
    full_waves, tail = divmod(num_tiles, cores)
    num_waves = full_waves + (1 if tail else 0)
    wave_time = 0.0
    pipe_s = dict.fromkeys(_PIPES, 0.0)
    taken = 0
    for cycles, pipes, gm, count in kinds:  # heaviest first, until the busiest core has its num_waves tiles
        take = min(count, num_waves - taken)
        full = max(0, min(take, full_waves - taken))  # of them, tiles that run in full waves
        for n_tiles, in_wave in ((full, cores), (take - full, tail)):
            if n_tiles:
                wave_bytes = in_wave * gm
                wave_time += n_tiles * max(cycles / clock, wave_bytes / arch.l2_bytes_per_s)
        for key in _PIPES:
            pipe_s[key] += take * pipes[key] / clock
        taken += take
        if taken == num_waves:
            break
    if a_resident:
        # Stream path: row-major tiles, so an M-block's N tiles sit on min(P, N-blocks) consecutive cores, each
        # of which loads that A panel (BLOCK_M x K and scales) once, between pipe barriers (not overlapped).
        panel = (tail_m if mb == 1 else c.block_m) * (kpad * a_bytes + sf_row)
        loads = r.count * mb * min(cores, nb)
        loads_busiest = -(-loads // cores)
        panel_s = panel / (arch.gm_to_l1_bytes_per_cycle * clock)
        wave_time += loads_busiest * max(panel_s, min(cores, loads) * panel / arch.l2_bytes_per_s)
        pipe_s["mte2"] += loads_busiest * panel_s
        l2_bytes += loads * panel

    # HBM (cold L2): A, B and scales once, B again when it does not fit L2 beside a super-row of A (the snake
    # order keeps the most recent part of B hot for the next super-row), D out (and C in when accumulating).
    # NOTES: the stream path walks tiles row-major; the cube path swizzles once there are group_m M-blocks.
    group_m = c.swizzle_group_m if mb >= c.swizzle_group_m and c.path == "cube" else 1
    super_rows = -(-mb // group_m)
    a_region = r.rows * (kpad * a_bytes + sf_row)
    b_region = r.cols * (kpad * b_bytes + sf_row)
    a_super_row = min(r.rows, group_m * c.block_m) * (kpad * a_bytes + sf_row)
    b_miss = max(0.0, 1.0 - max(0.0, arch.l2_bytes - a_super_row) / b_region)
    d_region = r.rows * r.cols * out_bytes * (2 if desc.with_accumulation else 1)
    hbm_bytes = r.count * (a_region + b_region * (1.0 + (super_rows - 1) * b_miss) + d_region)
    hbm_s = hbm_bytes / arch.hbm_bytes_per_s

    # Fill: the first wave's first L1 stage (its distinct A and B blocks) from cold HBM, each core's stage
    # through its MTE2, then its first L0 slices through MTE1. Drain: the last MAD tile through FixPipe and out.
    active = min(cores, num_tiles)
    first_m = min(c.block_m, tail_m if mb == 1 else c.block_m)
    first_n = min(c.block_n, tail_n if nb == 1 else c.block_n)
    first_k = min(c.block_k, kpad)
    if group_m > 1:  # super-rows: the first wave spans group_m M-blocks and active / group_m N-blocks
        m_blocks, n_blocks = group_m, min(nb, -(-active // group_m))
    else:  # row-major
        m_blocks, n_blocks = min(mb, -(-active // nb)), min(nb, active)
    sf_k = first_k / 32 if desc.has_sf else 0.0
    row_bytes_a, row_bytes_b = first_k * a_bytes + sf_k, first_k * b_bytes + sf_k
    first_wave = m_blocks * first_m * row_bytes_a + n_blocks * first_n * row_bytes_b
    stage = first_m * row_bytes_a + first_n * row_bytes_b
    fill_s = max(first_wave / arch.hbm_bytes_per_s, stage / (arch.gm_to_l1_bytes_per_cycle * clock))
    a_l0_bits, b_l0_bits = cube_operand_bits(desc)
    fill_s += (min(c.mad_m, first_m) * a_l0_bits + min(c.mad_n, first_n) * b_l0_bits) / 8 * min(c.mad_k, first_k) / (
        arch.l1_to_l0_bytes_per_cycle * clock)
    drain_s = min(c.mad_m, first_m) * min(c.mad_n, first_n) * (4 + out_bytes) / (arch.fixpipe_bytes_per_cycle * clock)

    # NOTES: the fill's bytes are part of the HBM traffic, so an HBM-bound kernel does not pay for them twice.
    time_s = max(fill_s + wave_time, l2_bytes / arch.l2_bytes_per_s, hbm_s) + drain_s + LAUNCH_S
    parts = dict(pipe_s, l2=l2_bytes / arch.l2_bytes_per_s, hbm=hbm_s)
    bound = max(RESOURCES, key=lambda key: parts[key])
    if fill_s + drain_s + LAUNCH_S > parts[bound]:
        bound = "latency"
    return GemmCost(
        time_s=time_s, cube_s=parts["cube"], mte1_s=parts["mte1"], mte2_s=parts["mte2"],
        fixpipe_s=parts["fixpipe"], vector_s=parts["vector"], l2_s=parts["l2"], hbm_s=hbm_s,
        fill_s=fill_s + drain_s, launch_s=LAUNCH_S, bound=bound, num_tiles=num_tiles, num_waves=num_waves,
        l2_bytes=int(round(l2_bytes)), hbm_bytes=int(round(hbm_bytes)), flops=useful_flops(desc),
    )
