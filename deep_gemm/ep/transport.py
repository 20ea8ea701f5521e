"""How the EP buffer moves rows between ranks: remote stores into the peers' symmetric buffer (ranks on one host), or
the group's all-to-all (ranks on several hosts, a torch gloo group). Byte rows only: dtypes are the caller's.

One exchange: every rank sends to every rank ``d`` a set of fields, each ``n_d`` byte rows (``rows[index]`` of a
source array, gathered straight into the destination); rank ``d`` then reads, per source rank, its ``n`` rows of each
field. In the symmetric buffer a region holds ``counts [R] int64`` (slot s written by source s only) and per field
``[R, capacity, row_bytes]`` (block s written by source s only), so no two ranks ever store to the same byte and
no atomics are needed. Two barriers per exchange: on entry (every rank has finished reading the region's previous
contents) and after the stores (every rank's stores are visible).
"""

from __future__ import annotations

import numpy as np

from .symm import SymmetricBuffer

_ALIGN = 64
NUM_REGIONS = 2  # dispatch, combine: a combine's stores never land on rows a late dispatch reader still reads


def _up(x: int) -> int:
    return -(-x // _ALIGN) * _ALIGN


def region_bytes(num_ranks: int, capacity: int, row_bytes: list[int]) -> int:
    return _up(8 * num_ranks) + sum(_up(num_ranks * capacity * b) for b in row_bytes)


class Transport:
    """Owns the EP buffer's symmetric memory (grown collectively when a call needs more) or, off one host, nothing."""

    def __init__(self, group, num_bytes: int = 0):
        self.group = group
        self.rank, self.num_ranks = group.rank, group.num_ranks
        self.symm: SymmetricBuffer | None = None
        self.uses_shared_memory = bool(group.same_host)
        if num_bytes and self.uses_shared_memory:
            self.symm = SymmetricBuffer(group, num_bytes)

    @property
    def num_bytes(self) -> int:
        return 0 if self.symm is None else self.symm.nbytes

    def reserve(self, region_need: int) -> None:
        """Make each region hold ``region_need`` bytes (collective: every rank computes the same need)."""
        if not self.uses_shared_memory:
            return
        if self.symm is not None and self.symm.nbytes // NUM_REGIONS >= region_need:
            return
        if self.symm is not None:
            self.group.barrier()  # nobody still reads the old buffer
            self.symm.close()
        size = NUM_REGIONS * _up(region_need)
        self.symm = SymmetricBuffer(self.group, -(-size // (1 << 20)) * (1 << 20))

    def exchange(self, region: int, capacity: int, row_bytes: list[int], sends: list) -> list:
        """``sends[d]``: per field ``(source byte rows [*, row_bytes], index [n_d] or None)``; returns, per source
        rank, the list of its fields' received byte rows ``[n, row_bytes]`` (views of this rank's buffer on one
        host: read them before the next exchange in the same region)."""
        if self.uses_shared_memory:
            return self._exchange_shared(region, capacity, row_bytes, sends)
        return self._exchange_group(row_bytes, sends)

    def _layout(self, region: int, capacity: int, row_bytes: list[int]):
        base = region * (self.symm.nbytes // NUM_REGIONS)
        counts = (base, 8 * self.num_ranks)
        offsets, off = [], base + _up(8 * self.num_ranks)
        for b in row_bytes:
            offsets.append(off)
            off += _up(self.num_ranks * capacity * b)
        return counts, offsets

    def _field(self, dst: int, offset: int, capacity: int, b: int) -> np.ndarray:
        return self.symm.all[dst, offset: offset + self.num_ranks * capacity * b].reshape(self.num_ranks, capacity, b)

    def _exchange_shared(self, region, capacity, row_bytes, sends):
        self.reserve(region_bytes(self.num_ranks, capacity, row_bytes))
        (count_off, count_len), offsets = self._layout(region, capacity, row_bytes)
        me = self.rank
        sizes = [(f[0][0].shape[0] if f[0][1] is None else f[0][1].shape[0]) if f else 0 for f in sends]
        if max(sizes, default=0) > capacity:
            raise ValueError(f"rank {me} sends {sizes} rows to the ranks, above the buffer's {capacity=}")
        self.group.barrier()

        # Remote stores: this rank's block of every destination's region
        for dst, fields in enumerate(sends):
            n = 0
            for (rows, index), off, b in zip(fields, offsets, row_bytes, strict=True):
                block = self._field(dst, off, capacity, b)[me]
                if index is None:
                    n = rows.shape[0]
                    block[:n] = rows
                else:
                    n = index.shape[0]
                    np.take(rows, index, axis=0, out=block[:n])
            self.symm.all[dst, count_off: count_off + count_len].view(np.int64)[me] = n
        self.group.barrier()

        # Loads from this rank's own region
        counts = self.symm.local[count_off: count_off + count_len].view(np.int64)
        fields = [self._field(me, off, capacity, b) for off, b in zip(offsets, row_bytes, strict=True)]
        return [[f[src, : int(counts[src])] for f in fields] for src in range(self.num_ranks)]

    def _exchange_group(self, row_bytes, sends):
        blocks = []
        for fields in sends:
            parts, n = [], 0
            for rows, index in fields:
                data = rows if index is None else rows[index]
                n = data.shape[0]
                parts.append(np.ascontiguousarray(data).reshape(-1))
            blocks.append(np.concatenate([np.array([n], np.int64).view(np.uint8)] + parts))
        out = []
        for data in self.group.all_to_all_bytes(blocks):
            n = int(data[:8].view(np.int64)[0])
            fields, off = [], 8
            for b in row_bytes:
                fields.append(data[off: off + n * b].reshape(n, b))
                off += n * b
            out.append(fields)
        return out

    def close(self) -> None:
        if self.symm is not None:
            self.symm.close()
            self.symm = None
