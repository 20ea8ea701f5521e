"""Wall-clock timing on the CPU: the steady-state protocol the benches use to compare libraries
(``bench_steady``), the median of repeated calls (``bench``) and paired A/B timing (``bench_paired``).

CPU numbers only (the modelled chip time comes from ``deep_gemm.estimate``); medians resist noisy neighbours.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
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

# NOTES: a library's worker threads may keep burning CPU after its call returned: numpy's OpenBLAS spins a worker
# for ~0.13 s of CPU after a matmul (measured on the 2-vCPU machine: 0.130 s of process CPU while the caller slept
# 0.2-0.8 s right after the MQA bench's numpy code). A block started then times the next library on one CPU fewer,
# for longer than its one discarded call. bench_steady waits for the process to go idle before every block.
IDLE_PROBE_S = 0.02
IDLE_MAX_PROBES = 50
# NOTES: after the process idled (the idle wait above, or another library's single-threaded or sleeping block), a
# library's calls on two threads run slower for some 10-30 ms: on the 2-vCPU VM, FP8 128x7168x2048 took 11-14 ms
# per call for the first two or three calls and ~7 ms after, and its block figure (1 discarded call, then 2 timed)
# rose from 7.0 ms alone to 9.8-11.9 ms when its blocks alternated with numpy's, or with a peer that only sleeps
# 30 ms a call. Each block therefore discards calls until WARM_BLOCK_S has passed (at least one call): a library
# whose call takes longer than that still loses one call, a fast one as many as the transition lasts.
WARM_BLOCK_S = 0.05


def _wait_idle() -> None:
    """Return once no thread of this process keeps a CPU busy (a sleep of IDLE_PROBE_S sees less than a quarter
    of it in process CPU time), or after IDLE_MAX_PROBES probes."""
    for _ in range(IDLE_MAX_PROBES):
        start = time.process_time()
        time.sleep(IDLE_PROBE_S)
        if time.process_time() - start < 0.25 * IDLE_PROBE_S:
            return


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


# ---------------------------------------------------------------------------------------------------------------
# The steady-state protocol
# ---------------------------------------------------------------------------------------------------------------
STEADY_PROTOCOL = f"""\
Timing protocol (deep_gemm.testing.bench_steady): each library is timed in its own steady state, the way a model
runs layer after layer with one library. A block starts once the process is idle (no thread of the previous
library still spinning: OpenBLAS keeps one busy for ~0.1 s after a matmul) and is back-to-back calls of one
library: its first calls are discarded until {WARM_BLOCK_S * 1000:g} ms have passed, at least one (they pay for
caches filled by someone else, threads and CPUs waking up from the idle wait), and the block's figure is the mean
of the next CALLS calls. The libraries' blocks alternate, in an order
rotated every round (A B C, B C A, C A B, ...) so none always follows the same neighbour; after BLOCKS rounds each
library's time is the median of its block figures, and a ratio of two libraries is the median over rounds of
their block ratios (slow drifts of the machine cancel within a round)."""


@dataclass(frozen=True)
class SteadyTiming:
    """What ``bench_steady`` measured: per library (by name) its block figures, seconds per call, in round order."""

    blocks: dict[str, tuple[float, ...]]

    def median(self, name: str) -> float:
        """Seconds per call of library ``name``: the median of its block figures."""
        return statistics.median(self.blocks[name])

    def ratio(self, name_a: str, name_b: str) -> float:
        """Median over rounds of (block figure of ``name_a``) / (block figure of ``name_b``): > 1 when a is slower."""
        pairs = zip(self.blocks[name_a], self.blocks[name_b], strict=True)
        return statistics.median(ta / tb if tb > 0 else float("inf") for ta, tb in pairs)

    def speedup(self, name: str, over: str | Sequence[str]) -> float:
        """How many times faster ``name`` runs than ``over`` (``ratio(over, name)``). With several names in
        ``over``, each round compares with the fastest of them in that round (the best peer)."""
        peers = [over] if isinstance(over, str) else list(over)
        if not peers:
            raise ValueError(f"over must name at least one library, got over={over!r}")
        best = [min(times) for times in zip(*(self.blocks[p] for p in peers), strict=True)]
        pairs = zip(best, self.blocks[name], strict=True)
        return statistics.median(tb / ta if ta > 0 else float("inf") for tb, ta in pairs)


def _wait_native_builds() -> None:
    """Wait for the native libraries the warm-up's compiles started linking (jit.compile.wait_native_builds).
    NOTES: the C compiler runs on a background thread after a compile; timing while it runs would measure it too."""
    from deep_gemm.jit.compile import wait_native_builds

    wait_native_builds()


def bench_steady(
    fns: Mapping[str, Callable[[], object]],
    num_blocks: int = 5,
    calls_per_block: int = 3,
    num_warmups: int = 1,
    warm_seconds: float = WARM_BLOCK_S,
) -> SteadyTiming:
    """Time several libraries solving the same problem, each in its own steady state (see ``STEADY_PROTOCOL``).

    ``fns`` maps a library's name to a zero-argument call of it. First ``num_warmups`` untimed calls of each
    library (compiles, JIT traces, first-touch allocations), and a wait for the native libraries those compiles
    started linking in the background; then ``num_blocks`` rounds. In round r the libraries
    run in their given order rotated by r, each as one block: discarded calls until ``warm_seconds`` have passed
    (at least one), then ``calls_per_block`` timed back-to-back calls whose mean is the block's figure. Returns
    every block figure (seconds per call).
    """
    if not isinstance(fns, Mapping) or not fns:
        raise ValueError(f"fns must be a non-empty mapping of name -> callable, got fns={fns!r}")
    for name, fn in fns.items():
        if not callable(fn):
            raise TypeError(f"fns[{name!r}] must be callable, got {fn!r}")
    _check_count("num_blocks", num_blocks, 1)
    _check_count("calls_per_block", calls_per_block, 1)
    _check_count("num_warmups", num_warmups, 0)
    if isinstance(warm_seconds, bool) or not isinstance(warm_seconds, (int, float)) or not 0 <= warm_seconds <= 10:
        raise ValueError(f"warm_seconds must be a number of seconds in [0, 10], got warm_seconds={warm_seconds!r}")

    names = list(fns)
    for name in names:
        for _ in range(num_warmups):
            fns[name]()
    _wait_native_builds()
    blocks: dict[str, list[float]] = {name: [] for name in names}
    for r in range(num_blocks):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            fn = fns[name]
            _wait_idle()  # the previous library's threads have stopped spinning
            # NOTES: discarded: the transition from the previous library's block (and the idle wait) lands here
            start = _clock()
            fn()
            while _clock() - start < warm_seconds:
                fn()
            start = _clock()
            for _ in range(calls_per_block):
                fn()
            blocks[name].append((_clock() - start) / calls_per_block)
    return SteadyTiming({name: tuple(times) for name, times in blocks.items()})
