"""Dequantization and the float64 reference GEMM against hand values and explicit loops."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from deep_gemm.testing import dequantize_fp4, dequantize_fp8, reference_gemm
from deep_gemm.utils import pack_fp4, transform_sf_into_required_layout


def test_dequantize_fp8_hand_case():
    codes = np.array([[0x38, 0xB8, 0x7E], [0x01, 0x00, 0x40]], np.uint8)  # 1, -1, 448 / 2^-9, 0, 2
    sf = np.array([[2.0**-7, 4.0], [0.5, 1.0]], np.float32)  # gran_k 2: columns {0,1} and {2}
    out = dequantize_fp8(codes, sf, gran_mn=1, gran_k=2)
    assert out.dtype == np.float64
    assert out.tolist() == [[2.0**-7, -(2.0**-7), 448.0 * 4], [2.0**-10, 0.0, 2.0]]
    # Same through the float8 dtype, a MN-major view, gran_mn 2, and the int16 required layout.
    fp8 = codes.view(ml_dtypes.float8_e4m3fn)
    assert dequantize_fp8(fp8.T.copy().T, sf, 1, 2).tolist() == out.tolist()
    sf1 = np.array([[2.0, 0.25]], np.float32)
    assert dequantize_fp8(codes, sf1, gran_mn=2, gran_k=2)[1].tolist() == [2.0**-8, 0.0, 0.5]


def test_dequantize_fp8_int16_layout_matches_fp32(rng):
    codes = rng.integers(0, 0x7E, size=(5, 100), dtype=np.uint8)
    sf = np.exp2(rng.integers(-9, -6, size=(5, 4))).astype(np.float32)
    req = transform_sf_into_required_layout(sf, 5, 100, (1, 1, 32), is_sfa=True)
    np.testing.assert_array_equal(dequantize_fp8(codes, req), dequantize_fp8(codes, sf, 1, 32))
    with pytest.raises(ValueError, match="gran_mn=1 gran_k=32, got gran_mn=2"):
        dequantize_fp8(codes, req, 2, 32)


def test_dequantize_fp4_both_majors():
    codes = np.array([[1, 2, 3, 15], [7, 0, 9, 4]], np.uint8)  # 0.5 1 1.5 -6 / 6 0 -0.5 2
    sf = np.array([[2.0, 0.5], [1.0, 4.0]], np.float32)  # gran_k 2
    want = [[1.0, 2.0, 0.75, -3.0], [6.0, 0.0, -2.0, 8.0]]
    assert dequantize_fp4(pack_fp4(codes), sf, 1, 2).tolist() == want
    mn_major = pack_fp4(codes, axis=0).T.copy().T  # logical [mn/2, k], stored [k, mn/2]
    assert dequantize_fp4(mn_major, sf, 1, 2, packed_axis=0).tolist() == want
    with pytest.raises(ValueError, match="packed_axis"):
        dequantize_fp4(pack_fp4(codes), sf, 1, 2, packed_axis=2)


def test_dequantize_errors():
    with pytest.raises(TypeError, match="int16"):
        dequantize_fp8(np.zeros((2, 2), np.int16), np.ones((2, 1), np.float32))
    with pytest.raises(ValueError, match=r"\(2, 2\) != \(2, 1\)"):
        dequantize_fp8(np.zeros((2, 2), np.uint8), np.ones((2, 2), np.float32))
    with pytest.raises(TypeError, match="float64"):
        dequantize_fp8(np.zeros((2, 2), np.uint8), np.ones((2, 1)))
    with pytest.raises(ValueError, match="gran_k"):
        dequantize_fp8(np.zeros((2, 2), np.uint8), np.ones((2, 1), np.float32), 1, 0)
    with pytest.raises(TypeError, match="int8"):
        dequantize_fp4(np.zeros((2, 2), np.float32), np.ones((2, 1), np.float32))


def test_reference_gemm_vs_loops(rng):
    a, b, c = rng.standard_normal((3, 5)), rng.standard_normal((4, 5)), rng.standard_normal((3, 4))
    want = np.zeros((3, 4))
    for i in range(3):
        for j in range(4):
            want[i, j] = c[i, j] + 0.5 * sum(a[i, t] * b[j, t] for t in range(5))
    np.testing.assert_allclose(reference_gemm(a, b, c, alpha=0.5), want, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(reference_gemm(a, b), a @ b.T, rtol=1e-15)
    assert reference_gemm(a.astype(np.float32), b.astype(np.float32)).dtype == np.float64
    with pytest.raises(ValueError, match=r"\(3, 5\).*\(4, 4\)"):
        reference_gemm(a, b[:, :4])
    with pytest.raises(ValueError, match="C shape"):
        reference_gemm(a, b, c[:2])
