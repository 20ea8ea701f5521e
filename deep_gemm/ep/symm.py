"""Symmetric buffers: one allocation of the same size on every rank, every rank mapping all of them.

``SymmetricBuffer(group, nbytes)`` is collective (every rank calls it, in the same order as its other symmetric
allocations, as HCCL registrations must be). Rank 0 creates one POSIX shared-memory segment of
``num_ranks * nbytes`` bytes; every rank maps it; rank 0 unlinks its name once all have mapped it, so nothing is left
in /dev/shm whatever happens to the ranks later (the spawn supervisor also removes the run's prefix at the end).

- ``.all``: uint8 ``[num_ranks, nbytes]`` view; row r is rank r's buffer, and a store into row r is the UBMEM (or
  NVLink) remote store into rank r;
- ``.local``: this rank's row (``.all[rank]``); ``.rank``, ``.num_ranks``, ``.nbytes``, ``.group``;
- ``.barrier()``: the group's barrier (orders every rank's stores before every rank's later loads);
- ``.close()``: drop this rank's mapping (views handed out keep it alive until they go).

``nbytes`` is rounded up to a multiple of 64 so every row starts on a cache line. Zero-filled on creation. A world of
one rank uses a private mapping. Ranks on several hosts cannot share memory: the constructor raises there, and the EP
buffer moves its data through the group's all-to-all instead.
"""

from __future__ import annotations

import numpy as np

from . import _shm
from .group import as_group

ROW_ALIGNMENT = 64


class SymmetricBuffer:
    def __init__(self, group=None, nbytes: int = 0):
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes <= 0:
            raise ValueError(f"SymmetricBuffer needs a positive integer byte count: {nbytes=}")
        self.group = as_group(group)
        if not self.group.same_host:
            raise ValueError(f"SymmetricBuffer needs every rank on one host (shared memory): group={self.group!r}")
        self.rank, self.num_ranks = self.group.rank, self.group.num_ranks
        self.nbytes = -(-int(nbytes) // ROW_ALIGNMENT) * ROW_ALIGNMENT
        total = self.num_ranks * self.nbytes
        self.name = None

        # Allocation: a private mapping for one rank, else one named segment rank 0 creates and all ranks map
        if self.num_ranks == 1:
            self._mm = _shm.anonymous(total)
        else:
            name = self.group.new_segment_name("symm")
            error = None
            if self.rank == 0:
                try:
                    self._mm = _shm.create(name, total)
                except OSError as exc:
                    error = f"rank 0 could not create {total} bytes of shared memory ({name}): {exc}"
            error = self.group.broadcast_object(error)
            if error is not None:
                raise RuntimeError(error)
            try:
                if self.rank != 0:
                    self._mm = _shm.attach(name, total)
            finally:
                self.group.barrier()
                if self.rank == 0:
                    _shm.unlink(name)
            self.name = name
        self.all = np.frombuffer(self._mm, np.uint8, total).reshape(self.num_ranks, self.nbytes)
        self.local = self.all[self.rank]

    def __repr__(self) -> str:
        return f"SymmetricBuffer(rank={self.rank}, num_ranks={self.num_ranks}, nbytes={self.nbytes})"

    def __reduce__(self):
        raise TypeError("a SymmetricBuffer is mapped by its rank's process and cannot be pickled")

    def barrier(self, timeout: float | None = None) -> None:
        self.group.barrier(timeout)

    def view(self, dtype, offset: int = 0, count: int = -1, rank: int | None = None) -> np.ndarray:
        """Rank ``rank``'s bytes ``[offset, offset + count * itemsize)`` as ``dtype`` (all ranks: ``rank=None``
        gives ``[num_ranks, count]``). ``offset`` must be aligned to the dtype."""
        dtype = np.dtype(dtype)
        if offset % dtype.itemsize:
            raise ValueError(f"view offset must be aligned to {dtype}: {offset=}")
        if count < 0:
            count = (self.nbytes - offset) // dtype.itemsize
        if offset < 0 or offset + count * dtype.itemsize > self.nbytes:
            raise ValueError(f"view out of the buffer: {offset=} {count=} {dtype=} nbytes={self.nbytes}")
        rows = self.all[:, offset: offset + count * dtype.itemsize].view(dtype)
        return rows if rank is None else rows[rank]

    def close(self) -> None:
        """Drop this rank's mapping; the memory goes once every view of it is gone (not collective)."""
        mm = getattr(self, "_mm", None)
        self.all = self.local = None
        self._mm = None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # views handed out still use it: the mapping goes with the last of them

    destroy = close
