"""What the grouped GEMMs share: group operands (kinds, stacked shapes, scale factors), the output checks and
the group layouts (psum and CUDA DeepGEMM's per-row form), used by the M-grouped, K-grouped, bmm and einsum calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..epilogue import is_fp8_output
from ..utils.formats import bf16_bits_to_fp32, decode_e2m1, decode_e4m3, unpack_fp4
from ..utils.layout import transform_sf_into_required_layout
from ..utils.math import align, ceil_div, per_token_cast_to_fp8
from .checks import (
    FP8,
    OPERAND_KINDS,
    OUT_KINDS,
    check_no_alias,
    check_no_self_overlap,
    contiguous_axis,
    require_array,
)

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
# Operand values for the float64 references


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
