"""Damage that is not byte damage (issue 22): a deeply nested JSON record, a FIFO, a symlink to /dev/zero or a
directory where a cache file belongs. Every reader (files.py) treats it as damage: one warning, moved aside,
rebuilt; damage that cannot be moved aside is reported once per process and never as rebuilt. Also: stale native
build directories of killed processes are swept, and a bad DG_* value fails at import naming the variable.

Damaged roots are copies of one pristine root (vadd, built by a child process); loads run in this process under a
SIGALRM watchdog (a read that blocks on a FIFO or streams /dev/zero fails the test instead of hanging it)."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from jit_helpers import EXAMPLE_DEVICE, VADD_CHILD, VADD_CONSTS, run_child, stats_delta, vadd_args, vadd_reference

from deep_gemm import envs
from deep_gemm.jit import build, cache, files, keyindex, native, numba_cache, stats
from deep_gemm.jit import compile as jit_compile
from deep_gemm.jit.compile import wait_native_builds

NATIVE = native.enabled() and native.compiler() is not None
NESTED = b"[" * 100_000 + b"]" * 100_000  # json.loads: RecursionError


def build_vadd(**overrides):
    return build("vadd", {**VADD_CONSTS, **overrides}, template="examples/vadd", device_module=EXAMPLE_DEVICE)


def run_vadd(kernel, n=40):
    unused, x, y, z, n = vadd_args(n, np.random.default_rng(0))
    kernel(unused, x, y, z, n)
    np.testing.assert_array_equal(z, vadd_reference(x, y, kernel.constants["SCALE"]))


@pytest.fixture(autouse=True)
def watchdog():
    """Fail (not hang) a test whose cache read blocks or streams."""
    def expire(signum, frame):
        raise TimeoutError("a cache read blocked or streamed for 150 s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(150)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(cache, "_warned", set())


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A root holding vadd's entry (with its native library and numba files), its key index and host records."""
    root = tmp_path_factory.mktemp("pristine")
    out = run_child(VADD_CHILD, root)
    assert out["ok"] and out["stats"].get("build") == 1, out
    return root, Path(out["path"]).relative_to(root)


@pytest.fixture
def damaged_root(pristine, tmp_path, monkeypatch, fresh_warnings):
    """A copy of the pristine root in force for this test, with empty in-process caches."""
    root0, entry_rel = pristine
    root = tmp_path / "root"
    shutil.copytree(root0, root, symlinks=True)
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(root))
    jit_compile.clear_memory_cache()
    native.host_cpu.cache_clear()
    yield root, root / entry_rel
    wait_native_builds()
    jit_compile.clear_memory_cache()
    native.host_cpu.cache_clear()


def _targets(root: Path, entry: Path) -> dict[str, Path]:
    (index,) = (root / "index").glob("vadd.*.json")
    (host,) = (root / "index").glob("host-*.json")
    return {
        "meta.json": entry / "meta.json",
        "kernel.py": entry / "kernel.py",
        "native.json": entry / native.NATIVE_JSON,
        "native.so": max(entry.glob("native-*.so")),
        "index": index,
        "host": host,
        "numba.json": entry / "__pycache__" / numba_cache.MANIFEST,
        "kernel.nbi": max((entry / "__pycache__").glob("kernel.vadd-*.nbi")),
    }


def _damage(path: Path, how: str) -> None:
    path.unlink()
    if how == "nested":
        path.write_bytes(NESTED)
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "devzero":
        path.symlink_to("/dev/zero")
    elif how == "directory":
        path.mkdir()
        (path / "inside").write_text("a file inside the directory")
    else:
        raise AssertionError(how)


def _jit_warnings(record) -> list[str]:
    return [str(w.message) for w in record if "deep_gemm.jit" in str(w.message)]


CASES = [
    ("meta.json", "nested"), ("meta.json", "fifo"), ("meta.json", "devzero"), ("meta.json", "directory"),
    ("kernel.py", "fifo"), ("kernel.py", "devzero"),
    ("native.json", "nested"), ("native.json", "fifo"), ("native.json", "devzero"), ("native.json", "directory"),
    ("native.so", "fifo"), ("native.so", "devzero"), ("native.so", "directory"),
    ("index", "nested"), ("index", "fifo"), ("index", "directory"),
    ("host", "nested"), ("host", "fifo"), ("host", "devzero"), ("host", "directory"),
    ("numba.json", "nested"), ("numba.json", "fifo"), ("numba.json", "directory"),
    ("kernel.nbi", "fifo"), ("kernel.nbi", "directory"),
]


