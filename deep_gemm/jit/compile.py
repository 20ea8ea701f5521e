"""build(): template + constants -> a loaded, numba-compiled kernel, through the in-process and on-disk caches.

render (render.py) -> key (cache.py) -> memory hit | disk hit | translate (translate/) + publish -> import
kernel.py -> numba compiles (or loads its own cache) at the first call. Compile events are observable (stats(),
add_listener()). Knows nothing of GEMM.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from .. import envs
from . import cache
from .errors import CacheCorruptError, CompileError, JITError, RenderError, TranslateError
from .numba_setup import KERNEL_MODULE_MARK, apply_numba_settings
from .render import normalize_constants, render

DEFAULT_DEVICE_MODULE = "deep_gemm.device"

# ---------------------------------------------------------------------------------------------------------------
# Events

_counts: Counter = Counter()
_listeners: list[Callable[[str, dict], None]] = []
_lock = threading.RLock()


def stats() -> dict[str, int]:
    """Counts of JIT events in this process: memory_hit, disk_hit, build (rendered + translated + published),
    publish_lost (another process published the key first), corrupt (entry rebuilt), numba_compile (an entry
    function compiled by numba), numba_cache_load (loaded from numba's cache), numba_compile_helper."""
    return dict(_counts)


def add_listener(callback: Callable[[str, dict], None]) -> Callable[[], None]:
    """Call ``callback(event, info)`` on every JIT event (see stats()); returns a function that removes it."""
    _listeners.append(callback)
    _install_numba_listener()
    return lambda: _listeners.remove(callback) if callback in _listeners else None


def _event(kind: str, **info) -> None:
    _counts[kind] += 1
    for callback in list(_listeners):
        callback(kind, info)


def _debug(level: int, message: str) -> None:
    if envs.DG_JIT_DEBUG.get() >= level:
        print(f"[deep_gemm.jit] {message}", file=sys.stderr, flush=True)


_numba_listener_installed = False


def _install_numba_listener() -> None:
    """Count numba's real compiles (cache misses) of functions in generated kernel modules."""
    global _numba_listener_installed
    if _numba_listener_installed:
        return
    from numba.core import event

    class _CompileListener(event.Listener):
        def on_start(self, ev):
            pass

        def on_end(self, ev):
            dispatcher = ev.data.get("dispatcher") if isinstance(ev.data, dict) else None
            py_func = getattr(dispatcher, "py_func", None)
            module = getattr(py_func, "__module__", "") or ""
            if not module.startswith(KERNEL_MODULE_MARK):
                return
            kernel = _by_module.get(module)
            is_entry = kernel is not None and py_func.__name__ in (kernel.entry, f"{kernel.entry}_prange")
            _event("numba_compile" if is_entry else "numba_compile_helper", module=module,
                   function=py_func.__qualname__, failed=ev.is_failed)

    event.register("numba:compile", _CompileListener())
    _numba_listener_installed = True


# ---------------------------------------------------------------------------------------------------------------
# The compiled kernel


LAUNCHERS = ("threads", "prange")


def launcher_mode() -> str:
    """DG_JIT_LAUNCHER: "threads" (default; jit/launch.py) or "prange" (numba parallel=True)."""
    mode = envs.DG_JIT_LAUNCHER.get()
    if mode not in LAUNCHERS:
        raise ValueError(f"DG_JIT_LAUNCHER={mode!r} must be one of {LAUNCHERS}")
    return mode


class EntryFunction:
    """The numba dispatcher that runs a kernel, seen with the kernel's own signature (the launcher's leading
    first_core/core_step arguments are added here): ``compile(sig)``, ``stats``, ``dispatcher``."""

    def __init__(self, dispatcher, launcher: str):
        self.dispatcher = dispatcher
        self.launcher = launcher

    def _full(self, sig):
        from numba import types
        from numba.core import sigutils

        if isinstance(sig, str):
            sig = sigutils.normalize_signature(sig)[0]
        sig = tuple(sig)
        return (types.int64, types.int64, *sig) if self.launcher == "threads" else sig

    def compile(self, sig):
        """Compile (or load from numba's cache) for a tuple of numba types or a signature string."""
        return self.dispatcher.compile(self._full(sig))

    @property
    def stats(self):
        return self.dispatcher.stats

    @property
    def py_func(self):
        return self.dispatcher.py_func


class CompiledKernel:
    """A loaded kernel: call it like the template's entry function (numpy arrays and scalars); its body runs once
    per logical AI core (NUM_AI_CORES) spread over the CPU threads.

    Attributes: ``name``, ``digest`` (cache key), ``path`` (entry directory), ``entry`` (function name),
    ``constants`` (template constants), ``meta`` (meta.json), ``source`` ("built", "disk"), ``timings``
    (seconds per phase; ``numba``: compile or cache load, ``first_call``: that plus the first run), ``fn``
    (EntryFunction: the numba
    dispatcher with the kernel's signature), ``launcher`` ("threads" or "prange", DG_JIT_LAUNCHER), ``module``.
    """

    def __init__(self, *, name: str, digest: str, path: Path, module, meta: dict, constants: dict, source: str,
                 timings: dict[str, float]):
        self.name = name
        self.digest = digest
        self.path = path
        self.module = module
        self.meta = meta
        self.entry = meta["entry"]
        self.constants = constants
        self.source = source
        self.timings = timings
        self.num_ai_cores = int(module.NUM_AI_CORES)
        self.launcher = launcher_mode()
        name_ = self.entry if self.launcher == "threads" else f"{self.entry}_prange"
        self.fn = EntryFunction(getattr(module, name_), self.launcher)
        self._call = self._first_call

    def __call__(self, *args):
        return self._call(*args)

    launch = __call__

    def _make_fast_call(self):
        dispatcher = self.fn.dispatcher
        if self.launcher == "prange":
            return dispatcher
        from .launch import LAUNCHER

        launch, cores = LAUNCHER.launch, self.num_ai_cores
        return lambda *args: launch(dispatcher, cores, args)

    def compile(self, *args) -> None:
        """Compile the kernel for the types of ``args`` (or load it from numba's cache) without running it."""
        import numba

        self._ensure_compiled(tuple(numba.typeof(a) for a in args), args)

    def _ensure_compiled(self, sig: tuple, args: tuple) -> None:
        import numba

        t0 = time.perf_counter()
        before = self.numba_stats()
        try:
            self._compile_with_cache_repair(sig)
        except numba.core.errors.NumbaError as e:
            raise self._compile_error(e, args) from e
        after = self.numba_stats()
        if after == before:
            return  # this signature was compiled before
        self.timings["numba"] = time.perf_counter() - t0
        loaded = after["cache_hits"] > before["cache_hits"]
        how = "loaded from numba's cache" if loaded else "compiled by numba"
        if loaded:
            _event("numba_cache_load", kernel=self.name, digest=self.digest)
        _debug(1, f"{self.name}.{self.digest}: {how} in {self.timings['numba']:.3f}s")

    def numba_stats(self) -> dict[str, int]:
        """How numba produced the kernel's machine code: cache_hits (loaded from numba's cache) and cache_misses
        (compiled) summed over signatures."""
        s = self.fn.stats
        return {"cache_hits": sum(s.cache_hits.values()), "cache_misses": sum(s.cache_misses.values())}

    @property
    def loaded_from_numba_cache(self) -> bool | None:
        """True when the first call loaded machine code from numba's cache, False when it compiled, None before."""
        s = self.numba_stats()
        if s["cache_hits"] + s["cache_misses"] == 0:
            return None
        return s["cache_misses"] == 0

    def _first_call(self, *args):
        import numba

        t0 = time.perf_counter()
        fast = self._make_fast_call()
        # NOTES: compile (or load) on this thread first: the launcher's threads would otherwise all enter numba's
        # compiler at once, and a compile error would surface from a worker.
        self._ensure_compiled(tuple(numba.typeof(a) for a in args), args)
        result = fast(*args)
        self.timings["first_call"] = time.perf_counter() - t0
        self._call = fast
        return result

    def _compile_error(self, e: Exception, args) -> CompileError:
        return CompileError(f"numba failed to compile {self.entry} for ({_signature(args)}):\n"
                            f"{_first_lines(str(e), 40)}\nkernel.asc and kernel.py are kept in {self.path}\n"
                            f"reproduce: {self.repro_command(args)}", kernel=self.name, key=self.digest)

    def _compile_with_cache_repair(self, sig):
        try:
            return self.fn.compile(sig)
        except (pickle.UnpicklingError, EOFError, ImportError, AttributeError, ValueError, TypeError) as e:
            # NOTES: a damaged numba data file surfaces here, before anything runs; anything else is re-raised.
            if not _raised_in_numba_cache_load(e):
                raise
            cache.warn_once(f"numba:{self.path}", f"numba's cache files in {self.path / '__pycache__'} are "
                                                  f"damaged ({type(e).__name__}: {e}); recompiling. Fix: delete "
                                                  "that directory (or run scripts/clear_cache.py)")
            cache.clear_numba_cache(self.path)
            _event("corrupt", kernel=self.name, path=str(self.path), what="numba data")
            return self.fn.compile(sig)

    def repro_command(self, args=()) -> str:
        sig = f' --compile "({_signature(args)})"' if args else ""
        return f"{cache.python_command()} -m deep_gemm.jit.dump --entry {self.path}{sig}"

    def __repr__(self) -> str:
        return f"CompiledKernel({self.name}.{self.digest}, entry={self.entry}, source={self.source}, path={self.path})"


def _raised_in_numba_cache_load(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(os.path.join("numba", "core", "caching.py")):
            return True
        tb = tb.tb_next
    return False


def _signature(args) -> str:
    """numba signature string of call arguments, e.g. 'float32[::1], int64' (parseable by Dispatcher.compile)."""
    import numba
    from numba.core import types

    parts = []
    for arg in args:
        ty = numba.typeof(arg)
        if isinstance(ty, types.Array):
            dims = [":"] * ty.ndim
            if ty.layout == "C" and ty.ndim:
                dims[-1] = "::1"
            elif ty.layout == "F" and ty.ndim:
                dims[0] = "::1"
            parts.append(f"{ty.dtype}[{', '.join(dims)}]")
        else:
            parts.append(str(ty))
    return ", ".join(parts)


def _first_lines(text: str, n: int) -> str:
    lines = text.splitlines()
    return "\n".join(lines[:n] + (["..."] if len(lines) > n else []))


# ---------------------------------------------------------------------------------------------------------------
# build

_CODEGEN_SETTINGS = ("enabled", "SLP_VECTORIZE", "CPU_FEATURES", "KERNEL_OPT")
_memo: dict[tuple, CompiledKernel] = {}
_by_digest: dict[str, CompiledKernel] = {}
_by_module: dict[str, CompiledKernel] = {}


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
    memo_key = (name, template, str(template_dir), device_module, tuple(sorted(constants.items())))
    kernel = _memo.get(memo_key)
    if kernel is not None:
        _event("memory_hit", kernel=name, digest=kernel.digest)
        _debug(1, f"{name}.{kernel.digest}: memory hit")
        return kernel
    with _lock:
        kernel = _memo.get(memo_key)
        if kernel is None:
            kernel = _build_locked(name, constants, template, template_dir, device_module)
            _memo[memo_key] = kernel
        return kernel


def _build_locked(name, constants, template, template_dir, device_module) -> CompiledKernel:
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    try:
        rendered = render(template, constants, template_dir)
    except RenderError as e:
        e.with_context(kernel=name)
        raise
    timings["render"] = time.perf_counter() - t0
    # NOTES: only the settings that change generated code enter the key (not e.g. whether scipy was deferred).
    settings = {k: v for k, v in apply_numba_settings().items() if k in _CODEGEN_SETTINGS}
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
    for root in roots.search:
        path = cache.entry_path(root, name, digest)
        if path.is_dir():
            kernel = _load_existing(path, name, digest, constants, timings, writable=root == roots.write)
            if kernel is not None:
                break
    if kernel is None:
        kernel = _build_new(roots.write, name, digest, components, rendered, constants, template, device_module,
                            timings)
    _by_digest[digest] = kernel
    _by_module[kernel.module.__name__] = kernel
    _install_numba_listener()
    return kernel


def _load_existing(path: Path, name: str, digest: str, constants: dict, timings: dict,
                   writable: bool) -> CompiledKernel | None:
    """Load a published entry; None when it was corrupt (reported, and moved aside when writable)."""
    problem = cache.check_entry(path, name, digest)
    if problem is None:
        numba_problem = cache.numba_cache_problem(path)
        if numba_problem is not None:
            _report_corrupt(path, f"numba cache: {numba_problem}", "numba's index is cleared and rebuilt")
            if writable:
                cache.clear_numba_cache(path)
        t0 = time.perf_counter()
        meta = cache.read_meta(path)
        try:
            module = _import_kernel(path, name, digest)
        except Exception as e:  # noqa: BLE001 - an entry whose kernel.py does not import is corrupt
            problem = f"kernel.py does not import ({type(e).__name__}: {e})"
        else:
            timings["import"] = time.perf_counter() - t0
            _event("disk_hit", kernel=name, digest=digest, path=str(path))
            _debug(1, f"{name}.{digest}: disk hit {path} (render {timings['render'] * 1e3:.1f} ms, "
                      f"import {timings['import'] * 1e3:.1f} ms)")
            return CompiledKernel(name=name, digest=digest, path=path, module=module, meta=meta,
                                  constants=constants, source="disk", timings=timings)
    _report_corrupt(path, problem, "it is rebuilt now" if writable else "it is rebuilt in the writable root")
    if writable:
        cache.move_aside(path.parent.parent, path)
    return None


def _report_corrupt(path: Path, problem: str, action: str) -> None:
    _event("corrupt", path=str(path), what=problem)
    cache.warn_once(f"corrupt:{path}:{problem}", f"corrupt kernel cache entry {path}: {problem}; {action}. "
                                                 f"Fix: remove it (rm -rf {path}) or run scripts/clear_cache.py")


def _build_new(root: Path, name, digest, components, rendered, constants, template, device_module,
               timings) -> CompiledKernel:
    from .translate import translate

    t0 = time.perf_counter()
    try:
        translation = translate(rendered, template=f"{template} (rendered)", constants=constants,
                                device_module=device_module)
    except TranslateError as e:
        consts = " ".join(f"--const {k}={_cli_value(v)}" for k, v in sorted(constants.items()))
        e.detail += (f"\nreproduce: {cache.python_command()} -m deep_gemm.jit.dump --template {template} {consts}"
                     + (f" --device-module {device_module}" if device_module != DEFAULT_DEVICE_MODULE else ""))
        e.with_context(kernel=name, key=digest)
        raise
    timings["translate"] = time.perf_counter() - t0
    _debug(4, f"{name}.{digest}: translated source\n{translation.python}")
    t1 = time.perf_counter()
    tmp = cache.new_tmp_dir(root)
    cache.write_file(tmp / "kernel.asc", rendered)
    cache.write_file(tmp / "kernel.py", translation.python)
    meta = {
        "meta_version": cache.META_VERSION,
        "name": name,
        "digest": digest,
        "template": template,
        "entry": translation.entry,
        "helpers": translation.helpers,
        "device_module": device_module,
        "device_functions": translation.device_names,
        "constants": constants,
        "key_components": components,
        "files": {f: cache.file_sha256(tmp / f) for f in ("kernel.asc", "kernel.py")},
        "created": time.time(),
        "timings": {k: round(v, 6) for k, v in timings.items()},
    }
    cache.write_file(tmp / "meta.json", json.dumps(meta, indent=1, sort_keys=True))
    path = cache.entry_path(root, name, digest)
    if cache.publish(tmp, path):
        _event("build", kernel=name, digest=digest, path=str(path))
        source = "built"
    else:
        _event("publish_lost", kernel=name, digest=digest, path=str(path))
        problem = cache.check_entry(path, name, digest)
        if problem is not None:
            raise CacheCorruptError(f"another process published {path} first, but it is corrupt: {problem}. "
                                    f"Fix: rm -rf {path}", kernel=name, key=digest)
        meta = cache.read_meta(path)
        source = "disk"
    timings["write"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    try:
        module = _import_kernel(path, name, digest)
    except Exception as e:
        raise CompileError(f"the translated kernel does not import ({type(e).__name__}: {e}); kernel.asc and "
                           f"kernel.py are kept in {path}\nreproduce: {cache.python_command()} -m deep_gemm.jit.dump "
                           f"--entry {path} --import", kernel=name, key=digest) from e
    timings["import"] = time.perf_counter() - t2
    _debug(1, f"{name}.{digest}: miss -> {source} {path} ("
              + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in timings.items()) + ")")
    return CompiledKernel(name=name, digest=digest, path=path, module=module, meta=meta, constants=constants,
                          source=source, timings=timings)


def _cli_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def module_name(name: str, digest: str) -> str:
    """Deterministic module name of an entry's kernel.py (numba's cache re-imports modules by name)."""
    return f"{KERNEL_MODULE_MARK}{name}_{digest}"


def _import_kernel(path: Path, name: str, digest: str):
    """Import <path>/kernel.py as a real module (numba's cache=True needs a file) under a unique name."""
    mod_name = module_name(name, digest)
    existing = sys.modules.get(mod_name)
    if existing is not None and Path(existing.__file__).resolve() == (path / "kernel.py").resolve():
        return existing
    apply_numba_settings()
    spec = importlib.util.spec_from_file_location(mod_name, path / "kernel.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    return module


def clear_memory_cache() -> None:
    """Forget the in-process kernels (the disk cache is untouched). For tests and tools."""
    with _lock:
        _memo.clear()
        _by_digest.clear()


__all__ = ["build", "CompiledKernel", "stats", "add_listener", "clear_memory_cache", "JITError"]
