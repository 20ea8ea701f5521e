"""Native code in the kernel cache (jit/native.py): a fresh process runs a cached kernel without importing numba (or
jinja2), the library is checked like every other cache file, an entry built for another CPU is rebuilt (never run),
and the native path gives the numba path's results bit for bit, falling back to numba for arguments it does not
cover."""

from __future__ import annotations

import json
import os
import threading
import warnings

import numpy as np
import pytest
from jit_helpers import EXAMPLE_DEVICE, VADD_CHILD, VADD_CONSTS, run_child, stats_delta, vadd_reference

from deep_gemm.jit import KernelRunError, build, native, stats
from deep_gemm.jit import compile as jit_compile
from deep_gemm.jit.compile import wait_native_builds
from deep_gemm.jit.compiled_kernel import CORE_COUNTER_TYPE_NAME

pytestmark = pytest.mark.skipif(not native.enabled() or native.compiler() is None,
                                reason="native kernels need Linux and a C compiler")

# A child that runs the cached vadd and reports whether numba / jinja2 were imported.
NATIVE_CHILD = f"""
import json, sys
import numpy as np
from deep_gemm.jit import build, stats
from deep_gemm.jit.compile import wait_native_builds
k = build("vadd", {VADD_CONSTS!r}, template="examples/vadd", device_module={EXAMPLE_DEVICE!r})
x = np.arange(50, dtype=np.float32); y = np.ones(50, np.float32); z = np.zeros(50, np.float32)
k(np.zeros(1, np.uint8), x, y, z, 50)
k.compile()  # precompiling a kernel its native library serves needs no numba either
wait_native_builds()
print(json.dumps({{"stats": stats(), "numba": "numba" in sys.modules, "jinja2": "jinja2" in sys.modules,
                  "native": k.native is not None,
                  "ok": bool(np.array_equal(z, (x + y) * np.float32({VADD_CONSTS['SCALE']!r})))}}))
"""


def _entry(root):
    (entry,) = (root / "cache").iterdir()
    return entry


def test_fresh_process_runs_a_cached_kernel_without_numba(fresh_root):
    first = run_child(VADD_CHILD, fresh_root)
    assert first["ok"], first
    entry = _entry(fresh_root)  # the native library is built in the background and published before exit
    record = json.loads((entry / native.NATIVE_JSON).read_text())
    assert (entry / record["library"]).is_file() and record["target"] == native.current_target()
    # the entry's signature ends with the launcher's core counter, spelled as the numba-free check spells it
    assert record["signature"][-1] == CORE_COUNTER_TYPE_NAME, record["signature"]
    second = run_child(NATIVE_CHILD, fresh_root)
    assert second["ok"] and second["native"], second
    assert second["numba"] is False and second["jinja2"] is False, second
    assert second["stats"] == {"disk_hit": 1, "native_load": 1}, second


def test_fresh_process_runs_a_cached_fp8_gemm_without_numba(tmp_path):
    code = """
        import json, sys
        import numpy as np, ml_dtypes
        import deep_gemm
        from deep_gemm.jit import stats
        rng = np.random.default_rng(0)
        m, n, k = 40, 64, 256
        a = rng.integers(0, 256, size=(m, k), dtype=np.uint8); a[(a & 0x7F) == 0x7F] = 0
        b = rng.integers(0, 256, size=(n, k), dtype=np.uint8); b[(b & 0x7F) == 0x7F] = 0
        sfa = np.ones((m, k // 32), np.float32); sfb = np.full((n, k // 32), 0.5, np.float32)
        d = np.empty((m, n), ml_dtypes.bfloat16)
        deep_gemm.fp8_gemm_nt((a.view(ml_dtypes.float8_e4m3fn), sfa), (b.view(ml_dtypes.float8_e4m3fn), sfb), d)
        from deep_gemm.jit.compile import wait_native_builds
        wait_native_builds()
        print(json.dumps({"stats": stats(), "numba": "numba" in sys.modules, "d": d.view(np.uint16).tolist()}))
    """
    first = run_child(code, tmp_path)
    assert first["stats"].get("native_build") == 1, first
    second = run_child(code, tmp_path)
    assert second["numba"] is False and second["stats"].get("native_load") == 1, second
    assert second["d"] == first["d"]  # the native library gives numba's results bit for bit


