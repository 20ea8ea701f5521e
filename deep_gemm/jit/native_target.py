"""The target a native library of the kernel cache was built for (jit/native.py): the host CPU as LLVM sees it
(asked once per machine, kept under the cache root by a fingerprint of /proc/cpuinfo), the versions, and the
record's checksum. A library whose target differs from current_target() is rebuilt, never run.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import platform
from pathlib import Path

from . import files
from .native_runtime import _RUNTIME_C

FORMAT = 1  # of native.json

# ---------------------------------------------------------------------------------------------------------------
# Target: what the native code was built for


@functools.lru_cache(maxsize=1)
def host_cpu() -> tuple[str, str]:
    """(CPU name, CPU feature string) as LLVM sees this host. Asked of LLVM (llvmlite, ~40 ms to load) once per
    machine: the answer is kept under the cache root, filed by a fingerprint of what the kernel reports about the
    CPU (/proc/cpuinfo's vendor, family, model, stepping, flags) and llvmlite's version."""
    fingerprint = _cpu_fingerprint()
    path = root = None
    if fingerprint is not None:
        from .cache import cache_roots

        root = cache_roots().write
        path = None if root is None else root / "index" / f"host-{fingerprint[:32]}.json"
    if path is not None:
        found = _read_host_record(root, path, fingerprint)
        if found is not None:
            return found
    import llvmlite.binding as llvm

    name, features = llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
    if path is not None:
        record = {"fingerprint": fingerprint, "cpu_name": name, "cpu_features": features}
        record["checksum"] = _checksum(record)
        with contextlib.suppress(OSError):
            from .numba_cache import write_atomic

            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, json.dumps(record, sort_keys=True).encode())
    return name, features


def _read_host_record(root: Path, path: Path, fingerprint: str) -> tuple[str, str] | None:
    """(CPU name, features) from the host record at ``path``; None when there is none or it cannot be read here.
    A damaged one (not a regular file, too large, not parseable, not verifying) is reported once and moved aside.

    NOTES: every kernel of every process reads this one record: no failure reading it may escape (issue 22: a deeply
    nested JSON file there once raised RecursionError from every GEMM)."""
    try:
        record = files.load_json_record(path)
    except FileNotFoundError:
        return None
    except files.DamagedFile as e:
        problem = str(e)
    except OSError:  # unreadable here (permissions): LLVM is asked
        return None
    else:
        try:
            if record.get("checksum") == _checksum(record) and record.get("fingerprint") == fingerprint:
                name, features = record["cpu_name"], record["cpu_features"]
                if isinstance(name, str) and isinstance(features, str):
                    return name, features
        except Exception:  # noqa: BLE001 - a record of another shape: damage like any other
            pass
        problem = "it does not verify"
    from .cache import report_damaged_file

    report_damaged_file(path, "host record", problem, root=root,
                        repaired="it is written again from LLVM's answer",
                        unrepaired="LLVM is asked about this CPU in every process (~40 ms)")
    return None


_CPUINFO_KEYS = ("vendor_id", "cpu family", "model", "model name", "stepping", "flags", "CPU implementer",
                 "CPU architecture", "CPU variant", "CPU part", "Features")


def _cpu_fingerprint() -> str | None:
    """sha256 of the first CPU's identifying /proc/cpuinfo lines, llvmlite's version and the machine; None when
    /proc/cpuinfo cannot be read (LLVM is then asked every time)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None
    first = text.split("\n\n", 1)[0]
    lines = sorted(line.strip() for line in first.splitlines() if line.split(":", 1)[0].strip() in _CPUINFO_KEYS)
    if not lines:
        return None
    from .cache import tool_versions

    return hashlib.sha256("\n".join([platform.machine(), tool_versions()["llvmlite"], *lines]).encode()).hexdigest()


def current_target() -> dict[str, str]:
    """The target record a native library of this process must match: machine, CPU name and features (LLVM's
    view), Python, numba, llvmlite, numpy and deep_gemm versions, and the runtime C source linked into it."""
    from .. import __version__
    from .cache import tool_versions

    versions = tool_versions()
    name, features = host_cpu()
    return {"machine": platform.machine(), "cpu_name": name, "cpu_features": features,
            "python": versions["python"], "numba": versions["numba"], "llvmlite": versions["llvmlite"],
            "numpy": versions["numpy"], "deep_gemm": __version__, "format": str(FORMAT),
            "runtime": hashlib.sha256(_RUNTIME_C.encode()).hexdigest()[:16]}


def _checksum(record: dict) -> str:
    body = {k: v for k, v in record.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
