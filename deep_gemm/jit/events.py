"""The JIT's events: counts of what happened in this process (memory/disk hits, builds, damaged files, numba
compiles) and the listeners told of each, plus the DG_JIT_DEBUG log. A leaf of the JIT: every module may report here
without importing the build pipeline (compile.py adds the numba compile listener on top).
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Callable

from .. import envs

_counts: Counter = Counter()
_listeners: list[Callable[[str, dict], None]] = []
_lock = threading.RLock()


def stats() -> dict[str, int]:
    """Counts of JIT events in this process: memory_hit, disk_hit, build (rendered + translated + published),
    build_in_memory (the cache could not be written), publish_lost (another process published the key first),
    corrupt (an entry or numba cache file that did not verify, rebuilt), cache_write_failed, numba_compile (an
    entry function compiled by numba), numba_cache_load (loaded from numba's cache), numba_compile_helper."""
    return dict(_counts)


def listen(callback: Callable[[str, dict], None]) -> Callable[[], None]:
    """Call ``callback(event, info)`` on every event; returns a function that removes it."""
    _listeners.append(callback)
    return lambda: _listeners.remove(callback) if callback in _listeners else None


def emit(kind: str, **info) -> None:
    """Count one event of ``kind`` and tell every listener."""
    _counts[kind] += 1
    for callback in list(_listeners):
        callback(kind, info)


def debug(level: int, message: str) -> None:
    """Print ``message`` on stderr when DG_JIT_DEBUG is at least ``level``."""
    if envs.DG_JIT_DEBUG.get() >= level:
        print(f"[deep_gemm.jit] {message}", file=sys.stderr, flush=True)
