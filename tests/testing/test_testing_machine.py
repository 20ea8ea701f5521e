"""The machine description and the FMA-peak kernel: the kernel really runs n_iters steps of its independent FMA
chains (checked against a float32 simulation, so the flops it is credited with are done), arguments are checked,
and the description names the CPU, the ISA and the BLAS (no timing asserted)."""

from __future__ import annotations

import numpy as np
import pytest

from deep_gemm.testing import machine


def _simulate(n_iters: int, x: float, lanes: int) -> np.float32:
    accs = [np.float32(1.0 + 0.01 * i) for i in range(machine.NUM_ACCUMULATORS)]
    for _ in range(n_iters):
        # x = 0.5: the product is exact, so the fused and the unfused step round the same way
        accs = [np.float32(a * np.float32(x) + np.float32(1e-7)) for a in accs]
    total = accs[0]
    for a in accs[1:]:
        total = np.float32(total + a)
    out = total
    for _ in range(1, lanes):
        out = np.float32(out + total)
    return out


@pytest.mark.parametrize("n_iters", [0, 1, 7])
def test_fma_kernel_runs_every_step(n_iters):
    fn, lanes = machine._build_kernel()
    assert lanes * 32 in (128, 256, 512)
    assert fn(np.intp(n_iters), np.float32(0.5)) == _simulate(n_iters, 0.5, lanes)


def test_measure_fma_peak_shape_and_arguments():
    peak = machine.measure_fma_peak(threads=1, seconds=0.01, repeats=1)
    assert peak.threads == 1 and peak.gflops > 0 and peak.gflops == peak.gflops_one_thread
    assert peak.vector_bits == 32 * machine._build_kernel()[1]
    assert peak.fraction(peak.gflops / 2) == 0.5
    assert peak.gflops_per_cpu_second > 0
    for kwargs, match in ((dict(threads=0), "threads=0"), (dict(seconds=0), "seconds=0"),
                          (dict(repeats=0), "repeats=0"), (dict(threads=True), "threads=True")):
        with pytest.raises(ValueError, match=match):
            machine.measure_fma_peak(**kwargs)


def test_describe_machine_names_cpu_isa_and_blas():
    text = machine.describe_machine()
    assert machine.cpu_model() in text
    for feature in ("avx2", "fma", "avx512f"):
        assert feature in text
    assert "BLAS" in text and "threads" in text
    assert set(machine.isa_features()) == set(machine.ISA_FEATURES)
    assert machine.blas_info() and all("threads" in b for b in machine.blas_info())


def test_amx_kernel_runs_every_step_and_peak_arguments():
    # The AMX loop adds 32 * AMX_STEPS (A = B = 1) to C per iteration: the flops it is credited with are done.
    from deep_gemm.device import cube

    fn = machine._build_amx_kernel()
    if not cube.AMX_SUPPORTED:
        assert fn is None and machine.measure_amx_peak(threads=1, seconds=0.01, repeats=1) is None
        return
    for n_iters in (0, 1, 7):
        assert fn(np.intp(n_iters), np.float32(1.0)) == 32 * machine.AMX_STEPS * n_iters
    peak = machine.measure_amx_peak(threads=1, seconds=0.01, repeats=1)
    assert peak.threads == 1 and peak.gflops > 0 and peak.gflops == peak.gflops_one_thread
    for kwargs, match in ((dict(threads=0), "threads=0"), (dict(seconds=0), "seconds=0"),
                          (dict(repeats=0), "repeats=0")):
        with pytest.raises(ValueError, match=match):
            machine.measure_amx_peak(**kwargs)


def test_dpbf16_kernel_runs_every_pair_and_peak_arguments():
    # The AVX512-BF16 loop adds 2 * DPBF16_PAIRS (A = B = 1) to C per iteration: the flops it is credited with are
    # done.
    from deep_gemm.device import cube

    fn = machine._build_dpbf16_kernel()
    if not cube.DPBF16_SUPPORTED:
        assert fn is None and machine.measure_dpbf16_peak(threads=1, seconds=0.01, repeats=1) is None
        return
    for n_iters in (0, 1, 7):
        assert fn(np.intp(n_iters), np.float32(1.0)) == 2 * machine.DPBF16_PAIRS * n_iters
    peak = machine.measure_dpbf16_peak(threads=1, seconds=0.01, repeats=1)
    assert peak.threads == 1 and peak.gflops > 0 and peak.gflops == peak.gflops_one_thread
    assert peak.vector_bits == 512
    for kwargs, match in ((dict(threads=0), "threads=0"), (dict(seconds=0), "seconds=0"),
                          (dict(repeats=0), "repeats=0")):
        with pytest.raises(ValueError, match=match):
            machine.measure_dpbf16_peak(**kwargs)


def test_machine_line_says_whether_amx_is_present_and_who_shares_it():
    threads = machine.smt_threads_per_core()
    assert isinstance(threads, int) and threads >= 1
    amx = machine.describe_amx()
    assert amx.startswith("AMX-BF16 present" if machine.amx_present() else "AMX-BF16 absent")
    if machine.amx_present():
        assert f"{threads} hardware thread" in amx
    text = machine.describe_machine()
    assert amx in text and f"{threads} thread(s) per core" in text
    assert machine.amx_present() == machine.isa_features()["amx-bf16"]


def test_tile_unit_sharing_from_the_one_and_all_thread_figures():
    # two threads, no faster than one: they share one unit; twice as fast: one unit each
    assert machine.tile_unit_sharing(machine.FmaPeak(100.0, 100.0, 2, 0)) == 2.0
    assert machine.tile_unit_sharing(machine.FmaPeak(200.0, 100.0, 2, 0)) == 1.0
    assert machine.tile_unit_sharing(machine.FmaPeak(150.0, 100.0, 3, 0)) == 2.0
