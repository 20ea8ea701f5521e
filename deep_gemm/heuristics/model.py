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
* MTE2 (GM -> L1): the tile's copies, one A and one B block per BLOCK_K step and a chunk of scales per
  ``sf_k_blocks`` steps. With ``MemoryFigures`` (the latency regime; each figure sourced from the shared reference
  ascend_memory_latency.md, see the class) a copy costs its issue (``copy_issue_s``: 128 B copies on 64 AIVs at
  0.34 TB/s) plus the slowest of: its bytes at the core's MTE2 rate (``mte2_bytes_per_s``: the 950's MTE2 theory
  for 8192^3, 146.5 GB/s per core), slower for rows under 512 B (GM requests are 512 B; 128 B rows measured
  1.35-1.57x slower); Little's law, the bytes the L1 ring lets the core have in flight over the loaded GM latency
  (``gm_latency_s``: 8 KB ND2NZ copies on 32 AICs at 1.24 TB/s, one in flight), a latency that grows while other
  cores queue on the same 512 B units (same order vs staggered, 370 vs 187 us for 32 readers, pro rata); and the
  core's share of HBM and of L2 (chip bandwidth over the active cores) for the fractions of the bytes each level
  serves. The in-order MTE2 adds these copy by copy, so a core that reads a cold B and a hot A does not overlap
  them, and a few active cores cannot draw the chip's HBM. ``ROOFLINE_FIGURES`` turns this off: the tile's bytes
  at ``gm_to_l1_bytes_per_cycle``.
* FixPipe: the tile's output elements at 64 per cycle (bf16/fp16/fp8 out; 32 for fp32 out, capped by the
  ArchSpec's ``fixpipe_bytes_per_cycle``); with the roofline figures the fp32 accumulator bytes at that rate.
* Vector (fp8 x fp4): the AIVs decode B from FP4 to FP8 and copy it UB -> L1 (DeepGEMM-Ascend's rates,
  ``FP4_DECODE_BYTES_PER_CYCLE``, ``UB_TO_L1_BYTES_PER_CYCLE``; B then sits in L1/L0 as FP8). FP8 output (the
  FP8Quantization epilogue): FixPipe moves the fp32 tile to the AIVs' UB at ``fixpipe_bytes_per_cycle`` (128 B),
  the two AIVs spend ``FP8_EPILOGUE_VECTOR_OPS`` passes per element at ``VECTOR_FP32_PER_CYCLE`` each, and D
  leaves as 1 byte per element plus one scale byte per 32.
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
* Fill (before the first MAD): the first wave's distinct first-stage blocks from cold HBM (and each core's first
  copies: issue, memory latency and MTE2), then the first L0 slices through MTE1. When MTE2 binds, the first
  stage's bytes are already in its busy time and only the first copy's issue and latency are exposed. Drain
  (after the last MAD): the last MAD tile through FixPipe and (with the figures) its store's issue and latency.
* Launch: ``LAUNCH_S``, the one time constant that is a judgement rather than a hardware figure: starting the
  kernel on every AI core and the end-of-kernel synchronisation. One value for every shape, not fitted per row.
* No separate "partial overlap" term: within a core the pipes overlap as far as the L1 ring lets MTE2 run ahead,
  which is the Little's-law bound above; the published large-M rows at 91-99 % of peak show no further loss.

Total: max(fill + sum over waves of max(tile, wave L2 reads), all L2 reads, all HBM bytes) + drain + launch,
each over its bandwidth. ``bound`` names the resource with the largest busy time; when that is MTE2, what its
copies mostly waited on ("hbm" or "l2" share, "latency" with too few bytes in flight, or "mte2" itself); and
"latency" when fill, drain and launch exceed it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

from ..arch import ArchSpec
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
# block start on every AI core and the final synchronisation. 2 us is our judgement for a persistent kernel on every
# AI core (not a hardware figure). CATLASS's A2 tiler charges a head of 1 + 7 * blocks / cores us; on the 950DT that
# would be 8 us, more than the published 128 x 32768 x 512 FP8 row leaves beside its HBM traffic (10.4 us measured,
# 6.5-7.4 us of bytes), so we keep the smaller figure for every shape (not fitted per row).
LAUNCH_S = 2.0e-6

