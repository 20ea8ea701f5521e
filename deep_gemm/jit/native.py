"""Native code in the kernel cache: a kernel's numba machine code linked into a shared library that a later process
loads with ctypes and calls without importing numba (numba builds, the cache serves).

build() runs in the process that compiled (or loaded from numba's cache) a kernel's entry: it takes the object code
numba generated for the entry's signature, writes a small C file (a per-phase trampoline that reads the numpy
arrays' data/shape/strides and calls numba's native entry with its flattened arguments, plus the few runtime
functions the code references: NRT allocation), links both with the C compiler into ``native-<sha>.so`` beside
kernel.py, and records it in ``native.json`` (sha256 of the library, the target it was built for: CPU name and
features as LLVM sees them, numba/llvmlite/numpy/Python/deep_gemm versions; its own checksum). load() verifies
native.json, the target and the library's bytes (regular files of bounded size, read through files.py), and dlopens
exactly the verified bytes (a copy in a private directory, removed once loaded); damaged native files are moved
aside (discard()) and built again. The C runtime it links is jit/native_runtime.py, the target record
jit/native_target.py. Knows nothing of GEMM.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .. import envs
from . import files

# NOTES: the runtime C source and the target record live in their own modules; every name stays importable from
# here (tests, tools).
from .native_runtime import _RUNTIME_C, _RUNTIME_SYMBOLS, _WRAPPER_ONLY  # noqa: F401
from .native_target import (  # noqa: F401
    _CPUINFO_KEYS,
    FORMAT,
    _checksum,
    _cpu_fingerprint,
    _read_host_record,
    current_target,
    host_cpu,
)

NATIVE_JSON = "native.json"
OK_STATUSES = (0, -2)  # numba's RETCODE_OK and RETCODE_NONE (a function returning None)
BAD_ARGUMENT = -1000  # the trampoline's status for an array numba's compiled signature does not cover
RAISED = -1  # numba's RETCODE_EXC; statuses >= 1 are its user exceptions (FIRST_USEREXC): both mean the code raised

_NPY_C_CONTIGUOUS, _NPY_ALIGNED, _NPY_WRITEABLE = 0x0001, 0x0100, 0x0400


class NativeUnavailable(Exception):
    """Why a kernel has no native code (the numba path is used); the text is for DG_JIT_DEBUG."""


class NativeStatus(Exception):
    """A native call returned a status other than success: BAD_ARGUMENT (an array numba's compiled signature does
    not cover, refused before anything is written: the call goes through numba), a status of a raised exception
    (``raised``: numba's RETCODE_EXC or a user exception's number) or another failure; after the last two the
    launch's outputs are invalid."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status

    @property
    def raised(self) -> bool:
        return self.status == RAISED or self.status >= 1


def enabled() -> bool:
    """DG_JIT_NATIVE and a platform where build() can work (Linux, ELF shared libraries, 64-bit)."""
    return bool(envs.DG_JIT_NATIVE.get()) and sys.platform.startswith("linux") and sys.maxsize > 2**32


# ---------------------------------------------------------------------------------------------------------------
# Loading


class NativeKernel:
    """A kernel's native library, loaded: ``phases`` are ctypes functions ``fn(*args, cores)`` (the numba entry's
    signature; arrays passed as numpy arrays), raising NativeStatus on a failed status."""

    def __init__(self, handle: ctypes.CDLL, record: dict, path: Path):
        self.handle = handle
        self.record = record
        self.path = path
        self.phases = []
        for phase in record["phases"]:
            fn = getattr(handle, phase["symbol"])
            fn.argtypes = [_CTYPES[kind] for kind in phase["args"]]
            fn.restype = ctypes.c_int32
            fn.errcheck = _errcheck
            self.phases.append(fn)

    def __repr__(self) -> str:
        return f"NativeKernel({self.path})"


_CTYPES = {"array": ctypes.py_object, "int64": ctypes.c_int64, "float64": ctypes.c_double, "bool": ctypes.c_int8}


def _errcheck(result, func, args):
    if result == 0 or result == -2:
        return result
    raise NativeStatus(result)


def read_record(entry: Path) -> dict:
    """native.json of an entry, verified against its own checksum. Raises NativeUnavailable (missing, damaged: also
    not a regular file, too large or not parseable, files.py)."""
    try:
        record = files.load_json_record(entry / NATIVE_JSON)
    except FileNotFoundError:
        raise NativeUnavailable("no native library in the entry") from None
    except files.DamagedFile as e:
        raise NativeUnavailable(f"{NATIVE_JSON} is unreadable ({e})", "damaged") from e
    except OSError as e:
        raise NativeUnavailable(f"{NATIVE_JSON} is unreadable ({type(e).__name__}: {e})") from e
    if record.get("checksum") != _checksum(record):
        raise NativeUnavailable(f"{NATIVE_JSON} does not match its own checksum", "damaged")
    return record


