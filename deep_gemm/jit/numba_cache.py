"""numba's on-disk cache for deep_gemm's own functions (generated kernels and device intrinsics): where its files
live (under the kernel cache root), a manifest of their sha256 checked on every read, and writes allowed to fail.

Installed by numba_setup.apply_numba_settings before any deep_gemm function is decorated; every other numba
function of the process keeps numba's own cache. Knows nothing of rendering, translating or GEMM.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import io
import json
import os
import pickle
import stat
import sys
import uuid
import weakref
from pathlib import Path

from . import cache, events, files, sources

MANIFEST = "numba.json"  # {"files": {file name: sha256}, "sha256": sha256 of the canonical files mapping}
LOCK = ".lock"
SHARED_DIR = "numba"  # <root>/numba/<source dir>_<hash>/: numba files of deep_gemm's device modules

# NOTES: numba writes an entry's .nbi/.nbc files at the first call of each signature, after the entry was
# published (the argument types are only known then, and a kernel may gain signatures later: another layout or
# dtype). So they cannot be in meta.json, which is fixed when the entry is renamed into place. Instead every
# numba write records the sha256 of the exact bytes it wrote in a second manifest (numba.json, next to them),
# under an flock of the directory and replaced atomically; every read takes the bytes once, checks them against
# the manifest and unpickles those same bytes. A file the manifest does not vouch for is never handed to numba.

_memory_modules: set[str] = set()  # generated kernel modules built in memory (no disk cache)
_read_only_modules: set[str] = set()  # kernel modules of entries in a read-only root (their numba files are read)


class DamagedCacheFile(Exception):
    """A numba cache file whose bytes the manifest does not vouch for."""


# ---------------------------------------------------------------------------------------------------------------
# Manifest and locked, atomic writes


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _manifest_checksum(recorded: dict) -> str:
    return _sha256(json.dumps(recorded, sort_keys=True).encode())


def read_manifest(directory: Path) -> dict[str, str]:
    """{file name: sha256} recorded for ``directory``; {} when there is none. Raises DamagedCacheFile when the
    manifest itself does not verify."""
    try:
        doc = files.load_json_record(directory / MANIFEST)
    except FileNotFoundError:
        return {}
    except files.DamagedFile as e:
        raise DamagedCacheFile(f"{MANIFEST} does not verify ({e})") from e
    recorded = doc.get("files")
    if not isinstance(recorded, dict) or doc.get("sha256") != _manifest_checksum(recorded):
        raise DamagedCacheFile(f"{MANIFEST} does not verify (checksum mismatch)")
    return recorded


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path`` and rename it over ``path``; nothing is left behind on
    any error (ENOSPC, EROFS, an interrupt)."""
    tmp = path.with_name(f"{path.name}.tmp.{uuid.uuid4().hex[:12]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        try:
            os.replace(tmp, path)
        except OSError:
            # NOTES: a directory where a cache file belongs (damage) is never replaced by a rename: it is renamed
            # aside and removed, then the file is published. Anything else is an error of the write.
            if not (os.path.isdir(path) and not os.path.islink(path)):
                raise
            aside = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.damaged")
            os.rename(path, aside)
            cache.remove_path(aside)
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_manifest(directory: Path, recorded: dict[str, str]) -> None:
    doc = {"files": recorded, "sha256": _manifest_checksum(recorded)}
    write_atomic(directory / MANIFEST, json.dumps(doc, indent=0, sort_keys=True).encode())


@contextlib.contextmanager
def locked(directory: Path):
    """Exclusive flock of ``directory`` (its .lock file) for read-modify-write of numba's files and the manifest.
    A .lock that is not a regular file (damage: a directory, a FIFO, a symlink) is removed and created again."""
    path = directory / LOCK
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | \
        getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError:
        if not os.path.lexists(path) or stat.S_ISREG(os.lstat(path).st_mode):
            raise
        cache.remove_path(path)
        fd = os.open(path, flags, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO opens read-write without waiting
        os.close(fd)
        cache.remove_path(path)
        fd = os.open(path, flags, 0o644)
    try:
        try:
            import fcntl
        except ImportError:  # not POSIX: atomic renames only
            fcntl = None
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def directory_problem(directory: Path) -> str | None:
    """None when every .nbi/.nbc file in ``directory`` matches the manifest, else the first problem (for tools and
    tests; loads check each file as they read it)."""
    try:
        expected = read_manifest(directory)
    except DamagedCacheFile as e:
        return str(e)
    for path in sorted(directory.glob("*.nb[ic]")):
        try:
            data = files.read_regular_file(path, files.MAX_BINARY_BYTES)
        except (OSError, files.DamagedFile) as e:
            return f"{path.name} is unreadable ({e})"
        if expected.get(path.name) != _sha256(data):
            return f"{path.name} does not match the sha256 recorded in {MANIFEST}"
    return None


# ---------------------------------------------------------------------------------------------------------------
# Reporting


def _report_damaged(directory: Path, what: str, discarded: bool = True) -> None:
    events.emit("corrupt", path=str(directory), what=f"numba cache: {what}")
    action = ("they are discarded and the functions recompiled" if discarded else
              "they cannot be removed (a read-only directory), so the functions are compiled again in every "
              "process")
    cache.warn_once(f"numba-damaged:{directory}", f"numba cache files in {directory} are damaged ({what}); "
                                                  f"{action}. Fix: remove them or run scripts/clear_cache.py")


def report_unwritable(where: Path | str | None, error: BaseException) -> None:
    """One warning per process: the kernel cache could not be written, so kernels are compiled in memory."""
    events.emit("cache_write_failed", path=str(where), error=f"{type(error).__name__}: {error}")
    cache.warn_once("cache-unwritable", f"the kernel cache could not be written at {where} ({type(error).__name__}: "
                                        f"{error}); kernels are compiled in memory for this process (correct, but "
                                        "compiled again by the next process). Free space or point DG_JIT_CACHE_DIR "
                                        "at a writable directory")


# ---------------------------------------------------------------------------------------------------------------
# numba cache classes for deep_gemm's functions


def _numba_classes():
    """Build the numba subclasses on first use (numba is imported only when deep_gemm compiles)."""
    from numba.core import caching

    class Locator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
        """numba files of one deep_gemm function in a directory deep_gemm chose (resolved at first use)."""

        def __init__(self, py_func, py_file: str, directory_fn):
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            self._directory_fn = directory_fn

        def ensure_cache_path(self):
            path = self.get_cache_path()
            if path is None:
                raise OSError(f"no writable kernel cache root for {self._py_file}")
            os.makedirs(path, exist_ok=True)

        def get_cache_path(self):
            path = self._directory_fn()
            return None if path is None else str(path)

    class Impl(caching.CompileResultCacheImpl):
        def __init__(self, py_func, locator):  # numba's __init__ would search its own locators (and mkdir them)
            self._lineno = py_func.__code__.co_firstlineno
            self._locator = locator
            modname = os.path.splitext(os.path.basename(locator._py_file))[0]
            self._filename_base = self.get_filename_base(f"{modname}.{py_func.__qualname__}",
                                                         getattr(sys, "abiflags", ""))

    class VerifiedIndexDataCacheFile(caching.IndexDataCacheFile):
        """numba's index/data files, every byte read checked against the manifest, every write recorded in it."""

        @property
        def directory(self) -> Path:
            return Path(self._cache_path)

        def _read_verified(self, name: str) -> bytes | None:
            path = self.directory / name
            try:
                data = files.read_regular_file(path, files.MAX_BINARY_BYTES)
            except FileNotFoundError:
                return None
            except files.DamagedFile as e:
                raise DamagedCacheFile(f"{name} is unreadable ({e})") from e
            if read_manifest(self.directory).get(name) == _sha256(data):
                return data
            if getattr(self, "_holding_lock", False):  # in save(): the reads above were already consistent
                raise DamagedCacheFile(f"{name} does not match {MANIFEST}")
            # NOTES: a concurrent writer may have replaced the file between our reads of it and of the manifest;
            # under the lock both are consistent, so a mismatch there is damage. (flock is per open file, so a
            # second lock from the same process would wait for itself: save() reads with the lock already held.)
            try:
                with locked(self.directory):
                    data = files.read_regular_file(path, files.MAX_BINARY_BYTES)
                    expected = read_manifest(self.directory).get(name)
            except FileNotFoundError:
                return None
            except files.DamagedFile as e:
                raise DamagedCacheFile(f"{name} is unreadable ({e})") from e
            except OSError:
                expected = None
            if expected == _sha256(data):
                return data
            raise DamagedCacheFile(f"{name} " + ("is not recorded in the manifest" if expected is None else
                                                 f"does not match the sha256 recorded in {MANIFEST}"))

        def _load_index(self):
            data = self._read_verified(self._index_name)
            if data is None:
                return {}
            stream = io.BytesIO(data)
            if pickle.load(stream) != self._version:
                return {}  # written by another numba release: stale, overwritten by the next save
            stamp, overloads = pickle.loads(stream.read())
            return overloads if stamp == self._source_stamp else {}

        def _load_data(self, name):
            data = self._read_verified(name)
            if data is None:
                raise FileNotFoundError(self.directory / name)  # numba's load() treats it as a miss
            return pickle.loads(data)

        def save(self, key, data):
            written: list[Path] = []
            with locked(self.directory):
                self._holding_lock = True
                try:
                    try:
                        overloads = self._load_index()
                    except DamagedCacheFile:
                        overloads = {}
                    data_name = overloads.get(key)
                    if data_name is None:
                        used = set(overloads.values())
                        data_name = next(self._data_name(i) for i in range(1, len(used) + 2)
                                         if self._data_name(i) not in used)
                        overloads = {**overloads, key: data_name}
                    payload = self._dump(data)
                    index = pickle.dumps(self._version, protocol=-1) + self._dump((self._source_stamp, overloads))
                    for name, content in ((data_name, payload), (self._index_name, index)):
                        write_atomic(self.directory / name, content)
                        written.append(self.directory / name)
                    try:
                        recorded = read_manifest(self.directory)
                    except DamagedCacheFile:
                        recorded = {}
                    recorded = {n: h for n, h in recorded.items() if (self.directory / n).exists()}
                    recorded.update({data_name: _sha256(payload), self._index_name: _sha256(index)})
                    write_manifest(self.directory, recorded)
                except BaseException:
                    # NOTES: files the manifest does not vouch for would read as damage; remove what we wrote.
                    for path in written:
                        with contextlib.suppress(OSError):
                            path.unlink()
                    raise
                finally:
                    self._holding_lock = False

        def discard(self) -> bool:
            """Remove this function's index and data files (after damage; whatever their file type); other
            functions' files stay. False when they could not be removed (a read-only directory)."""
            base = self._index_name[: -len(".nbi")]
            try:
                with locked(self.directory):
                    names = [self._index_name] + [p.name for p in self.directory.glob(f"{base}.*.nbc")]
                    if not all(cache.remove_path(self.directory / name) for name in names):
                        return False
                    try:
                        recorded = read_manifest(self.directory)
                    except DamagedCacheFile:
                        recorded = {}
                    write_manifest(self.directory, {n: h for n, h in recorded.items()
                                                    if n not in names and (self.directory / n).exists()})
            except OSError:
                return False
            return True

    class VerifiedFunctionCache(caching.FunctionCache):
        """numba's per-function cache for a deep_gemm function: files under the kernel cache root, verified on
        every read; a failed write (full or read-only disk, ...) warns once and leaves the function in memory."""

        def __init__(self, py_func, directory_fn):  # numba's __init__ would resolve the directory now
            self._name = repr(py_func)
            self._py_func = py_func
            self._impl = Impl(py_func, Locator(py_func, inspect.getfile(py_func), directory_fn))
            self._file = None
            self._save_failed = False
            self.enable()

        @property
        def _cache_file(self):
            if self._file is None:
                path = self._impl.locator.get_cache_path()
                if path is None:
                    return None
                self._file = VerifiedIndexDataCacheFile(path, self._impl.filename_base,
                                                        self._impl.locator.get_source_stamp())
            return self._file

        @property
        def cache_path(self):
            return self._impl.locator.get_cache_path()

        def _index_key(self, sig, codegen):
            # NOTES: with deferred machine code (lazy_codegen.py) a cached library is bitcode without numba's
            # wrappers: a process without it (DG_JIT_LAZY_CODEGEN=0) must not load those, nor they its.
            from .lazy_codegen import cache_tag

            return (*super()._index_key(sig, codegen), cache_tag())

        def flush(self):
            with contextlib.suppress(Exception):
                if self._cache_file is not None:
                    self._cache_file.discard()  # numba writes an empty index here; removing the files is ours

        def load_overload(self, sig, target_context):
            if not self._enabled:
                return None
            target_context.refresh()
            file = self._cache_file
            if file is None:
                return None
            key = self._index_key(sig, target_context.codegen())
            try:
                data = file.load(key)
                return None if data is None else self._impl.rebuild(target_context, data)
            except DamagedCacheFile as e:
                what = str(e)
            except OSError as e:  # unreadable: a miss (compiled, and saved when the disk allows)
                what = f"unreadable ({type(e).__name__}: {e})"
            except Exception as e:  # noqa: BLE001 - verified bytes numba cannot rebuild (RecursionError included)
                what = f"{self._impl.filename_base} does not load ({type(e).__name__}: {e})"
            _report_damaged(file.directory, what, discarded=file.discard())
            return None

        def save_overload(self, sig, data):
            if not self._enabled or self._save_failed:
                return
            try:
                if not self._impl.check_cachable(data):
                    return
                self._impl.locator.ensure_cache_path()
                file = self._cache_file
                key = self._index_key(sig, data.codegen)
                file.save(key, self._impl.reduce(data))
            except OSError as e:  # ENOSPC, EROFS, EACCES...: the function is compiled in memory, only its copy is lost
                self._save_failed = True
                report_unwritable(self.cache_path, e)
            except Exception as e:  # noqa: BLE001 - same: never fail a call because its cache copy failed
                # NOTES: e.g. numba's "no compiled object yet" after an interrupt swallowed inside LLVM's
                # object-code callback (compile.py then raises that KeyboardInterrupt).
                self._save_failed = True
                cache.warn_once(f"numba-save:{self._impl.filename_base}", f"numba's cache of "
                                f"{self._impl.filename_base} was not saved ({type(e).__name__}: {e}); it is "
                                "compiled again by the next process")

    VerifiedFunctionCache.file_class = VerifiedIndexDataCacheFile
    return VerifiedFunctionCache


@functools.lru_cache(maxsize=1)
def _verified_cache_class():
    return _numba_classes()


@functools.cache
def _sources_tag(source_dir: Path) -> str:
    """A hash of ``source_dir``'s path and of the package modules its functions can reach: its own modules and,
    transitively, every module of the package they import (names and bytes; read once per process and
    directory). An edit elsewhere in the package leaves these functions' cache alone."""
    package = Path(__file__).resolve().parent.parent
    prefix = ".".join(source_dir.relative_to(package.parent).parts)
    modules = {prefix if p.stem == "__init__" else f"{prefix}.{p.stem}" for p in source_dir.glob("*.py")}
    digest = hashlib.sha1(str(source_dir).encode())
    for module in sorted(sources.import_closure(modules, package.name, with_jit=True)):
        path = sources.module_file(module)
        if path is not None:
            digest.update(module.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _shared_directory(source_dir: Path) -> Path | None:
    """<root>/numba/<dir name>_<hash of its path and modules>/ for the functions of modules in ``source_dir``; None
    when no writable root exists (the functions then stay in memory).

    NOTES: numba checks a cached function only against its own file's stamp, but a device function inlines the
    functions it calls from other modules and freezes the constants it reads from them (heuristics.capacity): keyed
    by one file, an edited callee (an upgrade of deep_gemm) would leave its callers' stale machine code in use.
    Every module the directory's modules reach through imports is in the tag, so an edit of any of them rebuilds
    these functions once (and an edit of an unrelated module, say api/, none)."""
    try:
        root = cache.cache_roots().write
    except OSError:
        return None
    if root is None:
        return None
    try:
        tag = _sources_tag(source_dir)
    except OSError:
        return None
    return root / SHARED_DIR / f"{source_dir.name}_{tag}"


def cache_for(py_func):
    """The numba cache deep_gemm gives ``py_func``, or None when it is not deep_gemm's (numba decides)."""
    from numba.core.caching import NullCache

    from .numba_facts import KERNEL_MODULE_MARK

    module = getattr(py_func, "__module__", None) or ""
    if module.startswith(KERNEL_MODULE_MARK):
        if module in _memory_modules:
            return NullCache()
        directory = Path(inspect.getfile(py_func)).resolve().parent / "__pycache__"
        ours = _verified_cache_class()(py_func, lambda: directory)
        # NOTES: the user was told once that this root is not writable; no second warning per failed save.
        ours._save_failed = module in _read_only_modules
        return ours
    if module == "deep_gemm" or module.startswith("deep_gemm."):
        source_dir = Path(inspect.getfile(py_func)).resolve().parent
        return _verified_cache_class()(py_func, functools.lru_cache(maxsize=1)(
            functools.partial(_shared_directory, source_dir)))
    return None


# numba function compilers holding a memoized failure (install() records them)
_failing_compilers: weakref.WeakSet = weakref.WeakSet()


def install() -> bool:
    """Route numba's cache=True of deep_gemm's functions through cache_for() (idempotent). False, leaving numba
    alone, when the installed numba is not the release whose internals this was written against."""
    from numba.core import dispatcher

    from .numba_facts import numba_internals_known

    cls = dispatcher.Dispatcher
    if getattr(cls, "_dg_verified_cache", False):
        return True
    if not numba_internals_known():
        return False
    original = cls.enable_caching

    def enable_caching(self):
        ours = cache_for(self.py_func)
        if ours is None:
            return original(self)
        self._cache = ours

    cls.enable_caching = enable_caching
    cls._dg_verified_cache = True
    compiler_cls = dispatcher._FunctionCompiler
    original_cached = compiler_cls._compile_cached

    def _compile_cached(self, args, return_type):
        status, retval = original_cached(self, args, return_type)
        if not status:
            _failing_compilers.add(self)  # a failure numba memoized (forget_failed_compiles can drop it)
        return status, retval

    compiler_cls._compile_cached = _compile_cached
    return True


def forget_failed_compiles() -> None:
    """Drop numba's memo of failed typings (after an interrupted compile, a failure that the interrupt caused would
    otherwise be replayed by every later call).

    NOTES: every compiler that memoized a failure, numba's own included: an interrupt that lands while numba types
    one of its implementations (np.empty's, on the first compile of a process) leaves that TypingError in numba's
    dispatcher, and every later kernel that allocates would replay it. install() records them as they fail."""
    for compiler in list(_failing_compilers):
        compiler._failed_cache.clear()
    _failing_compilers.clear()
