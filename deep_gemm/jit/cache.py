"""The on-disk kernel cache: where it lives, how a key is computed, how entries are published, checked and cleared.

An entry is an immutable directory ``<root>/cache/<name>.<digest>/`` (kernel.asc, kernel.py, meta.json, and
numba's ``__pycache__``), built in ``<root>/tmp/<pid>-<uuid>/`` and published with one ``os.rename``. meta.json
carries its own checksum and the sha256 of kernel.asc and kernel.py; numba's files are vouched for by their own
manifest (numba_cache.py). Knows nothing of rendering, translating or numba compiling (compile.py does those).
"""

from __future__ import annotations

import errno
import functools
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import stat
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

from .. import envs
from . import events, files
from .sources import codegen_sources_digest, device_dependencies

META_VERSION = 3  # 2: meta.json carries its own checksum; 3: it records the entry's parameters ("params")
SHARED_NUMBA_DIR = "numba"  # <root>/numba/: numba's files of deep_gemm's device modules (numba_cache.py)
_PACKAGE_DIR = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------------------------------
# Cache root


class CacheRoots:
    """Where entries are written (``write``; None when no root is writable: kernels are then built in memory) and
    the extra read-only roots searched first (``read_only``)."""

    def __init__(self, write: Path | None, read_only: tuple[Path, ...] = ()):
        self.write = write
        self.read_only = read_only

    @property
    def search(self) -> tuple[Path, ...]:
        return (*self.read_only, self.write) if self.write is not None else self.read_only

    def __repr__(self) -> str:
        return f"CacheRoots(write={str(self.write)!r}, read_only={[str(p) for p in self.read_only]})"


_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """Warn (RuntimeWarning) once per process for ``key``."""
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(f"deep_gemm.jit: {message}", RuntimeWarning, stacklevel=3)


def _probe_writable(root: Path) -> bool:
    """Create cache/ and tmp/ under root and a file in tmp/; False when any of it fails."""
    try:
        (root / "cache").mkdir(parents=True, exist_ok=True)
        (root / "tmp").mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=root / "tmp", prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
        return True
    except OSError:
        return False


def _private_dir(root: Path) -> bool:
    """The temp-dir fallback sits where every user may write: use it only when it is this user's own directory and
    nobody else can write into it (another user could otherwise plant a kernel.py that this process runs)."""
    if not hasattr(os, "getuid"):
        return True
    try:
        root.mkdir(mode=0o700, exist_ok=True)
        st = root.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _checkout_root() -> Path | None:
    repo = _PACKAGE_DIR.parent
    if (repo / "pyproject.toml").is_file() and (repo / "jit_cache").is_dir():
        return repo / "jit_cache"
    return None


def _candidates() -> Iterator[tuple[str, Path]]:
    # NOTES: a generator, so the fallbacks are only worked out when an earlier root is not writable: platformdirs
    # (~3 ms to import) stays out of a process whose DG_JIT_CACHE_DIR or checkout cache serves it (start-up).
    env_dir = envs.DG_JIT_CACHE_DIR.get()
    if env_dir:
        yield ("DG_JIT_CACHE_DIR", Path(env_dir).expanduser())
    else:
        checkout = _checkout_root()
        if checkout is not None:
            yield ("source checkout", checkout)
    import platformdirs

    yield ("user cache", Path(platformdirs.user_cache_dir("deep_gemm", appauthor=False)) / "jit")
    uid = os.getuid() if hasattr(os, "getuid") else 0
    yield ("temp dir", Path(tempfile.gettempdir()) / f"deep_gemm-jit-{uid}")


@functools.lru_cache(maxsize=8)
def _resolve_roots(env_value: str | None) -> CacheRoots:
    read_only: list[Path] = []
    skipped: list[str] = []
    candidates = _candidates()
    for i, (origin, path) in enumerate(candidates):
        if (origin != "temp dir" or _private_dir(path)) and _probe_writable(path):
            if skipped:
                warn_once(f"root:{skipped}", f"kernel cache root {', '.join(skipped)} is not writable; new kernels "
                                             f"go to {path}")
            return CacheRoots(path, tuple(read_only))
        if i == 0 and (path / "cache").is_dir():
            read_only.append(path)  # still worth reading: entries someone else built
        skipped.append(f"{path} ({origin})")
    # NOTES: a cache that cannot be written never fails a call: kernels are compiled in memory instead.
    warn_once("cache-unwritable", f"no writable kernel cache directory among {', '.join(skipped)}; kernels are "
                                  "compiled in memory for this process (correct, but compiled again by the next "
                                  "process). Point DG_JIT_CACHE_DIR at a writable directory")
    return CacheRoots(None, tuple(read_only))


def cache_roots() -> CacheRoots:
    """The roots in force: DG_JIT_CACHE_DIR, else jit_cache/ of a writable source checkout, else the user cache
    directory, else a temp directory. An unwritable first choice is kept as a read-only lookup root."""
    return _resolve_roots(envs.DG_JIT_CACHE_DIR.get())


