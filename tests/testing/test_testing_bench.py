"""bench / bench_paired / bench_steady on a fake clock: call counts, order alternation, discarded calls and the
medians (no wall-clock asserts)."""

from __future__ import annotations

import importlib

import pytest

from deep_gemm.testing import STEADY_PROTOCOL, bench, bench_paired, bench_steady

# NOTES: the package re-exports the function `bench`, which shadows the submodule of the same name.
bench_mod = importlib.import_module("deep_gemm.testing.bench")


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.log: list[str] = []

    def __call__(self) -> float:
        return self.now

    def work(self, name: str, cost):
        def fn():
            self.log.append(name)
            self.now += cost(len(self.log)) if callable(cost) else cost
        return fn


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(bench_mod, "_clock", c)
    return c


def test_bench_median_and_counts(clock):
    costs = iter([100.0, 100.0, 5.0, 1.0, 3.0, 2.0, 4.0])  # 2 warmups then 5 timed calls
    fn = clock.work("f", lambda _n: next(costs))
    assert bench(fn, num_warmups=2, num_tests=5) == 3.0
    assert len(clock.log) == 7


def test_bench_paired_alternates_and_ratio(clock):
    # A costs 3 then 6 alternately, B always 2: ratios 1.5, 3, 1.5 -> median 1.5.
    a_costs = iter([9.0, 3.0, 6.0, 3.0])
    res = bench_paired(clock.work("a", lambda _n: next(a_costs)), clock.work("b", 2.0), num_pairs=3, num_warmups=1)
    assert clock.log == ["a", "b", "a", "b", "b", "a", "a", "b"]
    assert res == (3.0, 2.0, 1.5)
    assert res.median_a == 3.0 and res.median_b == 2.0 and res.median_ratio == 1.5


def test_bench_real_clock_returns_positive_seconds():
    assert bench(lambda: sum(range(1000)), num_warmups=0, num_tests=1) > 0


@pytest.mark.parametrize("kwargs", [dict(num_tests=0), dict(num_warmups=-1), dict(num_tests=True)])
def test_bench_bad_counts(kwargs):
    with pytest.raises(ValueError, match=list(kwargs)[0]):
        bench(lambda: None, **kwargs)
    with pytest.raises(ValueError, match="num_pairs=0"):
        bench_paired(lambda: None, lambda: None, num_pairs=0)


def test_bench_paired_settle_sleeps_before_every_timed_call(monkeypatch):
    sleeps = []
    monkeypatch.setattr(bench_mod.time, "sleep", sleeps.append)
    bench_mod.bench_paired(lambda: None, lambda: None, num_pairs=3, num_warmups=1, settle=0.25)
    assert sleeps == [0.25] * 6
    with pytest.raises(ValueError, match="settle"):
        bench_mod.bench_paired(lambda: None, lambda: None, settle=-1.0)


def test_bench_steady_waits_for_an_idle_process_before_every_block(monkeypatch):
    """Before each block the process must go idle: probes sleep until one sees (almost) no process CPU time; a
    thread that never stops spinning costs IDLE_MAX_PROBES probes, not a hang."""
    log = []
    busy_probes = iter([True, True, False] + [False] * 10)  # the first block waits out two busy probes
    cpu = [0.0]

    def fake_sleep(seconds):
        log.append("probe")
        cpu[0] += seconds if next(busy_probes) else 0.0

    monkeypatch.setattr(bench_mod.time, "sleep", fake_sleep)
    monkeypatch.setattr(bench_mod.time, "process_time", lambda: cpu[0])
    bench_steady({"a": lambda: log.append("a"), "b": lambda: log.append("b")}, num_blocks=2, calls_per_block=1,
                 num_warmups=0, warm_seconds=0)
    assert log == ["probe", "probe", "probe", "a", "a", "probe", "b", "b", "probe", "b", "b", "probe", "a", "a"]
    log.clear()
    monkeypatch.setattr(bench_mod.time, "sleep", lambda seconds: log.append("probe"))
    monkeypatch.setattr(bench_mod.time, "process_time", lambda: float(len(log)))  # always spinning
    bench_mod._wait_idle()
    assert log == ["probe"] * bench_mod.IDLE_MAX_PROBES


def test_bench_steady_blocks_rotate_and_discard_first_call(clock):
    res = bench_steady({"a": clock.work("a", 1.0), "b": clock.work("b", 1.0), "c": clock.work("c", 1.0)},
                       num_blocks=3, calls_per_block=2, num_warmups=1)
    # warm-ups, then per round each library's block of 1 discarded + 2 timed calls, order rotated per round
    assert clock.log == (["a", "b", "c"] + ["a"] * 3 + ["b"] * 3 + ["c"] * 3 + ["b"] * 3 + ["c"] * 3 + ["a"] * 3
                         + ["c"] * 3 + ["a"] * 3 + ["b"] * 3)
    assert res.blocks == {"a": (1.0, 1.0, 1.0), "b": (1.0, 1.0, 1.0), "c": (1.0, 1.0, 1.0)}


