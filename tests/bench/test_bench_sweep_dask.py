"""bench/sweep.py on a local Dask cluster (the "distributed" extra): the same rows as the single-process run, a
worker killed mid-shape, Ctrl-C on the client then --resume, and the error without the extra; plus the pieces the
cluster relies on: early-stopping repeats, the budget planner, the robust ceiling and the FMA peak."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import _sweep_ceiling  # noqa: E402
import _sweep_cpu  # noqa: E402
import _sweep_csv  # noqa: E402
import _sweep_plan  # noqa: E402
import _sweep_report  # noqa: E402
import sweep  # noqa: E402

PINNED = ["--ceiling-gflops", "100", "--bandwidth-gbs", "20"]  # no ceiling measurement in the plumbing tests
TINY = [(32, 32, 64), (64, 48, 96), (16, 16, 40), (8, 24, 32)]


def _shape_file(tmp_path: Path, shapes) -> Path:
    path = tmp_path / "shapes.txt"
    path.write_text("".join(f"{m} {n} {k}\n" for m, n, k in shapes))
    return path


def _raw_rows(out: Path) -> list[dict]:
    with open(out / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def _key(r: dict) -> tuple:
    return (r["dtype"], int(r["m"]), int(r["n"]), int(r["k"]))


def _distributed_or_fail():
    # NOTES: the README's test command installs the distributed extra, so a missing dask is a broken install here,
    # not a reason to skip.
    import distributed  # noqa: F401


# ---------------------------------------------------------------------------------------------------------------
# Done-when tests: cluster == single process, a dead worker, Ctrl-C + --resume, no extra
# ---------------------------------------------------------------------------------------------------------------

def test_local_cluster_rows_match_the_single_process_run(tmp_path):
    """--mode cpu --local-cluster 2 --limit 4 with the real kernels: the same (dtype, shape) rows as one process,
    every row ok, calc_diff within tolerance and equal (a shape's operands do not depend on where it ran)."""
    _distributed_or_fail()
    common = ["--mode", "cpu", "--limit", "4", "--no-progress", "--no-plots", "--max-repeats", "3", *PINNED]
    single = sweep.run([*common, "--out", str(tmp_path / "single")])
    cluster = sweep.run([*common, "--out", str(tmp_path / "cluster"), "--local-cluster", "2"])
    one = {_key(r): r for r in _raw_rows(tmp_path / "single")}
    many = {_key(r): r for r in _raw_rows(tmp_path / "cluster")}
    expected = {(d, *s) for d in ("bf16", "fp8") for s in sweep.shapes_mod.all_shapes()[:4]}
    assert set(one) == set(many) == expected
    assert len(_raw_rows(tmp_path / "cluster")) == len(expected)  # each row once
    for key, row in many.items():
        assert row["status"] == "ok" and one[key]["status"] == "ok", (row["error"], one[key]["error"])
        diff = float(row["calc_diff"])
        assert diff < _sweep_report.CALC_DIFF_TOL[key[0]]
        assert diff == pytest.approx(float(one[key]["calc_diff"]), rel=1e-6, abs=1e-12)
        assert row["config"] == one[key]["config"] and "block_m=" in row["config"]
        assert row["host"] and row["cpu_model"] and 1 <= int(row["repeats"]) <= 3
    workers = cluster["machine"]["cpu"]["workers"]
    assert cluster["machine"]["cpu"]["backend"] == "dask" and sum(w["shapes"] for w in workers.values()) == 8
    assert sorted(map(tuple, cluster["run"]["shapes_run"])) == sorted(expected)
    assert single["run"]["backend"] == "single process"


def test_worker_killed_mid_shape_every_row_exactly_once(tmp_path):
    """A worker process SIGKILLs itself inside a shape's timed call; Dask reruns the shape on a live worker and the
    file ends with each (dtype, shape) exactly once, all ok."""
    _distributed_or_fail()
    marker = tmp_path / "killed.pid"
    victim = ("bf16", 64, 48, 96)
    runner = _sweep_cpu.NumpyRunner(die_once_on=victim, die_marker=str(marker))
    out = tmp_path / "out"
    summary = sweep.run(["--mode", "cpu", "--shapes", str(_shape_file(tmp_path, TINY)), "--out", str(out),
                         "--local-cluster", "2", "--no-progress", "--no-plots", *PINNED], runner=runner)
    assert marker.exists()  # a worker did die mid-shape
    killed_pid = int(marker.read_text())
    rows = _raw_rows(out)
    keys = [_key(r) for r in rows]
    assert sorted(keys) == sorted((d, *s) for d in ("bf16", "fp8") for s in TINY)  # no duplicate, none missing
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows]
    assert killed_pid != os.getpid()  # the worker died, not this client
    assert sorted(map(tuple, summary["run"]["shapes_run"])) == sorted(keys)


