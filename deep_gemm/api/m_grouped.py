"""M-grouped GEMMs for mixture-of-experts layers, with DeepGEMM-Ascend's names, argument order and defaults:
contiguous (psum layout, and CUDA DeepGEMM's per-row layout) and masked.

Each call checks everything (layouts, group counts, shapes, dtypes, scale factors) into an MGroupedPlan before
anything is written, then runs it in one launch of the M-grouped schedule or, for the ``aclnn_*`` references, in
float64 numpy per group. The batched and einsum calls build these plans too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from .. import runtime
from ..heuristics.config import layout_problem
from ..kernels.common import GroupedLayout
from ..utils.formats import bf16_bits_to_fp32, fp32_to_bf16_bits
from ..utils.layout import transform_sf_into_required_layout
from ..utils.math import ceil_div, per_token_cast_to_fp8
from .checks import (
    FP32,
    MAX_DIM,
    check_arch_supports,
    check_compiled_dims,
    check_dims,
    check_no_alias,
    contiguous_axis,
    rebalance_scales,
    require_array,
    resolve_recipes,
)
from .grouped_operands import (
    _STORAGE,
    SF_LAYOUT_ALIGNMENT,
    GroupOperand,
    _check_int32_vector,
    _check_positive_int,
    _group_sf,
    _kind_of,
    _padding_mask,
    _rows_view,
    _scales,
    _split_pair,
    _values,
    _zero_row_sf_pair,
    check_grouped_out,
    make_group_operand,
    per_row_groups,
    planned_group_rows,
    psum_groups,
)
from .guard import api_call, protect

# ------------------------------------------------------------------------------------------------------------------
# M-grouped plans (contiguous, masked; batched and einsum build them too)


@dataclass
class MGroupedPlan:
    """A checked M-grouped call: A rows [rows, K] (K-major), B stack, D rows [rows, N]; group g owns rows
    [group_start[g], group_start[g] + rows_g) of A and D, with rows_g = clamp(group_rows[g], 0, max_group_rows)."""

    gemm_type: str
    a_kind: str
    a_phys: np.ndarray  # [rows, K or K/2] storage dtype, any row stride
    sfa: np.ndarray | None  # C-contiguous int16 [ceil(K/64), rows]
    b: GroupOperand
    sfb: np.ndarray | None  # C-contiguous int16 [G * ceil(K/64), N]
    d_rows: np.ndarray  # [rows, N] view of D (or of a temporary copied back by ``finish``)
    out_kind: str
    n: int
    k: int
    group_start: np.ndarray  # int32 [G]
    group_rows: np.ndarray  # int32 [G] (masked_m itself for the masked kind)
    max_group_rows: int
    model_m: int  # total rows the heuristic plans for
    model_groups: int
    compiled_dims: str
    with_accumulation: bool = False
    c_rows: np.ndarray | None = None  # [rows, N] accumulated into D (copied in before the launch)
    zero_padding: bool = False  # ensure_zero_padding: rows of D no group owns are zeroed (by the kernel)
    finish: object = None  # callable run after the kernel (copy a temporary back into the caller's D)
    sfd: np.ndarray | None = None  # FP8 output: int16 [R, P] (check_grouped_fp8_out); per group when 3-D D
    sfd_per_group: bool = False  # masked / batched: group g's scales at pair columns [g * N/64, (g + 1) * N/64)
    alpha: float = 1.0  # the kernel's output scale: 2^out_shift after ``rebalance_m_grouped_sf``
    extra: dict = field(default_factory=dict)


def run_m_grouped(plan: MGroupedPlan, reference: bool = False) -> object:
    """Write D for a checked plan: the M-grouped kernel (returns its GemmConfig), or float64 numpy per group."""
    if not reference:
        check_arch_supports(a=plan.a_kind, b=plan.b.kind)
        rebalance_m_grouped_sf(plan)  # may raise ValueError: before anything is written
    if runtime.get_dry_run() and not reference:
        return _launch(plan)
    protect(plan.d_rows, plan.sfd, work=2.0 * plan.d_rows.shape[0] * plan.n * plan.k)
    if plan.c_rows is not None and plan.c_rows is not plan.d_rows:
        np.copyto(plan.d_rows, plan.c_rows)
    # NOTES: the kernel writes the padding zeros itself (its cores own the padding chunks); the host writes them
    # only where no kernel runs: the float64 reference, K == 0, and calls without a real row or column; and with FP8
    # output (codes 0 and the scales of a zero row, what quantizing zeros gives), which the kernel leaves to the host.
    if plan.zero_padding and (reference or not _launches(plan) or plan.out_kind == "fp8"):
        pad = _padding_mask(plan.d_rows.shape[0], plan.group_start, plan.group_rows)
        plan.d_rows[pad] = 0
        if plan.sfd is not None:
            plan.sfd.view(np.uint16)[pad] = _zero_row_sf_pair()
    # NOTES: K == 0 is upstream's early return (D = C, or zeros, in every group row); the numpy path writes exactly
    # that without a launch (for the masked kind it is the one case where the host reads masked_m to write).
    config = _reference_m_grouped(plan) if reference or plan.k == 0 else _launch(plan)
    if plan.finish is not None:
        plan.finish()
    return config


def _live_rows(plan: MGroupedPlan) -> np.ndarray:
    """int64 indices of the rows of A the kernel reads (every group's real rows; no padding, nothing past
    masked_m[g])."""
    rows = np.clip(plan.group_rows.astype(np.int64), 0, plan.max_group_rows)
    starts = plan.group_start.astype(np.int64)
    if not rows.any():
        return np.zeros(0, np.int64)
    return np.concatenate([np.arange(s, s + r) for s, r in zip(starts.tolist(), rows.tolist(), strict=True) if r])


def rebalance_m_grouped_sf(plan: MGroupedPlan) -> None:
    """Make every (A row, B row of its group) scale pair the kernel meets exact in the stand-in's fp32, as the dense
    path does: A's live rows against the B scales of every non-empty group side by side (a per-block shift c added
    to A's bytes and taken off all B bytes keeps every product bit-identical, whatever the pairing); a non-zero
    out_shift goes into ``plan.alpha``. Rows the kernel never reads (padding, past masked_m) are left as they are.
    Raises ``rebalance_sf_exponents``'s ValueError (naming the K block and row) when no exact split exists."""
    if plan.sfa is None or plan.k == 0 or plan.n == 0 or plan.extra.get("rebalanced"):
        return
    plan.extra["rebalanced"] = True
    # NOTES: alpha is 1.0 on the grouped paths, so alpha * 2^s stays finite in fp32 up to s = 126; FP8 output
    # quantizes the fp32 tile itself (there is no alpha), so nothing may move onto alpha.
    max_shift = 0 if plan.out_kind == "fp8" else 126
    num_groups, pairs, n = plan.b.num_groups, ceil_div(plan.k, 64), plan.n
    rows = _live_rows(plan)
    groups = np.flatnonzero(np.clip(plan.group_rows.astype(np.int64), 0, plan.max_group_rows) > 0)
    if rows.size == 0 or groups.size == 0:
        return
    sfa_live = np.ascontiguousarray(plan.sfa[:, rows])
    sfb3 = plan.sfb.reshape(num_groups, pairs, n)
    sfb_side = np.ascontiguousarray(sfb3[groups].transpose(1, 0, 2)).reshape(pairs, groups.size * n)
    try:
        new_a, new_b, shift, plan.extra["l0_bf16"] = rebalance_scales(sfa_live, sfb_side, plan.k, plan.a_kind,
                                                                      plan.b.kind, max_shift)
    except ValueError as e:
        # NOTES: the message indexes the side-by-side arrays; name the caller's A row and (group, B row) instead.
        msg = re.sub(r"sfa\[(\d+), ", lambda mt: f"sfa[row {int(rows[int(mt.group(1))])}, ", str(e))
        msg = re.sub(r"sfb\[(\d+), ",
                     lambda mt: f"sfb[group {int(groups[int(mt.group(1)) // n])}, row {int(mt.group(1)) % n}, ", msg)
        raise ValueError(f"{msg} (grouped: A's rows are checked against the B scales of every non-empty group)") \
            from None
    if new_a is sfa_live and new_b is sfb_side and not shift:
        return
    sfa = plan.sfa.copy()
    sfa[:, rows] = new_a
    sfb = sfb3.copy()
    sfb[groups] = new_b.reshape(pairs, groups.size, n).transpose(1, 0, 2)
    plan.sfa, plan.sfb = sfa, np.ascontiguousarray(sfb.reshape(num_groups * pairs, n))
    plan.alpha = float(np.ldexp(1.0, shift))


