"""rebalance_sf_exponents: exponents moved between A, B and alpha per 32-K block leave every product of a scale
pair unchanged, keep scaled operands finite in fp32, touch nothing on ordinary scales, and refuse what no split fixes.

Pure numpy; the end-to-end GEMM checks are in tests/api/test_gemm_extremes.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from deep_gemm.utils.layout import rebalance_sf_exponents

MAX_BYTE = {"fp8": 246, "fp4": 252}


def _phys(exps: np.ndarray) -> np.ndarray:
    """UE8M0 bytes [MN, num_blocks] -> the kernels' C-contiguous int16 [ceil(blocks / 2), MN]."""
    mn, nb = exps.shape
    full = np.zeros((mn, 2 * (-(-nb // 2))), np.uint16)
    full[:, :nb] = exps
    pairs = full[:, 0::2] | (full[:, 1::2] << 8)
    return np.ascontiguousarray(pairs.T).view(np.int16)


def _bytes(phys: np.ndarray, nb: int) -> np.ndarray:
    """Inverse of _phys: int [MN, num_blocks] (the high byte of an odd tail must be 0)."""
    bits = phys.view(np.uint16).T.astype(np.int64)
    out = np.empty((bits.shape[0], 2 * bits.shape[1]), np.int64)
    out[:, 0::2], out[:, 1::2] = bits & 0xFF, bits >> 8
    assert not out[:, nb:].any(), "an odd tail's high byte must stay 0"
    return out[:, :nb]


def _assert_products_kept(ea, eb, new_a, new_b, shift):
    """ea[m, kb] + eb[n, kb] == new_a[m, kb] + new_b[n, kb] + shift for every (m, n, kb) not involving NaN."""
    before = ea[:, None, :] + eb[None, :, :]
    after = new_a[:, None, :] + new_b[None, :, :] + shift
    valid = (ea[:, None, :] != 255) & (eb[None, :, :] != 255)
    assert np.array_equal(before[valid], after[valid])


@pytest.mark.parametrize("kind_a, kind_b", [("fp8", "fp8"), ("fp4", "fp4"), ("fp8", "fp4")])
def test_ordinary_scales_come_back_untouched(rng, kind_a, kind_b):
    # Every byte at most the operand's limit: c = 0 everywhere, the very arrays come back (bitwise the same D).
    for (lo_a, hi_a), (lo_b, hi_b) in (((118, 121), (118, 121)), ((0, 40), (0, 40)), ((200, 246), (0, 60)),
                                       ((0, 60), (200, 246))):
        sfa = _phys(rng.integers(lo_a, hi_a + 1, (13, 5)))
        sfb = _phys(rng.integers(lo_b, hi_b + 1, (7, 5)))
        new_a, new_b, shift = rebalance_sf_exponents(sfa, sfb, 5 * 32, kind_a, kind_b)
        assert new_a is sfa and new_b is sfb and shift == 0


@pytest.mark.parametrize("kind_a, kind_b", [("fp8", "fp8"), ("fp4", "fp4"), ("fp8", "fp4")])
@pytest.mark.parametrize("ea_range, eb_range", [((254, 254), (0, 0)), ((227, 254), (0, 37)),
                                                ((0, 30), (230, 254)), ((150, 254), (0, 10))])
def test_extreme_pairs_rebalanced_exactly(rng, kind_a, kind_b, ea_range, eb_range):
    nb = 5  # odd: the last pair's high byte carries no block
    ea = rng.integers(ea_range[0], ea_range[1] + 1, (9, nb))
    eb = rng.integers(eb_range[0], eb_range[1] + 1, (6, nb))
    new_a, new_b, shift = rebalance_sf_exponents(_phys(ea), _phys(eb), nb * 32 - 7, kind_a, kind_b)
    assert shift == 0  # the combined exponents are small: nothing moves to alpha
    na, nbb = _bytes(new_a, nb), _bytes(new_b, nb)
    _assert_products_kept(ea, eb, na, nbb, shift)
    assert 0 <= na.min() and na.max() <= MAX_BYTE[kind_a]
    assert 0 <= nbb.min() and nbb.max() <= MAX_BYTE[kind_b]


def test_nan_bytes_and_unaffected_blocks_stay():
    ea = np.array([[254, 120], [255, 121]])
    eb = np.array([[0, 119], [3, 255]])
    new_a, new_b, shift = rebalance_sf_exponents(_phys(ea), _phys(eb), 64, "fp8", "fp8")
    na, nb = _bytes(new_a, 2), _bytes(new_b, 2)
    assert na[1, 0] == 255 and nb[1, 1] == 255  # NaN stays NaN
    assert np.array_equal(na[:, 1], ea[:, 1]) and np.array_equal(nb[:, 1], eb[:, 1])  # block 1 was fine
    assert na[0, 0] <= 246 and shift == 0
    _assert_products_kept(ea, eb, na, nb, shift)


def test_sums_that_can_overflow_move_to_alpha():
    # 2^100 x 2^100: every product exceeds fp32 (the chip overflows too); the shift goes to alpha so the fp32 sum
    # stays finite and alpha * acc overflows with the sum's sign.
    ea, eb = np.full((4, 3), 227), np.full((5, 3), 227)
    new_a, new_b, shift = rebalance_sf_exponents(_phys(ea), _phys(eb), 96, "fp8", "fp8")
    assert 0 < shift <= 126
    na, nb = _bytes(new_a, 3), _bytes(new_b, 3)
    _assert_products_kept(ea, eb, na, nb, shift)
    # The largest possible |sum| after the shift stays below 2^127 in fp32.
    assert 448.0 * 448.0 * 96 * 2.0 ** (int(na.max() + nb.max()) - 254) < 2.0**127
    # alpha's room bounds the shift
    with pytest.raises(ValueError, match="beyond what the stand-in can carry"):
        rebalance_sf_exponents(_phys(ea), _phys(eb), 96, "fp8", "fp8", max_out_shift=10)


@pytest.mark.parametrize(
    "ea, eb, match",
    [
        # A's bytes in one block span 2^127 .. 2^-127: no single c keeps both rows finite and non-negative
        ([[254, 120], [0, 120]], [[27, 27]], r"sfa: the scales of K block 0 \(K 0..31\) span 2\^-127..2\^127 "
                                             r"\(max at sfa\[0, 0\]\)"),
        ([[27, 27]], [[120, 120], [120, 254], [120, 0]], r"sfb: the scales of K block 1 .*max at sfb\[1, 1\]"),
        # 2^127 x 2^127: sums beyond 2^250, more than fp32 plus alpha can carry
        ([[254]], [[254]], "beyond what the stand-in can carry"),
        # overflowing sums next to products so small that a shifted accumulator would lose them
        ([[240, 0]], [[200, 0]], r"K block 1 has scales as small as 2\^-127 x 2\^-127"),
    ],
)
def test_refusals_name_the_block(ea, eb, match):
    ea, eb = np.array(ea), np.array(eb)
    with pytest.raises(ValueError, match=match):
        rebalance_sf_exponents(_phys(ea), _phys(eb), 32 * ea.shape[1], "fp8", "fp8")


def test_empty_problems_pass_through():
    sfa, sfb = np.zeros((0, 4), np.int16), np.zeros((0, 3), np.int16)
    assert rebalance_sf_exponents(sfa, sfb, 0, "fp8", "fp8") == (sfa, sfb, 0)
    sfa, sfb = np.zeros((1, 0), np.int16), np.full((1, 3), 254, np.int16)
    out = rebalance_sf_exponents(sfa, sfb, 64, "fp8", "fp8")
    assert out[0] is sfa and out[1] is sfb and out[2] == 0


MIN_NORMAL_BYTE = {"fp8": 10, "fp4": 2}  # every nonzero code x 2^(byte - 127) is a normal fp32 from here


@pytest.mark.parametrize("kind_a, kind_b", [("fp8", "fp8"), ("fp4", "fp4"), ("fp8", "fp4")])
def test_require_normal_lifts_small_scales_or_refuses(rng, kind_a, kind_b):
    # The AMX Cube reads subnormal bf16 as zero: with require_normal every scaled operand value ends up normal
    # (products unchanged), the untouched fast path only when that already holds; no split -> SubnormalOperandsError
    # (a ValueError), which the API answers by running the call on the FMA Cube.
    from deep_gemm.utils.layout import SubnormalOperandsError

    nb = 5
    ea, eb = rng.integers(0, 9, (9, nb)), rng.integers(100, 130, (6, nb))  # A scaled into fp32 subnormals
    sfa, sfb = _phys(ea), _phys(eb)
    assert rebalance_sf_exponents(sfa, sfb, nb * 32, kind_a, kind_b)[0] is sfa  # exact in fp32 already
    new_a, new_b, shift = rebalance_sf_exponents(sfa, sfb, nb * 32, kind_a, kind_b, require_normal=True)
    na, nbb = _bytes(new_a, nb), _bytes(new_b, nb)
    _assert_products_kept(ea, eb, na, nbb, shift)
    assert na.min() >= MIN_NORMAL_BYTE[kind_a] and nbb.min() >= MIN_NORMAL_BYTE[kind_b]
    ordinary = _phys(rng.integers(118, 122, (9, nb)))
    assert rebalance_sf_exponents(ordinary, sfb, nb * 32, kind_a, kind_b, require_normal=True)[0] is ordinary
    # Both sides tiny in the same K block: any split leaves one of them subnormal
    tiny_a, tiny_b = _phys(np.zeros((9, nb), int)), _phys(np.ones((6, nb), int))
    with pytest.raises(SubnormalOperandsError, match="K block 0"):
        rebalance_sf_exponents(tiny_a, tiny_b, nb * 32, kind_a, kind_b, require_normal=True)
    assert rebalance_sf_exponents(tiny_a, tiny_b, nb * 32, kind_a, kind_b)[0] is tiny_a
