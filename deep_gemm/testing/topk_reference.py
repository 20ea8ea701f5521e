"""A numpy reference of ``deep_gemm.topk`` (DeepSelect's top-k), row by row with argsort: what the kernel must
equal bit for bit. Knows nothing of the kernel.

The order: elements compare by their float order with -0 below +0, a negative NaN below -inf and a positive NaN
above +inf (the order of the bits' radix key, as DeepSelect's kernels compare); among equal elements the lower
index wins. The k selected come in ascending index order (``sorted=False``, and ``sorted_index``), or largest first
with equal values in index order (``sorted=True``).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

NAN_SENTINEL = 0x3F3F3F3F
BF16 = np.dtype(ml_dtypes.bfloat16)


def order_keys(bits: np.ndarray) -> np.ndarray:
    """The order keys (int64) of float bits (int16 for bf16, int32 for fp32)."""
    s = bits.astype(np.int64)
    width = bits.dtype.itemsize * 8
    return s ^ ((s >> (width - 1)) & ((1 << (width - 1)) - 1))


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.int16 if x.dtype == BF16 else np.int32)


def _is_nan(bits: np.ndarray) -> np.ndarray:
    if bits.dtype == np.int16:
        return (bits.astype(np.int64) & 0x7FFF) > 0x7F80
    return (bits.astype(np.int64) & 0x7FFFFFFF) > 0x7F800000


def topk_reference(x: np.ndarray, topk: int, sorted: bool = False, begin: np.ndarray | None = None,  # noqa: A002
                   end: np.ndarray | None = None, indices_type=np.int64, output_idx_offset: np.ndarray | None = None,
                   idx_oob_fill_value: int = 2147483647, value_oob_fill_value: float = float("-inf"),
                   platform: str = "cuda") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values [b, topk] of x's dtype, indices [b, topk] of ``indices_type``, nan_rows bool [b]) of a top-k over
    the rows of ``x`` (bf16 or fp32 [b, vocab]) restricted to [begin[i], end[i]).

    A row of at most topk elements returns them all in index order, the rest filled with the fill values (the index
    fill gets no offset). Indices get output_idx_offset[i] added (in int64, then wrapped to ``indices_type``).
    nan_rows: the rows whose range holds a NaN that the NaN check sees (``platform`` "cuda": rows longer than topk
    only; "ascend": every row); in such a row index 0 ("cuda") or every index ("ascend") is 0x3F3F3F3F, the values
    are still the selection's.
    """
    b, vocab = x.shape
    it = np.dtype(indices_type)
    begin = np.zeros(b, np.int64) if begin is None else np.asarray(begin, np.int64)
    end = np.full(b, vocab, np.int64) if end is None else np.asarray(end, np.int64)
    offset = np.zeros(b, np.int64) if output_idx_offset is None else np.asarray(output_idx_offset, np.int64)
    values = np.empty((b, topk), x.dtype)
    indices = np.empty((b, topk), it)
    nan_rows = np.zeros(b, bool)
    fill_value = np.array(value_oob_fill_value, np.float32).astype(x.dtype)
    for r in range(b):
        lo, hi = int(begin[r]), int(end[r])
        bits = _bits(x[r, lo:hi])
        keys = order_keys(bits)
        n = hi - lo
        if n <= topk:
            pick = np.arange(n)
        else:
            pick = np.sort(np.argsort(-keys, kind="stable")[:topk])
        if sorted:
            pick = pick[np.argsort(-keys[pick], kind="stable")]
        cnt = len(pick)
        values[r, :cnt] = x[r, lo + pick]
        values[r, cnt:] = fill_value
        idx = (pick + lo + offset[r]).astype(np.int64)
        indices[r, :cnt] = idx.astype(np.uint64).astype(it) if it == np.int32 else idx
        indices[r, cnt:] = idx_oob_fill_value
        if (platform == "ascend" or n > topk) and _is_nan(bits).any():
            nan_rows[r] = True
            if platform == "ascend":
                indices[r, :] = NAN_SENTINEL
            else:
                indices[r, 0] = NAN_SENTINEL
    return values, indices, nan_rows
