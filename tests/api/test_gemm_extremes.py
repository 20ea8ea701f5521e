"""Inputs at the edges of what the chip computes: extreme MX scale pairs (computed as the chip scales a block's
product, checked against an exact float64 reference), overflowing results (+-Inf with the exact sum's sign),
ordinary scales bitwise unchanged, and inputs refused at the API before anything is written: alpha beyond fp32,
masked arrays and non-arrays, dims beyond the kernels' uint32 (whatever ``compiled_dims``), scale spreads no exact
split can apply. ndarray subclasses (np.matrix, np.memmap) work like plain arrays.

Shapes reuse tests/api/test_gemm.py's (17 x 72 x 96 FP8, 18 x 48 x 192 FP4, 9 x 80 x 256 FP8 x FP4, bf16 D), so the
session's kernels are shared.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import deep_gemm
from deep_gemm.api.gemm import check_fp8_fp4_problem
from deep_gemm.kernels.fp8_gemm import launch_fp8_gemm
from deep_gemm.testing import bf16_operand, calc_diff, random_fp4_codes, random_fp8_codes, reference_gemm
from deep_gemm.utils.formats import bf16_bits_to_fp32, decode_e2m1, decode_e4m3, pack_fp4

BF16 = ml_dtypes.bfloat16
FP8 = ml_dtypes.float8_e4m3fn
TOL = {("fp8", "fp8"): 1e-3, ("fp8", "fp4"): 1e-2, ("fp4", "fp4"): 2e-2}
# (a kind, b kind, m, n, k), K-major operands, bf16 D: the kernels test_gemm.py's FP_CASES compile
KINDS = [("fp8", "fp8", 17, 72, 96), ("fp4", "fp4", 18, 48, 192), ("fp8", "fp4", 9, 80, 256)]
FP32_MAX = float(np.finfo(np.float32).max)


def _codes(rng, kind, mn, k):
    """(operand array, its float64 values at unit scale [mn, k])."""
    if kind == "fp8":
        x = random_fp8_codes(rng, (mn, k))
        return x, decode_e4m3(x.view(np.uint8)).astype(np.float64)
    codes = random_fp4_codes(rng, (mn, k))
    return pack_fp4(codes, axis=-1), decode_e2m1(codes).astype(np.float64)


def _sf(exps) -> np.ndarray:
    """fp32 scales 2^e from an int array of exponents in [-127, 127] (2^-127 is encoded by +0.0, byte 0)."""
    exps = np.asarray(exps)
    return np.where(exps == -127, 0.0, np.ldexp(1.0, np.maximum(exps, -126))).astype(np.float32)


def _exact(values_a, exps_a, values_b, exps_b) -> np.ndarray:
    """float64 D = (A * 2^ea) @ (B * 2^eb)^T with per-(row, 32-block) exponents (exact: no overflow in float64)."""
    k = values_a.shape[1]
    return (values_a * np.ldexp(1.0, np.repeat(exps_a, 32, axis=1)[:, :k])) @ \
        (values_b * np.ldexp(1.0, np.repeat(exps_b, 32, axis=1)[:, :k])).T


def _d32(d: np.ndarray) -> np.ndarray:
    return bf16_bits_to_fp32(d.view(np.uint16)).astype(np.float64)


# Extreme scale pairs: exact products, bitwise the result of the equivalent ordinary pair
@pytest.mark.parametrize("kinds", KINDS, ids=lambda c: f"{c[0]}x{c[1]}")
@pytest.mark.parametrize("ea, eb", [(127, -127), (100, -90), (-127, 127), (-120, 100)])
def test_extreme_scale_pairs_are_exact(rng, kinds, ea, eb):
    kind_a, kind_b, m, n, k = kinds
    (a, va), (b, vb) = _codes(rng, kind_a, m, k), _codes(rng, kind_b, n, k)
    nb = k // 32
    exps_a, exps_b = np.full((m, nb), ea), np.full((n, nb), eb)
    d = np.zeros((m, n), BF16)
    deep_gemm.fp8_fp4_gemm_nt((a, _sf(exps_a)), (b, _sf(exps_b)), d)
    assert np.isfinite(_d32(d)).all()
    exact = _exact(va, exps_a, vb, exps_b)
    assert calc_diff(_d32(d), exact) < TOL[(kind_a, kind_b)]
    # The same products from an ordinary pair (2^(ea + eb) x 2^0): bitwise the same D
    d_ordinary = np.zeros((m, n), BF16)
    deep_gemm.fp8_fp4_gemm_nt((a, _sf(np.full((m, nb), ea + eb))), (b, _sf(np.zeros((n, nb), int))), d_ordinary)
    assert np.array_equal(d.view(np.uint16), d_ordinary.view(np.uint16))


def test_scales_no_normal_split_can_carry_run_exactly_on_the_fma_cube(rng):
    # An A row scaled by 2^-127 beside rows at 2^113 in the same K blocks (B at 2^-10: sums stay below 2^126, the
    # tiny row's products above 2^-149): no split keeps every A value a normal fp32 and in range, so the AMX Cube
    # (which reads subnormal bf16 as zero) cannot take the call; it runs on the fp32 FMA Cube, exact, and the tiny
    # row is not lost.
    kind_a, kind_b, m, n, k = KINDS[2]
    (a, va), (b, vb) = _codes(rng, kind_a, m, k), _codes(rng, kind_b, n, k)
    nb = k // 32
    exps_a = np.full((m, nb), 113)
    exps_a[0] = -127
    exps_b = np.full((n, nb), -10)
    d = np.zeros((m, n), BF16)
    deep_gemm.fp8_fp4_gemm_nt((a, _sf(exps_a)), (b, _sf(exps_b)), d)
    exact = _exact(va, exps_a, vb, exps_b)
    assert calc_diff(_d32(d)[1:], exact[1:]) < TOL[(kind_a, kind_b)]
    assert np.all(exact[0] != 0) and calc_diff(_d32(d)[:1], exact[:1]) < TOL[(kind_a, kind_b)]


@pytest.mark.parametrize("kinds", KINDS, ids=lambda c: f"{c[0]}x{c[1]}")
def test_extreme_per_block_scales_are_exact(rng, kinds):
    # Every (row, K block) its own exponent: A in 2^100..2^127, B in 2^-127..2^-100 (the old path gave NaN/Inf)
    kind_a, kind_b, m, n, k = kinds
    (a, va), (b, vb) = _codes(rng, kind_a, m, k), _codes(rng, kind_b, n, k)
    exps_a = rng.integers(100, 128, (m, k // 32))
    exps_b = rng.integers(-127, -99, (n, k // 32))
    d = np.zeros((m, n), BF16)
    deep_gemm.fp8_fp4_gemm_nt((a, _sf(exps_a)), (b, _sf(exps_b)), d)
    assert np.isfinite(_d32(d)).all()
    assert calc_diff(_d32(d), _exact(va, exps_a, vb, exps_b)) < TOL[(kind_a, kind_b)]
    d_ordinary = np.zeros((m, n), BF16)
    deep_gemm.fp8_fp4_gemm_nt((a, _sf(exps_a - 110)), (b, _sf(exps_b + 110)), d_ordinary)
    assert np.array_equal(d.view(np.uint16), d_ordinary.view(np.uint16))


@pytest.mark.parametrize("kinds", KINDS, ids=lambda c: f"{c[0]}x{c[1]}")
def test_ordinary_scales_give_the_same_bits_as_before(rng, kinds):
    # "Before": the kernel launched on the checked scales directly, with no rebalancing step in between.
    kind_a, kind_b, m, n, k = kinds
    (a, _), (b, _) = _codes(rng, kind_a, m, k), _codes(rng, kind_b, n, k)
    choices = (-9, -8, -7) if kind_a == "fp8" else (-2, -1, 0)
    sfa, sfb = _sf(rng.choice(choices, (m, k // 32))), _sf(rng.choice((-2, -1, 0, -9), (n, k // 32)))
    d = np.zeros((m, n), BF16)
    deep_gemm.fp8_fp4_gemm_nt((a, sfa), (b, sfb), d, alpha=0.75)
    p = check_fp8_fp4_problem((a, sfa), (b, sfb), np.zeros((m, n), BF16), None, None, None, None, False)
    d_before = np.zeros((m, n), BF16)
    launch_fp8_gemm(p.op_a.gm, p.op_a.major, p.op_a.kind, p.sfa, p.op_b.gm, p.op_b.major, p.op_b.kind, p.sfb,
                    d_before.view(np.uint16), m, n, k, with_accumulation=False, alpha=0.75, compiled_dims="nk")
    assert np.array_equal(d.view(np.uint16), d_before.view(np.uint16))


# Overflowing results: +-Inf with the sign of the exact sum, as the chip
def test_overflow_is_inf_with_the_exact_sums_sign(rng):
    m, n, k = 17, 72, 96
    (a, va), (b, vb) = _codes(rng, "fp8", m, k), _codes(rng, "fp8", n, k)
    exps = np.full((m, 3), 100), np.full((n, 3), 100)
    d = np.zeros((m, n), BF16)
    deep_gemm.fp8_gemm_nt((a, _sf(exps[0])), (b, _sf(exps[1])), d)
    exact = _exact(va, exps[0], vb, exps[1])  # 2^100 x 2^100: every nonzero sum is far beyond fp32
    got = _d32(d)
    assert not np.isnan(got).any()
    assert (np.abs(exact[exact != 0]) > 2 * FP32_MAX).all() and (exact > 0).any() and (exact < 0).any()
    assert np.array_equal(got, np.where(exact == 0, 0.0, np.copysign(np.inf, exact)))


def test_overflow_with_c_and_alpha_is_nan_only_for_inf_minus_inf(rng):
    # fp32 D with C (the kernel of test_gemm.py's accumulate test): D = C + alpha * acc in fp32, so an overflowing
    # product meets C's infinities as on the chip: Inf - Inf = NaN, Inf + finite = Inf.
    m, n, k = 17, 72, 96
    (a, va), (b, vb) = _codes(rng, "fp8", m, k), _codes(rng, "fp8", n, k)
    exps_a, exps_b = np.full((m, 3), 100), np.full((n, 3), 100)
    c = rng.standard_normal((m, n)).astype(np.float32)
    c[::3] = np.inf
    c[1::3] = -np.inf
    d = np.zeros((m, n), np.float32)
    deep_gemm.fp8_gemm_nt((a, _sf(exps_a)), (b, _sf(exps_b)), d, c=c, alpha=-0.75)
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = (-0.75 * _exact(va, exps_a, vb, exps_b)).astype(np.float32)  # +-Inf (or 0 for a zero sum)
        expected = c + scaled
    assert np.isnan(expected).any() and np.isinf(expected).any()
    assert np.array_equal(d, expected, equal_nan=True)


def test_partly_overflowing_results(rng):
    # Scales putting the median |sum| at 2^128: about half the outputs overflow, the rest stay exact-close.
    m, n, k = 17, 72, 96
    (a, va), (b, vb) = _codes(rng, "fp8", m, k), _codes(rng, "fp8", n, k)
    unit = va @ vb.T
    total = 128 - int(np.round(np.log2(np.median(np.abs(unit[unit != 0])))))
    exps_a, exps_b = np.full((m, 3), total - 127), np.full((n, 3), 127)
    d = np.zeros((m, n), BF16)
    deep_gemm.fp8_gemm_nt((a, _sf(exps_a)), (b, _sf(exps_b)), d)
    exact, got = _exact(va, exps_a, vb, exps_b), _d32(d)
    big, small = np.abs(exact) > 1.01 * FP32_MAX, np.abs(exact) < 0.99 * float(ml_dtypes.finfo(BF16).max)
    assert big.sum() > 100 and small.sum() > 100
    assert np.array_equal(got[big], np.copysign(np.inf, exact[big]))
    assert calc_diff(got[small], exact[small]) < 1e-3 and np.isfinite(got[small]).all()


# Refused at the API, d untouched
def _fp8_problem(rng, m=17, n=72, k=96):
    (a, _), (b, _) = _codes(rng, "fp8", m, k), _codes(rng, "fp8", n, k)
    return a, b, np.full((m, k // 32), -8), np.full((n, k // 32), -8)


def _assert_refused(call, d, exc, match):
    before = d.copy()
    with pytest.raises(exc, match=match):
        call()
    assert np.array_equal(np.asarray(d).view(np.uint8), before.view(np.uint8)), "d was written"


def test_scale_spreads_no_split_can_apply_are_refused(rng):
    a, b, ea, eb = _fp8_problem(rng)
    d = rng.standard_normal((17, 72)).astype(BF16)
    wide = ea.copy()
    wide[3, 1], wide[5, 1] = 127, -127  # one K-block column spanning 2^254
    _assert_refused(lambda: deep_gemm.fp8_gemm_nt((a, _sf(wide)), (b, _sf(eb)), d), d, ValueError,
                    r"sfa: the scales of K block 1 \(K 32..63\) span 2\^-127..2\^127 \(max at sfa\[3, 1\]\)")
    huge_a, huge_b = np.full_like(ea, 127), np.full_like(eb, 127)  # sums near 2^270: beyond fp32 and alpha
    _assert_refused(lambda: deep_gemm.fp8_gemm_nt((a, _sf(huge_a)), (b, _sf(huge_b)), d), d, ValueError,
                    "beyond what the stand-in can carry")


@pytest.mark.parametrize("alpha", [1e39, -1e39, 10**400, np.float64(3.5e38), -(2**128)])
def test_alpha_beyond_fp32_is_refused(rng, alpha):
    a, b, ea, eb = _fp8_problem(rng)
    d = rng.standard_normal((17, 72)).astype(BF16)
    _assert_refused(lambda: deep_gemm.fp8_gemm_nt((a, _sf(ea)), (b, _sf(eb)), d, alpha=alpha), d, ValueError,
                    "alpha")
    x, y = bf16_operand(rng, 17, 96), bf16_operand(rng, 72, 96)
    _assert_refused(lambda: deep_gemm.bf16_gemm_nt(x, y, d, alpha=alpha), d, ValueError,
                    "alpha.*outside fp32's finite range")


def test_masked_arrays_and_non_arrays_are_refused(rng):
    a, b, ea, eb = _fp8_problem(rng)
    d = rng.standard_normal((17, 72)).astype(np.float32)
    masked_d = np.ma.masked_array(d.copy(), mask=np.zeros(d.shape, bool))
    _assert_refused(lambda: deep_gemm.fp8_gemm_nt((a, _sf(ea)), (b, _sf(eb)), masked_d), d, TypeError,
                    "d is a numpy masked array")
    masked_a = np.ma.masked_array(a.view(np.uint8)).view(type=np.ma.MaskedArray, dtype=FP8)
    _assert_refused(lambda: deep_gemm.fp8_gemm_nt((masked_a, _sf(ea)), (b, _sf(eb)), d), d, TypeError,
                    r"a\[0\] is a numpy masked array")
    _assert_refused(lambda: deep_gemm.bf16_gemm_nt(bf16_operand(rng, 17, 96).tolist(), bf16_operand(rng, 72, 96),
                                                   d), d, TypeError, "a must be a numpy.ndarray, got list")
    _assert_refused(lambda: deep_gemm.fp8_gemm_nt((a, _sf(ea)), (b, _sf(eb)), memoryview(d)), d, TypeError,
                    "d must be a numpy.ndarray, got memoryview")


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix, on purpose
def test_ndarray_subclasses_work_as_plain_arrays(rng, tmp_path):
    a, b, ea, eb = _fp8_problem(rng)
    d = np.zeros((17, 72), BF16)
    deep_gemm.fp8_gemm_nt((a, _sf(ea)), (b, _sf(eb)), d)
    # np.matrix d (used to fail as a JIT CompileError after compiling): written in place, same bits
    d_matrix = np.asmatrix(np.full((17, 72), 7.0, BF16))
    deep_gemm.fp8_gemm_nt((a, _sf(ea)), (b, _sf(eb)), d_matrix)
    assert type(d_matrix) is np.matrix and np.array_equal(np.asarray(d_matrix).view(np.uint16), d.view(np.uint16))
    # np.memmap operand and np.matrix scale factors
    path = tmp_path / "a.bin"
    a.view(np.uint8).tofile(path)
    a_map = np.memmap(path, dtype=np.uint8, mode="r", shape=a.shape).view(FP8)
    d_map = np.zeros((17, 72), BF16)
    deep_gemm.fp8_gemm_nt((a_map, np.asmatrix(_sf(ea))), (b, _sf(eb)), d_map)
    assert np.array_equal(d_map.view(np.uint16), d.view(np.uint16))
    # BF16 with np.matrix operands, in the nn form (B given as [K, N]: .T of a matrix is a matrix)
    x, y = bf16_operand(rng, 17, 96), bf16_operand(rng, 72, 96)
    d32 = np.zeros((17, 72), np.float32)
    deep_gemm.bf16_gemm_nn(np.asmatrix(x), np.asmatrix(np.ascontiguousarray(y.T)), d32)
    assert calc_diff(d32, reference_gemm(x, y)) < 1e-5


# Dims beyond the kernels' uint32, whatever compiled_dims (sparse files: no memory is touched)
def _sparse(tmp_path, name, nbytes):
    path = tmp_path / name
    with open(path, "wb") as f:
        f.truncate(nbytes)
    return path


@pytest.mark.parametrize("compiled_dims", ["nk", "mn", "mnk", ""])
def test_dims_beyond_uint32_are_refused(tmp_path, compiled_dims):
    big = 2**32
    path = _sparse(tmp_path, "big.bin", 2 * big)
    d = np.full((1, 1), 3.0, np.float32)
    sf = np.zeros((1, 1), np.float32)
    row = np.memmap(path, dtype=np.uint8, mode="r", shape=(1, big)).view(FP8)  # [1, 2^32]: K = 2^32
    col = np.memmap(path, dtype=np.uint8, mode="r", shape=(big, 1)).view(FP8)  # [2^32, 1]: MN = 2^32
    small = np.zeros((1, 1), FP8)
    cases = [
        (lambda: deep_gemm.fp8_gemm_nt((row, sf), (row, sf), d, compiled_dims=compiled_dims), "k=4294967296"),
        (lambda: deep_gemm.fp8_gemm_nt((col, sf), (small, sf), d, compiled_dims=compiled_dims), "m=4294967296"),
        (lambda: deep_gemm.fp8_gemm_nt((small, sf), (col, sf), d, compiled_dims=compiled_dims), "n=4294967296"),
    ]
    bf16_row = np.memmap(path, dtype=np.uint16, mode="r", shape=(1, big)).view(BF16)
    cases.append((lambda: deep_gemm.bf16_gemm_nt(bf16_row, bf16_row, d, compiled_dims=compiled_dims),
                  "k=4294967296"))
    for call, name in cases:
        _assert_refused(call, d, ValueError, f"{name} exceeds 4294967295 .* uint32")


def test_fp8_on_a_bf16_only_arch_is_refused_before_c_reaches_d(rng):
    """910B2 has no FP8 Cube: refused at the API, before C is copied into D (dense and M-grouped)."""
    a, b, ea, eb = _fp8_problem(rng)
    d = rng.standard_normal((17, 72)).astype(BF16)
    c = np.ones((17, 72), BF16)
    with deep_gemm.runtime_scope(arch="910B2"):
        _assert_refused(lambda: deep_gemm.fp8_gemm_nt((a, _sf(ea)), (b, _sf(eb)), d, c=c), d, ValueError,
                        "a is fp8, but arch 910B2 has no fp8 Cube path")
        dg = np.full((256 + 5, 72), 3.0, BF16)
        ag, _ = _codes(rng, "fp8", 256 + 5, 96)
        layout = np.array([256, 261], np.int32)  # group 1 owns rows [256, 261)
        sfag = _sf(np.full((261, 3), -8))
        bg = np.stack([b, b])
        sfbg = np.stack([_sf(eb), _sf(eb)])
        _assert_refused(lambda: deep_gemm.m_grouped_fp8_gemm_nt_contiguous((ag, sfag), (bg, sfbg), dg, layout),
                        dg, ValueError, "arch 910B2 has no fp8 Cube path")


def test_dry_run_of_an_empty_k_batched_gemm_leaves_d_alone(rng):
    a = np.zeros((2, 3, 0), BF16)
    b = np.zeros((2, 4, 0), BF16)
    d = np.full((2, 3, 4), 5.0, BF16)
    with deep_gemm.runtime.dry_run():
        deep_gemm.bf16_bmm(a, b, d)
    assert (d.astype(np.float32) == 5.0).all()
    deep_gemm.bf16_bmm(a, b, d)
    assert (d.astype(np.float32) == 0.0).all()
