"""The core launcher's contract: every logical core runs exactly once per launch (claimed by whichever thread comes
first, the caller never waiting for a worker to start), a launch completes before it returns or raises (Ctrl-C
included), the pool survives errors and interrupts, and several Python threads may launch at once. And how it learns
which launch shapes run faster on the caller alone (the same bits either way)."""

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


@pytest.mark.parametrize("mode", ["learned", "solo"])
def test_ctrl_c_during_gemms_never_tears_an_output_nor_hangs(session_cache_dir, mode):
    """Timed SIGINTs land at random points of FP8 GEMM launches; after each, the interrupted output is untouched or
    complete and the next GEMM is exactly right. A hang is the timeout (before the fix: a torn output within a few
    dozen interrupts, then a dead pool thread and a launch waiting forever). "solo": every launch shape learned on
    the caller alone (the interrupted GEMM's launches are threaded otherwise: they are long)."""
    child = Path(__file__).with_name("sigint_child.py")
    env = {**os.environ, "DG_JIT_CACHE_DIR": session_cache_dir}
    argv = [sys.executable, str(child), "200" if mode == "learned" else "100", *(["solo"] if mode == "solo" else [])]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["interrupted"] > 0
    assert result["torn"] == 0 and result["wrong_after"] == 0, result
    if mode == "solo":
        assert result["solo_shapes"] >= 1 and result["other_shapes"] == 0, result
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


# --- short launch shapes on the caller alone (launch.py's _SOLO_PROBE_S NOTES) ---------------------------------------


@pytest.fixture
def learning(monkeypatch):
    """Two threads, a fresh table of learned shapes and a fake clock: a threaded launch of the test's entry takes
    cost["threaded"] s, one on the caller alone cost["solo"] s. ``ways`` records each launch: "T" (threaded) or "S"
    (the caller alone); ``ran`` the threads that ran its cores; ``fail`` makes the next solo call raise."""
    monkeypatch.setattr(launch, "num_threads", lambda: 2)
    monkeypatch.setattr(launch.LAUNCHER, "_ways", {})
    now = [0.0]
    monkeypatch.setattr(launch, "_clock", lambda: now[0])
    cost = {"threaded": 50e-6, "solo": 17e-6}
    ways, ran, in_threaded, fail = [], [], [], []
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

    def make_entry():
        def entry(out, n, cores):
            if not in_threaded:
                ways.append("S")
                now[0] += cost["solo"]
                if fail:
                    fail.clear()
                    raise RuntimeError("a kernel error on the caller alone")
            while (core := _claim(cores)) < out.size:
                ran.append(threading.get_ident())
                out[core] += n
            with _claim_lock:
                cores[1] += 1  # the kernels' finish_part

        return entry

    return {"cost": cost, "ways": ways, "ran": ran, "fail": fail, "entry": make_entry(), "make_entry": make_entry}


def _launches(learning, count, out, n=1, cores=4, solo_costs=None):
    for i in range(count):
        if solo_costs is not None:
            learning["cost"]["solo"] = solo_costs[i % len(solo_costs)]
        launch.LAUNCHER.launch(learning["entry"], cores, (out, n))


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
    learning["cost"].update(threaded=20e-6, solo=30e-6)
    out = np.zeros(4, np.int64)
    _launches(learning, 10, out)
    assert "".join(learning["ways"]) == "TTTT" + "SSS" + "TTT"
    assert out.tolist() == [10] * 4


def test_a_solo_sample_over_twice_the_threaded_median_ends_the_trial(learning):
    learning["cost"].update(threaded=20e-6, solo=50e-6)
    out = np.zeros(4, np.int64)
    _launches(learning, 8, out)
    assert "".join(learning["ways"]) == "TTTT" + "S" + "TTT"


def test_a_long_launch_shape_is_never_tried_alone(learning):
    learning["cost"]["threaded"] = 2 * launch._SOLO_PROBE_S
    out = np.zeros(4, np.int64)
    _launches(learning, 8, out)
    assert "".join(learning["ways"]) == "T" * 8
    assert out.tolist() == [8] * 4


def test_repeated_slow_solo_launches_make_the_shape_threaded_for_good(learning):
    # work that depends on the data, not on the int arguments: every third launch is heavy (ten times the solo
    # median); the third heavy one in a row of such ends the caller-alone way
    out = np.zeros(4, np.int64)
    _launches(learning, 7, out)
    _launches(learning, 9, out, solo_costs=[170e-6, 17e-6, 17e-6])
    _launches(learning, 3, out)
    assert "".join(learning["ways"]) == "TTTTSSS" + "S" * 7 + "TTTTT"
    assert out.tolist() == [19] * 4


def test_isolated_slow_solo_launches_decay_away(learning):
    # a hiccup of the machine now and then (here one launch in 100) never ends the caller-alone way
    out = np.zeros(4, np.int64)
    _launches(learning, 7, out)
    _launches(learning, 400, out, solo_costs=[170e-6] + [17e-6] * 99)
    assert "".join(learning["ways"]) == "TTTTSSS" + "S" * 400