def load(entry: Path, digest: str) -> NativeKernel:
    """The verified native library of the entry at ``entry`` (cache key ``digest``). Raises NativeUnavailable
    saying why not: none built, built for another target (args[1] == "stale"), damaged (args[1] == "damaged": a
    record or library that does not verify), or it cannot be loaded here (args[1] == "unavailable": no private
    directory to load from, dlopen refused the verified bytes)."""
    # NOTES: read without the entry's lock (a read-only root has none); a concurrent rebuild (_link, under the lock)
    # publishes the new library and record and then removes the old library, so a reader holding the old record
    # can find its library gone: it reads the record again once. Still gone: the record names a missing file.
    try:
        return _load(entry, digest)
    except _Vanished:
        pass
    try:
        return _load(entry, digest)
    except _Vanished as e:
        raise NativeUnavailable(str(e), "damaged") from None


class _Vanished(Exception):
    """The library a record names is not there (replaced by a concurrent rebuild, or missing)."""


def _load(entry: Path, digest: str) -> NativeKernel:
    record, data = _verified(entry, digest)
    name = record["library"]
    handle = _dlopen_bytes(data, entry / name)
    _self_test(handle)
    try:
        return NativeKernel(handle, record, entry / name)
    except (AttributeError, KeyError, TypeError) as e:
        raise NativeUnavailable(f"{name} does not provide what {NATIVE_JSON} lists ({e})", "damaged") from e


def _verified(entry: Path, digest: str) -> tuple[dict, bytes]:
    """(native.json, the library's bytes) once both verify for ``digest`` and this target; raises NativeUnavailable
    as load() does, or _Vanished."""
    record = read_record(entry)
    if record.get("digest") != digest or record.get("format") != FORMAT:
        raise NativeUnavailable(f"{NATIVE_JSON} describes another entry or format", "damaged")
    target = current_target()
    built_for = record.get("target") or {}
    if not isinstance(built_for, dict):
        raise NativeUnavailable(f"{NATIVE_JSON} names no target", "damaged")
    if built_for != target:
        diff = sorted(k for k in set(target) | set(built_for) if target.get(k) != built_for.get(k))
        raise NativeUnavailable(f"built for another target (differs in {', '.join(diff)})", "stale")
    name = record.get("library", "")
    if not isinstance(name, str) or "/" in name or not name.endswith(".so"):
        raise NativeUnavailable(f"{NATIVE_JSON} names no library", "damaged")
    try:
        data = files.read_regular_file(entry / name, files.MAX_BINARY_BYTES)
    except FileNotFoundError:
        raise _Vanished(f"{name}, named by {NATIVE_JSON}, is missing") from None
    except files.DamagedFile as e:
        raise NativeUnavailable(f"{name} is unreadable ({e})", "damaged") from e
    except OSError as e:
        raise NativeUnavailable(f"{name} is unreadable ({type(e).__name__}: {e})", "unavailable") from e
    if hashlib.sha256(data).hexdigest() != record.get("sha256"):
        raise NativeUnavailable(f"{name} does not match the sha256 recorded in {NATIVE_JSON}", "damaged")
    return record, data


def discard(entry: Path, digest: str) -> None:
    """After load() found the entry's native files damaged: move native.json and every native-*.so (whatever their
    file type) aside into the root's tmp/, under the entry's lock, so the next build publishes new ones. Nothing is
    moved when, under the lock, they are whole after all (another process rebuilt them meanwhile). Raises OSError
    when they cannot be moved (a read-only entry: the damage stays, and the kernel keeps the numba path)."""
    from .cache import move_aside
    from .numba_cache import locked

    with locked(entry):
        try:
            _verified(entry, digest)
            return
        except _Vanished:
            pass
        except NativeUnavailable as e:
            if len(e.args) < 2 or e.args[1] != "damaged":
                return  # gone, or built for another target: nothing damaged is left
        for path in (entry / NATIVE_JSON, *sorted(entry.glob("native-*.so"))):
            move_aside(entry.parent.parent, path)


_load_count = itertools.count()


