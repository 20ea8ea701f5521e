"""cache.py + compile.py: two cache levels, compile counting, keys, corrupt entries, concurrency, fallback roots,
errors with a reproduction command, and the DG_JIT_DEBUG ladder. Compile events are counted, never timed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from jit_helpers import EXAMPLE_DEVICE, VADD_CHILD, VADD_CONSTS, run_child, stats_delta, vadd_args, vadd_reference

from deep_gemm.jit import CompileError, JITError, build, cache, numba_cache, sources, stats
from deep_gemm.jit import compile as jit_compile
from deep_gemm.jit.render import default_template_dir


def build_vadd(**overrides):
    return build("vadd", {**VADD_CONSTS, **overrides}, template="examples/vadd", device_module=EXAMPLE_DEVICE)


def run_vadd(kernel, rng, n=40):
    unused, x, y, z, n = vadd_args(n, rng)
    kernel(unused, x, y, z, n)
    np.testing.assert_array_equal(z, vadd_reference(x, y, kernel.constants["SCALE"]))


# Two levels and compile counting ---------------------------------------------------------------------------------


def test_ten_calls_one_compile(fresh_root, rng):
    before = stats()
    kernels = [build_vadd() for _ in range(10)]
    assert all(k is kernels[0] for k in kernels)
    for _ in range(10):
        run_vadd(kernels[0], rng)
    delta = stats_delta(before)
    assert delta.get("build") == 1 and delta.get("memory_hit") == 9 and "disk_hit" not in delta
    assert delta.get("numba_compile") == 1, delta
    assert kernels[0].source == "built" and kernels[0].loaded_from_numba_cache is False
    entry = kernels[0].path
    assert entry.parent == fresh_root / "cache" and entry.name == f"vadd.{kernels[0].digest}"
    assert {"kernel.asc", "kernel.py", "meta.json", "__pycache__"} <= {p.name for p in entry.iterdir()}
    assert any(entry.glob("__pycache__/*.nbi")), "numba's cache must live inside the entry"
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["constants"] == VADD_CONSTS and meta["entry"] == "vadd"
    assert set(meta["key_components"]) >= {"numba", "llvmlite", "numpy", "tree-sitter-cpp", "python", "codegen_sources",
                                           "device_sources", "device_modules", "meta_version"}
    assert meta["key_components"]["device_modules"] == ["deep_gemm.jit.example_device"]


def test_second_process_loads_from_disk_without_compiling(fresh_root, rng):
    first = run_child(VADD_CHILD, fresh_root)
    assert first["ok"] and first["stats"].get("build") == 1 and first["stats"].get("numba_compile") == 1
    # NOTES: without native code (DG_JIT_NATIVE=0) a later process loads numba's cache of the entry function;
    # test_jit_native.py covers the native library that serves it by default.
    second = run_child(VADD_CHILD, fresh_root, extra_env={"DG_JIT_NATIVE": "0"})
    assert second["ok"] and second["source"] == "disk" and second["path"] == first["path"]
    assert second["stats"].get("disk_hit") == 1 and "build" not in second["stats"]
    assert "numba_compile" not in second["stats"] and "numba_compile_helper" not in second["stats"]
    assert second["stats"].get("numba_cache_load") == 1
    assert second["numba"] == {"cache_hits": 1, "cache_misses": 0}


# Keys -------------------------------------------------------------------------------------------------------------


def test_key_changes_with_template_constants_sources_and_versions(tmp_path, monkeypatch):
    src = (default_template_dir() / "examples" / "vadd.asc.j2").read_text()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "vadd.asc.j2").write_text(src)
    (tmp_path / "b" / "vadd.asc.j2").write_text(src.replace("// Vector add", "// Vector  add"))
    from deep_gemm.jit.render import render

    def key(template_dir="a", consts=VADD_CONSTS, settings=None):
        rendered = render("vadd", consts, tmp_path / template_dir)
        return cache.cache_key("vadd", rendered, EXAMPLE_DEVICE, settings or {"SLP_VECTORIZE": 1})[0]

    base = key()
    assert base == key()  # deterministic
    assert key("b") != base  # any change of the rendered template
    assert key(consts={**VADD_CONSTS, "TILE": 32}) != base
    assert key(settings={"SLP_VECTORIZE": 0}) != base
    monkeypatch.setattr(cache, "codegen_sources_digest", lambda: "edited")
    assert key() != base  # a change to the JIT modules that shape generated code
    monkeypatch.undo()
    monkeypatch.setattr(cache, "tool_versions", lambda: {"numba": "0.0"})
    assert key() != base


FAKE_DEVICE = {
    "__init__.py": "from .a import f\nfrom .b import g\n\n__all__ = ['f', 'g']\n",
    "a.py": "from ._util import helper\n\n\ndef f(x):\n    return helper(x)\n",
    "b.py": "def g(x):\n    return x\n",
    "_util.py": "def helper(x):\n    return x + 1\n",
}


@pytest.fixture
def fake_device(tmp_path, monkeypatch):
    """A device package of its own on sys.path (nothing imports it: the key reads files as text)."""
    name = f"fakedev_{tmp_path.name.replace('-', '_')}"
    pkg = tmp_path / name
    pkg.mkdir()
    for fname, text in FAKE_DEVICE.items():
        (pkg / fname).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    sources.clear_caches()
    yield name, pkg
    sources.clear_caches()


def test_device_key_covers_the_modules_a_kernel_uses(fake_device):
    name, pkg = fake_device

    def key(source="    f(x);  // calls f only\n"):
        sources.clear_caches()  # as a new process would see the files
        return cache.cache_key("k", source, name, {})

    base, components = key()
    assert components["device_intrinsics"] == {"f": f"{name}.a"}
    assert components["device_modules"] == [f"{name}._util", f"{name}.a"]  # f's module and what it imports
    # a new intrinsic in a new module, exported by the package: existing keys stay
    (pkg / "c.py").write_text("def h(x):\n    return 2 * x\n")
    init = FAKE_DEVICE["__init__.py"].replace("__all__ = ['f', 'g']", "from .c import h\n\n__all__ = ['f', 'g', 'h']")
    (pkg / "__init__.py").write_text(init)
    assert key()[0] == base
    (pkg / "b.py").write_text("def g(x):\n    return -x\n")  # an intrinsic this kernel does not call
    assert key()[0] == base
    assert key("g(x); h(x);")[0] != base
    (pkg / "_util.py").write_text("def helper(x):\n    return x + 2\n")  # imported by the intrinsic's module
    changed = key()[0]
    assert changed != base
    (pkg / "a.py").write_text(FAKE_DEVICE["a.py"] + "# edited\n")
    assert key()[0] not in (base, changed)


def test_numba_cache_of_a_device_directory_follows_its_imports_only(tmp_path, monkeypatch):
    """numba checks a cached function against its own file only, but a device function inlines its callees from
    other modules: the shared numba directory of a source directory is keyed by every module its functions can
    reach (imports at top level and inside functions, transitively). An edit there moves the functions to a fresh
    directory; an edit elsewhere in the package does not."""
    top = tmp_path / f"fakepkg_{tmp_path.name.replace('-', '_')}"
    files = {
        "__init__.py": "",
        "dev/__init__.py": "from .a import f\n",
        "dev/a.py": "def f(x):\n    from ..lib.c import K\n    return x + K\n",
        "lib/__init__.py": "",
        "lib/c.py": "from .d import BASE\nK = BASE + 1\n",
        "lib/d.py": "BASE = 1\n",
        "api/x.py": "from ..dev import f\n",
        "jit/__init__.py": "",
    }
    for name, text in files.items():
        (top / name).parent.mkdir(parents=True, exist_ok=True)
        (top / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(numba_cache, "__file__", str(top / "jit" / "numba_cache.py"))
    monkeypatch.setattr(cache, "cache_roots", lambda: cache.CacheRoots(tmp_path / "root", ()))

    def directory():
        sources.clear_caches()  # as a new process would see the files
        numba_cache._sources_tag.cache_clear()
        return numba_cache._shared_directory(top / "dev")

    first = directory()
    assert first.parent == tmp_path / "root" / numba_cache.SHARED_DIR and first.name.startswith("dev_")
    assert directory() == first
    (top / "api/x.py").write_text(files["api/x.py"] + "# edited\n")  # imports dev; dev does not import it
    assert directory() == first
    (top / "lib/d.py").write_text("BASE = 2\n")  # reached through a function-level import, then a module import
    second = directory()
    (top / "dev/a.py").write_text(files["dev/a.py"] + "# edited\n")
    third = directory()
    assert len({first, second, third}) == 3
    sources.clear_caches()
    numba_cache._sources_tag.cache_clear()


def test_gemm_keys_survive_a_new_device_module_and_follow_the_used_ones(monkeypatch):
    """The real fp8_gemm template against the real deep_gemm.device, as if a new intrinsic module were added."""
    from deep_gemm.heuristics.config import GemmConfig, GemmDesc
    from deep_gemm.jit.render import render
    from deep_gemm.kernels.common import gemm_constants

    config = GemmConfig(block_m=64, block_n=64, block_k=128, mad_m=32, mad_n=32, mad_k=64, num_l1_stages=2,
                        num_ai_cores=7)
    rendered = {t: render(t, gemm_constants(GemmDesc(m=40, n=96, k=320, a_dtype=d, b_dtype=d), config, "nk", False))
                for t, d in (("fp8_gemm", "fp8"), ("bf16_gemm", "bf16"))}
    real_text = sources._text.__wrapped__
    edits: dict[str, str] = {}

    def text(path):
        body = real_text(path)
        for suffix, extra in edits.items():
            if str(path).endswith(suffix):
                body += extra
        return body

    def keys():
        sources.clear_caches()
        return {t: cache.cache_key(t, src, "deep_gemm.device", {})[0] for t, src in rendered.items()}

    monkeypatch.setattr(sources, "_text", text)
    base = keys()
    assert keys() == base
    # deep_gemm.device gains an intrinsic: a new module and its export (the module itself need not exist to
    # show it is never read for these kernels)
    edits["device/__init__.py"] = "\nfrom .vector_new import Exp  # noqa: E402\n__all__ += ['Exp']\n"
    edits["device/capacity.py"] = "\n# a host-side helper edited\n"
    edits["jit/cache.py"] = edits["jit/launch.py"] = "\n# not code generation\n"
    assert keys() == base
    edits["device/fixpipe.py"] = "\n# FixPipe edited\n"  # used by both GEMMs
    after_fixpipe = keys()
    assert all(after_fixpipe[t] != base[t] for t in base)
    edits["device/_bits.py"] = "\n# bit helpers edited\n"  # imported by copy.py and cube.py
    after_bits = keys()
    assert all(after_bits[t] != after_fixpipe[t] for t in base)
    edits["jit/translate/expressions.py"] = "\n# the translator edited\n"
    assert all(keys()[t] != after_bits[t] for t in base)
    sources.clear_caches()


# Corrupt entries ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncate_kernel_py", "missing_meta", "garbage_meta", "edited_asc"])
def test_corrupt_entry_is_reported_once_and_rebuilt(fresh_root, damage, rng):
    kernel = build_vadd()
    entry = kernel.path
    if damage == "truncate_kernel_py":
        text = (entry / "kernel.py").read_text()
        (entry / "kernel.py").write_text(text[: len(text) // 2])
    elif damage == "missing_meta":
        (entry / "meta.json").unlink()
    elif damage == "garbage_meta":
        (entry / "meta.json").write_bytes(b"\x00garbage{")
    else:
        (entry / "kernel.asc").write_text("// edited\n")
    jit_compile.clear_memory_cache()
    before = stats()
    with pytest.warns(RuntimeWarning, match=f"corrupt kernel cache entry {entry}.*Fix: remove it"):
        rebuilt = build_vadd()
    delta = stats_delta(before)
    assert delta.get("corrupt") == 1 and delta.get("build") == 1
    assert rebuilt.path == entry and cache.check_entry(entry, "vadd", rebuilt.digest) is None
    run_vadd(rebuilt, rng)


def test_garbage_numba_index_is_detected_and_rebuilt(fresh_root):
    first = run_child(VADD_CHILD, fresh_root)
    entry = Path(first["path"])
    indexes = sorted(entry.glob("__pycache__/*.nbi"))
    assert indexes
    for index in indexes:
        index.write_bytes(b"not a pickle at all")
    assert "does not match" in numba_cache.directory_problem(entry / "__pycache__")
    numba_path = {"DG_JIT_NATIVE": "0"}  # numba's files are read only without native code
    second = run_child(VADD_CHILD, fresh_root, extra_env=numba_path)
    assert second["ok"] and second["source"] == "disk", second
    assert second["stats"].get("corrupt", 0) >= 1 and second["stats"].get("numba_compile") == 1, second
    assert "numba cache" in second["stderr"] and str(entry) in second["stderr"], second
    assert numba_cache.directory_problem(entry / "__pycache__") is None
    third = run_child(VADD_CHILD, fresh_root, extra_env=numba_path)
    assert "numba_compile" not in third["stats"] and "corrupt" not in third["stats"], third


def test_check_entry_names_each_problem(tmp_path):
    entry = tmp_path / "k.abc"
    entry.mkdir()
    assert "meta.json is missing" in cache.check_entry(entry, "k", "abc")
    (entry / "kernel.asc").write_text("a")
    (entry / "kernel.py").write_text("b")
    files = {f: cache.file_sha256(entry / f) for f in ("kernel.asc", "kernel.py")}
    (entry / "meta.json").write_text(cache.meta_text({"name": "k", "digest": "abc", "files": files}))
    assert "no entry signature" in cache.check_entry(entry, "k", "abc")  # an entry of an older deep_gemm
    (entry / "meta.json").write_text(cache.meta_text({"name": "k", "digest": "abc", "files": files, "params": [],
                                                      "meta_version": cache.META_VERSION}))
    assert cache.check_entry(entry, "k", "abc") is None
    assert "does not describe" in cache.check_entry(entry, "k", "other")
    (entry / "kernel.py").write_text("b" * 2)
    assert "kernel.py does not match" in cache.check_entry(entry, "k", "abc")
    assert "not a directory" in cache.check_entry(entry / "kernel.py", "k", "abc")


# Concurrency ------------------------------------------------------------------------------------------------------


def test_concurrent_processes_end_with_one_valid_entry(fresh_root, tmp_path):
    go = tmp_path / "go"
    code = f"""
