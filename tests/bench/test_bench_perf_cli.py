"""The performance benches' command lines (bench/perf_check.py, gemm_bench.py, jit_bench.py): the steady-state
protocol is described in every --help, rows are listed, bad arguments are refused before anything runs, and a
result line carries its verdict, target and figures. Nothing here times anything."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import gemm_bench  # noqa: E402
import jit_bench  # noqa: E402
import perf_check  # noqa: E402


@pytest.mark.parametrize("module", [perf_check, gemm_bench])
def test_help_describes_the_protocol(module, capsys):
    with pytest.raises(SystemExit) as exc:
        module.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for words in ("own steady state", "back-to-back", "discarded", "median of its block figures", "--calls",
                  "--blocks"):
        assert words in out


def test_perf_check_lists_the_issue_rows(capsys):
    assert perf_check.main(["--list"]) == 0
    rows = capsys.readouterr().out.split()
    assert rows == ["bf16-2048", "bf16-4096x7168", "fp8-2048", "fp8-4096x7168", "fp8-m128", "fp8-m16", "threads",
                    "startup", "jit"]


@pytest.mark.parametrize(("argv", "match"), [
    (["--blocks", "0"], "--blocks must be >= 1, got 0"), (["--calls", "-1"], "--calls must be >= 1, got -1"),
    (["--rows", "nope"], "no row matches 'nope'"), (["--peak-seconds", "-1"], "--peak-seconds must be >= 0"),
])
def test_perf_check_refuses_bad_arguments(argv, match, capsys):
    with pytest.raises(SystemExit) as exc:
        perf_check.main(argv)
    assert exc.value.code == 2 and match in capsys.readouterr().err


def test_gemm_bench_and_jit_bench_refuse_bad_arguments(capsys):
    with pytest.raises(SystemExit):
        gemm_bench.main(["--blocks", "0"])
    assert "--blocks must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gemm_bench.main(["--shapes", "16x0x32"])
    assert "16x0x32" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        jit_bench.main(["--reps", "0"])
    assert "--reps must be >= 1, got 0" in capsys.readouterr().err


def test_result_lines_carry_verdict_target_and_figures():
    ok = perf_check.Result("FP8 16x7168x2048 vs numpy", ">= 5.00x", 5.5, "x", True, "stand-in 1.0 ms")
    assert ok.line().startswith("PASS") and ">= 5.00x" in ok.line() and "5.50x" in ok.line()
    missing = perf_check.Result("BF16 vs JAX", ">= 1.20x", float("nan"), "x", None, "JAX not installed")
    assert missing.line().startswith("n/a") and "JAX not installed" in missing.line()
    frac = perf_check.Result("BF16 fraction of the FMA peak", ">= 0.65", 0.5, "", False, "")
    assert frac.line().startswith("FAIL") and "0.50" in frac.line()
    row = jit_bench.Row("dispatch", "<= 20 us", 25.0, "us", False, "min 20 us")
    assert row.line().startswith("FAIL") and "25.0 us" in row.line()
