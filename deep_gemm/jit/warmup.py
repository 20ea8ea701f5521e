"""Device functions compiled ahead, in a second process, while a kernel compiles cold.

A kernel's first numba compile in a process with a cold cache spends about half its time compiling the device
functions its code calls (``deep_gemm.device``: copies, Cube paths, FixPipe, Vector instructions), one after the
other, as numba's type inference reaches each call. Those functions are cached on disk (numba_cache.py: the shared
directory under the kernel cache root, writes under a lock, every read verified), so another process can compile
them at the same time: when a compile announced by notice.py starts, ``start`` runs ``main`` below in a new
interpreter on a spare CPU with the kernel's plan, the (function, argument types) pairs its compile will ask for,
in the order it asks. The helper works from the end of the plan while the kernel's compile starts
from its beginning; numba loads from disk whatever the helper finished first, and compiles the rest itself as
before. Nothing depends on the helper: a plan that is stale, a helper that fails or is stopped, changes no result;
the helper writes nothing but numba cache entries of deep_gemm's device functions.

Plans ship in warmup_plans.json (``python bench/jit_bench.py --record-plans`` rewrites it: one cold compile of each
of its setups with a ``Recorder`` on). A plan names the calls the kernel's own code makes; what those device
functions call in turn is compiled with them. DG_JIT_WARMUP=0 turns it off; it is off on one CPU and without a
writable cache.

NOTES: the helper changes how long a compile takes, never what it produces: numba keys a cached function by its
argument types and the machine, and the helper runs this deep_gemm with this process's environment and interpreter
flags (so deep_gemm's numba settings) into this process's cache root. numba.config changed in code is not passed on,
as it is not to any later process that loads numba's cache. Stopped (the compile ended, failed or was interrupted)
it gets SIGTERM and exits after the entry it is compiling: its cache writes are never cut short.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from .. import envs
from .events import debug, emit
from .numba_facts import KERNEL_MODULE_MARK

PLANS_FILE = Path(__file__).with_name("warmup_plans.json")
_DEVICE_PREFIX = "deep_gemm."  # a plan names only deep_gemm's own functions
_KERNEL_MODULE = re.compile(rf"^{KERNEL_MODULE_MARK}(?P<name>.+)_[0-9a-f]{{32}}$")
_STOP_SECONDS = 30.0  # a stopped helper finishes the entry it compiles; one still running after this is killed
_MIN_PENDING = 2  # fewer functions left to compile than this (or than half the plan): no helper

_live: set[subprocess.Popen] = set()
_live_lock = threading.Lock()
_plans: dict[str, list] | None = None


# ---------------------------------------------------------------------------------------------------------------
# Argument types as text: the kinds a kernel passes to device functions (scalars, arrays, tuples of scalars, dtype
# classes, bool and int literals). Anything else has no text, and a plan entry with such an argument is left out.

_ARRAY = re.compile(r"^array\((\w+),(\d+),([CFA])(,readonly)?\)$")
_TUPLE = re.compile(r"^tuple\((\w+),(\d+)\)$")
_CLASS = re.compile(r"^class\((\w+)\)$")
_LITERAL = re.compile(r"^literal\((True|False|-?\d+)\)$")


def _scalar_text(t) -> str | None:
    from numba.core import types

    if isinstance(t, (types.Integer, types.Float, types.Boolean)) and not isinstance(t, types.Literal):
        return str(t)
    return None


def type_text(t) -> str | None:
    """The text of numba type ``t`` (``array(uint8,2,C)``, ``int64``, ``class(float32)``, ...), or None when the
    plan format has none for it."""
    from numba.core import types

    if isinstance(t, types.BooleanLiteral) or isinstance(t, types.IntegerLiteral):
        return f"literal({t.literal_value})"
    if isinstance(t, types.Array):
        dtype = _scalar_text(t.dtype)
        if dtype is None or not t.aligned or type(t) is not types.Array:
            return None
        return f"array({dtype},{t.ndim},{t.layout}{'' if t.mutable else ',readonly'})"
    if isinstance(t, types.UniTuple):
        elem = _scalar_text(t.dtype)
        return None if elem is None else f"tuple({elem},{t.count})"
    if isinstance(t, types.NumberClass):
        inner = _scalar_text(t.instance_type)
        return None if inner is None else f"class({inner})"
    return _scalar_text(t)


def parse_type(text: str):
    """The numba type of a ``type_text`` string. Raises ValueError naming the text when it is not one."""
    from numba.core import types

    def scalar(name: str):
        t = getattr(types, name, None)
        if not isinstance(t, (types.Integer, types.Float, types.Boolean)) or isinstance(t, types.Literal):
            raise ValueError(f"warm-up plan: {name!r} in {text!r} is not a numba scalar type")
        return t

    if not isinstance(text, str):
        raise ValueError(f"warm-up plan: a type must be a string, got {text!r}")
    if m := _ARRAY.match(text):
        return types.Array(scalar(m[1]), int(m[2]), m[3], readonly=bool(m[4]))
    if m := _TUPLE.match(text):
        return types.UniTuple(scalar(m[1]), int(m[2]))
    if m := _CLASS.match(text):
        return types.NumberClass(scalar(m[1]))
    if m := _LITERAL.match(text):
        value = {"True": True, "False": False}.get(m[1])
        try:
            return types.literal(int(m[1]) if value is None else value)
        except (TypeError, ValueError, OverflowError) as e:
            raise ValueError(f"warm-up plan: {text!r} is not a numba literal ({e})") from None
    return scalar(text)


# ---------------------------------------------------------------------------------------------------------------
# Plans


def plans() -> dict[str, list]:
    """{kernel name: [[module, qualname, [type text, ...]], ...]} from warmup_plans.json ({} when it is missing or
    unreadable: the helper is an optimization)."""
    global _plans
    if _plans is None:
        try:
            doc = json.loads(PLANS_FILE.read_text())
            _plans = doc["plans"] if isinstance(doc.get("plans"), dict) else {}
        except (OSError, ValueError, AttributeError):
            _plans = {}
    return _plans


def _dispatcher(module: str, qualname: str):
    """The numba dispatcher ``module.qualname`` of deep_gemm (ValueError otherwise: a plan imports nothing else)."""
    import importlib

    if not module.startswith(_DEVICE_PREFIX) or "<" in qualname:
        raise ValueError(f"warm-up plan: {module}.{qualname} is not a deep_gemm function")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not hasattr(obj, "compile") or not hasattr(obj, "overloads"):
        raise ValueError(f"warm-up plan: {module}.{qualname} is not a numba dispatcher")
    return obj


def _cached_on_disk(disp, sig: tuple) -> bool:
    """Whether numba's disk cache has ``disp`` for ``sig`` (its index names the key numba would look up)."""
    try:
        cache = disp._cache
        return cache._index_key(sig, disp.targetctx.codegen()) in cache._cache_file._load_index()
    except Exception:  # numba's internals differ, no cache file, a damaged index: not known to be cached
        return False


