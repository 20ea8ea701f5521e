"""calc_diff, count_bytes and assert_bitwise_equal on hand-computed cases."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from deep_gemm.testing import assert_bitwise_equal, calc_diff, count_bytes


def test_calc_diff_hand_cases():
    assert calc_diff(np.zeros((2, 3)), np.zeros((2, 3))) == 0.0
    assert calc_diff(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == 1.0
    assert calc_diff(np.array([1.0, 1.0]), np.array([1.0, 0.0])) == pytest.approx(1 / 3, abs=1e-15)
    assert calc_diff(np.array([3.0, -4.0]), np.array([-3.0, 4.0])) == 2.0
    assert calc_diff(np.array([2.0, 5.0]), np.zeros(2)) == 1.0
    x = np.random.default_rng(0).standard_normal(1000)
    assert abs(calc_diff(x, x)) < 1e-15


def test_calc_diff_float64_and_dtypes():
    # In fp32 the sums would lose the 1e-9 relative difference entirely; float64 keeps its square (~2.5e-19).
    x = np.full(1000, 1.0, np.float32)
    y = np.full(1000, np.float32(1.0) + np.float32(2.0**-23), np.float32)
    d = calc_diff(x, y)
    assert 0 < d < 1e-13
    bf = np.array([1.0, 2.0], ml_dtypes.bfloat16)
    assert calc_diff(bf, np.array([1.0, 2.0], np.float32)) == 0.0
    with pytest.raises(ValueError, match=r"\(2,\).*\(3,\)"):
        calc_diff(np.zeros(2), np.zeros(3))


def test_count_bytes():
    a = np.zeros((3, 4), np.float32)
    b = np.zeros(5, np.int16)
    c = np.zeros((2, 2), ml_dtypes.bfloat16)
    assert count_bytes(a) == 48
    assert count_bytes(a, None, (b, [c, None])) == 48 + 10 + 8
    assert count_bytes(a[:, ::2]) == 24
    assert count_bytes() == 0
    with pytest.raises(TypeError, match="int"):
        count_bytes(a, 3)


def test_assert_bitwise_equal_passes():
    x = np.array([1.0, np.nan, -0.0], np.float32)
    assert_bitwise_equal(x, x.copy())
    assert_bitwise_equal(x[::2], np.ascontiguousarray(x[::2]))
    assert_bitwise_equal(np.zeros((0, 3)), np.zeros((0, 3)))
    bf = np.array([1.5, -2.0], ml_dtypes.bfloat16)
    assert_bitwise_equal(bf, bf.copy())


def test_assert_bitwise_equal_reports_first_mismatch():
    x = np.zeros((2, 3), np.float32)
    y = x.copy()
    y[1, 0] = -0.0
    y[1, 2] = 1.0
    expected = r"\[tile\]: 2 of 6 elements differ; first at \(1, 0\): .*0x00000000.*0x80000000"
    with pytest.raises(AssertionError, match=expected):
        assert_bitwise_equal(x, y, label="tile")
    with pytest.raises(AssertionError, match="dtype mismatch: float32 vs float64"):
        assert_bitwise_equal(x, x.astype(np.float64))
    with pytest.raises(AssertionError, match=r"shape mismatch: \(2, 3\) vs \(3, 2\)"):
        assert_bitwise_equal(x, x.T.copy())
    nan_a = np.array([0x7FC00000], np.uint32).view(np.float32)
    nan_b = np.array([0x7FC00001], np.uint32).view(np.float32)
    with pytest.raises(AssertionError, match="0x7fc00000.*0x7fc00001"):
        assert_bitwise_equal(nan_a, nan_b)
