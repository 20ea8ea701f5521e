"""``tf32_hc_prenorm_gemm``: the GEMM in front of the RMS norm of DeepSeek's hyper-connections, D = A @ B^T in TF32
with the row sums of squares of A, as DeepGEMM(-Ascend) names it. Checks, early return, dispatch; no compute here.
"""

from __future__ import annotations

import numpy as np

from .. import runtime
from .checks import BF16, FP32, check_dims, check_no_self_overlap, require_array
from .guard import api_call, protect

# NOTES: DeepGEMM's limits: k % 64 == 0 (the kernels split K in 64-element chunks), n % 8 == 0 and n <= 128 (one
# N block: the hyper-connection mixes are 2 * hc + hc^2 = 24 wide for hc = 4).
MAX_N = 128


def _check_unit_last(x: np.ndarray, name: str) -> None:
    if x.size == 0:
        # NOTES: an empty array has no layout to check (numpy 2 gives many of them zero strides, e.g. np.zeros((0, k)))
        return
    if any(s < 0 for s in x.strides):
        raise ValueError(f"{name} has negative strides {x.strides}; pass a view with non-negative strides")
    if x.shape[-1] > 1 and x.strides[-1] != x.itemsize:
        raise ValueError(f"{name} must have a unit-stride last dim (K-major / row-major), got strides={x.strides} "
                         f"for shape={x.shape} (itemsize {x.itemsize})")
    for ax in range(x.ndim - 1):
        inner = x.strides[ax + 1] * x.shape[ax + 1]  # the bytes one index of this axis must step over
        if x.shape[ax] > 1 and (x.strides[ax] % x.itemsize or x.strides[ax] < inner):
            raise ValueError(f"{name} has overlapping or misaligned rows: strides={x.strides} for shape={x.shape}")


@api_call
def tf32_hc_prenorm_gemm(a: np.ndarray, b: np.ndarray, d: np.ndarray, sqr_sum: np.ndarray,
                         num_splits: int | None = None) -> None:
    """D = A @ B^T with TF32 operands and sqr_sum = the row sums of A^2, fp32 accumulation; writes ``d`` and
    ``sqr_sum`` in place.

    a: bfloat16 [M, K], K-major (unit last stride); b: float32 [N, K], K-major, read as TF32 (mantissa rounded to 10
    bits, round to nearest even: the Cube's HF32 mode in its default rounding; A's bf16 values are already TF32).
    K % 64 == 0, N % 8 == 0, N <= 128. Without ``num_splits``: d float32 [M, N], sqr_sum float32 [M]; the kernel may
    split K over the AI cores itself and sums the parts in split order. With ``num_splits`` = s (1 <= s <= K / 64):
    d [s, M, N] and sqr_sum [s, M] receive the partial sums over the s K ranges (the 64-element K chunks dealt
    evenly), which the caller sums over dim 0, as DeepGEMM does.
    Deterministic mode (``use_deterministic_algorithms(True)``): the kernel's own split count depends only on the
    shape and the modelled arch, never on ``set_num_ai_cores``, so D is bitwise the same on any core and thread
    count. Reads runtime.get_num_ai_cores(), get_arch_spec(), get_deterministic_algorithms(), get_dry_run().
    """
    # Argument checks (nothing is written before they all pass)
    a = require_array(a, "a")
    b = require_array(b, "b")
    d = require_array(d, "d")
    sqr_sum = require_array(sqr_sum, "sqr_sum")
    if a.dtype != BF16:
        raise TypeError(f"a must be bfloat16 (ml_dtypes.bfloat16) [M, K], got {a.dtype=}")
    if b.dtype != FP32:
        raise TypeError(f"b must be float32 [N, K], got {b.dtype=}")
    if d.dtype != FP32:
        raise TypeError(f"d must be float32, got {d.dtype=}")
    if sqr_sum.dtype != FP32:
        raise TypeError(f"sqr_sum must be float32, got {sqr_sum.dtype=}")
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"a and b must be 2-D ([M, K] and [N, K]), got {a.shape=} {b.shape=}")
    m, k = a.shape
    n, kb = b.shape
    if kb != k:
        raise ValueError(f"a and b disagree on K: {a.shape=} {b.shape=}")
    if k == 0 or k % 64:
        raise ValueError(f"k={k} must be a positive multiple of 64")
    if n == 0 or n % 8 or n > MAX_N:
        raise ValueError(f"n={n} must be a multiple of 8 in [8, {MAX_N}]")
    check_dims(m=m, n=n, k=k)
    if num_splits is not None:
        if isinstance(num_splits, bool) or not isinstance(num_splits, (int, np.integer)):
            raise TypeError(f"num_splits must be None or an int, got {type(num_splits).__name__}: {num_splits!r}")
        if not 1 <= num_splits <= k // 64:
            raise ValueError(f"num_splits={num_splits} must be in [1, k / 64 = {k // 64}] (k={k})")
        num_splits = int(num_splits)
    d_shape = (m, n) if num_splits is None else (num_splits, m, n)
    s_shape = (m,) if num_splits is None else (num_splits, m)
    if d.shape != d_shape:
        raise ValueError(f"d must have shape {d_shape} (num_splits={num_splits}), got {d.shape=}")
    if sqr_sum.shape != s_shape:
        raise ValueError(f"sqr_sum must have shape {s_shape} (num_splits={num_splits}), got {sqr_sum.shape=}")
    for x, name in ((a, "a"), (b, "b"), (d, "d"), (sqr_sum, "sqr_sum")):
        _check_unit_last(x, name)
    check_no_self_overlap(d, "d")
    check_no_self_overlap(sqr_sum, "sqr_sum")
    if not d.flags.writeable or not sqr_sum.flags.writeable:
        raise ValueError(f"d and sqr_sum must be writeable ({d.flags.writeable=} {sqr_sum.flags.writeable=})")
    for out, out_name in ((d, "d"), (sqr_sum, "sqr_sum")):
        for x, name in ((a, "a"), (b, "b")):
            if np.shares_memory(out, x):
                raise ValueError(f"{out_name} shares memory with {name}; the outputs must not alias an input")
    if np.shares_memory(d, sqr_sum):
        raise ValueError("d shares memory with sqr_sum; give each output its own memory")

    # Early return: no rows, nothing to write
    if m == 0:
        return None

    # Dispatch
    protect(d, sqr_sum, work=2.0 * m * n * k)
    from ..kernels.hc_prenorm import launch_hc_prenorm

    launch_hc_prenorm(a, b, d, sqr_sum, num_splits or 0, runtime.get_deterministic_algorithms())
    return None
