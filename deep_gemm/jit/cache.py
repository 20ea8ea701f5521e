"""The on-disk kernel cache: where it lives, how a key is computed, how entries are published, checked and cleared.

An entry is an immutable directory ``<root>/cache/<name>.<digest>/`` (kernel.asc, kernel.py, meta.json, and
numba's ``__pycache__``), built in ``<root>/tmp/<uuid>/`` and published with one ``os.rename``. Knows nothing of
rendering, translating or numba compiling (compile.py does those).
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import pickle
import platform
import shutil
import sys
import tempfile
import uuid
import warnings
from importlib import metadata
from pathlib import Path

from .. import envs

META_VERSION = 1
_PACKAGE_DIR = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------------------------------
# Cache root


class CacheRoots:
    """Where entries are written (``write``) and the extra read-only roots searched first (``read_only``)."""

    def __init__(self, write: Path, read_only: tuple[Path, ...] = ()):
        self.write = write
        self.read_only = read_only

    @property
    def search(self) -> tuple[Path, ...]:
        return (*self.read_only, self.write)

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


def _checkout_root() -> Path | None:
    repo = _PACKAGE_DIR.parent
    if (repo / "pyproject.toml").is_file() and (repo / "jit_cache").is_dir():
        return repo / "jit_cache"
    return None


def _candidates() -> list[tuple[str, Path]]:
    out = []
    env_dir = envs.DG_JIT_CACHE_DIR.get()
    if env_dir:
        out.append(("DG_JIT_CACHE_DIR", Path(env_dir).expanduser()))
    else:
        checkout = _checkout_root()
        if checkout is not None:
            out.append(("source checkout", checkout))
    import platformdirs

    out.append(("user cache", Path(platformdirs.user_cache_dir("deep_gemm", appauthor=False)) / "jit"))
    uid = os.getuid() if hasattr(os, "getuid") else 0
    out.append(("temp dir", Path(tempfile.gettempdir()) / f"deep_gemm-jit-{uid}"))
    return out


@functools.lru_cache(maxsize=8)
def _resolve_roots(env_value: str | None) -> CacheRoots:
    read_only: list[Path] = []
    candidates = _candidates()
    for i, (origin, path) in enumerate(candidates):
        if _probe_writable(path):
            return CacheRoots(path, tuple(read_only))
        if i == 0 and (path / "cache").is_dir():
            read_only.append(path)  # still worth reading: entries someone else built
        warn_once(f"root:{path}", f"kernel cache root {path} ({origin}) is not writable; new kernels go to "
                                  f"{candidates[i + 1][1] if i + 1 < len(candidates) else '?'}")
    raise OSError(f"no writable kernel cache directory among {[str(p) for _, p in candidates]}")


def cache_roots() -> CacheRoots:
    """The roots in force: DG_JIT_CACHE_DIR, else jit_cache/ of a writable source checkout, else the user cache
    directory, else a temp directory. An unwritable first choice is kept as a read-only lookup root."""
    return _resolve_roots(envs.DG_JIT_CACHE_DIR.get())


def cache_root() -> Path:
    """The root new entries are written to."""
    return cache_roots().write


# ---------------------------------------------------------------------------------------------------------------
# Key


@functools.lru_cache(maxsize=1)
def tool_versions() -> dict[str, str]:
    """Versions of everything that changes the generated machine code."""
    out = {"python": platform.python_version()}
    for dist in ("numba", "llvmlite", "numpy", "tree-sitter-cpp"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "missing"
    return out


def sources_digest(paths: list[Path]) -> str:
    """sha256 over the *.py files under ``paths`` (directories are walked; relative names and bytes hashed)."""
    h = hashlib.sha256()
    for base in paths:
        files = sorted(base.rglob("*.py")) if base.is_dir() else [base]
        for f in files:
            if "__pycache__" in f.parts:
                continue
            h.update(str(f.relative_to(base.parent) if base.is_dir() else f.name).encode() + b"\0")
            h.update(f.read_bytes() + b"\0")
    return h.hexdigest()


@functools.lru_cache(maxsize=16)
def own_sources_digest(device_module: str) -> str:
    """Digest of deep_gemm/jit/ and deep_gemm/device/ sources, plus the device module's file when it lives
    elsewhere. Computed once per process: a process keeps the sources it imported."""
    paths = [_PACKAGE_DIR / "jit", _PACKAGE_DIR / "device"]
    import importlib.util

    spec = importlib.util.find_spec(device_module)
    if spec is not None and spec.origin and not any(Path(spec.origin).resolve().is_relative_to(p) for p in paths):
        paths.append(Path(spec.origin).resolve())
    return sources_digest([p for p in paths if p.exists()])


def cache_key(name: str, rendered: str, device_module: str, numba_settings: dict) -> tuple[str, dict]:
    """(digest, components): sha256 over the kernel name, the rendered source, our jit/ and device/ sources, the
    device module, numba settings and tool versions. The digest is the first 32 hex characters."""
    components = {
        "name": name,
        "source_sha256": hashlib.sha256(rendered.encode()).hexdigest(),
        "own_sources": own_sources_digest(device_module),
        "device_module": device_module,
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


def new_tmp_dir(root: Path) -> Path:
    path = root / "tmp" / f"{os.getpid()}-{uuid.uuid4().hex}"
    path.mkdir(parents=True)
    return path


def write_file(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def check_entry(path: Path, name: str, digest: str) -> str | None:
    """None when the entry is complete and consistent, else what is wrong with it (for the warning)."""
    meta_path = path / "meta.json"
    if not meta_path.is_file():
        return "meta.json is missing"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"meta.json is unreadable ({e})"
    if not isinstance(meta, dict) or meta.get("digest") != digest or meta.get("name") != name:
        return "meta.json does not describe this entry"
    files = meta.get("files", {})
    for fname in ("kernel.asc", "kernel.py"):
        fpath = path / fname
        if not fpath.is_file():
            return f"{fname} is missing"
        if files.get(fname) != file_sha256(fpath):
            return f"{fname} does not match the hash recorded in meta.json (truncated or edited)"
    return None


def read_meta(path: Path) -> dict:
    return json.loads((path / "meta.json").read_text(encoding="utf-8"))


def numba_cache_problem(path: Path) -> str | None:
    """None when numba's index files in the entry's __pycache__ are readable, else the problem.

    NOTES: numba unpickles its index without guarding against garbage, so a damaged .nbi file would surface as
    an UnpicklingError at the first call; checking the (small) index files here turns that into a rebuild. The
    index layout is numba's private format: with another numba release nothing is checked here (compile.py still
    repairs a damaged index when numba raises on it).
    """
    import numba

    from .numba_setup import numba_internals_known

    pycache = path / "__pycache__"
    if not pycache.is_dir() or not numba_internals_known():
        return None
    for index in sorted(pycache.glob("*.nbi")):
        try:
            with open(index, "rb") as f:
                version = pickle.load(f)
                rest = f.read()
            if version != numba.__version__:
                continue
            stamp, overloads = pickle.loads(rest)
            if not isinstance(overloads, dict):
                return f"{index.name} has an unexpected layout"
            for data_name in overloads.values():
                data = pycache / data_name
                if not data.is_file() or data.stat().st_size == 0:
                    return f"{index.name} refers to a missing or empty {data_name}"
        except Exception as e:  # noqa: BLE001 - any failure to read it means the same thing
            return f"{index.name} is unreadable ({type(e).__name__}: {e})"
    return None


def clear_numba_cache(path: Path) -> None:
    """Remove numba's index and data files of an entry (they are derived data and are rebuilt on next call)."""
    pycache = path / "__pycache__"
    if pycache.is_dir():
        for f in list(pycache.glob("*.nbi")) + list(pycache.glob("*.nbc")):
            f.unlink(missing_ok=True)


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
    """Move a corrupt entry out of cache/ (to tmp/, then delete it). If it is already gone another process did
    it; the caller then rebuilds or uses whatever is published."""
    trash = root / "tmp" / f"{uuid.uuid4().hex}.corrupt"
    trash.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            return
        shutil.rmtree(trash, ignore_errors=True)


def list_entries(root: Path | None = None) -> list[Path]:
    root = root if root is not None else cache_root()
    cache = root / "cache"
    return sorted(p for p in cache.iterdir() if p.is_dir()) if cache.is_dir() else []


def clear(root: Path | None = None, name: str | None = None, dry_run: bool = False) -> list[Path]:
    """Remove cache entries (all, or those of kernel ``name``) and leftover tmp/ builds. Returns what was (or,
    with dry_run, would be) removed. Processes holding a kernel keep running; they rebuild on their next miss."""
    root = root if root is not None else cache_root()
    targets = [p for p in list_entries(root) if name is None or p.name.rsplit(".", 1)[0] == name]
    tmp = root / "tmp"
    if name is None and tmp.is_dir():
        targets += sorted(p for p in tmp.iterdir() if not p.name.startswith(".probe-"))
    if not dry_run:
        for p in targets:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
    return targets


def python_command() -> str:
    return sys.executable or "python"
