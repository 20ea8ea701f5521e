"""Argument checks shared by every GEMM entry point: operand kinds, majors read from strides, recipes, outputs.

Everything here only inspects; nothing writes. Each failure raises ValueError/TypeError naming the argument and
the values that were wrong.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import ml_dtypes
import numpy as np

FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)
FP32 = np.dtype(np.float32)
PACKED_FP4 = np.dtype(np.int8)
INT16 = np.dtype(np.int16)

OPERAND_KINDS = {FP8: "fp8", PACKED_FP4: "fp4", BF16: "bf16"}
OUT_KINDS = {BF16: "bf16", FP32: "fp32"}


# NOTES: the templates declare the runtime dims ``uint32_t shape_m/shape_n/shape_k`` and the compiled-in ones
# ``constexpr uint32_t SHAPE_*``, so no dim may exceed this, whichever dims ``compiled_dims`` bakes in.
MAX_DIM = 2**32 - 1


def dtype_by_name(value: object, arg: str, allowed: dict[str, np.dtype], what: str) -> np.dtype:
    """The dtype of ``allowed`` (by name) that ``value`` names: a numpy / ml_dtypes dtype, its type or its name, or a
    torch dtype object (torch.float32 -> "float32"), told apart without importing torch. TypeError naming ``arg``
    and ``value`` otherwise, ``what`` saying what is allowed."""
    name = value if isinstance(value, str) else None
    if type(value).__module__.split(".")[0] == "torch":
        name = str(value).removeprefix("torch.")
    elif name is None:
        try:
            name = np.dtype(value).name
        except TypeError:
            name = None
    if name not in allowed:
        raise TypeError(f"{arg}={value!r} must be {what}")
    return allowed[name]


def require_array(x: object, name: str) -> np.ndarray:
    """``x`` as a plain numpy.ndarray (a subclass such as np.matrix or np.memmap is viewed as its base array: same
    memory, plain semantics); TypeError for masked arrays (their mask would be ignored) and for non-arrays."""
    # NOTES: a masked array exists only once numpy.ma is imported; asking sys.modules keeps `np.ma` (~7 ms of
    # import) off the path of a process that never used it.
    ma = sys.modules.get("numpy.ma")
    if ma is not None and isinstance(x, ma.MaskedArray):
        raise TypeError(
            f"{name} is a numpy masked array ({type(x).__name__}); the kernels would ignore its mask: "
            f"pass a plain numpy.ndarray, e.g. {name}.filled(0)"
        )
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(x).__name__}; convert it with numpy.asarray")
    if type(x) is not np.ndarray:
        # NOTES: np.matrix keeps 2-D-ness and redefines * and .T per its own rules; a base-class view shares the
        # memory (writes to d still land in the caller's array) and behaves like every other operand.
        return x.view(np.ndarray)
    return x


@dataclass(frozen=True)
class Operand:
    """One GEMM operand, logically [MN, K], as the kernels receive it.

    ``gm`` is the physical storage with unit stride on its last axis: [MN, >= K] when K-major, [K, >= MN] when
    MN-major (packed FP4 halves the contiguous extent). ``kind`` is "fp8", "fp4" or "bf16".
    """

    name: str
    array: np.ndarray
    kind: str
    major: str  # "k" or "mn"
    mn: int
    k: int

    @property
    def gm(self) -> np.ndarray:
        phys = self.array if self.major == "k" else self.array.T
        return phys.view(np.uint16 if self.kind == "bf16" else np.uint8)


def contiguous_axis(x: np.ndarray, name: str) -> int:
    """Which of a 2-D array's axes is unit-stride (1: rows are contiguous, 0: columns are); else ValueError."""
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got {x.ndim=} {x.shape=}")
    rows, cols = x.shape
    item = x.itemsize
    s_rows, s_cols = x.strides
    if x.size == 0:
        return 1  # NOTES: numpy gives empty arrays arbitrary strides; an empty operand has no layout to check.
    if any(s < 0 for s in x.strides):
        raise ValueError(f"{name} has negative strides {x.strides}; pass a copy")
    # NOTES: the stride of a length-1 axis carries no information, so such an axis counts as unit-stride;
    # when both qualify (e.g. a [1, 1] array) the last axis wins, as for a C-contiguous array.
    if (s_cols == item or cols <= 1) and (rows <= 1 or s_rows >= cols * item):
        return 1
    if (s_rows == item or rows <= 1) and (cols <= 1 or s_cols >= rows * item):
        return 0
    raise ValueError(
        f"{name} must be contiguous along one of its last two axes with non-overlapping rows: "
        f"{x.shape=} strides(bytes)={x.strides} itemsize={item}"
    )


