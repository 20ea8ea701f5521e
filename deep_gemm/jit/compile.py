"""build(): template + constants -> a loaded, numba-compiled kernel, through the in-process and on-disk caches.

key index (keyindex.py) or render (render.py) -> key (cache.py) -> memory hit | verified disk hit | translate
(translate/) + publish. A disk hit whose entry holds native code for this target (native.py) runs it without
importing numba; otherwise execute the verified kernel.py -> numba compiles (or loads its verified cache,
numba_cache.py) at the first call, and the entry's native library is then built for later processes.
A cache that cannot be written falls back to a kernel built in memory. Compile events are observable (stats(),
add_listener()). The kernel object it returns is jit/compiled_kernel.py's CompiledKernel. Knows nothing of GEMM.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import linecache
import os
import shutil
import sys
import time
import types
from pathlib import Path

from .. import envs
from . import cache, native, numba_cache

# NOTES: the kernel object moved to jit/compiled_kernel.py; its names stay importable from here (dump.py, tests,
# users' code). Its module globals that are rebound (the native-build lock after a fork, the listener flag) are
# read through __getattr__ below, so this module never holds a stale copy.
from .compiled_kernel import (  # noqa: F401
    LAUNCHERS,
    CompiledKernel,
    EntryFunction,
    _after_interrupt,
    _by_module,
    _first_lines,
    _install_numba_listener,
    _interrupts_seen,
    _lock,
    _native_builds,
    _numba_type_name,
    _reset_native_builds_after_fork,
    _signature,
    add_listener,
    launcher_mode,
    wait_native_builds,
)
from .constants import normalize_constants
from .errors import CompileError, JITError, RenderError, TranslateError
from .events import debug as _debug
from .events import emit as _event
from .events import stats
from .numba_setup import KERNEL_MODULE_MARK, apply_numba_settings, codegen_settings

DEFAULT_DEVICE_MODULE = "deep_gemm.device"

# ---------------------------------------------------------------------------------------------------------------
# build

_memo: dict[tuple, CompiledKernel] = {}
_by_digest: dict[str, CompiledKernel] = {}


def build(name: str, constants: dict, *, template: str | None = None, template_dir: str | os.PathLike | None = None,
          device_module: str = DEFAULT_DEVICE_MODULE) -> CompiledKernel:
    """Render template ``template`` (default: ``name``) with ``constants``, translate, compile and cache it.

    ``name`` is the kernel's stem (an identifier; it names the cache entry ``<name>.<digest>``); ``constants``
    are the UPPER_CASE template constants and must include NUM_AI_CORES; ``device_module`` is the module whose
    exports the template may call. Returns a CompiledKernel; numba compiles (or loads its cache) at the first call.
    Env: DG_JIT_CACHE_DIR (cache root), DG_JIT_DEBUG (1 hits/misses + timings, 2 + constants, 3 + rendered
    source, 4 + translated source). Raises RenderError, TranslateError, CompileError (all JITError).
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"kernel name must be an identifier, got {name=!r}")
    constants = normalize_constants(constants)
    template = template or name
    sync_check = bool(envs.DG_SYNC_CHECK.get())
    memo_key = (name, template, str(template_dir), device_module, tuple(sorted(constants.items())), sync_check)
    kernel = _memo.get(memo_key)
    if kernel is not None:
        _event("memory_hit", kernel=name, digest=kernel.digest)
        _debug(1, f"{name}.{kernel.digest}: memory hit")
        return kernel
    with _lock:
        kernel = _memo.get(memo_key)
        if kernel is None:
            kernel = _build_locked(name, constants, template, template_dir, device_module, sync_check)
            _memo[memo_key] = kernel
        return kernel


# NOTES: mixed kernels and the checker's kernels call device/crosscore.py and device/synccheck.py through code the
# translator emits (translate/mixed.py), not through intrinsics their source names: the key covers them explicitly.
_SYNC_RUNTIME_MODULES = ("deep_gemm.device.crosscore", "deep_gemm.device.synccheck")
_MIXED_MARKERS = ("ASCEND_IS_AI", "CrossCore", "SyncAll", "UBTensor", "GetSubBlockIdx")


