"""The example templates built by the real pipeline (render -> translate -> numba), checked against Python."""

from __future__ import annotations

import math

import numpy as np
import pytest
from jit_helpers import HELPERS_CONSTS, LOOPS_CONSTS, VADD_CONSTS, vadd_args, vadd_reference

from deep_gemm.jit import CompiledKernel


def test_vadd_matches_numpy_for_ragged_sizes(vadd_kernel, rng):
    assert isinstance(vadd_kernel, CompiledKernel) and vadd_kernel.entry == "vadd"
    for n in (1, 15, 16, 17, 3 * 16 * 2 + 5):
        unused, x, y, z, n = vadd_args(n, rng)
        vadd_kernel(unused, x, y, z, n)
        np.testing.assert_array_equal(z, vadd_reference(x, y, VADD_CONSTS["SCALE"]))


def c_div(a, b):
    return int(a / b)


def c_mod(a, b):
    return int(math.fmod(a, b))


def loops_reference(ints, rows, cols, use_bias, bias):
    """What examples/loops.asc.j2 computes, written directly in Python with C semantics."""
    bias = np.float32(bias)
    out = np.zeros(rows * cols, np.float32)
    stats = np.zeros(rows * 6, np.int32)
    for r in range(rows):
        hist, skipped = [0] * 4, 0
        for c in range(cols):
            v = int(ints[r * cols + c])
            hist[(c_mod(v, 4) + 4) % 4] += 1
            if v == 0:
                out[r * cols + c] = bias
                skipped += 1
                continue
            q, m = c_div(v, 3), c_mod(v, 3)
            f = np.float32(q) + np.float32(m) * np.float32(0.5)
            if q < 0 and m != 0:
                f = np.float32(f - np.float32(1))
            elif q > 10:
                f = np.float32(f * np.float32(2))
            else:
                f = np.float32(f + (bias if use_bias else np.float32(0)))
            out[r * cols + c] = f if (v & 0x7F) > 5 else -f
        side, k, s = 0, cols - 1, 0
        while k >= 0 and s <= 3:
            if (k ^ s) % 3 != 0:
                side += (k << s) | (~k & 1)
            k, s = k - 2, s + 1
        stats[r * 6:(r + 1) * 6] = [skipped, side >> 1, *hist]
    return out, stats


def test_loops_matches_c_semantics(loops_kernel, rng):
    rows, cols = LOOPS_CONSTS["ROWS"], LOOPS_CONSTS["COLS"]
    ints = rng.integers(-40, 40, rows * cols).astype(np.int32)
    ints[::5] = 0
    out = np.full(rows * cols, np.nan, np.float32)
    stats = np.full(rows * 6, -99, np.int32)
    loops_kernel(ints, out, stats, 0.75)
    ref_out, ref_stats = loops_reference(ints, rows, cols, LOOPS_CONSTS["USE_BIAS"], 0.75)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(stats, ref_stats)


def test_helpers_matches_python(helpers_kernel, rng):
    tile = HELPERS_CONSTS["TILE"]
    n = 5 * tile + 3
    x = rng.standard_normal(n).astype(np.float32)
    y0 = (rng.standard_normal(n) * 4).astype(np.float32)
    y = y0.copy()
    tiles = np.zeros(6, np.int32)
    helpers_kernel(x, y, tiles, n, 1.25)
    expect = np.float32(1.25) * x + y0
    for t in range(6):
        if t % 2 == 1:
            expect[t * tile:(t + 1) * tile] *= -1
    np.testing.assert_array_equal(y, expect)
    sums = [sum(int(v) for v in expect[t * tile:min(n, (t + 1) * tile)]) for t in range(6)]
    assert tiles.tolist() == sums


def test_results_do_not_depend_on_the_core_count(rng):
    from jit_helpers import EXAMPLE_DEVICE

    from deep_gemm.jit import build

    unused, x, y, _, n = vadd_args(100, rng)
    outs = []
    for cores in (1, VADD_CONSTS["NUM_AI_CORES"]):
        kernel = build("vadd", {**VADD_CONSTS, "NUM_AI_CORES": cores}, template="examples/vadd",
                       device_module=EXAMPLE_DEVICE)
        z = np.zeros(n, np.float32)
        kernel(unused, x, y, z, n)
        outs.append(z)
    np.testing.assert_array_equal(outs[0], outs[1])


