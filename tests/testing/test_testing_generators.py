"""Generators: dtypes, shapes, storage order, code ranges and scale sets."""

from __future__ import annotations

import numpy as np
import pytest

from deep_gemm.testing import bf16_operand, dequantize_fp4, fp4_operand, fp8_operand, random_fp8_codes
from deep_gemm.utils import is_bf16, is_fp8, is_packed_fp4, unpack_fp4


@pytest.mark.parametrize("major", ["k", "mn"])
def test_fp8_operand(rng, major):
    x, sf = fp8_operand(rng, 6, 70, major)
    assert is_fp8(x) and x.shape == (6, 70)
    assert x.flags.c_contiguous if major == "k" else (x.strides == (1, 6) and x.T.flags.c_contiguous)
    assert sf.dtype == np.float32 and sf.shape == (6, 3)
    assert set(np.unique(sf).tolist()) <= {2.0**-9, 2.0**-8, 2.0**-7}


def test_fp8_codes_cover_every_non_nan_code(rng):
    codes = random_fp8_codes(rng, (20000,)).view(np.uint8)
    assert set(np.unique(codes).tolist()) == set(range(256)) - {0x7F, 0xFF}


@pytest.mark.parametrize("major", ["k", "mn"])
def test_fp4_operand(rng, major):
    x, sf = fp4_operand(rng, 6, 70, major)
    assert is_packed_fp4(x)
    if major == "k":
        assert x.shape == (6, 35) and x.flags.c_contiguous
    else:
        assert x.shape == (3, 70) and x.strides == (1, 3)
    assert sf.shape == (6, 3) and set(np.unique(sf).tolist()) <= {0.25, 0.5, 1.0}
    values = dequantize_fp4(x, sf, packed_axis=-1 if major == "k" else 0)
    assert values.shape == (6, 70)
    assert unpack_fp4(x, axis=-1 if major == "k" else 0).max() <= 15


def test_bf16_operand(rng):
    x = bf16_operand(rng, 4, 9, "mn")
    assert is_bf16(x) and x.shape == (4, 9) and x.strides == (2, 8)
    assert 0.3 < float(np.std(bf16_operand(rng, 64, 64).astype(np.float32))) < 3


def test_generator_errors(rng):
    with pytest.raises(ValueError, match="major='x'"):
        fp8_operand(rng, 2, 2, "x")
    with pytest.raises(ValueError, match="k=-1"):
        bf16_operand(rng, 2, -1)
    with pytest.raises(ValueError, match="mn=3 k=4 major='mn'"):
        fp4_operand(rng, 3, 4, "mn")
    with pytest.raises(ValueError, match="k=5"):
        fp4_operand(rng, 2, 5)
