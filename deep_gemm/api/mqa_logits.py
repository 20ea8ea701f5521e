"""MQA logits of DeepSeek's sparse-attention indexer over ragged key ranges: ``fp8_fp4_mqa_logits`` (and CUDA
DeepGEMM's legacy name ``fp8_mqa_logits``), plus the argument checks the paged family (api/paged_mqa_logits.py)
shares.

Checks, early returns and layout preparation only (scales into the kernels' forms, weights to fp32); the logits
are computed by the mixed Cube + Vector kernels of deep_gemm/kernels/mqa_logits.py. Every check runs before
anything is written.
"""

from __future__ import annotations

import numbers

import ml_dtypes
import numpy as np

from ..heuristics.mqa import MQA_FP4_HEAD_DIMS, MQA_HEAD_DIMS, MQA_MAX_HEADS, MQA_MIN_HEADS, storage_bytes
from ..utils.layout import transform_sf_into_required_layout
from ..utils.math import align
from .checks import BF16, FP8, FP32, INT16, PACKED_FP4, dtype_by_name, require_array
from .guard import api_call, protect

# NOTES: DeepGEMM-Ascend pads the logits' row stride to 512 bytes (256 bf16 elements; 128 fp32 ones here).
LOGITS_ROW_ALIGN_BYTES = 512
_KINDS = {FP8: "fp8", PACKED_FP4: "fp4"}
_INT32 = np.dtype(np.int32)


# ---------------------------------------------------------------------------------------------------------------
# Argument checks (shared with api/paged_mqa_logits.py)


def _pair(x: object, name: str) -> tuple[np.ndarray, object]:
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise TypeError(f"{name} must be a (values, scale_factors) pair (scale_factors may be None for q), got "
                        f"{type(x).__name__}")
    values = require_array(x[0], f"{name}[0]")
    sf = None if x[1] is None else require_array(x[1], f"{name}[1]")
    return values, sf


def _kind(x: np.ndarray, name: str) -> str:
    if x.dtype not in _KINDS:
        raise TypeError(f"{name} must be float8_e4m3fn (FP8) or int8 (packed FP4, two e2m1 values per byte), got "
                        f"{name}.dtype={x.dtype}")
    return _KINDS[x.dtype]


def _check_heads_dim(num_heads: int, head_dim: int, name: str, kind: str = "fp8") -> None:
    if not (MQA_MIN_HEADS <= num_heads <= MQA_MAX_HEADS and num_heads % 4 == 0):
        raise ValueError(f"{name}: num_heads={num_heads} must be a multiple of 4 in [{MQA_MIN_HEADS}, {MQA_MAX_HEADS}]")
    if head_dim not in MQA_HEAD_DIMS:
        raise ValueError(f"{name}: head_dim={head_dim} must be one of {MQA_HEAD_DIMS}")
    if kind == "fp4" and head_dim not in MQA_FP4_HEAD_DIMS:
        raise ValueError(f"{name}: head_dim={head_dim} with packed FP4 must be one of {MQA_FP4_HEAD_DIMS} (head_dim 32 "
                         f"is FP8 only, as in CUDA DeepGEMM)")


# NOTES: logits dtypes by name: numpy / ml_dtypes dtypes and torch's dtype objects (str 'torch.float32'), without
# importing torch (the torch boundary converts tensors, not dtype objects).
_LOGITS_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


def _logits_dtype(logits_dtype: object) -> np.dtype:
    """float32 or bfloat16 from a numpy / ml_dtypes dtype (or its type) or a torch dtype (torch.float32 / torch.float,
    torch.bfloat16)."""
    return dtype_by_name(logits_dtype, "logits_dtype", _LOGITS_DTYPES,
                         "float32 or bfloat16 (numpy / ml_dtypes or torch dtypes)")


