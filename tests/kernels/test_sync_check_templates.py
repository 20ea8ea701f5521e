"""Every shipped GEMM template passes the synchronisation checker (DG_SYNC_CHECK=1): the FP8 template (MX scale
ring, cube path, also with the K-MAD loop outermost; stream path with the resident A panel), the BF16 template, the
mixed ReLU example and the FP8-output epilogue (cross-core flags). A checked kernel raises SyncCheckError on any
protocol error, so a clean run with the right numbers is the pass. The examples of the JIT are checked in
tests/jit/test_sync_check.py."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from kernel_data import as_float, operand, output
from test_mixed import run_mixed_relu

from deep_gemm import envs, runtime
from deep_gemm.epilogue import FP8Quantization
from deep_gemm.kernels.bf16_gemm import launch_bf16_gemm
from deep_gemm.kernels.fp8_gemm import launch_fp8_gemm
from deep_gemm.testing import calc_diff

# name -> (a_dtype, b_dtype, m, n, k, major_a, major_b, out_dtype)
CHECKED = {
    "fp8_cube": ("fp8", "fp8", 129, 97, 200, "k", "k", "bf16"),
    # 2 x 2 MAD tiles of 2 K steps each on 2 L0 stages: the K-MAD loop runs outermost (K_MAD_OUTER)
    "fp8_cube_k_mad_outer": ("fp8", "fp8", 160, 512, 1024, "k", "k", "bf16"),
    "fp8_fp4_stream_resident_a": ("fp8", "fp4", 13, 232, 136, "k", "mn", "fp32"),
    "bf16_cube": ("bf16", "bf16", 130, 33, 100, "k", "mn", "fp32"),
}


@pytest.fixture
def sync_check(monkeypatch):
    monkeypatch.setenv(envs.DG_SYNC_CHECK.name, "1")


@pytest.mark.parametrize("name", sorted(CHECKED))
def test_gemm_templates_pass_the_checker(sync_check, rng, name):
    a_dtype, b_dtype, m, n, k, major_a, major_b, out_dtype = CHECKED[name]
    a, b = operand(rng, a_dtype, m, k, major_a), operand(rng, b_dtype, n, k, major_b)
    d, _ = output(rng, m, n, out_dtype, False)
    with runtime.runtime_scope(num_ai_cores=7):
        if a_dtype == "bf16":
            launch_bf16_gemm(a.storage, major_a, b.storage, major_b, d, m, n, k, with_accumulation=False, alpha=1.0,
                             compiled_dims="nk")
        else:
            launch_fp8_gemm(a.storage, major_a, a_dtype, a.sf, b.storage, major_b, b_dtype, b.sf, d, m, n, k,
                            with_accumulation=False, alpha=1.0, compiled_dims="nk")
    tol = {"bf16": 1e-5, "fp8": 1e-3}[a_dtype] if b_dtype != "fp4" else 1e-2
    assert calc_diff(as_float(d), a.values @ b.values.T) < tol


def test_mixed_relu_passes_the_checker(sync_check, rng):
    d, a, b, _ = run_mixed_relu(rng, 100, 96, 80, cores=3)
    assert calc_diff(d.astype(np.float64), np.maximum(a.values @ b.values.T, 0)) < 1e-5


def test_fp8_output_epilogue_passes_the_checker(sync_check, rng):
    import deep_gemm

    m, n, k = 40, 128, 64
    a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((n, k)).astype(ml_dtypes.bfloat16)
    d = np.zeros((m, n), ml_dtypes.float8_e4m3fn)
    sfd = np.zeros((n // 64, m), np.int16).T
    with runtime.runtime_scope(num_ai_cores=3):
        deep_gemm.bf16_gemm_nt(a, b, d, epilogue=FP8Quantization(sfd))
    scales = (np.ascontiguousarray(sfd).view(np.uint8).reshape(m, -1).astype(np.uint32) << 23).view(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    assert calc_diff(d.astype(np.float64) * np.repeat(scales, 32, axis=1), ref) < 2e-3
