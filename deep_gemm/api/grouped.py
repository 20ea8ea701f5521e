"""Grouped GEMM entry points for mixture-of-experts layers, with DeepGEMM-Ascend's names, argument order and defaults:
M-grouped contiguous (psum layout, and CUDA DeepGEMM's per-row layout), M-grouped masked, K-grouped contiguous.

Each call checks everything (layouts, group counts, shapes, dtypes, scale factors) into a plan before anything is
written, then runs the plan on the kernels (one launch of the M-grouped schedule; K-grouped: one launch per
non-empty group over that group's K range) or, for the ``aclnn_*`` references, in float64 numpy per group.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

import numpy as np

from .. import runtime
from ..epilogue import is_fp8_output
from ..heuristics.config import layout_problem
from ..kernels.common import GroupedLayout
from ..utils.formats import bf16_bits_to_fp32, decode_e2m1, decode_e4m3, fp32_to_bf16_bits, unpack_fp4
from ..utils.layout import (
    transform_k_grouped_sf_into_required_layout,
    transform_sf_into_required_layout,
)
from ..utils.math import align, ceil_div, per_token_cast_to_fp8
from .checks import (
    FP8,
    FP32,
    MAX_DIM,
    OPERAND_KINDS,
    OUT_KINDS,
    check_accumulator,
    check_arch_supports,
    check_compiled_dims,
    check_dims,
    check_no_alias,
    check_no_self_overlap,
    contiguous_axis,
    rebalance_scales,
    require_array,
    resolve_recipes,
)
from .guard import api_call, protect

INT32 = np.dtype(np.int32)
# The alignment utils.layout's grouped scale transforms are built for (DeepGEMM-Ascend's fixed 256).
SF_LAYOUT_ALIGNMENT = 256
_KIND_NAMES = {"fp8": "float8_e4m3fn", "fp4": "int8 (packed FP4)", "bf16": "bfloat16"}
_STORAGE = {"fp8": np.uint8, "fp4": np.uint8, "bf16": np.uint16}


# ------------------------------------------------------------------------------------------------------------------
# Operands


@dataclass(frozen=True)
class GroupOperand:
    """A stack of G operands, logically [G, MN, K], as the kernels take it: ``phys`` is C-contiguous physical
    storage [G * rows, cols] (K-major: rows = MN, cols = K or K/2; MN-major: rows = K, cols = MN or MN/2) in the
    kernels' storage dtype, group g starting ``group_stride`` elements after group g - 1."""

    name: str
    kind: str
    major: str
    num_groups: int
    mn: int
    k: int
    phys: np.ndarray

    @property
    def group_stride(self) -> int:
        return self.phys.size // max(self.num_groups, 1)

    def group_phys(self, g: int) -> np.ndarray:
        rows = self.phys.shape[0] // self.num_groups
        return self.phys[g * rows:(g + 1) * rows]


def _kind_of(x: np.ndarray, name: str, allowed: tuple[str, ...]) -> str:
    kind = OPERAND_KINDS.get(x.dtype)
    if kind is None or kind not in allowed:
        raise TypeError(f"{name} has dtype {x.dtype}; expected one of {[_KIND_NAMES[a] for a in allowed]}")
    return kind


def make_group_operand(x: object, name: str, allowed: tuple[str, ...], *,
                       require_k_major: bool = False) -> GroupOperand:
    """Inspect a 3-D operand [G, MN, K] (nt form; the major is read from the last two strides). Copies to a
    C-contiguous physical stack only when the input is not one already; never writes the input."""
    x = require_array(x, name)
    kind = _kind_of(x, name, allowed)
    if x.ndim != 3:
        raise ValueError(f"{name} must be 3-D [G, MN, K] (B is [G, N, K] for nt, [G, K, N] for nn), got {x.shape=}")
    num_groups, mn, k = x.shape
    axis = contiguous_axis(x[0], f"{name}[0]") if num_groups and x[0].size else 1
    major = "k" if axis == 1 else "mn"
    if require_k_major and major != "k":
        raise ValueError(f"{name} must be K-major (unit stride along K), got strides(bytes)={x.strides}")
    if kind == "fp4":
        if major == "k":
            k *= 2
        else:
            mn *= 2
    phys3 = x if major == "k" else np.swapaxes(x, 1, 2)
    phys3 = np.ascontiguousarray(phys3).view(_STORAGE[kind])
    phys = phys3.reshape(num_groups * phys3.shape[1], phys3.shape[2])
    return GroupOperand(name, kind, major, num_groups, mn, k, phys)