def _rows_view(x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """``x`` with its leading dims flattened, as a 2-D [rows, cols] array with unit column stride: a view when the
    strides allow it, else a contiguous copy (layout preparation)."""
    collapsible = all(x.strides[i] == x.shape[i + 1] * x.strides[i + 1] for i in range(x.ndim - 2))
    if collapsible and (x.strides[-1] == x.itemsize or x.shape[-1] <= 1):
        return x.reshape(rows, cols)
    return np.ascontiguousarray(x).reshape(rows, cols)


def _mx_sf(sf: np.ndarray, rows: int, head_dim: int, name: str, lead_shape: tuple[int, ...]) -> np.ndarray:
    """UE8M0 scales per 32 of head_dim in any accepted form -> the kernels' int16 [ceil(D / 64), rows] (C-contiguous).

    Forms: fp32 [*lead, D / 32] (powers of two); int16 pairs [*lead, ceil(D / 64)] (any strides: the required layout is
    taken as is); int32 [*lead] (CUDA DeepGEMM's FP4 form: byte b of the int32 is the exponent of 32-block b)."""
    pairs = -(-head_dim // 64)  # head_dim 32: one int16 whose low byte is the exponent
    blocks = head_dim // 32
    if sf.dtype == _INT32:
        if sf.shape != lead_shape:
            raise ValueError(f"{name}: int32 packed UE8M0 scales must have shape {lead_shape}, got {sf.shape}")
        exps = np.ascontiguousarray(sf).reshape(rows).astype("<i4").view(np.uint8).reshape(rows, 4)[:, :blocks]
        sf32 = (exps.astype(np.uint32) << np.uint32(23)).view(np.float32)
        sf32 = np.where(exps == 0, np.float32(2.0**-127), sf32).astype(np.float32)
        sf = sf32
    elif sf.dtype == INT16:
        if sf.shape != lead_shape + (pairs,):
            raise ValueError(f"{name}: int16 UE8M0 pairs must have shape {lead_shape + (pairs,)}, got {sf.shape}")
        sf = sf.reshape(rows, pairs)
    elif sf.dtype == FP32:
        if sf.shape != lead_shape + (blocks,):
            raise ValueError(f"{name}: fp32 scales per 32 of head_dim must have shape {lead_shape + (blocks,)}, got "
                             f"{sf.shape}")
        sf = sf.reshape(rows, blocks)
    else:
        raise TypeError(f"{name}.dtype={sf.dtype}: scales are fp32 (powers of two per 32 of head_dim), int16 (UE8M0 "
                        f"pairs) or int32 (packed UE8M0)")
    try:
        out = transform_sf_into_required_layout(sf, rows, head_dim, (1, 32))
    except (ValueError, TypeError) as e:
        raise type(e)(f"{name}: {e}") from None
    return np.ascontiguousarray(out.T)


def _check_weights(weights: object, seq_len: int, num_heads: int, name: str = "weights") -> np.ndarray:
    w = require_array(weights, name)
    if w.dtype not in (BF16, FP32):
        raise TypeError(f"{name}.dtype={w.dtype} must be bfloat16 or float32")
    if w.shape != (seq_len, num_heads):
        raise ValueError(f"{name}.shape={w.shape} must be (num_queries, num_heads) = {(seq_len, num_heads)}")
    return np.ascontiguousarray(w, dtype=np.float32)


def _check_int_array(x: object, name: str, shape: tuple[int, ...]) -> np.ndarray:
    a = require_array(x, name)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name}.dtype={a.dtype} must be an integer type (int32)")
    if a.shape != shape:
        raise ValueError(f"{name}.shape={a.shape} must be {shape}")
    if a.size and (a.min() < -2**31 or a.max() >= 2**31):
        raise ValueError(f"{name} holds values outside int32")
    return np.ascontiguousarray(a, dtype=np.int32)


def _check_int(value: object, name: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r}")
    if int(value) < minimum or int(value) >= 2**31:
        raise ValueError(f"{name}={value} must be in [{minimum}, 2^31)")
    return int(value)


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _new_logits(rows: int, cols: int, dtype: np.dtype) -> np.ndarray:
    """bf16 or fp32 [rows, cols] whose row stride is padded to LOGITS_ROW_ALIGN_BYTES (512 bytes)."""
    stride = align(max(cols, 1), LOGITS_ROW_ALIGN_BYTES // dtype.itemsize)
    return np.empty((rows, stride), dtype=dtype)[:, :cols]


def _check_q(q: object, name: str = "q", paged: bool = False):
    """q pair -> (values, sf, kind, leading shape, num_heads, head_dim)."""
    qv, q_sf = _pair(q, name)
    kind = _kind(qv, f"{name}[0]")
    want_ndim = 4 if paged else 3
    if qv.ndim != want_ndim:
        layout = "[batch, next_n, num_heads, head_dim]" if paged else "[num_queries, num_heads, head_dim]"
        raise ValueError(f"{name}[0] must be {layout} ({want_ndim}-D), got shape {qv.shape}")
    num_heads = qv.shape[-2]
    head_dim = qv.shape[-1] * (2 if kind == "fp4" else 1)
    _check_heads_dim(num_heads, head_dim, f"{name}[0].shape={qv.shape}", kind)
    return qv, q_sf, kind, num_heads, head_dim


# ---------------------------------------------------------------------------------------------------------------
# Ragged MQA logits


@api_call
def fp8_fp4_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, max_seqlen_k=0, clean_logits=True,
                       logits_dtype=ml_dtypes.bfloat16):
    """Weighted-ReLU MQA logits over ragged key ranges (DeepSeek V3.2's indexer, prefill):

        logits[i, j] = sum_h relu(q[i, h, :] . kv[j, :] * kv_scale[j]) * weights[i, h]   for ks[i] <= j < ke[i]

    q: (values, sf) with values float8_e4m3fn [S, H, D] or packed FP4 int8 [S, H, D / 2]; sf None, or UE8M0 scales
    per 32 of head_dim: fp32 [S, H, D / 32] powers of two, int16 pairs [S, H, ceil(D / 64)] (DeepGEMM-Ascend's form), or
    int32 [S, H] packed (CUDA DeepGEMM's FP4 form). kv: (values, sf) with values float8_e4m3fn [S_kv, D] or int8
    [S_kv, D / 2]; sf fp32 [S_kv] (a scale per key, CUDA DeepGEMM's FP8 form: q = (q_e4m3, None)), or MX scales
    fp32 [S_kv, D / 32], int16 [S_kv, ceil(D / 64)], int32 [S_kv], or None. H a multiple of 4 in [4, 64]; D 32 (FP8
    only), 64 or 128. weights: bf16 or fp32 [S, H]. cu_seq_len_k_start / _end: int32 [S], 0 <= ks <= ke <= S_kv.
    logits_dtype: bfloat16 (default, DeepGEMM-Ascend's) or float32 (CUDA DeepGEMM's default; numpy, ml_dtypes or
    torch dtypes): fp32 logits are the kernel's sums before the bf16 rounding (bf16 logits = fp32 ones rounded RNE).

    Returns logits [S, S_kv] whose row stride is padded to 512 bytes; with ``max_seqlen_k`` > 0 the compressed
    form [S, max_seqlen_k] instead, column j' holding key ks[i] + j' (every ke - ks must be <= max_seqlen_k).
    ``clean_logits``: every entry outside the row's range (compressed: columns >= ke - ks) is -inf; else those
    entries are left as allocated. Reads runtime.get_num_ai_cores(); results are bitwise the same for any core count.
    """
    # Shape and dtype checks
    qv, q_sf, q_kind, num_heads, head_dim = _check_q(q)
    kvv, kv_sf = _pair(kv, "kv")
    kv_kind = _kind(kvv, "kv[0]")
    seq_len = qv.shape[0]
    if kvv.ndim != 2 or kvv.shape[1] != storage_bytes(kv_kind, head_dim):
        raise ValueError(f"kv[0].shape={kvv.shape} must be [num_keys, {storage_bytes(kv_kind, head_dim)}] "
                         f"({kv_kind}, head_dim={head_dim} from q)")
    seq_len_kv = kvv.shape[0]
    if seq_len_kv >= 2**31 or seq_len * num_heads >= 2**31:
        raise ValueError(f"num_queries={seq_len} x num_heads={num_heads} and num_keys={seq_len_kv} must be < 2^31")
    w = _check_weights(weights, seq_len, num_heads)
    ks = _check_int_array(cu_seq_len_k_start, "cu_seq_len_k_start", (seq_len,))
    ke = _check_int_array(cu_seq_len_k_end, "cu_seq_len_k_end", (seq_len,))
    if isinstance(max_seqlen_k, bool):
        raise TypeError("max_seqlen_k must be an int, got a bool (CUDA DeepGEMM's fp8_fp4_mqa_logits takes "
                        "clean_logits first: pass both by keyword)")
    max_seqlen_k = _check_int(max_seqlen_k, "max_seqlen_k")
    if not isinstance(clean_logits, (bool, np.bool_)):
        raise TypeError(f"clean_logits must be a bool, got {type(clean_logits).__name__}: {clean_logits!r}")
    out_dtype = _logits_dtype(logits_dtype)

    # Range checks
    for name, arr in (("cu_seq_len_k_start", ks), ("cu_seq_len_k_end", ke)):
        if seq_len and arr.min() < 0:
            i = _first_bad(arr < 0)
            raise ValueError(f"{name}[{i}]={arr[i]} is negative")
    if seq_len and (ks > ke).any():
        i = _first_bad(ks > ke)
        raise ValueError(f"cu_seq_len_k_start[{i}]={ks[i]} > cu_seq_len_k_end[{i}]={ke[i]}")
    if seq_len and (ke > seq_len_kv).any():
        i = _first_bad(ke > seq_len_kv)
        raise ValueError(f"cu_seq_len_k_end[{i}]={ke[i]} is beyond the {seq_len_kv} keys of kv")
    if max_seqlen_k and seq_len and (ke - ks > max_seqlen_k).any():
        i = _first_bad(ke - ks > max_seqlen_k)
        raise ValueError(f"row {i}: cu_seq_len_k_end - cu_seq_len_k_start = {ke[i] - ks[i]} exceeds "
                         f"max_seqlen_k={max_seqlen_k}")

    # Scales into the kernels' forms (MX: int16 pairs [D / 64, rows]; per key: fp32 [S_kv])
    sfq = None if q_sf is None else _mx_sf(q_sf, seq_len * num_heads, head_dim, "q[1]", (seq_len, num_heads))
    sfkv, kv_scale = None, None
    if kv_sf is not None:
        if kv_sf.dtype == FP32 and kv_sf.ndim == 1:
            if kv_sf.shape != (seq_len_kv,):
                raise ValueError(f"kv[1].shape={kv_sf.shape}: a scale per key must be [{seq_len_kv}]")
            kv_scale = np.ascontiguousarray(kv_sf)
        else:
            sfkv = _mx_sf(kv_sf, seq_len_kv, head_dim, "kv[1]", (seq_len_kv,))

    # Output, early return
    out_cols = max_seqlen_k if max_seqlen_k else seq_len_kv
    logits = _new_logits(seq_len, out_cols, out_dtype)
    if seq_len == 0 or out_cols == 0:
        return logits

    # Dispatch
    protect(work=2.0 * seq_len * num_heads * head_dim * out_cols)
    from ..kernels.mqa_logits import launch_mqa_logits

    q_rows = _rows_view(qv, seq_len * num_heads, qv.shape[-1])
    # NOTES: the kernel addresses kv as rows at a non-negative stride with unit columns; anything else is copied.
    unit_cols = kvv.strides[1] == kvv.itemsize or kvv.shape[1] == 1
    kv_rows = kvv if unit_cols and kvv.strides[0] >= 0 else np.ascontiguousarray(kvv)
    launch_mqa_logits(q_rows, sfq, kv_rows, sfkv, kv_scale, w, ks, ke, logits,
                      num_heads=num_heads, head_dim=head_dim, q_dtype=q_kind, kv_dtype=kv_kind,
                      compressed=bool(max_seqlen_k), clean_logits=bool(clean_logits))
    return logits


@api_call
def fp8_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True, max_seqlen_k=0):
    """CUDA DeepGEMM's legacy name (and argument order: clean_logits before max_seqlen_k) of fp8_fp4_mqa_logits."""
    return fp8_fp4_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, max_seqlen_k=max_seqlen_k,
                              clean_logits=clean_logits)
