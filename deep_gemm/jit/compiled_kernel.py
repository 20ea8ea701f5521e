"""The kernel object: CompiledKernel (a loaded kernel, called like the template's entry function: arguments bound
by the template's parameter names, numba's compile at the first call, or the entry's native library), the numba
compile listener behind stats()/add_listener(), and the background native builds (wait_native_builds).

Built by jit/compile.py's build pipeline; knows nothing of GEMM.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path

from .. import envs
from . import cache, events, interrupt, lazy_codegen, native, numba_cache
from .errors import CompileError, KernelRunError
from .events import debug as _debug
from .events import emit as _event
from .launch import num_threads
from .numba_setup import KERNEL_MODULE_MARK
from .signature import EntrySignature

# ---------------------------------------------------------------------------------------------------------------
# Events (jit/events.py; the numba compile listener is installed from here)

_lock = threading.RLock()
# Loaded kernels by the name of their kernel.py module (the numba listener tells entry compiles from helpers'; the
# build pipeline registers each kernel it loads).
_by_module: dict[str, CompiledKernel] = {}


def add_listener(callback: Callable[[str, dict], None]) -> Callable[[], None]:
    """Call ``callback(event, info)`` on every JIT event (see stats()); returns a function that removes it."""
    remove = events.listen(callback)
    _install_numba_listener()
    return remove


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
            is_entry = kernel is not None and py_func.__name__ in (*kernel.phases, f"{kernel.entry}_prange")
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


# The threads launcher's own trailing argument of every entry (after the cancel flag): the launch's core counter
# (jit/launch.py), as numba types it and as its name in a native record's signature.
CORE_COUNTER_TYPE_NAME = "array(int64, 1d, C)"


_pools = threading.local()


def cross_pool(ub_bytes: int):
    """The calling thread's pool of cross-core states for mixed kernels whose AIVs have ``ub_bytes`` of UB: a row per
    launch thread (deep_gemm.device.crosscore.new_cross_pool; a launch runs on at most num_threads() threads, read on
    this thread as the launcher reads it), kept across launches. A Python thread runs one launch at a time, so no two
    launches use a row at once."""
    pools = getattr(_pools, "by_size", None)
    if pools is None:
        pools = _pools.by_size = {}
    pool, rows = pools.get(ub_bytes), num_threads()
    if pool is None or pool.shape[0] < rows:
        from ..device.crosscore import new_cross_pool

        pool = pools[ub_bytes] = new_cross_pool(rows, ub_bytes)
    return pool


class EntryFunction:
    """The numba dispatcher that runs a kernel, seen with the kernel's own signature (the threads launcher's
    trailing core counter is added here): ``compile(sig)``, ``stats``, ``dispatcher``."""

    def __init__(self, dispatcher, launcher: str):
        self.dispatcher = dispatcher
        self.launcher = launcher
        # NOTES: the launcher and the native library run the entry's machine code: generate it when it compiles
        lazy_codegen.keep_eager(dispatcher.py_func)

    def full_signature(self, sig) -> tuple:
        """``sig`` (the kernel's arguments, the cancel flag included) as the launcher calls the entry."""
        from numba import types
        from numba.core import sigutils

        if isinstance(sig, str):
            sig = sigutils.normalize_signature(sig)[0]
        sig = tuple(sig)
        return (*sig, types.Array(types.int64, 1, "C")) if self.launcher == "threads" else sig

    def compile(self, sig):
        """Compile (or load from numba's cache) for a tuple of numba types or a signature string."""
        return self.dispatcher.compile(self.full_signature(sig))

    @property
    def stats(self):
        return self.dispatcher.stats

    @property
    def py_func(self):
        return self.dispatcher.py_func


class CompiledKernel:
    """A loaded kernel: call it like the template's entry function (numpy arrays and scalars); its body runs once
    per logical AI core (NUM_AI_CORES) spread over the CPU threads.

    Attributes: ``name``, ``digest`` (cache key), ``path`` (entry directory; None for a kernel built in memory
    because the cache could not be written), ``entry`` (function name),
    ``constants`` (template constants), ``meta`` (meta.json), ``source`` ("built", "disk", "memory"), ``timings``
    (seconds per phase; ``numba``: compile or cache load, ``first_call``: that plus the first run), ``fn``
    (EntryFunction: the numba
    dispatcher with the kernel's signature), ``launcher`` ("threads" or "prange", DG_JIT_LAUNCHER), ``module``
    (imported on first use when native code serves the kernel), ``native`` (the loaded native library, or None).
    """

    def __init__(self, *, name: str, digest: str, path: Path | None, module, meta: dict, constants: dict, source: str,
                 timings: dict[str, float], load_module: Callable[[], types.ModuleType] | None = None,
                 native_kernel: native.NativeKernel | None = None, native_writable: bool = False):
        self.name = name
        self.digest = digest
        self.path = path
        self._module = module
        self._load_module = load_module
        self.meta = meta
        self.entry = meta["entry"]
        self.constants = constants
        self.source = source
        self.timings = timings
        self.num_ai_cores = int(constants["NUM_AI_CORES"] if module is None else module.NUM_AI_CORES)
        self.launcher = launcher_mode()
        # NOTES: a kernel split by SyncAll() has one launch entry per phase (launched in order, so every core ends
        # a phase before any core starts the next); its prange entry runs the phases itself.
        self.phases = tuple(meta.get("phases") or (self.entry,))
        self._phase_fns: list[EntryFunction] | None = None
        self.signature = EntrySignature.from_abi(name, meta["params"], entry=self.entry)
        bind = self.signature.bind
        # NOTES: every launch entry takes the call's cancel flag as a hidden trailing argument (jit/interrupt.py);
        # a mixed kernel's entry takes the calling thread's pool of cross-core states before it (cross_pool).
        if meta.get("is_mixed"):
            ub_bytes = int(meta["ub_bytes"])
            self._bind = lambda args, kwargs: (*bind(args, kwargs), cross_pool(ub_bytes), interrupt.cancel_flag())
            self._num_hidden = 2
        else:
            self._bind = lambda args, kwargs: (*bind(args, kwargs), interrupt.cancel_flag())
            self._num_hidden = 1
        self._call = self._first_call
        # Native code (native.py): the loaded library when the entry has one for this target; ``native_writable``:
        # this process may build one into the entry after numba compiled (or loaded) the entry function.
        self.native = native_kernel
        self._native_writable = native_writable and native_kernel is None

    @property
    def module(self) -> types.ModuleType:
        """The kernel's Python module (kernel.py executed; imports numba): loaded on first use when the kernel runs
        from native code."""
        if self._module is None:
            with _lock:
                if self._module is None:
                    self._module = self._load_module()
                    _by_module[self._module.__name__] = self
                    _install_numba_listener()
        return self._module

    @property
    def phase_fns(self) -> list[EntryFunction]:
        """The numba entry of each phase (or the prange entry), as EntryFunction."""
        if self._phase_fns is None:
            module = self.module
            names = self.phases if self.launcher == "threads" else (f"{self.entry}_prange",)
            self._phase_fns = [EntryFunction(getattr(module, n), self.launcher) for n in names]
        return self._phase_fns

    @property
    def fn(self) -> EntryFunction:
        return self.phase_fns[0]

    def __call__(self, *args, **kwargs):
        """Run the kernel: arguments by name (``gm_a=..., stride_a=...``) or in the entry's order, bound and checked
        against the template's signature (``signature``); a missing, extra or mistyped one raises ArgumentError."""
        return self._call(*self._bind(args, kwargs))

    launch = __call__

    @property
    def params(self) -> tuple[str, ...]:
        """The entry's parameter names, in the template's order."""
        return self.signature.names

    def _make_fast_call(self):
        if self.native is not None and self.launcher == "threads":
            return self._make_native_call()
        dispatcher = self.fn.dispatcher
        if self.launcher == "prange":
            return dispatcher
        from .launch import LAUNCHER

        launch, cores = LAUNCHER.launch, self.num_ai_cores
        if len(self.phase_fns) == 1:
            return lambda *args: launch(dispatcher, cores, args)
        dispatchers = [fn.dispatcher for fn in self.phase_fns]

        def run_phases(*args):
            for phase in dispatchers:
                launch(phase, cores, args)

        return run_phases

    def _make_native_call(self):
        """The launch through the native library: its phase functions on the core launcher's threads (ctypes
        releases the GIL). A call the native signature does not cover (a non-contiguous or read-only array: the
        BAD_ARGUMENT status, returned by the first phase before anything is written) goes through numba; any other
        failure status raises (_native_failed)."""
        from .launch import LAUNCHER

        launch, cores, phases = LAUNCHER.launch, self.num_ai_cores, self.native.phases

        def run_native(*args):
            for i, phase in enumerate(phases):
                try:
                    launch(phase, cores, args)
                except native.NativeStatus as e:
                    self._native_failed(e, i, args)
                    return

        return run_native

    def _native_failed(self, e: native.NativeStatus, phase: int, args: tuple) -> None:
        """After a native launch returned status ``e.status`` in phase ``phase``: BAD_ARGUMENT from the first phase
        (nothing written) reruns the launch through numba; anything else raises KernelRunError.

        NOTES: never rerun a launch that may have written its outputs (an accumulating kernel would add twice). A
        kernel that raised is run once more through numba only to raise numba's exception (chained to the
        KernelRunError): the outputs are invalid either way, and success is never returned."""
        if e.status == native.BAD_ARGUMENT and phase == 0:
            _event("native_fallback", kernel=self.name, digest=self.digest, status=e.status)
            self._numba_call(args)
            return
        _event("native_error", kernel=self.name, digest=self.digest, status=e.status)
        what = "the kernel raised an exception" if e.raised else "a failure status"
        err = KernelRunError(f"the native library {self.native.path.name} returned status {e.status} ({what}) in "
                             f"phase {phase} of {self.entry}; the launch's outputs are invalid (possibly partly "
                             f"written)", status=e.status, kernel=self.name, key=self.digest)
        err.__cause__ = e
        if e.raised:
            try:
                self._numba_call(args)
            except Exception as raised:
                raise raised from err
            err.detail += "; numba ran it again without raising"
        raise err from e

    def _numba_call(self, args: tuple) -> None:
        """One launch through numba (compiling or loading the entry for these argument types first)."""
        import numba

        self._ensure_compiled(tuple(numba.typeof(a) for a in args), args, build_native=False)
        from .launch import LAUNCHER

        if self.launcher == "prange":
            self.fn.dispatcher(*args)
            return
        for fn in self.phase_fns:
            LAUNCHER.launch(fn.dispatcher, self.num_ai_cores, args)

    def compile(self, *args, **kwargs) -> None:
        """Compile the kernel for the types of the arguments (bound as by a launch; or load it from numba's cache)
        without running it. Without arguments: for placeholders of the types a launch binds (EntrySignature)."""
        if not args and not kwargs:
            kwargs = self.signature.placeholders()
        args = self._bind(args, kwargs)
        if self.native is not None and self.launcher == "threads" and self._native_covers(args):
            return  # the native library serves these arguments: nothing to compile (and numba is not imported)
        import numba

        self._ensure_compiled(tuple(numba.typeof(a) for a in args), args)

    def _native_covers(self, args: tuple) -> bool:
        """True when the native library's signature is the one numba would pick for ``args`` (bound arguments),
        decided without importing numba (its type names are spelled here for what a bind produces)."""
        wanted = []
        for a in args:
            name = _numba_type_name(a)
            if name is None:
                return False
            wanted.append(name)
        return [*wanted, CORE_COUNTER_TYPE_NAME] == list(self.native.record.get("signature", ()))

    def _ensure_compiled(self, sig: tuple, args: tuple, build_native: bool = True) -> None:
        import numba

        t0 = time.perf_counter()
        before = self.numba_stats()
        helper = self._start_warmup() if "_compile_notice" in self.__dict__ else None
        # NOTES: the compile stays inline here. Moved into a method of its own (same code), the tf32_hc_prenorm_gemm
        # new-specialization compile measured ~0.25 s slower (2.67-2.89 vs 2.42-2.68 s, alternated); cause not found.
        with _interrupts_seen() as seen:
            try:
                for fn in self.phase_fns:
                    fn.compile(sig)
            except BaseException as e:
                if helper is not None:
                    helper.stop()
                notice = self.__dict__.pop("_compile_notice", None)  # a compile this process announced (notice.py)
                if notice is not None:
                    notice.finish(failed=True)
                if seen or isinstance(e, KeyboardInterrupt):
                    _after_interrupt()
                    if not isinstance(e, KeyboardInterrupt):
                        raise seen[0] from e  # the interrupt was swallowed and resurfaced as another error
                    raise
                if isinstance(e, numba.core.errors.NumbaError):
                    raise self._compile_error(e, args) from e
                raise
        if helper is not None:
            helper.stop()
        if seen:  # swallowed inside a callback (LLVM's object-code hook), the compile then went on: still honour it
            notice = self.__dict__.pop("_compile_notice", None)
            if notice is not None:
                notice.finish(failed=True)
            _after_interrupt()
            raise seen[0]
        after = self.numba_stats()
        if build_native:
            self._build_native(sig)
        if after == before:
            return  # this signature was compiled before
        self.timings["numba"] = time.perf_counter() - t0
        notice = self.__dict__.pop("_compile_notice", None)
        if notice is not None:
            notice.finish()
        loaded = after["cache_hits"] > before["cache_hits"]
        how = "loaded from numba's cache" if loaded else "compiled by numba"
        if loaded:
            _event("numba_cache_load", kernel=self.name, digest=self.digest)
        _debug(1, f"{self.name}.{self.digest}: {how} in {self.timings['numba']:.3f}s")

    def _start_warmup(self):
        """A helper compiling this kernel's device functions beside its cold compile (jit/warmup.py), or None.
        It only ever saves time: any error in starting one leaves the compile as it would be without it."""
        from . import warmup

        try:
            return warmup.start(self.name)
        except Exception as e:  # noqa: BLE001 - an optimization must not fail the compile
            _debug(1, f"{self.name}.{self.digest}: no warm-up helper ({type(e).__name__}: {e})")
            return None

    def _build_native(self, sig: tuple) -> None:
        """After numba compiled (or loaded) the entry for ``sig``: link its machine code into the entry's native
        library when this process may write the entry and none is there yet; later processes then run the kernel
        without numba. Any reason it cannot be built leaves the kernel on the numba path.

        NOTES: what the library links is taken from numba here; the C compiler then runs on a background thread
        (a specialization's compile does not wait for it; this process switches to the library once it is
        loaded, the same machine code) and the process waits for it at exit (wait_native_builds)."""
        if not self._native_writable or self.launcher != "threads" or self.path is None or not native.enabled():
            return
        self._native_writable = False  # one attempt per kernel and process
        if self.meta.get("is_mixed") or envs.DG_SYNC_CHECK.get():
            self._native_unavailable("mixed and checker kernels keep the numba path")
            return
        try:
            job = native.prepare_build(self.path, self.path.parent.parent, self.digest,
                                       [fn.dispatcher for fn in self.phase_fns], self.fn.full_signature(sig))
        except native.NativeUnavailable as e:
            self._native_unavailable(str(e))
            return
        thread = threading.Thread(target=self._run_native_build, args=(job,), daemon=True,
                                  name=f"deep_gemm-native-{self.name}")
        global _atexit_registered
        with _native_lock:
            _native_builds.append(thread)
            if not _atexit_registered:
                # NOTES: registered at the first build, so it runs before the exit handlers registered earlier
                # (numba's among them; atexit is last in, first out).
                atexit.register(wait_native_builds, 120.0)
                _atexit_registered = True
        thread.start()

    def _run_native_build(self, job) -> None:
        t0 = time.perf_counter()
        try:
            built = job.run()
        except native.NativeUnavailable as e:
            self._native_unavailable(str(e))
            return
        except OSError as e:  # the entry could not be written: the numba path serves this process
            self._native_unavailable(f"{type(e).__name__}: {e}")
            return
        except Exception as e:  # noqa: BLE001 - never fail a kernel because its native copy failed
            self._native_unavailable(f"{type(e).__name__}: {e}")
            return
        self.timings["native_build"] = time.perf_counter() - t0
        self.native = built
        _event("native_build", kernel=self.name, digest=self.digest, path=str(built.path))
        _debug(1, f"{self.name}.{self.digest}: native library built in {self.timings['native_build']:.3f}s")
        if self._call is not self._first_call:
            self._call = self._make_native_call()

    def _native_unavailable(self, why: str) -> None:
        _event("native_unavailable", kernel=self.name, digest=self.digest, why=why)
        _debug(1, f"{self.name}.{self.digest}: no native library ({why}); numba serves it")

    def numba_stats(self) -> dict[str, int]:
        """How numba produced the kernel's machine code: cache_hits (loaded from numba's cache) and cache_misses
        (compiled) summed over signatures."""
        stats = [fn.stats for fn in self.phase_fns]
        return {"cache_hits": sum(sum(s.cache_hits.values()) for s in stats),
                "cache_misses": sum(sum(s.cache_misses.values()) for s in stats)}

    @property
    def loaded_from_numba_cache(self) -> bool | None:
        """True when the first call loaded machine code from numba's cache, False when it compiled, None before."""
        s = self.numba_stats()
        if s["cache_hits"] + s["cache_misses"] == 0:
            return None
        return s["cache_misses"] == 0

    def _first_call(self, *args):
        t0 = time.perf_counter()
        if self.native is not None and self.launcher == "threads":
            fast = self._make_native_call()
            result = fast(*args)
            self.timings["first_call"] = time.perf_counter() - t0
            self._call = fast
            return result
        import numba

        # NOTES: compile (or load) on this thread first: the launcher's threads would otherwise all enter numba's
        # compiler at once, and a compile error would surface from a worker. The launch then uses the native
        # library when the compile could build one (the same machine code).
        self._ensure_compiled(tuple(numba.typeof(a) for a in args), args)
        fast = self._make_fast_call()
        result = fast(*args)
        self.timings["first_call"] = time.perf_counter() - t0
        self._call = fast
        return result

    def _compile_error(self, e: Exception, args) -> CompileError:
        kept = (f"kernel.asc and kernel.py are kept in {self.path}" if self.path is not None else
                "the kernel was built in memory (the cache could not be written)")
        return CompileError(f"numba failed to compile {self.entry} for ({_signature(args[:-self._num_hidden])}):\n"
                            f"{_first_lines(str(e), 40)}\n{kept}\n"
                            f"reproduce: {self.repro_command(args)}", kernel=self.name, key=self.digest)

    def repro_command(self, args=()) -> str:
        if self.path is None:
            return "rerun with DG_JIT_CACHE_DIR set to a writable directory, then use the command printed there"
        # NOTES: the last bound arguments are the hidden ones (the cancel flag, a mixed kernel's pool before it),
        # which dump adds itself
        shown = args[:-self._num_hidden]
        sig = f' --compile "({_signature(shown)})"' if shown else ""
        return f"{cache.python_command()} -m deep_gemm.jit.dump --entry {self.path}{sig}"

    def __repr__(self) -> str:
        return f"CompiledKernel({self.name}.{self.digest}, entry={self.entry}, source={self.source}, path={self.path})"


_native_builds: list[threading.Thread] = []
_native_lock = threading.Lock()


def wait_native_builds(timeout: float | None = None) -> None:
    """Wait until the native libraries this process started building are published (or failed); tools and tests
    call it, and it runs at exit (so a short process still leaves its kernels' native code in the cache)."""
    with _native_lock:
        threads = list(_native_builds)
    for thread in threads:
        thread.join(timeout)
    with _native_lock:
        _native_builds[:] = [t for t in _native_builds if t.is_alive()]


_atexit_registered = False


def _reset_native_builds_after_fork() -> None:
    """In a forked child: the parent's build threads do not exist there (nor does a holder of _native_lock)."""
    global _native_lock
    _native_lock = threading.Lock()
    _native_builds.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_native_builds_after_fork)


