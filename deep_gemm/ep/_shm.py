"""POSIX shared-memory segments for simulated ranks: create, attach, unlink, and clean up by run prefix.

A segment is a file under /dev/shm mapped with mmap (the same object ``shm_open`` gives). Every segment of one run
is named ``dg_<run id>_<what>``, so a supervisor can remove whatever a killed rank left behind, and a leftover is
easy to find. No resource tracker is involved: the creator unlinks as soon as every rank has mapped it.
"""

from __future__ import annotations

import mmap
import os
import secrets

SHM_DIR = "/dev/shm"
SEGMENT_PREFIX = "dg_"


def new_run_prefix() -> str:
    """A fresh per-run prefix: ``dg_<pid>x<random hex>_`` (unique across concurrent runs on one host)."""
    return f"{SEGMENT_PREFIX}{os.getpid()}x{secrets.token_hex(4)}_"


def _path(name: str) -> str:
    if "/" in name or not name.startswith(SEGMENT_PREFIX):
        raise ValueError(f"shared-memory segment name must start with {SEGMENT_PREFIX!r} and hold no '/': {name=}")
    return os.path.join(SHM_DIR, name)


def create(name: str, nbytes: int) -> mmap.mmap:
    """Create a zero-filled segment of ``nbytes`` bytes (fails if the name exists) and map it read-write."""
    if nbytes <= 0:
        raise ValueError(f"segment size must be positive: {nbytes=}")
    fd = os.open(_path(name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, nbytes)
        return mmap.mmap(fd, nbytes)
    except BaseException:
        os.close(fd)
        fd = -1
        unlink(name)
        raise
    finally:
        if fd >= 0:
            os.close(fd)


def attach(name: str, nbytes: int) -> mmap.mmap:
    """Map an existing segment read-write; its size must be at least ``nbytes``."""
    fd = os.open(_path(name), os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size < nbytes:
            raise RuntimeError(f"shared-memory segment {name!r} holds {size} bytes, {nbytes} expected")
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


def anonymous(nbytes: int) -> mmap.mmap:
    """A private zero-filled mapping (a world of one rank needs no named segment)."""
    return mmap.mmap(-1, max(nbytes, 1))


def unlink(name: str) -> bool:
    """Remove a segment's name (mappings stay valid); False if it was already gone."""
    try:
        os.unlink(_path(name))
        return True
    except FileNotFoundError:
        return False


def leftovers(prefix: str) -> list[str]:
    """The segment names under /dev/shm that start with ``prefix``."""
    if not prefix.startswith(SEGMENT_PREFIX):
        raise ValueError(f"run prefix must start with {SEGMENT_PREFIX!r}: {prefix=}")
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix))
    except FileNotFoundError:
        return []


def unlink_all(prefix: str) -> list[str]:
    """Unlink every segment of a run; returns the names removed."""
    return [n for n in leftovers(prefix) if unlink(n)]