def _split_pair(x: object, name: str) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise TypeError(f"{name} must be a (tensor, scale_factors) pair, got {type(x).__name__}")
    return require_array(x[0], f"{name}[0]"), require_array(x[1], f"{name}[1]")


def _group_sf(sf: np.ndarray, op: GroupOperand, gran: tuple[int, int], is_sfa: bool, disable_ue8m0_cast: bool,
              sf_name: str) -> np.ndarray:
    """Per-group scale factors [G, MN, ...] -> C-contiguous int16 [G * ceil(K/64), MN] (each group's required
    layout, physical, one after another)."""
    gran_mn, gran_k = gran
    if op.num_groups == 0:
        # Early return: an empty batch has no scales to convert (the transform needs a group)
        sf = require_array(sf, sf_name)
        if sf.ndim != 3 or sf.shape[0] != 0:
            raise ValueError(f"{sf_name} must be 3-D [0, ...] for an empty batch, got {sf_name}.shape={sf.shape}")
        return np.zeros((0, op.mn), np.int16)
    recipe = (gran_mn, 1, gran_k) if is_sfa else (1, gran_mn, gran_k)
    try:
        out = transform_sf_into_required_layout(sf, op.mn, op.k, recipe, num_groups=op.num_groups, is_sfa=is_sfa,
                                                disable_ue8m0_cast=disable_ue8m0_cast)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{sf_name}: {e}") from None
    phys = np.ascontiguousarray(np.swapaxes(out, -1, -2))
    return phys.reshape(op.num_groups * phys.shape[1], op.mn)


def _check_out(d: object, shape: tuple[int, ...], name: str = "d", kinds: tuple[str, ...] = ("bf16", "fp32")):
    d = require_array(d, name)
    out_kind = OUT_KINDS.get(d.dtype)
    if out_kind is None or out_kind not in kinds:
        raise TypeError(f"{name} has dtype {d.dtype}; expected {' or '.join(kinds)}")
    if d.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {d.shape}")
    if d.size and shape[-1] > 1 and d.strides[-1] != d.itemsize:
        raise ValueError(f"{name} must have unit stride along N, got strides(bytes)={d.strides}")
    check_no_self_overlap(d, name)
    if not d.flags.writeable:
        raise ValueError(f"{name} is read-only ({d.flags.writeable=}); pass a writable array")
    return d, out_kind


def check_grouped_out(epilogue, d: object, shape: tuple[int, ...], **inputs):
    """(d, out_kind, sfd or None) of an M-grouped call's output: ``_check_out``'s bf16 / fp32 D, or FP8 output with
    epilogue=FP8Quantization(sfd) (``check_grouped_fp8_out``); Identity() is the default, Alpha is refused. sfd must
    not alias ``inputs``. Writes nothing."""
    from ..epilogue import Alpha

    if is_fp8_output(epilogue):
        d, sfd = check_grouped_fp8_out(epilogue, d, shape)
        check_no_alias(sfd, **inputs)
        return d, "fp8", sfd
    if isinstance(epilogue, Alpha):
        raise ValueError(f"epilogue={epilogue!r}: the grouped GEMMs take Identity() or FP8Quantization(sfd) only")
    d, out_kind = _check_out(d, shape)
    return d, out_kind, None