def make_operand(x: object, name: str, allowed: tuple[str, ...]) -> Operand:
    """Inspect an operand in the nt form: logically [MN, K]; K-major if its last axis is unit-stride."""
    x = require_array(x, name)
    kind = OPERAND_KINDS.get(x.dtype)
    if kind is None or kind not in allowed:
        names = {"fp8": "float8_e4m3fn", "fp4": "int8 (packed FP4)", "bf16": "bfloat16"}
        raise TypeError(f"{name} has dtype {x.dtype}; expected one of {[names[a] for a in allowed]}")
    axis = contiguous_axis(x, name)
    mn, k = x.shape
    if kind == "fp4":
        # NOTES: packed FP4 holds two values per byte along the contiguous axis, so that logical extent doubles.
        if axis == 1:
            k *= 2
        else:
            mn *= 2
    return Operand(name, x, kind, "k" if axis == 1 else "mn", mn, k)


def transposed(x: object) -> object:
    """``x.T`` for arrays (and None passes through), used by the nn/tn/tt wrappers."""
    return x.T if isinstance(x, np.ndarray) else x


def check_output(d: object, m: int, n: int, c: object,
                 fp8_out: bool = False) -> tuple[np.ndarray, np.ndarray | None, str]:
    """D (and C) are [M, N], bf16 or fp32 (float8_e4m3fn with ``fp8_out``: the FP8Quantization epilogue), unit-stride
    rows; C has D's dtype and shape. Returns (d, c, out_kind)."""
    d = require_array(d, "d")
    out_kind = "fp8" if fp8_out and d.dtype == FP8 else OUT_KINDS.get(d.dtype)
    if out_kind is None:
        if fp8_out:
            raise TypeError(f"d has dtype {d.dtype}; FP8 output (epilogue=FP8Quantization) needs float8_e4m3fn")
        hint = " (float8_e4m3fn output needs epilogue=FP8Quantization(sfd))" if d.dtype == FP8 else ""
        raise TypeError(f"d has dtype {d.dtype}; expected bfloat16 or float32{hint}")
    if d.ndim != 2 or d.shape != (m, n):
        raise ValueError(f"d must have shape (m, n) = {(m, n)}, got {d.shape}")
    if d.size and n > 1 and d.strides[1] != d.itemsize:
        raise ValueError(f"d must have unit stride along N, got strides(bytes)={d.strides}")
    if d.size and m > 1 and d.strides[0] < n * d.itemsize:
        raise ValueError(f"d rows must not overlap: outer stride {d.strides[0]} bytes < {n=} * {d.itemsize} bytes")
    check_no_self_overlap(d, "d")
    if not d.flags.writeable:
        raise ValueError(f"d is read-only ({d.flags.writeable=}); pass a writable array")
    if c is not None:
        c = require_array(c, "c")
        if c.dtype != d.dtype:
            raise TypeError(f"c must have d's dtype: {c.dtype=} {d.dtype=}")
        if c.shape != d.shape:
            raise ValueError(f"c must have d's shape: {c.shape=} {d.shape=}")
        if np.shares_memory(c, d) and not same_view(c, d):
            raise ValueError(
                f"c overlaps d without being the same view ({c.strides=} {d.strides=}); pass c=d to accumulate in place"
            )
    return d, c, out_kind