def _sync_runtime_digest(rendered: str, sync_check: bool) -> str | None:
    """sha256 of the cross-core / checker runtime modules for a kernel that uses them, else None."""
    if not sync_check and not any(marker in rendered for marker in _MIXED_MARKERS):
        return None
    from .sources import module_file

    h = hashlib.sha256()
    for module in _SYNC_RUNTIME_MODULES:
        path = module_file(module)
        h.update(f"{module}\0".encode() + (path.read_bytes() if path is not None else b""))
    return h.hexdigest()


def _settings(sync_check: bool, runtime_digest: str | None) -> dict:
    # NOTES: only the settings that change generated code enter the key (not e.g. whether scipy was deferred).
    settings = codegen_settings()
    if sync_check:  # DG_SYNC_CHECK: the checker's kernels are other code (absent from the key otherwise)
        settings["SYNC_CHECK"] = True
    if runtime_digest:
        settings["SYNC_RUNTIME"] = runtime_digest
    return settings


def _from_index(name, constants, template, template_dir, device_module, sync_check, timings):
    """The kernel found through the key index (keyindex.py: no rendering), or None."""
    from . import keyindex
    from .constants import resolve_template

    t0 = time.perf_counter()
    try:
        directory = resolve_template(template, template_dir)[0]
    except RenderError:
        return None
    build_args = json.dumps([name, template, str(directory), device_module, sorted(constants.items()), sync_check])
    roots = cache.cache_roots()
    for root in roots.search:
        base = _settings(sync_check, None)
        found = keyindex.lookup(root, name, build_args, directory, device_module, base)
        if found is None:  # a mixed kernel's key also covers the cross-core runtime
            found = keyindex.lookup(root, name, build_args, directory, device_module,
                                    _settings(sync_check, _sync_runtime_digest("", True)))
        if found is None:
            continue
        digest = found[0]
        if digest in _by_digest:
            return _by_digest[digest]
        path = cache.entry_path(root, name, digest)
        if not os.path.isdir(path):
            continue
        timings["render"] = 0.0
        timings["index"] = time.perf_counter() - t0
        kernel, _ = _load_existing(path, name, digest, constants, timings, writable=root == roots.write)
        if kernel is not None:
            _by_digest[digest] = kernel
            return kernel
    return None


def _index_build(name, constants, template, template_dir, device_module, sync_check, digest, components) -> None:
    from . import keyindex
    from .constants import resolve_template

    root = cache.cache_roots().write
    if root is None:
        return
    directory = resolve_template(template, template_dir)[0]
    build_args = json.dumps([name, template, str(directory), device_module, sorted(constants.items()), sync_check])
    keyindex.store(root, name, build_args, directory, device_module, digest, components)


def _build_locked(name, constants, template, template_dir, device_module, sync_check=False) -> CompiledKernel:
    timings: dict[str, float] = {}
    kernel = _from_index(name, constants, template, template_dir, device_module, sync_check, timings)
    if kernel is not None:
        if kernel._module is not None:
            _by_module[kernel._module.__name__] = kernel
            _install_numba_listener()
        return kernel
    t0 = time.perf_counter()
    from .render import render_lines  # jinja2: only when a kernel is rendered

    try:
        rendered, line_map = render_lines(template, constants, template_dir)
    except RenderError as e:
        e.with_context(kernel=name)
        raise
    timings["render"] = time.perf_counter() - t0
    settings = _settings(sync_check, _sync_runtime_digest(rendered, sync_check))
    t1 = time.perf_counter()
    digest, components = cache.cache_key(name, rendered, device_module, settings)
    timings["key"] = time.perf_counter() - t1
    if digest in _by_digest:  # same source reached through other constants (e.g. unused ones)
        _event("memory_hit", kernel=name, digest=digest)
        return _by_digest[digest]
    _debug(2, f"{name}.{digest}: constants {json.dumps(constants, sort_keys=True)}")
    _debug(3, f"{name}.{digest}: rendered source\n{rendered}")
    roots = cache.cache_roots()
    kernel = None
    writable = roots.write is not None
    for root in roots.search:
        path = cache.entry_path(root, name, digest)
        if os.path.lexists(path):
            kernel, usable = _load_existing(path, name, digest, constants, timings, writable=root == roots.write)
            if kernel is not None:
                break
            if root == roots.write and not usable:
                writable = False  # the damaged entry could not be moved aside: this root cannot take a new one
    if kernel is None:
        # NOTES: a miss of every cache: announce it (jit/notice.py; numba compiles at the first call, which ends it)
        from .notice import CompileNotice

        notice = CompileNotice(name, constants)
        try:
            kernel = _build_new(roots.write if writable else None, name, digest, components, rendered, line_map,
                                constants, template, device_module, timings, sync_check)
        except BaseException:
            notice.finish(failed=True)
            raise
        kernel._compile_notice = notice
    _by_digest[digest] = kernel
    if kernel.path is not None:
        _index_build(name, constants, template, template_dir, device_module, sync_check, digest, components)
    if kernel._module is not None:  # a kernel served by native code imports its module (and numba) only if needed
        _by_module[kernel._module.__name__] = kernel
        _install_numba_listener()
    return kernel