def check_grouped_fp8_out(epilogue, d: object, shape: tuple[int, ...], name: str = "d"):
    """FP8 output of an M-grouped call (epilogue=FP8Quantization(sfd)): D float8_e4m3fn of ``shape`` with unit-stride
    rows, N % 64 == 0, and sfd int16 as the kernel writes it. 2-D D [M, N]: sfd [M, N/64] with strides (1, M), as the
    dense GEMM. 3-D D [G, rows, N] (masked, batched): one [rows, N/64] block per group, MN-major, i.e. sfd
    [G, rows, N/64] with strides (rows * N/64, 1, rows) (np.empty((G, N // 64, rows), np.int16).transpose(0, 2, 1)),
    or DeepGEMM-Ascend's batched form [rows, G * N/64] with strides (1, rows): the same memory. Returns (d, sfd as the
    kernel's logical [R, P] int16 view: its transpose is C-contiguous [P, R]); writes nothing."""
    from ..epilogue import check_epilogue

    d = require_array(d, name)
    if d.dtype != FP8:
        raise TypeError(f"{name} must be float8_e4m3fn for FP8 output (the FP8Quantization epilogue), got "
                        f"{name}.dtype={d.dtype}")
    if d.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {d.shape}")
    n = shape[-1]
    if len(shape) == 2:
        _, sfd = check_epilogue(epilogue, None, d, None, shape[0], n)
        return d, sfd
    num_groups, rows = shape[0], shape[1]
    if n % 64:
        raise ValueError(f"FP8 output needs N % 64 == 0 (one int16 sfd element per 64 columns), got n={n}")
    sfd = require_array(epilogue.sfd, "sfd")
    if sfd.dtype != np.int16:
        raise TypeError(f"sfd must be int16 (two UE8M0 bytes per element), got sfd.dtype={sfd.dtype}")
    pairs = n // 64
    if sfd.shape == (num_groups, rows, pairs):
        phys = np.swapaxes(sfd, 1, 2)
        ok = phys.flags.c_contiguous or sfd.size == 0
        flat = phys.reshape(num_groups * pairs, rows) if ok else None
    elif sfd.shape == (rows, num_groups * pairs):
        flat = sfd.T if sfd.T.flags.c_contiguous or sfd.size == 0 else None
    else:
        raise ValueError(f"sfd must have shape (G, rows, N/64) = {(num_groups, rows, pairs)} or DeepGEMM-Ascend's "
                         f"(rows, G * N/64) = {(rows, num_groups * pairs)}, got sfd.shape={sfd.shape}")
    if flat is None or not np.shares_memory(flat, sfd) and sfd.size:
        raise ValueError(f"sfd must be MN-major per group (strides (rows * N/64, 1, rows) elements, e.g. "
                         f"np.empty((G, N // 64, rows), np.int16).transpose(0, 2, 1)), got strides(bytes)="
                         f"{sfd.strides}")
    if not sfd.flags.writeable:
        raise ValueError("sfd is read-only; pass a writable array")
    if np.shares_memory(sfd, d):
        raise ValueError("sfd shares memory with d; they must be separate arrays")
    return d, flat.T


def _zero_row_sf_pair() -> int:
    """The packed UE8M0 pair per_token_cast_to_fp8 gives an all-zero row (the scale of amax 1e-4)."""
    _, sf = per_token_cast_to_fp8(np.zeros((1, 64), np.float32), use_ue8m0=True, gran_k=32)
    exp = int(sf.view(np.uint32)[0, 0] >> 23)
    return exp | (exp << 8)


def _rows_view(d: np.ndarray, name: str = "d") -> np.ndarray:
    """[..., rows, N] output as a 2-D [rows_total, N] view sharing its memory (ValueError when that is impossible:
    the groups must follow each other at the row stride, as in a C-contiguous array)."""
    if d.ndim == 2:
        if d.size and d.shape[0] > 1 and d.strides[0] < d.shape[1] * d.itemsize:
            raise ValueError(f"{name} rows must not overlap: strides(bytes)={d.strides} shape={d.shape}")
        return d
    if not d.size:
        # NOTES: reshape cannot infer -1 when N == 0; an empty D has no memory to share anyway.
        return d.reshape(int(np.prod(d.shape[:-1])), d.shape[-1])
    flat = d.reshape(-1, d.shape[-1])
    if not np.shares_memory(flat, d):
        raise ValueError(
            f"{name} [G, rows, N] must have groups at a whole number of rows (e.g. C-contiguous); got "
            f"shape={d.shape} strides(bytes)={d.strides}"
        )
    return flat


def _check_int32_vector(x: object, name: str, length: int, length_name: str) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray of int32, got {type(x).__name__}")
    x = require_array(x, name)  # a masked array is refused: its mask would be ignored
    if x.dtype != INT32:
        raise TypeError(f"{name} must have dtype int32, got {x.dtype}")
    if x.ndim != 1 or x.shape[0] != length:
        raise ValueError(f"{name} must have shape ({length},) ({length_name}), got {x.shape}")
    return x


def _check_positive_int(x: object, name: str) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}: {x!r}")
    if x < 1:
        raise ValueError(f"{name} must be >= 1, got {name}={x}")
    return int(x)


# ------------------------------------------------------------------------------------------------------------------
# Layouts


def psum_groups(psum: np.ndarray, limit: int, alignment: int, name: str = "grouped_layout",
                limit_name: str = "M") -> tuple[np.ndarray, np.ndarray]:
    """(starts, sizes) int64 [G] of a psum layout: group g owns [align(psum[g-1], alignment), psum[g]); an empty
    group repeats the previous total. Raises ValueError naming the first offending index."""
    p = psum.astype(np.int64)
    starts = np.zeros(len(p), np.int64)
    prev = 0
    for g, end in enumerate(p.tolist()):
        if end < 0:
            raise ValueError(f"{name}[{g}]={end} is negative; {name}={p.tolist()}")
        if end < prev:
            raise ValueError(f"{name} must be non-decreasing: {name}[{g}]={end} < {name}[{g - 1}]={prev}")
        start = align(prev, alignment)
        if end != prev and end < start:
            raise ValueError(
                f"{name}[{g}]={end} ends inside the alignment padding of the previous group: group {g} starts at "
                f"align({prev}, {alignment}) = {start}"
            )
        if end > limit:
            raise ValueError(f"{name}[{g}]={end} exceeds {limit_name}={limit}")
        starts[g] = start
        prev = end
    sizes = np.maximum(p - starts, 0)
    starts = np.where(sizes > 0, starts, np.minimum(starts, limit))
    return starts, sizes


