"""The chip cost model (deep_gemm.heuristics.model): it meets the published 950DT measurements, and pins physical
behaviour: more work never takes less time, more cores never slow a large GEMM, grouped kinds cost at least their
dense equivalent, small M is bound by HBM, the tile order matches the device scheduler's, and the latency-regime
terms vanish at large M and grow with fewer bytes or cores in flight."""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import sys
from pathlib import Path

import pytest

from deep_gemm.estimate import estimate_gemm
from deep_gemm.heuristics import (
    GemmConfig,
    GemmDesc,
    candidate_configs,
    config_violations,
    get_arch,
    get_best_config,
    model_gemm,
)
from deep_gemm.heuristics.model import LAUNCH_S, MEMORY_FIGURES, ROOFLINE_FIGURES
from deep_gemm.heuristics.schedule import swizzled_block, swizzled_index


def _load_model_check():
    path = Path(__file__).resolve().parents[2] / "bench" / "model_check.py"
    spec = importlib.util.spec_from_file_location("model_check", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("model_check", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_published_measurements_within_bar():
    # The dense rows (deep_gemm/estimate/gemm.py) stay as accurate as before issue 25 (median 0.5 %, worst 4.3 %).
    model_check = _load_model_check()
    rows = model_check.check("950DT")
    assert len(rows) == len(model_check.PUBLISHED) == 14
    assert sum(r.m == 128 for r in rows) == 3  # the decode-sized rows are checked too
    median, worst = model_check.summarize(rows)
    assert median <= 0.01, [(r.m, r.n, r.k, r.dtypes, round(r.error, 3)) for r in rows]
    assert worst <= 0.05, [(r.m, r.n, r.k, r.dtypes, round(r.error, 3)) for r in rows]
    # the same rows through the published-checks convention, the same modelled times
    from deep_gemm.estimate.gemm import published_checks

    checks = published_checks("950DT")
    assert [c.modelled_us for c in checks] == pytest.approx([r.modelled_us for r in rows], rel=1e-12)


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
    # Batched: G independent GEMMs cost at least G times one's steady state (without its launch, fill and drain)
    # and at most G separate launches.
    one = estimate_gemm(1024, 2048, 2048, "fp8", "fp8")
    batched = estimate_gemm(1024, 2048, 2048, "fp8", "fp8", gemm_type="batched", num_groups=8).time_us
    assert 8 * (one.time_us - one.launch_us - one.fill_us) <= batched <= 8 * one.time_us
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


# The latency regime (MemoryFigures): terms that must vanish at large M and grow where cores draw too little.


def _best_time_s(desc, arch, figures):
    return min(model_gemm(desc, c, arch, figures).time_s for c in candidate_configs(desc, arch))


def test_memory_figures_derive_the_sourced_values():
    f = MEMORY_FIGURES
    assert f.copy_issue_s == pytest.approx(24.1e-9, rel=0.01)  # 128 B copies, 64 AIVs, 0.34 TB/s
    assert f.gm_latency_s == pytest.approx(187.3e-9, rel=0.01)  # 8 KB ND2NZ on 32 AICs at 1.24 TB/s, less issue
    assert f.mte2_bytes_per_s(get_arch("950DT")) == pytest.approx(146.5e9, rel=0.01)  # 8192^3 MTE2 theory
    assert f.row_factor(512) == f.row_factor(4096) == 1.0 and f.row_factor(128) == pytest.approx(1.46)
    assert 1.0 < f.row_factor(256) < f.row_factor(128)
    assert f.same_address_factor(1) == 1.0 and f.same_address_factor(32) == pytest.approx(370 / 187)
    assert 1.0 < f.same_address_factor(4) < f.same_address_factor(16) < f.same_address_factor(32)


@pytest.mark.parametrize("shape,dtype", [((4096, 7168, 16384), "fp8"), ((4096, 7168, 16384), "bf16"),
                                         ((4096, 7168, 16384), "fp4"), ((8192, 8192, 8192), "fp8"),
                                         ((16384, 16384, 4096), "bf16"), ((4096, 4096, 7168), "fp8")])
def test_new_terms_vanish_at_large_m(shape, dtype):
    # Large M stays Cube-bound, within 1 % of the roofline model (the figures switched off).
    arch = get_arch("950DT")
    desc = GemmDesc(*shape, dtype, dtype)
    with_terms = _best_time_s(desc, arch, MEMORY_FIGURES)
    roofline = _best_time_s(desc, arch, ROOFLINE_FIGURES)
    assert abs(with_terms / roofline - 1) <= 0.01, (with_terms, roofline)
    assert model_gemm(desc, get_best_config(desc, arch), arch).bound == "cube"


def test_new_terms_grow_at_decode_m():
    # M = 128 against a large weight: the per-core copies bind, well above the roofline's prediction.
    arch = get_arch("950DT")
    for n, k in ((2112, 7168), (7168, 16384)):
        desc = GemmDesc(128, n, k)
        assert _best_time_s(desc, arch, MEMORY_FIGURES) > 1.15 * _best_time_s(desc, arch, ROOFLINE_FIGURES)


def test_fewer_bytes_in_flight_per_core_lower_bandwidth():
    # Same tiles, a shallower L1 stage (smaller BLOCK_K): fewer bytes in flight per core, lower achieved HBM
    # bandwidth (Little's law); the roofline figures do not see it.
    arch = get_arch("950DT")
    desc = GemmDesc(128, 4096, 4096, "bf16", "bf16")
    bandwidths, roofline = [], []
    for block_k in (32, 64, 128, 256):
        config = GemmConfig(128, 64, block_k, 128, 64, min(block_k, 64), num_l1_stages=2)
        assert config_violations(desc, config, arch) == []
        bandwidths.append(model_gemm(desc, config, arch).achieved_hbm_bytes_per_s)
        roofline.append(model_gemm(desc, config, arch, ROOFLINE_FIGURES).time_s)
    assert all(b < a for a, b in itertools.pairwise(reversed(bandwidths))), bandwidths
    assert bandwidths[-1] > 1.5 * bandwidths[0]
    assert max(roofline) / min(roofline) < 1.05


def test_fewer_cores_with_loads_in_flight_lower_bandwidth():
    # A decode GEMM on fewer cores draws less of the HBM: each core's copies are bounded by its own MTE2.
    bandwidths = []
    for cores in (2, 4, 8, 16, 32):
        est = estimate_gemm(128, 7168, 16384, "fp8", "fp8", arch="950DT", num_ai_cores=cores)
        bandwidths.append(est.hbm_bytes / (est.time_us * 1e-6))
    assert all(a < b for a, b in itertools.pairwise(bandwidths)), bandwidths
    assert bandwidths[0] < 2 * 160e9  # two cores draw at most about two cores' MTE2 rate


def test_same_address_readers_slow_a_latency_bound_copy():
    # Many cores reading the same A panel at once lengthen its latency; with plenty in flight it does not show.
    arch = get_arch("950DT")
    desc = GemmDesc(128, 4096, 4096, "bf16", "bf16")
    config = GemmConfig(128, 64, 32, 128, 64, 32, num_l1_stages=2)
    alone = dataclasses.replace(MEMORY_FIGURES, same_address_slowdown=1.0)
    assert model_gemm(desc, config, arch).time_s > model_gemm(desc, config, arch, alone).time_s
    assert model_gemm(desc, config, arch).same_address_s > 0
    big = GemmDesc(4096, 7168, 16384)
    best = get_best_config(big, arch)
    assert model_gemm(big, best, arch).time_s == model_gemm(big, best, arch, alone).time_s