def cache_root() -> Path:
    """The root new entries are written to. Raises OSError when no root is writable."""
    root = cache_roots().write
    if root is None:
        raise OSError("no writable kernel cache directory (see the warning above); pass a root explicitly")
    return root


# ---------------------------------------------------------------------------------------------------------------
# Key


@functools.lru_cache(maxsize=1)
def tool_versions() -> dict[str, str]:
    """Versions of everything that changes the generated machine code."""
    out = {"python": platform.python_version()}
    for dist in ("numba", "llvmlite", "numpy", "tree-sitter-cpp"):
        out[dist] = dist_version(dist)
    return out


@functools.cache
def dist_version(dist: str) -> str:
    """Installed version of distribution ``dist`` ("missing" when absent), read from the ``<dist>-<version>
    .dist-info`` directory beside its top-level package when there is exactly one, else through importlib.metadata.

    NOTES: importlib.metadata costs ~40 ms to import and query on a loaded machine, a tenth of a warm start-up."""
    module = dist.replace("-", "_")
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        site = Path(spec.origin).parent.parent
        found = [p.name for p in site.glob(f"{module}-*.dist-info")] if site.is_dir() else []
        if len(found) == 1:
            return found[0][len(module) + 1: -len(".dist-info")]
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "missing"


def cache_key(name: str, rendered: str, device_module: str, numba_settings: dict) -> tuple[str, dict]:
    """(digest, components): sha256 over the kernel name, the rendered source, the JIT modules that shape generated
    code (sources.CODEGEN_SOURCES), the device modules this kernel's source uses (sources.device_dependencies: the
    intrinsics it names, their modules and what those import), the meta.json format, numba settings and tool
    versions. The digest is the first 32 hex characters.

    NOTES: the device part is per kernel, so adding an intrinsic (a new device module exported by the device
    package) or editing one a kernel does not call leaves that kernel's entry valid.
    """
    deps = device_dependencies(device_module, rendered)
    components = {
        "name": name,
        "source_sha256": hashlib.sha256(rendered.encode()).hexdigest(),
        "codegen_sources": codegen_sources_digest(),
        "device_module": device_module,
        "device_intrinsics": deps["intrinsics"],
        "device_modules": deps["modules"],
        "device_sources": deps["sha256"],
        "meta_version": META_VERSION,
        "numba_settings": {k: str(v) for k, v in sorted(numba_settings.items())},
        **tool_versions(),
    }
    digest = hashlib.sha256(json.dumps(components, sort_keys=True).encode()).hexdigest()[:32]
    return digest, components


# ---------------------------------------------------------------------------------------------------------------
# Entries


def entry_path(root: Path, name: str, digest: str) -> Path:
    return root / "cache" / f"{name}.{digest}"


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


STALE_TMP_SECONDS = 600.0


def new_tmp_dir(root: Path) -> Path:
    """A new build directory tmp/<pid>-<uuid>/ (after removing the stale ones of dead processes)."""
    sweep_stale_tmp(root)
    path = root / "tmp" / f"{os.getpid()}-{uuid.uuid4().hex}"
    path.mkdir(parents=True)
    return path