@pytest.mark.parametrize("kind,how", CASES, ids=[f"{k}-{h}" for k, h in CASES])
def test_damaged_file_warns_once_is_moved_aside_and_rebuilt(damaged_root, monkeypatch, kind, how):
    root, entry = damaged_root
    if kind.startswith(("native.", "host")) and not NATIVE:
        pytest.skip("native kernels need Linux and a C compiler")
    if kind in ("numba.json", "kernel.nbi"):
        monkeypatch.setenv("DG_JIT_NATIVE", "0")  # numba's files of the entry are read only on the numba path
    target = _targets(root, entry)[kind]
    _damage(target, how)
    before = stats()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        kernel = build_vadd()
        run_vadd(kernel)
        wait_native_builds()
    delta = stats_delta(before)
    messages = _jit_warnings(record)
    assert len(messages) == 1, messages
    assert str(target if kind in ("index", "host") else target.parent) in messages[0], messages
    assert "rebuilt now" in messages[0] or "written again" in messages[0] or "recompiled" in messages[0], messages
    # NOTES: a damaged numba.json also un-vouches the helper's files beside the entry function's: two events
    assert delta.get("corrupt") == 1 or kind == "numba.json" and delta.get("corrupt", 0) >= 1, delta
    # Repaired: the file is a regular file again, the entry and its files verify, nothing is left in tmp/
    digest = entry.name.split(".", 1)[1]
    assert cache.check_entry(entry, "vadd", digest) is None
    assert numba_cache.directory_problem(entry / "__pycache__") is None
    if kind in ("meta.json", "kernel.py"):
        assert kernel.source == "built"
    if kind.startswith("native.") or (NATIVE and kind in ("meta.json", "kernel.py")):
        assert delta.get("native_build") == 1, delta
        assert native.load(entry, digest).path.is_file()
    if kind == "index":
        found = keyindex.lookup(root, "vadd", files.load_json_record(target)["build_args"], *_index_context())
        assert found is not None and found[0] == digest
    if kind == "host":
        record = files.load_json_record(target)
        assert (record["cpu_name"], record["cpu_features"]) == native.host_cpu()
    if kind in ("numba.json", "kernel.nbi"):
        assert delta.get("numba_compile") == 1, delta
    assert not [p for p in (root / "tmp").iterdir() if not p.name.startswith(".probe-")]
    # and the next process-like build (memory cache cleared) finds everything whole: no warning, no damage
    jit_compile.clear_memory_cache()
    native.host_cpu.cache_clear()
    before = stats()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        again = build_vadd()
        run_vadd(again)
        wait_native_builds()
    assert not _jit_warnings(record) and "corrupt" not in stats_delta(before)
    assert again.source == "disk"


def _index_context():
    from deep_gemm.jit.constants import resolve_template

    directory = resolve_template("examples/vadd", None)[0]
    return directory, EXAMPLE_DEVICE, jit_compile._settings(False, None)


def test_damaged_native_files_in_a_child_process_never_hang_or_fail(pristine, tmp_path):
    """The reported cases in fresh processes (a hang or crash fails the test through the timeout): a FIFO and a
    symlink to /dev/zero at the native library, a nested host record. Each process after the first is clean."""
    if not NATIVE:
        pytest.skip("native kernels need Linux and a C compiler")
    root0, entry_rel = pristine
    for kind, how in (("native.so", "fifo"), ("native.so", "devzero"), ("host", "nested")):
        root = tmp_path / f"{kind}-{how}"
        shutil.copytree(root0, root, symlinks=True)
        _damage(_targets(root, root / entry_rel)[kind], how)
        first = run_child(VADD_CHILD, root, timeout=300)
        assert first["ok"] and first["stats"].get("corrupt") == 1, (kind, how, first)
        assert len([line for line in first["stderr"].splitlines() if "RuntimeWarning" in line]) == 1, first["stderr"]
        second = run_child(VADD_CHILD, root, timeout=300)
        assert second["ok"] and "corrupt" not in second["stats"] and "RuntimeWarning" not in second["stderr"], second
        assert second["stats"].get("native_load") == 1, second