def per_row_groups(layout: np.ndarray, num_groups: int, name: str = "grouped_layout") -> tuple[np.ndarray, np.ndarray]:
    """(starts, sizes) int64 [G] of CUDA DeepGEMM's per-row layout (the group of each row, -1 for padding). Each
    group's rows must form one run (any order of groups, any start); ValueError names the first offending row."""
    lay = layout.astype(np.int64)
    bad = np.nonzero((lay < -1) | (lay >= num_groups))[0]
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{name}[{i}]={int(lay[i])} is not a group index in [0, {num_groups}) or -1 (padding)")
    starts = np.zeros(num_groups, np.int64)
    sizes = np.zeros(num_groups, np.int64)
    if lay.size:
        run_start = np.ones(lay.size, bool)
        run_start[1:] = lay[1:] != lay[:-1]
        run_start &= lay >= 0
        run_rows = np.nonzero(run_start)[0]
        run_groups = lay[run_rows]
        seen = np.zeros(num_groups, bool)
        for row, g in zip(run_rows.tolist(), run_groups.tolist(), strict=True):
            if seen[g]:
                raise ValueError(
                    f"{name}: the rows of group {g} are not contiguous (a second run starts at row {row}, the first "
                    f"at row {int(starts[g])}); each group must own one run of rows"
                )
            seen[g] = True
            starts[g] = row
        sizes = np.bincount(lay[lay >= 0], minlength=num_groups).astype(np.int64)
    return starts, sizes


def planned_group_rows(mean_rows: int) -> int:
    """Rows per group the heuristic plans an M-grouped contiguous call for: the groups' mean row count rounded up to
    a quarter octave (16, 20, 24, 28, 32, 40, ..., 512, 640, 768, 896, 1024, 1280, ...), at least 16 (the Cube's
    smallest M tile), so that nearby layouts share one config."""
    if mean_rows <= 16:
        return 16
    step = 1 << (int(mean_rows).bit_length() - 3)
    return ceil_div(int(mean_rows), step) * step


def _padding_mask(num_rows: int, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """bool [num_rows]: True for every row that belongs to no group (the padding)."""
    mask = np.ones(num_rows, bool)
    for s, n in zip(starts.tolist(), sizes.tolist(), strict=True):
        mask[s:s + n] = False
    return mask


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


def _values(phys: np.ndarray, kind: str, major: str, mn: int, k: int) -> np.ndarray:
    """float64 [mn, k] values (before scaling) of physical storage (K-major [mn, k'] or MN-major [k, mn'])."""
    if kind == "bf16":
        v = bf16_bits_to_fp32(phys.view(np.uint16)).astype(np.float64)
    elif kind == "fp8":
        v = decode_e4m3(phys.view(np.uint8)).astype(np.float64)
    else:
        v = decode_e2m1(unpack_fp4(phys.view(np.uint8), axis=1)).astype(np.float64)
    return v[:mn, :k] if major == "k" else v.T[:mn, :k]


def _scales(sf_phys: np.ndarray, mn: int, k: int) -> np.ndarray:
    """float64 [mn, k] per-element scales from a physical int16 [ceil(k/64), mn] required-layout block."""
    from ..utils.layout import unpack_sf_from_required_layout

    s = unpack_sf_from_required_layout(np.ascontiguousarray(sf_phys).T, mn, k).astype(np.float64)
    return np.repeat(s, 32, axis=1)[:, :k]


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


__all__ = [
    "m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nn_contiguous",
    "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nn_contiguous",
    "m_grouped_bf16_gemm_nt_contiguous", "m_grouped_bf16_gemm_nn_contiguous",
    "m_grouped_fp8_fp4_gemm_nt_masked", "m_grouped_fp8_gemm_nt_masked", "m_grouped_bf16_gemm_nt_masked",
    "fp8_m_grouped_gemm_nt_masked", "bf16_m_grouped_gemm_nt_masked",
    "k_grouped_fp8_gemm_tn_contiguous", "k_grouped_fp8_gemm_nt_contiguous", "k_grouped_bf16_gemm_tn_contiguous",
]
