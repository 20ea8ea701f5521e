"""Number formats: decode tables, encoders, FP4 packing and bf16 rounding against independent references."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from dg_scalar_reference import e2m1_encode, e4m3_encode, e4m3_value
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from deep_gemm.utils import formats as F

# ---------------------------------------------------------------------------------------------------------------
# Decode tables


def test_e4m3_table_matches_ml_dtypes_and_formula():
    via_ml = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(F.E4M3_DECODE_TABLE, via_ml)  # NaN positions must agree too
    assert [c for c in range(256) if np.isnan(F.E4M3_DECODE_TABLE[c])] == [0x7F, 0xFF]
    for code in range(256):
        ref = e4m3_value(code)
        if math.isnan(ref):
            continue
        assert F.E4M3_DECODE_TABLE[code] == ref, hex(code)


@pytest.mark.parametrize(
    "code, value",
    [(0x00, 0.0), (0x01, 2.0**-9), (0x07, 7 * 2.0**-9), (0x08, 2.0**-6), (0x38, 1.0), (0x3C, 1.5), (0x7E, 448.0),
     (0x80, -0.0), (0xB8, -1.0), (0xFE, -448.0)],
)
def test_e4m3_table_hand_values(code, value):
    assert F.E4M3_DECODE_TABLE[code] == value
    assert math.copysign(1.0, F.E4M3_DECODE_TABLE[code]) == math.copysign(1.0, value)


def test_e2m1_table_hand_values():
    expected = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    assert F.E2M1_DECODE_TABLE.tolist() == expected
    assert math.copysign(1.0, F.E2M1_DECODE_TABLE[8]) == -1.0
    assert F.E2M1_DECODE_TABLE.dtype == np.float32 and F.E4M3_DECODE_TABLE.dtype == np.float32


def test_tables_are_read_only():
    with pytest.raises(ValueError):
        F.E4M3_DECODE_TABLE[0] = 1.0
    with pytest.raises(ValueError):
        F.E2M1_DECODE_TABLE[0] = 1.0


# ---------------------------------------------------------------------------------------------------------------
# Predicates and views


def test_predicates():
    fp8 = np.zeros(3, dtype=ml_dtypes.float8_e4m3fn)
    bf16 = np.zeros(3, dtype=ml_dtypes.bfloat16)
    i8 = np.zeros(3, dtype=np.int8)
    for x, want in ((fp8, (True, False, False)), (bf16, (False, False, True)), (i8, (False, True, False)),
                    (np.zeros(3, np.uint8), (False, False, False)), (np.zeros(3, np.float32), (False, False, False))):
        assert (F.is_fp8(x), F.is_packed_fp4(x), F.is_bf16(x)) == want
    assert F.is_fp8(ml_dtypes.float8_e4m3fn) and F.is_bf16(np.dtype(ml_dtypes.bfloat16)) and F.is_packed_fp4(np.int8)
    assert not F.is_fp8(ml_dtypes.float8_e5m2) and not F.is_fp8("not a dtype") and not F.is_bf16(3)


def test_fp8_codes_is_a_view():
    x = np.array([1.0, -2.0], dtype=np.float32).astype(ml_dtypes.float8_e4m3fn)[::-1]
    codes = F.fp8_codes(x)
    assert codes.dtype == np.uint8 and codes.tolist() == [0xC0, 0x38] and np.shares_memory(codes, x)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        F.fp8_codes(np.zeros(2, np.uint8))


# ---------------------------------------------------------------------------------------------------------------
# e4m3 encode / decode


def _e4m3_probe_values(rng) -> np.ndarray:
    pos = F.E4M3_DECODE_TABLE[:0x7F].astype(np.float64)
    mids = (pos[:-1] + pos[1:]) / 2
    vals = [pos, mids, [464.0, 463.99, 464.01, 470.0, 479.9, 480.0, 1e6, 2.0**-10, 2.0**-11, 1e-30]]
    base = np.concatenate([np.asarray(v, dtype=np.float64) for v in vals]).astype(np.float32)
    nudged = [base, np.nextafter(base, np.float32(np.inf)), np.nextafter(base, np.float32(0))]
    rand = (rng.standard_normal(4000) * np.exp2(rng.integers(-14, 10, 4000))).astype(np.float32)
    allv = np.concatenate(nudged + [rand])
    return np.concatenate([allv, -allv, np.array([0.0, -0.0], np.float32)])


def test_encode_e4m3_matches_scalar_rne_reference(rng):
    x = _e4m3_probe_values(rng)
    got = F.encode_e4m3(x).view(np.uint8)
    ref = np.array([e4m3_encode(float(v)) for v in x], dtype=np.uint8)
    bad = np.flatnonzero(got != ref)
    assert bad.size == 0, f"x={x[bad[:5]]} got={got[bad[:5]]} ref={ref[bad[:5]]}"


def test_encode_e4m3_specials():
    got = F.encode_e4m3(np.array([np.nan, np.inf, -np.inf, 448.0, 464.0, 465.0], np.float32)).view(np.uint8)
    assert np.isnan(F.E4M3_DECODE_TABLE[got[:3]]).all()
    assert got[3:].tolist() == [0x7E, 0x7E, 0x7F]
    assert F.encode_e4m3(np.array([1.0], ml_dtypes.bfloat16)).view(np.uint8).tolist() == [0x38]
    with pytest.raises(TypeError, match="x.dtype=dtype\\('int32'\\)"):
        F.encode_e4m3(np.array([1], np.int32))


def test_decode_e4m3():
    codes = np.arange(256, dtype=np.uint8).reshape(16, 16)
    out = F.decode_e4m3(codes)
    assert out.shape == (16, 16) and out.dtype == np.float32
    np.testing.assert_array_equal(out, F.decode_e4m3(codes.view(ml_dtypes.float8_e4m3fn)))
    finite = ~np.isnan(out)
    assert (F.encode_e4m3(out[finite]).view(np.uint8) == codes[finite]).all()
    with pytest.raises(TypeError, match="int16"):
        F.decode_e4m3(np.zeros(2, np.int16))


# ---------------------------------------------------------------------------------------------------------------
# e2m1


@pytest.mark.parametrize(
    "v, code",
    [(0.0, 0), (0.25, 0), (0.2500001, 1), (0.5, 1), (0.75, 1), (0.7500001, 2), (1.25, 2), (1.75, 3), (2.5, 4),
     (3.5, 5), (5.0, 6), (5.0001, 7), (6.0, 7), (100.0, 7), (-0.1, 0), (-0.0, 0), (-0.3, 9), (-6.0, 15), (-1e9, 15)],
)
def test_encode_e2m1_hand_cases(v, code):
    assert F.encode_e2m1(np.array([v], np.float32)).tolist() == [code]


def test_encode_e2m1_matches_nearest_ties_down(rng):
    x = np.concatenate([
        (rng.standard_normal(3000) * 3).astype(np.float32),
        np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32) * np.array([[1], [-1]], np.float32),
    ], axis=None)
    got = F.encode_e2m1(x)
    ref = np.array([e2m1_encode(float(v)) for v in x], np.uint8)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(F.decode_e2m1(np.arange(16)), F.E2M1_DECODE_TABLE)


def test_e2m1_bad_inputs():
    with pytest.raises(TypeError, match="int64"):
        F.encode_e2m1(np.array([1]))
    with pytest.raises(ValueError, match="max=16"):
        F.decode_e2m1(np.array([3, 16]))
    with pytest.raises(TypeError, match="float32"):
        F.decode_e2m1(np.array([1.0], np.float32))


# ---------------------------------------------------------------------------------------------------------------
# FP4 packing


def test_pack_fp4_hand_case():
    codes = np.array([[1, 2, 15, 0], [0xF, 0xF, 0x8, 0x7]], np.uint8)
    packed = F.pack_fp4(codes)
    assert packed.dtype == np.int8 and packed.shape == (2, 2)
    assert packed.view(np.uint8).tolist() == [[0x21, 0x0F], [0xFF, 0x78]]
    assert packed.tolist() == [[0x21, 0x0F], [-1, 0x78]]
    # Along axis 0: element (2i, j) low nibble, (2i+1, j) high nibble.
    assert F.pack_fp4(codes, axis=0).view(np.uint8).tolist() == [[0xF1, 0xF2, 0x8F, 0x70]]
    np.testing.assert_array_equal(F.unpack_fp4(packed), codes)
    np.testing.assert_array_equal(F.unpack_fp4(F.pack_fp4(codes, axis=0), axis=0), codes)


def test_pack_fp4_bad_inputs():
    with pytest.raises(ValueError, match="even length"):
        F.pack_fp4(np.zeros((2, 3), np.uint8))
    with pytest.raises(ValueError, match="max=16"):
        F.pack_fp4(np.array([1, 16], np.uint8))
    with pytest.raises(TypeError, match="float32"):
        F.pack_fp4(np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="axis=2"):
        F.pack_fp4(np.zeros((2, 2), np.uint8), axis=2)
    with pytest.raises(TypeError, match="int16"):
        F.unpack_fp4(np.zeros(2, np.int16))


@settings(max_examples=60, deadline=None)
@given(
    codes=hnp.arrays(np.uint8, hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6),
                     elements=st.integers(0, 15)),
    axis_pick=st.integers(0, 2),
)
def test_pack_unpack_roundtrip(codes, axis_pick):
    axis = axis_pick % codes.ndim
    if codes.shape[axis] % 2:
        codes = np.concatenate([codes, np.take(codes, [0], axis=axis)], axis=axis)
    packed = F.pack_fp4(codes, axis=axis)
    assert packed.shape[axis] * 2 == codes.shape[axis]
    np.testing.assert_array_equal(F.unpack_fp4(packed, axis=axis), codes)
    # And bytes -> codes -> bytes is the identity for every byte.
    np.testing.assert_array_equal(F.pack_fp4(F.unpack_fp4(packed, axis=axis), axis=axis), packed)


# ---------------------------------------------------------------------------------------------------------------
# bf16


def test_fp32_to_bf16_bits_matches_ml_dtypes(rng):
    special = np.array(
        [0, 0x80000000, 1, 0x7FFF, 0x8000, 0x8001, 0x18000, 0x17FFF, 0x3F808000, 0x3F818000, 0x3F80FFFF,
         0x7F7FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0x7F800000, 0xFF800000, 0x7F800001, 0x7FC00000, 0xFFFFFFFF,
         0x7FBFFFFF, 0xFF7FFFFF, 0x807FFFFF, 0x00800000],
        dtype=np.uint32,
    )
    bits = np.concatenate([special, rng.integers(0, 2**32, size=200_000, dtype=np.uint32)])
    x = bits.view(np.float32)
    got = F.fp32_to_bf16_bits(x)
    assert got.dtype == np.uint16
    with np.errstate(invalid="ignore"):
        ref = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(got, ref)
    # Hand cases: ties go to even, overflow to inf.
    assert F.fp32_to_bf16_bits(np.array([0x3F808000, 0x3F818000, 0x7F7FFFFF], np.uint32).view(np.float32)).tolist() \
        == [0x3F80, 0x3F82, 0x7F80]


def test_bf16_bits_to_fp32_roundtrip():
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    x = F.bf16_bits_to_fp32(bits)
    ref = bits.view(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(x.view(np.uint32), ref.view(np.uint32))
    finite = ~np.isnan(x)
    np.testing.assert_array_equal(F.fp32_to_bf16_bits(x[finite]), bits[finite])
    np.testing.assert_array_equal(F.bf16_bits_to_fp32(bits.view(ml_dtypes.bfloat16)), x)


def test_bf16_bad_inputs():
    with pytest.raises(TypeError, match="float64"):
        F.fp32_to_bf16_bits(np.zeros(2))
    with pytest.raises(TypeError, match="int16"):
        F.bf16_bits_to_fp32(np.zeros(2, np.int16))