# Damage that cannot be repaired ---------------------------------------------------------------------------------


@pytest.fixture
def read_only_entries(monkeypatch):
    """Nothing can be moved aside (as in a read-only entry or cache/ directory: rename fails with EACCES)."""
    def refuse(root, path):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(cache, "move_aside", refuse)


@pytest.mark.parametrize("kind", ["meta.json", "native.json", "native.so"])
def test_read_only_damage_is_reported_once_per_process_and_never_as_rebuilt(damaged_root, read_only_entries, kind):
    root, entry = damaged_root
    if kind.startswith("native.") and not NATIVE:
        pytest.skip("native kernels need Linux and a C compiler")
    target = _targets(root, entry)[kind]
    _damage(target, "nested" if kind != "native.so" else "directory")
    before = stats()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(3):  # three builds of the kernel in this process: one warning
            jit_compile.clear_memory_cache()
            kernel = build_vadd()
            run_vadd(kernel)
        wait_native_builds()
    messages = _jit_warnings(record)
    assert len(messages) == 1, messages
    assert "cannot be moved aside" in messages[0] and "rebuilt" not in messages[0], messages
    assert "PermissionError" in messages[0]
    delta = stats_delta(before)
    assert "native_build" not in delta, delta  # no futile build into an entry that cannot take it
    if kind == "meta.json":
        assert kernel.source == "memory" and "in memory" in messages[0]
    else:
        assert "runs through numba" in messages[0] and kernel.source == "disk"
    assert (target.is_dir() if kind == "native.so" else target.read_bytes() == NESTED)  # the damage is still there


def test_damaged_entry_in_a_read_only_root_names_where_the_kernel_comes_from(pristine, tmp_path, monkeypatch,
                                                                           fresh_warnings):
    root0, entry_rel = pristine
    read_only, writable = tmp_path / "ro", tmp_path / "rw"
    shutil.copytree(root0, read_only, symlinks=True)
    _damage(read_only / entry_rel / "meta.json", "nested")
    monkeypatch.setattr(cache, "_candidates", lambda: [("DG_JIT_CACHE_DIR", read_only), ("user cache", writable)])
    probe = cache._probe_writable
    monkeypatch.setattr(cache, "_probe_writable", lambda root: root != read_only and probe(root))
    cache._resolve_roots.cache_clear()
    jit_compile.clear_memory_cache()
    try:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            for _ in range(2):
                jit_compile.clear_memory_cache()
                kernel = build_vadd()
                run_vadd(kernel)
            wait_native_builds()
    finally:
        cache._resolve_roots.cache_clear()
        jit_compile.clear_memory_cache()
    messages = [m for m in _jit_warnings(record) if "corrupt" in m]
    assert len(messages) == 1, _jit_warnings(record)
    assert f"it is in a read-only root; the kernel is served from (or built in) {writable}" in messages[0]
    assert "rebuilt now" not in messages[0] and kernel.path.parent.parent == writable
    assert (read_only / entry_rel / "meta.json").read_bytes() == NESTED  # a read-only root is never written


def test_read_only_host_record_is_reported_once_and_not_as_rewritten(damaged_root, read_only_entries, monkeypatch):
    if not NATIVE:
        pytest.skip("native kernels need Linux and a C compiler")
    root, entry = damaged_root
    host = _targets(root, entry)["host"]
    _damage(host, "directory")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(2):
            native.host_cpu.cache_clear()
            name, features = native.host_cpu()
            assert isinstance(name, str) and isinstance(features, str)
    messages = _jit_warnings(record)
    assert len(messages) == 1 and "cannot be moved aside" in messages[0] and "written again" not in messages[0]
    assert "LLVM is asked" in messages[0]


# The reader itself ------------------------------------------------------------------------------------------------


