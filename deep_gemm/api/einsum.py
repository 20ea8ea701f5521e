"""Batched GEMMs and einsum with DeepGEMM-Ascend's names: ``fp8_bmm``, ``bf16_bmm``, ``einsum``, ``fp8_einsum``.

All run on the M-grouped schedule of the GEMM kernels (one launch; batch b is group b, owning rows
[b * M, (b + 1) * M) of A and D and its own B). einsum accepts DeepGEMM-Ascend's three expressions and maps each
onto a batched GEMM over h; operands are permuted into [batch, MN, K] copies when their layout needs it. CUDA
DeepGEMM's fourth, ``bmk,bnk->mn`` (a sum over the batch), runs the dense schedule once per batch, accumulating
into one fp32 [M, N] (as the K-grouped calls do per group).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import runtime
from ..epilogue import FP8Quantization, is_fp8_output
from ..utils.formats import bf16_bits_to_fp32, fp32_to_bf16_bits
from .checks import check_accumulator, check_compiled_dims, check_dims, check_no_alias, require_array, resolve_recipes
from .grouped import (
    GroupOperand,
    MGroupedPlan,
    _check_out,
    _group_sf,
    _kind_of,
    _split_pair,
    _values,
    check_grouped_out,
    check_stacked_pair,
    make_group_operand,
    run_m_grouped,
)
from .guard import api_call, protect

# expression -> (A permutation to [batch, M, K], B permutation to [batch, N, K], D permutation to [batch, M, N])
EINSUM_EXPRESSIONS = {
    "bhr,hdr->bhd": ((1, 0, 2), (0, 1, 2), (1, 0, 2)),
    "bhd,hdr->bhr": ((1, 0, 2), (0, 2, 1), (1, 0, 2)),
    "bhd,bhr->hdr": ((1, 2, 0), (1, 2, 0), (0, 1, 2)),
}
# CUDA DeepGEMM's batch reduction: D[m, n] (+)= sum_b A[b] @ B[b]^T (bf16 einsum only, as upstream)
BATCH_REDUCE_EXPRESSION = "bmk,bnk->mn"


def _plan_bmm(a_arr, sfa, b_arr, sfb, d, c, kinds, recipe, compiled_dims, d_perm=(0, 1, 2),
              epilogue=None) -> MGroupedPlan:
    """Checks of a batched GEMM A [B, M, K] x B [B, N, K] -> D (given as ``d`` with D = d.transpose(d_perm)
    [B, M, N]); writes nothing. A must be K-major; non-compact inputs are copied, a non-compact D goes through a
    temporary that ``finish`` copies back. FP8 output (epilogue=FP8Quantization(sfd)): D float8_e4m3fn [B, M, N]
    in batch order, sfd one MN-major [M, N/64] block per batch (grouped.check_grouped_fp8_out), no C."""
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
    if is_fp8_output(epilogue):
        if tuple(d_perm) != (0, 1, 2):
            raise ValueError("FP8 output (epilogue=FP8Quantization) needs D in batch order [batch, M, N] (bmm, "
                             "einsum 'bhd,bhr->hdr'); this expression writes D in another order")
        if c is not None:
            raise ValueError("FP8 output (epilogue=FP8Quantization) takes no c: the kernel cannot accumulate into "
                             f"FP8 codes (got c with shape {getattr(c, 'shape', None)})")
    d, out_kind, sfd = check_grouped_out(epilogue, d, tuple(d_logical_shape[i] for i in inv), a=a_arr, b=b_arr,
                                         sfa=sfa, sfb=sfb)
    check_no_alias(d, a=a_arr, b=b_arr, sfa=sfa, sfb=sfb)
    dd = np.transpose(d, d_perm)
    c_rows = None
    if c is not None:
        c, same = check_accumulator(c, d)
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
        compiled_dims=dims, with_accumulation=c is not None, c_rows=c_rows, finish=finish, sfd=sfd,
        sfd_per_group=True,
    )


def _run(plan, reference: bool):
    if isinstance(plan, BatchReducePlan):
        return _run_batch_reduce(plan, reference)
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


def _fp8_output(d, epilogue):
    """(D, epilogue): DeepGEMM-Ascend's d=(D, SFD) pair is FP8 output, the same as epilogue=FP8Quantization(SFD)."""
    if isinstance(d, (tuple, list)):
        if len(d) != 2:
            raise TypeError(f"d must be an array or a (D, SFD) pair for FP8 output, got a {type(d).__name__} of "
                            f"{len(d)}")
        if epilogue is not None:
            raise ValueError(f"d=(D, SFD) already requests FP8 output; do not pass epilogue={epilogue!r} too")
        return d[0], FP8Quantization(d[1])
    return d, epilogue


