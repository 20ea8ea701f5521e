"""Batched GEMMs and einsum with DeepGEMM-Ascend's names: ``fp8_bmm``, ``bf16_bmm``, ``einsum``, ``fp8_einsum``.

All run on the M-grouped schedule of the GEMM kernels (one launch; batch b is group b, owning rows
[b * M, (b + 1) * M) of A and D and its own B). einsum accepts DeepGEMM-Ascend's three expressions and maps each
onto a batched GEMM over h; operands are permuted into [batch, MN, K] copies when their layout needs it.
"""

from __future__ import annotations

import numpy as np

from .. import runtime
from .checks import check_compiled_dims, check_dims, check_no_alias, require_array, resolve_recipes
from .grouped import (
    GroupOperand,
    MGroupedPlan,
    _check_out,
    _group_sf,
    _kind_of,
    _split_pair,
    check_stacked_pair,
    make_group_operand,
    run_m_grouped,
)
from .guard import api_call

# expression -> (A permutation to [batch, M, K], B permutation to [batch, N, K], D permutation to [batch, M, N])
EINSUM_EXPRESSIONS = {
    "bhr,hdr->bhd": ((1, 0, 2), (0, 1, 2), (1, 0, 2)),
    "bhd,hdr->bhr": ((1, 0, 2), (0, 2, 1), (1, 0, 2)),
    "bhd,bhr->hdr": ((1, 2, 0), (1, 2, 0), (0, 1, 2)),
}


def _plan_bmm(a_arr, sfa, b_arr, sfb, d, c, kinds, recipe, compiled_dims, d_perm=(0, 1, 2)) -> MGroupedPlan:
    """Checks of a batched GEMM A [B, M, K] x B [B, N, K] -> D (given as ``d`` with D = d.transpose(d_perm)
    [B, M, N]); writes nothing. A must be K-major; non-compact inputs are copied, a non-compact D goes through a
    temporary that ``finish`` copies back."""
    op_a = make_group_operand(a_arr, "a", kinds)
    if op_a.major != "k":
        if op_a.kind == "fp4":
            raise ValueError(f"a must be K-major for packed FP4, got strides(bytes)={a_arr.strides}")
        op_a = make_group_operand(np.ascontiguousarray(a_arr), "a", kinds)
    op_b = make_group_operand(b_arr, "b", kinds)
    num_batches, m, k, n = check_stacked_pair(op_a, op_b, a_arr, b_arr, "the batch count")
    # NOTES: batch i owns rows [i * M, (i + 1) * M) of the one launch, so the row total is a uint32 index too.
    check_dims(m=m, n=n, k=k, **{"batch*m": num_batches * m})
    d_logical_shape = (num_batches, m, n)
    inv = np.argsort(d_perm)
    d, out_kind = _check_out(d, tuple(d_logical_shape[i] for i in inv))
    check_no_alias(d, a=a_arr, b=b_arr, sfa=sfa, sfb=sfb)
    dd = np.transpose(d, d_perm)
    c_rows = None
    if c is not None:
        c = require_array(c, "c")
        if c.dtype != d.dtype or c.shape != d.shape:
            raise ValueError(f"c must match d: {c.dtype=} {c.shape=} vs {d.dtype=} {d.shape=}")
        same = c.strides == d.strides and c.ctypes.data == d.ctypes.data
        if np.shares_memory(c, d) and not same:
            raise ValueError(f"c overlaps d without being the same view ({c.strides=} {d.strides=}); pass c=d")
    dims = check_compiled_dims(compiled_dims)

    sfa_phys = sfb_phys = None
    if op_a.kind != "bf16":
        gran_a, gran_b = resolve_recipes(recipe, None, None)
        sfa_group = _group_sf(sfa, op_a, gran_a, True, False, "sfa")
        pairs = sfa_group.shape[0] // max(num_batches, 1)
        sfa_phys = np.ascontiguousarray(
            sfa_group.reshape(num_batches, pairs, m).transpose(1, 0, 2)).reshape(pairs, num_batches * m)
        sfb_phys = _group_sf(sfb, op_b, gran_b, False, False, "sfb")

    # D rows: a view when D is compact in [B, M, N] order, else a temporary copied back after the launch
    compact = dd.flags.c_contiguous
    d_rows = dd.reshape(num_batches * m, n) if compact else np.empty((num_batches * m, n), d.dtype)
    finish = None
    if not compact:
        def finish(dd=dd, tmp=d_rows):
            dd[...] = tmp.reshape(dd.shape)
    if c is not None:
        cc = np.transpose(c, d_perm)
        if compact and c.strides == d.strides and c.ctypes.data == d.ctypes.data:
            c_rows = d_rows
        else:
            c_rows = np.ascontiguousarray(cc).reshape(num_batches * m, n)
    starts = (np.arange(num_batches, dtype=np.int64) * m).astype(np.int32)
    rows = np.full(num_batches, m, np.int32)
    return MGroupedPlan(
        gemm_type="batched", a_kind=op_a.kind, a_phys=op_a.phys, sfa=sfa_phys, b=op_b, sfb=sfb_phys,
        d_rows=d_rows, out_kind=out_kind, n=n, k=k, group_start=starts, group_rows=rows, max_group_rows=m,
        model_m=m * num_batches if m and n and num_batches else 0, model_groups=max(num_batches, 1),
        compiled_dims=dims, with_accumulation=c is not None, c_rows=c_rows, finish=finish,
    )


