"""The kernel cache under faults: byte damage in every cached file kind, a plain file at an entry path, a full or
unwritable disk, Ctrl-C during a compile. Damaged loads run in child processes, so a crash fails the test."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from jit_helpers import EXAMPLE_DEVICE, VADD_CHILD, VADD_CONSTS, run_child, stats_delta, vadd_args, vadd_reference

from deep_gemm.jit import build, cache, native, numba_cache, stats
from deep_gemm.jit import compile as jit_compile

REPO = Path(__file__).resolve().parents[2]


def build_vadd(**overrides):
    return build("vadd", {**VADD_CONSTS, **overrides}, template="examples/vadd", device_module=EXAMPLE_DEVICE)


def run_vadd(kernel, rng, n=40):
    unused, x, y, z, n = vadd_args(n, rng)
    kernel(unused, x, y, z, n)
    np.testing.assert_array_equal(z, vadd_reference(x, y, kernel.constants["SCALE"]))


def runtime_warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "RuntimeWarning: deep_gemm.jit" in line]


def leftovers(root: Path) -> list[Path]:
    """Partial builds and half-written files anywhere under a cache root."""
    tmp = [p for p in (root / "tmp").iterdir() if not p.name.startswith(".probe-")] if (root / "tmp").is_dir() else []
    return tmp + [p for p in root.rglob("*") if ".tmp." in p.name]


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Forget the once-per-process warnings given so far (each test sees its own)."""
    monkeypatch.setattr(cache, "_warned", set())


# Byte damage in every cached file kind ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A cache root holding vadd's entry and the device module's numba files, built by a child process."""
    root = tmp_path_factory.mktemp("pristine")
    out = run_child(VADD_CHILD, root)
    assert out["ok"] and out["stats"].get("build") == 1
    return root, Path(out["path"]).relative_to(root)


def _damage_targets(root: Path, entry: Path) -> dict[str, Path]:
    device_dirs = sorted((root / numba_cache.SHARED_DIR).iterdir())
    assert len(device_dirs) == 1, device_dirs
    biggest = lambda pattern, d: max(d.glob(pattern), key=lambda p: p.stat().st_size)  # noqa: E731
    return {
        "kernel.asc": entry / "kernel.asc",
        "kernel.py": entry / "kernel.py",
        "meta.json": entry / "meta.json",
        "kernel.nbi": biggest("kernel.vadd-*.nbi", entry / "__pycache__"),
        "kernel.nbc": biggest("kernel.vadd-*.nbc", entry / "__pycache__"),
        "numba.json": entry / "__pycache__" / numba_cache.MANIFEST,
        "device.nbi": biggest("*.nbi", device_dirs[0]),
        "device.nbc": biggest("*.nbc", device_dirs[0]),
        "native.so": biggest("native-*.so", entry),
        "native.json": entry / native.NATIVE_JSON,
    }


@pytest.mark.parametrize("kind", ["kernel.asc", "kernel.py", "meta.json", "kernel.nbi", "kernel.nbc", "numba.json",
                                  "device.nbi", "device.nbc", "native.so", "native.json"])
