"""Runtime controls (deep_gemm/runtime.py) and arch specs (deep_gemm/arch.py), as they are."""

from __future__ import annotations

import pytest

from deep_gemm import runtime
from deep_gemm.arch import ARCHS, ASCEND_910B2, ASCEND_950DT, ASCEND_950PR, ArchSpec, get_arch


@pytest.fixture(autouse=True)
def fresh_runtime(monkeypatch):
    """Every test starts from the env-var defaults (DG_NPU_ARCH / DG_NUM_AI_CORES unset) and leaves no trace."""
    monkeypatch.delenv("DG_NPU_ARCH", raising=False)
    monkeypatch.delenv("DG_NUM_AI_CORES", raising=False)
    monkeypatch.setattr(runtime, "_state", {})


# ---------------------------------------------------------------------------------------------------------------
# Arch specs


def test_arch_table():
    assert (ASCEND_950DT.num_ai_cores, ASCEND_950PR.num_ai_cores, ASCEND_910B2.num_ai_cores) == (32, 28, 24)
    assert set(ARCHS) == {"950DT", "950PR", "910B2"}
    assert ASCEND_950DT.flops_per_cycle("fp8") == 2 * ASCEND_950DT.flops_per_cycle("bf16")
    assert ASCEND_950DT.flops_per_cycle("fp4") == 4 * ASCEND_950DT.flops_per_cycle("bf16")
    assert ASCEND_950DT.peak_flops("bf16") == 32 * 8192 * 1.65e9
    assert ASCEND_950DT.peak_flops("bf16", num_ai_cores=16) == ASCEND_950DT.peak_flops("bf16") / 2
    with pytest.raises(ValueError, match="910B2 has no fp8"):
        ASCEND_910B2.flops_per_cycle("fp8")


@pytest.mark.parametrize("name", ["950PR", "950pr", "Ascend950PR", "ascend_950pr", " ASCEND-950PR "])
def test_get_arch_spellings(name):
    assert get_arch(name) is ASCEND_950PR


def test_get_arch_errors():
    assert get_arch(ASCEND_910B2) is ASCEND_910B2
    with pytest.raises(ValueError, match="unknown arch '960'"):
        get_arch("960")
    with pytest.raises(TypeError, match="int: 950"):
        get_arch(950)


# ---------------------------------------------------------------------------------------------------------------
# AI-core count


def test_defaults():
    assert runtime.get_npu_arch() == "950DT"
    assert isinstance(runtime.get_arch_spec(), ArchSpec) and runtime.get_arch_spec() is ASCEND_950DT
    assert runtime.get_num_ai_cores() == 32 and runtime.get_num_sms() == 32
    assert runtime.get_mk_alignment_for_contiguous_layout() == 256
    assert runtime.get_deterministic_algorithms() is False
    assert runtime.get_dry_run() is False


def test_env_defaults(monkeypatch):
    monkeypatch.setenv("DG_NPU_ARCH", "910B2")
    monkeypatch.setenv("DG_NUM_AI_CORES", "7")
    assert runtime.get_npu_arch() == "910B2"
    assert runtime.get_num_ai_cores() == 7


def test_set_get_and_aliases():
    runtime.set_num_ai_cores(5)
    assert runtime.get_num_ai_cores() == 5 and runtime.get_num_sms() == 5
    runtime.set_num_sms(32)
    assert runtime.get_num_ai_cores() == 32
    runtime.set_num_sms(1)
    assert runtime.get_num_sms() == 1
    assert runtime.set_num_sms is runtime.set_num_ai_cores and runtime.get_num_sms is runtime.get_num_ai_cores


@pytest.mark.parametrize("n", [0, -1, 33, 1000])
def test_core_bounds(n):
    runtime.set_num_ai_cores(4)
    with pytest.raises(ValueError, match=rf"num_ai_cores={n} must be in \[1, 32\] for arch 950DT"):
        runtime.set_num_sms(n)
    assert runtime.get_num_ai_cores() == 4  # unchanged after a rejected value


@pytest.mark.parametrize("n", [True, False, 4.0, "4", None])
def test_core_type_errors(n):
    with pytest.raises(TypeError, match="num_ai_cores must be an int"):
        runtime.set_num_ai_cores(n)


def test_core_bound_follows_arch():
    runtime.set_npu_arch("910B2")
    runtime.set_num_ai_cores(24)
    with pytest.raises(ValueError, match=r"\[1, 24\] for arch 910B2"):
        runtime.set_num_ai_cores(25)


# ---------------------------------------------------------------------------------------------------------------
# Arch switch


def test_arch_switch_resets_cores_above_new_count():
    runtime.set_num_ai_cores(30)
    runtime.set_npu_arch("950PR")
    assert runtime.get_npu_arch() == "950PR" and runtime.get_num_ai_cores() == 28  # reset to the full count
    runtime.set_npu_arch("950DT")
    assert runtime.get_num_ai_cores() == 32  # the reset value follows the arch: no stale 30 or 28