# NOTES: hardware figures the ArchSpec does not carry, from DeepGEMM-Ascend's heuristics.hpp (950 rates):
# the least time a MAD instruction holds the Cube pipe (its K-tile sweep: 64 cycles BF16, 116 FP8, 40 FP4;
# only MADs of a few fractals ever reach it), and the AIV rates of the fp8 x fp4 kernel, which decodes B from
# FP4 to FP8 (64 B/cycle per AIV) and copies it UB -> L1 (128 B/cycle per AIV), on both AIVs of a core.
MAD_ISSUE_CYCLES = {"bf16": 64, "fp8": 116, "fp4": 40}
FP4_DECODE_BYTES_PER_CYCLE = 64
UB_TO_L1_BYTES_PER_CYCLE = 128
AIVS_PER_CORE = 2
# FP8-output epilogue on the AIVs: fp32 lanes per cycle of one AIV's Vector unit (256 B vector registers; the
# white paper's 54 TFLOPS FP16 over 64 AIVs at 1.65 GHz is ~256 FP16 FLOP per AIV per cycle), and the vector
# passes per element of lib/epilogue.asc.j2 (Abs, the 32-wide ReduceMax, Muls, Cast to e4m3; the per-32 scale
# arithmetic is 1/32 of that and ignored).
VECTOR_FP32_PER_CYCLE = 64
FP8_EPILOGUE_VECTOR_OPS = 4


@dataclass(frozen=True)
class MemoryFigures:
    """Sourced figures of the latency-bound regime (shared reference ascend_memory_latency.md), from which the
    model derives its per-copy costs. Each field is a published figure, not a fitted one; ``bench/model_check.py
    --sensitivity`` moves each by +-20 %. ``enabled=False`` turns every term they feed off (the plain roofline of
    per-core MTE2 at the ArchSpec rate), which the tests use to check that the terms vanish at large M.
    """

    # asc-devkit data_copy best practice (950 box, msprof): 64 AIVs issuing 128 B copies reach 0.34 TB/s, i.e.
    # ~24 ns per copy per core: the issue cost of one DataCopy instruction. [M]
    small_copy_chip_bytes_per_s: float = 0.34e12
    small_copy_bytes: int = 128
    small_copy_cores: int = 64
    # Same source: 32 AICs copying 8 KB ND2NZ blocks GM -> L1 reach 1.24 TB/s, below the box's HBM: 211 ns per
    # copy per core. That loop has one copy in flight per core, so less its issue this is the loaded GM latency
    # (SemiAnalysis' 16 KiB reads on a 950PR: 134-182 ns for up to 56 blocks). [M]
    nd2nz_chip_bytes_per_s: float = 1.24e12
    nd2nz_copy_bytes: int = 8192
    nd2nz_cores: int = 32
    # 8192^3 fp16 on 32 cores of a 950 box (256 x 256 x 64 blocks): msprof's MTE2 theory is 1832 us for the
    # 268 MB each core loads (its 32 tiles of 2 x 256 x 8192 halves): 146.5 GB/s per core (88.8 B/cycle at
    # 1.65 GHz), the per-core GM -> L1 rate. The kernel's MTE2 was busy 1900 us: copies that deep hide latency. [M]
    mte2_theory_bytes: float = 32 * 2 * 256 * 8192 * 2
    mte2_theory_s: float = 1832e-6
    mte2_theory_clock_hz: float = 1.65e9
    # GM requests are served in 512 B units (asc-devkit guide, "avoid same-address access"). [S]
    gm_request_bytes: int = 512
    # 32 AICs reading the same 8 MB in the same order: 370 us, staggered: 187 us (950). Readers of the same
    # 512 B unit are served one after another, so while all 32 read the same blocks each waits this many times
    # the latency; fewer readers wait proportionally less ((s - 1) / 31 of the extra). [M]
    same_address_slowdown: float = 370.0 / 187.0
    same_address_cores: int = 32
    # Rows of 128 B into L1 fill a quarter of a 512 B line; 512 B rows ran 1.35-1.57x faster (mxfp4 matmul on a
    # 950, pto-kernels): the midpoint, spread over the 512 B requests a row length costs per byte. [M]
    short_row_slowdown: float = 1.46
    # FixPipe on the 950 (NPU arch 3510 spec): 64 elements/cycle for bf16/fp16/fp8 output, 32 for fp32. [S]
    fixpipe_elems_per_cycle: int = 64
    enabled: bool = True

    # NOTES: cached (per instance; replace() makes a new one): the model reads them for every config it costs.
    @functools.cached_property
    def copy_issue_s(self) -> float:
        """Issue cost of one DataCopy (s): 128 B copies on 64 AIVs at 0.34 TB/s."""
        return self.small_copy_cores * self.small_copy_bytes / self.small_copy_chip_bytes_per_s

    @functools.cached_property
    def gm_latency_s(self) -> float:
        """Loaded GM -> L1 latency (s): the 8 KB ND2NZ copy time per core less its issue."""
        return max(0.0, self.nd2nz_cores * self.nd2nz_copy_bytes / self.nd2nz_chip_bytes_per_s - self.copy_issue_s)

    def mte2_bytes_per_s(self, arch: ArchSpec) -> float:
        """Per-core GM -> L1 rate (B/s) on ``arch``: the 950's MTE2 theory in bytes per cycle, at ``arch``'s clock."""
        return self.mte2_theory_bytes / self.mte2_theory_s / self.mte2_theory_clock_hz * arch.clock_hz

    def row_factor(self, row_bytes: float) -> float:
        """Slowdown of MTE2 streaming for rows of ``row_bytes``: 1.0 for rows of whole 512 B requests, growing
        with the requests per byte up to ``short_row_slowdown`` for 128 B rows (and beyond for shorter ones)."""
        if row_bytes >= self.gm_request_bytes:
            return 1.0
        requests_per_byte = self.gm_request_bytes / max(row_bytes, 1.0) - 1.0
        return 1.0 + (self.short_row_slowdown - 1.0) * requests_per_byte / (self.gm_request_bytes / 128 - 1.0)

    def same_address_factor(self, sharers: int) -> float:
        """How much longer a copy's latency is when ``sharers`` cores read the same blocks at once (1.0 alone)."""
        if sharers <= 1:
            return 1.0
        span = max(1, self.same_address_cores - 1)
        return 1.0 + (self.same_address_slowdown - 1.0) * min(1.0, (sharers - 1) / span)