def _load_existing(path: Path, name: str, digest: str, constants: dict, timings: dict,
                   writable: bool) -> tuple[CompiledKernel | None, bool]:
    """Load a published entry after verifying every file it reads: (kernel, True), or (None, usable) when the
    entry did not verify (reported once, moved aside when ``writable``; usable is False when that failed).

    NOTES: an entry that verifies is never removed: if its kernel.py then fails to import, the error names the
    entry and is raised (it is our bug or the environment's, and deleting the evidence would hide it).
    """
    t0 = time.perf_counter()
    try:
        meta, source = cache.load_entry(path, name, digest)
    except cache.EntryProblem as e:
        # NOTES: repair first, then one warning that says what really happens: damage that cannot be moved aside
        # (a read-only entry or root) is reported once per process and never as "rebuilt now".
        if not writable:
            write_root = cache.cache_roots().write
            _report_corrupt(path, str(e), "it is in a read-only root; " + (
                f"the kernel is served from (or built in) {write_root}" if write_root is not None else
                "this process compiles the kernel in memory"))
            return None, True
        try:
            cache.move_aside(path.parent.parent, path)
        except OSError as err:
            _event("cache_write_failed", path=str(path), error=f"{type(err).__name__}: {err}")
            _report_corrupt(path, str(e), f"it cannot be moved aside ({type(err).__name__}: {err}), so this "
                                          "process compiles the kernel in memory")
            return None, False
        _report_corrupt(path, str(e), "it is moved aside and rebuilt now")
        return None, True
    native_kernel, native_writable = _load_native(path, name, digest, meta, writable)
    if native_kernel is not None:
        timings["import"] = time.perf_counter() - t0
        _event("disk_hit", kernel=name, digest=digest, path=str(path), native=True)
        _event("native_load", kernel=name, digest=digest, path=str(native_kernel.path))
        _debug(1, f"{name}.{digest}: disk hit {path}, native library {native_kernel.path.name} (render "
                  f"{timings['render'] * 1e3:.1f} ms, load {timings['import'] * 1e3:.1f} ms)")
        return CompiledKernel(name=name, digest=digest, path=path, module=None, meta=meta, constants=constants,
                              source="disk", timings=timings, native_kernel=native_kernel,
                              load_module=lambda: _import_existing(path, name, digest, source, writable)), True
    module = _import_existing(path, name, digest, source, writable)
    timings["import"] = time.perf_counter() - t0
    _event("disk_hit", kernel=name, digest=digest, path=str(path))
    _debug(1, f"{name}.{digest}: disk hit {path} (render {timings['render'] * 1e3:.1f} ms, "
              f"import {timings['import'] * 1e3:.1f} ms)")
    return CompiledKernel(name=name, digest=digest, path=path, module=module, meta=meta, constants=constants,
                          source="disk", timings=timings, native_writable=native_writable), True


def _load_native(path: Path, name: str, digest: str, meta: dict, writable: bool):
    """(the entry's verified native library for this target or None, whether this process may build one into the
    entry). None: none built (the numba path, which builds it when ``writable``); built for another target: rebuilt;
    damaged (also a native file that is not a regular file): reported once, moved aside and rebuilt, or, when it
    cannot be moved aside (a read-only entry), reported once per process and never rebuilt; verified but not
    loadable in this process: the numba path, no warning."""
    if not native.enabled() or launcher_mode() != "threads" or envs.DG_SYNC_CHECK.get() or meta.get("is_mixed"):
        return None, writable
    try:
        return native.load(path, digest), writable
    except native.NativeUnavailable as e:
        kind = e.args[1] if len(e.args) > 1 else "missing"
        if kind == "damaged":
            problem = f"native library: {e.args[0]}"
            if not writable:
                _report_corrupt(path, problem, "it is in a read-only root; the kernel runs through numba")
                return None, False
            try:
                native.discard(path, digest)
            except OSError as err:
                _report_corrupt(path, problem, f"it cannot be moved aside ({type(err).__name__}: {err}), so the "
                                               "kernel runs through numba")
                return None, False
            _report_corrupt(path, problem, "it is moved aside and rebuilt now")
        elif kind == "stale":
            _event("native_stale", kernel=name, digest=digest, why=e.args[0])
            _debug(1, f"{name}.{digest}: native library {e.args[0]}; rebuilt after numba compiles")
        elif kind == "unavailable":  # verified, but it cannot be loaded in this process: not a damaged entry
            _event("native_unavailable", kernel=name, digest=digest, why=e.args[0])
            _debug(1, f"{name}.{digest}: native library {e.args[0]}; numba serves it")
        return None, writable


