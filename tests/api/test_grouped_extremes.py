"""The grouped GEMMs at the edges the dense path already guards: dims beyond the kernels' uint32 refused before
anything is written (sparse memmaps: no memory touched), and extreme MX scale pairs (2^127 x 2^-127) rebalanced
so the stand-in's fp32 math is exact, bitwise the ordinary pair's D; ordinary scales bitwise unchanged.

Shapes reuse tests/api/test_grouped.py's (FP8 x FP8, N = 64, K = 256, bf16 D; K-grouped fp32 D, M = 48) so the
session's kernels are shared.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import deep_gemm
from deep_gemm.api import grouped
from deep_gemm.testing import assert_bitwise_equal, calc_diff, grouped_layouts, random_fp8_codes
from deep_gemm.utils.formats import bf16_bits_to_fp32, decode_e4m3

BF16 = ml_dtypes.bfloat16
FP8 = ml_dtypes.float8_e4m3fn
N, K = 64, 256
SIZES, EXTRA = [5, 0, 1, 300], 3  # test_grouped.py's 4-group contiguous case


def _sf(exps) -> np.ndarray:
    """fp32 scales 2^e from exponents in [-127, 127] (2^-127 is encoded by +0.0, byte 0)."""
    exps = np.asarray(exps)
    return np.where(exps == -127, 0.0, np.ldexp(1.0, np.maximum(exps, -126))).astype(np.float32)


def _vals(x: np.ndarray) -> np.ndarray:
    return decode_e4m3(x.view(np.uint8)).astype(np.float64)


def _d32(d: np.ndarray) -> np.ndarray:
    return bf16_bits_to_fp32(d.view(np.uint16)).astype(np.float64)


def _contiguous(rng):
    psum, per_row, m = grouped_layouts(SIZES, extra_rows=EXTRA)
    a = random_fp8_codes(rng, (m, K))
    b = random_fp8_codes(rng, (len(SIZES), N, K))
    return a, b, psum, per_row, m


def _exact(a, exps_a, b, exps_b, per_row) -> np.ndarray:
    """float64 D of the M-grouped contiguous problem, each row against its group's B (padding rows 0)."""
    va = _vals(a) * np.ldexp(1.0, np.repeat(exps_a, 32, axis=-1))
    vb = _vals(b) * np.ldexp(1.0, np.repeat(exps_b, 32, axis=-1))
    out = np.zeros((a.shape[0], b.shape[1]))
    for r, g in enumerate(per_row.tolist()):
        if g >= 0:
            out[r] = vb[g] @ va[r]
    return out


