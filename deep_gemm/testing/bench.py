"""Wall-clock timing on the CPU: median of repeated calls, and paired A/B timing that interleaves the two calls.

CPU numbers only (the modelled chip time comes from ``deep_gemm.estimate``); medians resist noisy neighbours.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import NamedTuple


class PairedTiming(NamedTuple):
    median_a: float  # seconds per call of fn_a
    median_b: float  # seconds per call of fn_b
    median_ratio: float  # median over pairs of t_a / t_b


def _check_count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {name}={value!r}")
    return value


# NOTES: one module-level clock, so tests can swap in a fake one without touching the time module.
_clock = time.perf_counter


def _time_call(fn: Callable[[], object]) -> float:
    start = _clock()
    fn()
    return _clock() - start


def bench(fn: Callable[[], object], num_warmups: int = 2, num_tests: int = 7) -> float:
    """Median wall-clock seconds of ``fn()`` over ``num_tests`` calls, after ``num_warmups`` untimed calls."""
    _check_count("num_warmups", num_warmups, 0)
    _check_count("num_tests", num_tests, 1)
    for _ in range(num_warmups):
        fn()
    return statistics.median(_time_call(fn) for _ in range(num_tests))


def bench_paired(
    fn_a: Callable[[], object],
    fn_b: Callable[[], object],
    num_pairs: int = 7,
    num_warmups: int = 1,
    settle: float = 0.0,
) -> PairedTiming:
    """Time ``fn_a`` and ``fn_b`` in alternation (A,B then B,A, ...) and return both medians and the median ratio.

    Pairing cancels slow drifts (other processes, clock changes) that two separate runs would fold into the ratio.
    ``settle`` seconds of sleep before every timed call keep one call's lingering threads (OpenBLAS spins its
    workers for a while after a matmul) out of the next call's timing.
    """
    _check_count("num_pairs", num_pairs, 1)
    _check_count("num_warmups", num_warmups, 0)
    if not settle >= 0:
        raise ValueError(f"settle must be >= 0 seconds, got {settle!r}")

    def timed(fn: Callable[[], object]) -> float:
        if settle:
            time.sleep(settle)
        return _time_call(fn)

    for _ in range(num_warmups):
        fn_a()
        fn_b()
    times_a, times_b, ratios = [], [], []
    for i in range(num_pairs):
        if i % 2 == 0:
            ta = timed(fn_a)
            tb = timed(fn_b)
        else:
            tb = timed(fn_b)
            ta = timed(fn_a)
        times_a.append(ta)
        times_b.append(tb)
        ratios.append(ta / tb if tb > 0 else float("inf"))
    return PairedTiming(statistics.median(times_a), statistics.median(times_b), statistics.median(ratios))
