"""Pipe synchronisation of one AI core: SetFlag / WaitFlag (event between two pipes) and PipeBarrier.

On the chip the MTE2, MTE1, Cube (M) and FixPipe pipes run concurrently and these flags order them. The stand-in
runs one core's pipes in program order, so every flag is already satisfied: the functions are no-ops (numba
removes the calls). They stay in the templates so the kernels read like Ascend C and the pipeline is visible.
Event and pipe values come from ``deep_gemm.jit.enums`` (``HardEvent::MTE2_MTE1`` -> ``HardEvent_MTE2_MTE1``).
"""

from __future__ import annotations

from numba import njit

from ..jit.numba_setup import apply_numba_settings

# NOTES: must run before the first @njit below can compile (numba reads it when building its CPU target).
apply_numba_settings()

# Event ids per pipe pair on A2/A3/950 (ascend_hardware.md A6): templates keep their rings within this.
NUM_EVENT_IDS = 8


@njit(cache=True)
def SetFlag(event, event_id):  # noqa: N802
    """SetFlag<HardEvent::SRC_DST>(event_id): the source pipe signals that its work up to here is done.

    No-op on the CPU (one core's pipes run in program order).
    """
    return None


@njit(cache=True)
def WaitFlag(event, event_id):  # noqa: N802
    """WaitFlag<HardEvent::SRC_DST>(event_id): the destination pipe waits for the matching SetFlag.

    No-op on the CPU (the matching SetFlag has always run before).
    """
    return None


@njit(cache=True)
def PipeBarrier(pipe):  # noqa: N802
    """PipeBarrier<PIPE_X>(): wait until every instruction issued to pipe X has finished. No-op on the CPU."""
    return None
