"""Ascend scale-factor layout: the worked example, an independent loop reference, round trips and every error."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deep_gemm.testing.reference import dequantize_fp8
from deep_gemm.utils import (
    is_required_sf_layout,
    per_token_cast_to_fp8,
    transform_k_grouped_sf_into_required_layout,
    transform_sf_into_required_layout,
    unpack_sf_from_required_layout,
)


def _cdiv(a, b):
    return -(-a // b)


def _loop_reference(sf, mn, k, gran_mn, gran_k, zero_rows=(), zero_blocks=()):
    """Flat int16 memory of the required layout, built element by element: index (g*Kp + p)*mn + r."""
    sf3 = sf if sf.ndim == 3 else sf[None]
    nb, kp = _cdiv(k, 32), _cdiv(k, 64)
    out = []
    for g in range(sf3.shape[0]):
        for p in range(kp):
            for r in range(mn):
                pair = 0
                for half in (0, 1):
                    j = 2 * p + half
                    if j >= nb or r in zero_rows or j in zero_blocks:
                        continue
                    if sf.dtype == np.float32:
                        value = float(sf3[g, r // gran_mn, j * 32 // gran_k])
                        byte = struct.unpack("<I", struct.pack("<f", value))[0] >> 23
                    else:
                        word = int(sf3[g, r // gran_mn, j // 2]) & 0xFFFF
                        byte = (word >> (8 * (j % 2))) & 0xFF
                    pair |= byte << (8 * half)
                out.append(pair)
    return struct.pack(f"<{len(out)}H", *out)


def _check_layout(out, sf, mn, k, gran_mn, gran_k, **zero):
    kp = _cdiv(k, 64)
    lead = sf.shape[:-2]
    assert out.dtype == np.int16 and out.shape == lead + (mn, kp)
    strides = (2 * mn * kp, 2, 2 * mn) if lead else (2, 2 * mn)
    if mn > 1 and kp > 1:
        assert out.strides == strides
    physical = np.swapaxes(out, -1, -2)
    assert physical.flags.c_contiguous
    assert physical.tobytes() == _loop_reference(sf, mn, k, gran_mn, gran_k, **zero)


# ---------------------------------------------------------------------------------------------------------------
# The worked example (deepgemm_ascend_api.md 2.4)


def test_worked_example():
    sfa = np.array([[2.0**-7, 2.0**-8, 2.0**-9], [1.0, 2.0, 0.5], [2.0**-20, 4.0, 0.5]], np.float32)
    out = transform_sf_into_required_layout(sfa, 3, 96, (1, 1, 32), is_sfa=True)
    assert out.dtype == np.int16 and out.shape == (3, 2) and out.strides == (2, 6)
    assert out.view(np.uint16)[:, 0].tolist() == [0x7778, 0x807F, 0x816B]
    assert out.view(np.uint16)[:, 1].tolist() == [0x0076, 0x007E, 0x007E]
    assert np.swapaxes(out, 0, 1).ravel().view(np.uint16).tolist() == [0x7778, 0x807F, 0x816B, 0x0076, 0x007E, 0x007E]
    assert np.swapaxes(out, 0, 1).tobytes() == bytes.fromhex("78 77 7F 80 6B 81 76 00 7E 00 7E 00")
    assert out[1, 0] < 0  # 0x807F as a signed int16
    np.testing.assert_array_equal(unpack_sf_from_required_layout(out, 3, 96), sfa)


def test_worked_example_gran_mn_128():
    sfb = np.array([[1.0, 2.0, 0.5], [4.0, 0.25, 8.0]], np.float32)
    out = transform_sf_into_required_layout(sfb, 256, 96, (1, 128, 32), is_sfa=False)
    assert out.shape == (256, 2) and out.strides == (2, 512)
    back = unpack_sf_from_required_layout(out, 256, 96)
    np.testing.assert_array_equal(back[:128], np.broadcast_to(sfb[0], (128, 3)))
    np.testing.assert_array_equal(back[128:], np.broadcast_to(sfb[1], (128, 3)))


# ---------------------------------------------------------------------------------------------------------------
# Against the loop reference


@pytest.mark.parametrize("mn, k", [(1, 1), (5, 32), (7, 64), (4, 96), (9, 200), (3, 0), (0, 64)])
@pytest.mark.parametrize("gran_mn", [1, 2, 4])
@pytest.mark.parametrize("gran_k", [32, 128])
def test_fp32_matches_loop_reference(rng, mn, k, gran_mn, gran_k):
    sf = np.exp2(rng.integers(-20, 10, size=(_cdiv(mn, gran_mn), _cdiv(k, gran_k)))).astype(np.float32)
    out = transform_sf_into_required_layout(sf, mn, k, (gran_mn, 1, gran_k), is_sfa=True)
    _check_layout(out, sf, mn, k, gran_mn, gran_k)
    # MN-major (column-major) fp32 input gives the same result.
    mn_major = sf.T.copy().T
    again = transform_sf_into_required_layout(mn_major, mn, k, (gran_mn, 1, gran_k), is_sfa=True)
    np.testing.assert_array_equal(again, out)


def test_grouped_3d(rng):
    sf = np.exp2(rng.integers(-10, 10, size=(3, 5, 4))).astype(np.float32)  # G=3, mn=5, k=100 -> 4 blocks
    out = transform_sf_into_required_layout(sf, 5, 100, (1, 1, 32), num_groups=3, is_sfa=False)
    assert out.shape == (3, 5, 2) and out.strides == (20, 2, 10)
    _check_layout(out, sf, 5, 100, 1, 32)
    np.testing.assert_array_equal(unpack_sf_from_required_layout(out, 5, 100), sf)


@settings(max_examples=60, deadline=None)
@given(
    mn=st.integers(1, 40), k=st.integers(1, 400), log_gran_mn=st.integers(0, 7), gran_k=st.sampled_from([32, 128]),
    groups=st.sampled_from([None, 1, 3]), is_sfa=st.booleans(), seed=st.integers(0, 2**31),
)
def test_roundtrip_and_reference_property(mn, k, log_gran_mn, gran_k, groups, is_sfa, seed):
    gran_mn = 1 << log_gran_mn
    rng = np.random.default_rng(seed)
    lead = () if groups is None else (groups,)
    exps = rng.integers(1, 255, size=lead + (_cdiv(mn, gran_mn), _cdiv(k, gran_k)))
    sf = (exps.astype(np.uint32) << 23).view(np.float32)
    recipe = (gran_mn, 1, gran_k) if is_sfa else (1, gran_mn, gran_k)
    before = sf.copy()
    out = transform_sf_into_required_layout(sf, mn, k, recipe, num_groups=groups, is_sfa=is_sfa)
    np.testing.assert_array_equal(sf, before)
    _check_layout(out, sf, mn, k, gran_mn, gran_k)
    rows, cols = np.arange(mn) // gran_mn, np.arange(_cdiv(k, 32)) * 32 // gran_k
    expanded = sf[..., rows[:, None], cols[None, :]]
    np.testing.assert_array_equal(unpack_sf_from_required_layout(out, mn, k), expanded)
    # The int16 result fed back is the fast path; its per-row int16 form is accepted and re-laid out identically.
    assert transform_sf_into_required_layout(out, mn, k, (1, 1, 32), num_groups=groups) is out
    kmajor = np.ascontiguousarray(out)
    again = transform_sf_into_required_layout(kmajor, mn, k, (1, 1, 32), num_groups=groups)
    np.testing.assert_array_equal(again, out)


@pytest.mark.parametrize("lead", [(), (3,)])
def test_fp32_k_major_and_mn_major_scales_give_the_same_bits(rng, lead):
    """A K-major fp32 input (its exponent bytes are viewed as pairs as they are) and an MN-major copy of it (laid
    out first) give the same bits, exponents 0 and 254 included; a bad scale is named by its index either way."""
    exps = rng.integers(0, 255, size=lead + (33, 6)).astype(np.uint32)
    exps[..., 0, 0], exps[..., 1, 1] = 0, 254
    sf = (exps << 23).view(np.float32)
    groups = lead[0] if lead else None

    def mn_major(x):
        return np.swapaxes(np.swapaxes(x, -1, -2).copy(), -1, -2)

    out = transform_sf_into_required_layout(sf, 33, 192, (1, 1, 32), num_groups=groups, is_sfa=True)
    full = transform_sf_into_required_layout(mn_major(sf), 33, 192, (1, 1, 32), num_groups=groups, is_sfa=True)
    assert out.strides == full.strides
    np.testing.assert_array_equal(out, full)
    _check_layout(out, sf, 33, 192, 1, 32)
    for value in (3.0, -1.0, np.inf):
        bad = sf.copy()
        bad[..., 4, 5] = value
        for x in (bad, mn_major(bad)):
            with pytest.raises(ValueError, match=r"4, 5\]="):
                transform_sf_into_required_layout(x, 33, 192, (1, 1, 32), num_groups=groups, is_sfa=True)


# ---------------------------------------------------------------------------------------------------------------
# int16 inputs


def test_int16_fast_path_and_copies(rng):
    mn, k = 6, 200
    phys = rng.integers(-(2**15), 2**15, size=(4, mn), dtype=np.int16)
    phys[-1] &= 0x00FF  # 7 blocks: the last high byte is 0 in a valid layout
    required = phys.T
    assert is_required_sf_layout(required, mn, k)
    assert transform_sf_into_required_layout(required, mn, k, (1, 1, 32), is_sfa=True) is required
    kmajor = required.copy()  # C-contiguous [mn, Kp]: not the required strides
    assert not is_required_sf_layout(kmajor, mn, k)
    out = transform_sf_into_required_layout(kmajor, mn, k, (1, 1, 32), is_sfa=True)
    assert out is not kmajor and out.strides == (2, 2 * mn)
    np.testing.assert_array_equal(out, required)


def test_int16_odd_tail_high_byte_is_cleared_and_gran_mn_expanded():
    sf = np.array([[0x1234, 0x5678], [0x0102, 0x7F7F]], dtype=np.uint16).view(np.int16)  # 2 rows, k=96 -> 3 blocks
    out = transform_sf_into_required_layout(sf, 3, 96, (2, 1, 32), is_sfa=True)
    assert out.shape == (3, 2)
    assert out.view(np.uint16).tolist() == [[0x1234, 0x0078], [0x1234, 0x0078], [0x0102, 0x007F]]
    _check_layout(out, sf, 3, 96, 2, 32)


def test_fast_path_size_one_dims():
    # mn == 1: a C-contiguous [1, Kp] array is already the required memory layout.
    sf = np.array([[0x7F7F, 0x7F]], np.int16)
    assert transform_sf_into_required_layout(sf, 1, 96, (1, 1, 32), is_sfa=True) is sf


# ---------------------------------------------------------------------------------------------------------------
# CUDA recipes (gran_k 128) expand exactly


def test_cuda_recipe_1_128_128_dequantizes_identically(rng):
    m, n, k = 5, 130, 300
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((n, k)).astype(np.float32)
    a_fp8, sfa = per_token_cast_to_fp8(a, use_ue8m0=True, gran_k=128)
    b_fp8, sfb_tok = per_token_cast_to_fp8(b, use_ue8m0=True, gran_k=128)
    sfb = sfb_tok[::128]  # one scale per 128 rows of B, as recipe (1, 128, 128)
    req_a = transform_sf_into_required_layout(sfa, m, k, (1, 128, 128), is_sfa=True)
    req_b = transform_sf_into_required_layout(sfb, n, k, (1, 128, 128), is_sfa=False)
    np.testing.assert_array_equal(dequantize_fp8(a_fp8, req_a), dequantize_fp8(a_fp8, sfa, 1, 128))
    np.testing.assert_array_equal(dequantize_fp8(b_fp8, req_b), dequantize_fp8(b_fp8, sfb, 128, 128))


# ---------------------------------------------------------------------------------------------------------------
# Grouped layouts


def test_m_grouped_psum_padding_rows():
    mn, k = 768, 64
    psum = np.array([1, 556, 768], np.int32)  # groups [0,1) [256,556) [768,768); padding [1,256) [556,768)
    sf = np.full((mn, 2), 2.0, np.float32)
    sf[1:256] = np.nan  # garbage in padding is neither validated nor kept
    sf[600, 1] = -3.0
    before = sf.copy()
    out = transform_sf_into_required_layout(sf, mn, k, (1, 1, 32), is_sfa=True, psum_layout=psum)
    np.testing.assert_array_equal(sf, before)
    zero_rows = set(range(1, 256)) | set(range(556, 768))
    clean = np.where(np.isnan(sf) | (sf < 0), 0, sf).astype(np.float32)
    _check_layout(out, clean, mn, k, 1, 32, zero_rows=zero_rows)
    # gran_mn 32: padding in SF rows is [ceil(psum/32), align(psum, 256)/32): output rows 1..31 keep row 0's scale.
    sf32 = np.full((24, 2), 4.0, np.float32)
    sf32[1:8] = 3.0
    out32 = transform_sf_into_required_layout(sf32, mn, k, (32, 1, 32), is_sfa=True, psum_layout=psum)
    rows = unpack_sf_from_required_layout(out32, mn, k)[:, 0]
    assert (rows[:32] == 4.0).all() and (rows[32:256] == 2.0**-127).all() and (rows[256:544] == 4.0).all()
    assert (rows[576:] == 2.0**-127).all() and (rows[544:576] == 4.0).all()


def test_m_grouped_int16_padding():
    mn, k = 512, 64
    required = np.full((1, mn), 0x7F7F, np.int16).T
    assert transform_sf_into_required_layout(required, mn, k, (1, 1, 32), is_sfa=True, psum_layout=[256, 512]) \
        is required
    garbage = required.copy(order="F")
    psum = [100, 512]
    out = transform_sf_into_required_layout(garbage, mn, k, (1, 1, 32), is_sfa=True, psum_layout=psum)
    assert out is not garbage and (out[100:256] == 0).all() and (out[:100] == 0x7F7F).all()
    assert (garbage[100:256] == 0x7F7F).all()


def test_m_grouped_error_outside_padding_names_index():
    sf = np.ones((512, 1), np.float32)
    sf[300, 0] = 3.0
    with pytest.raises(ValueError, match=r"sf\[300, 0\]=3.0 \(bits 0x40400000\)"):
        transform_sf_into_required_layout(sf, 512, 32, (1, 1, 32), is_sfa=True, psum_layout=[256, 512])


@pytest.mark.parametrize(
    "psum, match",
    [([100, 200], r"psum_layout\[1\]=200 is below its group's start 256"), ([-1], r"psum_layout\[0\]=-1"),
     ([256, 1000], r"psum_layout\[-1\]=1000 exceeds mn=512"), ([], "non-empty"), ([[1]], "non-empty")],
)
def test_psum_errors(psum, match):
    with pytest.raises(ValueError, match=match):
        transform_sf_into_required_layout(np.ones((512, 1), np.float32), 512, 32, (1, 1, 32), is_sfa=True,
                                          psum_layout=psum)


def test_psum_type_and_group_errors():
    with pytest.raises(TypeError, match="float64"):
        transform_sf_into_required_layout(np.ones((4, 1), np.float32), 4, 32, (1, 1, 32), is_sfa=True,
                                          psum_layout=[1.0])
    with pytest.raises(ValueError, match="num_groups=2"):
        transform_sf_into_required_layout(np.ones((2, 4, 1), np.float32), 4, 32, (1, 1, 32), num_groups=2,
                                          is_sfa=True, psum_layout=[4])


@pytest.mark.parametrize("gran_k", [32, 128])
def test_k_grouped(rng, gran_k):
    psum = np.array([100, 256 + 64, 512 + 200], np.int64)  # padding K: [100,256) [320,512) [712,768)
    mn, k = 6, 712
    sf = np.exp2(rng.integers(-8, 8, size=(mn, _cdiv(k, gran_k)))).astype(np.float32)
    pad_cols = [c for c in range(sf.shape[1])
                if any(_cdiv(e, gran_k) <= c < _cdiv(e, 256) * 256 // gran_k for e in psum)]
    garbage = sf.copy()
    garbage[:, pad_cols] = -np.inf
    out = transform_k_grouped_sf_into_required_layout(garbage, mn, k, (1, 1, gran_k), True, psum)
    zero_blocks = {j for e in psum for j in range(_cdiv(e, 32), -(-e // 256) * 8)}
    assert zero_blocks >= {4, 5, 6, 7, 10, 15} and 3 not in zero_blocks
    _check_layout(out, sf, mn, k, 1, gran_k, zero_blocks=zero_blocks)
    bad = sf.copy()
    bad[2, 2] = 1.5
    with pytest.raises(ValueError, match=r"sf\[2, 2\]=1.5"):
        transform_k_grouped_sf_into_required_layout(bad, mn, k, (1, 1, gran_k), True, psum)
    with pytest.raises(ValueError, match="exceeds k=712"):
        transform_k_grouped_sf_into_required_layout(sf, mn, k, (1, 1, gran_k), True, [800])
    with pytest.raises(ValueError, match="psum_layout"):
        transform_k_grouped_sf_into_required_layout(sf, mn, k, (1, 1, gran_k), True, None)


def test_k_grouped_int16_zeroes_padded_bytes():
    # One group ending at K=80: blocks [3, 8) are its padding, pair 1 keeps its low byte only; blocks 8, 9 lie
    # past every group's range and are kept as given.
    k, mn = 320, 2
    sf = np.full((mn, 5), 0x7F7F, np.int16)
    out = transform_k_grouped_sf_into_required_layout(sf, mn, k, (1, 1, 32), True, [80])
    assert out.view(np.uint16)[0].tolist() == [0x7F7F, 0x007F, 0, 0, 0x7F7F]


# ---------------------------------------------------------------------------------------------------------------
# Validation


@pytest.mark.parametrize(
    "value, bits",
    [(-0.5, "0xbf000000"), (3.0, "0x40400000"), (np.nan, "0x7fc00000"), (np.inf, "0x7f800000"), (-0.0, "0x80000000"),
     (2.0**-130, "0x00080000")],
)
def test_fp32_value_errors_name_index_and_value(value, bits):
    sf = np.ones((3, 4), np.float32)
    sf[1, 2] = value
    sf[2, 3] = 3.0  # a later offence: the first one is reported
    with pytest.raises(ValueError, match=rf"sf\[1, 2\]=.*\(bits {bits}\)"):
        transform_sf_into_required_layout(sf, 3, 128, (1, 1, 32), is_sfa=True)


def test_zero_is_accepted_as_byte_zero():
    out = transform_sf_into_required_layout(np.zeros((1, 1), np.float32), 1, 32, (1, 1, 32), is_sfa=True)
    assert out.tolist() == [[0]]
    assert unpack_sf_from_required_layout(out, 1, 32)[0, 0] == 2.0**-127


def test_shape_and_type_errors():
    ok = np.ones((4, 2), np.float32)
    cases = [
        (TypeError, "float64", dict(sf=ok.astype(np.float64))),
        (TypeError, "numpy array", dict(sf=ok.tolist())),
        (TypeError, "uint16", dict(sf=ok.astype(np.uint16))),
        (ValueError, r"2-D \(3-D needs num_groups\)", dict(sf=ok[None])),
        (ValueError, r"3-D with num_groups=2", dict(sf=ok[None], num_groups=2)),
        (ValueError, r"\(4, 3\) does not match mn=4 k=64 gran_mn=1 gran_k=32.*\(4, 2\)",
         dict(sf=np.ones((4, 3), np.float32))),
        (ValueError, r"must be \(4, 1\)", dict(sf=np.ones((4, 2), np.int16))),
        (ValueError, "disable_ue8m0_cast=True", dict(disable_ue8m0_cast=True)),
        (ValueError, "mn must be >= 0, got mn=-1", dict(mn=-1)),
        (TypeError, "mn must be an int, got bool", dict(mn=True)),
        (TypeError, "k must be an int, got float", dict(k=64.0)),
        (ValueError, r"gran_mn=3", dict(recipe=(3, 1, 32))),
        (ValueError, r"gran_mn=256", dict(recipe=(256, 1, 32))),
        (ValueError, r"gran_mn=0", dict(recipe=(0, 1, 32))),
        (ValueError, r"gran_k=64", dict(recipe=(1, 1, 64))),
        (TypeError, "3-tuple", dict(recipe=(1, 1, 32, 1))),
        (TypeError, "recipe entries", dict(recipe=(1, 1.0, 32))),
        (ValueError, "is_sfa must be given", dict(recipe=(1, 128, 32), is_sfa=None)),
        (TypeError, "is_sfa must be a bool", dict(is_sfa=1)),
        (ValueError, "num_groups must be >= 1", dict(sf=ok[None], num_groups=0)),
    ]
    for exc, match, over in cases:
        kwargs = dict(sf=ok, mn=4, k=64, recipe=(1, 1, 32), is_sfa=True) | over
        with pytest.raises(exc, match=match):
            transform_sf_into_required_layout(**kwargs)
    with pytest.raises(ValueError, match="requires gran_k=32"):
        transform_sf_into_required_layout(np.ones((4, 1), np.int16), 4, 64, (1, 1, 128), is_sfa=True)
    # int16 input with disable_ue8m0_cast is fine; a 2-tuple recipe is the per-operand form.
    transform_sf_into_required_layout(np.ones((4, 1), np.int16), 4, 64, (1, 1, 32), disable_ue8m0_cast=True)
    out = transform_sf_into_required_layout(np.ones((2, 2), np.float32), 4, 64, (2, 32))
    assert out.shape == (4, 1)


def test_unpack_errors_and_specials():
    sf = np.array([[0x00FF], [0x7F00]], np.uint16).view(np.int16)
    out = unpack_sf_from_required_layout(sf, 2, 64)
    assert np.isnan(out[0, 0]) and out[0, 1] == 2.0**-127 and out[1].tolist() == [2.0**-127, 1.0]
    with pytest.raises(TypeError, match="float32"):
        unpack_sf_from_required_layout(np.ones((2, 1), np.float32), 2, 64)
    with pytest.raises(ValueError, match=r"\(2, 1\) does not end in \(2, 2\) for mn=2 k=65"):
        unpack_sf_from_required_layout(sf, 2, 65)
