"""K-grouped contiguous GEMMs (the weight-gradient GEMMs of mixture-of-experts), with DeepGEMM-Ascend's names,
argument order and defaults.

Each call checks everything into a KGroupedPlan before anything is written, then launches one kernel per non-empty
group over that group's K range or, for the ``aclnn_*`` references, runs float64 numpy per group.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from .. import runtime
from ..utils.layout import (
    transform_k_grouped_sf_into_required_layout,
    transform_sf_into_required_layout,
)
from ..utils.math import align, ceil_div
from .checks import (
    FP32,
    check_accumulator,
    check_compiled_dims,
    check_dims,
    check_no_alias,
    contiguous_axis,
    rebalance_scales,
    require_array,
)
from .grouped_operands import (
    _STORAGE,
    SF_LAYOUT_ALIGNMENT,
    _check_int32_vector,
    _check_out,
    _kind_of,
    _scales,
    _split_pair,
    _values,
    psum_groups,
)
from .guard import api_call, protect

# ------------------------------------------------------------------------------------------------------------------
# K-grouped contiguous


@dataclass
class KGroupedPlan:
    """A checked K-grouped call: group g reduces over K [k_start[g], k_start[g] + ks[g]) of A [K, M] and B [K, N]
    into D[g] [M, N] (fp32), starting from C[g] (or zeros)."""

    kind: str
    a_phys: np.ndarray  # storage dtype: [K_total, M] (MN-major) or [M, K_total] (K-major)
    b_phys: np.ndarray  # [K_total, N] or [N, K_total]
    major_a: str
    major_b: str
    sfa: list | None  # per group: C-contiguous int16 [ceil(K_g/64), M] (None for an empty group)
    sfb: list | None  # per group: [ceil(K_g/64), N]
    d: np.ndarray  # fp32 [G, M, N]
    c: np.ndarray | None
    m: int
    n: int
    k_start: np.ndarray
    ks: np.ndarray
    compiled_dims: str
    group_sf: dict | None = None  # {g: (sfa, sfb, alpha)} after ``_rebalance_k_groups`` (kernel path only)

    def group_phys(self, g: int, which: str) -> np.ndarray:
        """Physical storage of group g's slice of A or B (rows of MN-major storage, columns of K-major)."""
        k0, kg = int(self.k_start[g]), int(self.ks[g])
        phys, major = (self.a_phys, self.major_a) if which == "a" else (self.b_phys, self.major_b)
        return phys[k0:k0 + kg] if major == "mn" else phys[:, k0:k0 + kg]