def _dlopen_bytes(data: bytes, path: Path) -> ctypes.CDLL:
    """dlopen exactly ``data`` (already verified): written to a new file in a new private (0700) temporary directory,
    loaded, and both removed (the loaded mapping stays; no descriptor is kept, nothing is left behind). Raises
    NativeUnavailable(..., "unavailable") when any step fails: the kernel then runs through numba, and the entry is
    not reported as damaged."""
    # NOTES: the file cannot change between its check and its use (the directory is this process's, 0700); every
    # load uses a file name never used before (pid, counter, random part), since the dynamic loader hands back an
    # already loaded library opened under the same path instead of reading the new file. A directory per load, not
    # one per process: a process killed by a signal (no atexit) leaves nothing in the temporary directory, unless
    # killed in the instant between mkdtemp and rmtree; the directory's name then carries the pid, for
    # sweep_stale_temp_dirs.
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f"{_LOAD_PREFIX}{os.getpid()}-"))
        try:
            target = tmp / f"{os.getpid()}-{next(_load_count)}-{secrets.token_hex(8)}-{path.name}"
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o500)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            return ctypes.CDLL(str(target))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        raise NativeUnavailable(f"{path.name} does not load here ({type(e).__name__}: {e})", "unavailable") from e


_self_test_ok: bool | None = None


def _self_test(handle: ctypes.CDLL) -> None:
    """Once per process: the trampolines read numpy arrays' fields where this numpy keeps them."""
    global _self_test_ok
    if _self_test_ok is None:
        import numpy as np

        probe = handle.dg_probe_array
        probe.argtypes = [ctypes.py_object, ctypes.POINTER(ctypes.c_int64)]
        probe.restype = ctypes.c_int64
        a = np.arange(7, dtype=np.int16)[1:]
        out = (ctypes.c_int64 * 5)()
        probe(a, out)
        flags = _NPY_C_CONTIGUOUS | _NPY_ALIGNED | _NPY_WRITEABLE
        _self_test_ok = (out[0] == a.ctypes.data and out[1] == 1 and out[2] == 6 and out[3] == 2
                         and out[4] & flags == flags)
    if not _self_test_ok:
        raise NativeUnavailable("this numpy's array layout is not the one the trampolines read")


# ---------------------------------------------------------------------------------------------------------------
# Building


def compiler() -> str | None:
    """The C compiler build() links with: $CC, else cc, else gcc; None when there is none."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _c_type(llvm_type) -> str:
    text = str(llvm_type)
    if text.endswith("*") or text == "ptr":
        return "void *"
    return {"i64": "int64_t", "i32": "int32_t", "i16": "int16_t", "i8": "int8_t", "i1": "int8_t",
            "double": "double", "float": "float"}.get(text) or _refuse(f"argument type {text}")


def _refuse(why: str):
    raise NativeUnavailable(why)


def _trampoline(index: int, symbol: str, sig_args, context) -> tuple[str, list[str]]:
    """C source of ``dg_phase_<index>(args)`` calling numba's native ``symbol``, and the argument kinds."""
    from numba.core import types

    params, call, checks, kinds, externs = [], [], [], [], []
    for i, ty in enumerate(sig_args):
        flat = context.get_arg_packer([ty]).argument_types
        if isinstance(ty, types.Array):
            if len(flat) != 5 + 2 * ty.ndim or ty.ndim < 1:
                _refuse(f"array argument {ty} has an unexpected native layout")
            need = (_NPY_C_CONTIGUOUS if ty.layout == "C" else 0) | (_NPY_ALIGNED if ty.aligned else 0) | \
                (_NPY_WRITEABLE if ty.mutable else 0)
            if ty.layout not in ("C", "A"):
                _refuse(f"array argument {ty} is not C-contiguous or any-layout")
            params.append(f"dg_array *a{i}")
            checks.append(f"    if (a{i}->nd != {ty.ndim} || (a{i}->flags & {need}) != {need}) return {BAD_ARGUMENT};")
            nitems = " * ".join(f"a{i}->dimensions[{d}]" for d in range(ty.ndim))
            call += ["(void *)0", "(void *)0", f"(int64_t)({nitems})", f"(int64_t){ty.dtype.bitwidth // 8}",
                     f"(void *)a{i}->data"]
            call += [f"a{i}->dimensions[{d}]" for d in range(ty.ndim)]
            call += [f"a{i}->strides[{d}]" for d in range(ty.ndim)]
            externs += [_c_type(t) for t in flat]
            kinds.append("array")
        elif isinstance(ty, types.Integer) and ty.bitwidth == 64 and ty.signed:
            params.append(f"int64_t a{i}")
            call.append(f"a{i}")
            externs += [_c_type(t) for t in flat]
            kinds.append("int64")
        elif ty == types.float64:
            params.append(f"double a{i}")
            call.append(f"a{i}")
            externs += [_c_type(t) for t in flat]
            kinds.append("float64")
        elif isinstance(ty, types.Boolean):
            params.append(f"int8_t a{i}")
            call.append(f"(int8_t)(a{i} != 0)")
            externs += [_c_type(t) for t in flat]
            kinds.append("bool")
        else:
            _refuse(f"argument type {ty} has no native binding")
    decl = f"extern int32_t {symbol}(void *, void *{''.join(', ' + t for t in externs)});"
    body = "\n".join(checks)
    source = (f"{decl}\nint32_t dg_phase_{index}({', '.join(params)}) {{\n{body}\n"
              f"    void *ret[8] = {{0}};\n    void *exc = 0;\n"
              f"    return {symbol}(ret, &exc{''.join(', ' + c for c in call)});\n}}\n")
    return source, kinds