def test_arch_switch_keeps_cores_that_fit():
    runtime.set_num_ai_cores(16)
    runtime.set_npu_arch("910B2")
    assert runtime.get_num_ai_cores() == 16
    runtime.set_npu_arch(ASCEND_950PR)
    assert runtime.get_arch_spec() is ASCEND_950PR and runtime.get_num_ai_cores() == 16


def test_unknown_arch_leaves_state():
    runtime.set_npu_arch("950PR")
    with pytest.raises(ValueError, match="unknown arch 'H100'"):
        runtime.set_npu_arch("H100")
    with pytest.raises(TypeError):
        runtime.set_npu_arch(950)
    assert runtime.get_npu_arch() == "950PR"


# ---------------------------------------------------------------------------------------------------------------
# Alignment, determinism, dry run


def test_mk_alignment_multiples_of_32():
    try:
        for value in (128, 32, 512, 256):
            runtime.set_mk_alignment_for_contiguous_layout(value)
            assert runtime.get_mk_alignment_for_contiguous_layout() == value
        for bad in (0, -32, 16, 100):
            with pytest.raises(ValueError, match=f"positive multiple of 32, got {bad}"):
                runtime.set_mk_alignment_for_contiguous_layout(bad)
        with pytest.raises(TypeError, match="bool"):
            runtime.set_mk_alignment_for_contiguous_layout(True)
        assert runtime.get_mk_alignment_for_contiguous_layout() == 256
    finally:
        runtime.set_mk_alignment_for_contiguous_layout(256)
    assert runtime.get_theoretical_mk_alignment_for_contiguous_layout() == 256
    assert runtime.get_theoretical_mk_alignment_for_contiguous_layout(expected_m=7) == 256


def test_deterministic_flag():
    runtime.use_deterministic_algorithms(True)
    assert runtime.get_deterministic_algorithms() is True
    runtime.use_deterministic_algorithms(False)
    assert runtime.get_deterministic_algorithms() is False
    runtime.use_deterministic_algorithms()
    assert runtime.get_deterministic_algorithms() is True
    with pytest.raises(TypeError, match="int: 1"):
        runtime.use_deterministic_algorithms(1)


def test_dry_run_context():
    assert runtime.get_dry_run() is False
    with runtime.dry_run():
        assert runtime.get_dry_run() is True
        with runtime.dry_run():
            assert runtime.get_dry_run() is True
        assert runtime.get_dry_run() is True  # the inner block restores the outer mode, not False
    assert runtime.get_dry_run() is False
    with pytest.raises(RuntimeError, match="boom"), runtime.dry_run():
        raise RuntimeError("boom")
    assert runtime.get_dry_run() is False
    runtime.set_dry_run(True)
    with runtime.dry_run():
        pass
    assert runtime.get_dry_run() is True
    with pytest.raises(TypeError, match="int: 0"):
        runtime.set_dry_run(0)


# ---------------------------------------------------------------------------------------------------------------
# runtime_scope


def test_runtime_scope_restores():
    runtime.set_num_ai_cores(20)
    with runtime.runtime_scope(arch="910B2", num_ai_cores=3):
        assert runtime.get_npu_arch() == "910B2" and runtime.get_num_ai_cores() == 3
        runtime.use_deterministic_algorithms(True)
    assert runtime.get_npu_arch() == "950DT" and runtime.get_num_ai_cores() == 20
    assert runtime.get_deterministic_algorithms() is False
    with runtime.runtime_scope(arch="950PR"):
        assert runtime.get_num_ai_cores() == 20  # fits 28: kept
    with runtime.runtime_scope():
        runtime.set_npu_arch("910B2")
    assert runtime.get_npu_arch() == "950DT" and runtime.get_num_ai_cores() == 20


def test_runtime_scope_restores_after_errors():
    runtime.set_num_ai_cores(8)
    with pytest.raises(ValueError, match=r"\[1, 24\]"), runtime.runtime_scope(arch="910B2", num_ai_cores=28):
        pass
    assert runtime.get_npu_arch() == "950DT" and runtime.get_num_ai_cores() == 8
    with pytest.raises(KeyError), runtime.runtime_scope(num_ai_cores=2):
        raise KeyError("inside")
    assert runtime.get_num_ai_cores() == 8


def test_bad_env_cores_fails_consistently(monkeypatch):
    monkeypatch.setenv("DG_NUM_AI_CORES", "64")
    for _ in range(2):
        with pytest.raises(ValueError, match="num_ai_cores=64"):
            runtime.get_num_ai_cores()
    with pytest.raises(ValueError, match="num_ai_cores=64"):
        runtime.get_dry_run()
