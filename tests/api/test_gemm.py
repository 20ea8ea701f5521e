"""The public dense GEMMs end to end: correctness against a float64 numpy reference, layouts, recipes, core counts,
determinism, early returns, and every kind of bad input leaving ``d`` bit-for-bit unchanged.

Shapes are small but cover M = 1, M not a multiple of 16, K not a multiple of 64, N odd, both majors.
Kernels compile once per session (tests/conftest.py) and are shared, so shapes are reused across tests.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import deep_gemm
from deep_gemm.testing import (
    bf16_operand,
    calc_diff,
    dequantize_fp4,
    dequantize_fp8,
    fp4_operand,
    fp8_operand,
    reference_gemm,
)
from deep_gemm.utils import per_block_cast_to_fp8, per_token_cast_to_fp8, transform_sf_into_required_layout

BF16 = ml_dtypes.bfloat16
TOL = {"bf16": 1e-5, ("fp8", "fp8"): 1e-3, ("fp8", "fp4"): 1e-2, ("fp4", "fp4"): 2e-2}


def _operand(rng, kind, mn, k, major):
    if kind == "fp8":
        x, sf = fp8_operand(rng, mn, k, major)
        return (x, sf), dequantize_fp8(x, sf)
    x, sf = fp4_operand(rng, mn, k, major)
    return (x, sf), dequantize_fp4(x, sf, packed_axis=-1 if major == "k" else 0)


def _garbage(rng, shape, dtype):
    # NOTES: like DeepGEMM-Ascend's tests, d starts as random garbage so an unwritten element cannot pass.
    return rng.standard_normal(shape).astype(dtype)


# Correctness: FP8 / FP4 (nt form, both majors, accumulation and alpha)
FP_CASES = [
    # (a kind, b kind, m, n, k, major_a, major_b)
    ("fp8", "fp8", 1, 64, 256, "k", "k"),
    ("fp8", "fp8", 17, 72, 96, "k", "k"),
    ("fp8", "fp8", 130, 40, 320, "k", "k"),
    ("fp8", "fp8", 33, 48, 160, "mn", "mn"),
    ("fp8", "fp8", 20, 56, 128, "k", "mn"),
    ("fp4", "fp4", 18, 48, 192, "k", "k"),
    ("fp4", "fp4", 32, 64, 128, "mn", "k"),
    ("fp8", "fp4", 9, 80, 256, "k", "k"),
]


@pytest.mark.parametrize("case", FP_CASES, ids=lambda c: "{}x{}-{}x{}x{}-{}{}".format(*c))
def test_fp8_fp4_gemm_nt_matches_reference(rng, case):
    a_kind, b_kind, m, n, k, major_a, major_b = case
    a, a_ref = _operand(rng, a_kind, m, k, major_a)
    b, b_ref = _operand(rng, b_kind, n, k, major_b)
    d = _garbage(rng, (m, n), BF16)
    config = deep_gemm.fp8_fp4_gemm_nt(a, b, d)
    assert config is not None and config.block_m > 0
    ref = reference_gemm(a_ref, b_ref)
    assert calc_diff(d, ref) < TOL[(a_kind, b_kind)]


@pytest.mark.parametrize("out_dtype", [np.float32, BF16])
def test_fp8_gemm_accumulate_and_alpha(rng, out_dtype):
    m, n, k = 17, 72, 96
    a, a_ref = _operand(rng, "fp8", m, k, "k")
    b, b_ref = _operand(rng, "fp8", n, k, "k")
    c = (rng.standard_normal((m, n)) * 8).astype(out_dtype)
    c_before = c.copy()
    d = _garbage(rng, (m, n), out_dtype)
    deep_gemm.fp8_gemm_nt(a, b, d, c=c, alpha=-0.75)
    assert np.array_equal(c.view(np.uint8), c_before.view(np.uint8)), "c must not be modified"
    assert calc_diff(d, reference_gemm(a_ref, b_ref, c=c, alpha=-0.75)) < 1e-3
    # In place: c is d
    d2 = c.copy()
    deep_gemm.fp8_gemm_nt(a, b, d2, c=d2, alpha=-0.75)
    assert np.array_equal(d2.view(np.uint8), d.view(np.uint8))


def test_fp8_gemm_matches_aclnn_reference_bitwise_close(rng):
    m, n, k = 130, 40, 320
    a, _ = _operand(rng, "fp8", m, k, "k")
    b, _ = _operand(rng, "fp8", n, k, "k")
    d = np.zeros((m, n), np.float32)
    d_ref = np.zeros((m, n), np.float32)
    deep_gemm.fp8_gemm_nt(a, b, d)
    deep_gemm.aclnn_fp8_fp4_gemm_nt(a, b, d_ref)
    # NOTES: fp32 accumulation of exactly representable products; only summation order differs.
    assert calc_diff(d, d_ref) < 1e-9


@pytest.mark.parametrize("layout", ["nn", "tn", "tt"])
def test_fp8_layout_wrappers_equal_nt(rng, layout):
    m, n, k = 17, 72, 96
    (a, sfa), _ = _operand(rng, "fp8", m, k, "k")
    (b, sfb), _ = _operand(rng, "fp8", n, k, "k")
    d_nt = np.zeros((m, n), np.float32)
    deep_gemm.fp8_gemm_nt((a, sfa), (b, sfb), d_nt, compiled_dims="nk")
    d = np.zeros((m, n), np.float32)
    a_arg = (a, sfa) if layout == "nn" else (a.T, sfa.T)
    b_arg = (b, sfb) if layout == "tt" else (b.T, sfb.T)
    getattr(deep_gemm, f"fp8_gemm_{layout}")(a_arg, b_arg, d, compiled_dims="nk")
    assert np.array_equal(d, d_nt)


# Correctness: BF16
@pytest.mark.parametrize(
    "m,n,k,major_a,major_b", [(1, 64, 256, "k", "k"), (17, 72, 96, "k", "k"), (33, 48, 160, "mn", "mn")]
)
def test_bf16_gemm_nt_matches_reference(rng, m, n, k, major_a, major_b):
    a = bf16_operand(rng, m, k, major_a)
    b = bf16_operand(rng, n, k, major_b)
    d = _garbage(rng, (m, n), np.float32)
    deep_gemm.bf16_gemm_nt(a, b, d)
    assert calc_diff(d, reference_gemm(a, b)) < 1e-5


@pytest.mark.parametrize("layout", ["nn", "tn", "tt"])
def test_bf16_layout_wrappers(rng, layout):
    m, n, k = 17, 72, 96
    a = bf16_operand(rng, m, k, "k")
    b = bf16_operand(rng, n, k, "k")
    c = rng.standard_normal((m, n)).astype(BF16)
    d = _garbage(rng, (m, n), BF16)
    a_arg = a if layout == "nn" else a.T
    b_arg = b if layout == "tt" else b.T
    getattr(deep_gemm, f"bf16_gemm_{layout}")(a_arg, b_arg, d, c=c, compiled_dims="nk", alpha=0.5)
    assert calc_diff(d, reference_gemm(a, b, c=c, alpha=0.5)) < 1e-5


# Recipes and scale-factor forms
def test_cuda_recipes_with_fp32_scales(rng):
    m, n, k = 17, 72, 256
    x = rng.standard_normal((m, k), dtype=np.float32)
    y = rng.standard_normal((n, k), dtype=np.float32)
    a, sfa = per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=128)
    b, sfb = per_block_cast_to_fp8(y, use_ue8m0=True, gran_k=128)
    ref = reference_gemm(dequantize_fp8(a, sfa, 1, 128), dequantize_fp8(b, sfb, 128, 128))
    d = np.zeros((m, n), np.float32)
    deep_gemm.fp8_gemm_nt((a, sfa), (b, sfb), d, recipe=(1, 128, 128))
    assert calc_diff(d, ref) < 1e-6
    b1, sfb1 = per_token_cast_to_fp8(y, use_ue8m0=True, gran_k=128)
    d1 = np.zeros((m, n), np.float32)
    deep_gemm.fp8_gemm_nt((a, sfa), (b1, sfb1), d1, recipe_a=(1, 128), recipe_b=(1, 128))
    assert calc_diff(d1, reference_gemm(dequantize_fp8(a, sfa, 1, 128), dequantize_fp8(b1, sfb1, 1, 128))) < 1e-6


def test_int16_scales_in_required_layout(rng):
    m, n, k = 17, 72, 96
    (a, sfa), a_ref = _operand(rng, "fp8", m, k, "k")
    (b, sfb), b_ref = _operand(rng, "fp8", n, k, "k")
    sfa16 = transform_sf_into_required_layout(sfa, m, k, (1, 1, 32), is_sfa=True)
    sfb16 = transform_sf_into_required_layout(sfb, n, k, (1, 1, 32), is_sfa=False)
    d16 = np.zeros((m, n), np.float32)
    d32 = np.zeros((m, n), np.float32)
    deep_gemm.fp8_gemm_nt((a, sfa16), (b, sfb16), d16)
    deep_gemm.fp8_gemm_nt((a, sfa), (b, sfb), d32)
    assert np.array_equal(d16, d32)


# Schedule: core count, determinism, strides
def test_core_count_changes_kernel_not_result(rng):
    m, n, k = 130, 40, 320
    a, _ = _operand(rng, "fp8", m, k, "k")
    b, _ = _operand(rng, "fp8", n, k, "k")
    results = []
    for cores in (1, 7, 32):
        with deep_gemm.runtime_scope(num_ai_cores=cores):
            d = np.zeros((m, n), BF16)
            config = deep_gemm.fp8_gemm_nt(a, b, d)
            assert config.num_ai_cores == cores
            results.append(d.view(np.uint16).copy())
    assert all(np.array_equal(results[0], r) for r in results[1:])


@pytest.mark.parametrize("kind", ["fp8", "bf16"])
def test_every_cube_unit_agrees(rng, monkeypatch, kind):
    # The Cube's engines: bf16 L0 on the AMX tile unit (the default where the host has it), bf16 L0 on the
    # AVX512-BF16 dot products (the default where AMX is absent or DG_CUBE_AMX=0) and fp32 L0 on the FMA
    # micro-kernel (both switches 0, and every host without either). Each kernel states its unit; all meet the
    # reference; the switches take effect between calls of one process.
    from deep_gemm.jit import amx, cpu_features
    from deep_gemm.kernels.bf16_gemm import BF16_GEMM
    from deep_gemm.kernels.fp8_gemm import FP8_GEMM

    m, n, k = 65, 48, 320
    if kind == "fp8":
        a, a_ref = _operand(rng, "fp8", m, k, "k")
        b, b_ref = _operand(rng, "fp8", n, k, "k")
        run, family = deep_gemm.fp8_gemm_nt, FP8_GEMM
    else:
        a, b = bf16_operand(rng, m, k), bf16_operand(rng, n, k)
        a_ref, b_ref = a, b
        run, family = deep_gemm.bf16_gemm_nt, BF16_GEMM
    ref = reference_gemm(a_ref, b_ref)
    dp = "dpbf16" if cpu_features.dpbf16_supported() else ""
    expected = []
    for flag_amx, flag_dp, unit in (("1", "1", "amx" if amx.supported() else dp), ("0", "1", dp), ("0", "0", "")):
        monkeypatch.setenv("DG_CUBE_AMX", flag_amx)
        monkeypatch.setenv("DG_CUBE_DPBF16", flag_dp)
        d = _garbage(rng, (m, n), np.float32)
        run(a, b, d)
        assert calc_diff(d, ref) < (TOL[("fp8", "fp8")] if kind == "fp8" else TOL["bf16"]), (flag_amx, flag_dp)
        expected.append(unit)
    l0_types = {p.constants["CUBE_L0_BF16"] for p in family._prepared.values()
                if (p.desc.m, p.desc.n, p.desc.k) == (m, n, k)}
    assert l0_types == set(expected)


def test_deterministic_across_calls_and_threads(rng):
    import numba

    m, n, k = 130, 40, 320
    a, _ = _operand(rng, "fp8", m, k, "k")
    b, _ = _operand(rng, "fp8", n, k, "k")
    outs = []
    saved = numba.get_num_threads()
    try:
        for threads in (saved, saved, 1):
            numba.set_num_threads(threads)
            d = np.zeros((m, n), np.float32)
            deep_gemm.fp8_gemm_nt(a, b, d)
            outs.append(d)
    finally:
        numba.set_num_threads(saved)
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


def test_non_tight_outer_strides(rng):
    m, n, k = 17, 72, 96
    (a, sfa), a_ref = _operand(rng, "fp8", m, k, "k")
    (b, sfb), b_ref = _operand(rng, "fp8", n, k, "k")
    a_wide = np.zeros((m, k + 40), a.dtype)
    a_wide[:, :k] = a
    b_wide = np.zeros((n, k + 8), b.dtype)
    b_wide[:, 3 : 3 + k] = b
    d_wide = np.full((m, n + 24), 7.0, np.float32)
    deep_gemm.fp8_gemm_nt((a_wide[:, :k], sfa), (b_wide[:, 3 : 3 + k], sfb), d_wide[:, :n])
    assert calc_diff(d_wide[:, :n], reference_gemm(a_ref, b_ref)) < 1e-3
    assert np.all(d_wide[:, n:] == 7.0), "columns beyond n must not be written"


# Early returns and dry run
def test_early_returns(rng):
    (a, sfa), _ = _operand(rng, "fp8", 0, 64, "k")
    (b, sfb), _ = _operand(rng, "fp8", 8, 64, "k")
    d = np.zeros((0, 8), np.float32)
    assert deep_gemm.fp8_gemm_nt((a, sfa), (b, sfb), d) is None
    # K == 0: D = C, or zeros
    a0 = np.zeros((4, 0), ml_dtypes.float8_e4m3fn)
    b0 = np.zeros((8, 0), ml_dtypes.float8_e4m3fn)
    sf0a, sf0b = np.zeros((4, 0), np.float32), np.zeros((8, 0), np.float32)
    d = np.full((4, 8), 3.0, np.float32)
    deep_gemm.fp8_gemm_nt((a0, sf0a), (b0, sf0b), d)
    assert np.all(d == 0)
    c = np.full((4, 8), 2.5, np.float32)
    deep_gemm.fp8_gemm_nt((a0, sf0a), (b0, sf0b), d, c=c)
    assert np.all(d == 2.5)
    d16 = np.full((4, 8), 1.0, BF16)
    deep_gemm.bf16_gemm_nt(np.zeros((4, 0), BF16), np.zeros((8, 0), BF16), d16)
    assert np.all(d16.astype(np.float32) == 0)


def test_dry_run_compiles_without_writing(rng):
    m, n, k = 17, 72, 96
    a, _ = _operand(rng, "fp8", m, k, "k")
    b, _ = _operand(rng, "fp8", n, k, "k")
    c = np.ones((m, n), np.float32)
    d = np.full((m, n), 5.0, np.float32)
    with deep_gemm.dry_run():
        assert deep_gemm.fp8_gemm_nt(a, b, d, c=c) is not None
    assert np.all(d == 5.0)


# Bad input: a clear error, and d untouched
def _bad_cases(rng):
    m, n, k = 17, 72, 96
    (a, sfa), _ = _operand(rng, "fp8", m, k, "k")
    (b, sfb), _ = _operand(rng, "fp8", n, k, "k")
    (a4, sfa4), _ = _operand(rng, "fp4", m, 128, "k")
    (b8, sfb8), _ = _operand(rng, "fp8", n, 128, "k")
    sf_three = sfa.copy()
    sf_three[2, 1] = 3.0
    sf_nan = sfa.copy()
    sf_nan[0, 0] = np.nan
    sf_neg = sfb.copy()
    sf_neg[5, 2] = -2.0**-8
    a_gappy = np.zeros((m, 2 * k), a.dtype)[:, ::2]
    ok = {"a": (a, sfa), "b": (b, sfb)}
    cases = {
        "a dtype float32": (dict(ok, a=(a.astype(np.float32), sfa)), TypeError, "a has dtype float32"),
        "b not an array": (dict(ok, b=(b.tolist(), sfb)), TypeError, "numpy.ndarray"),
        "a not a pair": (dict(ok, a=a), TypeError, "pair"),
        "K mismatch": (dict(ok, b=(b[:, :64], sfb[:, :2])), ValueError, "disagree on K"),
        "sfa wrong size": (dict(ok, a=(a, sfa[:, :2])), ValueError, "sfa"),
        "sfa not power of two": (dict(ok, a=(a, sf_three)), ValueError, "sf[2, 1]"),
        "sfa NaN": (dict(ok, a=(a, sf_nan)), ValueError, "sf[0, 0]"),
        "sfb negative": (dict(ok, b=(b, sf_neg)), ValueError, "sf[5, 2]"),
        "sfa float64": (dict(ok, a=(a, sfa.astype(np.float64))), TypeError, "sfa"),
        "fp4 x fp8": (dict(ok, a=(a4, sfa4), b=(b8, sfb8)), TypeError, "fp4 A with fp8 B"),
        "strided both axes": (dict(ok, a=(a_gappy, sfa)), ValueError, "contiguous"),
        "recipe 4-tuple": (dict(ok, recipe=(1, 1, 32, 1)), ValueError, "recipe"),
        "recipe and recipe_a": (dict(ok, recipe=(1, 1, 32), recipe_a=(1, 32), recipe_b=(1, 32)), ValueError,
                                "either recipe"),
        "recipe_a alone": (dict(ok, recipe_a=(1, 32)), ValueError, "together"),
        "gran_k 64": (dict(ok, recipe=(1, 1, 64)), ValueError, "gran_k"),
        "compiled_dims letter": (dict(ok, compiled_dims="nx"), ValueError, "compiled_dims"),
        "compiled_dims repeat": (dict(ok, compiled_dims="nn"), ValueError, "compiled_dims"),
        "alpha nan": (dict(ok, alpha=float("nan")), ValueError, "alpha"),
        "alpha str": (dict(ok, alpha="2"), TypeError, "alpha"),
        "fp32 sf with disable_ue8m0_cast": (dict(ok, disable_ue8m0_cast=True), ValueError, "sfa"),
        "c dtype": (dict(ok, c=np.zeros((m, n), BF16)), TypeError, "c must have d's dtype"),
        "c shape": (dict(ok, c=np.zeros((m, n + 1), np.float32)), ValueError, "c must have d's shape"),
    }
    return m, n, ok, cases


def test_bad_input_raises_and_leaves_d_unchanged(rng):
    m, n, ok, cases = _bad_cases(rng)
    for label, (kwargs, exc, text) in cases.items():
        d = _garbage(rng, (m, n), np.float32)
        before = d.copy()
        kwargs = dict(kwargs)
        with pytest.raises(exc) as info:
            deep_gemm.fp8_gemm_nt(kwargs.pop("a"), kwargs.pop("b"), d, **kwargs)
        assert text in str(info.value), f"{label}: {info.value}"
        assert np.array_equal(d.view(np.uint8), before.view(np.uint8)), f"{label}: d was written"


def test_bad_output_and_aliasing(rng):
    m, n, k = 17, 72, 96
    (a, sfa), _ = _operand(rng, "fp8", m, k, "k")
    (b, sfb), _ = _operand(rng, "fp8", n, k, "k")
    with pytest.raises(TypeError, match="d has dtype float16"):
        deep_gemm.fp8_gemm_nt((a, sfa), (b, sfb), np.zeros((m, n), np.float16))
    with pytest.raises(ValueError, match="d must have shape"):
        deep_gemm.fp8_gemm_nt((a, sfa), (b, sfb), np.zeros((n, m), np.float32))
    with pytest.raises(ValueError, match="unit stride along N"):
        deep_gemm.fp8_gemm_nt((a, sfa), (b, sfb), np.zeros((n, m), np.float32).T)
    read_only = np.zeros((m, n), np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        deep_gemm.fp8_gemm_nt((a, sfa), (b, sfb), read_only)
    # d aliasing an input
    x = rng.standard_normal((m, k)).astype(BF16)
    y = rng.standard_normal((m, k)).astype(BF16)
    buf = np.zeros((m, m), BF16)
    with pytest.raises(ValueError, match="shares memory with a"):
        deep_gemm.bf16_gemm_nt(buf, y[:, :m], buf)
    with pytest.raises(ValueError, match="disagree on K"):
        deep_gemm.bf16_gemm_nt(x, y[:, :64], np.zeros((m, m), BF16))
    with pytest.raises(TypeError, match="a has dtype float32"):
        deep_gemm.bf16_gemm_nt(x.astype(np.float32), y, np.zeros((m, m), BF16))


def test_aliases_are_the_same_functions():
    assert deep_gemm.fp8_gemm_nt is deep_gemm.fp8_fp4_gemm_nt
    assert deep_gemm.fp8_gemm_tt is deep_gemm.fp8_fp4_gemm_tt
    assert deep_gemm.cublaslt_gemm_nt is deep_gemm.aclnn_bf16_gemm_nt