def _run(plan: MGroupedPlan, reference: bool):
    if plan.k == 0:
        if not reference and runtime.get_dry_run():
            return None  # dry run: neither launch nor touch d
        # NOTES: upstream's early return: K == 0 gives D = C (or zeros)
        if plan.c_rows is None:
            plan.d_rows[...] = 0
        elif plan.c_rows is not plan.d_rows:
            np.copyto(plan.d_rows, plan.c_rows)
        if plan.finish is not None:
            plan.finish()
        return None
    return run_m_grouped(plan, reference)


def _check_fp8_output(d) -> None:
    if isinstance(d, (tuple, list)):
        raise TypeError("d=(D, SFD) requests FP8 output through the FP8Quantization epilogue, which deep_gemm "
                        "implements for the dense GEMMs but not yet for the batched ones; pass a bfloat16 or "
                        "float32 d")


def plan_fp8_bmm(a, b, d, c=None, recipe=(1, 1, 32), compiled_dims="nk") -> MGroupedPlan:
    _check_fp8_output(d)
    a_arr, sfa = _split_pair(a, "a")
    b_arr, sfb = _split_pair(b, "b")
    return _plan_bmm(a_arr, sfa, b_arr, sfb, d, c, ("fp8", "fp4"), recipe, compiled_dims)


@api_call
def fp8_bmm(a, b, d, c=None, recipe=(1, 1, 32), compiled_dims="nk"):
    """Batched FP8/FP4 GEMM: D[i] = C[i] + dequant(A[i]) @ dequant(B[i])^T.

    a = (A [B, M, K] K-major, sfa [B, M, ceil(K/gran_k)]), b = (B [B, N, K] either major, sfb [B, N, ...]),
    d bfloat16/float32 [B, M, N], c like d (or c=d). FP8 output (d given as (D, SFD)) is refused: the FP8
    epilogue exists for the dense GEMMs only, not yet for the batched kernels. Returns the kernel's GemmConfig.
    """
    return _run(plan_fp8_bmm(a, b, d, c, recipe, compiled_dims), False)


def plan_bf16_bmm(a, b, d, c=None, compiled_dims="nk") -> MGroupedPlan:
    return _plan_bmm(require_array(a, "a"), None, require_array(b, "b"), None, d, c, ("bf16",), None, compiled_dims)


@api_call
def bf16_bmm(a, b, d, c=None, compiled_dims="nk"):
    """Batched BF16 GEMM: D[i] = C[i] + A[i] @ B[i]^T; A bfloat16 [B, M, K], B [B, N, K], D [B, M, N]."""
    return _run(plan_bf16_bmm(a, b, d, c, compiled_dims), False)