def pending(entries: list) -> list:
    """The entries of a plan that a compile in this process would have to compile: neither compiled in this
    process nor in numba's disk cache (an entry that does not resolve is kept: the helper skips it)."""
    out = []
    for entry in entries:
        try:
            module, qualname, texts = entry
            if module in sys.modules:
                disp = _dispatcher(module, qualname)
                sig = tuple(parse_type(t) for t in texts)
                if sig in disp.overloads or _cached_on_disk(disp, sig):
                    continue
        except (ValueError, TypeError, AttributeError, ImportError):
            pass
        out.append(entry)
    return out


class Recorder:
    """Context manager: records, per kernel, the device functions (and argument types) that the kernel's own code
    asks numba for while numba compiles it, in that order (also those compiled or loaded earlier in the process);
    ``plans`` is {kernel name: entries} afterwards. A kernel loaded from numba's cache is not compiled, so nothing
    of it is recorded: record with a cold cache, one compile at a time (the recorder follows one thread's)."""

    def __init__(self):
        self.plans: dict[str, list] = {}
        self._compiling: list[str] = []  # modules of the functions numba is compiling, innermost last
        self._listener = None
        self._original = None

    def _asked(self, disp, sig) -> None:
        caller = _KERNEL_MODULE.match(self._compiling[-1]) if self._compiling else None
        module = getattr(disp.py_func, "__module__", "") or ""
        if caller is None or not module.startswith(_DEVICE_PREFIX) or "<" in disp.py_func.__qualname__:
            return
        from numba.core import sigutils

        texts = [type_text(t) for t in sigutils.normalize_signature(sig)[0]]
        if None in texts:
            return
        entry = [module, disp.py_func.__qualname__, texts]
        plan = self.plans.setdefault(caller["name"], [])
        if entry not in plan:
            plan.append(entry)

    def __enter__(self):
        from numba.core import dispatcher, event

        compiling = self._compiling

        class Listener(event.Listener):
            def on_start(self, ev):
                compiling.append(getattr(ev.data["dispatcher"].py_func, "__module__", "") or "")

            def on_end(self, ev):
                if compiling:  # (a compile that started before the recorder)
                    compiling.pop()

        original = self._original = dispatcher.Dispatcher.compile
        recorder = self

        def compile(disp, sig):
            recorder._asked(disp, sig)
            return original(disp, sig)

        dispatcher.Dispatcher.compile = compile
        self._listener = Listener()
        event.register("numba:compile", self._listener)
        return self

    def __exit__(self, *exc):
        from numba.core import dispatcher, event

        event.unregister("numba:compile", self._listener)
        dispatcher.Dispatcher.compile = self._original
        return False


