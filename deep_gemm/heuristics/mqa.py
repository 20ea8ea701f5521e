"""MQA logits (ragged and paged): what a call is (``MqaDesc``), the kernel config (``MqaConfig``), its cost on the
Ascend 950 (``model_mqa``) and the config choice (``get_best_mqa_config``); plus the paged schedule's work units.

Pure arithmetic, no numpy arrays, no numba. The kernels modelled are templates/mqa_logits.asc.j2 and
paged_mqa_logits.asc.j2 (lib/mqa.asc.j2), organised as DeepGEMM-Ascend's: per tile the AIC runs one
[block_q * H, block_kv] MAD over head_dim, FixPipe drains it into one AIV's UB (tiles alternate between the two
AIVs), applying the ReLU and rounding to bf16 on the fly (F322BF16, 64 elements per cycle), and that AIV weights
and sums the heads (one multiply-accumulate per head per query row) and writes the logits. With the unit flag
FixPipe drains each MAD as its fractals complete, so the Cube -> FixPipe chain of a tile costs the MAD's fixed
start plus its fractal sweep, against FixPipe's own stream; for FP8 at head_dim 128 the two streams are equal (64
outputs per cycle each) and the tile takes the MAD's start on top: the kernel is Cube/FixPipe-bound, the AIVs and
MTE2 well under it. Per tile the pipes overlap (every stage is double-buffered); a core's time is its tiles times
the slowest pipe (paged: the sum over its units of each unit's slowest pipe, a unit's own query rows and keys).
The paged gather is the chip's: the AIC copies two pages of values per copy, the AIVs move the scales
(PAGES_PER_COPY). ``mqa_tile_work`` is the per-tile work both the time model and ``ragged_work`` / ``paged_work``
(the exact totals of the kernels' walk, tested against their own counters) count.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..arch import ArchSpec
from .model import (
    AIVS_PER_CORE,
    LAUNCH_S,
    MAD_ISSUE_CYCLES,
    MEMORY_FIGURES,
    UB_TO_L1_BYTES_PER_CYCLE,
    VECTOR_FP32_PER_CYCLE,
)

MQA_DTYPES = ("fp8", "fp4")
MQA_HEAD_DIMS = (32, 64, 128)
# NOTES: FP4 head_dim 32 is refused as CUDA DeepGEMM does (its FP4 path takes 64 and 128 only).
MQA_FP4_HEAD_DIMS = (64, 128)
MQA_MIN_HEADS, MQA_MAX_HEADS = 4, 64
# NOTES: the paged schedule's work unit, as upstream: one query atom against 256 keys (a whole number of pages for
# page sizes 32, 64 and 128). The metadata splits units, so it is fixed (the kernel's block_kv is this).
PAGED_SPLIT_KV = 256
PAGE_SIZES = (32, 64, 128)
# NOTES: the MAD's rows (query rows x heads) are capped by L0C (two [rows, block_kv] fp32 slots in 256 KiB) and by
# one AIV's UB (its bf16 [rows, block_kv] hand-off slot plus the operator's buffers, mqa_ub_bytes).
# Where the stand-in still differs from DeepGEMM-Ascend's kernel (mqa_logits.hpp), and why: its MAD is up to 128
# rows x 128 / 256 keys where the chip's is 64 / H * H rows x 512 keys, 8 such MADs per query block sharing one key
# load (the paged metadata's 256-key units and the ragged kernel's L0B key residency are what the existing tests
# and get_paged_mqa_logits_metadata pin); its AIV sums the heads in fp32 (one VF per query row, a multiply-
# accumulate per head, each bf16 score widened in the lane) where the chip multiply-accumulates bf16 scores into
# bf16 sums (asc_mula), which would round each partial sum to bf16 and break the stand-in's bf16 = RNE(fp32 logits)
# contract; and it keeps CUDA DeepGEMM's fp32 per-key scale form (the same VF scales and ReLUs each score), which
# the chip's API does not take. The model charges the chip's rates for the work the stand-in issues: the head
# reduction at the chip's bf16 lanes, FixPipe at 64 bf16 elements per cycle.
# The paged gather (PAGES_PER_COPY) is the chip's in the model and in the stand-in's kernel: two pages of values per
# AIC copy (a two-burst copy), the scales moved by the owning AIV; copies and bytes are tested against the kernel's
# counters (test_mqa_work_model.py). The stand-in's AIC reads the owner's UB scale stage in place of the chip's
# UB -> L1 copy (counted where the chip issues it, not run).
MAX_MAD_ROWS = 128
# L0B stages of the MQA kernels' AIC (lib/mqa.asc.j2 NUM_L0_STAGES): the ragged kernel skips a tile's key copies
# when the stage it uses still holds that key block.
MQA_L0B_STAGES = 2
# NOTES: the MAD's fixed cost beyond its fractal sweep: asc-devkit's Cube instruction table (docs/zh/api/附录/
# Cube指令理论性能汇总.md) gives a 128 x 256 x 512 fp16 Mmad 4096 cycles of sweep + 60 in theory and 4209-4225
# measured: the midpoint less the sweep, 121 cycles, is charged once per MAD (shared reference
# ascend_memory_latency.md, "Fixed costs"). [M]
MAD_START_CYCLES = 121
# bf16 lanes of one AIV Vector instruction: 256 B registers (deepgemm_ascend_api.md, "Vector register 256 B");
# DeepGEMM-Ascend's head reduction is one bf16 multiply-accumulate (asc_mula) per head per register of scores.
VECTOR_BF16_PER_CYCLE = 128
# Fixed cost of one vector-function call of the head reduction (cycles): issue and pipeline start, our judgement
# (the 950's vector pipeline depth); DeepGEMM-Ascend makes one such call per query row (two when it pairs rows).
VECTOR_ISSUE_CYCLES = 8


@dataclass(frozen=True)
class TileWork:
    """What one tile of m_rows MAD rows (q_rows query rows x H heads) x kv_rows keys makes each unit do, as the
    kernels issue it (lib/mqa.asc.j2): the MAD, FixPipe's bf16 bytes into the owning AIV's UB, the head reduction
    (q_rows * H multiply-accumulate rows of kv_rows lanes, one VF per query row) and, in CUDA's fp32 per-key
    scale form, the fp32 lanes of the scale's Mul and the ReLU inside that VF."""

    m_rows: int
    kv_rows: int
    q_rows: int
    fixpipe_bytes: int
    reduce_instructions: int
    reduce_lanes: int
    scale_lanes: int


