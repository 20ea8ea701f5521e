"""The synchronisation checker (DG_SYNC_CHECK=1): each kind of protocol error is reported with its kernel.asc line
(kernels translated with the checker and run as plain Python: fast), a deliberately broken template is caught
through the real pipeline, and the shipped example templates pass it (the GEMM templates: tests/kernels)."""

from __future__ import annotations

import numpy as np
import pytest
from jit_helpers import EXAMPLE_DEVICE, HELPERS_CONSTS, LOOPS_CONSTS, VADD_CONSTS, vadd_args, vadd_reference

from deep_gemm import envs
from deep_gemm.device.crosscore import KernelDeadlockError, new_cross_pool
from deep_gemm.device.synccheck import SyncCheckError
from deep_gemm.jit import build
from deep_gemm.jit.translate import translate


def run_checked(body: str, params: str = "GlobalTensor<float> x", args=None, helpers: str = ""):
    """Translate an entry body with the checker on, run it as plain Python on 2 cores; returns the arrays."""
    source = (f"constexpr int32_t NUM_AI_CORES = 2;\n{helpers}\n"
              f'extern "C" __global__ __aicore__ void k({params}) {{\n{body}\n}}\n')
    translation = translate(source, template="case.asc", device_module=EXAMPLE_DEVICE, sync_check=True)
    python = translation.python.replace("from numba import njit, prange",
                                        "njit = lambda *a, **k: (lambda f: f)\nprange = range")
    namespace: dict = {}
    exec(compile(python, "<checked kernel>", "exec"), namespace)
    args = args if args is not None else (np.zeros(4, np.float32),)
    # the hidden arguments: a mixed kernel's pool of cross-core states (a row for the one launch thread), the cancel
    # flag, the core counter
    pool = (new_cross_pool(1, translation.ub_bytes),) if translation.is_mixed else ()
    namespace["k"](*args, *pool, np.zeros(1, np.uint8), np.zeros(3, np.int64))
    return args


GOOD_RING = """
    SetFlag<HardEvent::MTE1_MTE2>(0);
    SetFlag<HardEvent::MTE1_MTE2>(1);
    for (int32_t i = 0; i < 4; ++i) {
        WaitFlag<HardEvent::MTE1_MTE2>(i % 2);
        x[i] = x[i] + 1.0f;
        SetFlag<HardEvent::MTE1_MTE2>(i % 2);
    }
    PipeBarrier<PIPE_ALL>();
    WaitFlag<HardEvent::MTE1_MTE2>(0);
    WaitFlag<HardEvent::MTE1_MTE2>(1);"""


def test_a_correct_ring_passes():
    (x,) = run_checked(GOOD_RING)
    np.testing.assert_array_equal(x, np.full(4, 2.0, np.float32))  # two cores, one add each