def test_read_regular_file_refuses_every_other_file_type_without_blocking(tmp_path):
    regular = tmp_path / "regular"
    regular.write_bytes(b"abc")
    assert files.read_regular_file(regular, 3) == b"abc"
    (tmp_path / "link").symlink_to(regular)
    assert files.read_regular_file(tmp_path / "link", 3) == b"abc"  # a symlink to a regular file is read
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    (tmp_path / "dir").mkdir()
    (tmp_path / "fifo-link").symlink_to(tmp_path / "fifo")
    t0 = time.perf_counter()
    for name, kind in (("fifo", "a FIFO"), ("zero", "a character device"), ("dir", "a directory"),
                       ("fifo-link", "a FIFO")):
        with pytest.raises(files.DamagedFile, match=f"not a regular file: {kind}"):
            files.read_regular_file(tmp_path / name, 1 << 20)
    assert time.perf_counter() - t0 < 5
    with pytest.raises(files.DamagedFile, match="more than the 2"):
        files.read_regular_file(regular, 2)
    (tmp_path / "dangling").symlink_to(tmp_path / "nothing")
    with pytest.raises(FileNotFoundError):
        files.read_regular_file(tmp_path / "dangling", 10)


@pytest.mark.parametrize("raw,match", [
    (NESTED, "RecursionError"),
    (b"[" * 40 + b"]" * 40, "a JSON list, not an object"),
    (b'{"a": ' + b"[" * 40 + b"]" * 40 + b"}", "nested more than"),
    (b'{"a": 1', "JSONDecodeError"),
    (b"\xff\xfe{}", "UnicodeDecodeError"),
    (b"null", "a JSON NoneType, not an object"),
], ids=["recursion", "list", "deep", "truncated", "utf8", "null"])
def test_every_failure_to_parse_a_record_is_damage(tmp_path, raw, match):
    path = tmp_path / "record.json"
    path.write_bytes(raw)
    with pytest.raises(files.DamagedFile, match=match):
        files.load_json_record(path)


def test_atomic_write_replaces_a_directory_and_the_lock_survives_a_fifo(tmp_path):
    target = tmp_path / "native.json"
    target.mkdir()
    (target / "x").write_text("inside")
    numba_cache.write_atomic(target, b"{}")
    assert target.read_bytes() == b"{}" and sorted(p.name for p in tmp_path.iterdir()) == ["native.json"]
    os.mkfifo(tmp_path / numba_cache.LOCK)
    with numba_cache.locked(tmp_path):
        pass
    assert (tmp_path / numba_cache.LOCK).is_file()
    (tmp_path / numba_cache.LOCK).unlink()
    (tmp_path / numba_cache.LOCK).mkdir()
    with numba_cache.locked(tmp_path):
        pass
    assert (tmp_path / numba_cache.LOCK).is_file()


# Native build directories of killed processes ----------------------------------------------------------------------


def test_stale_native_build_and_load_directories_are_swept(tmp_path):
    old = time.time() - 2 * cache.STALE_TMP_SECONDS
    dead = 999_999_999
    made = {
        "dead-old-build": tmp_path / f"deep_gemm-native-{dead}-abc",
        "dead-old-load": tmp_path / f"deep_gemm-load-{dead}-def",
        "dead-young": tmp_path / f"deep_gemm-native-{dead}-ghi",
        "alive-old": tmp_path / f"deep_gemm-native-{os.getppid()}-jkl",
        "no-pid": tmp_path / "deep_gemm-native-mno",
        "other": tmp_path / f"other-{dead}-pqr",
    }
    for name, path in made.items():
        path.mkdir()
        (path / "phase0.o").write_bytes(b"partial")
        if name != "dead-young":
            os.utime(path, (old, old))
    removed = native.sweep_stale_temp_dirs(tmp_path)
    assert sorted(removed) == sorted([made["dead-old-build"], made["dead-old-load"]])
    assert all(p.exists() for k, p in made.items() if not k.startswith("dead-old"))


KILLED_BUILD_CHILD = f"""
import os, sys, time
import numpy as np
from deep_gemm.jit import build, native
real_run = native.subprocess.run
def slow_cc(cmd, *args, **kwargs):
    if "-shared" in cmd:  # the link: tell the parent, then wait to be killed
        open(os.environ["MARKER"], "w").write(str(os.getpid()))
        time.sleep(600)
    return real_run(cmd, *args, **kwargs)
native.subprocess.run = slow_cc
k = build("vadd", {{**{VADD_CONSTS!r}, "TILE": 24}}, template="examples/vadd", device_module={EXAMPLE_DEVICE!r})
x = np.arange(50, dtype=np.float32)
k(np.zeros(1, np.uint8), x, x, np.zeros(50, np.float32), 50)
time.sleep(600)
"""