import os, time
while not os.path.exists({str(go)!r}):
    time.sleep(0.005)
""" + VADD_CHILD
    env = dict(os.environ, DG_JIT_CACHE_DIR=str(fresh_root))
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    time.sleep(0.5)
    go.write_text("go")
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["ok"] for r in results)
    entries = cache.list_entries(fresh_root)
    assert len(entries) == 1 and {r["path"] for r in results} == {str(entries[0])}
    digest = entries[0].name.split(".", 1)[1]
    assert cache.check_entry(entries[0], "vadd", digest) is None
    assert numba_cache.directory_problem(entries[0] / "__pycache__") is None
    assert sum(r["stats"].get("build", 0) for r in results) >= 1
    assert not [p for p in (fresh_root / "tmp").iterdir()], "no build directory may be left behind"


def test_publish_lost_race_keeps_the_first_entry(tmp_path):
    final = tmp_path / "cache" / "k.abc"
    first, second = tmp_path / "t1", tmp_path / "t2"
    for d, text in ((first, "one"), (second, "two")):
        d.mkdir()
        (d / "kernel.py").write_text(text)
    assert cache.publish(first, final) is True
    assert cache.publish(second, final) is False
    assert (final / "kernel.py").read_text() == "one" and not second.exists()


# Roots ------------------------------------------------------------------------------------------------------------


def test_unwritable_root_falls_back_and_read_only_entries_are_still_used(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    bad_root = blocker / "root"  # cannot be created, whoever we are
    fallback = tmp_path / "fallback"
    monkeypatch.setattr(cache, "_candidates", lambda: [("DG_JIT_CACHE_DIR", bad_root), ("user cache", fallback)])
    cache._resolve_roots.cache_clear()
    jit_compile.clear_memory_cache()
    try:
        with pytest.warns(RuntimeWarning, match="not writable"):
            roots = cache.cache_roots()
        assert roots.write == fallback
        kernel = build_vadd(TILE=24)
        assert kernel.path.parent == fallback / "cache"
        # A read-only root that holds the entry is searched first and used as is.
        shared = tmp_path / "shared"
        shutil.copytree(fallback, shared)
        monkeypatch.setattr(cache, "_candidates", lambda: [("DG_JIT_CACHE_DIR", shared), ("user cache", fallback)])
        real_probe = cache._probe_writable
        monkeypatch.setattr(cache, "_probe_writable", lambda p: False if p == shared else real_probe(p))
        cache._resolve_roots.cache_clear()
        jit_compile.clear_memory_cache()
        with pytest.warns(RuntimeWarning, match="not writable"):
            kernel2 = build_vadd(TILE=24)
        assert kernel2.source == "disk" and kernel2.path.parent == shared / "cache"
    finally:
        cache._resolve_roots.cache_clear()
        jit_compile.clear_memory_cache()


def test_clear_removes_entries(fresh_root):
    build_vadd(TILE=8)
    assert cache.list_entries(fresh_root)
    assert cache.clear(fresh_root, name="other", dry_run=False) == []
    removed = cache.clear(fresh_root, name="vadd", dry_run=True)
    assert removed and cache.list_entries(fresh_root)
    cache.clear(fresh_root)
    assert cache.list_entries(fresh_root) == []


# Errors and debug -------------------------------------------------------------------------------------------------

BAD_NUMBA = """
constexpr int32_t NUM_AI_CORES = {{ NUM_AI_CORES }};
extern "C" __global__ __aicore__ void broken(GlobalTensor<float> x) {
    LocalTensor<float> buf = AllocTensor<float>(4);
    fill(buf);  // one argument short: numba refuses to type it
}
"""


def test_failed_numba_compile_keeps_sources_and_prints_a_repro(fresh_root, tmp_path):
    (tmp_path / "broken.asc.j2").write_text(BAD_NUMBA)
    kernel = build("broken", {"NUM_AI_CORES": 2}, template_dir=tmp_path, device_module=EXAMPLE_DEVICE)
    with pytest.raises(CompileError) as info:
        kernel(np.zeros(4, np.float32))
    err = info.value
    assert isinstance(err, JITError) and err.kernel == "broken" and err.key == kernel.digest
    text = str(err)
    assert f"-m deep_gemm.jit.dump --entry {kernel.path}" in text and "float32[::1]" in text
    assert (kernel.path / "kernel.asc").is_file() and (kernel.path / "kernel.py").is_file()
    from numba.core.errors import TypingError

    from deep_gemm.jit.dump import main

    with pytest.raises(TypingError):  # the printed command reproduces the failure
        main(["--entry", str(kernel.path), "--compile", "(float32[::1],)", "--what", "asc"])


def test_translate_error_names_kernel_key_and_repro(fresh_root, tmp_path):
    (tmp_path / "bad.asc.j2").write_text('extern "C" __global__ __aicore__ void bad() {\n    goto end;\n}\n')
    with pytest.raises(JITError) as info:
        build("bad", {"NUM_AI_CORES": 2, "X": 1}, template_dir=tmp_path, device_module=EXAMPLE_DEVICE)
    text = str(info.value)
    assert info.value.phase == "translate" and info.value.kernel == "bad" and info.value.key
    assert "bad (rendered):2:5" in text and "goto" in text
    assert "-m deep_gemm.jit.dump --template bad --const NUM_AI_CORES=2 --const X=1" in text


def test_debug_ladder(fresh_root, monkeypatch, capsys):
    monkeypatch.setenv("DG_JIT_DEBUG", "1")
    build_vadd(TILE=40)
    err = capsys.readouterr().err
    assert "miss -> built" in err and "translate" in err and "rendered source" not in err
    jit_compile.clear_memory_cache()
    monkeypatch.setenv("DG_JIT_DEBUG", "4")
    build_vadd(TILE=48)
    err = capsys.readouterr().err
    assert "constants {" in err and "rendered source" in err and "translated source" in err
    assert "constexpr int32_t TILE = 48;" in err and "def vadd(" in err and "_dg_cores):" in err


def test_bad_arguments_to_build():
    with pytest.raises(ValueError, match="name"):
        build("not a name", {"NUM_AI_CORES": 1})
    with pytest.raises(TypeError, match="X"):
        build("vadd", {"NUM_AI_CORES": 1, "X": object()}, template="examples/vadd", device_module=EXAMPLE_DEVICE)