def plan_fp8_bmm(a, b, d, c=None, recipe=(1, 1, 32), compiled_dims="nk", epilogue=None) -> MGroupedPlan:
    d, epilogue = _fp8_output(d, epilogue)
    a_arr, sfa = _split_pair(a, "a")
    b_arr, sfb = _split_pair(b, "b")
    return _plan_bmm(a_arr, sfa, b_arr, sfb, d, c, ("fp8", "fp4"), recipe, compiled_dims, epilogue=epilogue)


@api_call
def fp8_bmm(a, b, d, c=None, recipe=(1, 1, 32), compiled_dims="nk", epilogue=None):
    """Batched FP8/FP4 GEMM: D[i] = C[i] + dequant(A[i]) @ dequant(B[i])^T.

    a = (A [B, M, K] K-major, sfa [B, M, ceil(K/gran_k)]), b = (B [B, N, K] either major, sfb [B, N, ...]),
    d bfloat16/float32 [B, M, N], c like d (or c=d). FP8 output: d = (D float8_e4m3fn [B, M, N], SFD) or
    epilogue=FP8Quantization(SFD), SFD int16 [M, B * N/64] with strides (1, M) (DeepGEMM-Ascend's) or [B, M, N/64]
    with strides (M * N/64, 1, M), no c; the codes and scales are per_token_cast_to_fp8 of each batch's fp32 result.
    Returns the kernel's GemmConfig.
    """
    return _run(plan_fp8_bmm(a, b, d, c, recipe, compiled_dims, epilogue), False)


def plan_bf16_bmm(a, b, d, c=None, compiled_dims="nk", epilogue=None) -> MGroupedPlan:
    d, epilogue = _fp8_output(d, epilogue)
    return _plan_bmm(require_array(a, "a"), None, require_array(b, "b"), None, d, c, ("bf16",), None, compiled_dims,
                     epilogue=epilogue)


@api_call
def bf16_bmm(a, b, d, c=None, compiled_dims="nk", epilogue=None):
    """Batched BF16 GEMM: D[i] = C[i] + A[i] @ B[i]^T; A bfloat16 [B, M, K], B [B, N, K], D [B, M, N]; FP8 output
    as ``fp8_bmm``."""
    return _run(plan_bf16_bmm(a, b, d, c, compiled_dims, epilogue), False)


def _einsum_perms(expr: object, *extra: str):
    """(expression, permutations) of a batched-GEMM expression; ``extra`` are the other expressions the caller takes
    (named in the error)."""
    if not isinstance(expr, str):
        raise TypeError(f"expr must be a str, got {type(expr).__name__}")
    key = expr.replace(" ", "")
    if key not in EINSUM_EXPRESSIONS:
        hint = "" if extra or key != BATCH_REDUCE_EXPRESSION else " (bmk,bnk->mn is a bf16 einsum only, as upstream)"
        raise ValueError(f"unsupported einsum expression {expr!r}; supported: "
                         f"{sorted(EINSUM_EXPRESSIONS) + list(extra)}{hint}")
    return key, EINSUM_EXPRESSIONS[key]


def _permuted(x: np.ndarray, perm, name: str) -> np.ndarray:
    if x.ndim != 3:
        raise ValueError(f"{name} must be 3-D for einsum, got {x.shape=}")
    return np.transpose(x, perm)


@dataclass
class BatchReducePlan:
    """A checked ``bmk,bnk->mn`` call: D [M, N] = C + sum_b A[b] @ B[b]^T, fp32 accumulation over b in order."""

    a: GroupOperand  # [B, M, K]
    b: GroupOperand  # [B, N, K]
    d: np.ndarray  # bfloat16 or float32 [M, N]
    out_kind: str
    c: np.ndarray | None


