"""From a kernel's build arguments (name, template, constants, ...) to its cache key without rendering the template:
one small record per build in ``<root>/index/``, trusted only while everything the key covers still matches.

The key (cache.cache_key) hashes the rendered source; rendering needs jinja2 and costs tens of milliseconds, a
large share of a warm start-up that runs a cached native kernel. A record keeps the key's components and is
checked against what they depend on besides the rendered text: every template file of the template directory
(with jinja2's version and jit/render.py, through the codegen sources, the same constants then render the same
text), the device modules the kernel used and the device package's own file, the codegen settings and tool
versions. Anything that differs, or a record that does not verify, is a miss: the kernel is rendered as before
(a damaged record is also reported once and moved aside).
Knows nothing of GEMM.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from . import cache, files
from .sources import _digest_files, codegen_sources_digest, module_file

INDEX_DIR = "index"
FORMAT = 1


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _checksum(record: dict) -> str:
    return _sha(json.dumps({k: v for k, v in record.items() if k != "checksum"}, sort_keys=True).encode())


@functools.lru_cache(maxsize=16)
def templates_digest(directory: Path) -> str:
    """sha256 over every *.j2 file under ``directory`` (names relative to it, contents)."""
    return _digest_files([(str(p.relative_to(directory)), p) for p in sorted(directory.rglob("*.j2"))])


def _file_digest(module: str) -> str:
    path = module_file(module)
    return _sha(path.read_bytes()) if path is not None else "missing"


def record_path(root: Path, name: str, build_args: str) -> Path:
    return root / INDEX_DIR / f"{name}.{_sha(build_args.encode())[:32]}.json"


def _context(template_directory: Path, device_module: str) -> dict:
    return {"templates": templates_digest(template_directory), "device_module_file": _file_digest(device_module),
            "jinja2": cache.dist_version("jinja2"), "format": FORMAT}


def lookup(root: Path, name: str, build_args: str, template_directory: Path, device_module: str,
           settings: dict) -> tuple[str, dict] | None:
    """(digest, components) recorded for ``build_args`` (a canonical text of the build's arguments) when the record
    verifies and still describes this installation, else None. A damaged record (not a regular file, too large,
    not parseable, not matching its own checksum) is reported once and moved aside; store() writes it again."""
    path = record_path(root, name, build_args)
    try:
        record = files.load_json_record(path)
    except FileNotFoundError:
        return None
    except files.DamagedFile as e:
        _damaged(root, path, str(e))
        return None
    except OSError:  # unreadable here (permissions): a miss, the kernel is rendered
        return None
    try:
        if record.get("checksum") != _checksum(record):
            _damaged(root, path, "it does not match its own checksum")
            return None
        if record["build_args"] != build_args:
            return None
        components, digest = record["components"], record["digest"]
        if _sha(json.dumps(components, sort_keys=True).encode())[:32] != digest:
            return None
        if record["context"] != _context(template_directory, device_module):
            return None
        current = {"codegen_sources": codegen_sources_digest(), "meta_version": cache.META_VERSION,
                   "numba_settings": {k: str(v) for k, v in sorted(settings.items())}, **cache.tool_versions()}
        if any(components.get(k) != v for k, v in current.items()):
            return None
        modules = components["device_modules"]
        if _digest_files([(m, module_file(m)) for m in modules if module_file(m) is not None]) != \
                components["device_sources"]:
            return None
    except Exception:  # noqa: BLE001 - a verified record of another shape (another deep_gemm): a miss, rewritten
        return None
    return digest, components


def _damaged(root: Path, path: Path, problem: str) -> None:
    writable = root == cache.cache_roots().write
    cache.report_damaged_file(path, "key index record", problem, root=root if writable else None,
                              repaired="it is written again once the kernel's template is rendered",
                              unrepaired="the kernel is found by rendering its template")


def store(root: Path, name: str, build_args: str, template_directory: Path, device_module: str, digest: str,
          components: dict) -> None:
    """Record ``digest`` for ``build_args`` (atomic replace; a failed write is ignored: the index only saves time)."""
    from .numba_cache import write_atomic

    record = {"build_args": build_args, "digest": digest, "components": components,
              "context": _context(template_directory, device_module)}
    record["checksum"] = _checksum(record)
    path = record_path(root, name, build_args)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(record, sort_keys=True).encode())
    except OSError:
        pass
