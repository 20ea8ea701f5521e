"""The performance benches' command lines (bench/perf_check.py, gemm_bench.py, jit_bench.py): the steady-state
protocol is described in every --help, rows are listed, bad arguments are refused before anything runs, a result
line carries its verdict, target and figures, and the rows carry torch at its default and best thread count (and
say so when torch is missing) in their lines and their --json output, timed on a tiny shape with the stand-in
replaced by numpy (the rows are under test, not the kernels); grouped_bench's row figures likewise."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
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
                    "startup", "jit", "jit-mixed"]


def test_jit_bench_checks_issue_28_compile_targets():
    # every kernel it builds has its targets: the FP8 GEMM's and the mixed kernels' are issue 28's
    mixed = {"hc_prenorm", "mqa_logits", "paged_mqa_logits"}
    assert set(jit_bench.TARGETS) == set(jit_bench.SETUP) == {"vadd", "fp8_gemm"} | mixed
    assert jit_bench.TARGETS["fp8_gemm"] == (2.0, 6.0, True)
    for name in mixed:
        assert jit_bench.TARGETS[name] == (10.0, 10.0, False)
    # each child's setup is Python the cold-compile script can run (only children execute it)
    for name, setup in jit_bench.SETUP.items():
        compile(jit_bench.COLD.format(setup=setup, reps=1), f"<{name}>", "exec")
    # and the warm-up plan recorder's (every setup, the record-only ones too)
    for name, setup in {**jit_bench.SETUP, **jit_bench.PLAN_SETUP}.items():
        compile(jit_bench.RECORD.format(setup=setup), f"<record {name}>", "exec")


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


# ---------------------------------------------------------------------------------------------------------------
# The torch columns (a tiny shape; the stand-in replaced by numpy so nothing compiles: the rows are under test)
# ---------------------------------------------------------------------------------------------------------------
class _FakeStandIn:
    """perf_check's view of deep_gemm: the two GEMMs it times, computed by numpy."""

    @staticmethod
    def bf16_gemm_nt(a, b, d):
        d[...] = (a.astype(np.float32) @ b.astype(np.float32).T).astype(d.dtype)

    @staticmethod
    def fp8_gemm_nt(a, b, d):
        from deep_gemm.testing import peers

        d[...] = peers.numpy_fp8_gemm(a[0], a[1], b[0], b[1])

    @staticmethod
    def get_num_ai_cores():
        return 1

    @staticmethod
    def get_npu_arch():
        return "fake"


def _tiny_rows(monkeypatch):
    monkeypatch.setattr(perf_check, "deep_gemm", _FakeStandIn)
    opts = perf_check.Options(blocks=1, calls=1, naive=False)
    rng = np.random.default_rng(0)
    return (perf_check.row_bf16(rng, (16, 32, 64), opts),
            perf_check.row_fp8(rng, (16, 32, 64), opts, 5.0, None, 5.0))


def test_rows_carry_torch_at_default_and_best_thread_count(monkeypatch):
    pytest.importorskip("torch", reason="the torch peer is the optional `torch` extra")
    from deep_gemm.testing import peers

    bf16, fp8 = _tiny_rows(monkeypatch)
    default = peers.torch_default_threads()
    labels = {f"torch({default}t default)"} | {f"torch({t}t)" for t in peers.torch_thread_counts() if t != default}
    by_name = {r.name: r for r in bf16}
    default_row = by_name["BF16 16x32x64 vs torch bf16 a @ b.T, default threads"]
    best_row = by_name["BF16 16x32x64 vs torch bf16 a @ b.T, best thread count"]
    assert default_row.target == ">= 1.20x" and best_row.target == ">= 1.00x"
    for row in (default_row, best_row):
        # JAX (the `peers` extra) times beside them when it is installed
        assert row.passed is not None and row.value > 0 and set(row.times) - {"jax"} == {"stand-in", "numpy"} | labels
    assert "best: " in best_row.detail and all(label in default_row.detail for label in labels)
    amx = by_name["BF16 16x32x64 fraction of the measured AMX-BF16 peak"]
    assert amx.target == ">= 0.60" and amx.passed is None  # no AMX peak measured here
    best_peer = next(r for r in fp8 if "best peer" in r.name)
    assert best_peer.target == ">= 5.00x" and best_peer.value > 0 and labels <= set(best_peer.times)


def test_without_torch_its_rows_say_it_is_missing(monkeypatch):
    from deep_gemm.testing import peers

    monkeypatch.setattr(peers, "torch_version", lambda: None)
    bf16, fp8 = _tiny_rows(monkeypatch)
    torch_rows = [r for r in bf16 if "torch" in r.name]
    assert len(torch_rows) == 2 and all(r.passed is None and "torch not installed" in r.detail for r in torch_rows)
    assert not any(name.startswith("torch") for r in bf16 + fp8 for name in r.times)
    best_peer = next(r for r in fp8 if "best peer" in r.name)
    assert best_peer.passed is not None and "torch not installed" in best_peer.detail


def test_json_output_carries_every_library(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(perf_check, "deep_gemm", _FakeStandIn)
    monkeypatch.setattr(perf_check, "ROWS", {"tiny": lambda rng, o: perf_check.row_bf16(rng, (16, 32, 64), o)})
    out = tmp_path / "rows.json"
    perf_check.main(["--blocks", "1", "--calls", "1", "--peak-seconds", "0", "--json", str(out)])
    record = json.loads(out.read_text())
    assert record["torch"] == perf_check.peers.torch_version() and record["blocks"] == 1
    names = [r["name"] for r in record["rows"]]
    assert "BF16 16x32x64 vs torch bf16 a @ b.T, best thread count" in names
    for row in record["rows"]:
        assert {"target", "value", "passed", "detail", "times"} <= set(row)
    if record["torch"]:
        assert any(lib.startswith("torch(") for lib in record["rows"][0]["times"])
    assert f"rows written to {out}" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------------------
# grouped_bench: a row's figures, torch columns included
# ---------------------------------------------------------------------------------------------------------------
def test_grouped_row_figures_with_and_without_torch():
    import grouped_bench as gb

    from deep_gemm.testing import SteadyTiming

    timing = SteadyTiming({gb.GROUPED: (1.0, 1.0), gb.NUMPY: (8.0, 8.0), gb.TORCH: (4.0, 4.0),
                           "torch-1t": (2.0, 3.0)})
    f = gb.row_figures(timing, 2e9)
    assert f["grouped_ms"] == 1e3 and f["gflops"] == 2.0 and f["x_numpy"] == 8.0 and f["x_torch"] == 4.0
    assert f["torch_best_threads"] == 1 and f["torch_best_ms"] == 2.5e3 and f["x_torch_best"] == 2.5
    assert f["x_best_peer"] == 2.5  # per round the fastest peer: torch at 1 thread
    plain = gb.row_figures(SteadyTiming({gb.GROUPED: (1.0,), gb.NUMPY: (3.0,)}), 1e9)
    assert plain["torch_ms"] is None and plain["x_torch"] is None and plain["x_best_peer"] == 3.0
