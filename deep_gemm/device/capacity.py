"""The host-side capacity check, as the device package has always exported it (the code lives in
heuristics/capacity.py, which imports no numba, so a launch of a cached kernel checks its config without importing
the device package)."""

from __future__ import annotations

from ..heuristics.capacity import (  # noqa: F401
    BufferCapacityError,
    arch_capacity,
    check_buffer_capacity,
    keeps_a_resident,
    num_mad_tiles,
)

__all__ = ["BufferCapacityError", "arch_capacity", "check_buffer_capacity", "keeps_a_resident", "num_mad_tiles"]