def test_zeroed_bytes_in_any_cached_file_never_crash(pristine, tmp_path, kind):
    root0, entry_rel = pristine
    size = _damage_targets(root0, root0 / entry_rel)[kind].stat().st_size
    cases = []
    for offset in sorted({min(offset, size - 16) for offset in (1000, 5000, 200000)}):
        root = tmp_path / f"at{offset}"
        shutil.copytree(root0, root)
        target = _damage_targets(root, root / entry_rel)[kind]
        data = bytearray(target.read_bytes())
        changed = any(data[offset:offset + 16])
        data[offset:offset + 16] = bytes(16)
        target.write_bytes(bytes(data))
        if kind.startswith("device."):
            # a kernel loaded from the cache carries its device code; a new kernel's compile reads the device files
            shutil.rmtree(root / entry_rel)
        cases.append((offset, root, target, changed))
    # one child per damaged copy, run side by side; a crash (signal exit status) or any error fails the test
    # NOTES: numba's files of the entry are read only on the numba path (the native library serves it otherwise)
    env = {"DG_JIT_NATIVE": "0"} if kind.startswith(("kernel.nb", "numba.")) else {}
    procs = [subprocess.Popen([sys.executable, "-c", VADD_CHILD],
                              env=dict(os.environ, DG_JIT_CACHE_DIR=str(root), **env),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _, root, _, _ in cases]
    results = [proc.communicate(timeout=600) + (proc.returncode,) for proc in procs]
    for (offset, root, target, changed), (stdout, stderr, code) in zip(cases, results, strict=True):
        assert code == 0, f"{kind} zeroed at {offset}: exit status {code}\n{stderr}"
        out = json.loads(stdout.strip().splitlines()[-1])
        assert out["ok"], (kind, offset, out)
        if changed:
            assert out["stats"].get("corrupt", 0) >= 1, (kind, offset, out)
            assert len(runtime_warnings(stderr)) == 1, (kind, offset, stderr)
            assert str(target.parent) in stderr or str(root / entry_rel) in stderr, stderr
        # whatever was damaged is whole again afterwards
        entry = root / entry_rel
        assert cache.check_entry(entry, "vadd", entry.name.split(".", 1)[1]) is None
        for d in [entry / "__pycache__", *(root / numba_cache.SHARED_DIR).iterdir()]:
            assert numba_cache.directory_problem(d) is None, (kind, offset, d)
        if not env:  # the native library was verified, or rebuilt, and published again
            assert native.load(entry, entry.name.split(".", 1)[1]).path.is_file(), (kind, offset)
        assert not leftovers(root)


# What sits at an entry path -----------------------------------------------------------------------------------


def test_plain_file_at_entry_path_is_moved_aside_once_and_rebuilt(fresh_root, fresh_warnings, rng):
    kernel = build_vadd(TILE=72)
    entry = kernel.path
    shutil.rmtree(entry)
    entry.write_text("not an entry")
    jit_compile.clear_memory_cache()
    before = stats()
    with pytest.warns(RuntimeWarning, match=f"corrupt kernel cache entry {entry}: it is not a directory") as record:
        rebuilt = build_vadd(TILE=72)
    assert len(record) == 1
    assert stats_delta(before).get("build") == 1 and rebuilt.path == entry and entry.is_dir()
    assert cache.check_entry(entry, "vadd", rebuilt.digest) is None
    run_vadd(rebuilt, rng)
    assert not leftovers(fresh_root)
    jit_compile.clear_memory_cache()
    assert build_vadd(TILE=72).source == "disk"


def test_unreadable_entry_is_moved_aside_and_rebuilt(fresh_root, fresh_warnings, rng):
    kernel = build_vadd(TILE=80)
    entry = kernel.path
    (entry / "meta.json").unlink()
    (entry / "meta.json").mkdir()  # read_bytes() raises IsADirectoryError, whoever we run as
    jit_compile.clear_memory_cache()
    with pytest.warns(RuntimeWarning, match="meta.json is unreadable"):
        rebuilt = build_vadd(TILE=80)
    assert rebuilt.source == "built" and cache.check_entry(entry, "vadd", rebuilt.digest) is None
    run_vadd(rebuilt, rng)


def test_verified_entry_that_fails_to_import_is_reported_and_kept(fresh_root, fresh_warnings, monkeypatch):
    kernel = build_vadd(TILE=88)
    jit_compile.clear_memory_cache()
    sys.modules.pop(kernel.module.__name__, None)

    def broken(*args, **kwargs):
        raise ImportError("simulated: the device module lost a function")

    monkeypatch.setattr(jit_compile, "_import_kernel", broken)
    with pytest.raises(jit_compile.CompileError, match=f"cache entry {kernel.path} verifies but"):
        build_vadd(TILE=88)
    assert kernel.path.is_dir() and cache.check_entry(kernel.path, "vadd", kernel.digest) is None


def test_clear_cache_script_removes_whatever_sits_in_the_cache(fresh_root):
    kernel = build_vadd(TILE=96)
    (fresh_root / "cache" / "vadd.0123abcd").write_text("a file at an entry path")
    (fresh_root / "tmp" / "123-abc").mkdir(parents=True)
    (fresh_root / "tmp" / "123-abc" / "kernel.py").write_text("partial")
    (fresh_root / "tmp" / "feed.corrupt").write_text("moved aside")
    (fresh_root / numba_cache.SHARED_DIR / "x_1").mkdir(parents=True)
    (fresh_root / numba_cache.SHARED_DIR / "x_1" / "f.nbi").write_bytes(b"index")
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "clear_cache.py"), "--root", str(fresh_root)],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr
    assert str(kernel.path) in proc.stdout and "vadd.0123abcd" in proc.stdout
    for sub in ("cache", "tmp", numba_cache.SHARED_DIR):
        assert not [p for p in (fresh_root / sub).iterdir() if not p.name.startswith(".probe-")], sub


