"""The warm-up helper (jit/warmup.py): a second process compiles the device functions of a cold kernel compile into
the shared numba cache, the compile loads what the helper finished, and nothing else changes: the plan format, the
shipped plans, when a helper starts and stops, and the cache it leaves behind. Every child has a cache of its own."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import time

import pytest
from jit_helpers import EXAMPLE_DEVICE, VADD_CONSTS, run_child
from numba.core import types

from deep_gemm.jit import numba_cache, warmup

ON = {"DG_JIT_WARMUP": "1"}
# a helper is started only with a second usable CPU
two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the helper needs a second usable CPU")


@pytest.mark.parametrize("t", [
    types.int64, types.int32, types.uint8, types.float32, types.boolean,
    types.Array(types.uint8, 2, "C"), types.Array(types.float32, 1, "A", readonly=True),
    types.Array(types.int16, 3, "F"), types.UniTuple(types.int64, 2), types.NumberClass(types.uint16),
    types.literal(True), types.literal(False), types.literal(7),
])
def test_type_text_round_trips(t):
    text = warmup.type_text(t)
    assert text is not None and warmup.parse_type(text) == t


@pytest.mark.parametrize("t", [
    types.Tuple((types.int64, types.float32)), types.unicode_type, types.Array(types.uint8, 1, "C", aligned=False),
    types.UniTuple(types.Array(types.uint8, 1, "C"), 2), types.literal("x"),
])
def test_types_without_text_leave_their_entry_out(t):
    assert warmup.type_text(t) is None


@pytest.mark.parametrize("text", ["array(uint8,2,Z)", "array(uint8,2)", "unicode_type", "class(none)", "Array",
                                  "literal(x)", 5, ""])
def test_bad_type_text_is_a_value_error_naming_it(text):
    with pytest.raises(ValueError, match="warm-up plan"):
        warmup.parse_type(text)


def test_shipped_plans_name_deep_gemm_functions_with_matching_arity():
    plans = warmup.plans()
    # the kernels bench/jit_bench.py --record-plans compiles
    assert {"fp8_gemm", "tf32_hc_prenorm_gemm", "mqa_logits", "paged_mqa_logits", "vadd"} <= set(plans)
    for kernel, entries in plans.items():
        assert entries, kernel
        for module, qualname, texts in entries:
            disp = warmup._dispatcher(module, qualname)
            parsed = [warmup.parse_type(t) for t in texts]
            # a stale entry (the function's parameters changed) would make the helper compile nothing useful
            inspect.signature(disp.py_func).bind(*parsed)


# vadd with another SCALE first (its device functions are then compiled), then recorded
RECORD_VADD = f"""
import json
import numpy as np
from deep_gemm.jit import build, warmup
def run(consts):
    k = build("vadd", consts, template="examples/vadd", device_module={EXAMPLE_DEVICE!r})
    k(np.zeros(1, np.uint8), *(np.ones(8, np.float32) for _ in range(3)), 8)
run({{**{VADD_CONSTS!r}, "SCALE": 3.0}})
with warmup.Recorder() as recorder:
    run({VADD_CONSTS!r})