def test_ctrl_c_on_the_client_keeps_rows_and_resume_finishes(tmp_path):
    """Ctrl-C at a terminal (SIGINT to the client's whole process group, local workers included) mid-sweep: exit
    130, rows written so far kept, not a line of Dask's logs on stderr, no process left behind; --resume (on the
    cluster again) runs only the rest, and the file ends with every key once.

    NOTES: independent of the machine's load: the runner lets exactly two shapes finish and holds every later one
    forever, so the interrupt lands mid-sweep with two rows written however slow the machine is, and the cluster
    has to close workers busy in a shape (their nannies kill them). The time limits only bound a hang."""
    _distributed_or_fail()
    shapes = [(64, 64, 32 * i) for i in range(1, 7)]
    out, hold = tmp_path / "out", tmp_path / "hold"
    hold.mkdir()
    argv = ["--mode", "cpu", "--dtype", "bf16", "--shapes", str(_shape_file(tmp_path, shapes)), "--out", str(out),
            "--local-cluster", "2", "--no-plots", "--no-progress", *PINNED]
    driver = ("import sys; sys.path.insert(0, sys.argv[1]); import sweep, _sweep_cpu; "
              "sweep.run(sys.argv[3:], runner=_sweep_cpu.NumpyRunner(hold_after=2, hold_dir=sys.argv[2]))")
    proc = subprocess.Popen([sys.executable, "-c", driver, str(BENCH), str(hold), *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 600
        while time.time() < deadline and proc.poll() is None:
            if list(hold.glob("held-*")) and (out / "results.csv").exists() and len(_raw_rows(out)) >= 2:
                break  # two rows written and a worker busy in a shape that never ends
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=600)
        deadline = time.time() + 600
        while time.time() < deadline:  # the cluster's processes are gone too
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"processes of the interrupted sweep are still running; stderr: {err[-2000:]}")
    finally:
        try:  # the leader and whatever of its group (the local cluster's processes) is left
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "rerun with --resume" in err, err[-3000:]
    for noise in ("Traceback", "distributed.", "tornado", " - ERROR - ", " - WARNING - "):
        assert noise not in err, err[-3000:]
    first = _raw_rows(out)
    assert len(first) == 2 and len({_key(r) for r in first}) == 2, err[-2000:]
    assert all(r["status"] == "ok" for r in first)
    interrupted = json.loads((out / "summary.json").read_text())["run"]
    assert interrupted["interrupted"] is True, err[-2000:]
    assert sorted(map(tuple, interrupted["shapes_run"])) == sorted(_key(r) for r in first)

    resumed = subprocess.run([sys.executable, str(BENCH / "sweep.py"), *argv, "--runner", "numpy", "--resume"],
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    rows = _raw_rows(out)
    assert rows[: len(first)] == first  # appended, not rewritten
    assert sorted(_key(r) for r in rows) == sorted(("bf16", *s) for s in shapes)
    ran = json.loads((out / "summary.json").read_text())["run"]["shapes_run"]
    assert sorted(map(tuple, ran)) == sorted(set(("bf16", *s) for s in shapes) - {_key(r) for r in first})


def test_a_closing_cluster_is_quiet(tmp_path, capfd):
    """Dask's records reach stderr while the sweep runs and are dropped once the client starts closing: in a local
    worker (its flag file present) and in the client (its filter's closing flag), whatever the timing."""
    _distributed_or_fail()
    import logging

    import _sweep_dask

    flag = tmp_path / "closing"
    client, cluster = _sweep_dask.connect(None, 1, quiet_flag=str(flag))
    try:
        def log(message):
            logging.getLogger("distributed.worker").error(message)

        client.run(log, "worker-before-closing")
        flag.touch()
        client.run(log, "worker-after-closing")
    finally:
        client.close()
        cluster.close()
    err = capfd.readouterr().err
    assert "worker-before-closing" in err and "worker-after-closing" not in err, err[-2000:]

    quiet = _sweep_dask.install_quiet_filter()
    try:
        def record(name):
            return logging.LogRecord(name, logging.ERROR, __file__, 1, "heartbeat failed", None, None)

        assert quiet.filter(record("distributed.worker")) and quiet.filter(record("deep_gemm"))
        quiet.closing = True
        assert not quiet.filter(record("distributed.worker")) and not quiet.filter(record("tornado.application"))
        assert quiet.filter(record("deep_gemm")) and quiet.filter(record("sweep"))  # only Dask's loggers
        assert all(quiet in h.filters for h in logging.getLogger("distributed").handlers)
    finally:
        _sweep_dask.remove_quiet_filter(quiet)
    assert not any(quiet in h.filters for h in logging.getLogger("distributed").handlers)


def test_resume_across_backends(tmp_path):
    """Rows from a single-process run count on the cluster and the other way round: same file, no rerun."""
    _distributed_or_fail()
    out = tmp_path / "out"
    args = ["--mode", "cpu", "--dtype", "fp8", "--shapes", str(_shape_file(tmp_path, TINY)), "--out", str(out),
            "--no-progress", "--no-plots", *PINNED]
    sweep.run([*args, "--limit", "2"], runner=_sweep_cpu.NumpyRunner())
    summary = sweep.run([*args, "--resume", "--local-cluster", "1"], runner=_sweep_cpu.NumpyRunner())
    assert sorted(map(tuple, summary["run"]["shapes_run"])) == sorted(("fp8", *s) for s in TINY[2:])
    again = _sweep_cpu.NumpyRunner()
    sweep.run([*args, "--resume"], runner=again)
    assert again.calls == []
    assert sorted(_key(r) for r in _raw_rows(out)) == sorted(("fp8", *s) for s in TINY)


def test_scheduler_without_the_extra_names_it_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match=r'"distributed" extra: pip install -e "\.\[distributed\]"'):
        sweep.run(["--mode", "cpu", "--shapes", str(_shape_file(tmp_path, TINY)), "--out", str(out),
                   "--scheduler", "tcp://127.0.0.1:8786", "--no-progress"], runner=_sweep_cpu.NumpyRunner())
    assert not out.exists()


