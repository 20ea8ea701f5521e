"""Dense GEMM entry points with DeepGEMM-Ascend's names, argument order and defaults.

Each call validates everything, returns early on empty problems, converts scale factors to the required
int16 UE8M0 layout, and dispatches to a JIT kernel; nothing is written to ``d`` before every check has passed.
The nn/tn/tt forms are thin wrappers that transpose into the nt form, as upstream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import runtime
from ..epilogue import Epilogue, check_epilogue, is_fp8_output
from ..heuristics.config import GemmConfig
from ..utils.layout import transform_sf_into_required_layout
from ..utils.math import per_token_cast_to_fp8
from .checks import (
    Operand,
    check_alpha,
    check_arch_supports,
    check_compiled_dims,
    check_dims,
    check_no_alias,
    check_output,
    make_operand,
    rebalance_scales,
    require_array,
    resolve_recipes,
    transposed,
)
from .guard import api_call, protect


def _split_pair(x: object, name: str) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise TypeError(f"{name} must be a (tensor, scale_factors) pair, got {type(x).__name__}")
    return require_array(x[0], f"{name}[0]"), require_array(x[1], f"{name}[1]")


def _required_sf(sf: np.ndarray, op: Operand, gran: tuple[int, int], is_sfa: bool, disable_ue8m0_cast: bool):
    """The scale factors of ``op`` in the kernel's physical form: C-contiguous int16 [ceil(K/64), MN]."""
    gran_mn, gran_k = gran
    recipe = (gran_mn, 1, gran_k) if is_sfa else (1, gran_mn, gran_k)
    sf_name = "sfa" if is_sfa else "sfb"
    try:
        out = transform_sf_into_required_layout(
            sf, op.mn, op.k, recipe, is_sfa=is_sfa, disable_ue8m0_cast=disable_ue8m0_cast
        )
    except (ValueError, TypeError) as e:
        raise type(e)(f"{sf_name}: {e}") from None
    return np.ascontiguousarray(out.T)


@dataclass(frozen=True)
class Fp8Fp4Problem:
    """A checked FP8/FP4 GEMM call: operands, output, and the scale factors in the kernels' physical form."""

    op_a: Operand
    op_b: Operand
    sfa: np.ndarray  # C-contiguous int16 [ceil(K/64), M]
    sfb: np.ndarray  # C-contiguous int16 [ceil(K/64), N]
    d: np.ndarray
    c: np.ndarray | None
    out_kind: str

    @property
    def m(self) -> int:
        return self.op_a.mn

    @property
    def n(self) -> int:
        return self.op_b.mn

    @property
    def k(self) -> int:
        return self.op_a.k


def check_fp8_fp4_problem(a, b, d, c, recipe, recipe_a, recipe_b, disable_ue8m0_cast,
                          fp8_out: bool = False) -> Fp8Fp4Problem:
    """Every check of an FP8/FP4 GEMM call (shared with the numpy reference GEMMs); writes nothing."""
    # Operand checks
    a_arr, sfa = _split_pair(a, "a")
    b_arr, sfb = _split_pair(b, "b")
    op_a = make_operand(a_arr, "a", ("fp8", "fp4"))
    op_b = make_operand(b_arr, "b", ("fp8", "fp4"))
    if (op_a.kind, op_b.kind) == ("fp4", "fp8"):
        raise TypeError(
            f"fp4 A with fp8 B is not supported (as upstream): {a_arr.dtype=} {b_arr.dtype=}; "
            "pass fp8 A with fp4 B instead"
        )
    if op_a.k != op_b.k:
        raise ValueError(f"A and B disagree on K: {op_a.k=} {op_b.k=} (a.shape={a_arr.shape}, b.shape={b_arr.shape})")
    check_dims(m=op_a.mn, n=op_b.mn, k=op_a.k)

    # Output and recipes
    d, c, out_kind = check_output(d, op_a.mn, op_b.mn, c, fp8_out)
    check_no_alias(d, a=a_arr, b=b_arr, sfa=sfa, sfb=sfb)
    if not isinstance(disable_ue8m0_cast, bool):
        raise TypeError(f"disable_ue8m0_cast must be a bool, got {disable_ue8m0_cast!r}")
    gran_a, gran_b = resolve_recipes(recipe, recipe_a, recipe_b)

    # Scale factors -> required layout (validates sizes and values; allocates, never writes the inputs)
    sfa_phys = _required_sf(sfa, op_a, gran_a, True, disable_ue8m0_cast)
    sfb_phys = _required_sf(sfb, op_b, gran_b, False, disable_ue8m0_cast)
    return Fp8Fp4Problem(op_a, op_b, sfa_phys, sfb_phys, d, c, out_kind)


