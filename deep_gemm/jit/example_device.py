"""Tiny device intrinsics for the JIT's own example templates, tests and bench (templates/examples/*).

Not the real stand-ins (those are deep_gemm.device): just enough to exercise calls from generated kernels,
template arguments (SetFlag<HardEvent::X>) and numba's handling of cached callees.
"""

from __future__ import annotations

from numba import njit

from .numba_setup import apply_numba_settings

apply_numba_settings()

__all__ = ["SetFlag", "WaitFlag", "PipeBarrier", "add_span", "fill"]


@njit(cache=True)
def SetFlag(event, event_id):  # noqa: N802 - Ascend C spelling
    """Signal pipe event `event` (enums.HardEvent) with id `event_id`: a no-op on the CPU."""
    return None


@njit(cache=True)
def WaitFlag(event, event_id):  # noqa: N802
    """Wait for pipe event `event` with id `event_id`: a no-op on the CPU (one core runs its pipes in order)."""
    return None


@njit(cache=True)
def PipeBarrier(pipe):  # noqa: N802
    """Barrier on pipe `pipe` (enums.BARE PIPE_*): a no-op on the CPU."""
    return None


@njit(cache=True)
def add_span(dst, a, b, start, count):
    """dst[start:start+count] = a[...] + b[...] (1-D arrays of one dtype); returns the number of elements written."""
    for i in range(start, start + count):
        dst[i] = a[i] + b[i]
    return count


@njit(cache=True)
def fill(dst, value):
    """dst[:] = value (1-D)."""
    for i in range(dst.shape[0]):
        dst[i] = value
