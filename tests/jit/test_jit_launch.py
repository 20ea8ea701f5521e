"""The core launcher's contract: every logical core runs exactly once per launch (claimed by whichever thread comes
first, the caller never waiting for a worker to start), a launch completes before it returns or raises (Ctrl-C
included), the pool survives errors and interrupts, and several Python threads may launch at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from deep_gemm.jit import launch


@pytest.fixture
def two_threads(monkeypatch):
    monkeypatch.setattr(launch, "num_threads", lambda: 2)
    # every launch threaded (no shape is short enough to be tried on the caller alone): these tests' entries wait
    # for a worker
    monkeypatch.setattr(launch, "_SOLO_PROBE_S", 0.0)


_claim_lock = threading.Lock()


def _claim(cores) -> int:
    """A Python entry's core claim (the kernels' is an atomic add, jit/cruntime.py claim_core)."""
    with _claim_lock:
        core = int(cores[0])
        cores[0] = core + 1
        return core


def test_every_core_runs_once_and_workers_take_part(two_threads):
    seen = []
    lock = threading.Lock()
    both = threading.Barrier(2, timeout=60)

    def entry(out, cores):
        # NOTES: each call waits for the other before claiming, so the caller cannot claim every core: a worker
        # must take part, however loaded the machine (a fixed sleep flaked under load)
        both.wait()
        while (core := _claim(cores)) < 8:
            with lock:
                seen.append((core, threading.get_ident()))
            out[core] += 1
            time.sleep(0.001)

    out = np.zeros(8, np.int64)
    caller = threading.get_ident()
    for _ in range(5):
        seen.clear()
        launch.LAUNCHER.launch(entry, 8, (out,))
        assert sorted(c for c, _ in seen) == list(range(8))
        # the caller and a pool worker (which worker: the pool may hold more, e.g. after a cancellable launch)
        threads = {t for _, t in seen}
        assert len(threads) == 2 and caller in threads
    assert out.tolist() == [5] * 8


def test_the_caller_claims_every_core_when_no_worker_comes(two_threads, monkeypatch):
    # A worker that has not woken yet (here: its queue delivers nothing) never delays a launch: the caller claims
    # every core, then takes the worker's part too, whose call of the entry is skipped (no core is left), and
    # returns without blocking on the job's lock (_Job.wait failing proves it).
    calls, held = [], []

    def never(self):
        raise AssertionError("the launch blocked on its lock")

    class Asleep:  # the pool's queue as seen by a worker that never wakes
        def put(self, job):
            held.append(job)

    def entry(out, cores):
        calls.append(threading.get_ident())
        while (core := _claim(cores)) < 6:
            out[core] += 1
        cores[1] += 1  # the kernels' finish_part

    out = np.zeros(6, np.int64)
    launch.LAUNCHER._ensure(1)  # the pool's workers exist already (and keep reading the real queue)
    monkeypatch.setattr(launch.LAUNCHER, "_jobs", Asleep())
    monkeypatch.setattr(launch._Job, "wait", never)
    launch.LAUNCHER.launch(entry, 6, (out,))
    assert out.tolist() == [1] * 6 and calls == [threading.get_ident()]
    assert len(held) == 1 and held[0].claim() == -1 and held[0].args == ()  # a worker waking now drops the job


def test_finished_entries_end_the_launch_without_blocking(two_threads, monkeypatch):
    # Entries count themselves finished in cores[1] (the kernels' finish_part): once every call has, the caller
    # returns without blocking on the job's lock (a blocked thread is woken late on some VMs), with a worker taking
    # part. _Job.wait failing proves the lock was never waited for.
    lock = threading.Lock()
    both = threading.Barrier(2, timeout=60)
    seen = set()

    def entry(out, cores):
        both.wait()
        with lock:
            seen.add(threading.get_ident())
        while (core := _claim(cores)) < 4:
            out[core] += 1
        with lock:
            cores[1] += 1  # the kernels' atomic finish_part

    def never(self):
        raise AssertionError("the launch blocked on its lock")

    monkeypatch.setattr(launch, "_WATCH_S", 30.0)  # however loaded the machine
    monkeypatch.setattr(launch._Job, "wait", never)
    out = np.zeros(4, np.int64)
    caller = threading.get_ident()
    for _ in range(3):
        seen.clear()
        launch.LAUNCHER.launch(entry, 4, (out,))
        # the caller and a pool worker (which worker: the pool may hold more, e.g. after a cancellable launch)
        assert len(seen) == 2 and caller in seen
    assert out.tolist() == [3] * 4


def test_an_error_in_a_part_reaches_the_caller_after_every_part_finished(two_threads):
    finished = []
    calls = []
    lock = threading.Lock()

    def entry(cores):
        with lock:
            first = not calls
            calls.append(1)
        if first:
            raise KeyboardInterrupt  # as if Ctrl-C surfaced inside the first call
        time.sleep(0.1)
        finished.append(1)

    for _ in range(3):
        with pytest.raises(KeyboardInterrupt):
            launch.LAUNCHER.launch(entry, 4, ())
        assert finished == [1]  # the other call had completed before the launch raised
        finished.clear()
        calls.clear()
    out = np.zeros(2, np.int64)

    def fill(o, cores):
        while (core := _claim(cores)) < 2:
            o[core] = core + 10

    launch.LAUNCHER.launch(fill, 2, (out,))
    assert out.tolist() == [10, 11]  # the pool survived


def test_launches_from_several_python_threads_all_complete(two_threads):
    results = {}

    def entry(out, tag, cores):
        while (core := _claim(cores)) < 2:
            time.sleep(0.005)
            out[core] = tag * 10 + core

    def caller(tag):
        out = np.full(2, -1, np.int64)
        for _ in range(20):
            out[:] = -1
            launch.LAUNCHER.launch(entry, 2, (out, tag))
            if out.tolist() != [tag * 10, tag * 10 + 1]:
                results[tag] = out.tolist()
                return
        results[tag] = "ok"

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == {t: "ok" for t in range(4)}


def test_gemms_from_two_python_threads_are_bitwise_right():
    import deep_gemm
    from deep_gemm.utils import per_token_cast_to_fp8

    rng = np.random.default_rng(1)
    a = per_token_cast_to_fp8(rng.standard_normal((48, 128), dtype=np.float32), use_ue8m0=True, gran_k=32)
    b = per_token_cast_to_fp8(rng.standard_normal((64, 128), dtype=np.float32), use_ue8m0=True, gran_k=32)
    expected = np.empty((48, 64), ml_dtypes.bfloat16)
    deep_gemm.fp8_gemm_nt(a, b, expected)
    bad = []

    def caller():
        d = np.empty_like(expected)
        for _ in range(30):
            d.fill(0)
            deep_gemm.fp8_gemm_nt(a, b, d)
            if not (d.view(np.uint16) == expected.view(np.uint16)).all():
                bad.append(1)

    threads = [threading.Thread(target=caller) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not bad


def test_ctrl_c_during_gemms_never_tears_an_output_nor_hangs(session_cache_dir):
    """Timed SIGINTs land at random points of FP8 GEMM launches; after each, the interrupted output is untouched or
    complete and the next GEMM is exactly right. A hang is the timeout (before the fix: a torn output within a few
    dozen interrupts, then a dead pool thread and a launch waiting forever)."""
    child = Path(__file__).with_name("sigint_child.py")
    env = {**os.environ, "DG_JIT_CACHE_DIR": session_cache_dir}
    proc = subprocess.run([sys.executable, str(child), "200"], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["interrupted"] > 0
    assert result["torn"] == 0 and result["wrong_after"] == 0, result
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


# --- short launch shapes on the caller alone (launch.py's _SOLO_PROBE_S NOTES) ---------------------------------------


@pytest.fixture
def learning(monkeypatch):
    """Two threads, a fresh table of learned shapes and a fake clock: a threaded launch of the test's entry takes
    cost["threaded"] s, one on the caller alone cost["solo"] s. ``ways`` records each launch: "T" (threaded) or "S"
    (the caller alone); ``ran`` the threads that ran its cores."""
    monkeypatch.setattr(launch, "num_threads", lambda: 2)
    monkeypatch.setattr(launch.LAUNCHER, "_ways", {})
    now = [0.0]
    monkeypatch.setattr(launch, "_clock", lambda: now[0])
    cost = {"threaded": 50e-6, "solo": 17e-6}
    ways, ran, in_threaded = [], [], []
    original = launch.CoreLauncher._launch_threaded

    def threaded(self, *args):
        ways.append("T")
        in_threaded.append(1)
        try:
            original(self, *args)
        finally:
            in_threaded.pop()
        now[0] += cost["threaded"]

    monkeypatch.setattr(launch.CoreLauncher, "_launch_threaded", threaded)

    def entry(out, n, cores):
        if not in_threaded:
            ways.append("S")
            now[0] += cost["solo"]
        while (core := _claim(cores)) < out.size:
            ran.append(threading.get_ident())
            out[core] += n
        with _claim_lock:
            cores[1] += 1  # the kernels' finish_part

    return {"cost": cost, "ways": ways, "ran": ran, "entry": entry}


def test_a_short_launch_shape_is_learned_on_the_caller_alone(learning):
    out = np.zeros(6, np.int64)
    for _ in range(10):
        learning["ran"].clear()
        launch.LAUNCHER.launch(learning["entry"], 6, (out, 1))
    # a first launch, three threaded ones, three on the caller alone, then the faster way (alone: 17 < 50 us)
    assert "".join(learning["ways"]) == "TTTT" + "S" * 6
    assert out.tolist() == [10] * 6
    assert learning["ran"] == [threading.get_ident()] * 6  # the last launch ran every core on the caller


def test_a_shape_faster_on_threads_stays_threaded(learning):
    learning["cost"].update(threaded=20e-6, solo=40e-6)
    out = np.zeros(4, np.int64)
    for _ in range(10):
        launch.LAUNCHER.launch(learning["entry"], 4, (out, 1))
    assert "".join(learning["ways"]) == "TTTT" + "SSS" + "TTT"
    assert out.tolist() == [10] * 4


def test_a_long_launch_shape_is_never_tried_alone(learning):
    learning["cost"]["threaded"] = 2 * launch._SOLO_PROBE_S
    out = np.zeros(4, np.int64)
    for _ in range(8):
        launch.LAUNCHER.launch(learning["entry"], 4, (out, 1))
    assert "".join(learning["ways"]) == "T" * 8
    assert out.tolist() == [8] * 4


def test_a_solo_shape_that_runs_long_learns_again(learning):
    # work that depends on the data, not on the int arguments: one solo launch took longer than _SOLO_PROBE_S
    out = np.zeros(4, np.int64)
    for _ in range(8):
        launch.LAUNCHER.launch(learning["entry"], 4, (out, 1))
    learning["cost"]["solo"] = 2 * launch._SOLO_PROBE_S
    launch.LAUNCHER.launch(learning["entry"], 4, (out, 1))
    learning["cost"]["solo"] = 17e-6
    for _ in range(8):
        launch.LAUNCHER.launch(learning["entry"], 4, (out, 1))
    assert "".join(learning["ways"]) == "TTTTSSSS" + "S" + "TTTTSSSS"
    assert out.tolist() == [17] * 4


def test_launch_shapes_differ_by_their_int_arguments(learning):
    out = np.zeros(4, np.int64)
    for _ in range(8):
        launch.LAUNCHER.launch(learning["entry"], 4, (out, 1))
    launch.LAUNCHER.launch(learning["entry"], 4, (out, 2))  # another int: another shape, learned from the start
    launch.LAUNCHER.launch(learning["entry"], 4, (out, 1))
    launch.LAUNCHER.launch(learning["entry"], 5, (out, 1))  # another core count: another shape
    assert "".join(learning["ways"]) == "TTTTSSSS" + "T" + "S" + "T"
    assert out.tolist() == [12] * 4


def test_an_fp8_gemm_is_bitwise_the_same_threaded_and_on_the_caller_alone(monkeypatch):
    # The real kernel's launches through the learning: every shape tried alone after four threaded launches and
    # kept alone (a probe limit and margin no launch can miss), each result the same bits as the first
    import deep_gemm
    from deep_gemm.utils import per_token_cast_to_fp8

    monkeypatch.setattr(launch, "num_threads", lambda: 2)
    monkeypatch.setattr(launch.LAUNCHER, "_ways", {})
    monkeypatch.setattr(launch, "_SOLO_PROBE_S", 1e9)
    monkeypatch.setattr(launch, "_SOLO_MARGIN", 1e9)
    rng = np.random.default_rng(2)
    a = per_token_cast_to_fp8(rng.standard_normal((40, 256), dtype=np.float32), use_ue8m0=True, gran_k=32)
    b = per_token_cast_to_fp8(rng.standard_normal((96, 256), dtype=np.float32), use_ue8m0=True, gran_k=32)
    first = np.empty((40, 96), ml_dtypes.bfloat16)
    deep_gemm.fp8_gemm_nt(a, b, first)
    d = np.empty_like(first)
    for _ in range(8):
        d.fill(0)
        deep_gemm.fp8_gemm_nt(a, b, d)
        assert (d.view(np.uint16) == first.view(np.uint16)).all()
    assert True in launch.LAUNCHER._ways.values()