def check_no_self_overlap(x: np.ndarray, name: str) -> None:
    """Every output: no byte reachable through two indices (any rank, any strides, zero and negative strides
    included). Raises ValueError naming ``name``, its shape and strides.

    NOTES: the axes of extent > 1, by increasing |stride|, must each step over everything the smaller axes span;
    this is exact for every layout numpy's slicing, transposes and reshapes produce (interleaved stride patterns
    that happen not to collide are refused too, as the kernels could not address them anyway)."""
    if x.size <= 1:
        return
    span = x.itemsize
    for stride, extent in sorted((abs(s), e) for s, e in zip(x.strides, x.shape, strict=True) if e > 1):
        if stride < span:
            raise ValueError(f"{name} overlaps itself: shape={x.shape} strides(bytes)={x.strides} reach some "
                             f"elements through two indices; every output element needs its own memory (e.g. a "
                             f"C-contiguous array)")
        span += stride * (extent - 1)


def check_accumulator(c: object, d: np.ndarray) -> tuple[np.ndarray, bool]:
    """(C as an array, whether it is D's own view) for the calls that accumulate into D: C must have D's dtype and
    shape, and may share D's memory only as the very same view (c=d)."""
    c = require_array(c, "c")
    if c.dtype != d.dtype or c.shape != d.shape:
        raise ValueError(f"c must match d: {c.dtype=} {c.shape=} vs {d.dtype=} {d.shape=}")
    same = c.strides == d.strides and c.ctypes.data == d.ctypes.data
    if np.shares_memory(c, d) and not same:
        raise ValueError(f"c overlaps d without being the same view ({c.strides=} {d.strides=}); pass c=d")
    return c, same


def same_view(x: np.ndarray, y: np.ndarray) -> bool:
    return (
        x.shape == y.shape
        and x.strides == y.strides
        and x.__array_interface__["data"][0] == y.__array_interface__["data"][0]
    )


def check_no_alias(d: np.ndarray, **inputs: np.ndarray | None) -> None:
    for name, x in inputs.items():
        if x is not None and np.shares_memory(d, x):
            raise ValueError(f"d shares memory with {name}; the output must not alias an input")


def check_alpha(alpha: object) -> float:
    """alpha as a Python float; the kernels apply it as an fp32, so it must be finite in fp32."""
    if alpha is None:
        return 1.0
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating, np.integer)):
        raise TypeError(f"alpha must be a float or None, got {type(alpha).__name__}: {alpha!r}")
    try:
        value = float(alpha)
    except OverflowError:
        raise ValueError(f"alpha is outside fp32's finite range: an int of {int(alpha).bit_length()} bits") from None
    if not math.isfinite(value):
        raise ValueError(f"alpha must be finite, got alpha={alpha!r}")
    with np.errstate(over="ignore"):
        as_fp32 = np.float32(value)
    if not np.isfinite(as_fp32):
        raise ValueError(
            f"alpha={alpha!r} is outside fp32's finite range (|alpha| <= {float(np.finfo(np.float32).max)!r}): "
            "the kernels apply alpha as an fp32"
        )
    return value


def check_arch_supports(**kinds: str) -> None:
    """Refuse operand dtypes the NPU arch in force has no Cube path for (910B2: bf16 only), before any write."""
    from .. import runtime

    arch = runtime.get_arch_spec()
    for name, kind in kinds.items():
        if kind != "bf16" and not arch.has_fp8:
            raise ValueError(f"{name} is {kind}, but arch {arch.name} has no {kind} Cube path (bf16 only); "
                             "choose another arch with deep_gemm.set_npu_arch")


def check_dims(**dims: int) -> None:
    """Every GEMM dim must fit the uint32 the kernels index it with (whatever ``compiled_dims`` says)."""
    for name, value in dims.items():
        if value > MAX_DIM:
            raise ValueError(
                f"{name}={value} exceeds {MAX_DIM} (2^32 - 1): the kernels index {name} as a uint32, "
                "whatever compiled_dims bakes in"
            )


