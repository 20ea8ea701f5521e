"""MQA logits (ragged and paged): what a call is (``MqaDesc``), the kernel config (``MqaConfig``), its cost on the
Ascend 950 (``model_mqa``) and the config choice (``get_best_mqa_config``); plus the paged schedule's work units.

Pure arithmetic, no numpy arrays, no numba. The kernels modelled are templates/mqa_logits.asc.j2 and
paged_mqa_logits.asc.j2 (lib/mqa.asc.j2): per tile the AIC runs one [block_q * H, block_kv] MAD over head_dim,
FixPipe moves the fp32 tile to the two AIVs' UB (fp32 at ``fixpipe_bytes_per_cycle``: DeepSeek found their MQA
kernel FixPipe-bound), and each AIV scales, ReLUs, weights and sums half the keys over the heads and writes bf16.
Per tile the pipes overlap (every stage is double-buffered); a core's time is its tiles times the slowest pipe.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..arch import ArchSpec
from .model import AIVS_PER_CORE, LAUNCH_S, MAD_ISSUE_CYCLES, MEMORY_FIGURES, VECTOR_FP32_PER_CYCLE

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
# one AIV's UB (two fp32 [rows, block_kv / 2] stages plus the operator's buffers).
MAX_MAD_ROWS = 128
# Rows of the AIVs' key-scale tile (lib/mqa.asc.j2 SC_ROWS: the per-key fp32 scales repeated per row, so one Mul
# scales SC_ROWS rows of the tile; a Mul per row cost more in call overhead than in arithmetic on the CPU).
MQA_SCALE_ROWS = 32
# L0B stages of the MQA kernels' AIC (lib/mqa.asc.j2 NUM_L0_STAGES): the ragged kernel skips a tile's key copies
# when the stage it uses still holds that key block.
MQA_L0B_STAGES = 2
# Vector passes per element of the AIV operator (lib/mqa.asc.j2): the per-key scale (Mul, CUDA's fp32 scale form
# only), the ReLU, and per head one Axpy (a multiply and an add); the bf16 cast is per query row, not per head.
MQA_VECTOR_OPS = {"relu": 1, "axpy": 2, "token_scale": 1}
# Fixed per-instruction cost of a Vector instruction on short rows (cycles): issue and pipeline start. Our judgement
# (the 950's vector pipeline depth), charged once per row-instruction of the operator.
VECTOR_ISSUE_CYCLES = 8


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
    half = c.block_kv // 2
    ub = c.num_ub_stages * mad_m * half * 4 + MQA_SCALE_ROWS * half * 4 + c.block_q * desc.num_heads * 4 \
        + c.block_q * half * 6 + half * 2 + half * 4
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
    mte2_s: float  # GM -> L1: key blocks (paged: the page gather, per page transfers) and the q panels
    l2_s: float
    hbm_s: float
    launch_s: float
    bound: str
    num_tiles: int  # tiles (paged: work units) with work
    busiest_tiles: int  # tiles of the busiest core
    transfers_per_page: int  # paged: GM -> L1 copies per page (0: ragged)
    hbm_bytes: int
    l2_bytes: int
    flops: float  # useful FLOPs: 2 * H * D per (query row, key) in range


def _tile_pipes(desc: MqaDesc, c: MqaConfig, arch: ArchSpec, m_rows: int, kv_rows: int, token_scale: bool,
                copies: int, copy_bytes: int) -> dict[str, float]:
    """Busy time of each pipe for one tile of m_rows MAD rows x kv_rows keys (seconds)."""
    clock = arch.clock_hz
    cube_dtype = "fp8" if "fp8" in (desc.q_dtype, desc.kv_dtype) else "fp4"
    c0 = arch.c0_bytes * 8 // (8 if cube_dtype == "fp8" else 4)
    frac = arch.frac_mn
    cycles = -(-m_rows // frac) * -(-kv_rows // frac) * -(-desc.head_dim // c0)
    cube = max(cycles, MAD_ISSUE_CYCLES[cube_dtype]) / clock
    fixpipe = m_rows * kv_rows * 4 / arch.fixpipe_bytes_per_cycle / clock
    half = -(-kv_rows // AIVS_PER_CORE)
    ops = MQA_VECTOR_OPS["relu"] + MQA_VECTOR_OPS["axpy"] + (MQA_VECTOR_OPS["token_scale"] if token_scale else 0)
    rows_q = max(1, m_rows // desc.num_heads)
    row_instr = m_rows * (2 if token_scale else 1) + rows_q * 2
    vector = (m_rows * half * ops + rows_q * half) / VECTOR_FP32_PER_CYCLE / clock \
        + row_instr * VECTOR_ISSUE_CYCLES / clock
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
                   bound=bound, num_tiles=num_tiles, busiest_tiles=busiest, transfers_per_page=0,
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


def model_paged_mqa(desc: MqaDesc, c: MqaConfig, arch: ArchSpec, *, context_lens: list[list[int]],
                    page_size: int) -> MqaCost:
    """Modelled time of the paged kernel (templates/paged_mqa_logits.asc.j2): every batch row's atoms against its
    context, 256-key units split evenly over the cores; each unit gathers its pages GM -> L1 through the block
    table: one transfer per page in the Ascend layout (values and scales together; FP4: values and scales apart),
    values and scales apart in CUDA DeepGEMM's (FP8: the fp32 scales go GM -> UB on the AIVs)."""
    cores = desc.num_ai_cores
    atom = c.block_q
    units = paged_units(context_lens, atom)
    total = sum(units)
    d = desc.head_dim
    token = paged_token_bytes(desc.kv_dtype, d, desc.ascend_kv_layout)
    fused = desc.ascend_kv_layout and desc.kv_dtype == "fp8"
    transfers = 1 if fused else 2
    token_scale = (not desc.ascend_kv_layout) and desc.kv_dtype == "fp8"
    pages = c.block_kv // page_size
    m_rows = atom * desc.num_heads
    full = _tile_pipes(desc, c, arch, m_rows, c.block_kv, token_scale, pages * transfers, c.block_kv * token)
    # the q panel of an atom: a core's share is contiguous in (atom, unit) order, so it reloads once per atom
    q_row = storage_bytes(desc.q_dtype, d) + d // 32
    panel_s = MEMORY_FIGURES.copy_issue_s + MEMORY_FIGURES.gm_latency_s + \
        m_rows * q_row / MEMORY_FIGURES.mte2_bytes_per_s(arch)
    busiest = -(-total // cores) if total else 0
    atoms_with_work = sum(1 for u in units if u)
    panels = min(busiest, -(-atoms_with_work // cores) + 1) if total else 0
    tile_s = max(full.values())
    core_s = busiest * tile_s + panels * panel_s
    valid = sum(sum(min(v, 10**12) for v in row) for row in context_lens)
    touched = sum(max(0, -(-max(row[t0:t0 + atom]) // page_size)) * page_size for row in context_lens
                  for t0 in range(0, len(row), atom))
    l2_bytes = total * c.block_kv * token
    hbm_bytes = touched * token + len(units) * m_rows * (q_row + 4) + valid * 2
    l2_s, hbm_s = l2_bytes / arch.l2_bytes_per_s, hbm_bytes / arch.hbm_bytes_per_s
    times = {"core": core_s, "l2": l2_s, "hbm": hbm_s}
    pipes = {k: v * busiest for k, v in full.items()}
    bound = max(pipes, key=pipes.get) if max(times, key=times.get) == "core" else max(times, key=times.get)
    total_s = max(times.values()) + (MEMORY_FIGURES.gm_latency_s + tile_s if total else 0.0) + LAUNCH_S
    return MqaCost(time_s=total_s, cube_s=pipes["cube"], fixpipe_s=pipes["fixpipe"], vector_s=pipes["vector"],
                   mte2_s=pipes["mte2"] + panels * panel_s, l2_s=l2_s, hbm_s=hbm_s, launch_s=LAUNCH_S, bound=bound,
                   num_tiles=total, busiest_tiles=busiest, transfers_per_page=transfers, hbm_bytes=int(hbm_bytes),
                   l2_bytes=int(l2_bytes), flops=2.0 * desc.num_heads * d * valid)


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
    """The legal config with the least modelled time on the representative workload (ties: the first, i.e. the
    smaller blocks and fewer stages)."""
    cands = candidate_mqa_configs(desc, arch)
    if not cands:
        raise ValueError(f"no MQA-logits config fits arch {arch.name} for {desc}")
    if desc.paged:
        ctx = [[_REPRESENTATIVE_CTX] * desc.next_n for _ in range(_REPRESENTATIVE_BATCH)]
        return min(cands, key=lambda c: model_paged_mqa(desc, c, arch, context_lens=ctx, page_size=64).time_s)
    n = _REPRESENTATIVE_SEQ
    ks, ke = [0] * n, list(range(1, n + 1))
    return min(cands, key=lambda c: model_mqa(desc, c, arch, seq_len=n, seq_len_kv=n, ks=ks, ke=ke).time_s)
