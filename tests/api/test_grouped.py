"""The grouped GEMMs end to end: M-grouped contiguous (psum and per-row layouts) and masked, K-grouped, bmm and
einsum against a float64 reference computed per group here (dequantize, then one matmul per group), plus the
layouts' edge cases, core-count determinism and every kind of bad input leaving ``d`` bit-for-bit unchanged.

Shapes are small; N = 64 and K = 128 or 256 throughout so that the compiled kernels are shared between tests.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import deep_gemm
from deep_gemm.testing import (
    assert_bitwise_equal,
    bf16_operand,
    calc_diff,
    dequantize_fp4,
    dequantize_fp8,
    fp4_operand,
    fp8_operand,
    grouped_layouts,
)

BF16 = ml_dtypes.bfloat16
TOL = {("fp8", "fp8"): 1e-3, ("fp8", "fp4"): 1e-2, ("fp4", "fp4"): 2e-2, ("bf16", "bf16"): 1e-5}
N, K = 64, 256


def _operand(rng, kind, mn, k):
    """((codes, sf) or bf16 array, float64 values [mn, k])."""
    if kind == "fp8":
        x, sf = fp8_operand(rng, mn, k)
        return (x, sf), dequantize_fp8(x, sf)
    if kind == "fp4":
        x, sf = fp4_operand(rng, mn, k)
        return (x, sf), dequantize_fp4(x, sf)
    x = bf16_operand(rng, mn, k)
    return x, x.astype(np.float64)


def _stack(rng, kind, g, mn, k):
    """B-like stack of ``g`` operands [g, mn, k]: (stacked operand, list of float64 values per group)."""
    ops = [_operand(rng, kind, mn, k) for _ in range(g)]
    if kind == "bf16":
        return np.stack([o for o, _ in ops]), [v for _, v in ops]
    return (np.stack([o[0] for o, _ in ops]), np.stack([o[1] for o, _ in ops])), [v for _, v in ops]


def _garbage(rng, shape, dtype=BF16):
    # NOTES: d starts as random garbage so that an unwritten element cannot pass.
    return rng.standard_normal(shape).astype(dtype)


def _bits(x):
    return x.view(np.uint16) if x.dtype == BF16 else x


# ------------------------------------------------------------------------------------------------------------------
# M-grouped contiguous

CONTIGUOUS_FN = {
    "fp8": deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous,
    "fp4": deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous,
    "bf16": deep_gemm.m_grouped_bf16_gemm_nt_contiguous,
}

CONTIGUOUS_CASES = [
    # (a kind, b kind, group sizes, extra padding rows at the end)
    ("fp8", "fp8", [300], 0),  # one group holds every row; M = 300, not a multiple of 256
    ("fp8", "fp8", [5, 0, 1, 300], 3),  # 4 groups: an empty one, a 1-row one
    ("fp8", "fp8", [40, 0, 17, 1, 256, 0, 3, 90, 2], 0),  # 9 groups
    ("fp8", "fp4", [33, 0, 70], 1),
    ("fp4", "fp4", [20, 64], 0),
    ("bf16", "bf16", [7, 0, 130, 1], 5),
]


def _contiguous_problem(rng, a_kind, b_kind, sizes, extra):
    psum, per_row, m = grouped_layouts(sizes, extra_rows=extra)
    a, a_val = _operand(rng, a_kind, m, K)
    b, b_vals = _stack(rng, b_kind, len(sizes), N, K)
    ref = np.zeros((m, N))
    starts = [int(np.nonzero(per_row == g)[0][0]) if sizes[g] else 0 for g in range(len(sizes))]
    for g, (s, n_rows) in enumerate(zip(starts, sizes, strict=True)):
        ref[s:s + n_rows] = a_val[s:s + n_rows] @ b_vals[g].T
    return a, b, psum, per_row, m, ref


@pytest.mark.parametrize("case", CONTIGUOUS_CASES, ids=lambda c: f"{c[0]}x{c[1]}-{len(c[2])}groups")
def test_m_grouped_contiguous_matches_per_group_reference(rng, case):
    a_kind, b_kind, sizes, extra = case
    a, b, psum, per_row, m, ref = _contiguous_problem(rng, a_kind, b_kind, sizes, extra)
    fn = CONTIGUOUS_FN[a_kind]
    d = _garbage(rng, (m, N))
    config = fn(a, b, d, psum)
    assert config is not None and config.block_m == 256
    padding = per_row < 0
    real = ~padding
    assert calc_diff(d[real].astype(np.float64), ref[real]) < TOL[(a_kind, b_kind)]
    # ensure_zero_padding=True (the default): every row of no group is zero
    assert not d[padding].astype(np.float32).any()

    # CUDA DeepGEMM's per-row layout gives the same D, bit for bit
    d_rows = _garbage(rng, (m, N))
    fn(a, b, d_rows, per_row, use_psum_layout=False)
    assert_bitwise_equal(_bits(d_rows), _bits(d), "per-row vs psum layout")

    # ensure_zero_padding=False leaves the padding rows as they were
    d_keep = _garbage(rng, (m, N))
    before = d_keep.copy()
    fn(a, b, d_keep, psum, ensure_zero_padding=False)
    assert_bitwise_equal(_bits(d_keep[padding]), _bits(before[padding]), "untouched padding")
    assert_bitwise_equal(_bits(d_keep[real]), _bits(d[real]), "same real rows")


def test_m_grouped_contiguous_matches_numpy_reference_function_and_nn_form(rng):
    sizes = [5, 0, 1, 300]
    a, b, psum, per_row, m, ref = _contiguous_problem(rng, "fp8", "fp8", sizes, 3)
    d = _garbage(rng, (m, N))
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a, b, d, psum)
    d_ref = _garbage(rng, (m, N))
    deep_gemm.aclnn_m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d_ref, psum)
    assert calc_diff(d.astype(np.float64), d_ref.astype(np.float64)) < 1e-6
    assert not d_ref[per_row < 0].astype(np.float32).any()
    # nn: B given as [G, K, N] (and sfb as [G, ceil(K/32), N])
    b_nn = (np.ascontiguousarray(np.swapaxes(b[0], 1, 2)), np.ascontiguousarray(np.swapaxes(b[1], 1, 2)))
    d_nn = _garbage(rng, (m, N))
    deep_gemm.m_grouped_fp8_gemm_nn_contiguous(a, b_nn, d_nn, psum)
    assert calc_diff(d_nn[per_row >= 0].astype(np.float64), ref[per_row >= 0]) < 1e-3


def test_m_grouped_bf16_nn_contiguous(rng):
    sizes = [7, 0, 130, 1]
    a, b, psum, per_row, m, ref = _contiguous_problem(rng, "bf16", "bf16", sizes, 5)
    d = _garbage(rng, (m, N))
    deep_gemm.m_grouped_bf16_gemm_nn_contiguous(a, np.ascontiguousarray(np.swapaxes(b, 1, 2)), d, psum)
    assert calc_diff(d[per_row >= 0].astype(np.float64), ref[per_row >= 0]) < 1e-5


def test_m_grouped_contiguous_all_groups_empty_and_expected_m(rng):
    psum, per_row, m = grouped_layouts([0, 0], extra_rows=9)
    a, _ = _operand(rng, "fp8", m, K)
    b, _ = _stack(rng, "fp8", 2, N, K)
    d = _garbage(rng, (m, N))
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a, b, d, psum)
    assert not d.astype(np.float32).any()  # nothing but padding
    # expected_m_for_psum_layout only steers the heuristic: same D
    a, b, psum, per_row, m, ref = _contiguous_problem(rng, "fp8", "fp8", [5, 0, 1, 300], 3)
    d1, d2 = _garbage(rng, (m, N)), _garbage(rng, (m, N))
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a, b, d1, psum)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a, b, d2, psum, expected_m_for_psum_layout=77)
    assert calc_diff(d1.astype(np.float64), d2.astype(np.float64)) < 1e-6


def test_k_zero_writes_zeros_in_group_rows_only(rng):
    psum, per_row, m = grouped_layouts([5, 0, 3], extra_rows=2)
    b = np.zeros((3, N, 0), BF16)
    d = _garbage(rng, (m, N))
    before = d.copy()
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(np.zeros((m, 0), BF16), b, d, psum, ensure_zero_padding=False)
    assert not d[per_row >= 0].astype(np.float32).any()
    assert_bitwise_equal(_bits(d[per_row < 0]), _bits(before[per_row < 0]), "padding untouched")
    masked_m = np.array([1, 0, 2], np.int32)
    dm = _garbage(rng, (3, 4, N))
    before = dm.copy()
    deep_gemm.m_grouped_bf16_gemm_nt_masked(np.zeros((3, 4, 0), BF16), b, dm, masked_m, 2)
    for g, mm in enumerate(masked_m):
        assert not dm[g, :mm].astype(np.float32).any()
        assert_bitwise_equal(_bits(dm[g, mm:]), _bits(before[g, mm:]), "rows past masked_m")


def test_alignment_functions():
    assert deep_gemm.get_mk_alignment_for_contiguous_layout() == 256
    assert deep_gemm.get_theoretical_mk_alignment_for_contiguous_layout() == 256


# ------------------------------------------------------------------------------------------------------------------
# M-grouped masked

MAX_M = 40


@pytest.mark.parametrize("kinds", [("fp8", "fp8"), ("bf16", "bf16")], ids=lambda k: "x".join(k))
def test_m_grouped_masked_matches_reference_and_never_writes_past_masked_m(rng, kinds):
    a_kind, b_kind = kinds
    masked_m = np.array([0, MAX_M, 1, 17], np.int32)  # masked_m of 0 and of max_m
    g = len(masked_m)
    a, a_vals = _stack(rng, a_kind, g, MAX_M, K)
    b, b_vals = _stack(rng, b_kind, g, N, K)
    # Garbage past masked_m: NaN codes in A (and NaN bf16), whose scales are garbage too
    a_arr = a[0] if a_kind == "fp8" else a
    for gi, mm in enumerate(masked_m):
        if a_kind == "fp8":
            a_arr.view(np.uint8)[gi, mm:] = 0x7F
            a[1][gi, mm:] = np.float32(3.0)  # not a power of two: never read, never validated
        else:
            a_arr[gi, mm:] = np.nan
    d = _garbage(rng, (g, MAX_M, N))
    before = d.copy()
    fn = deep_gemm.m_grouped_fp8_gemm_nt_masked if a_kind == "fp8" else deep_gemm.m_grouped_bf16_gemm_nt_masked
    fn(a, b, d, masked_m, 16)
    for gi, mm in enumerate(masked_m):
        assert_bitwise_equal(_bits(d[gi, mm:]), _bits(before[gi, mm:]), f"group {gi} rows >= masked_m")
        if mm:
            ref = a_vals[gi][:mm] @ b_vals[gi].T
            assert calc_diff(d[gi, :mm].astype(np.float64), ref) < TOL[kinds]
    d_ref = before.copy()
    ref_fn = (deep_gemm.aclnn_m_grouped_fp8_fp4_gemm_nt_masked if a_kind == "fp8"
              else deep_gemm.aclnn_m_grouped_bf16_gemm_nt_masked)
    ref_fn(a, b, d_ref, masked_m, 16)
    assert calc_diff(d.astype(np.float64), d_ref.astype(np.float64)) < 1e-6


def test_m_grouped_masked_fp8_fp4(rng):
    masked_m = np.array([3, 32], np.int32)
    a, a_vals = _stack(rng, "fp8", 2, 32, K)
    b, b_vals = _stack(rng, "fp4", 2, N, K)
    d = _garbage(rng, (2, 32, N))
    deep_gemm.m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked_m, 16)
    for gi, mm in enumerate(masked_m):
        assert calc_diff(d[gi, :mm].astype(np.float64), a_vals[gi][:mm] @ b_vals[gi].T) < 1e-2


# ------------------------------------------------------------------------------------------------------------------
# One and 32 logical cores: bitwise-equal


def test_grouped_one_and_32_cores_bitwise_equal(rng):
    a, b, psum, _, m, _ = _contiguous_problem(rng, "fp8", "fp8", [40, 0, 17, 1, 256, 0, 3, 90, 2], 0)
    masked_m = np.array([0, MAX_M, 1, 17], np.int32)
    am, _ = _stack(rng, "bf16", 4, MAX_M, K)
    bm, _ = _stack(rng, "bf16", 4, N, K)
    outs = []
    for cores in (1, 32):
        with deep_gemm.runtime_scope(num_ai_cores=cores):
            d = _garbage(rng, (m, N))
            deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a, b, d, psum)
            dm = np.zeros((4, MAX_M, N), BF16)
            deep_gemm.m_grouped_bf16_gemm_nt_masked(am, bm, dm, masked_m, 16)
            outs.append((d, dm))
    assert_bitwise_equal(_bits(outs[0][0]), _bits(outs[1][0]), "contiguous, 1 vs 32 cores")
    assert_bitwise_equal(_bits(outs[0][1]), _bits(outs[1][1]), "masked, 1 vs 32 cores")


def test_padding_is_zeroed_by_the_kernel_in_any_group_order(rng, monkeypatch):
    # CUDA DeepGEMM's per-row layout: groups out of order, at any row, padding before, between and after them; the
    # kernel's cores write the zeros (the host's padding pass is never reached when the kernel runs)
    from deep_gemm.api import m_grouped as m_grouped_api

    m = 300
    per_row = np.full(m, -1, np.int32)
    per_row[3:40], per_row[40], per_row[100:228], per_row[290:299] = 2, 0, 3, 1
    a, a_val = _operand(rng, "fp8", m, K)
    b, b_vals = _stack(rng, "fp8", 4, N, K)

    def host_pass(*args):
        raise AssertionError("the host zeroed the padding although the kernel ran")

    monkeypatch.setattr(m_grouped_api, "_padding_mask", host_pass)
    outs = []
    for cores in (1, 32):
        with deep_gemm.runtime_scope(num_ai_cores=cores):
            d = _garbage(rng, (m, N))
            deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a, b, d, per_row, use_psum_layout=False)
            outs.append(d)
    assert_bitwise_equal(_bits(outs[0]), _bits(outs[1]), "kernel-zeroed padding, 1 vs 32 cores")
    d = outs[0]
    assert not d[per_row < 0].astype(np.float32).any()
    for g in range(4):
        rows = per_row == g
        assert calc_diff(d[rows].astype(np.float64), a_val[rows] @ b_vals[g].T) < 1e-3


def test_new_routings_of_similar_size_reuse_the_planned_config(rng, monkeypatch):
    # an MoE layer routes differently every call: layouts whose mean group size rounds to the same quarter octave
    # plan one config (the heuristic runs at most once for them), and D is still exact for each
    from deep_gemm.kernels import common

    planned = []
    select = common._select_config
    monkeypatch.setattr(common, "_select_config", lambda desc, arch: planned.append(desc) or select(desc, arch))
    for sizes in ([150, 0, 140], [149, 0, 141], [133, 0, 160]):
        a, b, psum, per_row, m, ref = _contiguous_problem(rng, "fp8", "fp8", sizes, 0)
        d = _garbage(rng, (m, N))
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a, b, d, psum)
        assert calc_diff(d[per_row >= 0].astype(np.float64), ref[per_row >= 0]) < 1e-3
    assert len({(desc.m, desc.num_groups) for desc in planned}) <= 1 and len(planned) <= 1


# ------------------------------------------------------------------------------------------------------------------
# K-grouped


def _k_grouped_problem(rng, kind, ks, m=48, n=N):
    psum, _, k_total = grouped_layouts(ks)
    k_total = max(k_total, 1) if not any(ks) else k_total
    if kind == "fp8":
        a_t, a_sf = fp8_operand(rng, m, k_total)  # logical [M, K_total]
        b_t, b_sf = fp8_operand(rng, n, k_total)
        a_vals, b_vals = dequantize_fp8(a_t, a_sf), dequantize_fp8(b_t, b_sf)
        a = (np.ascontiguousarray(a_t.T), a_sf)  # A [K_total, M] MN-major, sfa [M, ceil(K_total/32)]
        b = (np.ascontiguousarray(b_t.T), b_sf)
    else:
        a_t, b_t = bf16_operand(rng, m, k_total), bf16_operand(rng, n, k_total)
        a_vals, b_vals = a_t.astype(np.float64), b_t.astype(np.float64)
        a, b = np.ascontiguousarray(a_t.T), np.ascontiguousarray(b_t.T)
    c = rng.standard_normal((len(ks), m, n)).astype(np.float32)
    ref = c.astype(np.float64).copy()
    k0 = 0
    for g, kg in enumerate(ks):
        start = -(-k0 // 256) * 256
        ref[g] += a_vals[:, start:start + kg] @ b_vals[:, start:start + kg].T
        if kg:
            k0 = start + kg
    return a, b, psum, c, ref


@pytest.mark.parametrize("kind", ["fp8", "bf16"])
def test_k_grouped_matches_per_group_reference(rng, kind):
    ks = [256, 0, 512, 128]  # a K group of size 0; the last one not a multiple of 256
    a, b, psum, c, ref = _k_grouped_problem(rng, kind, ks)
    d = _garbage(rng, c.shape, np.float32)
    fn = deep_gemm.k_grouped_fp8_gemm_tn_contiguous if kind == "fp8" else deep_gemm.k_grouped_bf16_gemm_tn_contiguous
    fn(a, b, d, ks, psum, c=c)
    assert calc_diff(d.astype(np.float64), ref) < TOL[(kind, kind)]
    assert_bitwise_equal(d[1], c[1], "empty K group: D = C")
    d_ref = _garbage(rng, c.shape, np.float32)
    ref_fn = (deep_gemm.aclnn_k_grouped_fp8_gemm_tn_contiguous if kind == "fp8"
              else deep_gemm.aclnn_k_grouped_bf16_gemm_tn_contiguous)
    ref_fn(a, b, d_ref, None, psum, c=c)
    assert calc_diff(d.astype(np.float64), d_ref.astype(np.float64)) < 1e-6


def test_k_grouped_nt_is_deprecated_and_forwards(rng):
    ks = [256, 256]
    a, b, psum, c, ref = _k_grouped_problem(rng, "fp8", ks)
    d_tn = np.empty_like(c)
    deep_gemm.k_grouped_fp8_gemm_tn_contiguous(a, b, d_tn, ks, psum, c=c)
    d_nt = np.empty_like(c)
    a_nt, b_nt = (np.ascontiguousarray(a[0].T), a[1]), (np.ascontiguousarray(b[0].T), b[1])
    with pytest.warns(DeprecationWarning, match="k_grouped_fp8_gemm_nt_contiguous is deprecated"):
        deep_gemm.k_grouped_fp8_gemm_nt_contiguous(a_nt, b_nt, d_nt, ks, psum, c=c)
    assert_bitwise_equal(d_nt, d_tn, "nt forwards to tn")
    # the per-group K layout (use_psum_layout=False) gives the same D
    d_ks = np.empty_like(c)
    deep_gemm.k_grouped_fp8_gemm_tn_contiguous(a, b, d_ks, None, np.array(ks, np.int32), c=c, use_psum_layout=False)
    assert_bitwise_equal(d_ks, d_tn, "per-group K layout vs psum")


# ------------------------------------------------------------------------------------------------------------------
# bmm and einsum


def test_bmm_fp8_and_bf16(rng):
    nb, m = 3, 20
    a, a_vals = _stack(rng, "fp8", nb, m, K)
    b, b_vals = _stack(rng, "fp8", nb, N, K)
    d = _garbage(rng, (nb, m, N))
    deep_gemm.fp8_bmm(a, b, d)
    ref = np.stack([a_vals[i] @ b_vals[i].T for i in range(nb)])
    assert calc_diff(d.astype(np.float64), ref) < 1e-3
    ab, ab_vals = _stack(rng, "bf16", nb, m, K)
    bb, bb_vals = _stack(rng, "bf16", nb, N, K)
    c = rng.standard_normal((nb, m, N)).astype(np.float32)
    d32 = np.empty((nb, m, N), np.float32)
    deep_gemm.bf16_bmm(ab, bb, d32, c=c)
    ref = c + np.stack([ab_vals[i] @ bb_vals[i].T for i in range(nb)])
    assert calc_diff(d32.astype(np.float64), ref) < 1e-5
    with pytest.raises(TypeError, match="FP8Quantization epilogue"):
        deep_gemm.fp8_bmm(a, b, (d, np.zeros((1,), np.int16)))


@pytest.mark.parametrize("expr", ["bhr,hdr->bhd", "bhd,hdr->bhr", "bhd,bhr->hdr"])
def test_einsum_bf16_matches_numpy(rng, expr):
    bsz, h, dim, r = 24, 3, 64, 128
    shapes = {"bhr,hdr->bhd": ((bsz, h, r), (h, dim, r), (bsz, h, dim)),
              "bhd,hdr->bhr": ((bsz, h, dim), (h, dim, r), (bsz, h, r)),
              "bhd,bhr->hdr": ((bsz, h, dim), (bsz, h, r), (h, dim, r))}[expr]
    x = rng.standard_normal(shapes[0]).astype(BF16)
    y = rng.standard_normal(shapes[1]).astype(BF16)
    ref = np.einsum(expr, x.astype(np.float64), y.astype(np.float64))
    d = _garbage(rng, shapes[2], np.float32)
    if expr == "bhd,bhr->hdr":
        c = rng.standard_normal(shapes[2]).astype(np.float32)
        d[...] = c
        deep_gemm.einsum(expr, x, y, d, c=d)
        ref = ref + c
    else:
        deep_gemm.einsum(expr, x, y, d)
    assert calc_diff(d.astype(np.float64), ref) < 1e-5


def test_fp8_einsum_matches_dequantized_numpy(rng):
    bsz, h, dim, r = 16, 2, 64, 128
    x, sfx = fp8_operand(rng, bsz * h, r)
    w, sfw = fp8_operand(rng, h * dim, r)
    xv = dequantize_fp8(x, sfx).reshape(bsz, h, r)
    wv = dequantize_fp8(w, sfw).reshape(h, dim, r)
    d = _garbage(rng, (bsz, h, dim))
    deep_gemm.fp8_einsum("bhr,hdr->bhd", (x.reshape(bsz, h, r), sfx.reshape(bsz, h, -1)),
                         (w.reshape(h, dim, r), sfw.reshape(h, dim, -1)), d)
    assert calc_diff(d.astype(np.float64), np.einsum("bhr,hdr->bhd", xv, wv)) < 1e-3


# ------------------------------------------------------------------------------------------------------------------
# Bad input: ValueError/TypeError naming the argument, raised before anything is written


def _bad_cases(rng):
    sizes = [5, 0, 1, 300]
    a, b, psum, per_row, m, _ = _contiguous_problem(rng, "fp8", "fp8", sizes, 3)
    masked = np.array([0, MAX_M, 1, 17], np.int32)
    am, _ = _stack(rng, "bf16", 4, MAX_M, K)
    bm, _ = _stack(rng, "bf16", 4, N, K)
    ka, kb, kpsum, kc, _ = _k_grouped_problem(rng, "bf16", [256, 256])
    contiguous = deep_gemm.m_grouped_fp8_gemm_nt_contiguous
    masked_fn = deep_gemm.m_grouped_bf16_gemm_nt_masked
    k_fn = deep_gemm.k_grouped_bf16_gemm_tn_contiguous
    d_c, d_m, d_k = (m, N), (4, MAX_M, N), (2, 48, N)
    p = psum.copy()
    cases = [
        # (name, d shape, d dtype, call(d), error, message)
        ("psum decreasing", d_c, BF16, lambda d: contiguous(a, b, d, np.array([5, 4, 257, 559], np.int32)),
         ValueError, r"grouped_layout must be non-decreasing: grouped_layout\[1\]=4"),
        ("psum exceeds M", d_c, BF16, lambda d: contiguous(a, b, d, np.array([5, 5, 257, m + 1], np.int32)),
         ValueError, rf"grouped_layout\[3\]={m + 1} exceeds M={m}"),
        ("psum negative", d_c, BF16, lambda d: contiguous(a, b, d, np.array([-1, 5, 257, 559], np.int32)),
         ValueError, r"grouped_layout\[0\]=-1 is negative"),
        ("psum inside padding", d_c, BF16, lambda d: contiguous(a, b, d, np.array([5, 9, 257, 559], np.int32)),
         ValueError, r"grouped_layout\[1\]=9 ends inside the alignment padding"),
        ("psum dtype", d_c, BF16, lambda d: contiguous(a, b, d, p.astype(np.int64)),
         TypeError, "grouped_layout must have dtype int32, got int64"),
        ("psum length", d_c, BF16, lambda d: contiguous(a, b, d, p[:3]),
         ValueError, r"grouped_layout must have shape \(4,\).*use_psum_layout=False"),
        ("per-row length", d_c, BF16, lambda d: contiguous(a, b, d, per_row[:-1], use_psum_layout=False),
         ValueError, rf"grouped_layout must have shape \({m},\)"),
        ("per-row bad group", d_c, BF16,
         lambda d: contiguous(a, b, d, np.where(np.arange(m) == 7, 4, per_row).astype(np.int32),
                              use_psum_layout=False),
         ValueError, r"grouped_layout\[7\]=4 is not a group index in \[0, 4\)"),
        ("per-row split group", d_c, BF16,
         lambda d: contiguous(a, b, d, np.where(np.arange(m) == 300, 0, per_row).astype(np.int32),
                              use_psum_layout=False),
         ValueError, "the rows of group 0 are not contiguous"),
        ("B not 3-D", d_c, BF16, lambda d: contiguous(a, (b[0][0], b[1][0]), d, p),
         ValueError, r"b must be 3-D \[G, MN, K\]"),
        ("A MN-major", d_c, BF16, lambda d: contiguous((a[0].T.copy().T, a[1]), b, d, p),
         ValueError, "a must be K-major"),
        ("d wrong shape", (m - 1, N), BF16, lambda d: contiguous(a, b, d, p),
         ValueError, rf"d must have shape \({m}, {N}\)"),
        ("d wrong dtype", d_c, np.float16, lambda d: contiguous(a, b, d, p),
         TypeError, "d has dtype float16"),
        ("expected_m with per-row", d_c, BF16,
         lambda d: contiguous(a, b, d, per_row, use_psum_layout=False, expected_m_for_psum_layout=8),
         ValueError, "expected_m_for_psum_layout=8 is only legal with use_psum_layout=True"),
        ("bad sfb value", d_c, BF16, lambda d: contiguous(a, (b[0], b[1] * np.float32(3)), d, p),
         ValueError, "sfb: fp32 sf must hold exact non-negative powers of two"),
        ("masked_m above max_m", d_m, BF16,
         lambda d: masked_fn(am, bm, d, np.array([0, MAX_M + 1, 1, 17], np.int32), 16),
         ValueError, rf"masked_m\[1\]={MAX_M + 1} is outside \[0, max_m={MAX_M}\]"),
        ("masked_m negative", d_m, BF16, lambda d: masked_fn(am, bm, d, np.array([0, 1, -2, 17], np.int32), 16),
         ValueError, r"masked_m\[2\]=-2 is outside"),
        ("masked_m length", d_m, BF16, lambda d: masked_fn(am, bm, d, masked[:3], 16),
         ValueError, r"masked_m must have shape \(4,\)"),
        ("masked groups disagree", d_m, BF16, lambda d: masked_fn(am, bm[:3], d, masked, 16),
         ValueError, "A and B disagree on the number of groups"),
        ("expected_m 0", d_m, BF16, lambda d: masked_fn(am, bm, d, masked, 0),
         ValueError, "expected_m must be >= 1"),
        ("K groups do not sum", d_k, np.float32,
         lambda d: k_fn(ka, kb, d, None, np.array([256, 512], np.int32), c=kc, use_psum_layout=False),
         ValueError, "K group sizes sum to 768, but A and B have K_total=512"),
        ("ks_cpu disagrees", d_k, np.float32, lambda d: k_fn(ka, kb, d, [256, 128], kpsum, c=kc),
         ValueError, r"ks_cpu\[1\]=128 disagrees with grouped_layout"),
        ("k layout exceeds K", d_k, np.float32,
         lambda d: k_fn(ka, kb, d, None, np.array([256, 1024], np.int32), c=kc),
         ValueError, r"grouped_layout\[1\]=1024 exceeds K_total"),
        ("k groups vs d", (3, 48, N), np.float32, lambda d: k_fn(ka, kb, d, None, kpsum, c=kc),
         ValueError, r"d must have shape \(2, 48, 64\)"),
        ("fp8 k-grouped needs c", d_k, np.float32,
         lambda d: deep_gemm.k_grouped_fp8_gemm_tn_contiguous(
             (np.zeros((512, 48), ml_dtypes.float8_e4m3fn), np.ones((48, 16), np.float32)),
             (np.zeros((512, N), ml_dtypes.float8_e4m3fn), np.ones((N, 16), np.float32)), d, None, kpsum),
         ValueError, "requires accumulation into C"),
        ("einsum expression", (2, 2, 2), BF16,
         lambda d: deep_gemm.einsum("bij,bjk->bik", am[:2], bm[:2], d),
         ValueError, r"unsupported einsum expression 'bij,bjk->bik'; supported: \['bhd,bhr->hdr'"),
    ]
    return cases


def test_bad_input_raises_before_writing(rng):
    for name, shape, dtype, call, err, msg in _bad_cases(rng):
        d = _garbage(rng, shape, dtype)
        before = d.copy()
        with pytest.raises(err, match=msg):
            call(d)
        assert_bitwise_equal(d.view(np.uint8), before.view(np.uint8), f"{name}: d untouched")
