"""bench/startup_bench.py: the `-X importtime` parser splits the imports at the child's phase marks, the phase
arithmetic leaves the operand set-up out, bad arguments are refused, and a fresh process runs a cached FP8 GEMM
without importing numba, llvmlite, jinja2 or tree_sitter (the bench's own child, twice: the first fills the cache).
No timing is asserted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import startup_bench as sb  # noqa: E402

IMPORTTIME = f"""import time: self [us] | cumulative | imported package
import time:       100 |        100 |   numpy._core
import time:       200 |        300 | numpy
{sb.MARKS['operands']}
import time:        50 |         50 | numpy.random
{sb.MARKS['deep_gemm']}
import time:        10 |         10 | deep_gemm
{sb.MARKS['first_call']}
import time:        30 |         30 |     deep_gemm.jit.cache
import time:        20 |         50 |   deep_gemm.jit
import time:         5 |         55 | deep_gemm.api.gemm
"""


def test_parse_importtime_splits_at_the_phase_marks():
    phases = sb.parse_importtime(IMPORTTIME)
    assert phases["start"] == [("numpy._core", 100, 100, 1), ("numpy", 200, 300, 0)]
    assert phases["operands"] == [("numpy.random", 50, 50, 0)]
    assert sb.top_level(phases["deep_gemm"]) == [("deep_gemm", 10)]
    assert [e[3] for e in phases["first_call"]] == [2, 1, 0]
    assert sb.top_level(phases["first_call"]) == [("deep_gemm.api.gemm", 55)]


def test_figures_leave_the_operand_set_up_out():
    record = {"main": 10.05, "numpy": 10.10, "ml_dtypes": 10.11, "operands": 10.31, "import": 10.32,
              "first": 10.40, "second": 10.41}
    f = sb.figures(record, spawn=10.0)
    assert f["interpreter"] == pytest.approx(0.05) and f["deep_gemm"] == pytest.approx(0.01)
    assert f["first_call"] == pytest.approx(0.08) and f["steady_call"] == pytest.approx(0.01)
    assert f["total"] == pytest.approx(0.40 - 0.20)  # spawn to the end of the first call, less the operands


@pytest.mark.parametrize(("argv", "match"), [(["--runs", "0"], "--runs must be >= 1"),
                                             (["--size", "100"], "--size must be a positive multiple of 128"),
                                             (["--top", "-1"], "--top must be >= 0")])
def test_bad_arguments_are_refused(argv, match, capsys):
    with pytest.raises(SystemExit) as exc:
        sb.main(argv)
    assert exc.value.code == 2 and match in capsys.readouterr().err


def test_the_cached_path_imports_no_compiler_module(session_cache_dir):
    code = sb.CHILD.format(size=128, marks=sb.MARKS, heavy=sb.HEAVY_MODULES)
    # NOTES: the environment as inherited (no .pyc written into the checkout); the imports do not depend on bytecode
    env = sb._env("as inherited", None, session_cache_dir)
    sb.run_child(code, env)  # compiles the kernel into the session cache, or finds it there
    record, stderr, spawn = sb.run_child(code, env)
    assert record["stats"].get("numba_compile", 0) == 0 and record["stats"].get("build", 0) == 0, record["stats"]
    for name in ("numba", "llvmlite", "jinja2", "tree_sitter", "tree_sitter_cpp"):
        assert record["modules"][name] is False, (name, record)
    f = sb.figures(record, spawn)
    assert 0 < f["first_call"] < f["total"] and f["steady_call"] > 0
    assert all(mark in stderr for mark in sb.MARKS.values())