def _plan_batch_reduce(a, b, d, c) -> BatchReducePlan:
    a_arr, b_arr = require_array(a, "a"), require_array(b, "b")
    for name, x in (("a", a_arr), ("b", b_arr)):
        _kind_of(x, name, ("bf16",))
        if x.ndim != 3:
            raise ValueError(f"{name} must be 3-D for einsum {BATCH_REDUCE_EXPRESSION!r}, got {x.shape=}")
    op_a, op_b = make_group_operand(a_arr, "a", ("bf16",)), make_group_operand(b_arr, "b", ("bf16",))
    num_batches, m, k, n = check_stacked_pair(op_a, op_b, a_arr, b_arr, "the batch count b")
    check_dims(m=m, n=n, k=k)
    d, out_kind = _check_out(d, (m, n))
    check_no_alias(d, a=a_arr, b=b_arr)
    if c is not None:
        c, same = check_accumulator(c, d)
        if same:
            c = d
    return BatchReducePlan(op_a, op_b, d, out_kind, c)


def _run_batch_reduce(plan: BatchReducePlan, reference: bool):
    """D = C + sum_b A[b] @ B[b]^T: the dense kernel per batch accumulating into fp32 (D itself when it is fp32,
    else a workspace rounded once into D), or float64 numpy."""
    d, num_batches = plan.d, plan.a.num_groups
    m, n, k = plan.a.mn, plan.b.mn, plan.a.k
    if m == 0 or n == 0:
        return None
    c32 = None
    if plan.c is not None:
        c32 = bf16_bits_to_fp32(plan.c.view(np.uint16)) if plan.out_kind == "bf16" else plan.c

    if reference:
        acc = np.zeros((m, n)) if c32 is None else c32.astype(np.float64)
        for i in range(num_batches):
            acc += (_values(plan.a.group_phys(i), "bf16", plan.a.major, m, k)
                    @ _values(plan.b.group_phys(i), "bf16", plan.b.major, n, k).T)
        _store(d, plan.out_kind, acc.astype(np.float32))
        return None

    from ..kernels.bf16_gemm import launch_bf16_gemm

    live = num_batches if k else 0
    if runtime.get_dry_run():
        if live:
            return launch_bf16_gemm(plan.a.group_phys(0), plan.a.major, plan.b.group_phys(0), plan.b.major,
                                    np.empty((m, n), np.float32), m, n, k, with_accumulation=True, alpha=1.0,
                                    compiled_dims="nk")
        return None
    protect(d, work=2.0 * m * n * k * num_batches)
    # NOTES: the kernels accumulate into D as FixPipe does (fp32 + fp32 tile); a bf16 D goes through an fp32
    # workspace rounded once at the end (as upstream's zeroed fp32 workspace), so bf16 is never re-rounded per batch.
    acc = d if plan.out_kind == "fp32" else np.empty((m, n), np.float32)
    if c32 is None:
        acc[...] = 0
    elif c32 is not acc:
        np.copyto(acc, c32)
    config = None
    for i in range(live):
        config = launch_bf16_gemm(plan.a.group_phys(i), plan.a.major, plan.b.group_phys(i), plan.b.major, acc, m, n,
                                  k, with_accumulation=True, alpha=1.0, compiled_dims="nk")
    if acc is not d:
        _store(d, plan.out_kind, acc)
    return config


def _store(d: np.ndarray, out_kind: str, acc32: np.ndarray) -> None:
    if out_kind == "bf16":
        d.view(np.uint16)[...] = fp32_to_bf16_bits(np.ascontiguousarray(acc32))
    else:
        d[...] = acc32


