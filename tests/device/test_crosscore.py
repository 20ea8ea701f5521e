"""The cross-core state of a mixed kernel's logical core (device/crosscore.py): UBTensor views record the UB bytes
they address, and reset_cross_state gives the next core of a launch part a state equal to a new one (flags, lines,
info and both UBs zero) by zeroing only what the previous core's views addressed."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from deep_gemm.device.crosscore import (
    INFO_SIZE,
    INFO_UB_RANGE,
    cross_core_set,
    new_cross_state,
    reset_cross_state,
    ub_tensor,
)

UB = 4096


@njit(cache=True)
def _fill(ub, info, aiv, offset, rows, cols, value):
    view = ub_tensor(ub, info, aiv, offset, rows, cols, np.float32)
    view[:, :] = value


def _as_new(state):
    flags, lines, info, ub = state
    fresh = new_cross_state(ub.shape[1])
    for got, want in zip(state, fresh, strict=True):
        np.testing.assert_array_equal(got, want)


def test_new_state_has_empty_ub_ranges():
    _, _, info, ub = new_cross_state(UB)
    assert info.shape == (INFO_SIZE,) and ub.shape == (2, UB) and not ub.any()
    for aiv in range(2):
        lo, hi = info[INFO_UB_RANGE + 2 * aiv: INFO_UB_RANGE + 2 * aiv + 2]
        assert lo >= hi  # nothing addressed yet


def test_views_widen_the_range_and_reset_zeroes_it():
    state = new_cross_state(UB)
    flags, lines, info, ub = state
    _fill(ub, info, 0, 64, 2, 8, 7.0)  # AIV0 bytes [64, 128)
    _fill(ub, info, 0, 1024, 1, 16, 3.0)  # AIV0 bytes [1024, 1088): the range becomes [64, 1088)
    _fill(ub, info, 1, 2048, 4, 8, -1.0)  # AIV1 bytes [2048, 2176)
    _fill(ub, info, 1, 512, 0, 8, 5.0)  # an empty view addresses nothing
    assert list(info[INFO_UB_RANGE:INFO_UB_RANGE + 4]) == [64, 1088, 2048, 2176]
    assert ub[0].view(np.float32)[16:32].tolist() == [7.0] * 16 and ub[1].view(np.float32)[512:544].min() == -1.0
    cross_core_set(flags, lines, info, 0, 2, 3, 42)
    assert flags.any() and lines.any() and info[0] == 1
    reset_cross_state(*state)
    _as_new(state)
    # the reset state records afresh
    _fill(ub, info, 1, 32, 1, 8, 1.0)
    assert list(info[INFO_UB_RANGE:INFO_UB_RANGE + 4]) == [UB, 0, 32, 64]
    reset_cross_state(*state)
    _as_new(state)


def test_reset_of_an_untouched_state_changes_nothing():
    state = new_cross_state(UB)
    reset_cross_state(*state)
    _as_new(state)


def test_views_outside_the_ub_raise_and_record_nothing():
    _, _, info, ub = new_cross_state(UB)
    with pytest.raises(ValueError, match="exceeds the Unified Buffer"):
        _fill(ub, info, 0, UB - 32, 1, 16, 1.0)
    with pytest.raises(ValueError, match="multiple of 32"):
        _fill(ub, info, 1, 16, 1, 4, 1.0)
    assert list(info[INFO_UB_RANGE:INFO_UB_RANGE + 4]) == [UB, 0, UB, 0] and not ub.any()