# A cache that cannot be written ---------------------------------------------------------------------------------


def test_no_writable_root_compiles_in_memory_with_one_warning(tmp_path, monkeypatch, fresh_warnings, rng):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setattr(cache, "_candidates", lambda: [("DG_JIT_CACHE_DIR", blocker / "a"),
                                                       ("user cache", blocker / "b")])
    cache._resolve_roots.cache_clear()
    jit_compile.clear_memory_cache()
    try:
        with pytest.warns(RuntimeWarning) as record:
            first = build_vadd(TILE=104)
            run_vadd(first, rng)
            second = build_vadd(TILE=112)
            run_vadd(second, rng)
        messages = [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)]
        assert len(messages) == 1 and "compiled in memory" in messages[0], messages
        assert first.source == second.source == "memory" and first.path is None
        assert "DG_JIT_CACHE_DIR" in first.repro_command()
    finally:
        cache._resolve_roots.cache_clear()
        jit_compile.clear_memory_cache()


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX ownership only")
def test_a_temp_dir_fallback_others_can_write_is_never_used(tmp_path, monkeypatch, fresh_warnings):
    """The last-resort root sits in the shared temp dir: one that group or others may write (someone could plant
    a kernel.py there) is skipped; a private one of this user is used."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    private = tmp_path / "private"
    try:
        monkeypatch.setattr(cache, "_candidates", lambda: [("user cache", blocker / "b"), ("temp dir", shared)])
        cache._resolve_roots.cache_clear()
        with pytest.warns(RuntimeWarning):
            assert cache.cache_roots().write is None
        monkeypatch.setattr(cache, "_candidates", lambda: [("user cache", blocker / "b"), ("temp dir", private)])
        cache._resolve_roots.cache_clear()
        with pytest.warns(RuntimeWarning, match="not writable; new kernels go to"):
            assert cache.cache_roots().write == private
        assert private.stat().st_mode & 0o777 == 0o700
    finally:
        cache._resolve_roots.cache_clear()


@pytest.mark.parametrize("code,tile", [(errno.EROFS, 152), (errno.EACCES, 160), (errno.ENOSPC, 168)])
def test_numba_save_failure_after_the_compile_never_fails_the_call(fresh_root, fresh_warnings, monkeypatch, rng,
                                                                   code, tile):
    def refuse(path, data):
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(numba_cache, "write_atomic", refuse)
    before = stats()
    with pytest.warns(RuntimeWarning, match="could not be written") as record:
        kernel = build_vadd(TILE=tile)
        run_vadd(kernel, rng)
    assert len(record) == 1
    delta = stats_delta(before)
    assert delta.get("numba_compile") == 1 and delta.get("cache_write_failed", 0) >= 1, delta
    assert kernel.source == "built" and not list(kernel.path.glob("__pycache__/*.nb?"))
    assert not leftovers(fresh_root)
    run_vadd(kernel, rng)  # and it keeps working


def _mount_tmpfs(path: Path, size: str) -> str | None:
    """Mount a tmpfs of ``size`` at path; None on success, else why not (the test is then skipped)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "mounting a small tmpfs needs root"
    if shutil.which("mount") is None:
        return "no mount command"
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        return f"mount -t tmpfs failed here: {proc.stderr.strip() or proc.returncode}"
    return None


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    reason = _mount_tmpfs(mnt, "1m")
    if reason is not None:
        pytest.skip(reason)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(mnt: Path, keep_free: int) -> Path:
    st = os.statvfs(mnt)
    filler = mnt / "filler"
    with open(filler, "wb") as f:
        f.write(bytes(st.f_bavail * st.f_frsize - keep_free))
    return filler