def test_launch_shapes_differ_by_their_int_arguments(learning):
    out = np.zeros(4, np.int64)
    _launches(learning, 8, out)
    launch.LAUNCHER.launch(learning["entry"], 4, (out, 2))  # another int: another shape, learned from the start
    launch.LAUNCHER.launch(learning["entry"], 4, (out, 1))
    launch.LAUNCHER.launch(learning["entry"], 5, (out, 1))  # another core count: another shape
    assert "".join(learning["ways"]) == "TTTTSSSS" + "T" + "S" + "T"
    assert out.tolist() == [12] * 4


def test_a_shape_whose_entry_id_comes_back_on_another_entry_is_learned_anew(learning):
    # a freed kernel's id may be reused by its successor: what was learned of the old entry must not carry over
    out = np.zeros(4, np.int64)
    _launches(learning, 8, out)
    other = learning["make_entry"]()
    ways = launch.LAUNCHER._ways
    ways[(id(other), 4, 2, 1)] = ways[(id(learning["entry"]), 4, 2, 1)]  # as if other had the old entry's id
    launch.LAUNCHER.launch(other, 4, (out, 1))
    assert "".join(learning["ways"]) == "TTTTSSSS" + "T"
    assert ways[(id(other), 4, 2, 1)].entry() is other and ways[(id(other), 4, 2, 1)].alone is None


def test_an_error_on_the_caller_alone_reaches_the_caller_and_the_way_stays(learning):
    out = np.zeros(4, np.int64)
    _launches(learning, 7, out)
    learning["fail"].append(1)
    with pytest.raises(RuntimeError, match="caller alone"):
        launch.LAUNCHER.launch(learning["entry"], 4, (out, 1))
    _launches(learning, 2, out)
    assert "".join(learning["ways"]) == "TTTTSSS" + "S" + "SS"
    assert out.tolist() == [9] * 4  # the failed launch ran no core


def test_the_table_of_shapes_is_bounded(learning, monkeypatch):
    monkeypatch.setattr(launch, "_MAX_SHAPES", 2)
    out = np.zeros(4, np.int64)
    for n in range(1, 6):
        launch.LAUNCHER.launch(learning["entry"], 4, (out, n))
        assert len(launch.LAUNCHER._ways) <= 2
    assert out.tolist() == [15] * 4


def test_python_threads_learning_one_shape_at_once_all_complete(monkeypatch):
    # the real clock: whichever way the shape ends, every launch completes with its cores run once and the shape
    # ends learned (True or False), the samples of the two ways never mixed up
    monkeypatch.setattr(launch, "num_threads", lambda: 2)
    monkeypatch.setattr(launch.LAUNCHER, "_ways", {})

    def entry(out, n, cores):
        while (core := _claim(cores)) < out.shape[1]:
            out[n, core] += 1
        with _claim_lock:
            cores[1] += 1

    out = np.zeros((4, 3), np.int64)
    errors = []

    def caller(n):
        try:
            for _ in range(40):
                launch.LAUNCHER.launch(entry, 3, (out, 0))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and out[0].tolist() == [160] * 3
    (way,) = launch.LAUNCHER._ways.values()
    assert way.alone in (True, False)
    assert len(way.threaded) == launch._SAMPLES and len(way.solo) <= launch._SAMPLES


def test_an_fp8_gemm_is_bitwise_the_same_threaded_and_on_the_caller_alone(monkeypatch):
    # The real kernel through the learning (limits no launch can miss: it ends on the caller alone), every launch
    # the same bits as the call on one thread
    import deep_gemm
    from deep_gemm.utils import per_token_cast_to_fp8

    rng = np.random.default_rng(2)
    a = per_token_cast_to_fp8(rng.standard_normal((40, 256), dtype=np.float32), use_ue8m0=True, gran_k=32)
    b = per_token_cast_to_fp8(rng.standard_normal((96, 256), dtype=np.float32), use_ue8m0=True, gran_k=32)
    one_thread = np.empty((40, 96), ml_dtypes.bfloat16)
    monkeypatch.setattr(launch, "num_threads", lambda: 1)
    deep_gemm.fp8_gemm_nt(a, b, one_thread)

    monkeypatch.setattr(launch, "num_threads", lambda: 2)
    monkeypatch.setattr(launch.LAUNCHER, "_ways", {})
    for limit in ("_SOLO_PROBE_S", "_SOLO_MARGIN", "_SOLO_STOP"):
        monkeypatch.setattr(launch, limit, 1e9)
    threaded_launches = []
    original = launch.CoreLauncher._launch_threaded
    monkeypatch.setattr(launch.CoreLauncher, "_launch_threaded",
                        lambda self, *args: (threaded_launches.append(1), original(self, *args)))
    d = np.empty_like(one_thread)
    for _ in range(10):
        d.fill(0)
        deep_gemm.fp8_gemm_nt(a, b, d)
        assert (d.view(np.uint16) == one_thread.view(np.uint16)).all()
    assert 0 < len(threaded_launches) < 10  # threaded launches, then launches on the caller alone
    assert [way.alone for way in launch.LAUNCHER._ways.values()] == [True]