def _import_existing(path: Path, name: str, digest: str, source: bytes, writable: bool):
    """Import a verified entry's kernel.py; an entry that verifies but does not import is a CompileError."""
    try:
        return _import_kernel(path, name, digest, source=source, read_only=not writable)
    except Exception as e:
        raise CompileError(f"the cache entry {path} verifies but its kernel.py does not import "
                           f"({type(e).__name__}: {e}); the entry is kept for inspection.\nreproduce: "
                           f"{cache.python_command()} -m deep_gemm.jit.dump --entry {path} --import\nFix: if the "
                           f"environment changed under a running process, restart it; else rm -rf {path}",
                           kernel=name, key=digest) from e


def _report_corrupt(path: Path, problem: str, action: str) -> None:
    _event("corrupt", path=str(path), what=problem)
    cache.warn_once(f"corrupt:{path}:{problem}", f"corrupt kernel cache entry {path}: {problem}; {action}. "
                                                 f"Fix: remove it (rm -rf {path}) or run scripts/clear_cache.py")


def _build_new(root: Path | None, name, digest, components, rendered, line_map, constants, template, device_module,
               timings, sync_check=False) -> CompiledKernel:
    """Translate and publish a new entry under ``root``, then import it; in memory when ``root`` is None or
    cannot be written (ENOSPC, EROFS, EACCES, ...: one warning per process, no partial directory left)."""
    from .translate import translate

    t0 = time.perf_counter()
    try:
        translation = translate(rendered, template=f"{template} (rendered)", constants=constants,
                                device_module=device_module, line_map=line_map, sync_check=sync_check)
    except TranslateError as e:
        consts = " ".join(f"--const {k}={_cli_value(v)}" for k, v in sorted(constants.items()))
        e.detail += (f"\nreproduce: {cache.python_command()} -m deep_gemm.jit.dump --template {template} {consts}"
                     + (f" --device-module {device_module}" if device_module != DEFAULT_DEVICE_MODULE else ""))
        e.with_context(kernel=name, key=digest)
        raise
    timings["translate"] = time.perf_counter() - t0
    _debug(4, f"{name}.{digest}: translated source\n{translation.python}")
    meta = {
        "meta_version": cache.META_VERSION,
        "name": name,
        "digest": digest,
        "template": template,
        "entry": translation.entry,
        "phases": list(translation.phases),
        "is_mixed": translation.is_mixed,
        "ub_bytes": translation.ub_bytes,
        "helpers": translation.helpers,
        "params": [dataclasses.asdict(p) for p in translation.params],
        "device_module": device_module,
        "device_functions": translation.device_names,
        "constants": constants,
        "key_components": components,
        "files": {f: hashlib.sha256(text.encode()).hexdigest()
                  for f, text in (("kernel.asc", rendered), ("kernel.py", translation.python))},
        "created": time.time(),
        "timings": {k: round(v, 6) for k, v in timings.items()},
    }
    source = translation.python.encode()
    if root is None:
        return _build_in_memory(name, digest, meta, source, constants, timings)
    t1 = time.perf_counter()
    path = cache.entry_path(root, name, digest)
    tmp = None
    try:
        tmp = cache.new_tmp_dir(root)
        cache.write_file(tmp / "kernel.asc", rendered)
        cache.write_file(tmp / "kernel.py", translation.python)
        cache.write_file(tmp / "meta.json", cache.meta_text(meta))
        published = cache.publish(tmp, path)
    except OSError as e:
        numba_cache.report_unwritable(tmp or root, e)
        return _build_in_memory(name, digest, meta, source, constants, timings)
    finally:
        # NOTES: whatever stopped the build (a full disk, an interrupt), no partial directory is left behind.
        if tmp is not None and os.path.lexists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    if published:
        _event("build", kernel=name, digest=digest, path=str(path))
        how = "built"
    else:
        _event("publish_lost", kernel=name, digest=digest, path=str(path))
        try:
            meta, source = cache.load_entry(path, name, digest)
        except cache.EntryProblem as e:
            _report_corrupt(path, f"published by another process but {e}", "this process builds it in memory")
            return _build_in_memory(name, digest, meta, source, constants, timings)
        how = "disk"
    timings["write"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    try:
        module = _import_kernel(path, name, digest, source=source)
    except Exception as e:
        raise CompileError(f"the translated kernel does not import ({type(e).__name__}: {e}); kernel.asc and "
                           f"kernel.py are kept in {path}\nreproduce: {cache.python_command()} -m deep_gemm.jit.dump "
                           f"--entry {path} --import", kernel=name, key=digest) from e
    timings["import"] = time.perf_counter() - t2
    _debug(1, f"{name}.{digest}: miss -> {how} {path} ("
              + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in timings.items()) + ")")
    return CompiledKernel(name=name, digest=digest, path=path, module=module, meta=meta, constants=constants,
                          source=how, timings=timings, native_writable=True)