@pytest.mark.parametrize("free", [4096, 32768], ids=["entry-files-do-not-fit", "numba-files-do-not-fit"])
def test_full_disk_returns_the_right_answer_with_one_warning(small_disk, free):
    root = small_disk / "root"
    root.mkdir()
    filler = _fill(small_disk, free)
    out = run_child(VADD_CHILD, root)
    assert out["ok"], out
    warnings = runtime_warnings(out["stderr"])
    assert len(warnings) == 1 and "could not be written" in warnings[0], out["stderr"]
    assert "No space left on device" in warnings[0]
    assert not leftovers(root), leftovers(root)
    # a later process with space builds (or completes) the cache normally
    filler.unlink()
    later = run_child(VADD_CHILD, root)
    assert later["ok"] and not runtime_warnings(later["stderr"]), later
    again = run_child(VADD_CHILD, root, extra_env={"DG_JIT_NATIVE": "0"})  # numba's cache, not native code
    assert again["source"] == "disk" and again["numba"] == {"cache_hits": 1, "cache_misses": 0}, again
    assert not runtime_warnings(again["stderr"]) and not leftovers(root)


def test_read_only_disk_serves_its_entries_with_one_warning(small_disk, tmp_path):
    root = small_disk / "root"
    root.mkdir()
    first = run_child(VADD_CHILD, root)
    entry = Path(first["path"])
    for f in entry.glob("__pycache__/*.nb?"):
        f.unlink()  # numba must compile again, and may not write there
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    xdg = tmp_path / "xdg"  # the fallback root for new kernels (user cache directory)
    # NOTES: DG_JIT_NATIVE=0: the native library in the entry would serve it without numba's files
    out = run_child(VADD_CHILD, root, extra_env={"XDG_CACHE_HOME": str(xdg), "DG_JIT_NATIVE": "0"})
    assert out["ok"] and out["source"] == "disk" and out["path"] == str(entry), out
    assert out["stats"].get("numba_compile") == 1, out
    warnings = runtime_warnings(out["stderr"])
    assert len(warnings) == 1 and f"{root} (DG_JIT_CACHE_DIR) is not writable" in warnings[0], out["stderr"]
    assert not list(entry.glob("__pycache__/*.nb?"))


GEMM_CHILD = """
import json
import numpy as np
import deep_gemm
from deep_gemm.testing import bf16_operand, calc_diff, reference_gemm
rng = np.random.default_rng(0)
a, b = bf16_operand(rng, 64, 128), bf16_operand(rng, 96, 128)
d = np.zeros((64, 96), np.float32)
deep_gemm.bf16_gemm_nt(a, b, d)
print(json.dumps({"diff": float(calc_diff(d, reference_gemm(a, b)))}))
"""