MEMORY_FIGURES = MemoryFigures()
ROOFLINE_FIGURES = MemoryFigures(enabled=False)

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
    # Latency-regime terms (0 with the roofline figures): of the busiest core's MTE2 time, the part spent on copy
    # issue and exposed memory latency, and the part lost to same-address serialisation of shared blocks.
    copy_overhead_s: float = 0.0
    same_address_s: float = 0.0
    active_cores: int = 0  # cores with a tile in the first wave

    @property
    def achieved_hbm_bytes_per_s(self) -> float:
        """Modelled HBM bandwidth the kernel reaches: its HBM bytes over its time."""
        return self.hbm_bytes / self.time_s


@dataclass(frozen=True)
class _Links:
    """GM -> L1 conditions of one core under a schedule: its in-order MTE2, the bytes its L1 ring lets it have in
    flight, its shares of HBM and L2, and where its A and B bytes come from."""

    stream_bytes_per_s: float  # the MTE2 rate of one core
    inflight_bytes: float  # bytes the L1 ring lets the MTE2 request ahead of the Cube
    hbm_share: float  # HBM bandwidth per active core (B/s)
    l2_share: float  # L2 bandwidth per active core (B/s)
    latency_s: float
    issue_s: float
    hbm_frac_a: float  # fraction of A's (B's) GM -> L1 bytes that come from HBM rather than L2
    hbm_frac_b: float
    slow_a: float  # same-address factors of A and B copies
    slow_b: float
    figures: MemoryFigures


def _copy_s(links: _Links, nbytes: float, rows: float, hbm_frac: float,
            slow: float) -> tuple[float, float, float, str]:
    """(time, exposed overhead, same-address loss, what limits it) of one GM -> L1 copy of ``nbytes`` in ``rows``
    rows; the limit is "mte2" (the core's rate), "hbm" or "l2" (its share of either) or "latency" (in flight).

    The copy is issued (``issue_s``, serial in the in-order MTE2), then its bytes stream at the slowest of: the
    core's MTE2 rate (slower for rows under 512 B); Little's law, the bytes the L1 ring lets the core have in
    flight over the memory latency (longer while other cores queue on the same 512 B units: ``slow``); and the
    core's share of the HBM and L2 bandwidth, for the fractions of the bytes each level serves.
    """
    if nbytes <= 0:
        return 0.0, 0.0, 0.0, "mte2"
    f = links.figures
    factor = 1.0
    if f.enabled:
        row_bytes = nbytes / max(rows, 1.0)
        if row_bytes < f.gm_request_bytes:  # whole 512 B requests stream at the full rate (row_factor's 1.0)
            factor = f.row_factor(row_bytes)
    stream = nbytes * factor / links.stream_bytes_per_s
    hbm = nbytes * hbm_frac / links.hbm_share
    l2 = nbytes * (1.0 - hbm_frac) / links.l2_share
    inflight = nbytes * links.latency_s / links.inflight_bytes
    shared = hbm + l2
    # NOTES: the hot path of the config search (a few copies per tile of every config). The limits "mte2", "hbm",
    # "l2", "latency" are compared in that order, a later one winning only when strictly larger (as max() picks
    # the first maximum), without building a dict or calling max().
    limiter, limit = "mte2", stream
    if hbm >= l2:
        if shared > limit:
            limiter, limit = "hbm", shared
    elif shared > limit:
        limiter, limit = "l2", shared
    waiting = inflight * slow
    if waiting > limit:
        limiter, limit = "latency", waiting
    issue = links.issue_s
    t = issue + limit
    busiest = shared if shared > stream else stream  # max(stream, hbm + l2)
    loss = t - (issue + (inflight if inflight > busiest else busiest))
    exposed = inflight - busiest
    return t, issue + (exposed if exposed > 0.0 else 0.0), loss, limiter


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


