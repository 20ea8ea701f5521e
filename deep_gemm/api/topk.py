"""``topk``: DeepSelect's top-k (the sparse-attention indexer's selection step, MQA logits -> top-k -> sparse MLA),
with its signature and contract, and ``get_stride_requirement``. Checks, early return, output allocation, dispatch;
no compute here (kernels/topk.py, templates/topk.asc.j2).

DeepSelect picks its backend per process (the CUDA kernels, or the Ascend kernel when /dev/davinci_manager exists);
here ``set_topk_platform("ascend")`` turns on the Ascend kernel's contract for the process: bf16 input, int32
indices, ``sorted=False`` only, vocab < 2**21, and a row holding a NaN gets 0x3F3F3F3F in every index (short rows
checked too). The default "cuda" is the full contract: bf16 / fp32, int32 / int64, sorted values, vocab < 2**23,
and a NaN sets index 0 only (rows of at most topk elements are not checked).
"""

from __future__ import annotations

import math

import numpy as np

from .checks import BF16, FP32, check_no_self_overlap, dtype_by_name, require_array
from .guard import api_call, protect

# NOTES: DeepSelect's limits (its csrc/api.cpp and structs.h): 1 <= topk <= 4096; vocab < 2**23 on CUDA, < 2 MiB on
# Ascend; row strides a multiple of 32 bytes for the input and the outputs (the Ascend kernel's requirement, which
# this stand-in's AIV kernel has; DeepSelect's CUDA build asks 1024 bytes of the input's rows for its TMA loads).
MAX_TOPK = 4096
MAX_VOCAB = {"cuda": 1 << 23, "ascend": 2 * 1024 * 1024}
INPUT_STRIDE_BYTES = 32
OUTPUT_STRIDE_BYTES = 32
NAN_SENTINEL = 0x3F3F3F3F
PLATFORMS = ("cuda", "ascend")
INT32 = np.dtype(np.int32)
INT64 = np.dtype(np.int64)
_INDEX_DTYPES = {"int32": INT32, "int64": INT64}

_platform = "cuda"


def set_topk_platform(platform: str) -> None:
    """Which DeepSelect backend's contract ``topk`` follows in this process: "cuda" (default: the full contract) or
    "ascend" (the Ascend kernel's: bf16 only, int32 indices only, sorted=False only, vocab < 2**21, a NaN fills the
    row's indices with 0x3F3F3F3F). A process-wide setting, as DeepSelect's backend is, so code written against
    ``deep_select.topk`` runs unchanged under either."""
    global _platform
    if platform not in PLATFORMS:
        raise ValueError(f"platform={platform!r} must be one of {PLATFORMS}")
    _platform = platform


def get_topk_platform() -> str:
    """The DeepSelect backend contract ``topk`` follows: "cuda" or "ascend" (set_topk_platform)."""
    return _platform


def get_stride_requirement() -> tuple[int, int]:
    """(input, output) row-stride requirement in bytes: stride(0) * itemsize of the input, and of the outputs, must be
    a multiple of these (the outputs ``topk`` allocates are padded to it)."""
    return INPUT_STRIDE_BYTES, OUTPUT_STRIDE_BYTES


def _indices_dtype(indices_type: object) -> np.dtype:
    """int32 or int64 from a numpy dtype (or its type, or its name) or a torch dtype (torch.int32 / torch.int64)."""
    return dtype_by_name(indices_type, "indices_type", _INDEX_DTYPES, "int32 or int64 (numpy or torch dtypes)")


def _flag(value: object, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}: {value!r}")
    return bool(value)


def _row_stride_ok(x: np.ndarray, align: int) -> bool:
    return x.strides[0] % align == 0


def _row_vector(x: object, name: str, b: int) -> np.ndarray | None:
    """``begin`` / ``end`` / ``output_idx_offset``: None or an int32 [b] array (contiguous)."""
    if x is None:
        return None
    x = require_array(x, name)
    if x.dtype != INT32:
        raise TypeError(f"{name} must be int32, got {x.dtype=}")
    if x.shape != (b,):
        raise ValueError(f"{name} must have shape ({b},) (one entry per input row), got {x.shape=}")
    if b > 1 and x.strides[0] != 4:
        raise ValueError(f"{name} must be contiguous, got strides={x.strides}")
    return x


