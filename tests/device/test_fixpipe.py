"""Fixpipe (deep_gemm.device.fixpipe) against numpy: fp32 -> bf16 rounding bit-exact with ml_dtypes (ties, NaN,
Inf, overflow, subnormals), alpha, accumulate mode, fp32 output, and writes confined to the valid region."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from numba import njit

from deep_gemm.device import fixpipe


@njit(cache=True)
def _round_all(x, out):
    for i in range(x.size):
        out[i] = fixpipe.f32_to_bf16_bits(x[i])


def _special_bits(rng) -> np.ndarray:
    """fp32 bit patterns that stress rounding: ties (odd and even), halfway +- 1, NaNs, Infs, max finite,
    subnormals, zeros, plus random patterns over the whole range."""
    hi = rng.integers(0, 1 << 16, size=4000, dtype=np.uint32) << 16
    tails = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    edges = (hi[:, None] | tails[None, :]).reshape(-1)
    fixed = np.array([0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7FC00000, 0xFFC00001,
                      0x7F800001, 0x7FBFFFFF, 0x00000001, 0x00008000, 0x80018000, 0x0, 0x80000000], np.uint32)
    rand = rng.integers(0, 1 << 32, size=20000, dtype=np.uint32)
    return np.concatenate([edges, fixed, rand])


def test_bf16_rounding_bit_exact_with_ml_dtypes(rng):
    x = _special_bits(rng).view(np.float32)
    out = np.empty(x.size, np.uint16)
    _round_all(x, out)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    mismatch = np.flatnonzero(out != ref)
    assert mismatch.size == 0, (
        f"{mismatch.size} mismatches, first x bits={x.view(np.uint32)[mismatch[0]]:#010x} "
        f"got {out[mismatch[0]]:#06x} want {ref[mismatch[0]]:#06x}"
    )


def _flat(phys):
    stride = phys.strides[0] // phys.itemsize
    flat = np.lib.stride_tricks.as_strided(phys, shape=((phys.shape[0] - 1) * stride + phys.shape[1],),
                                           strides=(phys.itemsize,))
    return flat, stride


@pytest.mark.parametrize("out_dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("with_accumulation", [False, True])
@pytest.mark.parametrize("alpha", [1.0, 0.37])
def test_fixpipe_valid_region(rng, out_dtype, with_accumulation, alpha):
    m, n = 21, 37  # logical output; tile at (16, 32) of 16 x 16 straddles both edges
    row0, col0, tile_m, tile_n = 16, 32, 16, 16
    l0c = rng.standard_normal((tile_m + 3, tile_n + 5)).astype(np.float32) * 100
    wide = rng.standard_normal((m, n + 6)).astype(np.float32)
    if out_dtype == "bf16":
        storage = wide.astype(ml_dtypes.bfloat16).view(np.uint16).copy()
    else:
        storage = wide.copy()
    d = storage[:, :n]  # non-tight rows: outer stride n + 6
    before = storage.copy()
    flat, stride = _flat(d)
    fixpipe.Fixpipe(flat, stride, l0c, row0, col0, tile_m, tile_n, m, n, alpha, with_accumulation)

    # numpy reference: one fp32 multiply, one fp32 add, one rounding
    rows, cols = m - row0, n - col0
    acc = np.float32(alpha) * l0c[:rows, :cols]
    region = before[row0:m, col0:n]
    if out_dtype == "bf16":
        old = region.view(ml_dtypes.bfloat16).astype(np.float32)
        value = (old + acc) if with_accumulation else acc
        want = value.astype(ml_dtypes.bfloat16).view(np.uint16)
    else:
        want = (region + acc) if with_accumulation else acc
    expected = before.copy()
    expected[row0:m, col0:n] = want
    np.testing.assert_array_equal(storage.view(np.uint32 if out_dtype == "fp32" else np.uint16),
                                  expected.view(np.uint32 if out_dtype == "fp32" else np.uint16))


def test_fixpipe_nan_inf_pass_through():
    l0c = np.array([[np.nan, np.inf, -np.inf, 3.0e38]], np.float32)
    d = np.zeros(4, np.uint16)
    fixpipe.Fixpipe(d, 4, l0c, 0, 0, 1, 4, 1, 4, 2.0, False)
    got = d.view(ml_dtypes.bfloat16).astype(np.float32)
    assert np.isnan(got[0]) and got[1] == np.inf and got[2] == -np.inf and got[3] == np.inf  # 6e38 overflows


@pytest.mark.parametrize("dtype", [np.uint16, np.float32])
def test_init_global_memory_fills_exactly_size_elements(dtype):
    gm = np.full(10, 7, dtype)
    fixpipe.InitGlobalMemory(gm[3:], 5, 0.0)
    want = np.full(10, 7, dtype)
    want[3:8] = 0
    np.testing.assert_array_equal(gm, want)
    fixpipe.InitGlobalMemory(gm, 2, 1.5)  # stored as D stores it: bf16 bits of 1.5, or 1.5
    assert gm[0] == (0x3FC0 if dtype == np.uint16 else np.float32(1.5))
    with pytest.raises(IndexError):
        fixpipe.InitGlobalMemory(gm, 11, 0.0)
    assert gm[9] == 7