def check_compiled_dims(compiled_dims: object) -> str:
    if not isinstance(compiled_dims, str):
        raise TypeError(f"compiled_dims must be a str over 'mnk', got {type(compiled_dims).__name__}")
    if any(ch not in "mnk" for ch in compiled_dims) or len(set(compiled_dims)) != len(compiled_dims):
        raise ValueError(f"compiled_dims must be distinct letters from 'mnk', got {compiled_dims!r}")
    return "".join(ch for ch in "mnk" if ch in compiled_dims)


def _check_int_tuple(value: object, length: int, name: str) -> tuple[int, ...]:
    if (
        not isinstance(value, (tuple, list))
        or len(value) != length
        or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value)
    ):
        raise ValueError(f"{name} must be a tuple of {length} ints, got {value!r}")
    if any(v <= 0 for v in value):
        raise ValueError(f"{name} entries must be positive, got {value!r}")
    return tuple(int(v) for v in value)


def resolve_recipes(recipe: object, recipe_a: object, recipe_b: object) -> tuple[tuple[int, int], tuple[int, int]]:
    """Per-operand (gran_mn, gran_k). Default MX (1, 1, 32); ``recipe`` and ``recipe_a``/``recipe_b`` exclude
    each other, and ``recipe_a``/``recipe_b`` come together."""
    if recipe is not None and (recipe_a is not None or recipe_b is not None):
        raise ValueError(f"pass either recipe or recipe_a/recipe_b, not both: {recipe=} {recipe_a=} {recipe_b=}")
    if (recipe_a is None) != (recipe_b is None):
        raise ValueError(f"recipe_a and recipe_b must be given together: {recipe_a=} {recipe_b=}")
    if recipe_a is not None:
        ra = _check_int_tuple(recipe_a, 2, "recipe_a")
        rb = _check_int_tuple(recipe_b, 2, "recipe_b")
    else:
        gm, gn, gk = _check_int_tuple((1, 1, 32) if recipe is None else recipe, 3, "recipe")
        ra, rb = (gm, gk), (gn, gk)
    for name, (gran_mn, gran_k) in (("A", ra), ("B", rb)):
        if gran_k not in (32, 128):
            raise ValueError(f"gran_k of {name} must be 32 (MX) or 128 (CUDA DeepGEMM recipes), got {gran_k}")
        if gran_mn & (gran_mn - 1) or gran_mn > 128:
            raise ValueError(f"gran_mn of {name} must be a power of two in [1, 128], got {gran_mn}")
    return ra, rb


def rebalance_scales(sfa: np.ndarray, sfb: np.ndarray, k: int, kind_a: str, kind_b: str,
                     max_shift: int) -> tuple[np.ndarray, np.ndarray, int, bool]:
    """utils.layout.rebalance_sf_exponents for the Cube the call will run on: (sfa, sfb, out_shift, l0_bf16).

    Where the kernel would keep the operands in bf16 L0 (the AMX or AVX512-BF16 Cube: both read subnormal bf16 as
    zero), the split must also keep every scaled operand value normal; when no split can (scales near 2^-127), the
    call runs on the fp32 FMA Cube instead (l0_bf16 False), exact with subnormals. Raises the ValueError of
    rebalance_sf_exponents when no exact split exists at all."""
    from ..kernels.common import cube_l0_bf16
    from ..utils.layout import SubnormalOperandsError, rebalance_sf_exponents

    if cube_l0_bf16(kind_a, kind_b):
        try:
            return (*rebalance_sf_exponents(sfa, sfb, k, kind_a, kind_b, max_shift, require_normal=True), True)
        except SubnormalOperandsError:
            pass
    return (*rebalance_sf_exponents(sfa, sfb, k, kind_a, kind_b, max_shift), False)