@pytest.mark.skipif(not NATIVE, reason="native kernels need Linux and a C compiler")
def test_kill_9_during_a_native_build_leaves_a_directory_the_next_build_sweeps(tmp_path, monkeypatch, fresh_root):
    tmp = tmp_path / "systmp"
    tmp.mkdir()
    marker = tmp_path / "marker"
    env = dict(os.environ, DG_JIT_CACHE_DIR=str(tmp_path / "childroot"), TMPDIR=str(tmp), MARKER=str(marker))
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(KILLED_BUILD_CHILD)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 240
        while not marker.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        assert marker.exists(), proc.communicate(timeout=10) if proc.poll() is not None else "no link in 240 s"
        proc.kill()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    (left,) = tmp.glob(f"deep_gemm-native-{proc.pid}-*")
    assert (left / "native.c").is_file()
    old = time.time() - 2 * cache.STALE_TMP_SECONDS
    os.utime(left, (old, old))
    # The first native build of this process sweeps it (in the same temp directory)
    monkeypatch.setattr(native.tempfile, "tempdir", str(tmp))
    monkeypatch.setattr(native, "_swept", False)
    kernel = build_vadd(TILE=24)
    run_vadd(kernel)
    wait_native_builds()
    assert kernel.native is not None
    assert not left.exists() and not list(tmp.iterdir())


# DG_* variables -------------------------------------------------------------------------------------------------


BAD_VALUES = {bool: "maybe", int: "yes", str: "no-such-choice"}


@pytest.mark.parametrize("name", sorted(envs.ENV_VARS))
def test_every_dg_variable_with_a_bad_value_fails_naming_it(monkeypatch, name):
    var = envs.ENV_VARS[name]
    if var.kind is str and not var.choices:
        pytest.skip(f"{name} takes any string")
    bad = BAD_VALUES[var.kind]
    monkeypatch.setenv(name, bad)
    for check in (var.get, envs.check_environment):
        with pytest.raises(ValueError, match=f"{name}={bad!r} is invalid: expected") as info:
            check()
        assert "unset it" in str(info.value)
    if var.minimum is not None:
        monkeypatch.setenv(name, str(var.minimum - 1))
        with pytest.raises(ValueError, match=f">= {var.minimum}"):
            var.get()


def test_dg_variables_accept_their_documented_spellings(monkeypatch):
    from deep_gemm.arch import ARCHS, get_arch

    for text, value in (("1", True), ("yes", True), ("On", True), ("0", False), ("FALSE", False), (" off ", False)):
        monkeypatch.setenv("DG_JIT_NATIVE", text)
        assert envs.DG_JIT_NATIVE.get() is value
    monkeypatch.setenv("DG_JIT_DEBUG", " 3 ")
    assert envs.DG_JIT_DEBUG.get() == 3
    monkeypatch.setenv("DG_JIT_LAUNCHER", "PRANGE")
    assert envs.DG_JIT_LAUNCHER.get() == "prange"
    # the arch names are those of deep_gemm/arch.py, matched the way get_arch matches them
    assert set(envs.DG_NPU_ARCH.choices) == set(ARCHS)
    for text in ("950pr", "Ascend950PR", "ascend_950pr", "Ascend-910B2"):
        monkeypatch.setenv("DG_NPU_ARCH", text)
        assert envs.DG_NPU_ARCH.get() == get_arch(text).name
    monkeypatch.setenv("DG_JIT_DEBUG", "")
    assert envs.DG_JIT_DEBUG.get() == 0  # empty: the default


def test_dg_jit_debug_yes_fails_at_the_start_with_a_clear_error(tmp_path):
    code = "import deep_gemm\ndeep_gemm.bf16_gemm_nt\n"
    env = dict(os.environ, DG_JIT_DEBUG="yes", DG_JIT_CACHE_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: environment variable DG_JIT_DEBUG='yes' is invalid: expected an integer"), \
        proc.stderr
    assert "compile.py" not in proc.stderr and "numba" not in proc.stderr  # before any JIT work
