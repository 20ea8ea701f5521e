"""bench/sweep.py on tiny shape files: the CSV schema shared by both modes, resume after an interruption, failed
and skipped rows, the summary's figures, and (when the teammates' parts exist) the real estimator and kernels."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import _sweep_cpu  # noqa: E402
import _sweep_csv  # noqa: E402
import _sweep_report  # noqa: E402
import sweep  # noqa: E402

CPU_MACHINE = {"peak_gflops": 100.0, "bandwidth_gbs": 20.0}
TINY = [(32, 32, 64), (64, 48, 96), (16, 16, 40), (8, 24, 32)]


def _shape_file(tmp_path: Path, shapes=TINY) -> Path:
    path = tmp_path / "shapes.txt"
    path.write_text("".join(f"{m} {n} {k}\n" for m, n, k in shapes))
    return path


def _fake_estimate(m, n, k, a_dtype="fp8", b_dtype="fp8", *, out_dtype="bf16", arch=None, num_ai_cores=None,
                   **_):
    """Predicts 2MNK at 100 TFLOPS plus 3 us; raises on K == 40 to exercise failed rows."""
    if k == 40:
        raise RuntimeError("no config for K=40\nsecond line")
    time_us = 2 * m * n * k / 100e12 * 1e6 + 3.0
    return types.SimpleNamespace(time_us=time_us, tflops=2 * m * n * k / time_us / 1e6, utilization=0.1,
                                 bound="hbm", config={"block_m": 128, "path": "cube"})


def _rows(out: Path) -> list[dict]:
    with open(out / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def _args(tmp_path: Path, mode: str, *extra: str) -> list[str]:
    return ["--mode", mode, "--shapes", str(_shape_file(tmp_path)), "--out", str(tmp_path / "out"),
            "--no-progress", "--no-plots", *extra]


def test_schema_documented_in_sweep_docstring_in_order():
    block = sweep.__doc__.split("results.csv schema")[1].split("\n\n")[0]
    documented = []
    for line in block.splitlines()[1:]:
        if line.startswith("    ") and not line.startswith("     "):
            documented += line.strip().split("  ")[0].split(", ")
    assert tuple(documented) == _sweep_csv.COLUMNS


def test_both_modes_share_one_schema(tmp_path):
    summary = sweep.run(_args(tmp_path, "both", "--repeats", "3", "--max-repeats", "4"),
                        runner=_sweep_cpu.NumpyRunner(), estimator=_fake_estimate, cpu_machine=CPU_MACHINE)
    out = tmp_path / "out"
    with open(out / "results.csv", newline="") as f:
        header = next(csv.reader(f))
    assert tuple(header) == _sweep_csv.COLUMNS
    rows = _rows(out)
    assert len(rows) == 2 * 2 * len(TINY)  # modes x dtypes x shapes
    assert {(r["mode"], r["dtype"]) for r in rows} == {(m, d) for m in ("model", "cpu") for d in ("bf16", "fp8")}
    for r in rows:
        m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
        assert int(r["flops"]) == 2 * m * n * k
        if r["status"] != "ok":
            continue
        gflops = float(r["gflops"])
        assert gflops == pytest.approx(2 * m * n * k / float(r["time_us"]) / 1e3, rel=1e-4)
        assert float(r["frac_peak"]) == pytest.approx(gflops / float(r["peak_gflops"]), rel=1e-4)
        attainable = min(float(r["peak_gflops"]), float(r["intensity"]) * float(r["bandwidth_gbs"]))
        assert float(r["frac_attainable"]) == pytest.approx(gflops / attainable, rel=1e-4)
        assert int(r["compute_bound"]) == int(float(r["intensity"]) > float(r["ridge"]))
    model = [r for r in rows if r["mode"] == "model"]
    cpu = [r for r in rows if r["mode"] == "cpu"]
    # Model rows: the estimator's bound and config; no baseline columns. K=40 failed with a one-line error.
    failed = [r for r in model if r["status"] == "failed"]
    assert {(r["dtype"], r["k"]) for r in failed} == {("bf16", "40"), ("fp8", "40")}
    assert "RuntimeError: no config for K=40 | second line" == failed[0]["error"]
    for r in model:
        if r["status"] == "ok":
            assert r["bound"] == "hbm" and r["config"] == "block_m=128 path=cube"
            assert r["arch"] == "950DT" and r["num_ai_cores"] == "32" and r["baseline_time_us"] == ""
    ridges = {r["dtype"]: float(r["ridge"]) for r in model}
    assert ridges["fp8"] == pytest.approx(2 * ridges["bf16"], rel=1e-4)
    # CPU rows: the baseline, speedup, repeats and a calc_diff at bf16 rounding level; no model bound.
    for r in cpu:
        assert r["status"] == "ok", r["error"]
        assert float(r["speedup"]) == pytest.approx(float(r["baseline_time_us"]) / float(r["time_us"]), rel=1e-4)
        assert 3 <= int(r["repeats"]) <= 4
        assert 0 <= float(r["calc_diff"]) < 1e-4
        assert r["bound"] == "" and float(r["ridge"]) == pytest.approx(5.0)
    # summary.json agrees with the CSV.
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["groups"]["model/bf16"]["failed"] == 1 and on_disk["groups"]["model/bf16"]["ok"] == 3
    assert on_disk["groups"]["cpu/fp8"]["ok"] == len(TINY)
    assert summary["groups"].keys() == on_disk["groups"].keys()
    assert "I = 2MNK / bytes" in on_disk["definitions"]["intensity"]


class _InterruptingRunner(_sweep_cpu.NumpyRunner):
    """Raises KeyboardInterrupt (a Ctrl-C) on its n-th timed shape."""

    def __init__(self, interrupt_at: int) -> None:
        super().__init__()
        self.interrupt_at = interrupt_at
        self.shapes_seen: list[tuple] = []

    def run(self, case):
        shape = (case.dtype, case.m, case.n, case.k)
        if shape not in self.shapes_seen:
            self.shapes_seen.append(shape)
        if len(self.shapes_seen) == self.interrupt_at:
            raise KeyboardInterrupt
        return super().run(case)


def test_interrupt_keeps_rows_and_resume_skips_them(tmp_path):
    args = _args(tmp_path, "cpu", "--dtype", "bf16")
    with pytest.raises(SystemExit) as exc:
        sweep.run(args, runner=_InterruptingRunner(3), cpu_machine=CPU_MACHINE)
    assert exc.value.code == 130
    out = tmp_path / "out"
    first = _rows(out)
    assert [(int(r["m"]), int(r["n"]), int(r["k"])) for r in first] == TINY[:2]
    assert json.loads((out / "summary.json").read_text())["run"]["interrupted"] is True

    resumed = _sweep_cpu.NumpyRunner()
    sweep.run([*args, "--resume"], runner=resumed, cpu_machine=CPU_MACHINE)
    assert sorted({c[1:] for c in resumed.calls}) == sorted(TINY[2:])  # the first two were not run again
    rows = _rows(out)
    assert [(int(r["m"]), int(r["n"]), int(r["k"])) for r in rows] == TINY
    assert rows[:2] == first  # appended, not rewritten

    # A fresh run without --resume starts over and keeps the old file as .bak.
    again = _sweep_cpu.NumpyRunner()
    sweep.run(args, runner=again, cpu_machine=CPU_MACHINE)
    assert sorted({c[1:] for c in again.calls}) == sorted(TINY)
    assert len(_rows(out)) == len(TINY)
    assert (out / "results.csv.bak").exists()


def test_failed_shape_recorded_then_retried_on_resume(tmp_path):
    args = _args(tmp_path, "cpu", "--dtype", "fp8")
    bad = ("fp8", 16, 16, 40)
    sweep.run(args, runner=_sweep_cpu.NumpyRunner(fail_on=[bad]), cpu_machine=CPU_MACHINE)
    rows = _rows(tmp_path / "out")
    status = {(int(r["m"]), int(r["n"]), int(r["k"])): (r["status"], r["error"]) for r in rows}
    assert status[bad[1:]] == ("failed", f"RuntimeError: injected failure for {bad}")
    assert all(s == "ok" for shape, (s, _) in status.items() if shape != bad[1:])

    retry = _sweep_cpu.NumpyRunner()
    summary = sweep.run([*args, "--resume"], runner=retry, cpu_machine=CPU_MACHINE)
    assert {c[1:] for c in retry.calls} == {bad[1:]}
    # The retried row replaced the failed one in the file: one row per shape, every one ok, the others untouched.
    after = _rows(tmp_path / "out")
    assert sorted((int(r["m"]), int(r["n"]), int(r["k"])) for r in after) == sorted(TINY)
    assert all(r["status"] == "ok" and r["error"] == "" for r in after)
    assert [r for r in after if int(r["k"]) != 40] == [r for r in rows if int(r["k"]) != 40]
    assert summary["groups"]["cpu/fp8"]["ok"] == len(TINY)
    assert sorted(map(tuple, summary["run"]["shapes_run"])) == [bad]  # read before the file was rewritten


def test_interrupted_resume_still_ends_with_one_row_per_shape(tmp_path):
    """Two failed shapes; a resume retries the first (ok now) and is interrupted on the second: the file holds one
    row per shape, the first's new row and the second's old failure (retried by the next resume)."""
    args = _args(tmp_path, "cpu", "--dtype", "bf16")
    first, second = ("bf16", *TINY[0]), ("bf16", *TINY[1])
    sweep.run(args, runner=_sweep_cpu.NumpyRunner(fail_on=[first, second]), cpu_machine=CPU_MACHINE)
    with pytest.raises(SystemExit) as exc:
        sweep.run([*args, "--resume"], runner=_InterruptingRunner(2), cpu_machine=CPU_MACHINE)
    assert exc.value.code == 130
    status = {(int(r["m"]), int(r["n"]), int(r["k"])): r["status"] for r in _rows(tmp_path / "out")}
    assert len(_rows(tmp_path / "out")) == len(TINY) == len(status)
    assert status == {TINY[0]: "ok", TINY[1]: "failed", TINY[2]: "ok", TINY[3]: "ok"}
    sweep.run([*args, "--resume"], runner=_sweep_cpu.NumpyRunner(), cpu_machine=CPU_MACHINE)
    assert [r["status"] for r in _rows(tmp_path / "out")] == ["ok"] * len(TINY)


def test_compact_results_keeps_the_newest_row_per_key_as_written(tmp_path):
    path = tmp_path / "results.csv"
    cells = {c: "" for c in _sweep_csv.COLUMNS}

    def line(k, status, error="", time_us=""):
        row = {**cells, "mode": "cpu", "dtype": "bf16", "m": "8", "n": "8", "k": str(k), "status": status,
               "error": error, "time_us": time_us}
        return _sweep_csv.csv_line(row[c] for c in _sweep_csv.COLUMNS)

    header = _sweep_csv.csv_line(_sweep_csv.COLUMNS)
    path.write_text(header + line(32, "ok", time_us="1.50000") + line(64, "failed", 'RuntimeError: a, "b"')
                    + line(96, "ok") + line(64, "ok", time_us="2"))
    untouched = path.stat()
    assert _sweep_csv.compact_results(path) == 1
    kept = header + line(32, "ok", time_us="1.50000") + line(96, "ok") + line(64, "ok", time_us="2")
    assert path.read_bytes() == kept.encode()  # the kept rows byte for byte
    assert path.stat().st_ino != untouched.st_ino  # renamed over, not rewritten in place
    assert not list(tmp_path.glob(".results.csv.compact-*"))
    # Nothing to drop: the file is left alone; a row cut short by an interruption is dropped with the duplicates.
    before = path.stat()
    assert _sweep_csv.compact_results(path) == 0 and path.stat().st_ino == before.st_ino
    path.write_bytes(path.read_bytes() + (line(32, "failed") + line(96, "ok")[:20]).encode())
    assert _sweep_csv.compact_results(path) == 2
    assert [(r["k"], r["status"]) for r in _sweep_csv.read_results(path)] == [(96, "ok"), (64, "ok"), (32, "failed")]
    assert len(path.read_bytes().splitlines()) == 4


def test_shapes_that_do_not_fit_are_skipped_with_a_reason(tmp_path):
    runner = _sweep_cpu.NumpyRunner()
    sweep.run(_args(tmp_path, "cpu", "--dtype", "bf16"), runner=runner, cpu_machine=CPU_MACHINE,
              mem_available=lambda: 10 * 2**20)  # 10 MiB free: every shape's chunk allowance alone exceeds it
    rows = _rows(tmp_path / "out")
    assert len(rows) == len(TINY) and not runner.calls
    assert all(r["status"] == "skipped" and "GiB > budget" in r["error"] and r["time_us"] == "" for r in rows)
    # --max-mem-gb caps the budget the same way when memory is plentiful.
    sweep.run(_args(tmp_path, "cpu", "--dtype", "bf16", "--max-mem-gb", "0.001"), runner=runner,
              cpu_machine=CPU_MACHINE)
    assert {r["status"] for r in _rows(tmp_path / "out")} == {"skipped"}


def test_shape_memory_counts_operands_and_baseline_copies():
    m, n, k = 4096, 8192, 2048
    need = _sweep_cpu.shape_memory_bytes("bf16", m, n, k)
    core = 2 * (m + n) * k + 2 * m * n + 4 * (m + n) * k + 4 * m * n + 2 * m * n
    assert need >= core
    assert _sweep_cpu.shape_memory_bytes("fp8", m, n, k) < need  # 1-byte operands


def test_resume_refuses_another_target_and_another_schema(tmp_path):
    args = _args(tmp_path, "model", "--dtype", "bf16")
    sweep.run(args, estimator=_fake_estimate)
    with pytest.raises(SystemExit, match="use another --out"):
        sweep.run([*args, "--resume", "--arch", "950PR"], estimator=_fake_estimate)
    results = tmp_path / "out" / "results.csv"
    results.write_text("m,n,k,time\n1,2,3,4\n")
    with pytest.raises(ValueError, match="not the sweep's schema"):
        sweep.run([*args, "--resume"], estimator=_fake_estimate)


def test_resume_ignores_a_row_cut_short(tmp_path):
    args = _args(tmp_path, "model", "--dtype", "bf16")
    sweep.run(args, estimator=_fake_estimate)
    results = tmp_path / "out" / "results.csv"
    lines = results.read_text().splitlines()
    results.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:25])  # the last row half-written, no newline
    calls = []

    def counting(*a, **kw):
        calls.append(a[:3])
        return _fake_estimate(*a, **kw)

    sweep.run([*args, "--resume"], estimator=counting)
    assert calls == [TINY[2], TINY[3]]  # the failed K=40 row is retried, the cut-short row redone
    assert len(_sweep_csv.read_results(results)) == len(TINY)


def test_model_mode_num_ai_cores_scales_peak(tmp_path):
    sweep.run(_args(tmp_path, "model", "--dtype", "fp8", "--num-ai-cores", "16"), estimator=_fake_estimate)
    row = _rows(tmp_path / "out")[0]
    assert row["num_ai_cores"] == "16"
    assert float(row["peak_gflops"]) == pytest.approx(16 * 8192 * 2 * 1.65e9 / 1e9, rel=1e-5)


def test_quick_and_limit_selection():
    assert sweep.select_shapes(sweep.parse_args(["--quick"])) == sweep.shapes_mod.quick_shapes()
    assert len(sweep.select_shapes(sweep.parse_args([]))) == 1055
    assert sweep.select_shapes(sweep.parse_args(["--limit", "3"])) == sweep.shapes_mod.all_shapes()[:3]
    with pytest.raises(SystemExit):
        sweep.parse_args(["--quick", "--shapes", "x.txt"])
    with pytest.raises(SystemExit):
        sweep.parse_args(["--limit", "0"])


def test_help_lists_every_option(capsys):
    with pytest.raises(SystemExit) as exc:
        sweep.parse_args(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for option in ("--mode", "--dtype", "--quick", "--limit", "--shapes", "--out", "--resume", "--arch",
                   "--num-ai-cores", "--max-mem-gb"):
        assert option in text


def test_summary_best_and_median_over_all_and_compute_bound():
    def row(frac, bound):
        return {"mode": "model", "dtype": "bf16", "m": 1, "n": 1, "k": 1, "arch": "950DT", "num_ai_cores": 32,
                "status": "ok", "frac_peak": frac, "frac_attainable": frac,
                "gflops": None if frac is None else frac * 100,
                "compute_bound": bound, "peak_gflops": 100.0, "bandwidth_gbs": 1.0, "ridge": 100.0,
                "speedup": None, "calc_diff": None, "bound": "cube", "baseline_frac_peak": None,
                "baseline_gflops": None, "error": ""}

    rows = [row(0.2, 0), row(0.9, 1), row(0.5, 1), row(0.7, 1), row(0.1, 0)]
    rows.append({**row(None, 1), "status": "failed", "error": "RuntimeError: boom"})
    g = _sweep_report.summarize_group(rows)
    assert (g["shapes"], g["ok"], g["failed"]) == (6, 5, 1)
    assert g["all"]["best_frac_peak"] == 0.9 and g["all"]["median_frac_peak"] == 0.5
    assert g["compute_bound"]["count"] == 3 and g["compute_bound"]["median_frac_peak"] == 0.7
    text = _sweep_report.format_summary({"machine": {}, "groups": {"model/bf16": g}})
    assert "best 0.900  median 0.500" in text and "best 0.900  median 0.700  (n=3)" in text
    assert g["top_errors"] == {"failed: RuntimeError: boom": 1} and "1 x failed: RuntimeError: boom" in text


def test_calc_diff_chunks_match_one_pass(monkeypatch, rng):
    from deep_gemm.testing import numeric

    x = rng.standard_normal((37, 29)).astype(np.float32)
    y = x + 1e-3 * rng.standard_normal((37, 29)).astype(np.float32)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    one_pass = 1.0 - 2.0 * float(np.sum(x64 * y64)) / float(np.sum(x64 * x64 + y64 * y64))
    assert _sweep_cpu.calc_diff(x, y) == pytest.approx(one_pass, rel=1e-9)
    monkeypatch.setattr(numeric, "_CHUNK_ELEMS", 64)  # 17 chunks, the last one short
    assert _sweep_cpu.calc_diff(x, y) == pytest.approx(one_pass, rel=1e-9)
    assert _sweep_cpu.calc_diff(np.zeros((2, 2)), np.zeros((2, 2))) == 0.0


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_cases_and_baseline_follow_the_api_contract(dtype, rng):
    case = _sweep_cpu.make_case(dtype, 8, 24, 40, rng)
    assert case.a.shape == (8, 40) and case.b.shape == (24, 40) and case.d.shape == (8, 24)
    assert case.d.dtype == _sweep_cpu.BF16
    if dtype == "fp8":
        assert case.a.dtype == _sweep_cpu.FP8 and case.sfa.shape == (8, 2) and case.sfb.shape == (24, 2)
        exps = np.log2(case.sfa)
        assert np.array_equal(exps, np.round(exps))  # powers of two (UE8M0)
        a = case.a.astype(np.float64) * np.repeat(case.sfa, 32, axis=1)[:, :40]
        b = case.b.astype(np.float64) * np.repeat(case.sfb, 32, axis=1)[:, :40]
    else:
        assert case.a.dtype == _sweep_cpu.BF16 and case.sfa is None
        a, b = case.a.astype(np.float64), case.b.astype(np.float64)
    np.testing.assert_allclose(_sweep_cpu.baseline_product(case), a @ b.T, rtol=1e-5, atol=1e-5)


def _estimator_or_skip():
    import deep_gemm

    try:
        return deep_gemm.estimate_gemm
    except (ImportError, AttributeError) as e:
        pytest.skip(f"deep_gemm.estimate_gemm not available yet: {e}")


def test_model_mode_with_the_real_estimator(tmp_path):
    _estimator_or_skip()
    shapes = [(128, 7168, 2048), (4096, 4096, 4096), (256, 256, 256), (16384, 2112, 7168)]
    cmd = [sys.executable, str(BENCH / "sweep.py"), "--mode", "model", "--shapes",
           str(_shape_file(tmp_path, shapes)), "--out", str(tmp_path / "out"), "--no-progress"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = _rows(tmp_path / "out")
    assert len(rows) == 2 * len(shapes)
    for r in rows:
        assert r["status"] == "ok", r["error"]
        assert 0 < float(r["frac_peak"]) <= 1.0 and r["bound"] and "block_m=" in r["config"]
    assert "fraction of peak, compute-bound" in done.stdout
    assert (tmp_path / "out" / "fraction_vs_intensity.png").stat().st_size > 0


def test_cpu_mode_with_the_real_kernels(tmp_path):
    import deep_gemm

    try:
        deep_gemm.bf16_gemm_nt, deep_gemm.fp8_gemm_nt  # noqa: B018
        import deep_gemm.kernels.bf16_gemm  # noqa: F401
        import deep_gemm.kernels.fp8_gemm  # noqa: F401
    except (ImportError, AttributeError) as e:
        pytest.skip(f"deep_gemm's GEMMs not available yet: {e}")
    sweep.run(["--mode", "cpu", "--shapes", str(_shape_file(tmp_path, [(40, 24, 96)])),
               "--out", str(tmp_path / "out"), "--no-progress", "--no-plots", "--max-repeats", "3"],
              cpu_machine=CPU_MACHINE)
    rows = _rows(tmp_path / "out")
    assert [r["dtype"] for r in rows] == ["bf16", "fp8"]
    for r in rows:
        assert r["status"] == "ok", r["error"]
        assert float(r["calc_diff"]) < _sweep_report.CALC_DIFF_TOL[r["dtype"]]
        assert "block_m=" in r["config"] and float(r["time_us"]) > 0 and 2 <= int(r["repeats"]) <= 3