def sweep_stale_tmp(root: Path) -> None:
    """Remove build directories left in tmp/ by processes that died mid-build (kill -9, power loss) and
    moved-aside entries whose deletion failed.

    NOTES: only when older than STALE_TMP_SECONDS and, for builds, when their pid is not alive here: a build
    takes seconds, and a cache shared by several hosts could hold a live build of a pid unknown to this one.
    """
    tmp = root / "tmp"
    if not tmp.is_dir():
        return
    now = time.time()
    for p in tmp.iterdir():
        pid, _, rest = p.name.partition("-")
        is_build = pid.isdigit() and rest
        if not (is_build or p.name.endswith(".corrupt")):
            continue
        try:
            if now - p.lstat().st_mtime < STALE_TMP_SECONDS:
                continue
            if is_build and _pid_alive(int(pid)):
                continue
        except OSError:
            continue
        remove_path(p)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def write_file(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


class EntryProblem(Exception):
    """What is wrong with a cache entry (the text is for the warning)."""


def meta_checksum(meta: dict) -> str:
    """sha256 of meta.json's content without its ``checksum`` field (canonical JSON)."""
    body = {k: v for k, v in meta.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def meta_text(meta: dict) -> str:
    """meta.json's text: ``meta`` plus its own checksum."""
    return json.dumps({**meta, "checksum": meta_checksum(meta)}, indent=1, sort_keys=True)


def load_entry(path: Path, name: str, digest: str) -> tuple[dict, bytes]:
    """(meta, kernel.py bytes) of a complete, consistent entry, read once and verified: meta.json against its own
    checksum, kernel.asc and kernel.py against the sha256 it records. Raises EntryProblem naming what is wrong
    (a missing, unreadable or edited file, a file that is not a regular file or is too large (files.py), or a path
    that is not a directory)."""
    if not path.is_dir():
        raise EntryProblem("it is not a directory")
    try:
        meta = files.load_json_record(path / "meta.json")
    except FileNotFoundError:
        raise EntryProblem("meta.json is missing") from None
    except (OSError, files.DamagedFile) as e:
        raise EntryProblem(f"meta.json is unreadable ({_problem(e)})") from e
    if meta.get("checksum") != meta_checksum(meta):
        raise EntryProblem("meta.json does not match its own checksum (damaged, or written by an older deep_gemm)")
    if meta.get("digest") != digest or meta.get("name") != name:
        raise EntryProblem("meta.json does not describe this entry")
    if meta.get("meta_version") != META_VERSION or not isinstance(meta.get("params"), list):
        raise EntryProblem(f"meta.json is version {meta.get('meta_version')!r}, not {META_VERSION} (no entry "
                           "signature: written by an older deep_gemm)")
    recorded = meta.get("files") if isinstance(meta.get("files"), dict) else {}
    contents = {}
    for fname in ("kernel.asc", "kernel.py"):
        try:
            contents[fname] = files.read_regular_file(path / fname, files.MAX_SOURCE_BYTES)
        except FileNotFoundError:
            raise EntryProblem(f"{fname} is missing") from None
        except (OSError, files.DamagedFile) as e:
            raise EntryProblem(f"{fname} is unreadable ({_problem(e)})") from e
        if recorded.get(fname) != hashlib.sha256(contents[fname]).hexdigest():
            raise EntryProblem(f"{fname} does not match the hash recorded in meta.json (truncated or edited)")
    return meta, contents["kernel.py"]


def _problem(e: BaseException) -> str:
    return str(e) if isinstance(e, files.DamagedFile) else f"{type(e).__name__}: {e}"


def check_entry(path: Path, name: str, digest: str) -> str | None:
    """None when the entry is complete and consistent, else what is wrong with it (for the warning)."""
    try:
        load_entry(path, name, digest)
    except EntryProblem as e:
        return str(e)
    return None


def publish(tmp_dir: Path, final: Path) -> bool:
    """Rename tmp_dir to final. True if we published; False if another process published this key first
    (then tmp_dir is removed). The only error this module swallows."""
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(tmp_dir, final)
        return True
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST) and final.is_dir():
            shutil.rmtree(tmp_dir, ignore_errors=True)
            return False
        raise


def move_aside(root: Path, path: Path) -> None:
    """Move whatever sits at an entry's path (a corrupt entry, a plain file) out of cache/ into tmp/, then delete
    it. If it is already gone another process did it; the caller then rebuilds or uses whatever is published.
    Raises OSError when it cannot be moved (a read-only root); what cannot be deleted stays in tmp/ for
    clear_cache.py."""
    trash = root / "tmp" / f"{uuid.uuid4().hex}.corrupt"
    trash.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(path):
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            return
        remove_path(trash)


def report_damaged_file(path: Path, what: str, problem: str, *, root: Path | None, repaired: str,
                        unrepaired: str) -> bool:
    """Report a damaged cache file outside the entries (a key index or host record: ``what``) once per process,
    after moving it aside when ``root``, the writable root holding it, is given. The warning says ``repaired``
    (what happens next) when it was moved aside, else why it could not be and ``unrepaired``: damage that cannot
    be repaired never claims a rebuild. True when it was moved aside."""
    error = None
    if root is not None:
        try:
            move_aside(root, path)
        except OSError as e:
            error = e
    if root is None:
        action = f"it is in a read-only root; {unrepaired}"
    elif error is not None:
        action = f"it cannot be moved aside ({type(error).__name__}: {error}); {unrepaired}"
    else:
        action = f"it is moved aside; {repaired}"
    events.emit("corrupt", path=str(path), what=f"{what}: {problem}")
    warn_once(f"damaged:{path}:{problem}", f"damaged {what} {path}: {problem}; {action}. Fix: remove it "
                                           f"(rm -rf {path}) or run scripts/clear_cache.py")
    return root is not None and error is None


def remove_path(path: Path) -> bool:
    """Remove a file, symlink or directory tree; True when nothing is left."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass
    return not os.path.lexists(path)


def list_entries(root: Path | None = None) -> list[Path]:
    root = root if root is not None else cache_root()
    cache = root / "cache"
    return sorted(p for p in cache.iterdir() if p.is_dir()) if cache.is_dir() else []


def clear(root: Path | None = None, name: str | None = None, dry_run: bool = False) -> list[Path]:
    """Remove whatever sits in the cache: entries and anything else at an entry path (all, or those of kernel
    ``name``), and, when ``name`` is None, leftover tmp/ builds, moved-aside entries, numba's files of the
    device modules (numba/) and the key index (index/). Returns what was (or, with dry_run, would be) removed.
    Processes holding a kernel keep running; they rebuild on their next miss."""
    root = root if root is not None else cache_root()
    cache_dir = root / "cache"
    targets = sorted(p for p in cache_dir.iterdir() if name is None or p.name.rsplit(".", 1)[0] == name) \
        if cache_dir.is_dir() else []
    if name is None:
        for sub in ("tmp", SHARED_NUMBA_DIR, "index"):
            if (root / sub).is_dir():
                targets += sorted((root / sub).iterdir())
    if not dry_run:
        targets = [p for p in targets if remove_path(p)]
    return targets


def python_command() -> str:
    return sys.executable or "python"
