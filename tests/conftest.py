"""Test session setup: one kernel cache directory for the whole session (kernels compile once and are shared by
every test, and by every pytest-xdist worker of the session), a seeded RNG, fixtures for tests that need a cache of
their own, and ``--compile-report PATH`` (where the suite's time and kernel compiles go, per file)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time

import numpy as np
import pytest

# NOTES: set before deep_gemm.jit reads it. A user-provided DG_JIT_CACHE_DIR is respected (handy for reruns). Under
# pytest-xdist this module is imported by the controller first (an initial conftest), which creates the directory;
# the workers it starts inherit DG_JIT_CACHE_DIR, so every worker uses the same cache (a kernel one worker compiled
# is a disk hit for the other) and only the controller removes it. A worker never creates one of its own.
_SESSION_CACHE = None
if not os.environ.get("DG_JIT_CACHE_DIR") and not os.environ.get("PYTEST_XDIST_WORKER"):
    _SESSION_CACHE = tempfile.mkdtemp(prefix="dg-test-cache-")
    os.environ["DG_JIT_CACHE_DIR"] = _SESSION_CACHE

# NOTES: the suite's two workers keep both CPUs busy, so a warm-up helper per cold compile (jit/warmup.py) would only
# compete with them; tests/jit/test_warmup.py turns it on where it is the subject.
os.environ.setdefault("DG_JIT_WARMUP", "0")

# NOTES: a shell starts a background job (and a CI runner may start the suite) with SIGINT ignored, and children
# inherit an ignored signal; then Python installs no KeyboardInterrupt handler and the Ctrl-C tests would test
# nothing. Restore Python's default handler here, so this process and every child it starts handle SIGINT as a
# user's interpreter does.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser):
    parser.addoption("--compile-report", metavar="PATH", default=None,
                     help="write per test file: tests, seconds (setup + call + teardown), kernels built (rendered + "
                          "translated), entry functions compiled by numba and the seconds numba spent compiling "
                          "each kernel, slowest first, the kernels two test files built with constants that "
                          "differ in at most two keys (near_duplicates), and every build with its test (builds), to "
                          "PATH (JSON)")


def pytest_sessionfinish(session, exitstatus):
    if _SESSION_CACHE is not None:
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)
    path = session.config.getoption("compile_report")
    if path and not hasattr(session.config, "workerinput"):  # the controller (or the only process) writes it
        _write_compile_report(path)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture
def session_cache_dir() -> str:
    return os.environ["DG_JIT_CACHE_DIR"]


@pytest.fixture(autouse=True)
def _fresh_launch_shapes(monkeypatch):
    """Each test learns its launch shapes anew (jit/launch.py: threads or the caller alone): no test's launches
    follow the timings of the tests that ran before it in the same process."""
    from deep_gemm.jit import launch

    monkeypatch.setattr(launch.LAUNCHER, "_ways", {})


# ---------------------------------------------------------------------------------------------------------------
# --compile-report: where the time goes. Each test's counts are taken in the process that ran it (an xdist worker)
# and travel to the controller with its teardown report.

_PROFILE_KEYS = ("build", "numba_compile", "numba_compile_helper", "disk_hit")
_START = pytest.StashKey[dict]()
_per_file: dict[str, dict] = {}


def _jit_counts() -> dict[str, int]:
    from deep_gemm.jit import events  # imports neither numba nor jinja2

    counts = events.stats()
    return {k: counts.get(k, 0) for k in _PROFILE_KEYS}


_compile_seconds: dict[str, float] = {}  # this process: kernel name -> seconds numba spent compiling its entries
_builds: list[dict] = []  # this process: every kernel it built (rendered, translated, published), in order
_compile_timer_installed = False


def _install_compile_timer() -> None:
    """Time numba's compiles of generated kernels' functions, outermost only (an entry's time includes the device
    functions it compiles), by kernel name (``_dg_kernel_<name>_<digest>``: the name)."""
    global _compile_timer_installed
    if _compile_timer_installed:
        return
    _compile_timer_installed = True
    from numba.core import event

    from deep_gemm.jit.numba_facts import KERNEL_MODULE_MARK

    stack: list[tuple[str | None, float]] = []
    from deep_gemm.jit import events

    def on_event(kind: str, info: dict) -> None:
        if kind != "build":
            return
        try:
            with open(os.path.join(info["path"], "meta.json"), encoding="utf-8") as f:
                constants = json.load(f).get("constants")
        except (OSError, ValueError, KeyError):
            constants = None
        _builds.append({"kernel": info.get("kernel"), "constants": constants})

    events.listen(on_event)

    class Timer(event.Listener):
        def on_start(self, ev):
            dispatcher = ev.data.get("dispatcher") if isinstance(ev.data, dict) else None
            module = getattr(getattr(dispatcher, "py_func", None), "__module__", "") or ""
            name = module[len(KERNEL_MODULE_MARK):].rsplit("_", 1)[0] if module.startswith(KERNEL_MODULE_MARK) else None
            stack.append((name, time.perf_counter()))

        def on_end(self, ev):
            name, start = stack.pop()
            if name is not None and not any(n is not None for n, _ in stack):
                _compile_seconds[name] = _compile_seconds.get(name, 0.0) + time.perf_counter() - start

    event.register("numba:compile", Timer())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    if item.config.getoption("compile_report"):
        _install_compile_timer()
        item.stash[_START] = (_jit_counts(), dict(_compile_seconds), len(_builds))
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    start = item.stash.get(_START, None)
    if start is not None:
        counts, seconds, built = start
        end = _jit_counts()
        item.user_properties.append(("dg_jit", {k: end[k] - counts[k] for k in _PROFILE_KEYS}))
        spent = {k: round(v - seconds.get(k, 0.0), 2) for k, v in _compile_seconds.items() if v > seconds.get(k, 0.0)}
        item.user_properties.append(("dg_compile_seconds", spent))
        item.user_properties.append(("dg_builds", _builds[built:]))


def pytest_runtest_logreport(report):
    empty = {"tests": 0, "seconds": 0.0, "compile_seconds": 0.0, **dict.fromkeys(_PROFILE_KEYS, 0), "kernels": {}}
    row = _per_file.setdefault(report.nodeid.split("::")[0], empty)
    row["seconds"] += report.duration
    if report.when == "call" or (report.when == "setup" and report.skipped):
        row["tests"] += 1
    for name, value in report.user_properties:
        if name == "dg_jit":
            for k in _PROFILE_KEYS:
                row[k] += value.get(k, 0)
        elif name == "dg_compile_seconds":
            for kernel, seconds in value.items():
                row["compile_seconds"] += seconds
                row["kernels"][kernel] = round(row["kernels"].get(kernel, 0.0) + seconds, 2)
        elif name == "dg_builds":
            _all_builds.extend(dict(b, test=report.nodeid) for b in value)


_all_builds: list[dict] = []  # the controller: every build of the session, with the test that made it


def near_duplicates(builds: list[dict], max_differ: int = 2) -> list[dict]:
    """Kernels built by two different test files whose template constants differ in one to ``max_differ`` keys
    (fewest first): the candidates for one test to use the other's shape or core count and load its kernel. (Equal
    constants with two builds differ by a setting of the key, DG_SYNC_CHECK say: not listed.)"""
    out = []
    by_kernel: dict[str, list[dict]] = {}
    for b in builds:
        if isinstance(b.get("constants"), dict):
            by_kernel.setdefault(b["kernel"], []).append(b)
    for kernel, group in by_kernel.items():
        for i, x in enumerate(group):
            for y in group[i + 1:]:
                if x["test"].split("::")[0] == y["test"].split("::")[0]:
                    continue
                keys = set(x["constants"]) | set(y["constants"])
                differ = {k: [x["constants"].get(k), y["constants"].get(k)] for k in sorted(keys)
                          if x["constants"].get(k) != y["constants"].get(k)}
                if 0 < len(differ) <= max_differ:
                    out.append({"kernel": kernel, "tests": [x["test"], y["test"]], "differ": differ})
    return sorted(out, key=lambda d: (len(d["differ"]), d["kernel"], d["tests"]))


def _write_compile_report(path: str) -> None:
    rows = sorted(_per_file.items(), key=lambda kv: -kv[1]["seconds"])
    report = {"written": time.strftime("%Y-%m-%d %H:%M:%S"),
              "total_seconds": round(sum(r["seconds"] for _, r in rows), 1),
              "compile_seconds": round(sum(r["compile_seconds"] for _, r in rows), 1),
              "files": [{"file": f, **{k: round(v, 1) if isinstance(v, float) else v for k, v in r.items()}}
                        for f, r in rows],
              "near_duplicates": near_duplicates(_all_builds),
              "builds": _all_builds}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