def _forge_target(entry, **changes):
    record = json.loads((entry / native.NATIVE_JSON).read_text())
    record["target"].update(changes)
    record["checksum"] = native._checksum(record)  # a consistent record, built for another CPU
    (entry / native.NATIVE_JSON).write_text(json.dumps(record))
    return record


def test_entry_built_for_other_cpu_features_is_rebuilt_not_run(fresh_root):
    assert run_child(VADD_CHILD, fresh_root)["ok"]
    entry = _entry(fresh_root)
    forged = _forge_target(entry, cpu_features="+sse2,-avx,-avx2,+forged-feature")
    out = run_child(NATIVE_CHILD, fresh_root)
    assert out["ok"] and "native_load" not in out["stats"], out  # the forged library was never loaded
    assert out["stats"].get("native_stale") == 1 and out["stats"].get("native_build") == 1, out
    assert out["numba"] is True  # numba built it again
    record = json.loads((entry / native.NATIVE_JSON).read_text())
    assert record["target"] == native.current_target() and record["target"] != forged["target"]
    again = run_child(NATIVE_CHILD, fresh_root)
    assert again["ok"] and again["numba"] is False and again["stats"].get("native_load") == 1, again


@pytest.mark.parametrize("damage", ["library", "record"])
def test_damaged_native_files_are_reported_and_rebuilt(fresh_root, damage):
    assert run_child(VADD_CHILD, fresh_root)["ok"]
    entry = _entry(fresh_root)
    record = json.loads((entry / native.NATIVE_JSON).read_text())
    if damage == "library":
        lib = entry / record["library"]
        data = bytearray(lib.read_bytes())
        data[len(data) // 2] ^= 0xFF
        lib.write_bytes(bytes(data))
    else:
        (entry / native.NATIVE_JSON).write_text(json.dumps(record)[:-40])
    out = run_child(NATIVE_CHILD, fresh_root)
    assert out["ok"] and "native_load" not in out["stats"], out
    assert out["stats"].get("corrupt") == 1 and out["stats"].get("native_build") == 1, out
    warnings = [line for line in out["stderr"].splitlines() if "RuntimeWarning" in line]
    assert len(warnings) == 1 and "native library" in warnings[0], out["stderr"]
    again = run_child(NATIVE_CHILD, fresh_root)
    assert again["ok"] and again["stats"].get("native_load") == 1 and "corrupt" not in again["stats"], again


def test_native_and_numba_paths_agree_bitwise_and_uncovered_arguments_fall_back(fresh_root, rng):
    kernel = build("vadd", VADD_CONSTS, template="examples/vadd", device_module=EXAMPLE_DEVICE)
    x, y = rng.standard_normal(300).astype(np.float32), rng.standard_normal(300).astype(np.float32)
    z = np.zeros(300, np.float32)
    kernel(np.zeros(1, np.uint8), x, y, z, 300)  # compiles, then builds the native library
    wait_native_builds()
    assert kernel.native is not None
    z_native = np.zeros(300, np.float32)
    before = stats()
    kernel(np.zeros(1, np.uint8), x, y, z_native, 300)
    assert "native_fallback" not in stats_delta(before)
    z_numba = np.zeros(300, np.float32)
    kernel._numba_call(kernel._bind((np.zeros(1, np.uint8), x, y, z_numba, 300), {}))
    assert z_native.tobytes() == z_numba.tobytes() == z.tobytes()
    np.testing.assert_array_equal(z_native, vadd_reference(x, y, VADD_CONSTS["SCALE"]))
    # a strided view is not what the native signature was compiled for: numba runs it (and compiles that layout)
    wide = np.repeat(x, 2)
    out = np.zeros(300, np.float32)
    before = stats()
    kernel(np.zeros(1, np.uint8), wide[::2], y, out, 300)
    assert stats_delta(before).get("native_fallback") == 1
    np.testing.assert_array_equal(out, vadd_reference(x, y, VADD_CONSTS["SCALE"]))


def test_codegen_settings_predicted_without_numba_equal_the_applied_ones(tmp_path):
    code = """
        import json, sys
        from deep_gemm.jit.numba_setup import apply_numba_settings, codegen_settings, CODEGEN_SETTINGS
        predicted = codegen_settings()
        assert "numba" not in sys.modules
        applied = {k: v for k, v in apply_numba_settings().items() if k in CODEGEN_SETTINGS}
        print(json.dumps({"predicted": predicted, "applied": applied}))
    """
    out = run_child(code, tmp_path)
    assert out["predicted"] == out["applied"], out


def test_no_c_compiler_keeps_the_numba_path(fresh_root):
    out = run_child(VADD_CHILD, fresh_root, extra_env={"CC": "/nonexistent/cc", "PATH": "/nonexistent"})
    assert out["ok"] and "native_build" not in out["stats"] and out["stats"].get("native_unavailable") == 1, out
    assert not (_entry(fresh_root) / native.NATIVE_JSON).exists()


def test_dg_jit_native_0_builds_and_runs_no_native_code(fresh_root):
    out = run_child(NATIVE_CHILD, fresh_root, extra_env={"DG_JIT_NATIVE": "0"})
    assert out["ok"] and not out["native"] and out["numba"] is True, out
    assert not any(k.startswith("native_") for k in out["stats"]), out
    assert not (_entry(fresh_root) / native.NATIVE_JSON).exists()


@pytest.fixture
def native_vadd(fresh_root):
    """The example vadd with its native library built and loaded in this process."""
    kernel = build("vadd", VADD_CONSTS, template="examples/vadd", device_module=EXAMPLE_DEVICE)
    x = np.arange(50, dtype=np.float32)
    kernel(np.zeros(1, np.uint8), x, x, np.zeros(50, np.float32), 50)
    wait_native_builds()
    assert kernel.native is not None
    return kernel


# Short-lived threads each allocate and free 8 x 4 MB through the native library's NRT functions (what a kernel's
# per-core np.empty does), in a fresh process that loads the library from the cache.
THREAD_EXIT_CHILD = f"""
import ctypes, json, threading
import numpy as np
from deep_gemm.jit import build
k = build("vadd", {VADD_CONSTS!r}, template="examples/vadd", device_module={EXAMPLE_DEVICE!r})
handle = k.native.handle
alloc, free = handle.NRT_MemInfo_alloc_safe_aligned, handle.NRT_MemInfo_call_dtor
alloc.restype, alloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_uint]
free.restype, free.argtypes = None, [ctypes.c_void_p]
size = 4 << 20

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * ctypes.CDLL(None).getpagesize()

def worker():
    blocks = [alloc(size, 64) for _ in range(8)]
    for b in blocks:
        ctypes.memset(ctypes.c_void_p.from_address(b + 24).value, 1, size)  # dg_meminfo.data: touch every page
    for b in blocks:
        free(b)

trim = getattr(ctypes.CDLL(None), "malloc_trim", lambda pad: 0)
trim(0)
before = rss()
for _ in range(20):
    t = threading.Thread(target=worker)
    t.start()
    t.join()
trim(0)
print(json.dumps({{"grown": rss() - before}}))
"""


def test_native_runtime_frees_reused_blocks_at_thread_exit(native_vadd, fresh_root):
    # What a thread keeps for reuse is bounded and freed when it exits.
    # NOTES: malloc_trim first and last, so what is measured is what the threads kept: glibc may hold memory that
    # was freed (an exited thread's arena, a raised mmap threshold) until trimmed. In a fresh process: in a
    # long-lived test worker whose heap earlier tests fragmented, glibc kept ~480 MB even trimmed, with every block
    # freed (it did in two sessions, after unrelated changes to what the worker ran before). glibc only.
    out = run_child(THREAD_EXIT_CHILD, fresh_root)
    grown = out["grown"]
    assert grown < 200 << 20, f"RSS grew by {grown >> 20} MB after 20 threads each freed 32 MB"


def test_loading_native_libraries_keeps_no_descriptor_open_and_leaves_no_file(native_vadd, tmp_path, monkeypatch):
    monkeypatch.setattr(native.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    native.load(native_vadd.path, native_vadd.digest)
    before = len(os.listdir("/proc/self/fd"))
    kernels = [native.load(native_vadd.path, native_vadd.digest) for _ in range(5)]
    assert len(os.listdir("/proc/self/fd")) == before
    assert len({id(k.handle) for k in kernels}) == 5 and not any((tmp_path / "tmp").iterdir())


def test_native_library_that_cannot_be_loaded_here_is_not_reported_damaged(native_vadd, monkeypatch):
    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(native.tempfile, "mkdtemp", no_space)
    with pytest.raises(native.NativeUnavailable) as info:
        native.load(native_vadd.path, native_vadd.digest)
    assert info.value.args[1] == "unavailable", info.value.args
    jit_compile.clear_memory_cache()
    before = stats()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no corruption warning
        kernel = build("vadd", VADD_CONSTS, template="examples/vadd", device_module=EXAMPLE_DEVICE)
        x = np.arange(50, dtype=np.float32)
        z = np.zeros(50, np.float32)
        kernel(np.zeros(1, np.uint8), x, x, z, 50)
        wait_native_builds()
    delta = stats_delta(before)
    assert "corrupt" not in delta and "native_load" not in delta, delta
    np.testing.assert_array_equal(z, vadd_reference(x, x, VADD_CONSTS["SCALE"]))


def test_native_load_during_a_concurrent_rebuild_reads_the_new_library(native_vadd, monkeypatch):
    # A reader that read native.json just before a rebuild replaced the library (new library and record published,
    # old library removed, as _link does) reads the record again instead of reporting the entry damaged.
    entry, read_record = native_vadd.path, native.read_record
    calls = []

    def read_then_rebuild(path):
        record = read_record(path)
        if not calls:
            new = dict(record, library="native-0123456789abcdef.so")
            new["checksum"] = native._checksum(new)
            (entry / new["library"]).write_bytes((entry / record["library"]).read_bytes())
            (entry / native.NATIVE_JSON).write_text(json.dumps(new))
            (entry / record["library"]).unlink()
        calls.append(path)
        return record

    monkeypatch.setattr(native, "read_record", read_then_rebuild)
    loaded = native.load(entry, native_vadd.digest)
    assert loaded.path.name == "native-0123456789abcdef.so" and len(calls) == 2


@pytest.mark.parametrize("status", [-3, 1])
def test_failed_native_launch_raises_and_never_reruns_on_written_outputs(native_vadd, status):
    # A native phase that wrote part of the output and then failed: the launch raises KernelRunError naming the
    # kernel and the status; numba does not run the launch again over the written output (and success is never
    # returned, even when numba would run it without raising).
    def failing_phase(*args):
        args[3][:5] = 7.0
        raise native.NativeStatus(status)

    native_vadd.native.phases = [failing_phase]
    native_vadd._call = native_vadd._make_native_call()
    x = np.arange(50, dtype=np.float32)
    z = np.zeros(50, np.float32)
    before = stats()
    with pytest.raises(KernelRunError, match=f"status {status}") as info:
        native_vadd(np.zeros(1, np.uint8), x, x, z, 50)
    assert info.value.kernel == "vadd" and info.value.status == status and "invalid" in str(info.value)
    assert stats_delta(before).get("native_error") == 1 and "native_fallback" not in stats_delta(before)
    if status == -3:  # not a raised exception: numba never ran, the output is as the native phase left it
        assert np.all(z[:5] == 7.0) and np.all(z[5:] == 0.0)


def test_native_kernel_that_raised_raises_numbas_exception_chained(native_vadd, monkeypatch):
    def raising_phase(*args):
        raise native.NativeStatus(1)

    def numba_raises(args):
        raise ZeroDivisionError("from the numba run")

    native_vadd.native.phases = [raising_phase]
    native_vadd._call = native_vadd._make_native_call()
    monkeypatch.setattr(native_vadd, "_numba_call", numba_raises)
    x = np.arange(50, dtype=np.float32)
    with pytest.raises(ZeroDivisionError, match="from the numba run") as info:
        native_vadd(np.zeros(1, np.uint8), x, x, np.zeros(50, np.float32), 50)
    assert isinstance(info.value.__cause__, KernelRunError) and info.value.__cause__.status == 1


def test_forked_child_does_not_inherit_held_native_build_locks():
    # A fork while a native build runs (its thread holding the locks) must not leave the child's builds blocked.
    with native._build_lock, jit_compile._native_lock:
        jit_compile._native_builds.append(threading.current_thread())
        try:
            pid = os.fork()
            if pid == 0:  # the child: only os._exit, whatever happens
                ok = False
                try:
                    ok = (native._build_lock.acquire(timeout=2) and jit_compile._native_lock.acquire(timeout=2)
                          and jit_compile._native_builds == [])
                finally:
                    os._exit(0 if ok else 1)
            _, status = os.waitpid(pid, 0)
        finally:
            jit_compile._native_builds.remove(threading.current_thread())
    assert os.waitstatus_to_exitcode(status) == 0