def test_default_path_never_imports_dask(tmp_path):
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import sweep; "
            "sweep.run(sys.argv[2:]); "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')); "
            "assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", code, str(BENCH), "--mode", "cpu", "--runner", "numpy",
                           "--shapes", str(_shape_file(tmp_path, TINY[:2])), "--out", str(tmp_path / "out"),
                           "--no-progress", "--no-plots", *PINNED], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_cluster_options_are_checked():
    for bad in (["--scheduler", "tcp://x:1", "--local-cluster", "2", "--mode", "cpu"],
                ["--local-cluster", "0", "--mode", "cpu"], ["--local-cluster", "2", "--mode", "model"],
                ["--spread-tol", "-0.1"], ["--budget-hours", "0"]):
        with pytest.raises(SystemExit):
            sweep.parse_args(bad)
    text = sweep.build_parser().format_help()
    for option in ("--scheduler", "--local-cluster", "--worker-cache-dir", "--spread-tol", "--budget-hours",
                   "--plan-only", "--target-seconds"):
        assert option in text


# ---------------------------------------------------------------------------------------------------------------
# Early-stopping repeats
# ---------------------------------------------------------------------------------------------------------------

def _scripted_timer(monkeypatch, ours: list[float], theirs: list[float]):
    """Replace _sweep_cpu._timed: calls alternate stand-in, baseline and return the scripted times."""
    seq = iter([t for pair in zip(ours, theirs, strict=True) for t in pair])

    def fake(fn):
        fn()
        return next(seq)

    monkeypatch.setattr(_sweep_cpu, "_timed", fake)