print(json.dumps(recorder.plans))
"""


def test_a_compile_records_the_shipped_plan_also_after_its_device_functions_compiled(tmp_path):
    recorded = run_child(RECORD_VADD, tmp_path, extra_env={"DG_JIT_WARMUP": "0"})
    del recorded["stderr"]
    assert recorded == {"vadd": warmup.plans()["vadd"]}


@pytest.mark.slow
def test_the_shipped_plans_are_what_cold_compiles_record(tmp_path):
    bench = os.path.join(os.path.dirname(__file__), "..", "..", "bench")
    sys.path.insert(0, bench)
    try:
        import jit_bench
    finally:
        sys.path.remove(bench)
    out = jit_bench.record_plans([*jit_bench.SETUP, *jit_bench.PLAN_SETUP], tmp_path / "plans.json")
    assert out.read_text() == warmup.PLANS_FILE.read_text(), "stale plans: python bench/jit_bench.py --record-plans"


def test_dispatcher_refuses_anything_but_deep_gemm_functions():
    for module, qualname in (("os", "system"), ("deep_gemm.jit.warmup", "main"),
                             ("deep_gemm.device.crosscore", "_borrow_impl.<locals>.<lambda>")):
        with pytest.raises(ValueError, match="warm-up plan"):
            warmup._dispatcher(module, qualname)


class _FakeProcess:
    pid = 1

    def __init__(self, *args, **kwargs):
        import io

        self.args, self.stdin = args, io.BytesIO()
        self.stdin.close = lambda: None

    def poll(self):
        return None


def test_start_declines_when_little_can_be_gained(monkeypatch):
    started = []
    monkeypatch.setattr(warmup.subprocess, "Popen", lambda *a, **k: started.append(_FakeProcess(*a)) or started[-1])
    monkeypatch.setattr(warmup, "_live", set())
    monkeypatch.setenv("DG_JIT_WARMUP", "1")
    monkeypatch.setattr(warmup, "_usable_cpus", lambda: 2)
    uncompiled = [["deep_gemm.device.sync", "SetFlag", ["int32", "int32"]],
                  ["deep_gemm.device.sync", "WaitFlag", ["int32", "int32"]]]
    monkeypatch.setattr(warmup, "_plans", {"k": uncompiled})
    helper = warmup.start("k")  # (the fake process: nothing runs)
    assert helper is not None and len(started) == 1 and json.loads(started[0].stdin.getvalue()) == uncompiled
    assert warmup.start("no such kernel") is None
    monkeypatch.setattr(warmup, "_usable_cpus", lambda: 1)
    assert warmup.start("k") is None
    monkeypatch.setattr(warmup, "_usable_cpus", lambda: 2)
    monkeypatch.setenv("DG_JIT_WARMUP", "0")
    assert warmup.start("k") is None
    monkeypatch.setenv("DG_JIT_WARMUP", "1")
    from deep_gemm.jit import cache

    with monkeypatch.context() as m:  # no writable root: kernels are built in memory, the helper could write nothing
        m.setattr(cache, "cache_roots", lambda: cache.CacheRoots(None))
        assert warmup.start("k") is None
    from deep_gemm.device.sync import SetFlag

    SetFlag.compile((types.int64, types.int64))  # compiled in this process: pending() leaves it out
    compiled = [["deep_gemm.device.sync", "SetFlag", ["int64", "int64"]]]
    assert warmup.pending(compiled + uncompiled) == uncompiled
    more = [["deep_gemm.device.sync", name, [t, t]] for name in ("SetFlag", "WaitFlag") for t in ("uint8", "int16")]
    monkeypatch.setattr(warmup, "_plans", {"k": compiled * 5 + uncompiled + more[:1]})  # 3 of 8 left: declined
    assert warmup.start("k") is None
    assert len(started) == 1
    monkeypatch.setattr(warmup, "_plans", {"k": compiled * 3 + uncompiled + more[:2]})  # 4 of 7 left: started
    assert warmup.start("k") is not None and len(started) == 2


# Counts the numba compiles of the example device module's functions while vadd builds and runs.
VADD_COMPILES = f"""
import json
import numpy as np
from numba.core import event
from deep_gemm.jit import add_listener, build, warmup

compiled = []
class Listener(event.Listener):
    def on_start(self, ev):
        f = ev.data["dispatcher"].py_func
        if f.__module__ == {EXAMPLE_DEVICE!r}:
            compiled.append(f.__qualname__)
    def on_end(self, ev):
        pass
event.register("numba:compile", Listener())
seen = []
add_listener(lambda kind, info: seen.append([kind, info.get("kernel")]) if kind.startswith("warmup") else None)
helper_status = None
if PRE_WARM:
    helper = warmup.start("vadd")
    helper_status = helper.wait(120)
    import deep_gemm.jit.example_device  # (pending() looks only at imported modules, as a compile's are)
    assert warmup.pending(warmup.plans()["vadd"]) == []  # on disk now: a compile would not start another helper
k = build("vadd", {VADD_CONSTS!r}, template="examples/vadd", device_module={EXAMPLE_DEVICE!r})
x = np.arange(50, dtype=np.float32); y = np.ones(50, np.float32); z = np.zeros(50, np.float32)
k(np.zeros(1, np.uint8), x, y, z, 50)
warmup.stop_all()
print(json.dumps({{"compiled": compiled, "events": seen, "helper_status": helper_status,
                  "ok": bool(np.array_equal(z, (x + y) * np.float32({VADD_CONSTS['SCALE']!r})))}}))