def _launches(plan: MGroupedPlan) -> bool:
    """Whether ``_launch`` runs the kernel for this plan (it has rows to plan for, N and K)."""
    return plan.model_m != 0 and plan.n != 0 and plan.k != 0


def _launch(plan: MGroupedPlan):
    if not _launches(plan):
        return None
    # NOTES: the kernel with FP8 output has no zero_padding argument (the host writes the padding, run_m_grouped).
    zero_padding = (plan.zero_padding if plan.gemm_type == "m_grouped_contiguous" and plan.out_kind != "fp8"
                    else None)
    layout = GroupedLayout(plan.group_start, plan.group_rows, plan.max_group_rows, plan.b.group_stride,
                           plan.sfb.size // plan.b.num_groups if plan.sfb is not None else 0, zero_padding)
    storage = {"bf16": np.uint16, "fp8": np.uint8}.get(plan.out_kind)
    d = plan.d_rows.view(storage) if storage else plan.d_rows
    common = dict(with_accumulation=plan.with_accumulation, alpha=plan.alpha, compiled_dims=plan.compiled_dims,
                  gemm_type=plan.gemm_type, num_groups=plan.model_groups, grouped=layout, sfd=plan.sfd)
    if plan.a_kind == "bf16":
        from ..kernels.bf16_gemm import launch_bf16_gemm

        return launch_bf16_gemm(plan.a_phys, "k", plan.b.phys, plan.b.major, d, plan.model_m, plan.n, plan.k,
                                **common)
    from ..kernels.fp8_gemm import launch_fp8_gemm

    return launch_fp8_gemm(plan.a_phys, "k", plan.a_kind, plan.sfa, plan.b.phys, plan.b.major, plan.b.kind,
                           plan.sfb, d, plan.model_m, plan.n, plan.k, l0_bf16=plan.extra.get("l0_bf16", True),
                           **common)


def store_rows(d_rows: np.ndarray, out_kind: str, r0: int, acc: np.ndarray, accumulate: bool) -> None:
    """Round float64 ``acc`` (+ D's rows when accumulating) once into D[r0 : r0 + len(acc)]."""
    rows = slice(r0, r0 + acc.shape[0])
    if accumulate:
        cur = bf16_bits_to_fp32(d_rows[rows].view(np.uint16)) if out_kind == "bf16" else d_rows[rows]
        acc = acc + cur.astype(np.float64)
    acc32 = acc.astype(np.float32)
    if out_kind == "bf16":
        d_rows.view(np.uint16)[rows] = fp32_to_bf16_bits(acc32)
    else:
        d_rows[rows] = acc32


def _reference_m_grouped(plan: MGroupedPlan) -> None:
    k, n = plan.k, plan.n
    pairs = ceil_div(k, 64)
    for g in range(plan.b.num_groups):
        rows = int(min(max(int(plan.group_rows[g]), 0), plan.max_group_rows))
        if rows == 0 or n == 0:
            continue
        r0 = int(plan.group_start[g])
        a_phys = plan.a_phys[r0:r0 + rows]
        a = _values(a_phys, plan.a_kind, "k", rows, k)
        b = _values(plan.b.group_phys(g), plan.b.kind, plan.b.major, n, k)
        if plan.sfa is not None:
            a = a * _scales(plan.sfa[:, r0:r0 + rows], rows, k)
            b = b * _scales(plan.sfb[g * pairs:(g + 1) * pairs], n, k)
        if plan.out_kind == "fp8":
            _store_fp8_rows(plan, g, r0, (a @ b.T).astype(np.float32))
        else:
            store_rows(plan.d_rows, plan.out_kind, r0, a @ b.T, plan.with_accumulation)


def _store_fp8_rows(plan: MGroupedPlan, g: int, r0: int, acc32: np.ndarray) -> None:
    """FP8 output of group g's rows from r0: per_token_cast_to_fp8 of the fp32 result into D and its scales."""
    codes, sf = per_token_cast_to_fp8(acc32, use_ue8m0=True, gran_k=32)
    exps = (sf.view(np.uint32) >> 23).astype(np.uint16)
    rows, pairs = acc32.shape[0], plan.n // 64
    plan.d_rows[r0:r0 + rows] = codes
    row0, p0 = (r0 - int(plan.group_start[g]), g * pairs) if plan.sfd_per_group else (r0, 0)
    plan.sfd.view(np.uint16)[row0:row0 + rows, p0:p0 + pairs] = exps[:, 0::2] | (exps[:, 1::2] << 8)


def _operands_a_b(a, b, kinds: tuple[str, ...], nn: bool, a_k_major: bool = True):
    """(A array, sfa | None, B GroupOperand (nt form), sfb | None) for fp8/fp4 pairs or bf16 arrays."""
    if "bf16" in kinds:
        a_arr, sfa = require_array(a, "a"), None
        b_arr, sfb = require_array(b, "b"), None
    else:
        a_arr, sfa = _split_pair(a, "a")
        b_arr, sfb = _split_pair(b, "b")
    if nn:
        if b_arr.ndim != 3:
            raise ValueError(f"b must be 3-D [G, K, N] for the nn form, got {b_arr.shape=}")
        b_arr = np.swapaxes(b_arr, 1, 2)
        if sfb is not None and sfb.ndim == 3:
            sfb = np.swapaxes(sfb, 1, 2)
    op_b = make_group_operand(b_arr, "b", kinds)
    return a_arr, sfa, op_b, sfb


def _a_rows(a_arr: np.ndarray, name: str, kinds: tuple[str, ...]) -> tuple[str, np.ndarray, int, int]:
    """(kind, physical K-major storage [rows, K'], rows, K) of a 2-D K-major A."""
    kind = _kind_of(a_arr, name, kinds)
    if a_arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D [M, K], got {a_arr.shape=}")
    if contiguous_axis(a_arr, name) != 1:
        raise ValueError(f"{name} must be K-major (unit stride along K), got strides(bytes)={a_arr.strides}")
    rows, k = a_arr.shape
    if kind == "fp4":
        k *= 2
    return kind, a_arr.view(_STORAGE[kind]), rows, k


def check_stacked_pair(op_a: GroupOperand, op_b: GroupOperand, a_arr, b_arr, count: str) -> tuple[int, int, int, int]:
    """(G, M, K, N) of A [G, M, K] and B [G, N, K] stacks that must agree on G (``count`` names it) and on K."""
    _check_pair_kinds(op_a.kind, op_b.kind, a_arr, b_arr)
    if op_b.num_groups != op_a.num_groups:
        raise ValueError(f"A and B disagree on {count}: a.shape={a_arr.shape} b.shape={b_arr.shape}")
    if op_b.k != op_a.k:
        raise ValueError(f"A and B disagree on K: a has K={op_a.k}, b has K={op_b.k}")
    return op_a.num_groups, op_a.mn, op_a.k, op_b.mn


def _check_pair_kinds(a_kind: str, b_kind: str, a_arr, b_arr) -> None:
    if (a_kind, b_kind) == ("fp4", "fp8"):
        raise TypeError(
            f"fp4 A with fp8 B is not supported (as upstream): a.dtype={a_arr.dtype} b.dtype={b_arr.dtype}; "
            "pass fp8 A with fp4 B instead"
        )


def plan_m_grouped_contiguous(a, b, d, grouped_layout, *, kinds, nn, recipe=None, recipe_a=None, recipe_b=None,
                              compiled_dims="nk", disable_ue8m0_cast=False, use_psum_layout=True,
                              ensure_zero_padding=True, expected_m_for_psum_layout=None,
                              epilogue=None) -> MGroupedPlan:
    """Every check of an M-grouped contiguous call; returns the plan, writes nothing."""
    # Operands
    a_arr, sfa, op_b, sfb = _operands_a_b(a, b, kinds, nn)
    a_kind, a_phys, m, k = _a_rows(a_arr, "a", kinds)
    # NOTES: fp4 A x fp8 B is refused as by the dense call (upstream has no such kernel); b is the (B, sfb) pair.
    _check_pair_kinds(a_kind, op_b.kind, a_arr, b[0] if isinstance(b, (tuple, list)) else b)
    num_groups, n = op_b.num_groups, op_b.mn
    if num_groups < 1:
        raise ValueError(f"b must hold at least one group, got b.shape={op_b.phys.shape} (G=0)")
    if op_b.k != k:
        raise ValueError(f"A and B disagree on K: a has K={k}, b has K={op_b.k} (a.shape={a_arr.shape})")
    check_dims(m=m, n=n, k=k)
    d, out_kind, sfd = check_grouped_out(epilogue, d, (m, n), a=a_arr, b=op_b.phys, sfa=sfa, sfb=sfb,
                                         grouped_layout=grouped_layout)
    d_rows = _rows_view(d)
    check_no_alias(d, a=a_arr, b=op_b.phys, sfa=sfa, sfb=sfb, grouped_layout=grouped_layout)
    dims = check_compiled_dims(compiled_dims)
    for flag_name, flag in (("use_psum_layout", use_psum_layout), ("ensure_zero_padding", ensure_zero_padding),
                            ("disable_ue8m0_cast", disable_ue8m0_cast)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{flag_name} must be a bool, got {flag!r}")

    # Layout
    alignment = runtime.get_mk_alignment_for_contiguous_layout()
    if use_psum_layout:
        lay = _check_int32_vector(grouped_layout, "grouped_layout", num_groups,
                                  "the psum layout: one running row total per group; pass use_psum_layout=False "
                                  "for CUDA DeepGEMM's per-row layout [M]")
        starts, sizes = psum_groups(lay, m, alignment)
    else:
        lay = _check_int32_vector(grouped_layout, "grouped_layout", m,
                                  "use_psum_layout=False: the group of each row of A, -1 for padding")
        starts, sizes = per_row_groups(lay, num_groups)
    if expected_m_for_psum_layout is not None:
        if not use_psum_layout:
            raise ValueError(f"expected_m_for_psum_layout={expected_m_for_psum_layout!r} is only legal with "
                             "use_psum_layout=True (as upstream)")
        expected = _check_positive_int(expected_m_for_psum_layout, "expected_m_for_psum_layout")
        # NOTES: a hint (as upstream, where it only feeds the heuristic): no group can hold more than M rows, and
        # the planned total is a uint32 kernel argument, so a larger hint is clamped rather than refused.
        expected = min(expected, max(m, 1), MAX_DIM // num_groups)
        model_m, model_groups = expected * num_groups, num_groups
    else:
        # NOTES: the host knows the real layout here (it checked it): the heuristic plans for the non-empty groups
        # (what the schedule walks) at their mean size, as estimate_gemm models this layout, with the mean rounded up
        # to a quarter octave so that a new routing every call (an MoE layer's normal case) finds its config and
        # kernel prepared instead of running the heuristic again (tens of ms) or compiling a new specialization.
        model_m, model_groups = 0, 1
        if sizes.sum():
            real_m, _, model_groups = layout_problem("m_grouped_contiguous", m, k, group_sizes=sizes.tolist())
            model_m = planned_group_rows(ceil_div(real_m, model_groups)) * model_groups

    # Scale factors
    sfa_phys = sfb_phys = None
    if a_kind != "bf16":
        gran_a, gran_b = resolve_recipes(recipe, recipe_a, recipe_b)
        ra = (gran_a[0], 1, gran_a[1])
        # NOTES: the layout transform knows DeepGEMM-Ascend's fixed alignment only; at any other alignment the
        # rows of no group are masked here (fp32, below) and never read by the kernel (other dtypes).
        psum_for_sf = lay if use_psum_layout and sizes.sum() and alignment == SF_LAYOUT_ALIGNMENT else None
        gran_mn = ra[0]
        if sfa.dtype == FP32 and sfa.ndim == 2 and gran_mn >= 1 and sfa.shape[0] == ceil_div(m, gran_mn):
            # NOTES: scales of rows of no group (padding, rows past the last group, -1 rows of the per-row layout)
            # are never read; upstream leaves them uninitialised, so, like rows past masked_m, they may be garbage
            # and are not validated (the transform checks every row it is given).
            pad = np.ones(sfa.shape[0] * gran_mn, bool)
            for s0, rows in zip(starts.tolist(), sizes.tolist(), strict=True):
                pad[s0:s0 + rows] = False
            pad = pad.reshape(-1, gran_mn).all(axis=1)
            if pad.any():
                sfa = np.where(pad[:, None], np.float32(1.0), sfa)
        try:
            sfa_req = transform_sf_into_required_layout(sfa, m, k, ra, is_sfa=True,
                                                        disable_ue8m0_cast=disable_ue8m0_cast,
                                                        psum_layout=psum_for_sf)
        except (ValueError, TypeError) as e:
            raise type(e)(f"sfa: {e}") from None
        sfa_phys = np.ascontiguousarray(sfa_req.T)
        sfb_phys = _group_sf(sfb, op_b, gran_b, False, disable_ue8m0_cast, "sfb")

    return MGroupedPlan(
        gemm_type="m_grouped_contiguous", a_kind=a_kind, a_phys=a_phys, sfa=sfa_phys, b=op_b, sfb=sfb_phys,
        d_rows=d_rows, out_kind=out_kind, n=n, k=k, group_start=starts.astype(np.int32),
        group_rows=sizes.astype(np.int32), max_group_rows=m, model_m=model_m if m and n else 0,
        model_groups=model_groups, compiled_dims=dims, zero_padding=bool(ensure_zero_padding), sfd=sfd,
    )


def plan_m_grouped_masked(a, b, d, masked_m, expected_m, *, kinds, recipe=None, recipe_a=None, recipe_b=None,
                          compiled_dims="nk", disable_ue8m0_cast=False, epilogue=None) -> MGroupedPlan:
    """Every check of an M-grouped masked call; returns the plan, writes nothing. ``masked_m`` is checked here
    (values in [0, max_m]) but the schedule reads it on the device; the heuristic uses ``expected_m`` only."""
    if "bf16" in kinds:
        a_arr, sfa = require_array(a, "a"), None
        b_arr, sfb = require_array(b, "b"), None
    else:
        a_arr, sfa = _split_pair(a, "a")
        b_arr, sfb = _split_pair(b, "b")
    op_a = make_group_operand(a_arr, "a", kinds, require_k_major=True)
    op_b = make_group_operand(b_arr, "b", kinds)
    num_groups, max_m, k, n = check_stacked_pair(op_a, op_b, a_arr, b_arr, "the number of groups")
    # NOTES: the masked schedule indexes A's and D's rows as g * max_m + row, so the total must fit a uint32 too.
    check_dims(max_m=max_m, n=n, k=k, **{"num_groups*max_m": num_groups * max_m})
    d, out_kind, sfd = check_grouped_out(epilogue, d, (num_groups, max_m, n), a=a_arr, b=b_arr, sfa=sfa, sfb=sfb,
                                         masked_m=masked_m)
    d_rows = _rows_view(d)
    check_no_alias(d, a=a_arr, b=b_arr, sfa=sfa, sfb=sfb, masked_m=masked_m)
    dims = check_compiled_dims(compiled_dims)
    if not isinstance(disable_ue8m0_cast, (bool, np.bool_)):
        raise TypeError(f"disable_ue8m0_cast must be a bool, got {disable_ue8m0_cast!r}")
    mm = _check_int32_vector(masked_m, "masked_m", num_groups, "one row count per group")
    bad = np.nonzero((mm < 0) | (mm > max_m))[0]
    if bad.size:
        g = int(bad[0])
        raise ValueError(f"masked_m[{g}]={int(mm[g])} is outside [0, max_m={max_m}]")
    # NOTES: a hint (as upstream, where it only feeds the heuristic): no group has more than max_m rows, so a
    # larger hint is clamped to max_m (num_groups * max_m fits the kernels' uint32, checked above).
    expected = min(_check_positive_int(expected_m, "expected_m"), max(max_m, 1))

    sfa_phys = sfb_phys = None
    if op_a.kind != "bf16":
        gran_a, gran_b = resolve_recipes(recipe, recipe_a, recipe_b)
        if isinstance(sfa, np.ndarray) and sfa.dtype == FP32 and sfa.ndim == 3 and sfa.shape[0] == num_groups:
            # NOTES: scales of rows at or past masked_m[g] are never read; they may be garbage, like those rows of A.
            gran_mn = gran_a[0]
            live = np.arange(sfa.shape[1])[None, :] * gran_mn < mm[:, None]
            if not live.all():
                sfa = np.where(live[:, :, None], sfa, np.float32(1.0))
        sfa_group = _group_sf(sfa, op_a, gran_a, True, disable_ue8m0_cast, "sfa")  # [G * pairs, max_m]
        pairs = ceil_div(k, 64)
        sfa_phys = np.ascontiguousarray(
            sfa_group.reshape(num_groups, pairs, max_m).transpose(1, 0, 2)).reshape(pairs, num_groups * max_m)
        sfb_phys = _group_sf(sfb, op_b, gran_b, False, disable_ue8m0_cast, "sfb")

    return MGroupedPlan(
        gemm_type="m_grouped_masked", a_kind=op_a.kind, a_phys=op_a.phys, sfa=sfa_phys, b=op_b, sfb=sfb_phys,
        d_rows=d_rows, out_kind=out_kind, n=n, k=k,
        group_start=(np.arange(num_groups, dtype=np.int64) * max_m).astype(np.int32),
        group_rows=np.ascontiguousarray(mm),
        max_group_rows=max_m, model_m=expected * num_groups if max_m and n else 0, model_groups=num_groups,
        compiled_dims=dims, sfd=sfd, sfd_per_group=True,
    )


# ------------------------------------------------------------------------------------------------------------------
# Public M-grouped functions


@api_call
def m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d, grouped_layout, recipe=None, recipe_a=None, recipe_b=None,
                                         compiled_dims="nk", disable_ue8m0_cast=False, use_psum_layout=True,
                                         ensure_zero_padding=True, expected_m_for_psum_layout=None, epilogue=None):
    """M-grouped GEMM, groups stacked along M: D[rows of g] = dequant(A[rows of g]) @ dequant(B[g])^T.

    a = (A float8_e4m3fn [M, K] or packed FP4 [M, K/2], K-major; sfa [M, ceil(K/gran_k)] fp32 or int16 required
    layout), b = (B [G, N, K] (either major), sfb [G, N, ...]), d bfloat16/float32 [M, N]. ``grouped_layout`` int32:
    the psum layout [G] (running row totals; group g owns rows [align(psum[g-1], alignment), psum[g]), alignment
    = get_mk_alignment_for_contiguous_layout(), 256 by default), or with
    ``use_psum_layout=False`` CUDA DeepGEMM's per-row layout [M] (group of each row, -1 for padding; each group
    one run of rows). Rows of no group: zeroed when ``ensure_zero_padding``, else untouched, with either layout
    (CUDA DeepGEMM's per-row kernel never writes them either: its tests zero them in D before comparing). The
    kernel walks only the groups' real rows; ``expected_m_for_psum_layout`` (psum only) replaces the real layout as
    the heuristic's per-group row hint (a hint: above M it is clamped to M). ``epilogue``: None / Identity(), or
    FP8Quantization(sfd) for FP8 output (d float8_e4m3fn, sfd int16 [M, N/64] with strides (1, M), N % 64 == 0; the
    codes and scales of per_token_cast_to_fp8 of the fp32 result). Returns the kernel's GemmConfig (None when there
    is nothing to compute).
    """
    plan = plan_m_grouped_contiguous(a, b, d, grouped_layout, kinds=("fp8", "fp4"), nn=False, recipe=recipe,
                                     recipe_a=recipe_a, recipe_b=recipe_b, compiled_dims=compiled_dims,
                                     disable_ue8m0_cast=disable_ue8m0_cast, use_psum_layout=use_psum_layout,
                                     ensure_zero_padding=ensure_zero_padding,
                                     expected_m_for_psum_layout=expected_m_for_psum_layout, epilogue=epilogue)
    return run_m_grouped(plan)


@api_call
def m_grouped_fp8_fp4_gemm_nn_contiguous(a, b, d, grouped_layout, recipe=None, recipe_a=None, recipe_b=None,
                                         compiled_dims="nk", disable_ue8m0_cast=False, use_psum_layout=True,
                                         ensure_zero_padding=True, expected_m_for_psum_layout=None, epilogue=None):
    """As ``m_grouped_fp8_fp4_gemm_nt_contiguous`` with B given as [G, K, N] (sfb as [G, ceil(K/gran_k), N])."""
    plan = plan_m_grouped_contiguous(a, b, d, grouped_layout, kinds=("fp8", "fp4"), nn=True, recipe=recipe,
                                     recipe_a=recipe_a, recipe_b=recipe_b, compiled_dims=compiled_dims,
                                     disable_ue8m0_cast=disable_ue8m0_cast, use_psum_layout=use_psum_layout,
                                     ensure_zero_padding=ensure_zero_padding,
                                     expected_m_for_psum_layout=expected_m_for_psum_layout, epilogue=epilogue)
    return run_m_grouped(plan)


@api_call
def m_grouped_bf16_gemm_nt_contiguous(a, b, d, grouped_layout, compiled_dims="nk", use_psum_layout=True,
                                      ensure_zero_padding=True, expected_m_for_psum_layout=None, epilogue=None):
    """BF16 M-grouped contiguous GEMM: A bfloat16 [M, K] (K-major), B bfloat16 [G, N, K]; layouts as the FP8 form."""
    plan = plan_m_grouped_contiguous(a, b, d, grouped_layout, kinds=("bf16",), nn=False, compiled_dims=compiled_dims,
                                     use_psum_layout=use_psum_layout, ensure_zero_padding=ensure_zero_padding,
                                     expected_m_for_psum_layout=expected_m_for_psum_layout, epilogue=epilogue)
    return run_m_grouped(plan)


@api_call
def m_grouped_bf16_gemm_nn_contiguous(a, b, d, grouped_layout, compiled_dims="nk", use_psum_layout=True,
                                      ensure_zero_padding=True, expected_m_for_psum_layout=None, epilogue=None):
    """As ``m_grouped_bf16_gemm_nt_contiguous`` with B given as [G, K, N]."""
    plan = plan_m_grouped_contiguous(a, b, d, grouped_layout, kinds=("bf16",), nn=True, compiled_dims=compiled_dims,
                                     use_psum_layout=use_psum_layout, ensure_zero_padding=ensure_zero_padding,
                                     expected_m_for_psum_layout=expected_m_for_psum_layout, epilogue=epilogue)
    return run_m_grouped(plan)


@api_call
def m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked_m, expected_m, recipe=None, recipe_a=None, recipe_b=None,
                                     compiled_dims="nk", disable_ue8m0_cast=False, epilogue=None):
    """M-grouped masked GEMM (decode): D[g, :masked_m[g]] = dequant(A[g, :masked_m[g]]) @ dequant(B[g])^T.

    a = (A [G, max_m, K] K-major, sfa [G, max_m, ceil(K/gran_k)]), b = (B [G, N, K], sfb [G, N, ...]), d bfloat16 or
    float32 [G, max_m, N]; masked_m int32 [G] in [0, max_m], read by the kernel (rows at or past masked_m[g] are
    never written, whatever A holds there); ``expected_m`` (an int > 0) is the heuristic's per-group row hint
    (a hint, as upstream: above max_m it is clamped to max_m, since no group has more rows). FP8 output:
    epilogue=FP8Quantization(sfd), d float8_e4m3fn, sfd int16 [G, max_m, N/64] with strides (max_m * N/64, 1, max_m)
    (check_grouped_fp8_out); rows past masked_m[g] keep their codes and scales.
    """
    plan = plan_m_grouped_masked(a, b, d, masked_m, expected_m, kinds=("fp8", "fp4"), recipe=recipe,
                                 recipe_a=recipe_a, recipe_b=recipe_b, compiled_dims=compiled_dims,
                                 disable_ue8m0_cast=disable_ue8m0_cast, epilogue=epilogue)
    return run_m_grouped(plan)


@api_call
def m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m, compiled_dims="nk", epilogue=None):
    """BF16 M-grouped masked GEMM: A bfloat16 [G, max_m, K], B bfloat16 [G, N, K], D [G, max_m, N]; epilogue as
    the FP8 form."""
    plan = plan_m_grouped_masked(a, b, d, masked_m, expected_m, kinds=("bf16",), compiled_dims=compiled_dims,
                                 epilogue=epilogue)
    return run_m_grouped(plan)


# DeepGEMM's aliases (and CUDA DeepGEMM's legacy names of the masked kind)
m_grouped_fp8_gemm_nt_contiguous = m_grouped_fp8_fp4_gemm_nt_contiguous
m_grouped_fp8_gemm_nn_contiguous = m_grouped_fp8_fp4_gemm_nn_contiguous
m_grouped_fp8_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked
fp8_m_grouped_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked
bf16_m_grouped_gemm_nt_masked = m_grouped_bf16_gemm_nt_masked