@pytest.mark.parametrize(("ours", "theirs", "kw", "repeats", "why"), [
    ([1.00, 1.01, 9, 9], [2.00, 2.02, 9, 9], {}, 2, "spread"),                      # agree at once: stop at 2
    ([1.0, 1.5, 1.2, 1.21] + [9] * 6, [1] * 10, {"target_s": 100}, 10, "max_repeats"),  # never within 5 %
    ([0.3, 0.6, 0.45, 0.9], [0.5, 0.5, 0.5, 0.5], {"target_s": 1.0}, 3, "budget"),  # 1.35 s timed: over budget
    ([5.0, 5.0], [7.0, 9.0], {"min_repeats": 1, "target_s": 1.0}, 1, "budget"),     # long shape: one run each
])
def test_repeats_stop_on_spread_budget_or_max(monkeypatch, rng, ours, theirs, kw, repeats, why):
    _scripted_timer(monkeypatch, ours + [9.0] * 10, theirs + [9.0] * 10)
    case = _sweep_cpu.make_case("bf16", 8, 16, 32, rng)
    timing = _sweep_cpu.time_shape(_sweep_cpu.NumpyRunner(), case, **{"min_repeats": 2, "max_repeats": 10, **kw})
    assert (timing.repeats, timing.stopped_by) == (repeats, why)
    if repeats == 1:
        assert timing.spread is None
    else:
        expected = max(_sweep_cpu.relative_spread(ours[:repeats]), _sweep_cpu.relative_spread(theirs[:repeats]))
        assert timing.spread == pytest.approx(expected)
    assert timing.calc_diff < 1e-5


@pytest.mark.parametrize("light", [False, True])
def test_light_warmup_replaces_the_untimed_run_of_long_shapes(monkeypatch, rng, light):
    _scripted_timer(monkeypatch, [5.0], [7.0])
    runner = _sweep_cpu.NumpyRunner()
    waits = []  # (runs, builds) when time_shape waits for background native links: after the warm-up, untimed
    monkeypatch.setattr("deep_gemm.jit.compile.wait_native_builds",
                        lambda: waits.append((len(runner.calls), len(runner.builds))))
    case = _sweep_cpu.make_case("bf16", 300, 16, 32, rng)
    case.d[...] = 1.0
    gflop = 2 * 300 * 16 * 32 / 1e9
    timing = _sweep_cpu.time_shape(runner, case, min_repeats=1, target_s=1.0,
                                   light_warmup_gflop=gflop if light else gflop * 1.01)
    assert timing.repeats == 1 and timing.calc_diff < 1e-5
    # light: the kernel built in the process, no untimed run; else one untimed run before the timed one
    assert runner.builds == ([("bf16", 300, 16, 32)] if light else [])
    assert runner.calls == [("bf16", 300, 16, 32)] * (1 if light else 2)
    assert waits == ([(0, 1)] if light else [(1, 0)])
    task = ("bf16", 4096, 4096, 4096)
    rates = _sweep_plan.DEFAULT_RATES_GFLOPS
    full = _sweep_plan.shape_seconds(task, rates, min_repeats=1, max_repeats=10, target_s=0.5)
    cut = _sweep_plan.shape_seconds(task, rates, min_repeats=1, max_repeats=10, target_s=0.5, light_warmup_gflop=50)
    per_pair = 2 * 4096**3 / 1e9 * (1 / rates["stand_in"] + 1 / rates["baseline"])
    assert full - cut == pytest.approx(per_pair - _sweep_plan.LIGHT_WARMUP_S)


def test_rows_record_repeats_spread_and_over_peak(tmp_path):
    out = tmp_path / "out"
    sweep.run(["--mode", "cpu", "--dtype", "bf16", "--runner", "numpy", "--shapes", str(_shape_file(tmp_path, TINY)),
               "--out", str(out), "--no-progress", "--no-plots", "--ceiling-gflops", "1e-6", "--bandwidth-gbs", "1"])
    for r in _raw_rows(out):
        assert 2 <= int(r["repeats"]) <= 10 and float(r["spread"]) >= 0
        assert r["over_peak"] == "1"  # a 1 kFLOP/s ceiling: every row is above it, and says so
        assert r["host"] == _sweep_ceiling.machine_identity()["host"]
    text = _sweep_report.format_summary(json.loads((out / "summary.json").read_text()))
    assert "WARNING: 4 shapes above the peak (over_peak=1 in their rows)" in text
    assert "CPU shapes run this time (4, single process): bf16 32x32x64, bf16 64x48x96" in text


# ---------------------------------------------------------------------------------------------------------------
# Planning: kernel groups and --budget-hours
# ---------------------------------------------------------------------------------------------------------------

