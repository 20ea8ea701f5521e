"""The GEMM launchers (deep_gemm.kernels) end to end against float64 numpy references: FP8xFP8, FP4xFP4, FP8xFP4
and BF16; bf16 and fp32 out; accumulation and alpha; K-/MN-major operands; non-tight rows; ragged M/N/K; the stream
and cube paths; determinism over calls, AI-core counts and numba threads.

Kernels are shared: every case below is one of a few problems (PROBLEMS), precompiled in parallel worker processes
first (deep_gemm.testing.par_compile), so each compiles once per session.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
import pytest
from kernel_data import as_float, operand, output

from deep_gemm import runtime
from deep_gemm.device import BufferCapacityError, keeps_a_resident
from deep_gemm.heuristics import get_arch
from deep_gemm.heuristics.config import GemmConfig, GemmDesc
from deep_gemm.kernels.bf16_gemm import launch_bf16_gemm, precompile_bf16_gemm
from deep_gemm.kernels.fp8_gemm import launch_fp8_gemm, precompile_fp8_gemm
from deep_gemm.testing.par_compile import par_compile

TOLERANCE = {("bf16", "bf16"): 1e-5, ("fp8", "fp8"): 1e-3, ("fp8", "fp4"): 1e-2, ("fp4", "fp4"): 2e-2}
CORES = 7  # default core count of this file (the schedule wraps: several tiles per core)

# name -> (a_dtype, b_dtype, m, n, k, major_a, major_b, out_dtype, with_accumulation, compiled_dims)
PROBLEMS = {
    # cube path (M > 64): ragged M, odd N, K not a multiple of 64, all K-major, bf16 out
    "fp8_cube": ("fp8", "fp8", 129, 97, 200, "k", "k", "bf16", False, "nk"),
    # both operands MN-major, fp32 out, accumulate with alpha, runtime K and N (the tn/tt default dims)
    "fp8_mn_acc": ("fp8", "fp8", 80, 48, 320, "mn", "mn", "fp32", True, "mn"),
    # stream path (small M): M = 1, bf16 out
    "fp8_m1": ("fp8", "fp8", 1, 72, 256, "k", "k", "bf16", False, "nk"),
    "fp4_cube": ("fp4", "fp4", 96, 64, 192, "k", "k", "bf16", False, "nk"),
    # NOTES: N spans more 32-wide blocks than CORES, so a core reuses the A panel and the explicit stream configs
    # below keep A resident (the rule of heuristics.keeps_a_resident)
    "fp8_fp4_stream": ("fp8", "fp4", 13, 232, 136, "k", "mn", "fp32", False, "nk"),
    "bf16_cube": ("bf16", "bf16", 130, 33, 100, "k", "k", "bf16", False, "nk"),
    "bf16_stream_acc": ("bf16", "bf16", 40, 250, 64, "mn", "k", "fp32", True, "nk"),
}


def _precompile(name: str):
    a_dtype, b_dtype, m, n, k, major_a, major_b, out_dtype, acc, dims = PROBLEMS[name]
    if a_dtype == "bf16":
        return functools.partial(precompile_bf16_gemm, m, n, k, out_dtype, major_a, major_b, acc, dims)
    return functools.partial(precompile_fp8_gemm, m, n, k, a_dtype, b_dtype, out_dtype, major_a, major_b, acc, dims)


@pytest.fixture(scope="module", autouse=True)
def precompiled():
    """Compile every problem's kernel (and the core-count variants) in worker processes, into the session cache."""
    jobs = []
    for cores in (CORES, 1, 32):
        with runtime.runtime_scope(num_ai_cores=cores):
            names = PROBLEMS if cores == CORES else ["fp8_cube"]
            jobs.append(par_compile([_precompile(name) for name in names], max_workers=2, progress=False))
    yield jobs


def _run(name: str, rng: np.random.Generator, alpha: float = 1.0, config: GemmConfig | None = None):
    """Launch problem ``name`` on fresh data; returns (d storage, float64 reference, config, launch closure)."""
    a_dtype, b_dtype, m, n, k, major_a, major_b, out_dtype, acc, dims = PROBLEMS[name]
    a = operand(rng, a_dtype, m, k, major_a)
    b = operand(rng, b_dtype, n, k, major_b)
    d, c = output(rng, m, n, out_dtype, acc)
    d_init = d.copy()
    ref = alpha * (a.values @ b.values.T) + (c if acc else 0.0)

    def launch(dst: np.ndarray) -> GemmConfig:
        if a_dtype == "bf16":
            return launch_bf16_gemm(a.storage, major_a, b.storage, major_b, dst, m, n, k, with_accumulation=acc,
                                    alpha=alpha, compiled_dims=dims, config=config)
        return launch_fp8_gemm(a.storage, major_a, a_dtype, a.sf, b.storage, major_b, b_dtype, b.sf, dst, m, n, k,
                               with_accumulation=acc, alpha=alpha, compiled_dims=dims, config=config)

    cfg = launch(d)
    return d, d_init, ref, cfg, launch