def _undefined(objects: list[Path]) -> set[str]:
    nm = shutil.which("nm")
    if nm is None:
        _refuse("no nm to list the object code's undefined symbols")
    out = subprocess.run([nm, "-u", *map(str, objects)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip() and not line.endswith(":")}


_BUILD_PREFIX, _LOAD_PREFIX = "deep_gemm-native-", "deep_gemm-load-"  # + "<pid>-<random>" in the system temp dir
_swept = False  # sweep_stale_temp_dirs ran in this process (at its first native build)


def sweep_stale_temp_dirs(directory: str | os.PathLike | None = None) -> list[Path]:
    """Remove the native build and load directories that killed processes (kill -9, power loss: no finally ran)
    left in ``directory`` (default: the system's temp directory): this user's own, named with the pid of a process
    that is not alive here, and older than cache.STALE_TMP_SECONDS. Returns what was removed.

    NOTES: the age rule as for the cache's tmp/ (cache.sweep_stale_tmp): a build takes seconds, and a temp
    directory shared with another pid namespace (containers) could hold a live build of a pid unknown here."""
    from .cache import STALE_TMP_SECONDS, _pid_alive

    base = Path(directory if directory is not None else tempfile.gettempdir())
    removed: list[Path] = []
    now = time.time()
    try:
        candidates = [p for p in base.iterdir() if p.name.startswith((_BUILD_PREFIX, _LOAD_PREFIX))]
    except OSError:
        return removed
    uid = os.getuid() if hasattr(os, "getuid") else None
    for path in candidates:
        pid = path.name.split("-")[2] if path.name.count("-") >= 3 else ""
        try:
            st = path.lstat()
        except OSError:
            continue
        if not pid.isdigit() or (uid is not None and st.st_uid != uid) or now - st.st_mtime < STALE_TMP_SECONDS:
            continue
        if int(pid) == os.getpid() or _pid_alive(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            removed.append(path)
    return removed


_build_lock = threading.Lock()


def _reset_after_fork() -> None:
    """In a forked child: a fresh build lock (a build running in another thread of the parent held it, and that
    thread does not exist in the child)."""
    global _build_lock
    _build_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


class NativeBuild:
    """What build() links, gathered from numba on the compiling thread (object code of each phase, trampolines);
    ``run()`` then needs no numba and may run on another thread (the C compiler runs outside the GIL)."""

    def __init__(self, entry: Path, root: Path, digest: str, objects: list[bytes], sources: list[str],
                 phases: list[dict], signature: list[str]):
        self.entry, self.root, self.digest = entry, root, digest
        self.objects, self.sources, self.phases, self.signature = objects, sources, phases, signature

    def run(self) -> NativeKernel:
        """Link, publish (native-<sha>.so, then native.json, atomically, under the entry's lock) and load.
        Raises NativeUnavailable (the C compiler failed, code needing numba's runtime) or OSError (unwritable)."""
        cc = compiler()
        if cc is None:
            _refuse("no C compiler (set CC, or install cc/gcc)")
        # NOTES: the objects are linked in the system's temp directory (the cache root only ever receives the
        # finished library, written atomically), so a build in progress leaves nothing in the root. mkdtemp + rmtree,
        # not TemporaryDirectory: its finalizer runs at interpreter exit before the atexit wait for background
        # builds (atexit is last in, first out), and would remove the files mid-build. A process killed mid-build
        # (kill -9: no finally) leaves its directory, named with its pid: the first build of a later process
        # sweeps those (sweep_stale_temp_dirs).
        global _swept
        with _build_lock:
            if not _swept:
                _swept = True
                sweep_stale_temp_dirs()
            tmp = Path(tempfile.mkdtemp(prefix=f"{_BUILD_PREFIX}{os.getpid()}-"))
            try:
                return self._link(tmp, cc)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)

    def _link(self, tmp: Path, cc: str) -> NativeKernel:
        entry = self.entry
        objects = []
        for i, obj in enumerate(self.objects):
            (tmp / f"phase{i}.o").write_bytes(obj)
            objects.append(tmp / f"phase{i}.o")
        undefined = _undefined(objects)
        unknown = sorted(s for s in undefined if (s.startswith(("numba_", "NRT_", "_ZN")) and
                                                  s not in _WRAPPER_ONLY and s not in _RUNTIME_SYMBOLS))
        if unknown:
            _refuse(f"the code needs numba's runtime: {', '.join(unknown[:5])}")
        stubs = "".join(f"void {s}(void) {{ dg_wrapper_only(\"{s}\"); }}\n"
                        for s in sorted(undefined & _WRAPPER_ONLY))
        (tmp / "native.c").write_text("\n".join([_RUNTIME_C, *self.sources]) + stubs)
        out = tmp / "native.so"
        cmd = [cc, "-shared", "-fPIC", "-O2", "-o", str(out), str(tmp / "native.c"), *map(str, objects), "-lm",
               "-pthread", "-Wl,-z,notext", "-Wl,-z,noexecstack"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            _refuse(f"the C compiler failed: {proc.stderr.strip()[-400:]}")
        data = out.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        name = f"native-{sha[:16]}.so"
        record = {"format": FORMAT, "digest": self.digest, "library": name, "sha256": sha,
                  "phases": self.phases, "target": current_target(), "signature": self.signature}
        record["checksum"] = _checksum(record)
        from .cache import remove_path
        from .numba_cache import locked, write_atomic

        with locked(entry):
            write_atomic(entry / name, data)
            write_atomic(entry / NATIVE_JSON, json.dumps(record, indent=1, sort_keys=True).encode())
            # NOTES: the libraries of earlier builds (named by the record just replaced, or left by a damaged one)
            # are removed; a reader still holding an old record reads the new one (load()).
            for old in entry.glob("native-*.so"):
                if old.name != name:
                    remove_path(old)
        handle = _dlopen_bytes(data, entry / name)
        _self_test(handle)
        return NativeKernel(handle, record, entry / name)


def prepare_build(entry: Path, root: Path, digest: str, dispatchers: list, sig: tuple) -> NativeBuild:
    """Gather from numba what the native library of the entry at ``entry`` links: each phase dispatcher's object
    code for the (full) signature ``sig`` and its trampoline. Raises NativeUnavailable when it cannot be built."""
    if compiler() is None:
        _refuse("no C compiler (set CC, or install cc/gcc)")
    objects, sources, phases = [], [], []
    for i, disp in enumerate(dispatchers):
        cres = disp.overloads.get(sig)
        if cres is None:
            _refuse(f"no compiled overload for {sig}")
        lib = cres.library
        obj = getattr(lib, "_compiled_object", None) or getattr(lib, "_dg_object", None)
        if not obj:
            _refuse("numba kept no object code of the entry")
        objects.append(bytes(obj))
        source, kinds = _trampoline(i, cres.fndesc.mangled_name, cres.signature.args, cres.target_context)
        sources.append(source)
        phases.append({"symbol": f"dg_phase_{i}", "args": kinds})
    return NativeBuild(entry, root, digest, objects, sources, phases, [str(t) for t in sig])


def install_object_capture() -> bool:
    """Keep the object code numba hands to LLVM when it loads a library from its cache (numba drops it), so a
    kernel loaded from numba's cache can still be linked natively. Idempotent; needs numba's known internals."""
    from numba.core import codegen

    cls = codegen.CPUCodeLibrary
    if getattr(cls, "_dg_object_capture", False):
        return True
    original = getattr(cls, "_object_getbuffer_hook", None)
    if original is None:
        return False
    func = original.__func__

    def _object_getbuffer_hook(klass, ll_module):
        buf = func(klass, ll_module)
        if buf:
            library = getattr(ll_module, "_CPUCodeLibrary__library", None)
            if library is not None:
                library._dg_object = buf
        return buf

    cls._object_getbuffer_hook = classmethod(_object_getbuffer_hook)
    cls._dg_object_capture = True
    return True