def _cost(task):
    return _sweep_plan.shape_seconds(task, _sweep_plan.DEFAULT_RATES_GFLOPS, min_repeats=2, max_repeats=10,
                                     target_s=0.5)


def _nk_key(task):
    return (task[0], task[2], task[3])


def test_budget_plan_is_stratified_fits_and_is_deterministic():
    tasks = [("bf16", *s) for s in sweep.shapes_mod.all_shapes()]
    total = _sweep_plan.estimate_total(tasks, _cost, _nk_key)
    assert total["kernels"] == len({_nk_key(t) for t in tasks})
    plan = _sweep_plan.plan_budget(tasks, 3600, _cost, _nk_key)
    chosen = plan["tasks"]
    assert 0 < len(chosen) < len(tasks) and plan["estimated_s"] <= 3600
    assert _sweep_plan.estimate_total(chosen, _cost, _nk_key)["seconds"] == pytest.approx(plan["estimated_s"])
    strata = {_sweep_plan.stratum(t) for t in tasks}
    assert plan["strata"] == len(strata)
    # Every stratum whose cheapest shape fits on its own is represented.
    cheap = {s for s in strata
             if min(_cost(t) for t in tasks if _sweep_plan.stratum(t) == s) + _sweep_plan.DEFAULT_COMPILE_S < 30}
    assert cheap <= {_sweep_plan.stratum(t) for t in chosen}
    assert chosen == [t for t in tasks if t in set(chosen)]  # in the selection's order
    assert _sweep_plan.plan_budget(tasks, 3600, _cost, _nk_key)["tasks"] == chosen
    # Twice the machines, about twice the work; an ample budget takes everything.
    two = _sweep_plan.plan_budget(tasks, 3600, _cost, _nk_key, workers=2)
    assert plan["estimated_s"] < two["estimated_s"] <= 7200
    everything = _sweep_plan.plan_budget(tasks, total["seconds"] + 1, _cost, _nk_key)
    assert everything["tasks"] == tasks and everything["dropped"] == 0


def test_kernel_groups_and_fitted_rates():
    tasks = [("bf16", 128, 256, 512), ("bf16", 64, 256, 512), ("fp8", 128, 256, 512), ("bf16", 128, 512, 512)]
    groups = _sweep_plan.kernel_groups(tasks, _nk_key)
    assert list(groups.values()) == [tasks[:2], [tasks[2]], [tasks[3]]]
    rows = [{"mode": "cpu", "dtype": "bf16", "status": "ok", "gflops": g, "baseline_gflops": 2 * g}
            for g in (10.0, 30.0, 20.0)] + [{"mode": "cpu", "dtype": "fp8", "status": "failed", "gflops": None,
                                              "baseline_gflops": None}]
    assert _sweep_plan.fit_rates(rows) == {"bf16": {"stand_in": 20.0, "baseline": 40.0, "rows": 3}}


def test_budget_run_says_so_in_the_summary(tmp_path):
    out = tmp_path / "out"
    shapes = [(256 * a, 256 * b, 256 * c) for a in (1, 4, 16) for b in (1, 4) for c in (1, 8)]
    summary = sweep.run(["--mode", "cpu", "--dtype", "bf16", "--runner", "numpy", "--no-progress", "--no-plots",
                         "--shapes", str(_shape_file(tmp_path, shapes)), "--out", str(out), "--budget-hours", "0.0002",
                         "--repeats", "1", "--max-repeats", "1", *PINNED])
    plan = summary["run"]["plan"]
    ran = [tuple(t) for t in summary["run"]["shapes_run"]]
    assert 0 < plan["planned"] == len(ran) < len(shapes) and plan["selected"] == len(shapes)
    assert sorted(_key(r) for r in _raw_rows(out)) == sorted(ran)
    text = _sweep_report.format_summary(summary)
    assert f"planned {len(ran)} of the {len(shapes)} pending (dtype, shape) runs, a stratified subset" in text


