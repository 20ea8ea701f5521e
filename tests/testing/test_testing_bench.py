"""bench / bench_paired on a fake clock: call counts, order alternation and the medians (no wall-clock asserts)."""

from __future__ import annotations

import importlib

import pytest

from deep_gemm.testing import bench, bench_paired

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