BROKEN = {
    # name: (body, kind text, line of the finding in case.asc)
    "wait without set": ("    WaitFlag<HardEvent::MTE2_V>(3);", "without a matching earlier SetFlag", 4),
    "set twice": ("    SetFlag<HardEvent::V_MTE3>(1);\n    SetFlag<HardEvent::V_MTE3>(1);\n"
                  "    WaitFlag<HardEvent::V_MTE3>(1);", "set again before it was waited", 4),
    "id out of range": ("    SetFlag<HardEvent::M_FIX>(8);\n    WaitFlag<HardEvent::M_FIX>(8);", "outside 0..7", 4),
    # slot 1 was last set by the loop's SetFlag (line 10) and is never drained
    "armed at end": (GOOD_RING.replace("    WaitFlag<HardEvent::MTE1_MTE2>(1);", ""), "still set at kernel end", 10),
    "bad pipe": ("    PipeBarrier(99);", "unknown pipe 99", 4),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_each_protocol_error_is_reported_with_its_line(case):
    body, text, line = BROKEN[case]
    with pytest.raises(SyncCheckError) as info:
        run_checked(body)
    err = info.value
    assert text in str(err) and err.line == line and err.core == 0 and err.sub_core == "AIC", str(err)
    assert "kernel k" in str(err)


def test_helpers_thread_the_checker_state():
    helper = """
__aicore__ inline void consume(GlobalTensor<float> x, int32_t slot) {
    WaitFlag<HardEvent::MTE2_MTE1>(slot);
    x[slot] = 5.0f;
}"""
    with pytest.raises(SyncCheckError, match="without a matching") as info:
        run_checked("    SetFlag<HardEvent::MTE2_MTE1>(0);\n    consume(x, 0);\n    consume(x, 1);", helpers=helper)
    assert info.value.line == 4  # inside the helper


MIXED_OK = """
    if ASCEND_IS_AIC {
        CrossCoreSetFlag<2, PIPE_FIX>(4);
        CrossCoreWaitFlag(5);
    }
    if ASCEND_IS_AIV {
        CrossCoreWaitFlag(4);
        x[GetBlockIdx() * 2 + GetSubBlockIdx()] = 1.0f;
        CrossCoreSetFlag<2, PIPE_MTE3>(5);
    }"""


def test_cross_core_flags_checked():
    (x,) = run_checked(MIXED_OK)
    np.testing.assert_array_equal(x, np.ones(4, np.float32))
    # a set nobody waits for is left at the end
    with pytest.raises(SyncCheckError, match=r"CrossCoreSetFlag\(6\) to AIC never waited") as info:
        run_checked(MIXED_OK.replace("CrossCoreSetFlag<2, PIPE_MTE3>(5);",
                                     "CrossCoreSetFlag<2, PIPE_MTE3>(5);\n        CrossCoreSetFlag<2, PIPE_MTE3>(6);"))
    assert info.value.line == 13
    # a wait nobody sets is a deadlock, reported as such (checker on or off)
    with pytest.raises(KernelDeadlockError) as dead:
        run_checked(MIXED_OK.replace("CrossCoreWaitFlag(5);", "CrossCoreWaitFlag(7);"))
    assert (dead.value.sub_core, dead.value.event_id, dead.value.line) == ("AIC", 7, 7)


@pytest.fixture
def sync_check_on(monkeypatch):
    monkeypatch.setenv(envs.DG_SYNC_CHECK.name, "1")


def test_shipped_examples_pass_the_checker(sync_check_on, rng):
    vadd = build("vadd", VADD_CONSTS, template="examples/vadd", device_module=EXAMPLE_DEVICE)
    assert "check_set_flag" in (vadd.path / "kernel.py").read_text()
    unused, x, y, z, n = vadd_args(3 * 16 * 2 + 5, rng)
    vadd(unused, x, y, z, n)
    np.testing.assert_array_equal(z, vadd_reference(x, y, VADD_CONSTS["SCALE"]))
    loops = build("loops", LOOPS_CONSTS, template="examples/loops", device_module=EXAMPLE_DEVICE)
    rows, cols = LOOPS_CONSTS["ROWS"], LOOPS_CONSTS["COLS"]
    loops(rng.integers(-50, 50, rows * cols).astype(np.int32), np.zeros(rows * cols, np.float32),
          np.zeros(rows * 6, np.int32), 0.5)
    helpers = build("helpers", HELPERS_CONSTS, template="examples/helpers", device_module=EXAMPLE_DEVICE)
    n = 20
    helpers(rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32),
            np.zeros(-(-n // HELPERS_CONSTS["TILE"]), np.int32), n, 1.5)


BROKEN_TEMPLATE = """// A ring that is never drained: the checker must catch it.
constexpr int32_t NUM_AI_CORES = {{ NUM_AI_CORES }};
extern "C" __global__ __aicore__ void broken_ring(GlobalTensor<float> x) {
    for (int32_t s = 0; s < 2; ++s) {
        SetFlag<HardEvent::MTE1_MTE2>(s);
    }
    for (int32_t i = GetBlockIdx(); i < 8; i += GetBlockNum()) {
        WaitFlag<HardEvent::MTE1_MTE2>(i % 2);
        x[i] = x[i] * 2.0f;
        SetFlag<HardEvent::MTE1_MTE2>(i % 2);
    }
}
"""


def test_checker_catches_a_broken_template(tmp_path, monkeypatch):
    (tmp_path / "broken_ring.asc.j2").write_text(BROKEN_TEMPLATE)
    x = np.arange(8, dtype=np.float32)
    # without the checker it runs (the CPU runs one core's pipes in order) ...
    kernel = build("broken_ring", {"NUM_AI_CORES": 3}, template_dir=tmp_path, device_module=EXAMPLE_DEVICE)
    kernel(x)
    np.testing.assert_array_equal(x, np.arange(8, dtype=np.float32) * 2)
    # ... with it, the undrained ring is reported with the line of the SetFlag left armed
    monkeypatch.setenv(envs.DG_SYNC_CHECK.name, "1")
    checked = build("broken_ring", {"NUM_AI_CORES": 3}, template_dir=tmp_path, device_module=EXAMPLE_DEVICE)
    assert checked.digest != kernel.digest
    with pytest.raises(SyncCheckError, match="still set at kernel end") as info:
        checked(x)
    assert info.value.line in (5, 10) and "broken_ring" in str(info.value)