def test_plan_only_estimates_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    got = sweep.run(["--mode", "cpu", "--dtype", "bf16", "--runner", "numpy", "--out", str(out), "--plan-only",
                     "--budget-hours", "0.5"])
    assert got == {"plan_only": True} and not out.exists()
    err = capsys.readouterr().err
    tasks = [("bf16", *s) for s in sweep.shapes_mod.all_shapes()]
    def cost(task):
        return _sweep_plan.shape_seconds(task, _sweep_plan.DEFAULT_RATES_GFLOPS, min_repeats=2, max_repeats=10,
                                         target_s=0.5, light_warmup_gflop=_sweep_plan.LIGHT_WARMUP_GFLOP)

    hours = _sweep_plan.estimate_total(tasks, cost, lambda t: t, compile_s=0.0)["seconds"] / 3600
    assert f"plan: 1055 (dtype, shape) runs, 1055 kernels; estimated {hours:.2f} h on one machine" in err
    assert "budget 0.5 h on 1 machine(s):" in err and "fp8" not in err


# ---------------------------------------------------------------------------------------------------------------
# The ceiling
# ---------------------------------------------------------------------------------------------------------------

def test_ceiling_waits_for_low_load_and_keeps_the_best_sample():
    loads = iter([3.0, 2.5, 0.2, 0.1, 5.0, 5.0, 5.0, 5.0])
    slept = []
    samples = iter([{64: 50.0, 128: 80.0}, {64: 60.0, 128: 70.0}, {64: 10.0, 128: 20.0}])
    got = _sweep_ceiling.measure_ceiling([64, 128], samples=3, load_threshold=1.0, max_wait_s=2.0,
                                         sample_fn=lambda sizes: next(samples), load=lambda: next(loads),
                                         sleep=slept.append)
    assert got["peak_gflops"] == 80.0 and got["samples"] == [80.0, 70.0, 20.0]
    assert got["per_size"] == {64: 60.0, 128: 80.0}
    # waited through 3.0 and 2.5 for the first sample (2 s: the whole budget), none for the others.
    assert got["loads"] == [0.2, 0.1, 5.0] and slept == [1.0, 1.0]
    with pytest.raises(ValueError, match="samples=0"):
        _sweep_ceiling.measure_ceiling([64], samples=0)


def test_real_ceiling_fma_peak_and_identity():
    per_size = _sweep_ceiling.numpy_ceiling_sample([128, 256], repeats=1)
    assert set(per_size) == {128, 256} and all(g > 0 for g in per_size.values())
    fma = _sweep_ceiling.measure_fma_peak(seconds=0.002, repeats=3)
    assert fma["threads"] >= 1 and fma["vector_bits"] in (128, 256, 512)
    assert 0 < fma["fma_peak_one_thread_gflops"] and 0 < fma["fma_peak_gflops"] < 1e6
    ident = _sweep_ceiling.machine_identity()
    assert ident["host"] and ident["cpu_model"] and ident["cpu_count"] >= 1


def test_worker_cache_dir_choice(monkeypatch, tmp_path):
    import _sweep_dask

    assert _sweep_dask.worker_cache_dir(str(tmp_path), "h", "w")[1].startswith("shared")
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "own"))
    assert _sweep_dask.worker_cache_dir(None, "h", "w") == (str(tmp_path / "own"), "the worker's DG_JIT_CACHE_DIR")
    monkeypatch.delenv("DG_JIT_CACHE_DIR")
    path, how = _sweep_dask.worker_cache_dir(None, "host.x", "tcp://10.0.0.1:4000")
    assert how == "per worker" and Path(path).name == "host.x-tcp_10.0.0.1_4000"
    assert _sweep_dask.worker_cache_dir(None, "host.x", "1")[0] != path