@pytest.mark.slow
def test_full_disk_gemm_returns_the_right_answer(small_disk):
    root = small_disk / "root"
    root.mkdir()
    _fill(small_disk, 32768)
    out = run_child(GEMM_CHILD, root, timeout=900)
    assert out["diff"] < 1e-5, out
    assert len(runtime_warnings(out["stderr"])) == 1, out["stderr"]
    assert not leftovers(root)


# Ctrl-C during a compile ----------------------------------------------------------------------------------------


def test_interrupt_inside_the_compiler_reaches_the_caller_and_the_next_call_works(fresh_root, monkeypatch, rng):
    from numba.core import compiler

    original = compiler.compile_extra
    calls = []

    def interrupted_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(compiler, "compile_extra", interrupted_once)
    kernel = build_vadd(TILE=136)
    with pytest.raises(KeyboardInterrupt):
        run_vadd(kernel, rng)
    run_vadd(kernel, rng)
    run_vadd(kernel, rng)
    assert len(calls) >= 2


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # ctypes reports the swallowed one
@pytest.mark.filterwarnings("ignore:deep_gemm.jit. numba's cache of:RuntimeWarning")
def test_interrupt_swallowed_inside_llvm_callback_still_reaches_the_caller(fresh_root, fresh_warnings, rng):
    """SIGINT handled inside LLVM's object-code callback: ctypes swallows the KeyboardInterrupt there and numba
    later failed with 'RuntimeError: no compiled object yet'. The caller must see KeyboardInterrupt."""
    from numba.core.registry import cpu_target

    engine = cpu_target.target_context.codegen()._engine._ee
    original = engine._object_cache_notify
    fired = []

    def notify(module, buf):
        if not fired:
            fired.append(1)
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs at the next bytecode, inside this callback
            fired.append(2)  # not reached: the KeyboardInterrupt is raised (and swallowed by ctypes) above
        original(module, buf)

    engine._object_cache_notify = notify
    try:
        kernel = build_vadd(TILE=144)
        with pytest.raises(KeyboardInterrupt):
            run_vadd(kernel, rng)
    finally:
        engine._object_cache_notify = original
    assert fired == [1]
    run_vadd(kernel, rng)
    jit_compile.clear_memory_cache()
    run_vadd(build_vadd(TILE=144), rng)


TIMED_SIGINT_CHILD = """
import json, os, signal, threading, time
import numpy as np
from deep_gemm.jit import build
rng = np.random.default_rng(1)
outcomes = []
for i in range({trials}):
    k = build("vadd", {{"NUM_AI_CORES": 3, "TILE": 16, "SCALE": 3.0 + i}}, template="examples/vadd",
              device_module="deep_gemm.jit.example_device")
    x = rng.standard_normal(50).astype(np.float32); y = np.ones(50, np.float32); z = np.zeros(50, np.float32)
    timer = threading.Timer({delay} * (i + 1) / {trials}, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        k(np.zeros(1, np.uint8), x, y, z, 50)
        time.sleep({delay})  # an interrupt that arrives after the call lands here, as KeyboardInterrupt
        outcomes.append("done")
    except KeyboardInterrupt:
        outcomes.append("interrupted")
    except BaseException as e:
        outcomes.append(f"{{type(e).__name__}}: {{e}}")
    timer.cancel()
    z[:] = 0
    k(np.zeros(1, np.uint8), x, y, z, 50)
    if not np.array_equal(z, (x + y) * np.float32(3.0 + i)):
        outcomes.append("wrong result after the interrupt")
print(json.dumps({{"outcomes": outcomes}}))
"""


def test_timed_interrupts_during_compiles_are_keyboard_interrupts(fresh_root):
    """Real SIGINTs at spread-out moments of vadd compiles (fresh kernels): every one reaches the caller as
    KeyboardInterrupt, never as another error, and the next call of the same kernel is correct."""
    out = run_child(TIMED_SIGINT_CHILD.format(trials=8, delay=0.6), fresh_root)
    bad = [o for o in out["outcomes"] if o not in ("done", "interrupted")]
    assert not bad, out["outcomes"]
    assert out["outcomes"].count("interrupted") >= 1, out["outcomes"]


