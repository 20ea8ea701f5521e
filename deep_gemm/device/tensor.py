"""Views into per-core LocalTensor buffers: one ring slot of an L1 / L0C buffer, or a sub-tile of a scale buffer.

Ascend C addresses a LocalTensor by element offset (``l1a[stage * BLOCK_M * BLOCK_K]``); the stand-in's buffers are
2-D ("rows x K"), so a slot is a row range. Views share memory with the buffer and allocate nothing.
"""

from __future__ import annotations

from numba import njit

from ..jit.numba_setup import apply_numba_settings

# NOTES: must run before the first @njit below can compile (numba reads it when building its CPU target).
apply_numba_settings()


@njit(cache=True)
def slot_view(buf, slot, num_rows):
    """Rows [slot * num_rows, (slot + 1) * num_rows) of ``buf``: one stage of a ring buffer (C-contiguous view)."""
    return buf[slot * num_rows:(slot + 1) * num_rows]


@njit(cache=True)
def tile_view(buf, row0, num_rows, col0, num_cols):
    """buf[row0:row0 + num_rows, col0:col0 + num_cols] of a 2-D buffer (a strided view)."""
    return buf[row0:row0 + num_rows, col0:col0 + num_cols]
