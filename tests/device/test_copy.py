"""GM -> L1 copies (deep_gemm.device.copy) against numpy/ml_dtypes: FP8, packed FP4 and BF16 decode, K-major and
MN-major GM with non-tight rows, zero fill past m/n and k; and the UE8M0 scale-factor copy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from deep_gemm.device import copy as dcopy


def _flat(phys: np.ndarray) -> tuple[np.ndarray, int]:
    """Flat 1-D view of 2-D storage with unit last stride, plus its row stride in elements (as the launchers do)."""
    stride = phys.strides[0] // phys.itemsize
    flat = np.lib.stride_tricks.as_strided(phys, shape=((phys.shape[0] - 1) * stride + phys.shape[1],),
                                           strides=(phys.itemsize,))
    return flat, stride


def _non_tight(rng, shape, dtype, pad=5):
    """A [rows, cols] view of a wider buffer (outer stride > cols), random contents."""
    full = rng.integers(0, np.iinfo(dtype).max + 1, size=(shape[0], shape[1] + pad), dtype=dtype)
    return full[:, : shape[1]]


def _expected_tile(values: np.ndarray, mn0, k0, rows, cols):
    """values: fp32 [MN, K] logical; the L1 tile of rows x cols at (mn0, k0), zero past the edges."""
    out = np.zeros((rows, cols), np.float32)
    part = values[mn0 : mn0 + rows, k0 : k0 + cols]
    out[: part.shape[0], : part.shape[1]] = part
    return out


def test_e4m3_table_matches_ml_dtypes():
    ref = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    nan = np.isnan(ref)
    assert np.flatnonzero(nan).tolist() == [0x7F, 0xFF]
    np.testing.assert_array_equal(dcopy.FP8_E4M3_VALUES[~nan], ref[~nan])
    # NaN codes decode to NaN deliberately (kept, with their sign), so a NaN input propagates like on the chip.
    assert np.isnan(dcopy.FP8_E4M3_VALUES[0x7F]) and np.isnan(dcopy.FP8_E4M3_VALUES[0xFF])
    assert not np.signbit(dcopy.FP8_E4M3_VALUES[0x7F]) and np.signbit(dcopy.FP8_E4M3_VALUES[0xFF])


def test_e2m1_table_matches_ml_dtypes():
    ref = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    np.testing.assert_array_equal(dcopy.FP4_E2M1_VALUES, ref)
    assert np.signbit(dcopy.FP4_E2M1_VALUES[8])  # -0.0


# (mn, k, mn0, k0, rows, cols): an interior tile, a tile straddling both edges, a tile fully past the rows
TILES = [(40, 100, 16, 32, 16, 32), (37, 70, 32, 64, 16, 64), (20, 64, 32, 0, 16, 64)]


@pytest.mark.parametrize("major", ["k", "mn"])
@pytest.mark.parametrize("tile", TILES)
def test_copy_fp8(rng, major, tile):
    mn, k, mn0, k0, rows, cols = tile
    phys = _non_tight(rng, (mn, k) if major == "k" else (k, mn), np.uint8)
    codes = phys if major == "k" else phys.T  # logical [mn, k]
    values = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    values[np.isnan(values)] = 0.0  # compared separately below
    flat, stride = _flat(phys)
    l1 = np.full((rows, cols), np.nan, np.float32)
    dcopy.copy_gm_to_l1_fp8(l1, flat, stride, major == "mn", mn0, k0, mn, k)
    expected = _expected_tile(values, mn0, k0, rows, cols)
    nan_mask = np.isnan(l1)
    nan_codes = _expected_tile(np.isin(codes, [0x7F, 0xFF]).astype(np.float32), mn0, k0, rows, cols) == 1
    np.testing.assert_array_equal(nan_mask, nan_codes)
    np.testing.assert_array_equal(np.where(nan_mask, 0, l1), expected)


@pytest.mark.parametrize("major", ["k", "mn"])
@pytest.mark.parametrize("tile", TILES)
def test_copy_fp4(rng, major, tile):
    mn, k, mn0, k0, rows, cols = tile
    codes = rng.integers(0, 16, size=(mn, k), dtype=np.uint8)
    # Pack along the contiguous axis (K for K-major, MN for MN-major): even element in the low nibble.
    stored = codes if major == "k" else codes.T.copy()  # [mn, k] or [k, mn]
    if stored.shape[1] % 2:
        stored = np.concatenate([stored, np.zeros((stored.shape[0], 1), np.uint8)], axis=1)
    packed = (stored[:, 0::2] | (stored[:, 1::2] << 4)).astype(np.uint8)
    phys = np.zeros((packed.shape[0], packed.shape[1] + 3), np.uint8)[:, : packed.shape[1]]
    phys[...] = packed
    values = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    flat, stride = _flat(phys)
    l1 = np.full((rows, cols), np.nan, np.float32)
    dcopy.copy_gm_to_l1_fp4(l1, flat, stride, major == "mn", mn0, k0, mn, k)
    np.testing.assert_array_equal(l1, _expected_tile(values, mn0, k0, rows, cols))


@pytest.mark.parametrize("major", ["k", "mn"])
@pytest.mark.parametrize("tile", TILES)
def test_copy_bf16(rng, major, tile):
    mn, k, mn0, k0, rows, cols = tile
    logical = rng.standard_normal((mn, k)).astype(ml_dtypes.bfloat16)
    bits = logical.view(np.uint16)
    stored = bits if major == "k" else bits.T
    phys = np.zeros((stored.shape[0], stored.shape[1] + 7), np.uint16)[:, : stored.shape[1]]
    phys[...] = stored
    flat, stride = _flat(phys)
    l1 = np.full((rows, cols), np.nan, np.float32)
    dcopy.copy_gm_to_l1_bf16(l1, flat, stride, major == "mn", mn0, k0, mn, k)
    np.testing.assert_array_equal(l1, _expected_tile(logical.astype(np.float32), mn0, k0, rows, cols))


# NOTES: besides whole pairs from an even block: an odd first block (k0 = 32, each L1 row's bytes from two GM int16),
# an odd block count (k = 224: the last int16 holds one block), rows past mn, an L1 view with a wider row
@pytest.mark.parametrize("mn,k,mn0,k0,rows,cols", [(40, 256, 16, 64, 16, 4), (37, 96, 32, 64, 16, 8),
                                                    (50, 224, 8, 0, 48, 8), (40, 256, 0, 32, 16, 6)])
def test_copy_sf(rng, mn, k, mn0, k0, rows, cols):
    num_blocks = -(-k // 32)
    exps = rng.integers(0, 256, size=(mn, num_blocks), dtype=np.uint8)  # logical [mn, k/32]
    padded = np.zeros((mn, 2 * (-(-num_blocks // 2))), np.uint8)
    padded[:, :num_blocks] = exps
    # Required layout: int16 [ceil(K/64), MN]; low byte = even block, high byte = odd block.
    sf = (padded[:, 0::2].astype(np.uint16) | (padded[:, 1::2].astype(np.uint16) << 8)).T.copy().view(np.int16)
    parent = np.full((rows, cols + 3), 0xAB, np.uint8)
    sf_l1 = parent[:, :cols]
    dcopy.copy_gm_to_l1_sf(sf_l1, sf.reshape(-1), sf.shape[1], mn0, k0, mn, k)
    assert (parent[:, cols:] == 0xAB).all()
    expected = np.zeros((rows, cols), np.uint8)
    part = exps[mn0 : mn0 + rows, k0 // 32 : k0 // 32 + cols]
    expected[: part.shape[0], : part.shape[1]] = part
    np.testing.assert_array_equal(sf_l1, expected)


# L1 of codes (what the GEMM kernels use): GM -> L1 copies the codes as stored; the L1 -> L0 loads decode them
@pytest.mark.parametrize("major", ["k", "mn"])
@pytest.mark.parametrize("kind", ["fp8", "bf16"])
def test_code_l1_matches_decoded_l1(rng, kind, major):
    from deep_gemm.device import cube

    dtype, copy = (np.uint8, dcopy.copy_gm_to_l1_fp8) if kind == "fp8" else (np.uint16, dcopy.copy_gm_to_l1_bf16)
    mn, k, mn0, k0, rows, cols = 37, 200, 8, 64, 32, 192  # a tile straddling both edges
    phys = _non_tight(rng, (mn, k) if major == "k" else (k, mn), dtype)
    if kind == "fp8":
        phys[phys == 0x7F] = 0x7E  # NaN codes are checked by the decode tests
        phys[phys == 0xFF] = 0xFE
    else:
        phys[(phys & 0x7F80) == 0x7F80] &= 0x80FF  # no Inf / NaN
    flat, stride = _flat(phys)
    codes_l1 = np.full((rows, cols), 0x55, dtype)
    values_l1 = np.full((rows, cols), np.nan, np.float32)
    copy(codes_l1, flat, stride, major == "mn", mn0, k0, mn, k)
    copy(values_l1, flat, stride, major == "mn", mn0, k0, mn, k)
    logical = phys if major == "k" else phys.T
    expected_codes = np.zeros((rows, cols), dtype)
    part = logical[mn0:mn0 + rows, k0:k0 + cols]
    expected_codes[:part.shape[0], :part.shape[1]] = part
    np.testing.assert_array_equal(codes_l1, expected_codes)
    sf = rng.integers(100, 150, size=(rows, cols // 32), dtype=np.uint8)
    for load, size in ((cube.load_l0a, cube.l0a_size), (cube.load_l0b, cube.l0b_size)):
        for row0, kk0, tile_rows, tile_k, with_sf in ((0, 0, rows, cols, True), (3, 8, 21, 77, False),
                                                       (8, 32, 16, 128, True)):
            from_codes = np.full(size(tile_rows, tile_k), -1.0, np.float32)
            from_values = from_codes.copy()
            load(from_codes, codes_l1, sf, row0, kk0, tile_rows, tile_k, with_sf)
            load(from_values, values_l1, sf, row0, kk0, tile_rows, tile_k, with_sf)
            np.testing.assert_array_equal(from_codes.view(np.uint32), from_values.view(np.uint32))


def test_copy_tf32_rounds_like_round_to_tf32(rng):
    from deep_gemm.utils import round_to_tf32

    mn, k, mn0, k0, rows, cols = 21, 300, 8, 256, 16, 64  # straddles both edges
    phys = rng.standard_normal((mn, k)).astype(np.float32)
    bits = phys.view(np.uint32)
    bits[0, :8] = (bits[0, :8] & np.uint32(0xFFFFE000)) | np.uint32(0x1000)  # ties
    bits[1, :4] = [0x7F800000, 0xFF800000, 0x7FC00001, 0x7F7FFFFF]  # +-Inf, NaN payload kept, max -> +Inf
    for major in ("k", "mn"):
        stored = phys if major == "k" else np.ascontiguousarray(phys.T)
        l1 = np.full((rows, cols), np.nan, np.float32)
        dcopy.copy_gm_to_l1_tf32(l1, stored.reshape(-1), stored.shape[1], major == "mn", mn0, k0, mn, k)
        expected = np.zeros((rows, cols), np.float32)
        part = round_to_tf32(phys)[mn0:mn0 + rows, k0:k0 + cols]
        expected[:part.shape[0], :part.shape[1]] = part
        np.testing.assert_array_equal(l1.view(np.uint32), expected.view(np.uint32))
    l1 = np.zeros((2, 8), np.float32)
    dcopy.copy_gm_to_l1_tf32(l1, phys.reshape(-1), k, False, 0, 0, mn, k)
    np.testing.assert_array_equal(l1.view(np.uint32), round_to_tf32(phys[:2, :8]).view(np.uint32))
    assert np.isposinf(l1[1, 0]) and np.isneginf(l1[1, 1]) and l1[1, 2:3].view(np.uint32)[0] == 0x7FC00001
    assert np.isposinf(l1[1, 3]) and (l1[0] != phys[0, :8]).any()


@pytest.mark.parametrize("kind", ["fp8", "fp4"])
@pytest.mark.parametrize("burst_stride_pages", [3, -2])
def test_burst_copy_gathers_two_pages_in_one_copy(rng, kind, burst_stride_pages):
    """copy_gm_to_l1_{fp8,fp4}_bursts: two row blocks apart in GM (forward or backward) land one after the other in L1,
    each row decoded as the one-block copy decodes it; rows past ``rows`` and K past ``k`` are zero; a lone burst is
    the one-block copy; a burst leaving GM raises IndexError and writes nothing."""
    burst_rows, row_stride, k = 4, 24, 30  # rows of 24 bytes (values and more), 30 values kept
    page = burst_rows * row_stride
    gm = rng.integers(0, 256, size=8 * page, dtype=np.uint8)
    gm[gm == 0x7F] = 0
    gm[gm == 0xFF] = 0
    first = 3 * page
    second = first + burst_stride_pages * page
    copy = dcopy.copy_gm_to_l1_fp8_bursts if kind == "fp8" else dcopy.copy_gm_to_l1_fp4_bursts
    one = dcopy.copy_gm_to_l1_fp8 if kind == "fp8" else dcopy.copy_gm_to_l1_fp4
    got = np.full((2 * burst_rows + 1, 32), 7.0, np.float32)
    copy(got, gm, first, row_stride, 2, burst_rows, burst_stride_pages * page, 2 * burst_rows - 1, k)
    want = np.zeros_like(got)
    one(want[:burst_rows], gm[first:], row_stride, False, 0, 0, burst_rows, k)
    one(want[burst_rows:2 * burst_rows], gm[second:], row_stride, False, 0, 0, burst_rows - 1, k)
    np.testing.assert_array_equal(got, want)
    assert (got[2 * burst_rows - 1:] == 0).all() and (got[:, k:] == 0).all()
    lone = np.full((burst_rows, 32), 7.0, np.float32)
    copy(lone, gm, second, row_stride, 1, burst_rows, 12345, burst_rows, 32)
    np.testing.assert_array_equal(lone, _one_block(one, gm, second, row_stride))
    codes = np.full((2 * burst_rows, 32), 9, np.uint8)
    if kind == "fp8":  # an L1 of codes receives the codes as stored
        dcopy.copy_gm_to_l1_fp8_bursts(codes, gm, first, row_stride, 2, burst_rows, burst_stride_pages * page,
                                       2 * burst_rows, 32)
        assert (codes[:burst_rows, :24] == gm[first:first + page].reshape(burst_rows, row_stride)).all()
        assert (codes[burst_rows:, :24] == gm[second:second + page].reshape(burst_rows, row_stride)).all()
    before = got.copy()
    with pytest.raises(IndexError):
        copy(got, gm, first, row_stride, 2, burst_rows, 6 * page, 2 * burst_rows, k)  # the second block leaves GM
    with pytest.raises(IndexError):
        copy(got, gm, first, row_stride, 2, burst_rows, -4 * page, 2 * burst_rows, k)  # before GM's start
    np.testing.assert_array_equal(got, before)


def _one_block(one, gm, start, row_stride):
    out = np.zeros((4, 32), np.float32)
    one(out, gm[start:], row_stride, False, 0, 0, 4, 32)
    return out


def test_datacopy_bursts_rows_and_columns(rng):
    """DataCopyBursts (GM -> UB): bursts stacked down the rows (a page's scale rows, strided) or across the columns
    with GM stride 0 (one row repeated in every UB row); the rest of the UB tile untouched; bursts leaving GM or the
    tile raise IndexError, writing nothing."""
    from deep_gemm.device import DataCopyBursts

    gm = rng.integers(0, 256, size=400, dtype=np.uint8)
    ub = np.full((10, 6), 0xEE, np.uint8)
    # two blocks of 4 rows x 3 bytes, rows 10 bytes apart, the second block 250 bytes after the first
    DataCopyBursts(ub, gm, 7, 10, 4, 3, 2, 250, 4, 0)
    want = np.full_like(ub, 0xEE)
    for b, start in enumerate((7, 257)):
        for r in range(4):
            want[4 * b + r, :3] = gm[start + 10 * r:start + 10 * r + 3]
    np.testing.assert_array_equal(ub, want)
    # a backward burst and column stacking with GM stride 0
    f32 = rng.standard_normal(200).astype(np.float32)
    sc = np.full((3, 8), -1.0, np.float32)
    DataCopyBursts(sc, f32, 150, 0, 3, 4, 2, -100, 0, 4)
    np.testing.assert_array_equal(sc, np.tile(np.concatenate([f32[150:154], f32[50:54]]), (3, 1)))
    before = ub.copy()
    for args in ((7, 10, 4, 3, 2, 390, 4, 0),  # the second block leaves GM
                 (7, 10, 4, 3, 2, -10, 4, 0),  # before GM's start
                 (7, 10, 4, 3, 2, 20, 7, 0),  # the second block leaves the tile (rows)
                 (7, 10, 4, 3, 2, 20, 0, 4)):  # ... (columns)
        with pytest.raises(IndexError):
            DataCopyBursts(ub, gm, *args)
    np.testing.assert_array_equal(ub, before)
