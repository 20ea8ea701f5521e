"""The Cube's bf16 unit choice (jit/cpu_features.cube_bf16_unit): kept between calls, yet following DG_CUBE_AMX /
DG_CUBE_DPBF16 at every call (tests and users flip them between GEMMs); a bad value raises at every call."""

from __future__ import annotations

import pytest

from deep_gemm.jit import amx, cpu_features


def _expected(amx_on: bool, dp_on: bool) -> str:
    if amx_on and amx.supported():
        return cpu_features.UNIT_AMX
    if dp_on and cpu_features.dpbf16_supported():
        return cpu_features.UNIT_DPBF16
    return ""


def test_unit_follows_the_variables_between_calls(monkeypatch):
    monkeypatch.delenv("DG_CUBE_AMX", raising=False)
    monkeypatch.delenv("DG_CUBE_DPBF16", raising=False)
    assert cpu_features.cube_bf16_unit() == _expected(True, True)
    for amx_raw, dp_raw in (("0", "1"), ("0", "0"), ("1", "no"), ("off", "yes"), ("1", "1"), ("0", "0")):
        monkeypatch.setenv("DG_CUBE_AMX", amx_raw)
        monkeypatch.setenv("DG_CUBE_DPBF16", dp_raw)
        want = _expected(amx_raw in ("1", "yes"), dp_raw in ("1", "yes"))
        assert cpu_features.cube_bf16_unit() == want, (amx_raw, dp_raw)
        assert cpu_features.cube_bf16_unit() == want, (amx_raw, dp_raw)  # the kept answer
    monkeypatch.delenv("DG_CUBE_DPBF16")
    assert cpu_features.cube_bf16_unit() == _expected(False, True)


def test_bad_value_raises_at_every_call(monkeypatch):
    monkeypatch.setenv("DG_CUBE_AMX", "0")
    monkeypatch.setenv("DG_CUBE_DPBF16", "maybe")
    for _ in range(2):
        with pytest.raises(ValueError, match="DG_CUBE_DPBF16='maybe'"):
            cpu_features.cube_bf16_unit()
    monkeypatch.setenv("DG_CUBE_DPBF16", "0")
    assert cpu_features.cube_bf16_unit() == ""