def _einsum_perms(expr: object):
    if not isinstance(expr, str):
        raise TypeError(f"expr must be a str, got {type(expr).__name__}")
    key = expr.replace(" ", "")
    if key not in EINSUM_EXPRESSIONS:
        raise ValueError(f"unsupported einsum expression {expr!r}; supported: {sorted(EINSUM_EXPRESSIONS)}")
    return key, EINSUM_EXPRESSIONS[key]


def _permuted(x: np.ndarray, perm, name: str) -> np.ndarray:
    if x.ndim != 3:
        raise ValueError(f"{name} must be 3-D for einsum, got {x.shape=}")
    return np.transpose(x, perm)


def plan_einsum(expr, a, b, d, c=None, use_cublaslt=False) -> MGroupedPlan:
    _, (pa, pb, pd) = _einsum_perms(expr)
    if not isinstance(use_cublaslt, (bool, np.bool_)):
        raise TypeError(f"use_cublaslt must be a bool, got {type(use_cublaslt).__name__}: {use_cublaslt!r}")
    if use_cublaslt:
        raise ValueError("use_cublaslt=True is not supported (as on DeepGEMM-Ascend)")
    a_arr, b_arr = require_array(a, "a"), require_array(b, "b")
    _kind_of(a_arr, "a", ("bf16",))
    _kind_of(b_arr, "b", ("bf16",))
    a_p, b_p = _permuted(a_arr, pa, "a"), _permuted(b_arr, pb, "b")
    return _plan_bmm(a_p, None, b_p, None, d, c, ("bf16",), None, "nk", d_perm=pd)


@api_call
def einsum(expr, a, b, d, c=None, use_cublaslt=False):
    """BF16 einsum for DeepGEMM-Ascend's expressions, as a batched GEMM over h:
    ``bhr,hdr->bhd`` and ``bhd,hdr->bhr`` (a [b, h, .], b [h, d, r], d [b, h, .]) and the weight gradient
    ``bhd,bhr->hdr`` (a [b, h, d], b [b, h, r], d [h, d, r], K = b; pass c (or c=d) to accumulate). D bfloat16 or
    float32; c like d. Any other expression raises ValueError naming the supported ones.
    """
    return _run(plan_einsum(expr, a, b, d, c, use_cublaslt), False)


def plan_fp8_einsum(expr, a, b, d, c=None, recipe=(1, 1, 32)) -> MGroupedPlan:
    _, (pa, pb, pd) = _einsum_perms(expr)
    _check_fp8_output(d)
    a_arr, sfa = _split_pair(a, "a")
    b_arr, sfb = _split_pair(b, "b")
    _kind_of(a_arr, "a", ("fp8",))
    _kind_of(b_arr, "b", ("fp8",))
    # NOTES: scale factors follow their tensor's index order with the contracted axis cut to ceil(len / gran_k),
    # so the same permutation brings both to [batch, MN, K].
    return _plan_bmm(_permuted(a_arr, pa, "a"), _permuted(require_array(sfa, "a[1]"), pa, "a[1]"),
                     _permuted(b_arr, pb, "b"), _permuted(require_array(sfb, "b[1]"), pb, "b[1]"), d, c, ("fp8",),
                     recipe, "nk", d_perm=pd)


@api_call
def fp8_einsum(expr, a, b, d, c=None, recipe=(1, 1, 32)):
    """FP8 einsum, the expressions of ``einsum``: a = (x float8_e4m3fn, sf fp32), b likewise; each sf has its
    tensor's index order with the contracted axis of length ceil(len / gran_k) (e.g. ``bhr,hdr->bhd``: sfa
    [b, h, ceil(r/32)], sfb [h, d, ceil(r/32)]; ``bhd,bhr->hdr``: sfa [ceil(b/32), h, d])."""
    return _run(plan_fp8_einsum(expr, a, b, d, c, recipe), False)


__all__ = ["fp8_bmm", "bf16_bmm", "einsum", "fp8_einsum", "EINSUM_EXPRESSIONS", "GroupOperand"]