def _calc_diff(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x.astype(np.float64), y.astype(np.float64)
    return 1.0 - 2.0 * float((x * y).sum()) / float((x * x + y * y).sum())


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_matches_reference(name, rng):
    a_dtype, b_dtype, m, n, k, *_ = PROBLEMS[name]
    alpha = 0.75 if PROBLEMS[name][8] else 1.0
    with runtime.runtime_scope(num_ai_cores=CORES):
        d, d_init, ref, cfg, _ = _run(name, rng, alpha=alpha)
    got = as_float(d)
    assert np.isfinite(got).all(), f"{name}: unwritten or non-finite outputs"
    diff = _calc_diff(got, ref)
    assert diff < TOLERANCE[(a_dtype, b_dtype)], f"{name}: calc_diff={diff:.3g} ({cfg})"
    assert cfg.path == ("stream" if m <= 64 else "cube"), cfg


def test_padding_of_d_untouched(rng):
    with runtime.runtime_scope(num_ai_cores=CORES):
        d, _, _, _, launch = _run("fp8_cube", rng)
        storage = np.full((d.shape[0], d.shape[1] + 5), 0x1234, np.uint16)
        launch(storage[:, : d.shape[1]])
    np.testing.assert_array_equal(storage[:, d.shape[1]:], 0x1234)


@pytest.mark.parametrize("name", ["fp8_cube", "fp8_mn_acc"])
def test_same_call_twice_bitwise(name, rng):
    with runtime.runtime_scope(num_ai_cores=CORES):
        d, d_init, _, _, launch = _run(name, rng)
        again = d_init.copy()  # the same C when accumulating
        launch(again)
    np.testing.assert_array_equal(again, d)


def test_core_counts_bitwise_equal(rng):
    outs = []
    state = rng.bit_generator.state
    for cores in (1, CORES, 32):
        rng.bit_generator.state = state
        with runtime.runtime_scope(num_ai_cores=cores):
            d, *_ = _run("fp8_cube", rng)
        outs.append(d.copy())
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


def test_numba_threads_bitwise_equal(rng):
    state = rng.bit_generator.state
    saved = numba.get_num_threads()
    outs = []
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            rng.bit_generator.state = state
            with runtime.runtime_scope(num_ai_cores=CORES):
                d, *_ = _run("fp8_fp4_stream", rng)
            outs.append(d.copy())
    finally:
        numba.set_num_threads(saved)
    np.testing.assert_array_equal(outs[0], outs[1])


def test_dry_run_builds_without_touching_d(rng):
    with runtime.runtime_scope(num_ai_cores=CORES):
        a_dtype, b_dtype, m, n, k, major_a, major_b, out_dtype, acc, dims = PROBLEMS["bf16_cube"]
        a = operand(rng, a_dtype, m, k, major_a)
        b = operand(rng, b_dtype, n, k, major_b)
        d = np.full((m, n), 0x4242, np.uint16)
        with runtime.dry_run():
            cfg = launch_bf16_gemm(a.storage, major_a, b.storage, major_b, d, m, n, k, with_accumulation=acc,
                                   alpha=1.0, compiled_dims=dims)
    assert isinstance(cfg, GemmConfig)
    assert (d == 0x4242).all()


# Hand-picked configs that walk template branches the heuristic may not pick: several MAD tiles per block (L0C
# slots > stages) with the K-MAD loop outermost (K_MAD_OUTER: 2 x 2 MAD tiles, 2 K steps, 2 L0 stages), scale chunks
# over 2 K blocks, and the resident-A stream path.
MULTI_MAD = GemmConfig(block_m=64, block_n=64, block_k=128, mad_m=32, mad_n=32, mad_k=64, num_l1_stages=3,
                       sf_k_blocks=2, num_ai_cores=CORES)
STREAM_NO_KEEP = GemmConfig(block_m=16, block_n=32, block_k=256, mad_m=16, mad_n=32, mad_k=64, num_l1_stages=2,
                            sf_k_blocks=3, num_ai_cores=CORES, path="stream")

# L0B keeps the slices of both N-MADs across the 2 M-MADs (NUM_N_MADS * NUM_K_MADS <= NUM_L0_STAGES), partial
# last blocks in M, N and K
KEEP_B = GemmConfig(block_m=64, block_n=64, block_k=128, mad_m=32, mad_n=32, mad_k=128, num_l1_stages=2,
                    num_ai_cores=CORES)

# resident A over 3 M blocks (the panel is reloaded whenever a core's M block changes), L0A kept across N-MADs
STREAM_MULTI_M = GemmConfig(block_m=16, block_n=32, block_k=64, mad_m=16, mad_n=16, mad_k=32, num_l1_stages=2,
                            num_ai_cores=CORES, path="stream")


@pytest.mark.parametrize("name,config", [("fp8_cube", MULTI_MAD), ("fp8_fp4_stream", STREAM_NO_KEEP),
                                         ("bf16_stream_acc", STREAM_MULTI_M), ("fp8_mn_acc", KEEP_B),
                                         ("bf16_cube", KEEP_B)])
def test_explicit_configs(name, config, rng):
    a_dtype, b_dtype, m, n, k, major_a, major_b, out_dtype, acc, dims = PROBLEMS[name]
    desc = GemmDesc(m=m, n=n, k=k, a_dtype=a_dtype, b_dtype=b_dtype, out_dtype=out_dtype, major_a=major_a,
                    major_b=major_b, with_accumulation=acc, num_ai_cores=CORES)
    resident = keeps_a_resident(desc, config, get_arch("950DT"), k_is_compiled="k" in dims)
    assert resident == (config is STREAM_MULTI_M or config is STREAM_NO_KEEP)
    with runtime.runtime_scope(num_ai_cores=CORES):
        d, _, ref, cfg, _ = _run(name, rng, alpha=0.5 if acc else 1.0, config=config)
    assert cfg == config
    assert _calc_diff(as_float(d), ref) < TOLERANCE[(a_dtype, b_dtype)]


def test_overflowing_config_is_refused(rng):
    too_big = GemmConfig(block_m=256, block_n=256, block_k=512, mad_m=256, mad_n=256, mad_k=256, num_l1_stages=4,
                         num_ai_cores=CORES)
    with runtime.runtime_scope(num_ai_cores=CORES), pytest.raises(BufferCapacityError, match="overflow"):
        _run("bf16_cube", rng, config=too_big)