def _tile_costs(desc: GemmDesc, c: GemmConfig, arch: ArchSpec, tm: int, tn: int, layout: _Layout,
                a_resident: bool, links: _Links) -> tuple[dict[str, float], float, float, float, dict[str, float]]:
    """Per-core pipe cycles of one tm x tn tile over the region's K, the bytes it reads GM -> L1 (via L2), and of
    its MTE2 seconds the copy overhead, the same-address loss and the split by what limits each copy."""
    kpad, a_bits, b_bits = layout.kpad, layout.a_bits, layout.b_bits  # bits as in L1 / L0
    c0 = layout.c0
    fm = arch.frac_mn

    # Cube: fractal-aligned work (16 x 16 x C0 per cycle), never less than the MADs' issue floor.
    m_mads, n_mads = -(-tm // c.mad_m), -(-tn // c.mad_n)
    k_mads = max(1, c.block_k // c.mad_k)  # MADs per K-block
    num_mads = m_mads * n_mads * -(-kpad // c.mad_k)
    cube = max(-(-tm // fm) * -(-tn // fm) * -(-kpad // c0), num_mads * layout.mad_issue_cycles)

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
    mte2_s, overhead_s, same_s, by_limit = _mte2_s(desc, c, tm, tn, kpad, a_resident, links)
    mte2 = mte2_s * arch.clock_hz

    if desc.out_dtype == "fp8":  # FP8Quantization: FixPipe hands the fp32 tile to the AIVs' UB (128 B/cycle)
        fix = tm * tn * 4 / arch.fixpipe_bytes_per_cycle
    elif links.figures.enabled:  # FixPipe drains L0C at so many output elements per cycle (bf16: 64, fp32: 32)
        out_bytes = OUT_DTYPE_BYTES[desc.out_dtype]
        fix = tm * tn / min(links.figures.fixpipe_elems_per_cycle, arch.fixpipe_bytes_per_cycle // out_bytes)
    else:
        fix = tm * tn * 4 / arch.fixpipe_bytes_per_cycle  # the fp32 accumulator out of L0C
    vector = 0.0
    if DTYPE_BITS[desc.b_dtype] < b_bits:  # fp8 x fp4: the AIVs decode B to FP8, then copy it UB -> L1
        decoded = tn * kpad * b_bits / 8
        vector = max(b_gm / FP4_DECODE_BYTES_PER_CYCLE, decoded / UB_TO_L1_BYTES_PER_CYCLE) / AIVS_PER_CORE
    if desc.out_dtype == "fp8":  # FP8Quantization: the two AIVs quantize what FixPipe hands them
        vector += tm * tn * FP8_EPILOGUE_VECTOR_OPS / (VECTOR_FP32_PER_CYCLE * AIVS_PER_CORE)
    pipes = {"cube": cube, "mte1": mte1, "mte2": mte2, "fixpipe": fix, "vector": vector}
    return pipes, gm, overhead_s, same_s, by_limit


def _mte2_s(desc: GemmDesc, c: GemmConfig, tm: int, tn: int, kpad: int, a_resident: bool,
            links: _Links) -> tuple[float, float, float, dict[str, float]]:
    """(time, copy overhead, same-address loss, time by limit) of one tile's GM -> L1 copies: per BLOCK_K step an
    A block (unless resident) and a B block, per ``sf_k_blocks`` steps a chunk of A and B scales (int16 pairs, MN-major:
    one row of 2 * rows bytes per 64 K)."""
    a_bytes, b_bytes = DTYPE_BITS[desc.a_dtype] / 8, DTYPE_BITS[desc.b_dtype] / 8
    k_steps = -(-kpad // c.block_k)
    last_k = kpad - (k_steps - 1) * c.block_k
    copies = []  # (count, _copy_s of one copy), in the order the in-order MTE2 issues them
    step = None  # the A (None when resident) and B copies of one BLOCK_K step
    for count, kk in ((k_steps - 1, c.block_k), (1, last_k)):
        if not count:
            continue
        if step is None or kk != c.block_k:  # NOTES: when BLOCK_K divides K the last step repeats the same copies
            a_copy = None if a_resident else _copy_s(links, tm * kk * a_bytes, kk if desc.major_a == "mn" else tm,
                                                     links.hbm_frac_a, links.slow_a)
            b_copy = _copy_s(links, tn * kk * b_bytes, kk if desc.major_b == "mn" else tn, links.hbm_frac_b,
                             links.slow_b)
            step = (a_copy, b_copy)
        if not a_resident:
            copies.append((count, step[0]))
        copies.append((count, step[1]))
    if desc.has_sf:
        chunks = -(-k_steps // max(1, c.sf_k_blocks))
        sf_rows = kpad / 64 / chunks  # int16 columns per chunk, each a row of 2 * MN bytes
        if not a_resident:
            copies.append((chunks, _copy_s(links, tm * kpad / 32 / chunks, sf_rows, links.hbm_frac_a, links.slow_a)))
        copies.append((chunks, _copy_s(links, tn * kpad / 32 / chunks, sf_rows, links.hbm_frac_b, links.slow_b)))
    time_s = overhead_s = loss_s = 0.0
    by_limit: dict[str, float] = {}
    for count, (t, overhead, loss, limit) in copies:
        time_s += count * t
        overhead_s += count * overhead
        loss_s += count * loss
        by_limit[limit] = by_limit.get(limit, 0.0) + count * t
    return time_s, overhead_s, loss_s, by_limit


def keeps_a_resident(desc: GemmDesc, config: GemmConfig, arch: ArchSpec) -> bool:
    """Whether the stream path keeps BLOCK_M x K of A (and its scales) in L1: when it fits beside the B stages
    and a core reuses the panel (more N tiles than cores), as DeepGEMM-Ascend's FP8 kernel decides.

    NOTES: loading the panel sits between pipe barriers (not overlapped); without reuse it only costs time.
    """
    if config.path != "stream":
        return False
    r = regions(desc)
    num_n_blocks = -(-r.cols // config.block_n)
    return num_n_blocks > config.num_ai_cores and stream_l1_bytes(desc, config, r.depth) <= arch.l1_bytes


class _Layout(NamedTuple):
    """The terms of ``model_gemm`` that depend on the problem and the block shape only (see ``_block_layout``)."""

    r: Region
    kpad: int  # K rounded up to the K granule
    a_bits: int  # bits per element of A (B) in L1 and L0 (cube_operand_bits)
    b_bits: int
    c0: int  # K elements of one Cube fractal row
    mad_issue_cycles: int  # MAD_ISSUE_CYCLES of the pair's Cube dtype
    a_bytes: float  # bytes per element of A (B) in GM
    b_bytes: float
    out_bytes: int
    sf_row: float  # scale bytes per operand row
    mb: int  # M-blocks (N-blocks) of one region
    nb: int
    tail_m: int  # the last M-block's (N-block's) rows, fractal-aligned
    tail_n: int
    kinds: tuple[tuple[int, int, int], ...]  # (tile rows, tile cols, count over every region) of each tile size
    num_tiles: int
    active: int  # cores with a tile in the first wave
    group_m: int  # M-blocks of a swizzle super-row (1: row-major)
    hbm_bytes: float
    hbm_s: float
    hbm_frac_a: float  # fraction of A's (B's) GM -> L1 bytes that come from HBM rather than L2
    hbm_frac_b: float
    sharers_a: int  # cores that read the same A (B) block at once
    sharers_b: int


# NOTES: the config search costs every BLOCK_K, MAD split and L1 depth of a block shape (~10-20 configs); these
# terms do not depend on them, so they are computed once per block shape (the inputs are frozen dataclasses).
@functools.lru_cache(maxsize=1 << 14)
def _block_layout(desc: GemmDesc, arch: ArchSpec, block_m: int, block_n: int, cores: int, path: str,
                  swizzle_group_m: int, a_resident: bool) -> _Layout:
    """Tile grid, HBM traffic and per-core GM -> L1 sharing of ``desc`` in ``block_m`` x ``block_n`` tiles on
    ``cores`` cores (``path``, ``swizzle_group_m``: the tile order; ``a_resident``: ``keeps_a_resident``)."""
    r = regions(desc)
    a_bytes, b_bytes = DTYPE_BITS[desc.a_dtype] / 8, DTYPE_BITS[desc.b_dtype] / 8  # in GM
    out_bytes = OUT_DTYPE_BYTES[desc.out_dtype]
    kpad = round_up(r.depth, k_alignment(desc))
    sf_row = kpad / 32 if desc.has_sf else 0.0  # scale bytes per operand row
    cdt = cube_dtype(desc.a_dtype, desc.b_dtype)

    # Tiles of one region: full tiles plus the last M-block row and N-block column, fractal-aligned.
    mb, nb = -(-r.rows // block_m), -(-r.cols // block_n)
    tail_m = block_m if r.full_m_tiles else round_up(r.rows - (mb - 1) * block_m, arch.frac_mn)
    tail_n = round_up(r.cols - (nb - 1) * block_n, arch.frac_mn)
    tiles_per_region = mb * nb
    num_tiles = tiles_per_region * r.count
    active = min(cores, num_tiles)
    kinds = tuple((tm, tn, count * r.count) for tm, tn, count in (
        (block_m, block_n, (mb - 1) * (nb - 1)), (tail_m, block_n, nb - 1), (block_m, tail_n, mb - 1),
        (tail_m, tail_n, 1)) if count)

    # HBM (cold L2): A, B and scales once, B again when it does not fit L2 beside a super-row of A (the snake
    # order keeps the most recent part of B hot for the next super-row), D out (and C in when accumulating).
    # NOTES: the stream path walks tiles row-major; the cube path swizzles once there are group_m M-blocks.
    group_m = swizzle_group_m if mb >= swizzle_group_m and path == "cube" else 1
    super_rows = -(-mb // group_m)
    a_region = r.rows * (kpad * a_bytes + sf_row)
    b_region = r.cols * (kpad * b_bytes + sf_row)
    a_super_row = min(r.rows, group_m * block_m) * (kpad * a_bytes + sf_row)
    b_miss = max(0.0, 1.0 - max(0.0, arch.l2_bytes - a_super_row) / b_region)
    b_hbm = b_region * (1.0 + (super_rows - 1) * b_miss)
    d_region = r.rows * r.cols * out_bytes * (2 if desc.with_accumulation else 1)
    if desc.out_dtype == "fp8":
        d_region += r.rows * r.cols / 32  # the UE8M0 scales of the FP8 output (one byte per 32 columns)
    hbm_bytes = r.count * (a_region + b_hbm + d_region)
    hbm_s = hbm_bytes / arch.hbm_bytes_per_s

    # Per-core GM -> L1 conditions. Which fraction of each operand's L1 loads comes from HBM (the rest hits L2),
    # and how many cores read the same block at once: the swizzle's chunk puts group_m M-blocks beside
    # num_cores / group_m N-blocks, the row-major order puts up to P consecutive N-blocks of one M-block.
    # NOTES: a wave's HBM bytes are the kernel's spread over its waves; the rest of the wave's loads hit L2.
    wave_slots = -(-num_tiles // cores) * active
    if a_resident:
        a_reads = r.count * mb * min(cores, nb) * min(block_m, r.rows) * (kpad * a_bytes + sf_row)
    else:
        a_reads = wave_slots * block_m * (kpad * a_bytes + sf_row)
    b_reads = wave_slots * block_n * (kpad * b_bytes + sf_row)
    hbm_frac_a = min(1.0, r.count * a_region / a_reads)
    hbm_frac_b = min(1.0, r.count * b_hbm / b_reads)
    sharers_a, sharers_b = min(active, nb), min(mb, -(-active // nb))
    if group_m > 1:  # NOTES: the larger of both orders, so that the switch to the swizzle never speeds a bigger problem
        sharers_a = max(sharers_a, min(max(cores // group_m, 1), nb))
        sharers_b = max(sharers_b, min(group_m, mb))
    return _Layout(r, kpad, *cube_operand_bits(desc), arch.c0_bytes * 8 // DTYPE_BITS[cdt], MAD_ISSUE_CYCLES[cdt],
                   a_bytes, b_bytes, out_bytes, sf_row, mb, nb, tail_m, tail_n, kinds, num_tiles, active, group_m,
                   hbm_bytes, hbm_s, hbm_frac_a, hbm_frac_b, sharers_a, sharers_b)


def model_gemm(desc: GemmDesc, config: GemmConfig, arch: ArchSpec,
               figures: MemoryFigures = MEMORY_FIGURES) -> GemmCost:
    """Modelled chip time of ``desc`` run with ``config`` on ``arch`` (the module docstring lists every term).

    ``figures``: the sourced memory-system figures (``ROOFLINE_FIGURES`` switches the latency-regime terms off).
    """
    return _gemm_cost(desc, _model_terms(desc, config, arch, figures))


class _Terms(NamedTuple):
    """A config's modelled time and the parts ``_gemm_cost`` turns into a ``GemmCost`` (see ``_model_terms``)."""

    time_s: float
    pipe_s: dict[str, float]  # the busiest core's busy time per pipe
    l2_s: float
    hbm_s: float
    fill_s: float  # fill + drain
    mte2_by_limit: dict[str, float]  # the busiest core's MTE2 time by what limits each copy
    num_tiles: int
    num_waves: int
    l2_bytes: float
    hbm_bytes: float
    overhead_s: float  # copy overhead and same-address loss of the busiest core's MTE2 time
    same_s: float
    active: int


def _model_terms(desc: GemmDesc, config: GemmConfig, arch: ArchSpec,
                 figures: MemoryFigures = MEMORY_FIGURES) -> _Terms:
    """``model_gemm`` up to its time: what the config search ranks configs by, without naming the bound or
    building a ``GemmCost`` for every config it tries (``_gemm_cost`` does that for the one it keeps)."""
    c = config
    cores = c.num_ai_cores
    clock = arch.clock_hz
    a_resident = keeps_a_resident(desc, c, arch)
    layout = _block_layout(desc, arch, c.block_m, c.block_n, cores, c.path, c.swizzle_group_m, a_resident)
    (r, kpad, a_bits, b_bits, _, _, a_bytes, b_bytes, out_bytes, sf_row, mb, nb, tail_m, tail_n, tile_kinds,
     num_tiles, active, group_m, hbm_bytes, hbm_s, hbm_frac_a, hbm_frac_b, sharers_a, sharers_b) = layout
    f = figures
    if f.enabled:
        stage = c.block_k * ((0 if a_resident else c.block_m * a_bits) + c.block_n * b_bits) / 8
        links = _Links(f.mte2_bytes_per_s(arch), max(1, c.num_l1_stages - 1) * stage,
                       arch.hbm_bytes_per_s / active, arch.l2_bytes_per_s / active, f.gm_latency_s, f.copy_issue_s,
                       hbm_frac_a, hbm_frac_b,
                       f.same_address_factor(sharers_a), f.same_address_factor(sharers_b), f)
    else:
        inf = float("inf")
        links = _Links(arch.gm_to_l1_bytes_per_cycle * clock, inf, inf, inf, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, f)
    stream = links.stream_bytes_per_s

    # (core cycles = slowest pipe, pipe cycles, GM bytes, count, copy overhead s, same-address s, MTE2 by limit,
    # core cycles without MTE2)
    kinds = []
    # NOTES: without an M (N) tail the four kinds share tile sizes; each size is costed once (the costs are pure).
    costed: dict[tuple[int, int], tuple] = {}
    for tm, tn, count in tile_kinds:
        costs = costed.get((tm, tn))
        if costs is None:
            pipes, gm, overhead, same, by_limit = _tile_costs(desc, c, arch, tm, tn, layout, a_resident, links)
            others = max(pipes["cube"], pipes["mte1"], pipes["fixpipe"], pipes["vector"])  # all but MTE2
            costs = costed[tm, tn] = (max(pipes.values()), pipes, gm, overhead, same, by_limit, others)
        cycles, pipes, gm, overhead, same, by_limit, others = costs
        kinds.append((cycles, pipes, gm, count, overhead, same, by_limit, others))
    kinds.sort(key=lambda kind: -kind[0])
    l2_bytes = sum(kind[2] * kind[3] for kind in kinds)

    # Waves over the AI cores. The busiest core runs ceil(tiles / P) tiles and is taken to draw the heaviest
    # ones: exact when tails are few (the static round-robin order gives some core only full tiles), an upper
    # bound otherwise. A wave costs the larger of that core's tile and the wave's L2 reads (P tiles like it;
    # the tail wave has fewer tiles, so fewer bytes); pipes within a core overlap (double-buffered stages).
    full_waves, tail = divmod(num_tiles, cores)
    num_waves = full_waves + (1 if tail else 0)
    wave_time = 0.0
    compute_time = 0.0  # the same without MTE2: what waits for the first L1 stage when the loads keep up
    pipe_s = dict.fromkeys(_PIPES, 0.0)
    overhead_s = same_s = 0.0
    mte2_by_limit: dict[str, float] = {}
    taken = 0
    # Heaviest first, until the busiest core is full.
    for cycles, pipes, gm, count, overhead, same, by_limit, others in kinds:
        take = min(count, num_waves - taken)
        full = max(0, min(take, full_waves - taken))  # of them, tiles that run in full waves
        for n_tiles, in_wave in ((full, cores), (take - full, tail)):
            if n_tiles:
                wave_bytes = in_wave * gm
                wave_time += n_tiles * max(cycles / clock, wave_bytes / arch.l2_bytes_per_s)
                compute_time += n_tiles * max(others / clock, wave_bytes / arch.l2_bytes_per_s)
        for key in _PIPES:
            pipe_s[key] += take * pipes[key] / clock
        overhead_s += take * overhead
        same_s += take * same
        for key, value in by_limit.items():
            mte2_by_limit[key] = mte2_by_limit.get(key, 0.0) + take * value
        taken += take
        if taken == num_waves:
            break
    if a_resident:
        # Stream path: row-major tiles, so an M-block's N tiles sit on min(P, N-blocks) consecutive cores, each
        # of which loads that A panel (BLOCK_M x K and scales) once, between pipe barriers (not overlapped).
        panel_rows = tail_m if mb == 1 else c.block_m
        panel = panel_rows * (kpad * a_bytes + sf_row)
        loads = r.count * mb * min(cores, nb)
        loads_busiest = -(-loads // cores)
        if f.enabled:
            rows = kpad / 64 if desc.major_a == "mn" else panel_rows
            panel_s, panel_overhead, panel_same, limit = _copy_s(links, panel, rows, links.hbm_frac_a, links.slow_a)
            overhead_s += loads_busiest * panel_overhead
            same_s += loads_busiest * panel_same
            mte2_by_limit[limit] = mte2_by_limit.get(limit, 0.0) + loads_busiest * panel_s
        else:
            panel_s = panel / stream
        wave_time += loads_busiest * max(panel_s, min(cores, loads) * panel / arch.l2_bytes_per_s)
        compute_time += loads_busiest * max(panel_s, min(cores, loads) * panel / arch.l2_bytes_per_s)
        pipe_s["mte2"] += loads_busiest * panel_s
        l2_bytes += loads * panel

    # Fill: the first wave's first L1 stage (its distinct A and B blocks) from cold HBM, each core's stage
    # through its MTE2 (with the figures: two copies, each paying issue and memory latency), then its first L0
    # slices through MTE1. Drain: the last MAD tile through FixPipe, out of UB and (with the figures) to GM.
    first_m = min(c.block_m, tail_m if mb == 1 else c.block_m)
    first_n = min(c.block_n, tail_n if nb == 1 else c.block_n)
    first_k = min(c.block_k, kpad)
    sf_k = first_k / 32 if desc.has_sf else 0.0
    row_bytes_a, row_bytes_b = first_k * a_bytes + sf_k, first_k * b_bytes + sf_k
    # Row-major: the first wave spans active / N-blocks M-blocks; super-rows: group_m M-blocks and active / group_m
    # N-blocks. NOTES: with super-rows the larger of the two is charged, so that the switch to the swizzle at
    # group_m M-blocks never makes a bigger problem faster.
    first_wave = (min(mb, -(-active // nb)) * first_m * row_bytes_a + min(nb, active) * first_n * row_bytes_b)
    if group_m > 1:
        first_wave = max(first_wave, group_m * first_m * row_bytes_a
                         + min(nb, -(-active // group_m)) * first_n * row_bytes_b)
    stage = first_m * row_bytes_a + first_n * row_bytes_b
    if f.enabled:
        # NOTES: the chip's HBM is the first_wave term; per core the first copies pay issue, latency and MTE2.
        stage_s = (links.issue_s + links.latency_s + first_m * row_bytes_a * f.row_factor(row_bytes_a) / stream
                   + (links.issue_s + links.latency_s + first_n * row_bytes_b * f.row_factor(row_bytes_b) / stream))
    else:
        stage_s = stage / stream
    fill_s = max(first_wave / arch.hbm_bytes_per_s, stage_s)
    l0_s = (min(c.mad_m, first_m) * a_bits + min(c.mad_n, first_n) * b_bits) / 8 * min(c.mad_k, first_k) / (
        arch.l1_to_l0_bytes_per_cycle * clock)
    fill_s += l0_s
    last_mad = min(c.mad_m, first_m) * min(c.mad_n, first_n)
    if f.enabled:
        # NOTES: the first stage's bytes are in the busiest core's MTE2 time already; when MTE2 binds only the
        # first copy's issue and latency (and the first L0 slices) are exposed, otherwise the Cube waits for the
        # whole first stage.
        exposed = links.issue_s + links.latency_s + l0_s
        core_s = max(fill_s + compute_time, exposed + wave_time)
        fill_s = max(fill_s + compute_time - wave_time, exposed)
        fix_elems = min(f.fixpipe_elems_per_cycle, arch.fixpipe_bytes_per_cycle // out_bytes)
        drain_s = last_mad / (fix_elems * clock) + links.issue_s + links.latency_s + last_mad * out_bytes / stream
    else:
        drain_s = last_mad * (4 + out_bytes) / (arch.fixpipe_bytes_per_cycle * clock)
        core_s = fill_s + wave_time

    # NOTES: the fill's bytes are part of the HBM traffic, so an HBM-bound kernel does not pay for them twice.
    # Rounded to 1e-15 s: float summation order must not make a bigger problem one ulp faster.
    time_s = round(max(core_s, l2_bytes / arch.l2_bytes_per_s, hbm_s) + drain_s + LAUNCH_S, 15)
    return _Terms(time_s, pipe_s, l2_bytes / arch.l2_bytes_per_s, hbm_s, fill_s + drain_s, mte2_by_limit, num_tiles,
                  num_waves, l2_bytes, hbm_bytes, overhead_s, same_s, active)


def _gemm_cost(desc: GemmDesc, t: _Terms) -> GemmCost:
    """The ``GemmCost`` of a config's terms: each resource's time and the one that binds it."""
    parts = dict(t.pipe_s, l2=t.l2_s, hbm=t.hbm_s)
    busiest = bound = max(RESOURCES, key=parts.__getitem__)
    if bound == "mte2" and t.mte2_by_limit:
        # MTE2 waiting on its share of HBM or L2, or on latency with too few bytes in flight: name that instead.
        bound = max(t.mte2_by_limit, key=t.mte2_by_limit.__getitem__)
    if t.fill_s + LAUNCH_S > parts[busiest]:
        bound = "latency"
    return GemmCost(
        time_s=t.time_s, cube_s=parts["cube"], mte1_s=parts["mte1"], mte2_s=parts["mte2"],
        fixpipe_s=parts["fixpipe"], vector_s=parts["vector"], l2_s=parts["l2"], hbm_s=t.hbm_s,
        fill_s=t.fill_s, launch_s=LAUNCH_S, bound=bound, num_tiles=t.num_tiles, num_waves=t.num_waves,
        l2_bytes=int(round(t.l2_bytes)), hbm_bytes=int(round(t.hbm_bytes)), flops=useful_flops(desc),
        copy_overhead_s=t.overhead_s, same_address_s=t.same_s, active_cores=t.active,
    )