def _max_alpha_shift(alpha: float) -> int:
    """Largest s with alpha * 2^s still a finite fp32 (alpha is applied in fp32 by the epilogue)."""
    if alpha == 0.0:
        return 1 << 16
    return max(0, 127 - math.frexp(abs(alpha))[1])


def _early_return(d: np.ndarray, c: np.ndarray | None, m: int, n: int, k: int) -> bool:
    """Upstream's early returns: nothing to do for an empty D; with K == 0, D = C or zeros."""
    if m == 0 or n == 0:
        return True
    if k == 0:
        if not runtime.get_dry_run():
            if c is None:
                d[...] = 0
            elif c is not d:
                d[...] = c
        return True
    return False


def _prepare_accumulation(d: np.ndarray, c: np.ndarray | None) -> bool:
    """Copy C into D (the kernels accumulate into D, as upstream's host does before launch)."""
    if c is None:
        return False
    if c is not d and not runtime.get_dry_run():
        np.copyto(d, c)
    return True


def _out_view(d: np.ndarray, out_kind: str) -> np.ndarray:
    return d.view(np.uint16) if out_kind == "bf16" else d.view(np.uint8) if out_kind == "fp8" else d


def _check_epilogue(epilogue, alpha, d, c, m: int, n: int, **inputs) -> tuple[object, np.ndarray | None]:
    """(alpha, sfd): the epilogue's checks (deep_gemm.epilogue.check_epilogue), sfd against every input."""
    alpha, sfd = check_epilogue(epilogue, alpha, d, c, m, n)
    if sfd is not None:
        for name, x in inputs.items():
            if x is not None and np.shares_memory(sfd, x):
                raise ValueError(f"sfd shares memory with {name}; the output must not alias an input")
    return alpha, sfd


def _fp8_out_early_return(d: np.ndarray, sfd: np.ndarray, m: int, n: int, k: int) -> bool:
    """FP8 output of an empty product (K == 0): D = 0 quantized as the per-token cast quantizes zeros."""
    if m == 0 or n == 0:
        return True
    if k == 0:
        if not runtime.get_dry_run():
            _, sf = per_token_cast_to_fp8(np.zeros((1, 64), np.float32), use_ue8m0=True, gran_k=32)
            exp = int(sf.view(np.uint32)[0, 0] >> 23)
            d.view(np.uint8)[...] = 0
            sfd.view(np.uint16)[...] = exp | (exp << 8)
        return True
    return False