def plan_k_grouped(a, b, d, ks_cpu, grouped_layout, c, *, kind, recipe=(1, 1, 32), compiled_dims="mn",
                   use_psum_layout=True) -> KGroupedPlan:
    """Every check of a K-grouped call; returns the plan, writes nothing."""
    if kind == "bf16":
        a_arr, sfa = require_array(a, "a"), None
        b_arr, sfb = require_array(b, "b"), None
    else:
        a_arr, sfa = _split_pair(a, "a")
        b_arr, sfb = _split_pair(b, "b")
    majors = {}
    for name, x in (("a", a_arr), ("b", b_arr)):
        _kind_of(x, name, (kind,))
        if x.ndim != 2:
            raise ValueError(f"{name} must be 2-D [K_total, {'M' if name == 'a' else 'N'}], got {x.shape=}")
        # NOTES: [K_total, MN] with unit stride along MN is the MN-major layout of upstream's tn form; the K-major
        # one (what the deprecated nt form passes on) is taken too: each group is then a column slice.
        majors[name] = "mn" if contiguous_axis(x, name) == 1 else "k"
    if a_arr.shape[0] != b_arr.shape[0]:
        raise ValueError(f"A and B disagree on K_total: a.shape={a_arr.shape} b.shape={b_arr.shape}")
    k_total, m = a_arr.shape
    n = b_arr.shape[1]
    check_dims(m=m, n=n, k_total=k_total)
    if not isinstance(grouped_layout, np.ndarray):
        raise TypeError(f"grouped_layout must be a numpy.ndarray of int32, got {type(grouped_layout).__name__}")
    if grouped_layout.ndim != 1 or grouped_layout.size == 0:
        raise ValueError(f"grouped_layout must be 1-D [G] with G >= 1, got shape {grouped_layout.shape}")
    num_groups = grouped_layout.shape[0]
    lay = _check_int32_vector(grouped_layout, "grouped_layout", num_groups, "one entry per group")
    d, _ = _check_out(d, (num_groups, m, n), kinds=("fp32",))
    if c is None and kind != "bf16":
        raise ValueError("K-grouped FP8 GEMM requires accumulation into C (as upstream): pass c (fp32 [G, M, N], "
                         "or c=d)")
    if c is not None:
        c, _ = check_accumulator(c, d)
    check_no_alias(d, a=a_arr, b=b_arr, sfa=sfa, sfb=sfb, grouped_layout=grouped_layout)
    dims = check_compiled_dims(compiled_dims)
    if not isinstance(use_psum_layout, (bool, np.bool_)):
        raise TypeError(f"use_psum_layout must be a bool, got {use_psum_layout!r}")

    alignment = runtime.get_mk_alignment_for_contiguous_layout()
    if use_psum_layout:
        starts, sizes = psum_groups(lay, k_total, alignment, limit_name="K_total (a.shape[0])")
    else:
        sizes = lay.astype(np.int64)
        bad = np.nonzero((sizes < 0) | (sizes % alignment != 0))[0]
        if bad.size:
            g = int(bad[0])
            raise ValueError(f"grouped_layout[{g}]={int(sizes[g])} (use_psum_layout=False: the K of group {g}) must "
                             f"be a non-negative multiple of {alignment}")
        if int(sizes.sum()) != k_total:
            raise ValueError(f"K group sizes sum to {int(sizes.sum())}, but A and B have K_total={k_total}: "
                             f"grouped_layout={sizes.tolist()}")
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    if ks_cpu is not None and not (isinstance(ks_cpu, (list, tuple)) and len(ks_cpu) == 0):
        if not isinstance(ks_cpu, (list, tuple)) or len(ks_cpu) != num_groups:
            raise ValueError(f"ks_cpu must be a list of {num_groups} ints (one K per group) or None, "
                             f"got {ks_cpu!r}")
        # NOTES: CUDA DeepGEMM's tests pass each group's K aligned up to the mk alignment (an upper bound, the
        # group's span up to the next group's start); the real K is taken too. Anything else is refused.
        for g, (given, real) in enumerate(zip(ks_cpu, sizes.tolist(), strict=True)):
            if isinstance(given, bool) or not isinstance(given, (int, np.integer)) or given not in (
                    real, align(real, alignment)):
                raise ValueError(f"ks_cpu[{g}]={given!r} disagrees with grouped_layout, which gives group {g} "
                                 f"K={real}; ks_cpu[{g}] must be {real} or align({real}, {alignment}) = "
                                 f"{align(real, alignment)} (the mk alignment)")

    sfa_phys = sfb_phys = None
    if kind != "bf16":
        psum_equiv = (starts + sizes).astype(np.int64)
        for name, sf, mn, is_sfa in (("sfa", sfa, m, True), ("sfb", sfb, n, False)):
            try:
                sf, sf_recipe = _expand_compact_k_grouped_sf(sf, mn, k_total, recipe, starts, sizes)
                if alignment == SF_LAYOUT_ALIGNMENT:
                    req = transform_k_grouped_sf_into_required_layout(sf, mn, k_total, sf_recipe, is_sfa, psum_equiv)
                else:
                    req = _k_grouped_sf_any_alignment(sf, mn, k_total, sf_recipe, is_sfa, starts, sizes)
            except (ValueError, TypeError) as e:
                raise type(e)(f"{name}: {e}") from None
            phys = _k_group_sf_blocks(np.ascontiguousarray(req.T), starts, sizes)
            if is_sfa:
                sfa_phys = phys
            else:
                sfb_phys = phys
    storage = _STORAGE[kind]
    a_phys = a_arr.view(storage) if majors["a"] == "mn" else a_arr.T.view(storage)
    b_phys = b_arr.view(storage) if majors["b"] == "mn" else b_arr.T.view(storage)
    return KGroupedPlan(kind, a_phys, b_phys, majors["a"], majors["b"], sfa_phys, sfb_phys, d, c, m, n, starts,
                        sizes, dims)