def test_bench_steady_block_figure_excludes_the_first_call(clock):
    # Each block's first call is slow (a transition from the other library); the steady calls cost 2 and 4.
    def cost_of(steady):
        calls = {"n": 0}

        def cost(_n):
            calls["n"] += 1
            return 100.0 if calls["n"] % 3 == 1 else steady
        return cost

    res = bench_steady({"a": clock.work("a", cost_of(2.0)), "b": clock.work("b", cost_of(4.0))},
                       num_blocks=4, calls_per_block=2, num_warmups=0)
    assert res.blocks == {"a": (2.0,) * 4, "b": (4.0,) * 4}
    assert res.median("a") == 2.0 and res.median("b") == 4.0
    assert res.ratio("b", "a") == 2.0 and res.speedup("a", over="b") == 2.0


def test_bench_steady_medians_over_blocks_and_per_round_ratios(clock):
    # Block figures (mean of the 2 timed calls): a = 3, 5, 30 (a noisy round), b = 2, 10, 10.
    a_costs = iter([1.0, 2.0, 4.0, 1.0, 5.0, 5.0, 1.0, 30.0, 30.0])
    b_costs = iter([1.0, 2.0, 2.0, 1.0, 10.0, 10.0, 1.0, 10.0, 10.0])
    res = bench_steady({"a": clock.work("a", lambda _n: next(a_costs)), "b": clock.work("b", lambda _n: next(b_costs))},
                       num_blocks=3, calls_per_block=2, num_warmups=0)
    assert res.blocks == {"a": (3.0, 5.0, 30.0), "b": (2.0, 10.0, 10.0)}
    assert res.median("a") == 5.0 and res.median("b") == 10.0
    assert res.ratio("a", "b") == 1.5  # per-round ratios 1.5, 0.5, 3 -> median 1.5 (not 5 / 10)


def test_bench_steady_discards_fast_calls_until_the_warm_time_has_passed(clock):
    """A library whose calls are shorter than warm_seconds loses as many calls as fit in it (the slow transition
    after an idle wait can last several calls); one whose call is longer loses exactly one."""
    fast_costs = iter([0.03, 0.03, 0.01, 0.02] * 2)  # per block: 2 slow calls, then the steady ones
    res = bench_steady({"fast": clock.work("fast", lambda _n: next(fast_costs)), "slow": clock.work("slow", 1.0)},
                       num_blocks=2, calls_per_block=2, num_warmups=0, warm_seconds=0.05)
    # fast: 2 discarded calls (0.03 + 0.03 >= 0.05), then 0.01 and 0.02 timed; slow: 1 discarded (1.0 >= 0.05)
    assert clock.log == ["fast"] * 4 + ["slow"] * 3 + ["slow"] * 3 + ["fast"] * 4
    assert res.blocks["fast"] == pytest.approx((0.015, 0.015))
    assert res.blocks["slow"] == pytest.approx((1.0, 1.0))


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(num_blocks=0), "num_blocks=0"), (dict(calls_per_block=0), "calls_per_block=0"),
    (dict(num_warmups=-1), "num_warmups=-1"), (dict(num_blocks=2.5), "num_blocks=2.5"),
    (dict(warm_seconds=-0.1), "warm_seconds=-0.1"), (dict(warm_seconds="1"), "warm_seconds='1'"),
    (dict(warm_seconds=True), "warm_seconds=True"),
])
def test_bench_steady_bad_counts(kwargs, match):
    calls = []
    with pytest.raises(ValueError, match=match):
        bench_steady({"a": lambda: calls.append(1)}, **kwargs)
    assert calls == []  # rejected before any call


def test_bench_steady_bad_fns():
    with pytest.raises(ValueError, match="fns"):
        bench_steady({})
    with pytest.raises(TypeError, match="fns\\['x'\\]"):
        bench_steady({"x": 3})


def test_steady_protocol_text_names_the_rules():
    for words in ("back-to-back", "discarded", "median", "rotated"):
        assert words in STEADY_PROTOCOL


def test_steady_speedup_over_the_best_peer_per_round():
    timing = bench_mod.SteadyTiming({"us": (1.0, 1.0, 2.0), "np": (4.0, 2.0, 8.0), "jax": (3.0, 5.0, 2.0)})
    # best peer per round: 3 (jax), 2 (np), 2 (jax) -> speedups 3, 2, 1 -> median 2
    assert timing.speedup("us", over=("np", "jax")) == 2.0
    assert timing.speedup("us", over="np") == 4.0 and timing.speedup("us", over=["jax"]) == 3.0
    with pytest.raises(ValueError, match="over"):
        timing.speedup("us", over=())


def test_bench_steady_waits_for_background_native_links_after_warmup(monkeypatch):
    # A warm-up compile starts its native library's C link on a background thread: the timed blocks come after it.
    log = []
    monkeypatch.setattr("deep_gemm.jit.compile.wait_native_builds", lambda: log.append("wait"))
    bench_steady({"a": lambda: log.append("a"), "b": lambda: log.append("b")}, num_blocks=1, calls_per_block=1,
                 num_warmups=2, warm_seconds=0)
    assert log[:5] == ["a", "a", "b", "b", "wait"] and log.count("wait") == 1 and len(log) == 9