def test_child_helper_reports_crashes(tmp_path):
    """The damage tests rely on run_child failing on a crash (a signal exit status): check that it does."""
    with pytest.raises(AssertionError, match="child failed"):
        run_child("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", tmp_path)


def test_meta_json_checksum_covers_every_field(tmp_path):
    entry = tmp_path / "k.abc"
    entry.mkdir()
    (entry / "kernel.asc").write_text("a")
    (entry / "kernel.py").write_text("b")
    files = {f: cache.file_sha256(entry / f) for f in ("kernel.asc", "kernel.py")}
    meta = {"name": "k", "digest": "abc", "entry": "k", "files": files, "params": [],
            "meta_version": cache.META_VERSION}
    (entry / "meta.json").write_text(cache.meta_text(meta))
    assert cache.check_entry(entry, "k", "abc") is None
    edited = json.loads((entry / "meta.json").read_text())
    edited["entry"] = "other"
    (entry / "meta.json").write_text(json.dumps(edited))
    assert "own checksum" in cache.check_entry(entry, "k", "abc")


def test_builds_left_by_dead_processes_are_swept(fresh_root):
    build_vadd(TILE=176)
    tmp = fresh_root / "tmp"
    dead_old, dead_young, alive_old = tmp / "999999999-aa", tmp / "999999999-bb", tmp / f"{os.getpid()}-cc"
    for path in (dead_old, dead_young, alive_old):
        path.mkdir()
        (path / "kernel.py").write_text("partial")
    old = os.stat(tmp).st_mtime - 2 * cache.STALE_TMP_SECONDS
    for path in (dead_old, alive_old):
        os.utime(path, (old, old))
    jit_compile.clear_memory_cache()
    build_vadd(TILE=184)  # a new build sweeps
    assert not dead_old.exists() and dead_young.exists() and alive_old.exists()


def test_numba_files_save_over_an_unverified_index_and_read_back_verified(tmp_path):
    """A save that finds an index the manifest does not vouch for replaces it (without waiting on its own lock),
    and what it wrote reads back verified."""
    import threading

    file_class = numba_cache._verified_cache_class().file_class
    files = file_class(str(tmp_path), "mod.fn-1.py311", "stamp")
    (tmp_path / "mod.fn-1.py311.nbi").write_bytes(b"not vouched for")
    worker = threading.Thread(target=files.save, args=(("sig",), {"payload": 1}), daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "save() waited for its own lock"
    assert files.load(("sig",)) == {"payload": 1}
    assert numba_cache.directory_problem(tmp_path) is None
    (tmp_path / "mod.fn-1.py311.1.nbc").write_bytes(b"swapped")
    with pytest.raises(numba_cache.DamagedCacheFile):
        files.load(("sig",))


def test_numba_files_of_device_modules_live_under_the_cache_root(tmp_path):
    code = """
import json
import deep_gemm.device as device
from deep_gemm.jit import example_device
import numpy as np
out = np.zeros(4, np.float32)
example_device.fill(out, 3.0)  # compiles and saves, outside any kernel
print(json.dumps({"paths": [example_device.fill.stats.cache_path, device.mmad.stats.cache_path,
                            device.Fixpipe.stats.cache_path], "ok": bool((out == 3.0).all())}))
"""
    root = tmp_path / "root"
    out = run_child(code, root)
    assert out["ok"]
    for path in out["paths"]:
        assert Path(path).parent == root / numba_cache.SHARED_DIR, path
    fill_files = list((root / numba_cache.SHARED_DIR).glob("*/example_device.fill-*.nb?"))
    assert len(fill_files) == 2 and numba_cache.directory_problem(fill_files[0].parent) is None
