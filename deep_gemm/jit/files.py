"""Reading the kernel cache's files: regular files only, of bounded size, without ever blocking (a FIFO) or streaming
(a character device); JSON records for which any failure to parse (RecursionError included) is damage.

Every cache reader (cache.py, keyindex.py, native.py, numba_cache.py) reads through here and decides what damage
means for its own file; this module knows nothing of entries, kernels or numba.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

# Bounds on what a cache file may hold. NOTES: the largest GEMM entry holds a ~5 KB meta.json, ~100 KB of sources and
# a ~150 KB native library; the bounds leave orders of magnitude of headroom and only keep a damaged (or planted)
# file from filling memory.
MAX_JSON_BYTES = 4 << 20  # meta.json, native.json, numba.json, key index and host records
MAX_SOURCE_BYTES = 32 << 20  # kernel.asc, kernel.py
MAX_BINARY_BYTES = 512 << 20  # native-*.so, numba's .nbi/.nbc
MAX_JSON_DEPTH = 32  # our records nest 4 deep; a deeper one is damage (and would overflow json.dumps' recursion)

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


class DamagedFile(Exception):
    """A cache file that cannot be what deep_gemm wrote: not a regular file, larger than its bound, or a JSON record
    that does not parse. The text is the problem, without the file's name (the reader adds it)."""


def file_kind(mode: int) -> str:
    """What a stat mode describes, for messages ("a directory", "a FIFO", ...)."""
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return kind
    return f"file type {stat.S_IFMT(mode):#o}"


def read_regular_file(path: Path, max_bytes: int) -> bytes:
    """The bytes of ``path`` when it is a regular file of at most ``max_bytes``. Raises FileNotFoundError (absent,
    or a dangling symlink), DamagedFile (another file type, or too large) or OSError (permissions, I/O).

    NOTES: a symlink to a regular file is read (a read-only root may be a symlink tree: runfiles, ``cp -rs``); a
    symlink to anything else is damage like the thing itself. The type is checked before the open (opening a
    device can have effects) and again on the descriptor (the path may have been swapped in between); O_NONBLOCK
    keeps an open of a FIFO from waiting for a writer, and at most max_bytes + 1 bytes are ever read."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise DamagedFile(f"not a regular file: {file_kind(st.st_mode)}")
    if st.st_size > max_bytes:
        raise DamagedFile(f"{st.st_size} bytes, more than the {max_bytes} a cache file of its kind may hold")
    fd = os.open(path, _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DamagedFile(f"not a regular file: {file_kind(st.st_mode)}")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, min(max_bytes + 1 - size, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > max_bytes:
        raise DamagedFile(f"more than the {max_bytes} bytes a cache file of its kind may hold")
    return b"".join(chunks)


def parse_json_record(raw: bytes) -> dict:
    """A JSON object from ``raw``. Raises DamagedFile for any failure to parse (invalid UTF-8 or JSON, nesting
    beyond the interpreter's recursion limit or MAX_JSON_DEPTH, MemoryError) or a value that is not an object."""
    try:
        value = json.loads(raw.decode("utf-8"))
    except Exception as e:  # noqa: BLE001 - RecursionError, MemoryError and the rest: the file is damaged
        raise DamagedFile(f"{type(e).__name__}: {_short(e)}") from None
    if not isinstance(value, dict):
        raise DamagedFile(f"a JSON {type(value).__name__}, not an object")
    if _depth(value) > MAX_JSON_DEPTH:
        raise DamagedFile(f"nested more than {MAX_JSON_DEPTH} levels deep")
    return value


def load_json_record(path: Path, max_bytes: int = MAX_JSON_BYTES) -> dict:
    """read_regular_file + parse_json_record: a JSON object, or FileNotFoundError, DamagedFile or OSError."""
    return parse_json_record(read_regular_file(path, max_bytes))


def _depth(value) -> int:
    """Nesting depth of lists and dicts in a parsed JSON value (iterative: no recursion limit to hit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _short(e: BaseException, limit: int = 160) -> str:
    text = str(e)
    return text if len(text) <= limit else text[:limit] + "..."