def _expand_compact_k_grouped_sf(sf, mn: int, k_total: int, recipe, starts: np.ndarray, sizes: np.ndarray):
    """(sf, recipe) for the K-grouped scale transform. CUDA DeepGEMM's compact per-group forms become the full form
    [mn, ceil(K_total / 32)] with recipe gran_k 32 (exact: each 32-block takes its group's scale; blocks of no group
    1.0); any other ``sf`` is returned as given. The compact forms: fp32 [sum_g ceil(K_g / gran_k), mn] (each group's
    K-block rows one after another) and int32 [sum_g ceil(ceil(K_g / gran_k) / 4), mn] (those rows packed 4 exponent
    bytes to an element per group, as get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor writes them).

    NOTES: a shape that is both a compact and the full form (sum of rows == mn == ceil(K_total / gran_k)) is read as
    the full form."""
    gran_k = recipe[-1] if isinstance(recipe, (tuple, list)) and recipe else None
    known_gran = isinstance(gran_k, (int, np.integer)) and not isinstance(gran_k, bool) and gran_k in (32, 128)
    if not known_gran or not isinstance(sf, np.ndarray) or sf.ndim != 2 or sf.shape[1] != mn \
            or sf.dtype not in (FP32, np.dtype(np.int32)):
        return sf, recipe
    if sf.dtype == FP32 and sf.shape == (mn, ceil_div(k_total, gran_k)):
        return sf, recipe
    block_rows = [ceil_div(int(kg), gran_k) for kg in sizes]
    if sf.dtype == FP32:
        if sf.shape[0] != sum(block_rows):
            return sf, recipe  # not a compact form: the transform reports the shape
        rows = np.ascontiguousarray(sf)
    else:
        packed = [ceil_div(r, 4) for r in block_rows]
        if sf.shape[0] != sum(packed):
            return sf, recipe
        codes, p0 = [], 0
        data = np.ascontiguousarray(sf).view(np.uint8).reshape(sf.shape[0], mn, 4)
        for r, pg in zip(block_rows, packed, strict=True):
            codes.append(data[p0:p0 + pg].transpose(0, 2, 1).reshape(pg * 4, mn)[:r])
            p0 += pg
        rows = (np.concatenate(codes).astype(np.uint32) << 23).view(np.float32) if codes else np.zeros((0, mn), FP32)
    full = np.ones((mn, ceil_div(k_total, 32)), FP32)
    r0 = 0
    for g, r in enumerate(block_rows):
        k0, kg = int(starts[g]), int(sizes[g])
        blocks = np.arange(ceil_div(kg, 32))
        full[:, k0 // 32 + blocks] = rows[r0 + blocks * 32 // gran_k].T
        r0 += r
    return full, (*tuple(recipe)[:-1], 32)


def _k_grouped_sf_any_alignment(sf, mn: int, k_total: int, recipe, is_sfa: bool, starts: np.ndarray,
                                sizes: np.ndarray) -> np.ndarray:
    """K-grouped scales -> the required layout [mn, ceil(K_total/64)] at an mk alignment other than 256: the
    columns of fp32 scales that cover no group's K (padding, past the last group) are never read, so they are not
    validated (set to 1.0 first); the groups' blocks are then cut out per group (``_k_group_sf_blocks``)."""
    gran_k = recipe[-1] if isinstance(recipe, (tuple, list)) and recipe else 32
    sf = require_array(sf, "sf")
    if (sf.dtype == FP32 and sf.ndim == 2 and isinstance(gran_k, (int, np.integer)) and gran_k > 0
            and sf.shape[1] == ceil_div(k_total, gran_k)):
        live = np.zeros(sf.shape[1], bool)
        for s0, kg in zip(starts.tolist(), sizes.tolist(), strict=True):
            if kg:
                live[s0 // gran_k:ceil_div(s0 + kg, gran_k)] = True
        if not live.all():
            sf = np.where(live[None, :], sf, np.float32(1.0))
    return transform_sf_into_required_layout(sf, mn, k_total, recipe, is_sfa=is_sfa)


def _k_group_sf_blocks(phys: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> list[np.ndarray | None]:
    """Each group's own scale pairs, C-contiguous int16 [ceil(K_g/64), MN], from the whole K range's physical
    int16 [ceil(K_total/64), MN]: the group's UE8M0 blocks from its first one (a group may start at an odd 32-block
    when the mk alignment is 32), re-paired from there, with the byte past an odd block count 0 (2^-127, as the
    layout transform pads). None for an empty group."""
    pairs, mn = phys.shape
    exps = phys.view(np.uint8).reshape(pairs, mn, 2).transpose(0, 2, 1).reshape(2 * pairs, mn)
    out: list[np.ndarray | None] = []
    for s0, kg in zip(starts.tolist(), sizes.tolist(), strict=True):
        if kg == 0:
            out.append(None)
            continue
        b0, nb = s0 // 32, ceil_div(kg, 32)
        blocks = np.zeros((2 * ceil_div(nb, 2), mn), np.uint8)
        blocks[:nb] = exps[b0:b0 + nb]
        out.append((blocks[0::2].astype(np.uint16) | (blocks[1::2].astype(np.uint16) << 8)).view(np.int16))
    return out


def run_k_grouped(plan: KGroupedPlan, reference: bool = False):
    """D[g] = C[g] + A[K range of g]^T @ B[K range of g] per group (kernel launches, or float64 numpy)."""
    from ..heuristics import get_best_config
    from ..heuristics.config import GemmDesc

    m, n = plan.m, plan.n
    if m == 0 or n == 0:
        return None
    config = None
    live = [g for g in range(len(plan.ks)) if plan.ks[g] > 0]
    if not reference:
        _rebalance_k_groups(plan, live)  # may raise ValueError: before anything is written
    if not reference and live:
        num_ai_cores, arch = runtime.get_num_ai_cores(), runtime.get_arch_spec()
        desc = GemmDesc(m=m, n=n, k=max(int(plan.ks.sum()), len(live)), a_dtype=plan.kind, b_dtype=plan.kind,
                        out_dtype="fp32", gemm_type="k_grouped_contiguous", num_groups=len(live),
                        major_a=plan.major_a, major_b=plan.major_b, with_accumulation=True, num_ai_cores=num_ai_cores)
        config = get_best_config(desc, arch)
    if runtime.get_dry_run() and not reference:
        for g in live[:1]:
            _k_group_launch(plan, g, config)
        return config
    # NOTES: one launch per group; the guard copies D back if the call is interrupted between or during them.
    protect(plan.d, work=2.0 * m * n * int(plan.ks.sum()))
    if plan.c is None:
        plan.d[...] = 0
    elif plan.c is not plan.d:
        np.copyto(plan.d, plan.c)
    for g in live:
        if reference:
            kg = int(plan.ks[g])
            a = _values(plan.group_phys(g, "a"), plan.kind, plan.major_a, m, kg)
            b = _values(plan.group_phys(g, "b"), plan.kind, plan.major_b, n, kg)
            if plan.sfa is not None:
                a = a * _scales(plan.sfa[g], m, kg)
                b = b * _scales(plan.sfb[g], n, kg)
            plan.d[g] = (a @ b.T + plan.d[g].astype(np.float64)).astype(np.float32)
        else:
            _k_group_launch(plan, g, config)
    return config


def _rebalance_k_groups(plan: KGroupedPlan, live: list[int]) -> None:
    """Per group (one launch each), ``rebalance_sf_exponents`` on that group's K blocks of sfa and sfb: exact fp32
    math in the stand-in for any representable scale pair, or its ValueError naming the group, K block and row.
    Fills ``plan.group_sf`` {g: (sfa, sfb, alpha)} for the launches."""
    if plan.sfa is None or plan.group_sf is not None:
        return
    out = {}
    for g in live:
        k0, kg = int(plan.k_start[g]), int(plan.ks[g])
        try:
            sfa, sfb, shift, l0_bf16 = rebalance_scales(plan.sfa[g], plan.sfb[g], kg, plan.kind, plan.kind, 126)
        except ValueError as e:
            raise ValueError(f"group {g} (K {k0}..{k0 + kg - 1}; its K blocks counted from its start): {e}") from None
        out[g] = (sfa, sfb, float(np.ldexp(1.0, shift)), l0_bf16)
    plan.group_sf = out


def _k_group_launch(plan: KGroupedPlan, g: int, config) -> None:
    # NOTES: one launch per non-empty group of the dense schedule over that group's K range, accumulating into
    # D[g] (K is a runtime dim, so every group shares one kernel; the config is the K-grouped problem's).
    kg = int(plan.ks[g])
    a_g, b_g = plan.group_phys(g, "a"), plan.group_phys(g, "b")
    d_g = plan.d[g]
    alpha, l0_bf16 = 1.0, True
    sfa = sfb = None
    if plan.sfa is not None:
        sfa, sfb, alpha, l0_bf16 = (plan.group_sf or {}).get(g, (plan.sfa[g], plan.sfb[g], 1.0, True))
    common = dict(with_accumulation=True, alpha=alpha, compiled_dims=plan.compiled_dims, config=config)
    if plan.kind == "bf16":
        from ..kernels.bf16_gemm import launch_bf16_gemm

        launch_bf16_gemm(a_g, plan.major_a, b_g, plan.major_b, d_g, plan.m, plan.n, kg, **common)
        return
    from ..kernels.fp8_gemm import launch_fp8_gemm

    launch_fp8_gemm(a_g, plan.major_a, "fp8", sfa, b_g, plan.major_b, "fp8", sfb, d_g, plan.m,
                    plan.n, kg, l0_bf16=l0_bf16, **common)


@api_call
def k_grouped_fp8_gemm_tn_contiguous(a, b, d, ks_cpu, grouped_layout, c=None, recipe=(1, 1, 32),
                                     compiled_dims="mn", use_psum_layout=True):
    """K-grouped GEMM (MoE weight gradients): D[g] = C[g] + dequant(A_g)^T @ dequant(B_g) for every group g.

    a = (A float8_e4m3fn [K_total, M], sfa [M, ceil(K_total/gran_k)] fp32 or int16 [M, ceil(K_total/64)] required
    layout), b = (B [K_total, N], sfb [N, ...]), MN-major (K-major taken too); d float32 [G, M, N]; c required
    (float32 [G, M, N], or c=d). ``grouped_layout`` int32 [G]: cumulative K ends (group g's K rows start at
    align(end[g-1], alignment), the mk alignment, 256 by default), or with ``use_psum_layout=False`` the K of each
    group (multiples of the alignment, summing to K_total). ``ks_cpu``: None or the per-group K list, each entry the
    group's K or (as CUDA DeepGEMM's tests pass it) that K aligned up to the alignment. Empty groups give D[g] = C[g].
    """
    plan = plan_k_grouped(a, b, d, ks_cpu, grouped_layout, c, kind="fp8", recipe=recipe, compiled_dims=compiled_dims,
                          use_psum_layout=use_psum_layout)
    return run_k_grouped(plan)


@api_call
def k_grouped_fp8_gemm_nt_contiguous(a, b, d, ks_cpu, grouped_layout, c=None, recipe=(1, 1, 32),
                                     compiled_dims="mn", use_psum_layout=True):
    """Deprecated (as upstream): A [M, K_total] and B [N, K_total] K-major; transposes them and forwards to
    ``k_grouped_fp8_gemm_tn_contiguous`` (scale factors as there)."""
    warnings.warn("k_grouped_fp8_gemm_nt_contiguous is deprecated; use k_grouped_fp8_gemm_tn_contiguous with A and B "
                  "given as [K_total, M] and [K_total, N]", DeprecationWarning, stacklevel=2)
    a_arr, sfa = _split_pair(a, "a")
    b_arr, sfb = _split_pair(b, "b")
    return k_grouped_fp8_gemm_tn_contiguous((a_arr.T, sfa), (b_arr.T, sfb), d, ks_cpu, grouped_layout, c, recipe,
                                            compiled_dims, use_psum_layout)


@api_call
def k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks_cpu, grouped_layout, c=None, compiled_dims="mn",
                                      use_psum_layout=True):
    """BF16 K-grouped GEMM: A bfloat16 [K_total, M], B bfloat16 [K_total, N] (MN-major), D float32 [G, M, N]
    (= C[g] + A_g^T @ B_g, or A_g^T @ B_g without c); layouts as ``k_grouped_fp8_gemm_tn_contiguous``."""
    plan = plan_k_grouped(a, b, d, ks_cpu, grouped_layout, c, kind="bf16", compiled_dims=compiled_dims,
                          use_psum_layout=use_psum_layout)
    return run_k_grouped(plan)