def mqa_tile_work(desc: MqaDesc, q_rows: int, kv_rows: int, token_scale: bool) -> TileWork:
    """The per-tile work of q_rows query rows x kv_rows keys (see TileWork)."""
    h = desc.num_heads
    m = q_rows * h
    return TileWork(m_rows=m, kv_rows=kv_rows, q_rows=q_rows, fixpipe_bytes=m * kv_rows * 2,
                    reduce_instructions=m, reduce_lanes=m * kv_rows, scale_lanes=2 * m * kv_rows if token_scale else 0)


@dataclass(frozen=True)
class MqaDesc:
    """One MQA-logits kernel problem: the compiled dims (heads, head_dim, dtypes, cores) and, for the paged kernel,
    the query tokens per batch row (``next_n``; 0 for the ragged kernel) and the KV layout."""

    num_heads: int
    head_dim: int
    q_dtype: str = "fp8"
    kv_dtype: str = "fp8"
    num_ai_cores: int = 32
    next_n: int = 0  # paged: query tokens per batch row; 0: ragged
    ascend_kv_layout: bool = False  # paged: each token's values and scales together

    @property
    def paged(self) -> bool:
        return self.next_n > 0


@dataclass(frozen=True)
class MqaConfig:
    """The kernel config: block_kv and the stage counts are template constants (UPPER_CASE), block_q a runtime
    argument."""

    block_q: int  # query rows per tile (paged: tokens of one batch row, the schedule's atom)
    block_kv: int  # keys per tile (paged: PAGED_SPLIT_KV)
    num_l1_stages: int  # key blocks in flight GM -> L1
    num_ub_stages: int = 2  # fp32 tiles in flight AIC -> AIV

    def template_constants(self) -> dict[str, int]:
        """The compiled part of the config; block_q is a runtime argument of the kernels (with the head count and
        head dim), so every head count and head dim of a dtype pair, core count and block_kv shares one kernel."""
        return {"BLOCK_KV": self.block_kv, "NUM_L1_STAGES": self.num_l1_stages, "NUM_UB_STAGES": self.num_ub_stages,
                "MAX_MAD_M": MAX_MAD_ROWS}


def storage_bytes(dtype: str, head_dim: int) -> int:
    """Bytes of one row of head_dim values: FP8 one per value, FP4 two values per byte."""
    return head_dim if dtype == "fp8" else head_dim // 2