@pytest.mark.parametrize("ea, eb", [(127, -127), (-127, 127), (100, -90)])
def test_m_grouped_contiguous_extreme_scale_pairs_are_exact(rng, ea, eb):
    a, b, psum, per_row, m = _contiguous(rng)
    g = len(SIZES)
    exps_a, exps_b = np.full((m, K // 32), ea), np.full((g, N, K // 32), eb)
    d = np.zeros((m, N), BF16)
    deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((a, _sf(exps_a)), (b, _sf(exps_b)), d, psum)
    got = _d32(d)
    assert np.isfinite(got).all()
    exact = _exact(a, exps_a, b, exps_b, per_row)
    assert calc_diff(got, exact) < 1e-3
    # The numpy reference (float64 on the caller's scales) agrees
    d_ref = np.zeros((m, N), BF16)
    deep_gemm.aclnn_m_grouped_fp8_fp4_gemm_nt_contiguous((a, _sf(exps_a)), (b, _sf(exps_b)), d_ref, psum)
    assert calc_diff(got, _d32(d_ref)) < 1e-6
    # The same products from an ordinary pair (2^(ea + eb) x 2^0): bitwise the same D
    d_ord = np.zeros((m, N), BF16)
    deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((a, _sf(np.full((m, K // 32), ea + eb))),
                                                   (b, _sf(np.zeros((g, N, K // 32), int))), d_ord, psum)
    assert_bitwise_equal(d.view(np.uint16), d_ord.view(np.uint16), "extreme vs ordinary pair")


def test_m_grouped_contiguous_per_group_extreme_scales(rng):
    # Each group's B at its own extreme, A rows at the opposite one: only a side-by-side split covers every pair
    a, b, psum, per_row, m = _contiguous(rng)
    g = len(SIZES)
    eb_group = np.array([-127, 0, -120, -110])
    exps_b = np.broadcast_to(eb_group[:, None, None], (g, N, K // 32)).copy()
    exps_b += rng.integers(0, 3, exps_b.shape)
    row_group = np.maximum(per_row, 0)
    exps_a = np.broadcast_to((-eb_group[row_group])[:, None], (m, K // 32)).copy()
    exps_a = np.minimum(exps_a, 127)
    d = np.zeros((m, N), BF16)
    deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((a, _sf(exps_a)), (b, _sf(exps_b)), d, psum)
    got = _d32(d)
    assert np.isfinite(got).all()
    assert calc_diff(got, _exact(a, exps_a, b, exps_b, per_row)) < 1e-3


def test_m_grouped_contiguous_overflow_is_inf_with_the_exact_sign(rng):
    # 2^100 x 2^100: every nonzero sum is beyond fp32, so the output shift goes into alpha: +-Inf, never NaN
    a, b, psum, per_row, m = _contiguous(rng)
    exps_a, exps_b = np.full((m, K // 32), 100), np.full((len(SIZES), N, K // 32), 100)
    d = np.zeros((m, N), BF16)
    deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((a, _sf(exps_a)), (b, _sf(exps_b)), d, psum)
    exact = _exact(a, exps_a, b, exps_b, per_row)
    assert (exact > 0).any() and (exact < 0).any()
    assert np.array_equal(_d32(d), np.where(exact == 0, 0.0, np.copysign(np.inf, exact)))


def test_m_grouped_contiguous_ordinary_scales_bitwise_unchanged(rng):
    # "Before": the kernel launched on the checked plan directly, with no rebalancing step
    a, b, psum, per_row, m = _contiguous(rng)
    sfa = _sf(rng.choice((-9, -8, -7), (m, K // 32)))
    sfb = _sf(rng.choice((-9, -8, -7), (len(SIZES), N, K // 32)))
    d = np.zeros((m, N), BF16)
    deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((a, sfa), (b, sfb), d, psum, ensure_zero_padding=False)
    d_before = np.zeros((m, N), BF16)
    plan = grouped.plan_m_grouped_contiguous((a, sfa), (b, sfb), d_before, psum, kinds=("fp8", "fp4"), nn=False,
                                             ensure_zero_padding=False)
    sfa_phys, sfb_phys = plan.sfa, plan.sfb
    grouped.rebalance_m_grouped_sf(plan)
    assert plan.sfa is sfa_phys and plan.sfb is sfb_phys and plan.alpha == 1.0
    grouped._launch(plan)
    assert_bitwise_equal(d.view(np.uint16), d_before.view(np.uint16), "ordinary scales")


def test_m_grouped_masked_garbage_scales_past_masked_m_do_not_fail(rng):
    # test_grouped.py's masked shapes: extreme scales in the live rows, scales no split could carry past masked_m
    masked_m = np.array([0, 40, 1, 17], np.int32)
    g, max_m = 4, 40
    a = random_fp8_codes(rng, (g, max_m, K))
    b = random_fp8_codes(rng, (g, N, K))
    exps_a, exps_b = np.full((g, max_m, K // 32), 127), np.full((g, N, K // 32), -127)
    for gi, mm in enumerate(masked_m):
        exps_a[gi, mm:] = -127  # live A rows at 2^127 and these at 2^-127: no one split for both
    d = np.zeros((g, max_m, N), BF16)
    deep_gemm.m_grouped_fp8_gemm_nt_masked((a, _sf(exps_a)), (b, _sf(exps_b)), d, masked_m, 16)
    for gi, mm in enumerate(masked_m):
        assert not _d32(d[gi, mm:]).any()
        if mm:
            exact = (_vals(a[gi, :mm]) * 2.0**127) @ (_vals(b[gi]) * 2.0**-127).T
            assert calc_diff(_d32(d[gi, :mm]), exact) < 1e-3


def test_extreme_scales_no_split_can_carry_are_refused_before_writing(rng):
    # One K block of A's live rows spanning 2^-127..2^127 against B at 2^0: refused, naming the block and row
    a, b, psum, per_row, m = _contiguous(rng)
    exps_a = np.zeros((m, K // 32), int)
    exps_a[0, 2], exps_a[600, 2] = 127, -127  # row 0 (group 0) and row 600 (group 3)
    d = np.full((m, N), 3.0, BF16)
    with pytest.raises(ValueError, match=r"K block 2 .*sfa\[row 0, 2\]"):
        deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((a, _sf(exps_a)), (b, _sf(np.zeros((4, N, K // 32), int))),
                                                       d, psum)
    assert (d.astype(np.float32) == 3.0).all()


def test_k_grouped_extreme_scales_per_group(rng):
    # test_grouped.py's K-grouped shapes (M = 48, N = 64, fp32 D): group 0 at 2^127 x 2^-127, group 2 at 2^-120 x
    # 2^110, group 3 ordinary
    ks, m = [256, 0, 512, 128], 48
    psum, _, k_total = grouped_layouts(ks)
    a_t, b_t = random_fp8_codes(rng, (m, k_total)), random_fp8_codes(rng, (N, k_total))
    exps_a, exps_b = np.full((m, k_total // 32), -8), np.full((N, k_total // 32), -8)
    exps_a[:, :8], exps_b[:, :8] = 127, -127
    exps_a[:, 8:24], exps_b[:, 8:24] = -120, 110
    a = (np.ascontiguousarray(a_t.T), _sf(exps_a))
    b = (np.ascontiguousarray(b_t.T), _sf(exps_b))
    c = rng.standard_normal((len(ks), m, N)).astype(np.float32)
    d = np.zeros_like(c)
    deep_gemm.k_grouped_fp8_gemm_tn_contiguous(a, b, d, ks, psum, c=c)
    assert np.isfinite(d).all()
    va = _vals(a_t) * np.ldexp(1.0, np.repeat(exps_a, 32, axis=1))
    vb = _vals(b_t) * np.ldexp(1.0, np.repeat(exps_b, 32, axis=1))
    k0 = 0
    for g, kg in enumerate(ks):
        start = -(-k0 // 256) * 256
        ref = c[g].astype(np.float64) + va[:, start:start + kg] @ vb[:, start:start + kg].T
        assert calc_diff(d[g].astype(np.float64), ref) < 1e-3
        if kg:
            k0 = start + kg


# Dims beyond the kernels' uint32 (sparse files: no memory is touched), D untouched
def _sparse(tmp_path, nbytes):
    path = tmp_path / "big.bin"
    with open(path, "wb") as f:
        f.truncate(nbytes)
    return path


def test_grouped_dims_beyond_uint32_are_refused(tmp_path):
    big = 2**32
    path = _sparse(tmp_path, 2 * big)

    def mm(shape, dtype=FP8):
        return np.memmap(path, dtype=np.uint8 if dtype == FP8 else np.uint16, mode="r", shape=shape).view(dtype)

    sf2, sf3 = np.zeros((1, 1), np.float32), np.zeros((1, 1, 1), np.float32)
    small2, small3 = np.zeros((1, 1), FP8), np.zeros((1, 1, 1), FP8)
    lay = np.array([1], np.int32)
    d = np.full((1, 1), 3.0, np.float32)
    d3 = np.full((1, 1, 1), 3.0, np.float32)
    two = np.zeros((2, 1, 1), FP8)
    cases = [
        (lambda: deep_gemm.m_grouped_fp8_gemm_nt_contiguous((mm((1, big)), sf2), (mm((1, 1, big)), sf3), d, lay),
         "k=4294967296"),
        (lambda: deep_gemm.m_grouped_fp8_gemm_nt_contiguous((mm((big, 1)), sf2), (small3, sf3), d, lay),
         "m=4294967296"),
        (lambda: deep_gemm.m_grouped_fp8_gemm_nt_contiguous((small2, sf2), (mm((1, big, 1)), sf3), d, lay),
         "n=4294967296"),
        (lambda: deep_gemm.m_grouped_bf16_gemm_nt_contiguous(mm((1, big), BF16), mm((1, 1, big), BF16), d, lay),
         "k=4294967296"),
        (lambda: deep_gemm.m_grouped_fp8_gemm_nt_masked((mm((2, big // 2, 1)), sf3), (two, sf3), d3,
                                                        np.zeros(2, np.int32), 1), r"num_groups\*max_m=4294967296"),
        (lambda: deep_gemm.k_grouped_fp8_gemm_tn_contiguous((mm((big, 1)), sf2), (mm((big, 1)), sf2), d3, None, lay,
                                                            c=d3), "k_total=4294967296"),
        (lambda: deep_gemm.k_grouped_bf16_gemm_tn_contiguous(mm((big, 1), BF16), mm((big, 1), BF16), d3, None, lay),
         "k_total=4294967296"),
        (lambda: deep_gemm.fp8_bmm((mm((2, big // 2, 1)), sf3), (two, sf3), d3), r"batch\*m=4294967296"),
        (lambda: deep_gemm.bf16_bmm(mm((1, 1, big), BF16), mm((1, 1, big), BF16), d3), "k=4294967296"),
        (lambda: deep_gemm.einsum("bhr,hdr->bhd", mm((1, 1, big), BF16), mm((1, 1, big), BF16), d3),
         "k=4294967296"),
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=f"{name} exceeds 4294967295 .* uint32"):
            call()
        assert (d == 3.0).all() and (d3 == 3.0).all()


def test_fp8_bmm_extreme_scale_pairs_are_exact(rng):
    # test_grouped.py's bmm shape: 3 batches of 20 x 64 x 256, bf16 D; batch i's A at 2^127, its B at 2^-127
    nb, m = 3, 20
    a, b = random_fp8_codes(rng, (nb, m, K)), random_fp8_codes(rng, (nb, N, K))
    exps_a, exps_b = np.full((nb, m, K // 32), 127), np.full((nb, N, K // 32), -127)
    d = np.zeros((nb, m, N), BF16)
    deep_gemm.fp8_bmm((a, _sf(exps_a)), (b, _sf(exps_b)), d)
    exact = np.stack([(_vals(a[i]) * 2.0**127) @ (_vals(b[i]) * 2.0**-127).T for i in range(nb)])
    assert np.isfinite(_d32(d)).all()
    assert calc_diff(_d32(d), exact) < 1e-3
    d_ord = np.zeros((nb, m, N), BF16)
    deep_gemm.fp8_bmm((a, _sf(np.zeros_like(exps_a))), (b, _sf(np.zeros_like(exps_b))), d_ord)
    assert_bitwise_equal(d.view(np.uint16), d_ord.view(np.uint16), "extreme vs ordinary pair")