def test_the_entry_claims_the_cores_left_and_counts_itself_finished(vadd_kernel, rng):
    # The threads launcher's entry ABI (jit/cruntime.py claim_core, finish_part), numba-compiled: a call claims every
    # core left and counts itself finished once; a call after every core was claimed runs none and still counts.
    unused, x, y, z, n = vadd_args(200, rng)
    vadd_kernel(unused, x, y, z, n)  # compiled for these types
    entry = vadd_kernel.fn.dispatcher
    bound = vadd_kernel._bind((unused, x, y, z, n), {})
    cores = np.zeros(2, np.int64)
    z[:] = 0
    entry(*bound, cores)
    num_cores = VADD_CONSTS["NUM_AI_CORES"]
    assert cores.tolist() == [num_cores + 1, 1]  # every core, plus the claim that found none left
    np.testing.assert_array_equal(z, vadd_reference(x, y, VADD_CONSTS["SCALE"]))
    z[:] = 0
    entry(*bound, cores)  # a thread that comes late: nothing left to claim
    assert cores.tolist() == [num_cores + 2, 2] and not z.any()
    cores = np.array([num_cores - 1, 0], np.int64)  # the other cores claimed elsewhere: only the last one runs
    entry(*bound, cores)
    tile = VADD_CONSTS["TILE"]
    ran = np.flatnonzero(z)
    assert cores[1] == 1 and ran.size and all((i // tile) % num_cores == num_cores - 1 for i in ran)


def test_prange_launcher_gives_the_same_results(monkeypatch, vadd_kernel, rng):
    from jit_helpers import EXAMPLE_DEVICE

    from deep_gemm.jit import build, clear_memory_cache

    unused, x, y, _, n = vadd_args(200, rng)
    outs = []
    for launcher in ("threads", "prange"):
        monkeypatch.setenv("DG_JIT_LAUNCHER", launcher)
        clear_memory_cache()
        kernel = build("vadd", VADD_CONSTS, template="examples/vadd", device_module=EXAMPLE_DEVICE)
        assert kernel.launcher == launcher and kernel.digest == vadd_kernel.digest  # one entry serves both
        z = np.zeros(n, np.float32)
        kernel(unused, x, y, z, n)
        outs.append(z)
    clear_memory_cache()
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], vadd_reference(x, y, VADD_CONSTS["SCALE"]))


RAISES = """
constexpr int32_t NUM_AI_CORES = {{ NUM_AI_CORES }};
extern "C" __global__ __aicore__ void raises(GlobalTensor<int32_t> out, int32_t n) {
    out[GetBlockIdx()] = n / (GetBlockIdx() - 1);  // core 1 divides by zero
}
"""


def test_an_error_on_any_core_reaches_the_caller(tmp_path, monkeypatch):
    from jit_helpers import EXAMPLE_DEVICE

    from deep_gemm.jit import build, launch

    monkeypatch.setattr(launch, "num_threads", lambda: 2)
    (tmp_path / "raises.asc.j2").write_text(RAISES)
    kernel = build("raises", {"NUM_AI_CORES": 2}, template_dir=tmp_path, device_module=EXAMPLE_DEVICE)
    out = np.zeros(2, np.int32)
    for _ in range(2):  # the pool stays usable after a failure
        with pytest.raises(ZeroDivisionError):
            kernel(out, 6)
    assert out[0] == -6


def test_both_launchers_run_the_helpers_kernel_alike(monkeypatch, helpers_kernel, rng):
    """helpers has no early return: its body sits directly in both launch loops (float parameter rebinding)."""
    from jit_helpers import EXAMPLE_DEVICE

    from deep_gemm.jit import build, clear_memory_cache

    assert "def _helpers_core" not in (helpers_kernel.path / "kernel.py").read_text()
    n = 3 * HELPERS_CONSTS["TILE"] + 1
    x = rng.standard_normal(n).astype(np.float32)
    y0 = rng.standard_normal(n).astype(np.float32)
    outs = []
    for launcher in ("threads", "prange"):
        monkeypatch.setenv("DG_JIT_LAUNCHER", launcher)
        clear_memory_cache()
        kernel = build("helpers", HELPERS_CONSTS, template="examples/helpers", device_module=EXAMPLE_DEVICE)
        y, tiles = y0.copy(), np.zeros(4, np.int32)
        kernel(x, y, tiles, n, 0.3)
        outs.append((y, tiles))
    clear_memory_cache()
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