@api_call
def fp8_fp4_gemm_nt(
    a: tuple[np.ndarray, np.ndarray],
    b: tuple[np.ndarray, np.ndarray],
    d: np.ndarray,
    c: np.ndarray | None = None,
    recipe: tuple[int, int, int] | None = None,
    recipe_a: tuple[int, int] | None = None,
    recipe_b: tuple[int, int] | None = None,
    compiled_dims: str = "nk",
    disable_ue8m0_cast: bool = False,
    alpha: float | None = None,
    epilogue: Epilogue | None = None,
) -> GemmConfig | None:
    """D = C + alpha * dequant(A) @ dequant(B)^T with fp32 accumulation, on the AI-core stand-in.

    a = (A, sfa): A is float8_e4m3fn [M, K] or packed FP4 int8 [M, K/2] (K-major) / MN-major views;
    b = (B, sfb) likewise [N, K]. Scale factors: fp32 [MN, ceil(K/gran_k)] exact powers of two, or int16 in the
    Ascend layout [MN, ceil(K/64)] with strides (1, MN). recipe defaults to MX (1, 1, 32); the CUDA DeepGEMM
    recipes (1, 128, 128) and (1, 1, 128) are accepted with fp32 scales. d: bfloat16 or float32 [M, N] with
    unit-stride rows; c: like d, or c=d to accumulate in place. Operand pairs: fp8 x fp8, fp4 x fp4, fp8 x fp4.
    epilogue: deep_gemm.epilogue.Identity(), Alpha(alpha) (excludes ``alpha``) or FP8Quantization(sfd): d is
    then float8_e4m3fn and sfd int16 [M, N/64] with strides (1, M) receives one UE8M0 scale per row per 32
    columns (N % 64 == 0, no c, no alpha), as deep_gemm.utils.per_token_cast_to_fp8 of the fp32 result.
    Returns the kernel's GemmConfig (None on an early return). Reads get_num_ai_cores(), get_npu_arch(),
    dry-run mode; env DG_JIT_CACHE_DIR, DG_JIT_DEBUG, DG_PRINT_CONFIGS, DG_SYNC_CHECK.
    """
    fp8_out = is_fp8_output(epilogue)
    p = check_fp8_fp4_problem(a, b, d, c, recipe, recipe_a, recipe_b, disable_ue8m0_cast, fp8_out)
    alpha, sfd = _check_epilogue(epilogue, alpha, p.d, p.c, p.m, p.n, a=p.op_a.array, b=p.op_b.array)
    alpha_f = check_alpha(alpha)
    dims = check_compiled_dims(compiled_dims)
    op_a, op_b, d, c, m, n, k = p.op_a, p.op_b, p.d, p.c, p.m, p.n, p.k
    check_arch_supports(a=op_a.kind, b=op_b.kind)

    # Scales as the chip applies them: the chip scales a block's product by 2^(ea + eb), the stand-in each operand;
    # exponents move between A, B and alpha (exact powers of two) until every fp32 step is exact (or Inf as on chip)
    # NOTES: FP8 output quantizes the fp32 tile itself (there is no alpha), so nothing may move onto alpha.
    max_shift = 0 if fp8_out else _max_alpha_shift(alpha_f)
    sfa, sfb, out_shift, l0_bf16 = rebalance_scales(p.sfa, p.sfb, k, op_a.kind, op_b.kind, max_shift)
    alpha_f = math.ldexp(alpha_f, out_shift)

    # Early return
    protect(d, sfd, work=2.0 * m * n * k)
    if _fp8_out_early_return(d, sfd, m, n, k) if fp8_out else _early_return(d, c, m, n, k):
        return None

    # Dispatch
    from ..kernels.fp8_gemm import launch_fp8_gemm

    with_acc = _prepare_accumulation(d, c)
    return launch_fp8_gemm(
        op_a.gm, op_a.major, op_a.kind, sfa, op_b.gm, op_b.major, op_b.kind, sfb,
        _out_view(d, p.out_kind), m, n, k,
        with_accumulation=with_acc, alpha=alpha_f, compiled_dims=dims, sfd=sfd, l0_bf16=l0_bf16,
    )


@api_call
def fp8_fp4_gemm_nn(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="nk",
                    disable_ue8m0_cast=False, alpha=None, epilogue=None):
    """As ``fp8_fp4_gemm_nt`` with B given as [K, N] and its scale factors as [ceil(K/gran_k), N]."""
    b_arr, sfb = _split_pair(b, "b")
    return fp8_fp4_gemm_nt(a, (b_arr.T, transposed(sfb)), d, c, recipe, recipe_a, recipe_b, compiled_dims,
                           disable_ue8m0_cast, alpha, epilogue)


@api_call
def fp8_fp4_gemm_tn(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="mn",
                    disable_ue8m0_cast=False, alpha=None, epilogue=None):
    """As ``fp8_fp4_gemm_nt`` with A given as [K, M] and B as [K, N] (scale factors transposed likewise)."""
    a_arr, sfa = _split_pair(a, "a")
    b_arr, sfb = _split_pair(b, "b")
    return fp8_fp4_gemm_nt((a_arr.T, transposed(sfa)), (b_arr.T, transposed(sfb)), d, c, recipe, recipe_a,
                           recipe_b, compiled_dims, disable_ue8m0_cast, alpha, epilogue)


@api_call
def fp8_fp4_gemm_tt(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="mn",
                    disable_ue8m0_cast=False, alpha=None, epilogue=None):
    """As ``fp8_fp4_gemm_nt`` with A given as [K, M] (its scale factors as [ceil(K/gran_k), M])."""
    a_arr, sfa = _split_pair(a, "a")
    return fp8_fp4_gemm_nt((a_arr.T, transposed(sfa)), b, d, c, recipe, recipe_a, recipe_b, compiled_dims,
                           disable_ue8m0_cast, alpha, epilogue)


