"""bench/model_check.py: every family's published rows (deep_gemm.estimate.published), the issue-25 bar (median
<= 5 %, every row <= 15 %) and its exit status, the HC rows within 10 % from the model's structure, the plot."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

from deep_gemm.estimate import published


def _load_model_check():
    path = Path(__file__).resolve().parents[2] / "bench" / "model_check.py"
    spec = importlib.util.spec_from_file_location("model_check", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("model_check", module)
    spec.loader.exec_module(module)
    return module


def test_every_family_module_is_printed_and_the_exit_status_is_the_bar(capsys, tmp_path):
    model_check = _load_model_check()
    checks = model_check.all_checks("950DT")
    families = {c.family for c in checks}
    assert {"fp8_fp4_gemm_nt", "bf16_gemm_nt", "tf32_hc_prenorm_gemm"} <= families
    for name in published.FAMILY_MODULES:  # every module with rows contributes them
        module = __import__(f"deep_gemm.estimate.{name}", fromlist=["published_checks"])
        if hasattr(module, "published_checks"):
            assert module.published_checks("950DT"), name
    median, worst = model_check.summarize_checks(checks)
    ok = median <= 0.05 and worst <= 0.15
    plot = tmp_path / "mc.png"
    assert model_check.main(["--plot", str(plot)]) == (0 if ok else 1)
    out = capsys.readouterr().out
    for c in checks:
        assert c.problem in out and f"{100 * c.error:+.1f}%" in out
    assert ("PASS" if ok else "FAIL") in out and plot.stat().st_size > 10_000
    # the GEMM and HC rows (this module's own families) are within the bar on their own
    mine = [c for c in checks if c.family in ("fp8_fp4_gemm_nt", "bf16_gemm_nt", "tf32_hc_prenorm_gemm")]
    median, worst = model_check.summarize_checks(mine)
    assert median <= 0.05 and worst <= 0.15, [(c.family, c.problem, round(c.error, 3)) for c in mine]


def test_hc_rows_within_ten_percent():
    from deep_gemm.estimate.hc_prenorm import published_checks

    rows = published_checks("950DT")
    assert [(r.published_us, r.problem.split(" (")[0]) for r in rows] == [
        (6.0, "M=13 N=24 K=28672"), (72.3, "M=4096 N=24 K=28672")]
    for r in rows:
        assert abs(r.error) <= 0.10, (r.problem, r.modelled_us)
    # M = 4096 streams A from HBM once; M = 13 is latency-bound (launch, one token block's chain, the store phases)
    assert rows[1].bound in ("aiv_mte2", "hbm") and rows[0].bound == "latency"


def test_a_row_off_the_bar_fails(monkeypatch, capsys):
    model_check = _load_model_check()
    good = [c for c in model_check.all_checks("950DT") if abs(c.error) <= 0.05]
    monkeypatch.setattr(model_check, "all_checks", lambda arch: good)
    assert model_check.main(["--plot", ""]) == 0
    bad = dataclasses.replace(good[0], modelled_us=good[0].published_us * 1.2)  # one row 20 % off
    monkeypatch.setattr(model_check, "all_checks", lambda arch: [bad, *good[1:]])
    assert model_check.main(["--plot", ""]) == 1
    assert "FAIL" in capsys.readouterr().out


@pytest.mark.slow
def test_sensitivity_runs_for_the_gemm_rows(monkeypatch, capsys):
    from deep_gemm.estimate.gemm import published_checks

    model_check = _load_model_check()
    monkeypatch.setattr(model_check, "all_checks", published_checks)  # the GEMM rows only: within the bar
    assert model_check.main(["--plot", "", "--sensitivity"]) == 0
    out = capsys.readouterr().out
    assert "Sensitivity" in out and "hbm_bytes_per_s" in out
