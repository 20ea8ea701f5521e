"""The chip cost model (deep_gemm.heuristics.model): it meets the published 950DT measurements, and pins physical
behaviour: more work never takes less time, more cores never slow a large GEMM, grouped kinds cost at least their
dense equivalent, small M is bound by HBM, and the tile order matches the device scheduler's."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path

import pytest

from deep_gemm.estimate import estimate_gemm
from deep_gemm.heuristics import GemmDesc, candidate_configs, get_arch, get_best_config, model_gemm
from deep_gemm.heuristics.model import LAUNCH_S
from deep_gemm.heuristics.schedule import swizzled_block, swizzled_index


def _load_model_check():
    path = Path(__file__).resolve().parents[2] / "bench" / "model_check.py"
    spec = importlib.util.spec_from_file_location("model_check", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("model_check", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_published_measurements_within_bar():
    model_check = _load_model_check()
    rows = model_check.check("950DT")
    assert len(rows) == len(model_check.PUBLISHED) == 11
    median, worst = model_check.summarize(rows)
    assert median <= 0.05, [(r.m, r.n, r.k, r.dtypes, round(r.error, 3)) for r in rows]
    assert worst <= 0.15, [(r.m, r.n, r.k, r.dtypes, round(r.error, 3)) for r in rows]


def test_peak_bound_for_the_big_published_shape():
    # 448 tiles of 256x256 on 32 cores: 14 full waves, Cube-bound at ~99 % of each dtype's peak.
    for a, b, peak in (("bf16", "bf16", 432.5), ("fp8", "fp8", 865.1), ("fp4", "fp4", 1730.2)):
        est = estimate_gemm(4096, 7168, 16384, a, b, arch="950DT")
        assert est.bound == "cube"
        assert 0.97 < est.tflops / peak <= 1.0
        assert 0.97 < est.utilization <= 1.0


@pytest.mark.parametrize("dtype,arch", [("fp8", "950DT"), ("bf16", "950DT"), ("bf16", "910B2"), ("fp4", "950PR")])
def test_more_work_never_faster(dtype, arch):
    values = (1, 16, 64, 80, 100, 576, 2112, 4096)
    for m, n, k in itertools.product(values, values, (256, 7168)):
        base = estimate_gemm(m, n, k, dtype, dtype, arch=arch).time_us
        for bigger in ((m * 2, n, k), (m + 16, n, k), (m, n * 2, k), (m, n + 16, k), (m, n, k * 2), (m, n, k + 64)):
            assert estimate_gemm(*bigger, dtype, dtype, arch=arch).time_us >= base, ((m, n, k), bigger)


@pytest.mark.parametrize("shape,dtype", [((4096, 7168, 16384), "fp8"), ((4096, 7168, 16384), "bf16"),
                                         ((8192, 8192, 8192), "fp8"), ((16384, 16384, 4096), "bf16"),
                                         ((4096, 7168, 16384), "fp4")])
def test_more_cores_never_slower_for_a_large_gemm(shape, dtype):
    times = [estimate_gemm(*shape, dtype, dtype, arch="950DT", num_ai_cores=c).time_us for c in range(1, 33)]
    assert all(later <= earlier for earlier, later in itertools.pairwise(times)), times
    assert times[0] / times[-1] > 25  # close to linear: 32 cores vs 1


def test_grouped_kinds_cost_at_least_the_dense_gemm():
    cases = [(4, 8192, 4096, 7168), (8, 4096, 7168, 2048), (8, 1024, 4096, 7168), (64, 4096, 7168, 2048)]
    for groups, m, n, k in cases:
        dense = estimate_gemm(m, n, k, "fp8", "fp8").time_us
        for kind in ("m_grouped_contiguous", "m_grouped_masked"):
            grouped = estimate_gemm(m, n, k, "fp8", "fp8", gemm_type=kind, num_groups=groups)
            assert grouped.time_us >= dense, (kind, groups, m, n, k)
            assert grouped.flops == pytest.approx(2.0 * m * n * k)
        # K-grouped: the same FLOPs split over groups, one M x N output per group.
        assert estimate_gemm(m, n, k, "fp8", "fp8", gemm_type="k_grouped_contiguous",
                             num_groups=groups).time_us >= dense * (1 - 1e-12)
    # Batched: G independent GEMMs cost at least G - 1 of them back to back and at most G separate launches.
    one = estimate_gemm(1024, 2048, 2048, "fp8", "fp8").time_us
    batched = estimate_gemm(1024, 2048, 2048, "fp8", "fp8", gemm_type="batched", num_groups=8).time_us
    assert 7 * (one - LAUNCH_S * 1e6) <= batched <= 8 * one
    # With one group every kind is the dense GEMM (up to M-grouped padding to 256 rows).
    for kind in ("m_grouped_masked", "k_grouped_contiguous", "batched"):
        assert estimate_gemm(4096, 4096, 4096, gemm_type=kind).time_us == pytest.approx(
            estimate_gemm(4096, 4096, 4096).time_us)


def test_m_grouped_decode_is_bound_by_weight_bandwidth():
    # 64 experts with 16 tokens each: every expert's B (7168 x 2048 FP8) is read from HBM once.
    arch = get_arch("950DT")
    est = estimate_gemm(64 * 16, 7168, 2048, "fp8", "fp8", gemm_type="m_grouped_masked", num_groups=64)
    b_bytes = 64 * 7168 * 2048 * (1 + 1 / 32)
    assert est.bound == "hbm"
    assert est.time_us >= b_bytes / arch.hbm_bytes_per_s * 1e6
    assert est.time_us <= 1.2 * b_bytes / arch.hbm_bytes_per_s * 1e6


@pytest.mark.parametrize("arch_name", ["950DT", "950PR"])
def test_small_m_is_bound_by_hbm_for_b(arch_name):
    arch = get_arch(arch_name)
    for m in (1, 16, 64):
        est = estimate_gemm(m, 16384, 7168, "fp8", "fp8", arch=arch_name)
        b_time = 16384 * 7168 * (1 + 1 / 32) / arch.hbm_bytes_per_s * 1e6
        assert est.bound == "hbm", (m, est)
        assert b_time <= est.time_us <= b_time * 1.25 + LAUNCH_S * 1e6
        assert est.config.path == "stream"
    # The slower HBM of the 950PR makes the same decode GEMM slower than on the 950DT.
    if arch_name == "950PR":
        assert estimate_gemm(16, 16384, 7168, arch="950PR").time_us > estimate_gemm(16, 16384, 7168,
                                                                                     arch="950DT").time_us


def test_dtype_speedups_follow_cube_rates():
    bf16 = estimate_gemm(8192, 8192, 8192, "bf16", "bf16").time_us
    fp8 = estimate_gemm(8192, 8192, 8192, "fp8", "fp8").time_us
    fp4 = estimate_gemm(8192, 8192, 8192, "fp4", "fp4").time_us
    assert 1.9 < bf16 / fp8 < 2.05 and 1.8 < fp8 / fp4 < 2.05


def test_breakdown_is_consistent():
    arch = get_arch("950DT")
    desc = GemmDesc(4096, 2112, 7168)
    config = get_best_config(desc, arch)
    cost = model_gemm(desc, config, arch)
    busiest = max(cost.cube_s, cost.mte1_s, cost.mte2_s, cost.fixpipe_s, cost.vector_s)
    assert cost.time_s >= max(busiest, cost.l2_s, cost.hbm_s) + cost.launch_s
    assert cost.l2_bytes >= (4096 + 2112) * 7168  # every operand byte passes L2 -> L1 at least once
    assert cost.hbm_bytes >= 4096 * 7168 + 2112 * 7168 + 4096 * 2112 * 2


def test_search_finds_the_exhaustive_minimum():
    # Branch and bound prunes block pairs by a lower bound; it must never prune the best config.
    arch = get_arch("950DT")
    for shape, (a, b) in itertools.product([(4096, 2112, 7168), (100, 7168, 512), (3000, 5000, 700), (64, 576, 7168)],
                                           [("fp8", "fp8"), ("bf16", "bf16"), ("fp8", "fp4")]):
        desc = GemmDesc(*shape, a, b)
        exhaustive = min(model_gemm(desc, c, arch).time_s for c in candidate_configs(desc, arch))
        assert model_gemm(desc, get_best_config(desc, arch), arch).time_s == exhaustive, (shape, a, b)


def test_tile_order_inverse_and_bijection():
    for mb, nb, cores in itertools.product((1, 3, 4, 5, 8, 9), (1, 7, 8, 9, 17), (7, 24, 28, 32)):
        seen = set()
        for t in range(mb * nb):
            m, n = swizzled_block(t, mb, nb, 4, cores)
            assert 0 <= m < mb and 0 <= n < nb
            assert swizzled_index(m, n, mb, nb, 4, cores) == t
            seen.add((m, n))
        assert len(seen) == mb * nb


def test_tile_order_matches_the_device_scheduler():
    scheduler = pytest.importorskip("deep_gemm.device.scheduler")
    for mb, nb, cores in [(8, 16, 32), (6, 10, 32), (13, 9, 28), (3, 5, 24), (16, 28, 32)]:
        order = scheduler.tile_order(mb, nb, 4, cores)
        assert [tuple(map(int, row)) for row in order] == [swizzled_block(t, mb, nb, 4, cores)
                                                           for t in range(mb * nb)]
