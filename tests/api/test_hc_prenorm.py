"""tf32_hc_prenorm_gemm (templates/tf32_hc_prenorm_gemm.asc.j2, a mixed kernel): against numpy with the same TF32
rounding (DeepGEMM's max(diff_d, diff_s) < 1e-8), split and unsplit; the HF32 rounding bit for bit on one-hot rows;
deterministic mode bitwise the same across runs, 1 and 2 threads and logical core counts; bad input refused before
any write; the cost model's estimate. Four kernels in all (the kernel-side split of deterministic mode on 2 and 5
cores and the one tuned to 5 cores, one caller split), shared by every test here."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import deep_gemm
from deep_gemm import runtime
from deep_gemm.jit import launch
from deep_gemm.testing import calc_diff
from deep_gemm.utils import round_to_tf32

M, N, K = 37, 24, 2048  # ragged M (the second AIV of the last block gets 5 rows); K = 32 chunks of 64


def _operands(rng, m=M, n=N, k=K):
    a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((n, k)).astype(np.float32)
    return a, b


def _reference(a, b, k_ranges):
    """float64 numpy of the kernel's sums over each K range, from TF32-rounded B (A's bf16 values are TF32)."""
    af, bf = a.astype(np.float64), round_to_tf32(b).astype(np.float64)
    d = np.stack([af[:, k0:k1] @ bf[:, k0:k1].T for k0, k1 in k_ranges])
    s = np.stack([(af[:, k0:k1] ** 2).sum(1) for k0, k1 in k_ranges])
    return d, s


def _run(a, b, num_splits=None, cores=5, threads=None, deterministic=True, padded=None):
    m, n = a.shape[0], b.shape[0]
    shape_d = (m, n) if num_splits is None else (num_splits, m, n)
    d = np.full(shape_d, np.nan, np.float32)
    sqr = np.full(shape_d[:-1], np.nan, np.float32)
    if padded is not None:  # views with padded rows (and splits): the padding must stay untouched
        padded["d"] = np.full(shape_d[:-1] + (n + 8,), np.nan, np.float32)
        padded["sqr"] = np.full(shape_d[:-2] + (m + 3,), np.nan, np.float32)
        d, sqr = padded["d"][..., :n], padded["sqr"][..., :m]
    saved = runtime.get_deterministic_algorithms()
    try:
        runtime.use_deterministic_algorithms(deterministic)
        with runtime.runtime_scope(num_ai_cores=cores):
            if threads is None:
                deep_gemm.tf32_hc_prenorm_gemm(a, b, d, sqr, num_splits)
            else:
                with pytest.MonkeyPatch.context() as mp:
                    mp.setattr(launch, "num_threads", lambda: threads)
                    deep_gemm.tf32_hc_prenorm_gemm(a, b, d, sqr, num_splits)
    finally:
        runtime.use_deterministic_algorithms(saved)
    return d, sqr


def test_unsplit_matches_numpy_and_is_bitwise_stable(rng):
    from deep_gemm.kernels.hc_prenorm import prepare_hc_prenorm

    a, b = _operands(rng)
    ref_d, ref_s = _reference(a, b, [(0, K)])
    outs = {}
    for cores in (5, 2):
        # the kernel's own K split: chosen for the arch's 32 cores in deterministic mode, whatever the core count
        with runtime.runtime_scope(num_ai_cores=cores):
            config = prepare_hc_prenorm(M, N, K, 0, True).config
        assert config.reduce_splits and config.num_splits > 1, config
        for threads in (1, 2):
            for run in range(2):
                outs[cores, threads, run] = _run(a, b, cores=cores, threads=threads)
    d, s = outs[5, 1, 0]
    assert calc_diff(d, ref_d[0]) < 1e-8 and calc_diff(s, ref_s[0]) < 1e-8
    np.testing.assert_allclose(d, ref_d[0], rtol=2e-5, atol=2e-5 * np.abs(ref_d).max())
    np.testing.assert_allclose(s, ref_s[0], rtol=2e-6)
    for key, (dk, sk) in outs.items():
        np.testing.assert_array_equal(dk.view(np.uint32), d.view(np.uint32), err_msg=str(key))
        np.testing.assert_array_equal(sk.view(np.uint32), s.view(np.uint32), err_msg=str(key))
    # without deterministic mode the split is tuned to the core count (5 cores: fewer splits), same tolerance
    with runtime.runtime_scope(num_ai_cores=5):
        tuned = prepare_hc_prenorm(M, N, K, 0, False).config
    assert tuned.num_splits != config.num_splits, (tuned, config)
    d_nd, s_nd = _run(a, b, cores=5, deterministic=False)
    assert calc_diff(d_nd, ref_d[0]) < 1e-8 and calc_diff(s_nd, ref_s[0]) < 1e-8


def test_caller_splits_are_the_partial_sums(rng):
    a, b = _operands(rng)
    num_splits = 3  # 10, 11 and 11 chunks: K blocks of 256 cut short at every split's end
    full = {}
    d, s = _run(a, b, num_splits=num_splits, deterministic=False, padded=full)
    assert np.isnan(full["d"][..., N:]).all() and np.isnan(full["sqr"][..., M:]).all()
    chunks = K // 64
    ranges = [(i * chunks // num_splits * 64, (i + 1) * chunks // num_splits * 64) for i in range(num_splits)]
    ref_d, ref_s = _reference(a, b, ranges)
    for i in range(num_splits):
        assert calc_diff(d[i], ref_d[i]) < 1e-8 and calc_diff(s[i], ref_s[i]) < 1e-8, i
    full_d, full_s = _reference(a, b, [(0, K)])
    assert calc_diff(d.sum(0), full_d[0]) < 1e-8 and calc_diff(s.sum(0), full_s[0]) < 1e-8
    # TF32 matters at this tolerance: the same sums from unrounded B are measurably further away
    exact = a.astype(np.float64) @ b.astype(np.float64).T
    assert np.abs(d.sum(0) - full_d[0]).max() < np.abs(exact - full_d[0]).max() / 4


def test_hf32_rounding_bit_for_bit(rng):
    """One-hot rows of A pick single elements of B: D is exactly B rounded to TF32 (ties to even), sqr_sum is 1."""
    a = np.zeros((M, K), ml_dtypes.bfloat16)
    cols = rng.choice(K, M, replace=False)
    a[np.arange(M), cols] = 1
    _, b = _operands(rng)
    bits = b.view(np.uint32)
    bits[:, cols[:8]] = (bits[:, cols[:8]] & np.uint32(0xFFFFE000)) | np.uint32(0x1000)  # exact ties, odd and even
    bits[0, cols[8]] = np.uint32(0x3FFFFFFF)  # 2 - 2^-23: the carry raises the exponent, 2.0
    d, s = _run(a, b)
    expected = round_to_tf32(b)[:, cols].T
    np.testing.assert_array_equal(d.view(np.uint32), expected.view(np.uint32))
    assert d[8, 0] == 2.0 and (d[:8] != b[:, cols[:8]].T).any()
    np.testing.assert_array_equal(s, np.ones(M, np.float32))


def test_bad_input_is_refused_before_any_write(rng):
    a, b = _operands(rng, m=8, k=256)
    d = np.full((8, N), 7.0, np.float32)
    s = np.full(8, 7.0, np.float32)
    cases = [
        (TypeError, "a must be bfloat16", dict(a=a.astype(np.float32))),
        (TypeError, "b must be float32", dict(b=b.astype(ml_dtypes.bfloat16))),
        (TypeError, "d must be float32", dict(d=d.astype(np.float64))),
        (ValueError, "k=160 must be a positive multiple of 64", dict(a=a[:, :160], b=b[:, :160])),
        (ValueError, "n=20 must be a multiple of 8", dict(b=b[:20], d=d[:, :20])),
        (ValueError, "n=136 must be a multiple of 8", dict(b=np.zeros((136, 256), np.float32),
                                                         d=np.zeros((8, 136), np.float32))),
        (ValueError, "disagree on K", dict(b=np.zeros((N, 320), np.float32))),
        (ValueError, "num_splits=5 must be in [1, k / 64 = 4]", dict(num_splits=5)),
        (ValueError, "num_splits=0 must be in", dict(num_splits=0)),
        (TypeError, "num_splits must be None or an int", dict(num_splits=True)),
        (ValueError, r"d must have shape (2, 8, 24)", dict(num_splits=2)),
        (ValueError, "sqr_sum must have shape (8,)", dict(s=np.zeros((1, 8), np.float32))),
        (ValueError, "unit-stride last dim", dict(a=np.asfortranarray(a))),
        (ValueError, "unit-stride last dim", dict(d=np.zeros((N, 8), np.float32).T)),
        (ValueError, "d shares memory with sqr_sum", dict(s=d.reshape(-1)[:8])),
        (ValueError, "d shares memory with b", dict(d=b.reshape(-1)[:8 * N].reshape(8, N))),
    ]
    for exc, message, override in cases:
        args = dict(a=a, b=b, d=d, s=s, num_splits=None) | override
        with pytest.raises(exc, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            deep_gemm.tf32_hc_prenorm_gemm(args["a"], args["b"], args["d"], args["s"], args["num_splits"])
        assert (d == 7).all() and (s == 7).all(), message
    # M == 0: nothing to do, nothing compiled
    deep_gemm.tf32_hc_prenorm_gemm(a[:0], b, d[:0], s[:0])


def test_estimate_hc_prenorm_gemm():
    est = deep_gemm.estimate_hc_prenorm_gemm(4096, 24, 28672, arch="950DT", num_ai_cores=32)
    # HBM-bound: A streams from HBM once through the AIVs (each at its share of HBM), B once per unit, D out once
    # after the splits' adds (DeepGEMM-Ascend's 16 splits x 2 cores, 16 token blocks in L0C per core)
    assert est.bound in ("aiv_mte2", "hbm") and "modelled" in str(est) and est.config.reduce_splits
    assert (est.config.num_splits, est.config.cores_per_split, est.config.num_l0c_stages) == (16, 2, 16)
    assert est.hbm_bytes == 4096 * 28672 * 2 + 24 * 28672 * 4 + 4096 * 25 * 4
    core = est.fill_us + max(est.aiv_mte2_us, est.vector_us, est.ub_to_l1_us, est.cube_us, est.mte1_us)
    assert est.time_us >= max(core, est.hbm_us, est.l2_us) + est.launch_us + est.store_us - 1e-6
    assert est.hbm_us == pytest.approx(est.hbm_bytes / 3.5e12 * 1e6)
    # decode: the kernel splits K over the cores; deterministic mode picks the same split on every core count
    dec = [deep_gemm.estimate_hc_prenorm_gemm(16, 24, 28672, deterministic=True, arch="950DT", num_ai_cores=c)
           for c in (4, 32)]
    assert dec[0].config.num_splits == dec[1].config.num_splits > 1 and dec[1].config.reduce_splits
    assert dec[1].time_us < dec[0].time_us
    user = deep_gemm.estimate_hc_prenorm_gemm(16, 24, 28672, num_splits=4, arch="950DT")
    assert user.config.num_splits == 4 and not user.config.reduce_splits
    with pytest.raises(ValueError, match="num_splits=449"):
        deep_gemm.estimate_hc_prenorm_gemm(16, 24, 28672, num_splits=449)
    with pytest.raises(ValueError, match="n=130"):
        deep_gemm.estimate_hc_prenorm_gemm(16, 130, 28672)
