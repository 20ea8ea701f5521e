"""The benches' peers: the strongest numpy FP8/FP4 GEMM (table decode, in-place scaling) equals the exact reference,
the naive formulation agrees, and the JAX and torch peers (when installed) compute the same problem: torch's FP8
decode is exact, its thread-count variants run at their counts, and without torch the peer says how to install it."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from deep_gemm.testing import calc_diff, dequantize_fp4, dequantize_fp8, fp4_operand, fp8_operand, peers, reference_gemm
from deep_gemm.utils.formats import BF16_DTYPE, FP8_DTYPE


def _exact_fp8_operand(rng, mn, k):
    """FP8 codes whose values are +-{1, 1.125, ..., 1.875} (e4m3 exponent 7) with power-of-two block scales: every
    product and every partial sum of a K <= 128 dot product is exact in fp32, whatever the summation order."""
    mantissa = rng.integers(0, 8, size=(mn, k), dtype=np.uint8)
    sign = rng.integers(0, 2, size=(mn, k), dtype=np.uint8) << 7
    codes = (sign | (7 << 3) | mantissa).astype(np.uint8).view(FP8_DTYPE)
    return codes, fp8_operand(rng, mn, k)[1]


@pytest.mark.parametrize("major", ["k", "mn"])
@pytest.mark.parametrize("k", [64, 96, 40])
def test_decode_fp8_lut_equals_exact_dequantize(major, k):
    rng = np.random.default_rng(k)
    codes, sf = fp8_operand(rng, 24, k, major)
    out = peers.decode_fp8_lut(codes, sf)
    assert out.dtype == np.float32 and out.shape == (24, k) and out.flags.c_contiguous
    np.testing.assert_array_equal(out, dequantize_fp8(codes, sf).astype(np.float32))


@pytest.mark.parametrize("k", [64, 96, 40])
def test_decode_fp4_lut_equals_exact_dequantize(k):
    rng = np.random.default_rng(k)
    packed, sf = fp4_operand(rng, 18, k)
    np.testing.assert_array_equal(peers.decode_fp4_lut(packed, sf), dequantize_fp4(packed, sf).astype(np.float32))


@pytest.mark.parametrize("k", [64, 128])
def test_numpy_fp8_gemm_bitwise_equals_reference_when_exact(k):
    rng = np.random.default_rng(1)
    (a, sfa), (b, sfb) = _exact_fp8_operand(rng, 8, k), _exact_fp8_operand(rng, 12, k)
    ref = reference_gemm(dequantize_fp8(a, sfa), dequantize_fp8(b, sfb)).astype(BF16_DTYPE)
    out = peers.numpy_fp8_gemm(a, sfa, b, sfb)
    assert out.dtype == BF16_DTYPE and out.shape == (8, 12)
    np.testing.assert_array_equal(out.view(np.uint16), ref.view(np.uint16))
    np.testing.assert_array_equal(peers.numpy_fp8_gemm_naive(a, sfa, b, sfb).view(np.uint16), ref.view(np.uint16))


def test_numpy_fp4_gemm_bitwise_equals_reference():
    # e2m1 values times scales in {1/4, 1/2, 1} have <= 3 significant bits: K = 256 sums stay exact in fp32.
    rng = np.random.default_rng(2)
    (a, sfa), (b, sfb) = fp4_operand(rng, 10, 256), fp4_operand(rng, 6, 256)
    ref = reference_gemm(dequantize_fp4(a, sfa), dequantize_fp4(b, sfb)).astype(BF16_DTYPE)
    np.testing.assert_array_equal(peers.numpy_fp4_gemm(a, sfa, b, sfb).view(np.uint16), ref.view(np.uint16))


def test_numpy_fp8_gemm_random_codes_close_to_reference():
    rng = np.random.default_rng(3)
    (a, sfa), (b, sfb) = fp8_operand(rng, 16, 512), fp8_operand(rng, 40, 512, "mn")
    ref = reference_gemm(dequantize_fp8(a, sfa), dequantize_fp8(b, sfb))
    assert calc_diff(peers.numpy_fp8_gemm(a, sfa, b, sfb).astype(np.float64), ref) < 1e-4
    assert calc_diff(peers.numpy_fp8_gemm_naive(a, sfa, b, sfb).astype(np.float64), ref) < 1e-4


def test_peers_bad_input_names_the_argument():
    rng = np.random.default_rng(4)
    a, sfa = fp8_operand(rng, 4, 64)
    with pytest.raises(TypeError, match="codes.dtype=float32"):
        peers.decode_fp8_lut(a.astype(np.float32), sfa)
    with pytest.raises(ValueError, match="sf.shape"):
        peers.decode_fp8_lut(a, sfa[:, :1])
    with pytest.raises(TypeError, match="sf.dtype=float64"):
        peers.decode_fp8_lut(a, sfa.astype(np.float64))
    c, sfc = fp8_operand(rng, 4, 96)
    with pytest.raises(ValueError, match="same K"):
        peers.numpy_fp8_gemm(a, sfa, c, sfc)
    x = np.ones((4, 64), np.float32)[:, ::2]
    with pytest.raises(ValueError, match="C-contiguous"):
        peers.scale_blocks_inplace(x, np.ones((4, 1), np.float32))


def test_jax_peer_same_problem():
    pytest.importorskip("jax", reason="the JAX peer is the optional `peers` extra")
    rng = np.random.default_rng(5)
    (a, sfa), (b, sfb) = fp8_operand(rng, 8, 96), fp8_operand(rng, 16, 96)
    want = peers.numpy_fp8_gemm(a, sfa, b, sfb).astype(np.float64)
    got = np.asarray(peers.jax_fp8_gemm(a, sfa, b, sfb)()).astype(np.float64)
    assert got.shape == (8, 16) and calc_diff(got, want) < 1e-5
    (p, sfp), (q, sfq) = fp4_operand(rng, 8, 64), fp4_operand(rng, 6, 64)
    got4 = np.asarray(peers.jax_fp4_gemm(p, sfp, q, sfq)()).astype(np.float64)
    np.testing.assert_array_equal(got4, peers.numpy_fp4_gemm(p, sfp, q, sfq).astype(np.float64))
    x = rng.standard_normal((8, 64)).astype(BF16_DTYPE)
    y = rng.standard_normal((4, 64)).astype(BF16_DTYPE)
    got16 = np.asarray(peers.jax_bf16_gemm(x, y)())
    assert got16.dtype == np.float32
    assert calc_diff(got16.astype(np.float64), reference_gemm(x, y)) < 1e-6


def test_jax_version_matches_importability():
    try:
        import jax
    except ImportError:
        assert peers.jax_version() is None
    else:
        assert peers.jax_version() == jax.__version__


# ---------------------------------------------------------------------------------------------------------------
# torch (the optional `torch` extra)
# ---------------------------------------------------------------------------------------------------------------
def test_torch_fp8_gemm_bitwise_equals_reference_when_exact():
    torch = pytest.importorskip("torch", reason="the torch peer is the optional `torch` extra")
    rng = np.random.default_rng(6)
    (a, sfa), (b, sfb) = _exact_fp8_operand(rng, 8, 128), _exact_fp8_operand(rng, 12, 128)
    ref = reference_gemm(dequantize_fp8(a, sfa), dequantize_fp8(b, sfb)).astype(BF16_DTYPE)
    out = peers.torch_fp8_gemm(a, sfa, b, sfb)()
    assert str(out.dtype) == "torch.bfloat16" and tuple(out.shape) == (8, 12)
    np.testing.assert_array_equal(out.view(dtype=torch.int16).numpy().view(np.uint16),
                                  ref.view(np.uint16))


@pytest.mark.parametrize("k", [96, 40])
def test_torch_fp8_peers_decode_and_gemm_match_numpy(k):
    torch = pytest.importorskip("torch", reason="the torch peer is the optional `torch` extra")
    rng = np.random.default_rng(k)
    (a, sfa), (b, sfb) = fp8_operand(rng, 16, k), fp8_operand(rng, 24, k, "mn")
    # the decode is exact (FP8 values times power-of-two scales fit bf16), K a multiple of 32 or not
    decoded = peers.torch_decode_fp8(peers.torch_tensor(a), peers.torch_tensor(sfa), k)
    np.testing.assert_array_equal(decoded.float().numpy(), peers.decode_fp8_lut(a, sfa))
    got = peers.torch_fp8_gemm(a, sfa, b, sfb)().float().numpy().astype(np.float64)
    assert calc_diff(got, peers.numpy_fp8_gemm(a, sfa, b, sfb).astype(np.float64)) < 1e-5
    x = rng.standard_normal((8, 64)).astype(BF16_DTYPE)
    y = rng.standard_normal((4, 64)).astype(BF16_DTYPE)
    got16 = peers.torch_bf16_gemm(x, y)()
    assert got16.dtype == torch.bfloat16
    assert calc_diff(got16.float().numpy().astype(np.float64), reference_gemm(x, y)) < 1e-4
    with pytest.raises(TypeError, match="bfloat16"):
        peers.torch_bf16_gemm(x.astype(np.float32), y)


def test_torch_variants_run_at_their_thread_counts():
    torch = pytest.importorskip("torch", reason="the torch peer is the optional `torch` extra")
    default = peers.torch_default_threads()
    seen = []
    variants = peers.torch_variants(lambda: seen.append(torch.get_num_threads()))
    counts = peers.torch_thread_counts()
    assert counts == list(range(1, len(counts) + 1))
    assert list(variants) == ["torch"] + [f"torch-{t}t" for t in counts if t != default]
    try:
        for fn in variants.values():
            fn()
    finally:
        torch.set_num_threads(default)
    assert seen == [default] + [t for t in counts if t != default]
    with pytest.raises(ValueError, match="threads=0"):
        peers.torch_at_threads(lambda: None, 0)


def test_without_torch_the_peer_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    assert peers.torch_version() is None
    rng = np.random.default_rng(7)
    a, sfa = fp8_operand(rng, 4, 64)
    with pytest.raises(ImportError, match=r"deep_gemm\[torch\]"):
        peers.torch_fp8_gemm(a, sfa, a, sfa)


def test_torch_version_matches_importability():
    try:
        import torch
    except ImportError:
        assert peers.torch_version() is None
    else:
        assert peers.torch_version() == torch.__version__
