"""Pipe sync stand-ins (deep_gemm.device.sync): callable from numba code with the translator's enum constants, and
without effect on the data flow (one core's pipes run in program order on the CPU)."""

from __future__ import annotations

import numpy as np
from numba import njit

from deep_gemm.device import sync
from deep_gemm.jit import enums

EV_MTE2_MTE1 = enums.lookup("HardEvent", "MTE2_MTE1")
EV_MTE1_MTE2 = enums.lookup("HardEvent", "MTE1_MTE2")
PIPE_ALL = enums.lookup(None, "PIPE_ALL")


@njit(cache=True)
def _ring(x, out):
    # A two-slot producer/consumer ring written the way the templates write it.
    for s in range(2):
        sync.SetFlag(EV_MTE1_MTE2, s)
    for i in range(x.size):
        s = i % 2
        sync.WaitFlag(EV_MTE1_MTE2, s)
        v = x[i] * 2.0
        sync.SetFlag(EV_MTE2_MTE1, s)
        sync.WaitFlag(EV_MTE2_MTE1, s)
        out[i] = v + 1.0
        sync.SetFlag(EV_MTE1_MTE2, s)
    sync.PipeBarrier(PIPE_ALL)
    for s in range(2):
        sync.WaitFlag(EV_MTE1_MTE2, s)


def test_flags_are_pure_ordering():
    x = np.arange(10, dtype=np.float64)
    out = np.zeros_like(x)
    _ring(x, out)
    np.testing.assert_array_equal(out, x * 2 + 1)
    assert sync.SetFlag.__doc__ and "SetFlag" in sync.SetFlag.__doc__
    assert 0 < sync.NUM_EVENT_IDS <= 16