def _check_head_splits(head_splits: object) -> tuple[int, int, int]:
    if not isinstance(head_splits, (tuple, list)) or len(head_splits) != 3:
        raise TypeError(f"head_splits must be a (left, mid, right) tuple of ints, got {head_splits!r}")
    for name, v in zip(("left", "mid", "right"), head_splits, strict=True):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"head_splits {name}={v!r} must be a non-negative int; head_splits={tuple(head_splits)}")
    left, mid, right = (int(v) for v in head_splits)
    if left + right == 0:
        raise ValueError(f"head_splits={tuple(head_splits)}: left + right must be > 0")
    return left, mid, right


def _head_runs(n: int, left: int, mid: int, right: int) -> list[tuple[int, int, int]]:
    """(first GEMM column, first D column, width) of every run of GEMM columns that lands contiguously in D: head h's
    left part at D column h * (left + mid + right), its right part after the mid columns; a head's right part and the
    next head's left part are one run (adjacent in both)."""
    width, out_width = left + right, left + mid + right
    runs: list[list[int]] = []
    for h in range(n // width):
        for g0, d0, w in ((h * width, h * out_width, left), (h * width + left, h * out_width + left + mid, right)):
            if w == 0:
                continue
            if runs and runs[-1][0] + runs[-1][2] == g0 and runs[-1][1] + runs[-1][2] == d0:
                runs[-1][2] += w
            else:
                runs.append([g0, d0, w])
    return [(g0, d0, w) for g0, d0, w in runs]


@api_call
def fp8_gemm_nt_skip_head_mid(a, b, d, head_splits, recipe=None, compiled_dims="nk", disable_ue8m0_cast=False):
    """CUDA DeepGEMM's FP8 GEMM with a per-head column gap: the GEMM output [M, N] (= dequant(A) @ dequant(B)^T) is cut
    into heads of left + right columns, and head h is written to D[:, h * W : (h + 1) * W], W = left + mid + right, as
    [left | mid columns untouched | right]. a, b, recipe and scales as ``fp8_fp4_gemm_nt``; d bfloat16 or float32
    [M, N + N / (left + right) * mid] with unit-stride rows; N % (left + right) == 0. Runs the dense kernel once per
    run of columns that is contiguous in D (one more than the head count at most), writing through column views of D
    (no copy of D). Returns the kernel's GemmConfig of the widest run (None when there is nothing to compute)."""
    # Shape checks
    left, mid, right = _check_head_splits(head_splits)
    a_arr, _ = _split_pair(a, "a")
    b_arr, _ = _split_pair(b, "b")
    op_a = make_operand(a_arr, "a", ("fp8", "fp4"))
    op_b = make_operand(b_arr, "b", ("fp8", "fp4"))
    m, n = op_a.mn, op_b.mn
    if n % (left + right):
        raise ValueError(f"N={n} must be divisible by left + right = {left + right} (head_splits={(left, mid, right)})")
    n_out = n + n // (left + right) * mid
    d, _, out_kind = check_output(d, m, n_out, None)
    # NOTES: every check of the dense call (operands, scales, exactness) runs once, on the GEMM's own columns of D.
    p = check_fp8_fp4_problem(a, b, d[:, :n], None, recipe, None, None, disable_ue8m0_cast)
    check_no_alias(d, a=p.op_a.array, b=p.op_b.array)
    dims = check_compiled_dims(compiled_dims)
    check_arch_supports(a=op_a.kind, b=op_b.kind)
    k = p.k
    sfa, sfb, out_shift, l0_bf16 = rebalance_scales(p.sfa, p.sfb, k, op_a.kind, op_b.kind, _max_alpha_shift(1.0))
    runs = _head_runs(n, left, mid, right)
    packed_mn_b = op_b.kind == "fp4" and op_b.major == "mn"
    if packed_mn_b and any(g0 % 2 or w % 2 for g0, _, w in runs):
        raise ValueError(f"packed FP4 B stored MN-major packs two N columns per byte: head_splits={(left, mid, right)} "
                         "must cut it at even columns (or pass B K-major)")

    # Early return
    protect(d, work=2.0 * m * n * k)
    if m == 0 or n == 0:
        return None
    if k == 0:
        if not runtime.get_dry_run():
            for _, d0, w in runs:
                d[:, d0:d0 + w] = 0
        return None

    # Dispatch: one dense launch per run, B's rows and D's columns of the run
    from ..kernels.fp8_gemm import launch_fp8_gemm

    gm_b, config, widest = p.op_b.gm, None, 0
    for g0, d0, w in runs:
        if op_b.major == "k":
            b_run = gm_b[g0:g0 + w]
        else:
            b_run = gm_b[:, g0 // 2:(g0 + w) // 2] if packed_mn_b else gm_b[:, g0:g0 + w]
        run_config = launch_fp8_gemm(
            p.op_a.gm, op_a.major, op_a.kind, sfa, b_run, op_b.major, op_b.kind, sfb[:, g0:g0 + w],
            _out_view(d[:, d0:d0 + w], out_kind), m, w, k,
            with_accumulation=False, alpha=math.ldexp(1.0, out_shift), compiled_dims=dims, l0_bf16=l0_bf16,
        )
        if w > widest:
            config, widest = run_config, w
    return config


# DeepGEMM's aliases
fp8_gemm_nt = fp8_fp4_gemm_nt
fp8_gemm_nn = fp8_fp4_gemm_nn
fp8_gemm_tn = fp8_fp4_gemm_tn
fp8_gemm_tt = fp8_fp4_gemm_tt


def check_bf16_problem(a, b, d, c, fp8_out: bool = False) -> tuple[Operand, Operand, np.ndarray, np.ndarray | None,
                                                                   str]:
    """Every check of a BF16 GEMM call (shared with the numpy reference GEMMs); writes nothing."""
    op_a = make_operand(a, "a", ("bf16",))
    op_b = make_operand(b, "b", ("bf16",))
    if op_a.k != op_b.k:
        raise ValueError(f"A and B disagree on K: {op_a.k=} {op_b.k=} (a.shape={a.shape}, b.shape={b.shape})")
    check_dims(m=op_a.mn, n=op_b.mn, k=op_a.k)
    d, c, out_kind = check_output(d, op_a.mn, op_b.mn, c, fp8_out)
    check_no_alias(d, a=op_a.array, b=op_b.array)
    return op_a, op_b, d, c, out_kind


@api_call
def bf16_gemm_nt(
    a: np.ndarray,
    b: np.ndarray,
    d: np.ndarray,
    c: np.ndarray | None = None,
    compiled_dims: str = "nk",
    alpha: float | None = None,
    epilogue: Epilogue | None = None,
) -> GemmConfig | None:
    """D = C + alpha * A @ B^T with fp32 accumulation. A: bfloat16 [M, K], B: bfloat16 [N, K] (either major);
    d: bfloat16 or float32 [M, N]; c like d (or c=d); epilogue as for ``fp8_fp4_gemm_nt`` (FP8Quantization: d
    float8_e4m3fn plus sfd). Returns the kernel's GemmConfig (None on an early return)."""
    fp8_out = is_fp8_output(epilogue)
    op_a, op_b, d, c, out_kind = check_bf16_problem(a, b, d, c, fp8_out)
    m, n, k = op_a.mn, op_b.mn, op_a.k
    alpha, sfd = _check_epilogue(epilogue, alpha, d, c, m, n, a=op_a.array, b=op_b.array)
    alpha_f = check_alpha(alpha)
    dims = check_compiled_dims(compiled_dims)

    protect(d, sfd, work=2.0 * m * n * k)
    if _fp8_out_early_return(d, sfd, m, n, k) if fp8_out else _early_return(d, c, m, n, k):
        return None

    from ..kernels.bf16_gemm import launch_bf16_gemm

    with_acc = _prepare_accumulation(d, c)
    return launch_bf16_gemm(
        op_a.gm, op_a.major, op_b.gm, op_b.major, _out_view(d, out_kind), m, n, k,
        with_accumulation=with_acc, alpha=alpha_f, compiled_dims=dims, sfd=sfd,
    )


@api_call
def bf16_gemm_nn(a, b, d, c=None, compiled_dims="nk", alpha=None, epilogue=None):
    """As ``bf16_gemm_nt`` with B given as [K, N]."""
    return bf16_gemm_nt(a, transposed(require_array(b, "b")), d, c, compiled_dims, alpha, epilogue)


@api_call
def bf16_gemm_tn(a, b, d, c=None, compiled_dims="mn", alpha=None, epilogue=None):
    """As ``bf16_gemm_nt`` with A given as [K, M] and B as [K, N]."""
    return bf16_gemm_nt(transposed(require_array(a, "a")), transposed(require_array(b, "b")), d, c, compiled_dims,
                        alpha, epilogue)


@api_call
def bf16_gemm_tt(a, b, d, c=None, compiled_dims="mn", alpha=None, epilogue=None):
    """As ``bf16_gemm_nt`` with A given as [K, M]."""
    return bf16_gemm_nt(transposed(require_array(a, "a")), b, d, c, compiled_dims, alpha, epilogue)