# ---------------------------------------------------------------------------------------------------------------
# The helper process, seen from the compiling process


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def share_cpus_with(processes: int) -> None:
    """Called in each of ``processes`` processes started together to compile (simulated ranks, precompile workers):
    turn the helper off in this process when they and a helper each would outnumber the usable CPUs (a
    DG_JIT_WARMUP the user set stands)."""
    if 2 * processes > _usable_cpus():
        os.environ.setdefault(envs.DG_JIT_WARMUP.name, "0")


class Warmup:
    """A running helper; ``stop`` ends it (idempotent), ``wait`` lets it finish its plan."""

    def __init__(self, proc: subprocess.Popen, kernel: str):
        self.proc, self.kernel = proc, kernel
        self.stopped = False

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the helper to finish its plan; returns its exit status (0: every entry was tried)."""
        status = self.proc.wait(timeout)
        _forget(self.proc)
        return status

    def stop(self) -> None:
        """End the helper now (its remaining entries are not needed once the kernel compiled) and reap it in the
        background."""
        if self.stopped:
            return
        self.stopped = True
        if self.proc.poll() is None:
            try:
                self.proc.terminate()
            except OSError:
                pass
            try:
                threading.Thread(target=_reap, args=(self.proc,), name="deep_gemm-warmup-reaper", daemon=True).start()
            except RuntimeError:  # the interpreter is shutting down: stop_all reaps it
                pass
        else:
            _forget(self.proc)
        emit("warmup_stop", kernel=self.kernel)


def _forget_all_in_child() -> None:
    """In a forked child: the parent's helpers are not this process's to stop."""
    global _live_lock
    _live_lock = threading.Lock()
    _live.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_all_in_child)


def _forget(proc: subprocess.Popen) -> None:
    with _live_lock:
        _live.discard(proc)


def _reap(proc: subprocess.Popen) -> None:
    try:
        proc.wait(_STOP_SECONDS)
    except subprocess.TimeoutExpired:  # stuck inside one entry: killed (its cache writes may then need repair)
        proc.kill()
        try:
            proc.wait(_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            return
    _forget(proc)


@atexit.register
def stop_all() -> None:
    """Stop every helper this process started and reap them (also at exit: no helper outlives its process, which
    may be about to remove the cache it writes to)."""
    with _live_lock:
        procs = list(_live)
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        _reap(proc)


def start(kernel: str) -> Warmup | None:
    """Start a helper compiling ``kernel``'s plan, or None when there is little to gain: DG_JIT_WARMUP=0, one usable
    CPU, no writable cache root, no plan, or most of the plan compiled in this process or cached on disk already."""
    if not envs.DG_JIT_WARMUP.get() or _usable_cpus() < 2:
        return None
    from . import cache

    try:
        root = cache.cache_roots().write
    except OSError:
        return None
    plan = plans().get(kernel, [])
    entries = pending(plan)
    # NOTES: a plan is the union of the kernel's variants (dense and grouped GEMMs share a name): when most of it is
    # compiled or cached already, what is left is likely another variant's, and the compile is short anyway.
    if root is None or len(entries) < max(_MIN_PENDING, len(plan) / 2):
        return None
    # NOTES: this deep_gemm, whatever the working directory or PYTHONPATH hold, with this interpreter's flags
    package_parent = str(Path(__file__).resolve().parent.parent.parent)
    code = (f"import sys; sys.path.insert(0, {package_parent!r}); "
            "from deep_gemm.jit.warmup import main; sys.exit(main())")
    command = [sys.executable, *subprocess._args_from_interpreter_flags(), "-c", code, str(os.getpid())]
    env = dict(os.environ, DG_JIT_CACHE_DIR=str(root), DG_JIT_WARMUP="0")
    quiet = envs.DG_JIT_DEBUG.get() < 1
    try:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL if quiet else None, env=env)
    except OSError as e:
        debug(1, f"{kernel}: warm-up helper not started ({type(e).__name__}: {e})")
        return None
    with _live_lock:
        _live.add(proc)
    try:
        proc.stdin.write(json.dumps(entries).encode())
        proc.stdin.close()
    except OSError:  # it exited already (a broken interpreter?): it cannot help
        pass
    emit("warmup_start", kernel=kernel, entries=len(entries), pid=proc.pid)
    debug(1, f"{kernel}: warm-up helper {proc.pid} compiles {len(entries)} device functions from the end of the plan")
    return Warmup(proc, kernel)


# ---------------------------------------------------------------------------------------------------------------
# The helper process itself


_stop_requested = False


def _request_stop(signum, frame):
    global _stop_requested
    _stop_requested = True


def _die_with_parent(parent: int | None) -> None:
    """SIGTERM when the thread that started this helper ends (Linux's PR_SET_PDEATHSIG: a compiling process killed
    outright leaves no helper behind); exit now if that process is gone already."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the helper ends with its plan
        pass
    if parent is not None and os.getppid() != parent:
        _request_stop(signal.SIGTERM, None)