def _build_in_memory(name, digest, meta, source: bytes, constants, timings) -> CompiledKernel:
    """A kernel whose module lives only in this process (numba compiles it without a disk cache)."""
    t0 = time.perf_counter()
    try:
        module = _import_kernel(None, name, digest, source=source)
    except Exception as e:
        raise CompileError(f"the translated kernel does not import ({type(e).__name__}: {e}); it was built in "
                           "memory (the cache could not be written): rerun with DG_JIT_CACHE_DIR set to a "
                           "writable directory to keep kernel.asc and kernel.py", kernel=name, key=digest) from e
    timings["import"] = time.perf_counter() - t0
    _event("build_in_memory", kernel=name, digest=digest)
    _debug(1, f"{name}.{digest}: miss -> built in memory (the cache could not be written)")
    return CompiledKernel(name=name, digest=digest, path=None, module=module, meta=meta, constants=constants,
                          source="memory", timings=timings)


def _cli_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def module_name(name: str, digest: str) -> str:
    """Deterministic module name of an entry's kernel.py (numba's cache re-imports modules by name)."""
    return f"{KERNEL_MODULE_MARK}{name}_{digest}"


def _import_kernel(path: Path | None, name: str, digest: str, source: bytes | None = None, read_only: bool = False):
    """Execute a kernel's Python source as a real module (numba's cache=True needs its file) named
    module_name(); ``source`` is the verified content of <path>/kernel.py (read from there when None). With path
    None the module exists only in memory (its own name; numba keeps no disk cache of it); with read_only numba
    reads the entry's files but does not try to add any.

    NOTES: the verified bytes are compiled here rather than imported, so no unverified .pyc is ever read (or
    written) and the file cannot change between its check and its use.
    """
    if path is None:
        mod_name, filename = f"{module_name(name, digest)}_in_memory", f"<deep_gemm kernel {name}.{digest}>"
        numba_cache._memory_modules.add(mod_name)
    else:
        mod_name, filename = module_name(name, digest), str(path / "kernel.py")
        (numba_cache._read_only_modules.add if read_only else numba_cache._read_only_modules.discard)(mod_name)
    existing = sys.modules.get(mod_name)
    if existing is not None and getattr(existing, "__file__", None) == filename:
        return existing
    apply_numba_settings()
    if source is None:
        source = (path / "kernel.py").read_bytes()
    module = types.ModuleType(mod_name)
    module.__file__ = filename
    if path is None:
        text = source.decode()
        linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    sys.modules[mod_name] = module
    try:
        exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102 - our own verified translation
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    return module


def clear_memory_cache() -> None:
    """Forget the in-process kernels (the disk cache is untouched). For tests and tools."""
    with _lock:
        _memo.clear()
        _by_digest.clear()


_FORWARDED = ("_native_lock", "_atexit_registered", "_numba_listener_installed")


def __getattr__(name: str):
    if name in _FORWARDED:
        from . import compiled_kernel

        return getattr(compiled_kernel, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["build", "CompiledKernel", "stats", "add_listener", "clear_memory_cache", "wait_native_builds", "JITError"]