def _aligned_empty(b: int, k: int, dtype: np.dtype) -> np.ndarray:
    """[b, k] with its rows OUTPUT_STRIDE_BYTES apart (a view of a padded array, as DeepSelect allocates)."""
    per = OUTPUT_STRIDE_BYTES // dtype.itemsize
    return np.empty((b, -(-k // per) * per), dtype)[:, :k]


@api_call
def topk(input: np.ndarray, topk: int, sorted: bool = False, begin: np.ndarray | None = None,  # noqa: A002
         end: np.ndarray | None = None, indices_type: object = np.int64, sorted_index: bool = False,
         hint: object = None, output_idx: np.ndarray | None = None, output_idx_offset: np.ndarray | None = None,
         idx_oob_fill_value: int = 2147483647, value_oob_fill_value: float = float("-inf"),
         return_value: bool = True, abort_when_nan_found: bool = True) -> tuple[np.ndarray | None, np.ndarray]:
    """The ``topk`` largest elements of each row of ``input`` and their indices, as DeepSelect's ``topk``.

    input: [b, vocab] bfloat16 (ml_dtypes) or float32, unit last stride, row stride a multiple of 32 bytes
    (get_stride_requirement). Row i is searched over [begin[i], end[i]) (int32 [b] each, default 0 and vocab,
    0 <= begin <= end <= vocab; DeepSelect itself refuses ``begin``). Elements compare in float order with -0 below
    +0; equal elements go to the lower index. ``sorted``: values largest first (float32 only, with return_value, not
    with sorted_index); otherwise the k indices come in ascending index order (so ``sorted_index`` always holds).
    A row of at most topk elements returns all of them in index order, then ``value_oob_fill_value`` (in the input's
    dtype) and ``idx_oob_fill_value`` (an int32; not offset). ``output_idx_offset`` (int32 [b]) is added to every
    selected index (in int64, wrapped to int32 indices). ``indices_type``: int32 or int64 (numpy or torch dtypes);
    ``output_idx``: the caller's [b, topk] array of that dtype (unit last stride, 32-byte row stride) to write.
    NaN: with ``abort_when_nan_found`` a row holding one raises ValueError and nothing is written; without it the
    platform's policy marks the row with 0x3F3F3F3F (set_topk_platform). ``hint`` must be None (DeepSelect
    refuses it too). Returns (values [b, topk] or None without return_value, indices [b, topk]); the outputs
    ``topk`` allocates have 32-byte row strides. Reads get_topk_platform(), runtime.get_num_ai_cores(),
    get_arch_spec().
    """
    platform = _platform
    # Argument checks (nothing is allocated or written before they all pass)
    if isinstance(topk, bool) or not isinstance(topk, (int, np.integer)):
        raise TypeError(f"topk must be an int, got {type(topk).__name__}: {topk!r}")
    if not 1 <= topk <= MAX_TOPK:
        raise ValueError(f"topk={topk} must be in [1, {MAX_TOPK}]")
    topk = int(topk)
    x = require_array(input, "input")
    if x.dtype not in (BF16, FP32):
        raise TypeError(f"input must be bfloat16 (ml_dtypes.bfloat16) or float32, got {x.dtype=}")
    if x.ndim != 2:
        raise ValueError(f"input must be 2-D (batch, vocab), got {x.shape=}")
    b, vocab = x.shape
    if hint is not None:
        raise ValueError(f"hint is not supported (DeepSelect refuses it too), got {type(hint).__name__}")
    sorted_value = _flag(sorted, "sorted")
    sorted_index = _flag(sorted_index, "sorted_index")
    return_value = _flag(return_value, "return_value")
    abort = _flag(abort_when_nan_found, "abort_when_nan_found")
    it = _indices_dtype(indices_type)
    if sorted_value and not return_value:
        raise ValueError("sorted=True needs return_value=True (the values are what is sorted)")
    if sorted_value and sorted_index:
        raise ValueError("sorted=True and sorted_index=True cannot be used together")
    if sorted_value and x.dtype != FP32:
        raise ValueError(f"sorted=True (by value) is supported for float32 input only, got {x.dtype=}")
    if platform == "ascend":
        if x.dtype != BF16:
            raise TypeError(f"input must be bfloat16 on the Ascend platform (set_topk_platform), got {x.dtype=}")
        if it != INT32:
            raise TypeError(f"indices_type must be int32 on the Ascend platform (set_topk_platform), got {it}")
        if sorted_value:
            raise ValueError("sorted=True is not supported on the Ascend platform (set_topk_platform)")
    if vocab >= MAX_VOCAB[platform]:
        raise ValueError(f"vocab={vocab} must be < {MAX_VOCAB[platform]} on the {platform} platform")
    if x.size:
        if any(s < 0 for s in x.strides):
            raise ValueError(f"input has negative strides {x.strides}; pass a view with non-negative strides")
        if vocab > 1 and x.strides[1] != x.itemsize:
            raise ValueError(f"input must have a unit-stride last dim, got strides={x.strides}")
        if not _row_stride_ok(x, INPUT_STRIDE_BYTES):
            raise ValueError(f"input.stride(0) = {x.strides[0] // x.itemsize} elements ({x.strides[0]} bytes) must be "
                             f"a multiple of {INPUT_STRIDE_BYTES} bytes (get_stride_requirement()[0]); pad the rows, "
                             f"e.g. an array of [b, vocab rounded up to {INPUT_STRIDE_BYTES // x.itemsize}] and its "
                             f"[:, :vocab] view")
    begin_a = _row_vector(begin, "begin", b)
    end_a = _row_vector(end, "end", b)
    offset_a = _row_vector(output_idx_offset, "output_idx_offset", b)
    lo = begin_a if begin_a is not None else np.zeros(b, INT32)
    hi = end_a if end_a is not None else np.full(b, vocab, INT32)
    bad = (lo < 0) | (lo > hi) | (hi > vocab)
    if bad.any():
        r = int(np.argmax(bad))
        raise ValueError(f"row {r}: begin={int(lo[r])}, end={int(hi[r])} must satisfy 0 <= begin <= end <= "
                         f"vocab={vocab}")
    if isinstance(idx_oob_fill_value, bool) or not isinstance(idx_oob_fill_value, (int, np.integer)):
        raise TypeError(f"idx_oob_fill_value must be an int, got {type(idx_oob_fill_value).__name__}")
    if not -(2**31) <= idx_oob_fill_value < 2**31:
        raise ValueError(f"idx_oob_fill_value={idx_oob_fill_value} must fit int32")
    if isinstance(value_oob_fill_value, bool) or not isinstance(value_oob_fill_value, (int, float, np.floating,
                                                                                        np.integer)):
        raise TypeError(f"value_oob_fill_value must be a float, got {type(value_oob_fill_value).__name__}")
    if output_idx is not None:
        output_idx = require_array(output_idx, "output_idx")
        if output_idx.dtype != it:
            raise TypeError(f"output_idx.dtype={output_idx.dtype} must equal indices_type ({it})")
        if output_idx.shape != (b, topk):
            raise ValueError(f"output_idx must have shape ({b}, {topk}), got {output_idx.shape=}")
        if b and (any(s < 0 for s in output_idx.strides) or (topk > 1 and output_idx.strides[1] != it.itemsize)
                  or not _row_stride_ok(output_idx, OUTPUT_STRIDE_BYTES)):
            raise ValueError(f"output_idx must have a unit-stride last dim and a row stride that is a multiple of "
                             f"{OUTPUT_STRIDE_BYTES} bytes (get_stride_requirement()[1]), got {output_idx.strides=}")
        if not output_idx.flags.writeable:
            raise ValueError("output_idx must be writeable")
        check_no_self_overlap(output_idx, "output_idx")
        for other, name in ((x, "input"), (begin_a, "begin"), (end_a, "end"), (offset_a, "output_idx_offset")):
            if other is not None and np.shares_memory(output_idx, other):
                raise ValueError(f"output_idx shares memory with {name}; the output must not alias an input")

    # Output allocation and early return (no rows)
    values = _aligned_empty(b, topk, x.dtype) if return_value else None
    indices = output_idx if output_idx is not None else _aligned_empty(b, topk, it)
    if b == 0:
        return values, indices

    # Dispatch. NOTES: with abort_when_nan_found the kernel writes the caller's output_idx only through a buffer of
    # ours, copied in once no row held a NaN, so an aborted call leaves it as it was.
    fill_bits = np.array(value_oob_fill_value, np.float32)
    fill_bits = int(fill_bits.astype(BF16).view(np.int16) if x.dtype == BF16 else fill_bits.view(np.int32))
    staged = output_idx is not None and abort
    target = _aligned_empty(b, topk, it) if staged else indices
    nan_rows = np.zeros(b, INT32)
    if output_idx is not None and not staged:
        protect(output_idx, work=float(x.size))  # NOTES: the arrays allocated here need no backup
    from ..kernels.topk import launch_topk

    bits = x.view(np.int16 if x.dtype == BF16 else np.int32)
    launch_topk(bits, topk, np.ascontiguousarray(lo, INT32), np.ascontiguousarray(hi, INT32),
                np.zeros(b, INT32) if offset_a is None else offset_a, values, target, nan_rows,
                sorted_value=sorted_value, ascend_nan=platform == "ascend", idx_fill=int(idx_oob_fill_value),
                value_fill_bits=fill_bits)
    if abort and nan_rows.any():
        r = int(np.argmax(nan_rows))
        raise ValueError(f"input row {r} holds a NaN in [begin, end) = [{int(lo[r])}, {int(hi[r])}) "
                         f"(abort_when_nan_found=True: DeepSelect aborts the kernel; pass False for its NaN policy)")
    if staged:
        protect(output_idx, work=float(math.prod(output_idx.shape)))
        np.copyto(output_idx, target)
    return values, indices