def main(argv: list[str] | None = None) -> int:
    """Compile the plan on stdin (a JSON list of entries), last entry first; argv: the starting process's pid, if
    any. Exit status 0 when every entry was tried or a stop was asked for (entries that failed are named on stderr;
    1 when the plan itself did not parse).

    NOTES: SIGTERM (a stop, or the parent's death) is honoured between entries, never inside one: a compile or a
    cache write cut short would leave files the manifest does not vouch for, which the next reader reports as
    damage. SIGINT is ignored: a Ctrl-C in the terminal reaches the whole process group, and the parent, which
    decides what an interrupt means, stops the helper itself."""
    signal.signal(signal.SIGTERM, _request_stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    argv = sys.argv[1:] if argv is None else argv
    _die_with_parent(int(argv[0]) if argv and argv[0].isdigit() else None)
    try:
        entries = json.load(sys.stdin)
        if not isinstance(entries, list):
            raise ValueError("the plan is not a list")
    except ValueError as e:
        print(f"deep_gemm.jit.warmup: {e}", file=sys.stderr)
        return 1
    from .numba_setup import apply_numba_settings

    apply_numba_settings()
    for entry in reversed(entries):
        if _stop_requested:
            break
        try:
            module, qualname, texts = entry
            _dispatcher(module, qualname).compile(tuple(parse_type(t) for t in texts))
        except Exception as e:  # a stale entry: the kernel's own compile does what is needed
            print(f"deep_gemm.jit.warmup: {entry!r} skipped ({type(e).__name__}: {e})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