def test_an_unusable_worker_cache_dir_is_refused_before_the_sweep_starts(tmp_path, capsys, monkeypatch):
    """--worker-cache-dir that a worker cannot create or write (here: a file, a path under a file) is refused with
    the option and the path named, before any shape runs: on the client for a local cluster, on every worker for
    --scheduler, on a worker that joins later at its first task; deep_gemm's fallback to the user cache never
    happens. Without a cluster, or relative with --scheduler, the option is an argument error."""
    _distributed_or_fail()
    import _sweep_dask

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for bad in (blocker, blocker / "sub"):
        assert _sweep_dask.cache_dir_problem(str(bad)), bad
    assert _sweep_dask.cache_dir_problem(str(tmp_path / "new" / "root")) is None
    assert (tmp_path / "new" / "root" / "tmp").is_dir() and not list((tmp_path / "new" / "root" / "tmp").iterdir())

    for argv, why in ((["--mode", "cpu", "--worker-cache-dir", str(tmp_path)], "needs --scheduler or --local-cluster"),
                      (["--mode", "cpu", "--scheduler", "tcp://127.0.0.1:1", "--worker-cache-dir", "rel/dir"],
                       "must be an absolute path")):
        with pytest.raises(SystemExit):
            sweep.parse_args(argv)
        err = capsys.readouterr().err
        assert f"--worker-cache-dir {argv[-1]}: " in err and why in err, err

    out = tmp_path / "out"
    common = ["--mode", "cpu", "--dtype", "bf16", "--shapes", str(_shape_file(tmp_path, TINY)), "--out", str(out),
              "--no-progress", "--no-plots", *PINNED, "--worker-cache-dir", str(blocker / "sub")]
    runner = _sweep_cpu.NumpyRunner()
    with pytest.raises(ValueError, match=rf"--worker-cache-dir {blocker / 'sub'}: not usable .*Not a directory"):
        sweep.run([*common, "--local-cluster", "1"], runner=runner)
    assert not out.exists() and runner.calls == []

    from distributed import LocalCluster

    with _sweep_dask._sigint_ignored():
        cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, resources={"timing": 1},
                               dashboard_address=None)
    try:
        with pytest.raises(ValueError, match=r"--worker-cache-dir .*a-file/sub: not usable as the kernel cache of "
                                             r"1 of 1 workers \(worker tcp://"):
            sweep.run([*common, "--scheduler", cluster.scheduler_address], runner=runner)
    finally:
        cluster.close()
    assert _raw_rows(out) == [] and runner.calls == []  # the header only: no shape ran

    monkeypatch.setattr(_sweep_dask, "_WORKER", {})
    monkeypatch.setenv("DG_JIT_CACHE_DIR", os.environ["DG_JIT_CACHE_DIR"])
    before = os.environ["DG_JIT_CACHE_DIR"]
    with pytest.raises(ValueError, match=r"--worker-cache-dir .*a-file/sub: not usable .* on worker w7 "):
        _sweep_dask._worker_setup({"token": "t", "worker_cache_dir": str(blocker / "sub")}, "w7")
    assert os.environ["DG_JIT_CACHE_DIR"] == before  # refused before the worker's cache was switched


def test_workers_on_one_host_share_one_measurement_per_sweep(monkeypatch, tmp_path):
    import tempfile

    import _sweep_dask

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(_sweep_dask, "_WORKER", {})
    monkeypatch.setenv("DG_JIT_CACHE_DIR", os.environ["DG_JIT_CACHE_DIR"])  # restored after the test
    calls = []

    def fake_measure(**kw):
        calls.append(kw)
        return {"host": "h", "cpu_model": "c", "peak_gflops": 50.0 + len(calls), "bandwidth_gbs": 5.0}

    monkeypatch.setattr(_sweep_ceiling, "measure_machine", fake_measure)
    first = _sweep_dask._worker_setup({"token": "t1"}, "0")
    assert first["measured_by"] == "this worker" and first["peak_gflops"] == 51.0
    assert _sweep_dask._worker_setup({"token": "t1"}, "0") is first  # once per process and sweep
    monkeypatch.setattr(_sweep_dask, "_WORKER", {})  # another worker process on the same host
    second = _sweep_dask._worker_setup({"token": "t1"}, "1")
    assert second["measured_by"] == "another worker on this host" and second["peak_gflops"] == 51.0
    third = _sweep_dask._worker_setup({"token": "t2"}, "1")  # the next sweep measures again
    assert third["measured_by"] == "this worker" and third["peak_gflops"] == 52.0 and len(calls) == 2


def test_schema_has_the_new_columns_parsed():
    for col in ("spread", "over_peak", "host", "cpu_model"):
        assert col in _sweep_csv.COLUMNS
    row = _sweep_csv.parse_row({c: "" for c in _sweep_csv.COLUMNS} | {"spread": "0.02", "over_peak": "1",
                                                                       "host": "h"})
    assert row["spread"] == 0.02 and row["over_peak"] == 1 and row["host"] == "h"
    assert os.environ.get("DG_JIT_CACHE_DIR")  # the conftest's session cache, inherited by local-cluster workers
