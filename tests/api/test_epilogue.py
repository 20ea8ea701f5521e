"""The FP8-output epilogue (deep_gemm.epilogue.FP8Quantization) through the public GEMMs: codes and scales bit-exact
with deep_gemm.utils.per_token_cast_to_fp8 of the fp32 GEMM output of the same inputs and config, for FP8 and BF16
operands; bitwise equal on 1, 7 and 32 logical cores and 1 and 2 CPU threads; Identity / Alpha; every bad input
refused with the argument named and D / sfd untouched."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numba
import numpy as np
import pytest

import deep_gemm
from deep_gemm import runtime
from deep_gemm.epilogue import Alpha, FP8Quantization, Identity
from deep_gemm.kernels.bf16_gemm import launch_bf16_gemm
from deep_gemm.kernels.fp8_gemm import launch_fp8_gemm
from deep_gemm.testing import calc_diff
from deep_gemm.utils import per_token_cast_to_fp8

FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)


def _fp8_inputs(rng, m, n, k):
    """FP8 A, B (codes over the finite e4m3 values) with power-of-two per-32 fp32 scales; the float64 product."""
    def operand(rows):
        x = (rng.standard_normal((rows, k)) * 2).astype(np.float32)
        codes, sf = per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32)
        return codes, sf, codes.astype(np.float64) * np.repeat(sf, 32, axis=1)[:, :k]

    a, sfa, av = operand(m)
    b, sfb, bv = operand(n)
    return (a, sfa), (b, sfb), av @ bv.T


def _empty_sfd(m, n):
    return np.full((n // 64, m), 0x5A5A, np.int16).T  # strides (1, M); filler bits show unwritten scales


def _unpack(sfd):
    """int16 [M, N/64] -> fp32 scales [M, N/32] (low byte first)."""
    b = np.ascontiguousarray(sfd).view(np.uint8).reshape(sfd.shape[0], -1).astype(np.uint32)
    return (b << 23).view(np.float32)


def _check_against_per_token_cast(d, sfd, d32):
    codes, sf = per_token_cast_to_fp8(d32, use_ue8m0=True, gran_k=32)
    np.testing.assert_array_equal(d.view(np.uint8), codes.view(np.uint8))
    np.testing.assert_array_equal(_unpack(sfd).view(np.uint32), sf.view(np.uint32))


def _fp8_launcher(a, b, m, n, k):
    """gemm(d, config): the kernel layer on the same FP8 inputs (fp32 D, or FP8 D + sfd)."""
    p = deep_gemm.api.gemm.check_fp8_fp4_problem(a, b, np.empty((m, n), np.float32), None, None, None, None, False)

    def gemm(d, config, sfd=None):
        out = d.view(np.uint8) if sfd is not None else d
        return launch_fp8_gemm(p.op_a.gm, "k", "fp8", p.sfa, p.op_b.gm, "k", "fp8", p.sfb, out, m, n, k,
                               with_accumulation=False, alpha=1.0, compiled_dims="nk", config=config, sfd=sfd)
    return gemm


def test_fp8_gemm_fp8_output_bit_exact_with_per_token_cast(rng):
    m, n, k = 150, 192, 160  # ragged M (partial tiles and AIV halves), several 64-column scale pairs
    a, b, ref = _fp8_inputs(rng, m, n, k)
    d = np.full((m, n), np.nan, FP8)
    sfd = _empty_sfd(m, n)
    with runtime.runtime_scope(num_ai_cores=7):
        config = deep_gemm.fp8_gemm_nt(a, b, d, epilogue=FP8Quantization(sfd))
        # the fp32 GEMM output of the same inputs and config (the same tile values), through the kernel layer
        d32 = np.empty((m, n), np.float32)
        _fp8_launcher(a, b, m, n, k)(d32, config)
    _check_against_per_token_cast(d, sfd, d32)
    dequant = d.astype(np.float64) * np.repeat(_unpack(sfd), 32, axis=1)
    assert calc_diff(dequant, ref) < 2e-3  # FP8 output precision


def test_bf16_gemm_fp8_output_bit_exact_with_per_token_cast(rng):
    m, n, k = 70, 128, 96
    a = rng.standard_normal((m, k)).astype(BF16)
    b = rng.standard_normal((n, k)).astype(BF16)
    d = np.zeros((m, n), FP8)
    sfd = _empty_sfd(m, n)
    with runtime.runtime_scope(num_ai_cores=3):
        config = deep_gemm.bf16_gemm_nt(a, b, d, epilogue=FP8Quantization(sfd))
        d32 = np.empty((m, n), np.float32)
        launch_bf16_gemm(a.view(np.uint16), "k", b.view(np.uint16), "k", d32, m, n, k, with_accumulation=False,
                         alpha=1.0, compiled_dims="nk", config=config)
    _check_against_per_token_cast(d, sfd, d32)


def test_fp8_output_bitwise_equal_over_cores_and_threads(rng):
    m, n, k = 150, 192, 160
    a, b, _ = _fp8_inputs(rng, m, n, k)
    gemm = _fp8_launcher(a, b, m, n, k)
    with runtime.runtime_scope(num_ai_cores=7):
        base = deep_gemm.fp8_gemm_nt(a, b, np.zeros((m, n), FP8), epilogue=FP8Quantization(_empty_sfd(m, n)))
    saved = numba.get_num_threads()
    outs = {}
    try:
        for cores in (1, 7, 32):
            config = dataclasses.replace(base, num_ai_cores=cores)
            for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
                numba.set_num_threads(threads)
                d, sfd = np.zeros((m, n), FP8), _empty_sfd(m, n)
                with runtime.runtime_scope(num_ai_cores=cores):
                    gemm(d, config, sfd)
                outs[cores, threads] = (d.view(np.uint8).copy(), sfd.copy())
    finally:
        numba.set_num_threads(saved)
    first_d, first_sfd = outs[1, 1]
    for key, (d, sfd) in outs.items():
        np.testing.assert_array_equal(d, first_d, err_msg=str(key))
        np.testing.assert_array_equal(sfd, first_sfd, err_msg=str(key))


def test_identity_and_alpha_epilogues(rng):
    m, n, k = 33, 48, 64
    a = rng.standard_normal((m, k)).astype(BF16)
    b = rng.standard_normal((n, k)).astype(BF16)
    with runtime.runtime_scope(num_ai_cores=3):
        plain, ident, scaled = (np.empty((m, n), np.float32) for _ in range(3))
        deep_gemm.bf16_gemm_nt(a, b, plain, alpha=0.5)
        deep_gemm.bf16_gemm_nt(a, b, ident, epilogue=Identity())
        deep_gemm.bf16_gemm_nt(a, b, scaled, epilogue=Alpha(0.5))
    np.testing.assert_array_equal(scaled, plain)
    np.testing.assert_array_equal(ident * np.float32(0.5), plain)


def _bytes(x):
    return np.ascontiguousarray(x).view(np.uint8)


def _bad_cases(m, n):
    """(name, kwargs overrides, exception, text naming the argument)."""
    good_sfd = _empty_sfd(m, n)
    return [
        ("with c", dict(c=np.zeros((m, n), FP8)), ValueError, "takes no c"),
        ("with alpha", dict(alpha=2.0), ValueError, "alpha=2.0"),
        ("alpha epilogue and alpha", dict(epilogue=Alpha(2.0), alpha=3.0, d=np.zeros((m, n), np.float32)),
         ValueError, "alpha=3.0"),
        ("sfd dtype", dict(epilogue=FP8Quantization(good_sfd.astype(np.int32))), TypeError, "sfd.dtype=int32"),
        ("sfd shape", dict(epilogue=FP8Quantization(np.zeros((n // 64 + 1, m), np.int16).T)), ValueError,
         "sfd.shape"),
        ("sfd strides", dict(epilogue=FP8Quantization(np.zeros((m, n // 64), np.int16))), ValueError,
         "strides"),
        ("d dtype", dict(d=np.zeros((m, n), BF16)), TypeError, "float8_e4m3fn"),
        ("fp8 d without epilogue", dict(epilogue=None), TypeError, "FP8Quantization"),
        ("not an epilogue", dict(epilogue="fp8"), TypeError, "epilogue must be"),
    ]


@pytest.mark.parametrize("case", range(9))
@pytest.mark.parametrize("kind", ["fp8", "bf16"])
def test_bad_input_is_refused_before_anything_is_written(rng, case, kind):
    m, n, k = 16, 128, 64
    name, overrides, exc, text = _bad_cases(m, n)[case]
    d = np.full((m, n), 3.0, FP8)
    sfd = _empty_sfd(m, n)
    kwargs = dict(d=d, epilogue=FP8Quantization(sfd))
    kwargs.update(overrides)
    before_d = [x.copy() for x in (d, sfd, kwargs["d"])]
    if kind == "fp8":
        a, b, _ = _fp8_inputs(rng, m, n, k)
        call = deep_gemm.fp8_gemm_nt
    else:
        a, b = (rng.standard_normal((x, k)).astype(BF16) for x in (m, n))
        call = deep_gemm.bf16_gemm_nt
    with pytest.raises(exc, match=text):
        call(a, b, **kwargs)
    for x, before in zip((d, sfd, kwargs["d"]), before_d, strict=True):
        np.testing.assert_array_equal(_bytes(x), _bytes(before), err_msg=name)


def test_n_not_a_multiple_of_64_is_refused(rng):
    m, n, k = 16, 96, 64
    a, b = (rng.standard_normal((x, k)).astype(BF16) for x in (m, n))
    d = np.zeros((m, n), FP8)
    with pytest.raises(ValueError, match="N % 64 == 0"):
        deep_gemm.bf16_gemm_nt(a, b, d, epilogue=FP8Quantization(np.zeros((1, m), np.int16).T))
    assert not _bytes(d).any()