def plan_einsum(expr, a, b, d, c=None, use_cublaslt=False, epilogue=None) -> MGroupedPlan | BatchReducePlan:
    if not isinstance(use_cublaslt, (bool, np.bool_)):
        raise TypeError(f"use_cublaslt must be a bool, got {type(use_cublaslt).__name__}: {use_cublaslt!r}")
    if use_cublaslt:
        raise ValueError("use_cublaslt=True is not supported (as on DeepGEMM-Ascend)")
    d, epilogue = _fp8_output(d, epilogue)
    if isinstance(expr, str) and expr.replace(" ", "") == BATCH_REDUCE_EXPRESSION:
        if epilogue is not None and not type(epilogue).__name__ == "Identity":
            raise ValueError(f"einsum {BATCH_REDUCE_EXPRESSION!r} takes no epilogue (it sums over the batch in "
                             f"fp32), got epilogue={epilogue!r}")
        return _plan_batch_reduce(a, b, d, c)
    _, (pa, pb, pd) = _einsum_perms(expr, BATCH_REDUCE_EXPRESSION)
    a_arr, b_arr = require_array(a, "a"), require_array(b, "b")
    _kind_of(a_arr, "a", ("bf16",))
    _kind_of(b_arr, "b", ("bf16",))
    a_p, b_p = _permuted(a_arr, pa, "a"), _permuted(b_arr, pb, "b")
    return _plan_bmm(a_p, None, b_p, None, d, c, ("bf16",), None, "nk", d_perm=pd, epilogue=epilogue)


@api_call
def einsum(expr, a, b, d, c=None, use_cublaslt=False, epilogue=None):
    """BF16 einsum for DeepGEMM-Ascend's expressions, as a batched GEMM over h:
    ``bhr,hdr->bhd`` and ``bhd,hdr->bhr`` (a [b, h, .], b [h, d, r], d [b, h, .]) and the weight gradient
    ``bhd,bhr->hdr`` (a [b, h, d], b [b, h, r], d [h, d, r], K = b; pass c (or c=d) to accumulate), and CUDA
    DeepGEMM's ``bmk,bnk->mn`` (a [b, m, k], b [b, n, k], d [m, n] = c + sum over b of a[b] @ b[b]^T, accumulated in
    fp32 over b in order: c=d accumulates in place; a bf16 d is rounded once). D bfloat16 or float32; c like d.
    Any other expression raises ValueError naming the supported ones. FP8 output (epilogue=FP8Quantization(sfd) or
    d=(D, SFD), as ``fp8_bmm``, batch h) for ``bhd,bhr->hdr``, whose D is in batch order.
    """
    return _run(plan_einsum(expr, a, b, d, c, use_cublaslt, epilogue), False)


def plan_fp8_einsum(expr, a, b, d, c=None, recipe=(1, 1, 32), epilogue=None) -> MGroupedPlan:
    _, (pa, pb, pd) = _einsum_perms(expr)
    d, epilogue = _fp8_output(d, epilogue)
    a_arr, sfa = _split_pair(a, "a")
    b_arr, sfb = _split_pair(b, "b")
    _kind_of(a_arr, "a", ("fp8",))
    _kind_of(b_arr, "b", ("fp8",))
    # NOTES: scale factors follow their tensor's index order with the contracted axis cut to ceil(len / gran_k),
    # so the same permutation brings both to [batch, MN, K].
    return _plan_bmm(_permuted(a_arr, pa, "a"), _permuted(require_array(sfa, "a[1]"), pa, "a[1]"),
                     _permuted(b_arr, pb, "b"), _permuted(require_array(sfb, "b[1]"), pb, "b[1]"), d, c, ("fp8",),
                     recipe, "nk", d_perm=pd, epilogue=epilogue)


@api_call
def fp8_einsum(expr, a, b, d, c=None, recipe=(1, 1, 32), epilogue=None):
    """FP8 einsum, the expressions of ``einsum``: a = (x float8_e4m3fn, sf fp32), b likewise; each sf has its
    tensor's index order with the contracted axis of length ceil(len / gran_k) (e.g. ``bhr,hdr->bhd``: sfa
    [b, h, ceil(r/32)], sfb [h, d, ceil(r/32)]; ``bhd,bhr->hdr``: sfa [ceil(b/32), h, d]). FP8 output as
    ``einsum``."""
    return _run(plan_fp8_einsum(expr, a, b, d, c, recipe, epilogue), False)


__all__ = ["fp8_bmm", "bf16_bmm", "einsum", "fp8_einsum", "EINSUM_EXPRESSIONS", "BATCH_REDUCE_EXPRESSION",
           "GroupOperand"]
