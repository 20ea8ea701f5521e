"""Config search: enumerate the legal (block, MAD, stage) configs of a GEMM and keep the fastest under the model.

Pure and deterministic (cached per (desc, arch)); the same ``model_gemm`` also answers ``estimate_gemm``.
"""

from __future__ import annotations

import functools
import itertools
import threading

from .. import envs
from ..arch import ArchSpec
from .config import (
    DTYPE_BITS,
    M_GROUPED_BLOCK_M,
    MAX_BLOCK_MN,
    GemmConfig,
    GemmDesc,
    check_desc,
    config_violations,
    cube_dtype,
    cube_operand_bits,
    k_alignment,
    mn_alignment,
    stream_l1_bytes,
)
from .model import LAUNCH_S, GemmCost, _gemm_cost, _model_terms, regions, round_up

# NOTES: small-M (decode-like) problems take the "stream" path: row-major tiles, A resident in L1 when it is
# reused, each B tile read once per M-block.
STREAM_MAX_M = 64
MAX_L1_STAGES = 8
MAX_L1_STAGES_SF = 4  # the scale-factor ring shares L1; DeepGEMM-Ascend stops at 4 stages with scales
MAX_SF_K_BLOCKS = 4


def _block_candidates(extent: int, align: int, cap: int) -> list[int]:
    """Block sizes tried for one dimension: the ladder {1, 1.5} x 2^i x ``align`` up to the cap, stopping at the
    first rung that covers the whole (aligned) extent.

    NOTES: a ladder rather than every multiple of 16: the published DeepGEMM-Ascend timings are consistent with
    such tiles and not with finely balanced ones (4096x2112x7168 FP8 runs at 91 % of peak, although 256x176
    tiles would fill 6 waves exactly); it also keeps the search small. Rungs above the covering one are
    dominated (the model charges a tail tile its aligned extent, and a bigger block only costs L1 stages), and
    a fixed ladder keeps the modelled time monotonic in the problem size.
    """
    whole = round_up(extent, align)
    out: list[int] = []
    size = align
    while size <= cap:
        for rung in (size, size * 3 // 2):
            if rung <= cap and rung % align == 0 and (not out or rung > out[-1]):
                out.append(rung)
        if out[-1] >= whole:
            break
        size *= 2
    while len(out) > 1 and out[-2] >= whole:
        out.pop()
    return sorted(out, reverse=True)


def _mad_k(a_bits: int, b_bits: int, ka: int, arch: ArchSpec, mad_m: int, mad_n: int, block_k: int) -> int:
    """Largest MAD K that double-buffers in L0A and L0B, is K-aligned and divides BLOCK_K (0 if none)."""
    limit = min(arch.l0a_bytes * 8 // (2 * mad_m * a_bits), arch.l0b_bytes * 8 // (2 * mad_n * b_bits), block_k)
    mad_k = limit // ka * ka
    while mad_k >= ka and block_k % mad_k:
        mad_k -= ka
    return mad_k if mad_k >= ka else 0


def _configs_for_blocks(desc: GemmDesc, arch: ArchSpec, block_m: int, block_n: int) -> list[GemmConfig]:
    """Legal configs with these block sizes: each BLOCK_K option x each MAD split, L1 stages filled to capacity."""
    r = regions(desc)
    # NOTES: configs depend on the problem only through these fields; sharing them across M (and N) keeps the
    # search fast for sweeps.
    return list(_configs_cached(desc.a_dtype, desc.b_dtype, desc.out_dtype, desc.major_a, desc.major_b, r.depth,
                                desc.num_ai_cores, _path(desc), desc.gemm_type, block_m, block_n, arch))


@functools.lru_cache(maxsize=1 << 16)
def _configs_cached(a_dtype: str, b_dtype: str, out_dtype: str, major_a: str, major_b: str, depth: int,
                    num_ai_cores: int, path: str, gemm_type: str, block_m: int, block_n: int,
                    arch: ArchSpec) -> tuple[GemmConfig, ...]:
    desc = GemmDesc(1, 1, depth, a_dtype, b_dtype, out_dtype, gemm_type, 1, major_a, major_b,
                    num_ai_cores=num_ai_cores)
    ka = k_alignment(desc)
    kpad = round_up(depth, ka)
    a_bits, b_bits = cube_operand_bits(desc)
    # NOTES: BLOCK_K starts at 256 B of the narrowest operand (whole 128 B L2 sectors per row) and may double
    # twice; never beyond the (aligned) K of the problem.
    base_k = 256 * 8 // min(a_bits, b_bits)
    block_ks = sorted({min(base_k << i, kpad) for i in range(3)})
    am = mn_alignment(a_dtype, major_a, arch.frac_mn)
    an = mn_alignment(b_dtype, major_b, arch.frac_mn)
    max_stages = MAX_L1_STAGES_SF if desc.has_sf else MAX_L1_STAGES
    out: list[GemmConfig] = []
    for block_k in block_ks:
        if block_k % ka:
            continue
        k_blocks = -(-depth // block_k)
        sf_k_blocks = min(MAX_SF_K_BLOCKS, k_blocks) if desc.has_sf else 1
        # L1: operand stages plus the scale-factor ring (the same arithmetic as buffer_bytes).
        stage_bytes = (block_m * block_k * a_bits + block_n * block_k * b_bits) // 8
        sf_bytes = 2 * (block_m + block_n) * sf_k_blocks * block_k // 32 if desc.has_sf else 0
        stages = min(max_stages, (arch.l1_bytes - sf_bytes) // stage_bytes)
        if stages < 2:
            continue
        stage_options = [stages]
        if path == "stream":
            # NOTES: the stream path keeps A resident only if the A panel fits beside the B stages: also offer
            # the deepest B ring that leaves room for it (the model weighs residency against ring depth).
            probe = GemmConfig(block_m, block_n, block_k, 16, 16, ka, num_l1_stages=0, sf_k_blocks=sf_k_blocks)
            b_stage = block_n * block_k * b_bits // 8
            resident = (arch.l1_bytes - stream_l1_bytes(desc, probe, depth)) // b_stage
            if 2 <= resident < stages:
                stage_options.append(resident)
        for (split_m, split_n), num_stages in itertools.product(((1, 1), (1, 2), (2, 1), (2, 2)), stage_options):
            mad_m, mad_n = block_m // split_m, block_n // split_n
            if block_m % split_m or block_n % split_n or mad_m % am or mad_n % an:
                continue
            if 2 * mad_m * mad_n * 4 > arch.l0c_bytes:
                continue
            mad_k = _mad_k(a_bits, b_bits, ka, arch, mad_m, mad_n, block_k)
            if not mad_k:
                continue
            config = GemmConfig(block_m, block_n, block_k, mad_m, mad_n, mad_k, num_l1_stages=num_stages,
                                sf_k_blocks=sf_k_blocks, num_ai_cores=num_ai_cores, path=path)
            if not config_violations(desc, config, arch):
                out.append(config)
    return tuple(out)


@functools.lru_cache(maxsize=1 << 12)
def _bound_terms(desc: GemmDesc, arch: ArchSpec) -> tuple:
    """The terms of ``_lower_bound_s`` that do not depend on the blocks (it runs for every block pair)."""
    r = regions(desc)
    c0 = arch.c0_bytes * 8 // DTYPE_BITS[cube_dtype(desc.a_dtype, desc.b_dtype)]
    a_bytes, b_bytes = DTYPE_BITS[desc.a_dtype] / 8, DTYPE_BITS[desc.b_dtype] / 8
    hbm = r.count * (r.rows * r.depth * a_bytes + r.cols * r.depth * b_bytes)
    return r, c0, a_bytes, b_bytes, hbm / arch.hbm_bytes_per_s


def _lower_bound_s(desc: GemmDesc, arch: ArchSpec, block_m: int, block_n: int) -> float:
    """A lower bound of the modelled time of every config with these blocks: the busiest core's Cube work (the
    model gives it the heaviest ceil(tiles / P) tiles), the L2 reads and the HBM bytes, plus the launch."""
    r, c0, a_bytes, b_bytes, hbm_s = _bound_terms(desc, arch)
    fm = arch.frac_mn
    mb, nb = -(-r.rows // block_m), -(-r.cols // block_n)
    tail_m = block_m if r.full_m_tiles else round_up(r.rows - (mb - 1) * block_m, fm)
    tail_n = round_up(r.cols - (nb - 1) * block_n, fm)
    waves = -(-(r.count * mb * nb) // desc.num_ai_cores)
    work = 0
    for tm, tn, count in sorted(((block_m, block_n, (mb - 1) * (nb - 1)), (block_m, tail_n, mb - 1),
                                 (tail_m, block_n, nb - 1), (tail_m, tail_n, 1)), key=lambda t: -t[0] * t[1]):
        take = min(count * r.count, waves)
        work += take * (tm // fm) * (tn // fm)
        waves -= take
    cube_s = work * -(-r.depth // c0) / arch.clock_hz
    cols = round_up(r.cols, fm)
    rows = mb * block_m if r.full_m_tiles else round_up(r.rows, fm)
    l2 = r.count * r.depth * (mb * cols * b_bytes + (0 if mb == 1 else nb * rows * a_bytes))
    return max(cube_s, l2 / arch.l2_bytes_per_s, hbm_s) + LAUNCH_S


def candidate_configs(desc: GemmDesc, arch: ArchSpec) -> list[GemmConfig]:
    """Every config the search considers for ``desc`` on ``arch`` (all legal), in a deterministic order."""
    check_desc(desc)
    _check_arch(desc, arch)
    out: list[GemmConfig] = []
    for block_m, block_n in _block_pairs(desc, arch):
        out.extend(_configs_for_blocks(desc, arch, block_m, block_n))
    return out


def _check_arch(desc: GemmDesc, arch: ArchSpec) -> None:
    for dtype in (desc.a_dtype, desc.b_dtype):
        arch.flops_per_cycle(dtype)  # raises ValueError for FP8/FP4 on an arch without them
    if not 1 <= desc.num_ai_cores <= arch.num_ai_cores:
        raise ValueError(f"num_ai_cores={desc.num_ai_cores} must be in [1, {arch.num_ai_cores}] for arch {arch.name}")


def _path(desc: GemmDesc) -> str:
    return "stream" if desc.expected_m <= STREAM_MAX_M else "cube"


def _block_pairs(desc: GemmDesc, arch: ArchSpec) -> list[tuple[int, int]]:
    r = regions(desc)
    cap = min(MAX_BLOCK_MN[desc.a_dtype], MAX_BLOCK_MN[desc.b_dtype])
    am = mn_alignment(desc.a_dtype, desc.major_a, arch.frac_mn)
    an = mn_alignment(desc.b_dtype, desc.major_b, arch.frac_mn)
    if desc.gemm_type == "m_grouped_contiguous":
        ms = [M_GROUPED_BLOCK_M]
    else:
        ms = _block_candidates(r.rows, am, cap)
    ns = _block_candidates(r.cols, an, cap)
    return [(bm, bn) for bm in ms for bn in ns if bm * bn * 4 <= arch.l0c_bytes]


@functools.lru_cache(maxsize=65536)
def _best(desc: GemmDesc, arch: ArchSpec) -> tuple[GemmConfig, GemmCost]:
    check_desc(desc)
    _check_arch(desc, arch)
    # Branch and bound: visit block pairs by their lower bound; stop once no pair can beat the best.
    ranked = sorted((_lower_bound_s(desc, arch, bm, bn), -bm * bn, (bm, bn)) for bm, bn in _block_pairs(desc, arch))
    best: tuple[tuple, GemmConfig, GemmCost] | None = None
    for bound, _, (block_m, block_n) in ranked:
        if best is not None and bound > best[0][0]:
            break
        for config in _configs_for_blocks(desc, arch, block_m, block_n):
            terms = _model_terms(desc, config, arch)  # model_gemm's time; its GemmCost only for the chosen config
            # NOTES: the exact minimum (any tolerance would break "a bigger problem is never faster"); exact ties
            # go to the larger tile and MAD, then the deeper L1 ring.
            rank = (terms.time_s, -config.block_m * config.block_n, -config.mad_m * config.mad_n,
                    -config.num_l1_stages, -config.mad_k, config.block_k, config.block_m, config.mad_m)
            if best is None or rank < best[0]:
                best = (rank, config, terms)
    if best is None:
        raise ValueError(f"no legal config for {desc} on {arch.name}")
    return best[1], _gemm_cost(desc, best[2])


def get_best_config(desc: GemmDesc, arch: ArchSpec) -> GemmConfig:
    """The fastest legal config for ``desc`` on ``arch`` under the cost model (pure, deterministic, cached).

    ``desc.num_ai_cores`` is the schedule's core count; ``path`` is "stream" when ``desc.expected_m <= 64``.
    Raises ValueError for an unsupported problem (dtype pair, gemm_type, FP8 on an arch without it, ...).
    """
    return _best(desc, arch)[0]


def get_best_config_and_cost(desc: GemmDesc, arch: ArchSpec) -> tuple[GemmConfig, GemmCost]:
    """``get_best_config`` and the modelled cost of the chosen config."""
    return _best(desc, arch)


_printed: set[tuple[GemmDesc, GemmConfig]] = set()
_printed_lock = threading.Lock()


def print_config_once(desc: GemmDesc, config: GemmConfig) -> None:
    """With ``DG_PRINT_CONFIGS=1``, print each distinct (desc, config) pair the first time a kernel uses it."""
    if not envs.DG_PRINT_CONFIGS.get():
        return
    with _printed_lock:
        if (desc, config) in _printed:
            return
        _printed.add((desc, config))
    print(
        f"deep_gemm config: {desc.gemm_type} m={desc.m} n={desc.n} k={desc.k} groups={desc.num_groups} "
        f"{desc.a_dtype}x{desc.b_dtype}->{desc.out_dtype} majors={desc.major_a}{desc.major_b} "
        f"cores={desc.num_ai_cores}: block {config.block_m}x{config.block_n}x{config.block_k} "
        f"mad {config.mad_m}x{config.mad_n}x{config.mad_k} stages L1={config.num_l1_stages} "
        f"L0={config.num_l0_stages} L0C={config.num_l0c_stages} sf_k_blocks={config.sf_k_blocks} "
        f"path={config.path}",
        flush=True,
    )