"""


@two_cpus
def test_the_compile_loads_what_the_helper_compiled(tmp_path):
    alone = run_child("PRE_WARM = False\n" + VADD_COMPILES, tmp_path / "alone", extra_env={"DG_JIT_WARMUP": "0"})
    assert alone["ok"] and sorted(alone["compiled"]) == ["SetFlag", "WaitFlag"] and alone["events"] == []
    warmed = run_child("PRE_WARM = True\n" + VADD_COMPILES, tmp_path / "warmed", extra_env=ON)
    assert warmed["ok"] and warmed["helper_status"] == 0
    assert warmed["compiled"] == []  # both loaded from the cache the helper wrote
    assert warmed["events"] == [["warmup_start", "vadd"]]  # and the cold compile of vadd started no other helper


@two_cpus
def test_a_cold_compile_starts_the_helper_and_stops_it(tmp_path):
    out = run_child("PRE_WARM = False\n" + VADD_COMPILES, tmp_path, extra_env=ON)
    assert out["ok"]
    assert out["events"] == [["warmup_start", "vadd"], ["warmup_stop", "vadd"]]
    # a second process: the kernel is cached, nothing compiles and no helper starts
    again = run_child("PRE_WARM = False\n" + VADD_COMPILES, tmp_path, extra_env=ON)
    assert again["ok"] and again["compiled"] == [] and again["events"] == []


def _helper(root, plan, **kwargs) -> subprocess.Popen:
    env = dict(os.environ, DG_JIT_CACHE_DIR=str(root), DG_JIT_WARMUP="0")
    proc = subprocess.Popen([sys.executable, "-m", "deep_gemm.jit.warmup"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True, **kwargs)
    proc.stdin.write(plan if isinstance(plan, str) else json.dumps(plan))
    proc.stdin.close()
    return proc


def _assert_cache_consistent(root):
    numba_dir = root / numba_cache.SHARED_DIR
    assert not [p for p in root.rglob("*") if ".tmp." in p.name], "a temporary file was left behind"
    for directory in [d for d in numba_dir.iterdir() if d.is_dir()] if numba_dir.exists() else []:
        recorded = numba_cache.read_manifest(directory)  # raises when the manifest does not verify
        for name, digest in recorded.items():
            assert numba_cache._sha256((directory / name).read_bytes()) == digest, name
        on_disk = {p.name for p in directory.iterdir() if p.suffix in (".nbi", ".nbc")}
        assert on_disk <= set(recorded), f"files the manifest does not vouch for: {on_disk - set(recorded)}"


def test_stale_entries_are_skipped_and_a_bad_plan_refused(tmp_path):
    plan = [["deep_gemm.device.sync", "NoSuchFunction", ["int64"]], ["os", "system", ["int64"]],
            ["deep_gemm.device.sync", "SetFlag", ["int64", "int64"]]]
    proc = _helper(tmp_path, plan)
    assert proc.wait(120) == 0
    err = proc.stderr.read()
    assert "NoSuchFunction" in err and "'os'" in err and "SetFlag" not in err
    assert any(tmp_path.rglob("sync.SetFlag-*.nbi"))
    _assert_cache_consistent(tmp_path)
    bad = _helper(tmp_path / "bad", "{not json")
    assert bad.wait(60) == 1 and "deep_gemm.jit.warmup" in bad.stderr.read()
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("after", [1, 6])
def test_a_stopped_helper_finishes_its_entry_and_leaves_a_consistent_cache(tmp_path, after):
    plan = warmup.plans()["paged_mqa_logits"]
    proc = _helper(tmp_path, plan)
    deadline = time.monotonic() + 120
    while len(list(tmp_path.rglob("*.nbi"))) < after and time.monotonic() < deadline:
        time.sleep(0.02)  # until it has saved `after` functions: mid-plan, compiling (or saving) the next one
    assert proc.poll() is None
    proc.terminate()
    assert proc.wait(30) == 0  # it exits by itself after the entry it was compiling, not killed mid-write
    _assert_cache_consistent(tmp_path)
    assert after <= len(list(tmp_path.rglob("*.nbi"))) < len(plan)  # stopped mid-plan, what it finished kept


def _gone(pid: int) -> bool:
    """The process has exited (a zombie left for a PID 1 that does not reap counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return _gone(pid)


# A cold FP8 GEMM compile interrupted by SIGINT 0.5 s after its helper started; then the same call again.
INTERRUPTED = """
import json, os, signal, threading, time
import ml_dtypes
import numpy as np
import deep_gemm
from deep_gemm.jit import add_listener
from deep_gemm.testing import calc_diff
from deep_gemm.utils import per_token_cast_to_fp8

def alive(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False

helpers, alive_at_interrupt = [], []
def interrupt():
    alive_at_interrupt.append(alive(helpers[0]))
    os.kill(os.getpid(), signal.SIGINT)
def on_event(kind, info):
    if kind == "warmup_start" and not helpers:
        helpers.append(info["pid"])
        threading.Timer(0.5, interrupt).start()
add_listener(on_event)
rng = np.random.default_rng(0)
x, w = rng.standard_normal((64, 256), dtype=np.float32), rng.standard_normal((128, 256), dtype=np.float32)
a, b = (per_token_cast_to_fp8(t, use_ue8m0=True, gran_k=32) for t in (x, w))
d = np.empty((64, 128), ml_dtypes.bfloat16)
interrupted = False
try:
    deep_gemm.fp8_gemm_nt(a, b, d)
except KeyboardInterrupt:
    interrupted = True
deadline = time.monotonic() + 20  # it finishes the entry it was compiling, then exits
while alive(helpers[0]) and time.monotonic() < deadline:
    time.sleep(0.05)
helper_alive_after = alive(helpers[0])
deep_gemm.fp8_gemm_nt(a, b, d)
print(json.dumps({"interrupted": interrupted, "alive_at_interrupt": alive_at_interrupt,
                  "helper_alive_after": helper_alive_after, "diff": float(calc_diff(d.astype(np.float32), x @ w.T))}))
"""


@two_cpus
def test_ctrl_c_during_a_cold_compile_stops_its_helper(tmp_path):
    out = run_child(INTERRUPTED, tmp_path, extra_env=ON)
    assert out["interrupted"] and out["alive_at_interrupt"] == [True], out
    assert not out["helper_alive_after"], "the helper outlived the interrupted compile"
    assert out["diff"] < 1e-2  # the call after the interrupt compiles and computes the GEMM
    _assert_cache_consistent(tmp_path)


# Starts a helper on every plan at once (a minute of work), prints its pid and sleeps until it is killed.
ORPHAN = """
import json, sys, time
from deep_gemm.jit import warmup
warmup._plans = {"all": [entry for plan in warmup.plans().values() for entry in plan]}
helper = warmup.start("all")
print(json.dumps({"pid": helper.proc.pid}), flush=True)
time.sleep(120)
"""


@two_cpus
def test_a_helper_ends_when_its_process_is_killed(tmp_path):
    env = dict(os.environ, DG_JIT_CACHE_DIR=str(tmp_path), DG_JIT_WARMUP="1")
    parent = subprocess.Popen([sys.executable, "-c", ORPHAN], env=env, stdout=subprocess.PIPE, text=True)
    try:
        pid = json.loads(parent.stdout.readline())["pid"]
        time.sleep(1.5)  # the helper is compiling
        assert not _gone(pid)
    finally:
        parent.kill()
        parent.wait()
    assert _wait_gone(pid, 15.0), "the helper outlived the process that started it"  # (its plan: a minute)
    _assert_cache_consistent(tmp_path)


def _warmup_setting():
    return os.environ.get("DG_JIT_WARMUP")


def test_precompile_workers_that_would_share_cpus_with_helpers_run_without_them(monkeypatch):
    from deep_gemm.testing import par_compile

    monkeypatch.delenv("DG_JIT_WARMUP", raising=False)
    expected = "0" if 2 * 2 > len(os.sched_getaffinity(0)) else None
    assert par_compile([_warmup_setting] * 2, max_workers=2, progress=False) == [expected] * 2
    monkeypatch.setenv("DG_JIT_WARMUP", "1")
    assert par_compile([_warmup_setting] * 2, max_workers=2, progress=False) == ["1", "1"]
