"""The small API cases of issue 22 (item 8), one test each: a TypeError/ValueError naming the argument and its value
raised before anything is written, or the documented behaviour. Shapes are small; the checks-only cases run the
float64 ``aclnn_*`` references (the same plan checks as the kernels, no compile), and the few kernel cases are
bf16 and share one shape.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import deep_gemm
from deep_gemm import utils as dg_utils
from deep_gemm.testing import assert_bitwise_equal, bf16_operand, grouped_layouts, random_fp8_codes
from deep_gemm.utils.layout import transform_k_grouped_sf_into_required_layout, transform_sf_into_required_layout

BF16 = ml_dtypes.bfloat16
FP8 = ml_dtypes.float8_e4m3fn
N, K = 64, 64


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint16) if x.dtype == BF16 else x.view(np.uint32)


def _garbage(rng, shape, dtype=BF16) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32).astype(dtype) * 7


def _fp8_pair(rng, lead: tuple[int, ...], k: int = K):
    """(float8_e4m3fn codes [*lead, k], fp32 UE8M0 scales [*lead, k / 32] of powers of two)."""
    codes = random_fp8_codes(rng, (*lead, k))
    sf = np.ldexp(1.0, rng.integers(-3, 4, (*lead, k // 32))).astype(np.float32)
    return codes, sf


def _refused(call, outputs, error, match):
    """``call()`` raises ``error`` matching ``match`` and leaves every output array bitwise as it was."""
    before = [o.copy() for o in outputs]
    with pytest.raises(error, match=match):
        call()
    for o, b in zip(outputs, before, strict=True):
        assert_bitwise_equal(o.view(np.uint8), b.view(np.uint8), "an output written before the error")


# ------------------------------------------------------------------------------------------------------------------
# FP4 A x FP8 B: refused as by the dense GEMM (it has no such pair either), never an AttributeError


def test_fp4_a_with_fp8_b_is_refused_like_the_dense_gemm(rng):
    m, g = 16, 2
    a4 = (np.zeros((m, K // 2), np.int8), np.ones((m, K // 32), np.float32))
    b8 = _fp8_pair(rng, (g, N))
    d = _garbage(rng, (m, N))
    psum = np.array([5, 5], np.int32)
    match = r"fp4 A with fp8 B is not supported \(as upstream\): a.dtype=int8 b.dtype=float8_e4m3fn"
    _refused(lambda: deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous(a4, b8, d, psum), [d], TypeError, match)
    b8_nn = (np.ascontiguousarray(np.swapaxes(b8[0], 1, 2)), np.ascontiguousarray(np.swapaxes(b8[1], 1, 2)))
    _refused(lambda: deep_gemm.m_grouped_fp8_fp4_gemm_nn_contiguous(a4, b8_nn, d, psum), [d], TypeError, match)
    per_row = np.array([0] * 5 + [-1] * (m - 5), np.int32)
    _refused(lambda: deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous(a4, b8, d, per_row, use_psum_layout=False), [d],
             TypeError, match)
    d_dense = _garbage(rng, (m, N))
    _refused(lambda: deep_gemm.fp8_fp4_gemm_nt(a4, (b8[0][0], b8[1][0]), d_dense), [d_dense], TypeError,
             "fp4 A with fp8 B is not supported")
    am = (np.zeros((g, m, K // 2), np.int8), np.ones((g, m, K // 32), np.float32))
    dm = _garbage(rng, (g, m, N))
    _refused(lambda: deep_gemm.m_grouped_fp8_fp4_gemm_nt_masked(am, b8, dm, np.array([3, 4], np.int32), 8), [dm],
             TypeError, match)


# ------------------------------------------------------------------------------------------------------------------
# numpy masked arrays: refused wherever an index or layout array is taken (their mask would be ignored)


def _masked_array_cases(rng):
    g, max_m = 2, 16
    a, b = bf16_operand(rng, g * max_m, K).reshape(g, max_m, K), bf16_operand(rng, g * N, K).reshape(g, N, K)
    d = _garbage(rng, (g, max_m, N))
    mm = np.ma.masked_array(np.array([3, 16], np.int32), mask=[False, True])
    psum, per_row, m = grouped_layouts([5, 7], extra_rows=3)
    ac, dc = bf16_operand(rng, m, K), _garbage(rng, (m, N))
    k_layout = np.ma.masked_array(np.array([256, 512], np.int32), mask=[False, False])  # even with nothing masked
    ak, bk, dk = bf16_operand(rng, 16, 512).T, bf16_operand(rng, 16, 512).T, _garbage(rng, (2, 16, 16), np.float32)
    ctx = np.ma.masked_array(np.array([[64], [70]], np.int32), mask=[[False], [True]])
    kv = (random_fp8_codes(rng, (2, 70, 64)), np.ones((2, 70), np.float32))
    table = np.ma.masked_array(np.array([[0, 1], [2, 3]], np.int32))
    q = (random_fp8_codes(rng, (6, 4, 64)), None)
    kv_r = (random_fp8_codes(rng, (50, 64)), np.ones(50, np.float32))
    w = np.ones((6, 4), np.float32)
    ks = np.ma.masked_array(np.zeros(6, np.int32), mask=[True] + [False] * 5)
    return {
        "masked_m": (lambda: deep_gemm.m_grouped_bf16_gemm_nt_masked(a, b, d, mm, 8), [d], "masked_m"),
        "psum grouped_layout": (
            lambda: deep_gemm.m_grouped_bf16_gemm_nt_contiguous(ac, b, dc, np.ma.masked_array(psum)), [dc],
            "grouped_layout"),
        "per-row grouped_layout": (
            lambda: deep_gemm.m_grouped_bf16_gemm_nt_contiguous(ac, b, dc, np.ma.masked_array(per_row),
                                                                use_psum_layout=False), [dc], "grouped_layout"),
        "K-grouped grouped_layout": (
            lambda: deep_gemm.k_grouped_bf16_gemm_tn_contiguous(ak, bk, dk, None, k_layout), [dk], "grouped_layout"),
        "paged metadata context_lens": (lambda: deep_gemm.get_paged_mqa_logits_metadata(ctx, 4), [], "context_lens"),
        "paged cache block_table": (lambda: deep_gemm.build_paged_kv_cache(kv, table, 4, 64), [], "block_table"),
        "ragged cu_seq_len_k_start": (
            lambda: deep_gemm.fp8_fp4_mqa_logits(q, kv_r, w, ks, np.full(6, 50, np.int32)), [],
            "cu_seq_len_k_start"),
    }


@pytest.mark.parametrize("case", sorted(_masked_array_cases(np.random.default_rng(0))))
def test_masked_arrays_are_refused_as_index_arrays(case):
    call, outputs, name = _masked_array_cases(np.random.default_rng(0))[case]
    _refused(call, outputs, TypeError, rf"{name} is a numpy masked array \(MaskedArray\); the kernels would ignore "
                                       rf"its mask")


# ------------------------------------------------------------------------------------------------------------------
# expected_m hints: a hint (upstream only feeds it to the heuristic), so a huge one is clamped, never refused naming
# a kernel internal (shape_m)


def test_expected_m_above_max_m_is_clamped_to_max_m(rng):
    g, max_m = 2, 16
    a, b = bf16_operand(rng, g * max_m, K).reshape(g, max_m, K), bf16_operand(rng, g * N, K).reshape(g, N, K)
    mm = np.array([3, 16], np.int32)
    d_max = _garbage(rng, (g, max_m, N))
    config = deep_gemm.m_grouped_bf16_gemm_nt_masked(a, b, d_max, mm, max_m)
    for hint in (max_m + 1, 10**6, 2**32, 2**40, np.int64(2**62)):
        d = d_max.copy()
        d[...] = 3
        assert deep_gemm.m_grouped_bf16_gemm_nt_masked(a, b, d, mm, hint) == config, hint
        for gi, rows in enumerate(mm.tolist()):  # the masked rows bitwise those of expected_m=max_m; the rest as was
            assert_bitwise_equal(_bits(d[gi, :rows]), _bits(d_max[gi, :rows]), f"expected_m={hint}")
            assert (d[gi, rows:].astype(np.float32) == 3).all()
    for bad, error, match in (("16", TypeError, "expected_m must be an int, got str: '16'"),
                              (16.0, TypeError, "expected_m must be an int, got float: 16.0"),
                              (True, TypeError, "expected_m must be an int, got bool"),
                              (0, ValueError, "expected_m must be >= 1, got expected_m=0")):
        d = _garbage(rng, (g, max_m, N))
        _refused(lambda bad=bad, d=d: deep_gemm.m_grouped_bf16_gemm_nt_masked(a, b, d, mm, bad), [d], error, match)


def test_expected_m_for_psum_layout_above_m_is_clamped_to_m(rng):
    psum, _, m = grouped_layouts([5, 7], extra_rows=3)
    a, b = bf16_operand(rng, m, K), bf16_operand(rng, 2 * N, K).reshape(2, N, K)
    d_m = _garbage(rng, (m, N))
    config = deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, d_m, psum, expected_m_for_psum_layout=m)
    for hint in (m + 1, 2**32, 2**40):
        d = _garbage(rng, (m, N))
        assert deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, d, psum, expected_m_for_psum_layout=hint) == config
        assert_bitwise_equal(_bits(d), _bits(d_m), f"expected_m_for_psum_layout={hint}")
    d = _garbage(rng, (m, N))
    _refused(lambda: deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, d, psum, expected_m_for_psum_layout="8"), [d],
             TypeError, "expected_m_for_psum_layout must be an int, got str: '8'")


# ------------------------------------------------------------------------------------------------------------------
# Boolean flags: a non-bool (bool("False") is True) raises TypeError naming the flag


def _flag_cases(rng):
    m, g = 16, 2
    a8, b8 = _fp8_pair(rng, (m,)), _fp8_pair(rng, (m,))
    d = _garbage(rng, (m, m))
    psum, _, mc = grouped_layouts([5, 7], extra_rows=3)
    ac, bc, dc = bf16_operand(rng, mc, K), bf16_operand(rng, g * N, K).reshape(g, N, K), _garbage(rng, (mc, N))
    ac8, bc8 = _fp8_pair(rng, (mc,)), _fp8_pair(rng, (g, N))
    am8, dm = _fp8_pair(rng, (g, m)), _garbage(rng, (g, m, N))
    ak, bk, dk = bf16_operand(rng, 16, 512).T, bf16_operand(rng, 16, 512).T, _garbage(rng, (2, 16, 16), np.float32)
    k_layout = np.array([256, 512], np.int32)
    ea, eb, ed = (bf16_operand(rng, 3 * 2, 32).reshape(3, 2, 32), bf16_operand(rng, 2 * 8, 32).reshape(2, 8, 32),
                  _garbage(rng, (3, 2, 8)))
    kv = (random_fp8_codes(rng, (2, 70, 64)), np.ones((2, 70), np.float32))
    table = np.array([[0, 1], [2, 3]], np.int32)
    q, kv_r = (random_fp8_codes(rng, (6, 4, 64)), None), (random_fp8_codes(rng, (50, 64)), np.ones(50, np.float32))
    w, ks, ke = np.ones((6, 4), np.float32), np.zeros(6, np.int32), np.full(6, 50, np.int32)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    packed, sf4 = dg_utils.per_token_cast_to_fp4(x, True, gran_k=32)
    s = "False"
    return {
        "build_paged_kv_cache use_ascend_kv_layout": (
            lambda: deep_gemm.build_paged_kv_cache(kv, table, 4, 64, use_ascend_kv_layout=s), []),
        "fp8_fp4_paged_mqa_logits use_ascend_kv_layout": (
            lambda: deep_gemm.fp8_fp4_paged_mqa_logits(None, None, None, None, None, None, 64,
                                                       use_ascend_kv_layout=s), []),
        "fp8_fp4_mqa_logits clean_logits": (
            lambda: deep_gemm.fp8_fp4_mqa_logits(q, kv_r, w, ks, ke, clean_logits=s), []),
        "einsum use_cublaslt": (lambda: deep_gemm.einsum("bhr,hdr->bhd", ea, eb, ed, use_cublaslt=s), [ed]),
        "fp8_fp4_gemm_nt disable_ue8m0_cast": (
            lambda: deep_gemm.fp8_fp4_gemm_nt(a8, b8, d, disable_ue8m0_cast=s), [d]),
        "m_grouped contiguous use_psum_layout": (
            lambda: deep_gemm.m_grouped_bf16_gemm_nt_contiguous(ac, bc, dc, psum, use_psum_layout=s), [dc]),
        "m_grouped contiguous ensure_zero_padding": (
            lambda: deep_gemm.m_grouped_bf16_gemm_nt_contiguous(ac, bc, dc, psum, ensure_zero_padding=s), [dc]),
        "m_grouped contiguous disable_ue8m0_cast": (
            lambda: deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous(ac8, bc8, dc, psum, disable_ue8m0_cast=s), [dc]),
        "m_grouped masked disable_ue8m0_cast": (
            lambda: deep_gemm.m_grouped_fp8_fp4_gemm_nt_masked(am8, bc8, dm, np.array([1, 2], np.int32), 4,
                                                               disable_ue8m0_cast=s), [dm]),
        "k_grouped use_psum_layout": (
            lambda: deep_gemm.k_grouped_bf16_gemm_tn_contiguous(ak, bk, dk, None, k_layout, use_psum_layout=s), [dk]),
        "estimate_paged_mqa_logits use_ascend_kv_layout": (
            lambda: deep_gemm.estimate_paged_mqa_logits([[64]], use_ascend_kv_layout=s), []),
        "estimate_mqa_logits kv_scale_per_key": (lambda: deep_gemm.estimate_mqa_logits(8, 8, kv_scale_per_key=s), []),
        "estimate_hc_prenorm_gemm deterministic": (
            lambda: deep_gemm.estimate_hc_prenorm_gemm(16, 24, 64, deterministic=s), []),
        "transform_sf_into_required_layout disable_ue8m0_cast": (
            lambda: transform_sf_into_required_layout(a8[1], m, K, (1, 1, 32), is_sfa=True, disable_ue8m0_cast=s), []),
        "per_token_cast_to_fp8 use_ue8m0": (lambda: dg_utils.per_token_cast_to_fp8(x, s), []),
        "per_token_cast_to_fp8 use_packed_ue8m0": (
            lambda: dg_utils.per_token_cast_to_fp8(x, True, use_packed_ue8m0=s), []),
        "per_channel_cast_to_fp8 use_ue8m0": (lambda: dg_utils.per_channel_cast_to_fp8(x, s, gran_k=4), []),
        "per_block_cast_to_fp8 use_ue8m0": (lambda: dg_utils.per_block_cast_to_fp8(x, s, gran_k=32), []),
        "per_custom_dims_cast_to_fp8 use_ue8m0": (lambda: dg_utils.per_custom_dims_cast_to_fp8(x, (0,), s), []),
        "per_token_cast_to_fp4 use_ue8m0": (lambda: dg_utils.per_token_cast_to_fp4(x, s, gran_k=32), []),
        "cast_back_from_fp4 use_packed_ue8m0": (
            lambda: dg_utils.cast_back_from_fp4(packed, sf4, gran_k=32, use_packed_ue8m0=s), []),
        "use_deterministic_algorithms enabled": (lambda: deep_gemm.use_deterministic_algorithms(s), []),
    }


@pytest.mark.parametrize("case", sorted(_flag_cases(np.random.default_rng(0))))
def test_boolean_flags_refuse_non_bools(case):
    call, outputs = _flag_cases(np.random.default_rng(0))[case]
    flag = case.split()[-1]
    _refused(call, outputs, TypeError, rf"{flag} must be a bool(?: or None)?, got (?:str: )?'False'")


def test_build_paged_kv_cache_flag_picks_the_layout_only_from_a_bool(rng):
    kv = (random_fp8_codes(rng, (2, 70, 64)), np.ones((2, 70), np.float32))
    table = np.array([[0, 1], [2, 3]], np.int32)
    cuda = deep_gemm.build_paged_kv_cache(kv, table, 4, 64, use_ascend_kv_layout=np.bool_(False))
    assert cuda.shape == (4, 64, 1, 64 + 4)  # CUDA DeepGEMM's layout: a 4-byte scale per token
    for flag in ("False", "True", 0, 1, None):
        with pytest.raises(TypeError, match="use_ascend_kv_layout must be a bool"):
            deep_gemm.build_paged_kv_cache(kv, table, 4, 64, use_ascend_kv_layout=flag)


# ------------------------------------------------------------------------------------------------------------------
# Nothing to do: early returns like the dense GEMMs' m == 0 / n == 0


def test_hc_prenorm_with_no_rows_is_an_early_return(rng):
    b = rng.standard_normal((24, 64)).astype(np.float32)
    a = np.zeros((0, 64), BF16)  # numpy 2 gives it strides (0, 0)
    assert deep_gemm.tf32_hc_prenorm_gemm(a, b, np.zeros((0, 24), np.float32), np.zeros(0, np.float32)) is None
    assert deep_gemm.tf32_hc_prenorm_gemm(np.empty((0, 64), BF16)[:, ::1], b, np.empty((0, 24), np.float32),
                                          np.empty((0,), np.float32)) is None
    assert deep_gemm.tf32_hc_prenorm_gemm(a, b, np.zeros((1, 0, 24), np.float32), np.zeros((1, 0), np.float32),
                                          num_splits=1) is None
    # the other checks still apply to an empty call
    with pytest.raises(ValueError, match=r"d must have shape \(0, 24\)"):
        deep_gemm.tf32_hc_prenorm_gemm(a, b, np.zeros((0, 16), np.float32), np.zeros(0, np.float32))
    with pytest.raises(ValueError, match=r"k=32 must be a positive multiple of 64"):
        deep_gemm.tf32_hc_prenorm_gemm(np.zeros((0, 32), BF16), b[:, :32].copy(), np.zeros((0, 24), np.float32),
                                       np.zeros(0, np.float32))


def test_empty_batches_and_empty_n_are_early_returns(rng):
    m, g = 16, 2
    empty = _fp8_pair(rng, (0, m)), _fp8_pair(rng, (0, N))
    d0 = np.zeros((0, m, N), BF16)
    assert deep_gemm.fp8_bmm(empty[0], empty[1], d0) is None
    assert deep_gemm.fp8_bmm(empty[0], empty[1], d0, c=np.zeros((0, m, N), BF16)) is None
    assert deep_gemm.fp8_bmm(empty[0], empty[1], d0, c=d0) is None
    assert deep_gemm.bf16_bmm(np.zeros((0, m, K), BF16), np.zeros((0, N, K), BF16), d0) is None
    with pytest.raises(ValueError, match=r"sfa must be 3-D \[0, \.\.\.\] for an empty batch"):
        deep_gemm.fp8_bmm((empty[0][0], np.ones((m, K // 32), np.float32)), empty[1], d0)
    # masked with N == 0 (either dtype), and with no group at all
    a8, mm = _fp8_pair(rng, (g, m)), np.array([3, 16], np.int32)
    b8_empty = (np.zeros((g, 0, K), FP8), np.ones((g, 0, K // 32), np.float32))
    assert deep_gemm.m_grouped_fp8_fp4_gemm_nt_masked(a8, b8_empty, np.zeros((g, m, 0), BF16), mm, 8) is None
    assert deep_gemm.m_grouped_bf16_gemm_nt_masked(np.zeros((g, m, K), BF16), np.zeros((g, 0, K), BF16),
                                                   np.zeros((g, m, 0), np.float32), mm, 8) is None
    assert deep_gemm.m_grouped_fp8_fp4_gemm_nt_masked(_fp8_pair(rng, (0, m)), _fp8_pair(rng, (0, N)),
                                                      np.zeros((0, m, N), BF16), np.zeros(0, np.int32), 8) is None
    # the checks still run: masked_m against max_m
    with pytest.raises(ValueError, match=r"masked_m\[1\]=17 is outside \[0, max_m=16\]"):
        deep_gemm.m_grouped_bf16_gemm_nt_masked(np.zeros((g, m, K), BF16), np.zeros((g, 0, K), BF16),
                                                np.zeros((g, m, 0), np.float32), np.array([3, 17], np.int32), 8)


# ------------------------------------------------------------------------------------------------------------------
# Estimators: sizes must be ints (TypeError naming the argument), never a str or a float taken at its int() value


@pytest.mark.parametrize("call,match", [
    (lambda: deep_gemm.estimate_paged_mqa_logits("4096"), r"context_lens must be a sequence .* got str: '4096'"),
    (lambda: deep_gemm.estimate_paged_mqa_logits(4096), r"context_lens must be a sequence .* got int: 4096"),
    (lambda: deep_gemm.estimate_paged_mqa_logits(["4096"]), r"context_lens\[0\] must be a sequence of ints, got str"),
    (lambda: deep_gemm.estimate_paged_mqa_logits([4096.0]), r"context_lens\[0\]\[0\] must be an int, got float"),
    (lambda: deep_gemm.estimate_paged_mqa_logits([[64, "1"]]), r"context_lens\[0\]\[1\] must be an int, got str"),
    (lambda: deep_gemm.estimate_paged_mqa_logits([64], page_size="64"), "page_size must be an int, got str: '64'"),
    (lambda: deep_gemm.estimate_mqa_logits("2048", 64), "seq_len must be an int, got str: '2048'"),
    (lambda: deep_gemm.estimate_mqa_logits(64, 64.0), "seq_len_kv must be an int, got float: 64.0"),
    (lambda: deep_gemm.estimate_mqa_logits(8, 8, cu_seq_len_k_start=[0.5] * 8, cu_seq_len_k_end=[8] * 8),
     r"cu_seq_len_k_start\[0\] must be an int, got float: 0.5"),
    (lambda: deep_gemm.estimate_mqa_logits(8, 8, num_ai_cores="8"),
     "num_ai_cores must be a positive integer, got str: num_ai_cores='8'"),
    (lambda: deep_gemm.estimate_gemm("256", 256, 256), "m must be a positive integer, got str: m='256'"),
    (lambda: deep_gemm.estimate_gemm(256, 256, 256.0), "k must be a positive integer, got float: k=256.0"),
    (lambda: deep_gemm.estimate_hc_prenorm_gemm(16.0, 24, 64), "m must be a positive integer, got float"),
    (lambda: deep_gemm.estimate_hc_prenorm_gemm(16, 24, 64, num_splits="1"), "num_splits must be a positive"),
])
def test_estimators_refuse_non_int_sizes(call, match):
    with pytest.raises(TypeError, match=match):
        call()


def test_estimators_still_take_numpy_ints_and_arrays():
    got = deep_gemm.estimate_paged_mqa_logits(np.array([4096, 100], np.int32), arch="950DT")
    assert got.time_us == deep_gemm.estimate_paged_mqa_logits([[4096], [100]], arch="950DT").time_us
    assert deep_gemm.estimate_mqa_logits(np.int64(64), 64, arch="950DT").time_us > 0
    assert deep_gemm.estimate_gemm(np.int32(256), 256, 256).time_us > 0


# ------------------------------------------------------------------------------------------------------------------
# Scale rows of no group are not validated (upstream leaves them uninitialised on purpose)


def _bad_scales(rng, n: int, cols: int) -> np.ndarray:
    """fp32 rows the transform refuses: NaN, negative, not a power of two."""
    return rng.choice(np.array([np.nan, -1.0, 0.3, np.inf], np.float32), (n, cols))


def test_sfa_rows_of_no_group_are_not_validated(rng):
    """Rows after the last group's aligned end (psum), padding rows (both layouts) and -1 rows (per-row) may hold
    any bytes in sfa; D is bitwise the one of clean scales there. A bad scale inside a group is still refused."""
    sizes = [5, 300]
    psum, per_row, m = grouped_layouts(sizes, extra_rows=300)
    tail = -(-int(psum[-1]) // 256) * 256
    assert m > tail  # rows [tail, m) come after the last group's aligned end
    a, sfa = _fp8_pair(rng, (m,))
    b = _fp8_pair(rng, (len(sizes), N))
    d_clean = _garbage(rng, (m, N))
    deep_gemm.aclnn_m_grouped_fp8_fp4_gemm_nt_contiguous((a, sfa), b, d_clean, psum)
    dirty = sfa.copy()
    dirty[per_row < 0] = _bad_scales(rng, int((per_row < 0).sum()), K // 32)
    for layout, psum_layout in ((psum, True), (per_row, False)):
        d = _garbage(rng, (m, N))
        deep_gemm.aclnn_m_grouped_fp8_fp4_gemm_nt_contiguous((a, dirty), b, d, layout, use_psum_layout=psum_layout)
        assert_bitwise_equal(_bits(d), _bits(d_clean), f"use_psum_layout={psum_layout}")
    inside = dirty.copy()
    inside[7] = 0.3  # group 0's padding (group 0 owns rows [0, 5)): still not validated
    inside[260] = 0.3  # group 1 owns rows [256, 556): refused
    d = _garbage(rng, (m, N))
    _refused(lambda: deep_gemm.aclnn_m_grouped_fp8_fp4_gemm_nt_contiguous((a, inside), b, d, psum), [d], ValueError,
             r"sfa: fp32 sf must hold exact non-negative powers of two .*sf\[260, 0\]=0.3")
    # The public transform: the psum layout's rows of no group are zeroed and not validated, up to the last row
    req = transform_sf_into_required_layout(dirty, m, K, (1, 1, 32), is_sfa=True, psum_layout=psum)
    assert not np.asarray(req)[per_row < 0].any()
    # K-grouped: the K blocks past the last group's end are not validated either (kept as given)
    ks = np.array([256, 512], np.int32)  # groups end at K 256 and 512 of K_total = 1024
    sf_k = np.ones((8, 1024 // 32), np.float32)
    sf_k[:, 512 // 32:] = _bad_scales(rng, 8, 512 // 32)
    req_k = transform_k_grouped_sf_into_required_layout(sf_k, 8, 1024, (1, 1, 32), True, ks)
    assert (np.asarray(req_k).view(np.uint16)[:, :512 // 64] == 0x7F7F).all()
    sf_k[3, 300 // 32] = 0.3  # inside group 1: refused
    with pytest.raises(ValueError, match=r"sf\[3, 9\]=0.3"):
        transform_k_grouped_sf_into_required_layout(sf_k, 8, 1024, (1, 1, 32), True, ks)


# ------------------------------------------------------------------------------------------------------------------
# Per-row layout, ensure_zero_padding=False: the padding rows stay as they were (documented; as CUDA DeepGEMM,
# whose kernel never writes them and whose tests zero them in D before comparing)


def test_per_row_layout_without_zero_padding_leaves_the_padding_rows(rng):
    psum, per_row, m = grouped_layouts([5, 7], extra_rows=3)
    a, b = bf16_operand(rng, m, K), bf16_operand(rng, 2 * N, K).reshape(2, N, K)
    padding = per_row < 0
    d_zero = _garbage(rng, (m, N))
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, d_zero, per_row, use_psum_layout=False)
    assert not d_zero[padding].astype(np.float32).any()  # the default: zeros
    d_keep = _garbage(rng, (m, N))
    before = d_keep.copy()
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, d_keep, per_row, use_psum_layout=False,
                                                ensure_zero_padding=False)
    assert_bitwise_equal(_bits(d_keep[padding]), _bits(before[padding]), "padding rows untouched")
    assert_bitwise_equal(_bits(d_keep[~padding]), _bits(d_zero[~padding]), "the groups' rows as with zero padding")
    d_psum = before.copy()
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, d_psum, psum, ensure_zero_padding=False)
    assert_bitwise_equal(_bits(d_psum), _bits(d_keep), "the psum layout does the same")
