"""Quantization math: bit-exact against hand-computed cases and a scalar (Python float) reference."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from dg_scalar_reference import ceil_pow2_ue8m0, e2m1_encode, e2m1_value, e4m3_encode, f32, quantize_blocks
from hypothesis import given, settings
from hypothesis import strategies as st

from deep_gemm.utils import math as M
from deep_gemm.utils.formats import E4M3_DECODE_TABLE, pack_fp4, unpack_fp4


def _rand(rng, shape, dtype=np.float32):
    # Wide dynamic range per row so blocks get different scales, plus exact zeros.
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-6, 6, size=shape[:-1] + (1,)))
    x[rng.random(shape) < 0.05] = 0.0
    return x.astype(dtype)


def test_ceil_div_align():
    assert [M.ceil_div(x, 32) for x in (0, 1, 31, 32, 33, 64)] == [0, 1, 1, 1, 2, 2]
    assert [M.align(x, 256) for x in (0, 1, 255, 256, 257)] == [0, 256, 256, 256, 512]


@pytest.mark.parametrize(
    "x, want",
    [(1.0, 1.0), (1.5, 2.0), (0.75, 1.0), (3.0, 4.0), (4.0, 4.0), (-3.0, 4.0), (2.0**-130, 2.0**-126),
     (0.0, 2.0**-126), (2.0**127 * 1.5, 2.0**127), (math.inf, 2.0**127), (1.0 + 2.0**-23, 2.0)],
)
def test_ceil_to_ue8m0_hand(x, want):
    out = M.ceil_to_ue8m0(np.array([x], np.float32))
    assert out.dtype == np.float32 and out[0] == want


def test_ceil_to_ue8m0_vs_frexp(rng):
    x = (rng.standard_normal(5000) * np.exp2(rng.integers(-140, 120, 5000))).astype(np.float32)
    got = M.ceil_to_ue8m0(x)
    ref = np.array([ceil_pow2_ue8m0(float(v)) for v in x], np.float64)
    np.testing.assert_array_equal(got.astype(np.float64), ref)


def test_pack_unpack_ue8m0_int():
    sf = np.array([[1.0, 2.0, 0.5, 2.0**-7, 4.0, 8.0, 1.0, 1.0]], np.float32)
    packed = M.pack_ue8m0_to_int(sf)
    assert packed.dtype == np.int32 and packed.shape == (1, 2)
    assert packed.view(np.uint32).tolist() == [[0x787E807F, 0x7F7F8281]]
    np.testing.assert_array_equal(M.unpack_ue8m0_from_int(packed), sf)
    with pytest.raises(ValueError, match="divisible by 4"):
        M.pack_ue8m0_to_int(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"x\[\(0, 1\)\]=np.float32\(3.0\)"):
        M.pack_ue8m0_to_int(np.array([[1, 3, 1, 1]], np.float32))


# ---------------------------------------------------------------------------------------------------------------
# FP8 casts


def _token_blocks(m, n, gran):
    return {(i, b): [(i, j) for j in range(b * gran, min(n, (b + 1) * gran))] for i in range(m)
            for b in range(M.ceil_div(n, gran))}


def _check_cast(codes, sf, x, blocks, use_ue8m0, sf_shape):
    ref_codes, ref_sf = quantize_blocks(x, blocks, 448.0, use_ue8m0, e4m3_encode)
    assert codes.dtype == ml_dtypes.float8_e4m3fn and codes.shape == x.shape and codes.flags.c_contiguous
    assert sf.dtype == np.float32 and sf.shape == sf_shape
    got = codes.view(np.uint8)
    for idx, c in ref_codes.items():
        assert got[idx] == c, (idx, float(x[idx]), got[idx], c)
    for key, s in ref_sf.items():
        assert sf[key] == s, (key, sf[key], s)


@pytest.mark.parametrize("use_ue8m0", [False, True])
@pytest.mark.parametrize("gran_k, n", [(128, 300), (32, 70), (128, 128)])
def test_per_token_cast_to_fp8_vs_scalar(rng, use_ue8m0, gran_k, n):
    x = _rand(rng, (3, n))
    codes, sf = M.per_token_cast_to_fp8(x, use_ue8m0=use_ue8m0, gran_k=gran_k)
    _check_cast(codes, sf, x, _token_blocks(3, n, gran_k), use_ue8m0, (3, M.ceil_div(n, gran_k)))


def test_per_token_cast_to_fp8_hand_case():
    # amax 448 -> sf 1 exactly; amax 0 -> sf 1e-4/448 (clamp); 1.5*448 -> sf 1.5 (ue8m0: 2)
    x = np.zeros((3, 32), np.float32)
    x[0, :3] = [448.0, -1.0, 0.3]
    x[2, 0] = 672.0
    codes, sf = M.per_token_cast_to_fp8(x, use_ue8m0=False, gran_k=32)
    assert sf[:, 0].tolist() == [1.0, f32(f32(1e-4) / 448.0), 1.5]
    assert codes.view(np.uint8)[0, :3].tolist() == [0x7E, 0xB8, e4m3_encode(0.3)]
    assert not codes.view(np.uint8)[1].any()
    codes, sf = M.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32)
    assert sf[:, 0].tolist() == [1.0, 2.0**-22, 2.0]
    assert codes.view(np.uint8)[2, 0] == 0x7A  # 672 / 2 = 336: a tie between 320 (0x7A) and 352 (0x7B) -> even


def test_per_token_cast_bf16_input_and_packed_sf(rng):
    x = _rand(rng, (2, 200)).astype(ml_dtypes.bfloat16)
    codes, sf = M.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32)
    codes32, sf32 = M.per_token_cast_to_fp8(x.astype(np.float32), use_ue8m0=True, gran_k=32)
    np.testing.assert_array_equal(codes.view(np.uint8), codes32.view(np.uint8))
    _, packed = M.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    assert packed.dtype == np.int32 and packed.shape == (2, 2)  # 7 scales padded with 1.0 to 8
    unpacked = M.unpack_ue8m0_from_int(packed)
    np.testing.assert_array_equal(unpacked[:, :7], sf)
    assert (unpacked[:, 7] == 1.0).all()


@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_per_channel_cast_to_fp8(rng, use_ue8m0):
    x = _rand(rng, (64, 5))
    codes, sf = M.per_channel_cast_to_fp8(x, use_ue8m0, gran_k=32)
    blocks = {(b, j): [(i, j) for i in range(b * 32, (b + 1) * 32)] for b in range(2) for j in range(5)}
    _check_cast(codes, sf, x, blocks, use_ue8m0, (2, 5))
    # Same as a per-token cast of the transpose.
    codes_t, sf_t = M.per_token_cast_to_fp8(np.ascontiguousarray(x.T), use_ue8m0, gran_k=32)
    np.testing.assert_array_equal(codes.view(np.uint8), codes_t.view(np.uint8).T)
    np.testing.assert_array_equal(sf, sf_t.T)
    with pytest.raises(ValueError, match="m=65 gran_k=32"):
        M.per_channel_cast_to_fp8(np.zeros((65, 2), np.float32), False, gran_k=32)


@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_per_block_cast_to_fp8(rng, use_ue8m0):
    x = _rand(rng, (40, 70))
    codes, sf = M.per_block_cast_to_fp8(x, use_ue8m0, gran_k=32)
    blocks = {
        (bi, bj): [(i, j) for i in range(bi * 32, min(40, bi * 32 + 32)) for j in range(bj * 32, min(70, bj * 32 + 32))]
        for bi in range(2)
        for bj in range(3)
    }
    _check_cast(codes, sf, x, blocks, use_ue8m0, (2, 3))


@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_per_custom_dims_cast_to_fp8(rng, use_ue8m0):
    x = _rand(rng, (4, 3, 6))
    codes, sf = M.per_custom_dims_cast_to_fp8(x, dims=(0, 2), use_ue8m0=use_ue8m0)
    blocks = {(t, d): [(t, h, d) for h in range(3)] for t in range(4) for d in range(6)}
    _check_cast(codes, sf, x, blocks, use_ue8m0, (4, 6))
    # dims=(0,) on a 2-D x: one scale per token, i.e. a per-token cast with gran_k = n; size-1 dims are squeezed.
    x2 = _rand(rng, (5, 24))
    c2, s2 = M.per_custom_dims_cast_to_fp8(x2, dims=(0,), use_ue8m0=use_ue8m0)
    c3, s3 = M.per_token_cast_to_fp8(x2, use_ue8m0, gran_k=24)
    np.testing.assert_array_equal(c2.view(np.uint8), c3.view(np.uint8))
    np.testing.assert_array_equal(s2, s3[:, 0])
    with pytest.raises(ValueError, match="dims=\\(3,\\)"):
        M.per_custom_dims_cast_to_fp8(x, dims=(3,), use_ue8m0=False)
    with pytest.raises(TypeError, match="dims"):
        M.per_custom_dims_cast_to_fp8(x, dims=(0.5,), use_ue8m0=False)


# ---------------------------------------------------------------------------------------------------------------
# FP4 casts


def test_per_token_cast_to_fp4_hand_case():
    # amax 6 -> sf = 1, 1/sf = 1: the values hit the thresholds exactly (ties go to the smaller magnitude).
    row = [6.0, 0.25, 0.2500001, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.1, -0.3, -6.0, 0.0, -0.0, 4.0, 1.0]
    x = np.array([row], np.float32)
    packed, sf = M.per_token_cast_to_fp4(x, use_ue8m0=False, gran_k=16)
    assert sf.tolist() == [[1.0]]
    codes = [7, 0, 1, 1, 2, 3, 4, 5, 6, 0, 9, 15, 0, 0, 6, 2]
    assert unpack_fp4(packed).tolist() == [codes]
    assert packed.dtype == np.int8 and packed.shape == (1, 8)
    assert packed.view(np.uint8).tolist() == [[0x07, 0x11, 0x32, 0x54, 0x06, 0xF9, 0x00, 0x26]]


@pytest.mark.parametrize("use_ue8m0", [False, True])
@pytest.mark.parametrize("gran_k, n", [(128, 200), (32, 70)])
def test_per_token_cast_to_fp4_vs_scalar(rng, use_ue8m0, gran_k, n):
    x = _rand(rng, (3, n))
    packed, sf = M.per_token_cast_to_fp4(x, use_ue8m0=use_ue8m0, gran_k=gran_k)
    ref_codes, ref_sf = quantize_blocks(x, _token_blocks(3, n, gran_k), 6.0, use_ue8m0, e2m1_encode)
    assert packed.shape == (3, n // 2) and sf.shape == (3, M.ceil_div(n, gran_k))
    codes = unpack_fp4(packed)
    for idx, c in ref_codes.items():
        assert codes[idx] == c, (idx, float(x[idx]))
    for key, s in ref_sf.items():
        assert sf[key] == s
    _, packed_sf = M.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=gran_k, use_packed_ue8m0=True)
    np.testing.assert_array_equal(M.unpack_ue8m0_from_int(packed_sf)[:, : sf.shape[1]],
                                  M.per_token_cast_to_fp4(x, True, gran_k)[1])


def test_cast_back_from_fp4(rng):
    # Exactly representable data: codes times a power-of-two scale, every block holding a +-6 so amax/6 = scale.
    m, n, gran = 3, 64, 32
    codes = rng.integers(0, 16, size=(m, n), dtype=np.uint8)
    codes[:, ::gran] = 7
    scales = np.exp2(rng.integers(-5, 5, size=(m, n // gran))).astype(np.float32)
    x = np.array([[e2m1_value(int(c)) for c in r] for r in codes], np.float32) * np.repeat(scales, gran, axis=1)
    packed, sf = M.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=gran)
    np.testing.assert_array_equal(sf, scales)
    back = M.cast_back_from_fp4(packed, sf, gran_k=gran)
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back, x)
    _, psf = M.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=gran, use_packed_ue8m0=True)
    np.testing.assert_array_equal(M.cast_back_from_fp4(packed, psf, gran_k=gran, use_packed_ue8m0=True), x)
    with pytest.raises(ValueError, match="does not cover"):
        M.cast_back_from_fp4(packed, sf[:, :1], gran_k=gran)
    with pytest.raises(TypeError, match="float64"):
        M.cast_back_from_fp4(packed, sf.astype(np.float64), gran_k=gran)


def test_transpose_packed_fp4_hand_case():
    codes = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.uint8)  # [m=2, n=4]
    out = M.transpose_packed_fp4(pack_fp4(codes))
    assert out.shape == (4, 1) and out.dtype == np.int8
    assert out.view(np.uint8)[:, 0].tolist() == [0x51, 0x62, 0x73, 0x84]
    with pytest.raises(ValueError, match="even row count"):
        M.transpose_packed_fp4(np.zeros((3, 2), np.int8))
    with pytest.raises(TypeError, match="uint8"):
        M.transpose_packed_fp4(np.zeros((2, 2), np.uint8))


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 6), n=st.integers(1, 6), seed=st.integers(0, 2**31))
def test_transpose_packed_fp4_twice_is_identity(m, n, seed):
    codes = np.random.default_rng(seed).integers(0, 16, size=(2 * m, 2 * n), dtype=np.uint8)
    packed = pack_fp4(codes)
    t = M.transpose_packed_fp4(packed)
    np.testing.assert_array_equal(unpack_fp4(t), codes.T)
    np.testing.assert_array_equal(M.transpose_packed_fp4(t), packed)


def test_fp8_cast_dequantizes_close(rng):
    # The round trip is not exact, but each value is within half an e4m3 step of its scaled input.
    x = _rand(rng, (4, 256))
    codes, sf = M.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32)
    back = E4M3_DECODE_TABLE[codes.view(np.uint8)] * np.repeat(sf, 32, axis=1)
    assert np.all(np.abs(back - x) <= np.abs(x) * 2.0**-4 + np.repeat(sf, 32, axis=1) * 2.0**-10)


@pytest.mark.parametrize("fn", [M.per_token_cast_to_fp8, M.per_token_cast_to_fp4, M.per_block_cast_to_fp8])
def test_cast_bad_inputs(fn):
    with pytest.raises(ValueError, match="2-D"):
        fn(np.zeros(4, np.float32), False)
    with pytest.raises(TypeError, match="int64"):
        fn(np.zeros((2, 4), np.int64), False)
    with pytest.raises(ValueError, match="gran_k=0"):
        fn(np.zeros((2, 4), np.float32), False, gran_k=0)
    with pytest.raises(TypeError, match="True"):
        fn(np.zeros((2, 4), np.float32), False, gran_k=True)


def test_fp4_odd_n():
    with pytest.raises(ValueError, match="n=3"):
        M.per_token_cast_to_fp4(np.zeros((2, 3), np.float32), False)