@contextlib.contextmanager
def _interrupts_seen():
    """Yield a list that receives the KeyboardInterrupt of any SIGINT handled while the block runs.

    NOTES: numba compiles partly inside C (LLVM) that calls back into Python; an interrupt delivered in such a
    callback is printed and swallowed by ctypes, and the compile then fails later for another reason (numba's
    "no compiled object yet" when saving) or even completes. Wrapping the handler lets the caller see the
    interrupt it asked for whatever happened to it. Only the main thread receives signals; elsewhere, or under a
    handler that is not a Python callable, nothing is wrapped.
    """
    seen: list[BaseException] = []
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield seen
        return

    def handler(signum, frame):
        try:
            previous(signum, frame)
        except BaseException as e:
            seen.append(e)
            raise

    signal.signal(signal.SIGINT, handler)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)


def _after_interrupt() -> None:
    """Forget what an interrupted compile may have left half done: numba's memo of failed typings (a callee whose
    compile the interrupt broke would fail every later call with a replayed error)."""
    numba_cache.forget_failed_compiles()


def _numba_type_name(value) -> str | None:
    """str(numba.typeof(value)) for the values a bind produces (numpy arrays of plain dtypes, Python bool, int,
    float), without numba; None for anything else."""
    import numpy as np

    if type(value) is bool:
        return "bool"
    if type(value) is int:
        return "int64" if -(2**63) <= value < 2**63 else None
    if type(value) is float:
        return "float64"
    if type(value) is np.ndarray and value.flags.aligned and value.dtype.isbuiltin and value.dtype.kind in "biuf":
        flags = value.flags
        layout = "C" if flags.c_contiguous else "F" if flags.f_contiguous else "A"
        name = f"array({value.dtype}, {value.ndim}d, {layout})"
        return name if flags.writeable else f"readonly {name}"
    return None


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