def paged_atom_tokens(next_n: int, num_heads: int) -> int:
    """Query tokens of one batch row taken together by the paged kernel (one MAD of atom * H rows): as many as fit
    MAX_MAD_ROWS, at most next_n. The metadata and the kernel both use it."""
    return max(1, min(next_n, MAX_MAD_ROWS // num_heads))


def paged_token_bytes(dtype: str, head_dim: int, ascend_kv_layout: bool) -> int:
    """Bytes per token of the uint8 paged cache: the values plus, in the Ascend layout, one UE8M0 exponent per 32
    of head_dim (2 * D / 64), or in CUDA DeepGEMM's, a 4-byte scale (fp32 for FP8, packed UE8M0 for FP4)."""
    return storage_bytes(dtype, head_dim) + (head_dim // 32 if ascend_kv_layout else 4)


def mqa_ub_bytes(c: MqaConfig) -> int:
    """One AIV's UB in the kernels (lib/mqa.asc.j2, sized for MAX_MAD_ROWS rows): its hand-off slots (bf16 tiles,
    num_ub_stages / 2 per AIV), the key-scale row (also the paged kernel's MX scale stage), the weights, the fp32
    sums and bf16 logits of MAX_MAD_ROWS / 4 query rows, the -inf rows."""
    n, rows = c.block_kv, MAX_MAD_ROWS
    def a32(b: int) -> int:
        return -(-b // 32) * 32
    return (c.num_ub_stages // 2) * rows * n * 2 + n * 4 + rows * 4 \
        + rows // 4 * n * 4 + a32(rows // 4 * n * 2) + a32(n * 2) + n * 4


def config_violations(desc: MqaDesc, c: MqaConfig, arch: ArchSpec) -> list[str]:
    """Why ``c`` cannot run ``desc`` on ``arch`` (empty when it can): the chip's L1 / L0 / UB capacities."""
    mad_m = c.block_q * desc.num_heads
    d = desc.head_dim
    row_bytes = max(storage_bytes(desc.kv_dtype, d), paged_token_bytes(desc.kv_dtype, d, True)) + 4
    out = []
    if mad_m > MAX_MAD_ROWS and not desc.paged:
        out.append(f"block_q * heads = {mad_m} > {MAX_MAD_ROWS}")
    if 2 * mad_m * c.block_kv * 4 > arch.l0c_bytes:
        out.append(f"two L0C slots of {mad_m} x {c.block_kv} fp32 exceed L0C ({arch.l0c_bytes} B)")
    if mad_m * storage_bytes(desc.q_dtype, d) > arch.l0a_bytes:
        out.append("the q panel exceeds L0A")
    if 2 * c.block_kv * storage_bytes(desc.kv_dtype, d) > arch.l0b_bytes:
        out.append("two key blocks exceed L0B")
    l1 = mad_m * (d + d // 32) + c.num_l1_stages * c.block_kv * row_bytes
    if l1 > arch.l1_bytes:
        out.append(f"L1 needs {l1} B > {arch.l1_bytes} B")
    ub = mqa_ub_bytes(c)
    if ub > arch.ub_bytes:
        out.append(f"UB needs {ub} B > {arch.ub_bytes} B")
    return out


# ---------------------------------------------------------------------------------------------------------------
# The cost model


@dataclass(frozen=True)
class MqaCost:
    """Modelled chip time of one MQA-logits call and its parts (seconds; per-pipe times on the busiest core)."""

    time_s: float
    cube_s: float
    fixpipe_s: float
    vector_s: float
    mte2_s: float  # the AIC's GM -> L1: key blocks (paged: the value gather, page pairs) and the q panels
    l2_s: float
    hbm_s: float
    launch_s: float
    bound: str
    num_tiles: int  # tiles (paged: work units) with work
    busiest_tiles: int  # tiles of the busiest core
    hbm_bytes: int
    l2_bytes: int
    flops: float  # useful FLOPs: 2 * H * D per (query row, key) in range
    aiv_mte2_s: float = 0.0  # paged: the AIVs' scale gather (GM -> UB -> L1), per AIV
    pages_per_copy: int = 0  # paged: pages per AIC value copy (0: ragged)


def _tile_pipes(desc: MqaDesc, c: MqaConfig, arch: ArchSpec, m_rows: int, kv_rows: int, token_scale: bool,
                copies: int, copy_bytes: int) -> dict[str, float]:
    """Busy time of each pipe of one core for one tile of m_rows MAD rows x kv_rows keys (seconds)."""
    clock = arch.clock_hz
    work = mqa_tile_work(desc, max(1, m_rows // desc.num_heads), kv_rows, token_scale)
    cube_dtype = "fp8" if "fp8" in (desc.q_dtype, desc.kv_dtype) else "fp4"
    c0 = arch.c0_bytes * 8 // (8 if cube_dtype == "fp8" else 4)
    frac = arch.frac_mn
    sweep = -(-m_rows // frac) * -(-kv_rows // frac) * -(-desc.head_dim // c0)
    # the Cube's MAD: its fixed start plus the sweep; FixPipe drains its fractals behind it (unit flag)
    cube = (MAD_START_CYCLES + max(sweep, MAD_ISSUE_CYCLES[cube_dtype])) / clock
    # FixPipe: bf16 out (F322BF16) at 64 elements per cycle (950 spec); the ReLU rides along
    fixpipe = work.fixpipe_bytes / 2 / MEMORY_FIGURES.fixpipe_elems_per_cycle / clock
    # the owning AIV: the head reduction (bf16 lanes per register, one VF call per query row), and CUDA's per-key
    # scale form's fp32 Mul + ReLU in the same VF; the two AIVs take alternate tiles, so a core spends half of it per
    # tile
    owner = work.reduce_lanes / VECTOR_BF16_PER_CYCLE + work.q_rows * VECTOR_ISSUE_CYCLES \
        + work.scale_lanes / VECTOR_FP32_PER_CYCLE
    vector = owner / AIVS_PER_CORE / clock
    fig = MEMORY_FIGURES
    mte2 = copies * fig.copy_issue_s + copy_bytes / fig.mte2_bytes_per_s(arch) + fig.gm_latency_s / c.num_l1_stages
    mte1 = kv_rows * storage_bytes(desc.kv_dtype, desc.head_dim) / arch.l1_to_l0_bytes_per_cycle / clock
    return {"cube": cube, "fixpipe": fixpipe, "vector": vector, "mte2": mte2, "mte1": mte1}


def ragged_tiles(seq_len: int, seq_len_kv: int, block_q: int, block_kv: int, ks: list[int] | None,
                 ke: list[int] | None) -> list[tuple[int, int, int]]:
    """Per query block with work: (query rows, first key block, key blocks) the ragged kernel runs (the blocks
    meeting the union of its rows' ranges; full rows [0, seq_len_kv) without ks / ke)."""
    out = []
    for q0 in range(0, seq_len, block_q):
        rows = min(block_q, seq_len - q0)
        if ks is None:
            lo, hi = 0, seq_len_kv
        else:
            spans = [(ks[i], ke[i]) for i in range(q0, q0 + rows) if ks[i] < ke[i]]
            if not spans:
                continue
            lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
        if hi > lo:
            first, last = lo // block_kv, (hi - 1) // block_kv
            out.append((rows, first, last - first + 1))
    return out


WORK_FIELDS = ("fixpipe_bytes", "fixpipe_tiles", "reduce_instructions", "reduce_lanes", "key_bytes", "mads")


def _add_tile(acc: dict[str, int], work: TileWork, key_bytes: int) -> None:
    acc["fixpipe_bytes"] += work.fixpipe_bytes
    acc["fixpipe_tiles"] += 1
    acc["reduce_instructions"] += work.reduce_instructions
    acc["reduce_lanes"] += work.reduce_lanes
    acc["key_bytes"] += key_bytes
    acc["mads"] += 1


def ragged_work(desc: MqaDesc, c: MqaConfig, *, seq_len: int, seq_len_kv: int, ks: list[int] | None = None,
                ke: list[int] | None = None, token_scale: bool = True) -> list[dict[str, int]]:
    """Per core, the work the ragged kernel issues (WORK_FIELDS totals): its walk (tile t on core t % cores, tiles
    whose keys miss every row's range skipped), the key copies it skips when its L0B stage still holds the block,
    and mqa_tile_work per tile. The kernel's own counters (kernels.mqa_logits.count_work) must agree."""
    cores, d = desc.num_ai_cores, desc.head_dim
    kv_row = storage_bytes(desc.kv_dtype, d) + (0 if token_scale else d // 32)
    num_q_blocks = -(-seq_len // c.block_q)
    num_kv_blocks = -(-seq_len_kv // c.block_kv)
    spans = []
    for qb in range(num_q_blocks):
        q0 = qb * c.block_q
        rows = min(c.block_q, seq_len - q0)
        if ks is None:
            spans.append((rows, 0, seq_len_kv))
            continue
        lo, hi = seq_len_kv, 0
        for i in range(q0, q0 + rows):
            if ks[i] < ke[i]:
                lo, hi = min(lo, ks[i]), max(hi, ke[i])
        spans.append((rows, lo, hi))
    out = []
    for core in range(cores):
        acc = dict.fromkeys(WORK_FIELDS, 0)
        held, it = [-1] * MQA_L0B_STAGES, 0
        for t in range(core, num_q_blocks * num_kv_blocks, cores):
            rows, lo, hi = spans[t // num_kv_blocks]
            kv0 = (t % num_kv_blocks) * c.block_kv
            if kv0 >= hi or kv0 + c.block_kv <= lo:
                continue
            n = min(c.block_kv, seq_len_kv - kv0)
            resident = held[it % MQA_L0B_STAGES] == kv0
            held[it % MQA_L0B_STAGES] = kv0
            it += 1
            _add_tile(acc, mqa_tile_work(desc, rows, n, token_scale), 0 if resident else n * kv_row)
        out.append(acc)
    return out


def paged_work(desc: MqaDesc, c: MqaConfig, *, context_lens: list[list[int]],
               token_scale: bool | None = None) -> list[dict[str, int]]:
    """Per core, the work the paged kernel issues (WORK_FIELDS totals): core c's share [starts[c], starts[c + 1])
    of the (atom, unit) order (split_units), every unit gathering its keys' pages (the cache layout's bytes per
    token, whatever the page size), mqa_tile_work per unit."""
    cores, atom = desc.num_ai_cores, c.block_q
    token = paged_token_bytes(desc.kv_dtype, desc.head_dim, desc.ascend_kv_layout)
    if token_scale is None:
        token_scale = (not desc.ascend_kv_layout) and desc.kv_dtype == "fp8"
    flat = paged_unit_list(context_lens, atom)
    starts = split_units(len(flat), cores)
    out = []
    for core in range(cores):
        acc = dict.fromkeys(WORK_FIELDS, 0)
        for rows, n in flat[starts[core]:starts[core + 1]]:
            _add_tile(acc, mqa_tile_work(desc, rows, n, token_scale), n * token)
        out.append(acc)
    return out


def model_mqa(desc: MqaDesc, c: MqaConfig, arch: ArchSpec, *, seq_len: int, seq_len_kv: int,
              ks: list[int] | None = None, ke: list[int] | None = None, token_scale: bool = True) -> MqaCost:
    """Modelled time of the ragged kernel (templates/mqa_logits.asc.j2) on ``seq_len`` query rows against
    ``seq_len_kv`` keys; row i sees keys [ks[i], ke[i]) (all keys when ks / ke are None). token_scale: CUDA's fp32
    per-key scale (an extra Vector pass) rather than MX scales."""
    cores = desc.num_ai_cores
    blocks = ragged_tiles(seq_len, seq_len_kv, c.block_q, c.block_kv, ks, ke)
    tiles = [(rows, nkv) for rows, _, nkv in blocks]
    num_tiles = sum(n for _, n in tiles)
    d = desc.head_dim
    kv_row = storage_bytes(desc.kv_dtype, d) + (0 if token_scale else d // 32)
    q_row = storage_bytes(desc.q_dtype, d) + d // 32
    full = _tile_pipes(desc, c, arch, c.block_q * desc.num_heads, c.block_kv, token_scale, 1 if token_scale else 2,
                       c.block_kv * kv_row)
    busiest = -(-num_tiles // cores) if num_tiles else 0
    # Key residency: when every query block with work meets every key block and the key blocks divide the
    # L0B stages of all cores, a core's tile finds its keys still in the L0B stage it uses (the tile
    # MQA_L0B_STAGES tiles earlier on that core had the same key block): only its first tiles load keys.
    num_kv_blocks = -(-seq_len_kv // c.block_kv)
    resident = num_tiles > 0 and all(n == num_kv_blocks for _, n in tiles) \
        and (MQA_L0B_STAGES * cores) % num_kv_blocks == 0
    loads = min(busiest, MQA_L0B_STAGES) if resident else busiest
    kept = dict(full, mte2=0.0, mte1=0.0)
    tile_s = max(full.values())
    tile_kept_s = max(kept.values())
    # q panels: a core reloads its panel when its next tile is another query block (between pipe barriers)
    q_blocks = len(blocks)
    panel_s = MEMORY_FIGURES.copy_issue_s + MEMORY_FIGURES.gm_latency_s + \
        c.block_q * desc.num_heads * q_row / MEMORY_FIGURES.mte2_bytes_per_s(arch)
    panels_per_core = -(-q_blocks // cores) if num_tiles < cores * max(1, q_blocks) else -(-num_tiles // cores)
    panels_per_core = min(panels_per_core, busiest)
    core_s = loads * tile_s + (busiest - loads) * tile_kept_s + panels_per_core * panel_s
    # chip-wide traffic: every key load reads its key block through L2; keys, q, weights come from HBM once, logits
    # leave
    valid = sum((min(ke[i], seq_len_kv) - ks[i]) for i in range(seq_len) if ke[i] > ks[i]) if ks is not None \
        else seq_len * seq_len_kv
    key_loads = min(num_tiles, MQA_L0B_STAGES * cores) if resident else num_tiles
    l2_bytes = key_loads * c.block_kv * kv_row + q_blocks * c.block_q * desc.num_heads * q_row
    hbm_bytes = seq_len_kv * kv_row + seq_len * desc.num_heads * (q_row + 4) + valid * 2
    l2_s, hbm_s = l2_bytes / arch.l2_bytes_per_s, hbm_bytes / arch.hbm_bytes_per_s
    times = {"core": core_s, "l2": l2_s, "hbm": hbm_s}
    pipes = {k: v * loads + kept[k] * (busiest - loads) for k, v in full.items()}
    bound = max(pipes, key=pipes.get) if max(times, key=times.get) == "core" else max(times, key=times.get)
    body = max(times.values())
    total = body + (MEMORY_FIGURES.gm_latency_s + tile_s if num_tiles else 0.0) + LAUNCH_S
    return MqaCost(time_s=total, cube_s=pipes["cube"], fixpipe_s=pipes["fixpipe"], vector_s=pipes["vector"],
                   mte2_s=pipes["mte2"] + panels_per_core * panel_s, l2_s=l2_s, hbm_s=hbm_s, launch_s=LAUNCH_S,
                   bound=bound, num_tiles=num_tiles, busiest_tiles=busiest,
                   hbm_bytes=int(hbm_bytes), l2_bytes=int(l2_bytes), flops=2.0 * desc.num_heads * d * valid)


def paged_units(context_lens: list[list[int]], atom: int) -> list[int]:
    """Work units (PAGED_SPLIT_KV-key segments) of every query atom, in the schedule's order (batch row, then its
    atoms): ceil(max context of the atom's tokens / PAGED_SPLIT_KV)."""
    units = []
    for row in context_lens:
        for t0 in range(0, len(row), atom):
            ctx = max(row[t0:t0 + atom])
            units.append(-(-max(ctx, 0) // PAGED_SPLIT_KV))
    return units


def split_units(total: int, num_cores: int) -> list[int]:
    """First unit of each core's share and the end: shares of total // cores units, the first total % cores cores
    one more (so shares differ by at most one)."""
    base, extra = divmod(total, num_cores)
    return [c * base + min(c, extra) for c in range(num_cores + 1)]


def paged_unit_list(context_lens: list[list[int]], atom: int) -> list[tuple[int, int]]:
    """(query rows, keys) of every work unit in the schedule's order (batch row, its atoms, their
    PAGED_SPLIT_KV-key units): the atom's tokens and min(PAGED_SPLIT_KV, the atom's context left)."""
    flat = []
    for row in context_lens:
        next_n = len(row)
        for t0 in range(0, next_n, atom):
            ctx = max(0, max(row[t0:t0 + atom]))
            for u in range(-(-ctx // PAGED_SPLIT_KV)):
                flat.append((min(atom, next_n - t0), min(PAGED_SPLIT_KV, ctx - u * PAGED_SPLIT_KV)))
    return flat


# NOTES: the chip's paged gather (DeepGEMM-Ascend mqa_logits.hpp mqa_logits_core_impl and
# scheduler/paged_mqa_logits.hpp get_physical_page_batch): the AIC copies a split's key values GM -> L1 two pages per
# copy (burst count 2, the source stride the two pages' physical distance, the lower page first; the AIVs restore
# the order of reversed pairs when they store the logits), and the scales never ride with the values: the split's
# owning AIV (splits alternate between the two) copies them GM -> UB, two pages per copy, four splits ahead, then
# UB -> L1 in one MTE3 copy (asc_copy_ub2l1) that the AIC's L1 -> L0B scale load waits for. The same in either
# cache layout and for FP8 and FP4. The model charges that gather; see the NOTES on MAX_MAD_ROWS for the stand-in.
PAGES_PER_COPY = 2


def paged_scale_bytes(kv_dtype: str, head_dim: int, ascend_kv_layout: bool) -> int:
    """Scale bytes per token of the paged cache (the bytes the AIVs move): one UE8M0 per 32 of head_dim in the
    Ascend layout, 4 bytes (fp32 for FP8, packed UE8M0 for FP4) in CUDA DeepGEMM's."""
    return paged_token_bytes(kv_dtype, head_dim, ascend_kv_layout) - storage_bytes(kv_dtype, head_dim)


def _paged_unit_pipes(desc: MqaDesc, c: MqaConfig, arch: ArchSpec, q_rows: int, kv_rows: int, page_size: int,
                      token_scale: bool) -> dict[str, float]:
    """Busy time of each pipe of one core for one paged work unit (seconds): the AIC's MAD, FixPipe and value
    gather (_tile_pipes with one copy per page pair), and the owning AIV's scale gather (``aiv_mte2``: GM -> UB
    per page pair, then, for MX scales, UB -> L1) halved like its reduction, the two AIVs taking alternate units."""
    d = desc.head_dim
    pages = -(-kv_rows // page_size)
    copies = -(-pages // PAGES_PER_COPY)
    pipes = _tile_pipes(desc, c, arch, q_rows * desc.num_heads, kv_rows, token_scale, copies,
                        kv_rows * storage_bytes(desc.kv_dtype, d))
    fig = MEMORY_FIGURES
    sf = kv_rows * paged_scale_bytes(desc.kv_dtype, d, desc.ascend_kv_layout)
    aiv = copies * fig.copy_issue_s + sf / fig.mte2_bytes_per_s(arch)
    if not token_scale:  # MX scales go on to L1 for the Cube; CUDA's fp32 per-key scales stay in UB
        aiv += fig.copy_issue_s + sf / UB_TO_L1_BYTES_PER_CYCLE / arch.clock_hz
    pipes["aiv_mte2"] = aiv / AIVS_PER_CORE
    return pipes


def model_paged_mqa(desc: MqaDesc, c: MqaConfig, arch: ArchSpec, *, context_lens: list[list[int]],
                    page_size: int) -> MqaCost:
    """Modelled time of the paged kernel (templates/paged_mqa_logits.asc.j2): every batch row's atoms against its
    context, 256-key units split evenly over the cores (split_units); a core's time is the sum over its units of
    the slowest pipe of each (the unit's own query rows and keys: a batch row's last atom may be short, as may its
    last unit), plus its q panels. The gather is the chip's (PAGES_PER_COPY)."""
    cores = desc.num_ai_cores
    atom = c.block_q
    units = paged_units(context_lens, atom)
    flat = paged_unit_list(context_lens, atom)
    total = len(flat)
    d = desc.head_dim
    token = paged_token_bytes(desc.kv_dtype, d, desc.ascend_kv_layout)
    token_scale = (not desc.ascend_kv_layout) and desc.kv_dtype == "fp8"
    cache: dict[tuple[int, int], dict[str, float]] = {}

    def unit_pipes(rows: int, n: int) -> dict[str, float]:
        if (rows, n) not in cache:
            cache[(rows, n)] = _paged_unit_pipes(desc, c, arch, rows, n, page_size, token_scale)
        return cache[(rows, n)]

    full = unit_pipes(atom, c.block_kv)
    # the q panel of an atom: a core's share is contiguous in (atom, unit) order, so it reloads once per atom
    q_row = storage_bytes(desc.q_dtype, d) + d // 32
    panel_s = MEMORY_FIGURES.copy_issue_s + MEMORY_FIGURES.gm_latency_s + \
        atom * desc.num_heads * q_row / MEMORY_FIGURES.mte2_bytes_per_s(arch)
    starts = split_units(total, cores)
    busiest = max(starts[i + 1] - starts[i] for i in range(cores)) if total else 0
    atoms_with_work = sum(1 for u in units if u)
    panels = min(busiest, -(-atoms_with_work // cores) + 1) if total else 0
    core_s, pipes = 0.0, dict.fromkeys(full, 0.0)
    for core in range(cores):
        share = flat[starts[core]:starts[core + 1]]
        s = sum(max(unit_pipes(r, n).values()) for r, n in share)
        if s >= core_s:
            core_s = s
            pipes = {k: sum(unit_pipes(r, n)[k] for r, n in share) for k in full}
    core_s += panels * panel_s
    tile_s = max(full.values())
    valid = sum(sum(min(v, 10**12) for v in row) for row in context_lens)
    touched = sum(max(0, -(-max(row[t0:t0 + atom]) // page_size)) * page_size for row in context_lens
                  for t0 in range(0, len(row), atom))
    l2_bytes = sum(n for _, n in flat) * token
    hbm_bytes = touched * token + len(units) * atom * desc.num_heads * (q_row + 4) + valid * 2
    l2_s, hbm_s = l2_bytes / arch.l2_bytes_per_s, hbm_bytes / arch.hbm_bytes_per_s
    times = {"core": core_s, "l2": l2_s, "hbm": hbm_s}
    bound = max(pipes, key=pipes.get) if max(times, key=times.get) == "core" else max(times, key=times.get)
    total_s = max(times.values()) + (MEMORY_FIGURES.gm_latency_s + tile_s if total else 0.0) + LAUNCH_S
    return MqaCost(time_s=total_s, cube_s=pipes["cube"], fixpipe_s=pipes["fixpipe"], vector_s=pipes["vector"],
                   mte2_s=pipes["mte2"] + panels * panel_s, l2_s=l2_s, hbm_s=hbm_s, launch_s=LAUNCH_S, bound=bound,
                   num_tiles=total, busiest_tiles=busiest, hbm_bytes=int(hbm_bytes),
                   l2_bytes=int(l2_bytes), flops=2.0 * desc.num_heads * d * valid, aiv_mte2_s=pipes["aiv_mte2"],
                   pages_per_copy=PAGES_PER_COPY)


# ---------------------------------------------------------------------------------------------------------------
# The choice


def candidate_mqa_configs(desc: MqaDesc, arch: ArchSpec) -> list[MqaConfig]:
    """Legal configs: ragged: block_q even (the AIVs' halves) with block_q * H <= MAX_MAD_ROWS, block_kv 128 or
    256; paged: block_q the atom, block_kv PAGED_SPLIT_KV; L1 stages 2-4."""
    if desc.paged:
        pairs = [(paged_atom_tokens(desc.next_n, desc.num_heads), PAGED_SPLIT_KV)]
    else:
        qs = [q for q in (2, 4, 8, 16, 32) if q * desc.num_heads <= MAX_MAD_ROWS]
        pairs = [(q, kv) for q in qs for kv in (128, 256)]
    out = []
    for q, kv in pairs:
        for stages in (2, 3, 4):
            cfg = MqaConfig(block_q=q, block_kv=kv, num_l1_stages=stages)
            if not config_violations(desc, cfg, arch):
                out.append(cfg)
    return out


# NOTES: the config is a compile-time choice per (heads, head_dim, dtypes, cores), so it is chosen on one
# representative workload, not per call (a kernel per call's ranges would recompile endlessly): causal prefill of
# 4096 rows over 4096 keys (ragged), and 16 batch rows at 8192 keys on pages of 64 (paged).
_REPRESENTATIVE_SEQ = 4096
_REPRESENTATIVE_BATCH, _REPRESENTATIVE_CTX = 16, 8192


def get_best_mqa_config(desc: MqaDesc, arch: ArchSpec) -> MqaConfig:
    """The legal config with the least modelled time on the representative workload (ties: ragged, the first, i.e.
    the smaller blocks and fewer stages; paged, the least AIC MTE2 time)."""
    cands = candidate_mqa_configs(desc, arch)
    if not cands:
        raise ValueError(f"no MQA-logits config fits arch {arch.name} for {desc}")
    if desc.paged:
        # ties (every unit bound by the Cube or FixPipe, whatever the stages): the least AIC MTE2 time, i.e. the
        # deeper gather, which short atoms and short units (bound by their gather) need
        ctx = [[_REPRESENTATIVE_CTX] * desc.next_n for _ in range(_REPRESENTATIVE_BATCH)]
        costs = [model_paged_mqa(desc, c, arch, context_lens=ctx, page_size=64) for c in cands]
        best = min(cost.time_s for cost in costs)
        tied = [i for i, cost in enumerate(costs) if cost.time_s <= best * (1 + 1e-9)]
        return cands[min(tied, key=lambda i: costs[i].mte2_s)]
    n = _REPRESENTATIVE_SEQ
    ks, ke = [0] * n, list(range(1, n + 1))
    return min(cands, key=lambda c: model_mqa(desc, c, arch, seq_len=n, seq_len_kv=n, ks=ks, ke=ke).time_s)
