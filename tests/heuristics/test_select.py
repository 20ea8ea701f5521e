"""Config search (deep_gemm.heuristics.select): every chosen config is legal on every arch, the choice is
deterministic, the path and grouped-kind rules hold, and unsupported problems are refused."""

from __future__ import annotations

import itertools

import pytest

from deep_gemm.heuristics import (
    ARCHS,
    GemmConfig,
    GemmDesc,
    buffer_bytes,
    candidate_configs,
    config_violations,
    get_arch,
    get_best_config,
    model_gemm,
    print_config_once,
    select,
)

SIZES = (1, 17, 64, 100, 256, 576, 2112, 4096, 7168)
KS = (64, 200, 2048, 7168)


def _pairs(arch):
    if not arch.has_fp8:
        return [("bf16", "bf16")]
    return [("bf16", "bf16"), ("fp8", "fp8"), ("fp8", "fp4"), ("fp4", "fp4")]


def _capacity(arch):
    return {"L1": arch.l1_bytes, "L0A": arch.l0a_bytes, "L0B": arch.l0b_bytes, "L0C": arch.l0c_bytes,
            "UB": arch.ub_bytes}


@pytest.mark.parametrize("arch_name", sorted(ARCHS))
def test_chosen_configs_fit_every_buffer(arch_name):
    arch = get_arch(arch_name)
    cap = _capacity(arch)
    for (a, b), m, n, k in itertools.product(_pairs(arch), SIZES, SIZES[::2], KS):
        desc = GemmDesc(m, n, k, a, b, num_ai_cores=arch.num_ai_cores)
        c = get_best_config(desc, arch)
        assert config_violations(desc, c, arch) == [], (desc, c)
        for name, used in buffer_bytes(desc, c).items():
            assert used <= cap[name], (name, desc, c)
        assert c.block_m * c.block_n * 4 <= arch.l0c_bytes
        assert c.mad_m % 16 == 0 and c.mad_n % 16 == 0 and c.block_k % c.mad_k == 0
        if a != "bf16":
            assert c.mad_k % 64 == 0
        assert c.num_l1_stages >= 2 and c.num_l0_stages >= 2 and c.num_l0c_stages >= 2
        assert c.num_ai_cores == arch.num_ai_cores


@pytest.mark.parametrize("gemm_type", ["m_grouped_contiguous", "m_grouped_masked", "k_grouped_contiguous", "batched"])
def test_grouped_kinds_choose_legal_configs(gemm_type):
    arch = get_arch("950DT")
    for (a, b), groups, m in itertools.product(_pairs(arch), (1, 4, 8), (256, 1024, 8192)):
        desc = GemmDesc(m, 4096, 7168, a, b, gemm_type=gemm_type, num_groups=groups)
        c = get_best_config(desc, arch)
        assert config_violations(desc, c, arch) == []
        if gemm_type == "m_grouped_contiguous":
            assert c.block_m == 256


def test_every_candidate_is_legal_and_an_overflow_is_caught():
    arch = get_arch("950DT")
    desc = GemmDesc(4096, 7168, 16384, "fp8", "fp8")
    candidates = candidate_configs(desc, arch)
    assert len(candidates) > 20
    assert all(config_violations(desc, c, arch) == [] for c in candidates)
    # The same blocks with twice the L1 stages overflow L1; a 512x256 block overflows L0C.
    best = get_best_config(desc, arch)
    too_deep = GemmConfig(**{**best.to_dict(), "num_l1_stages": 2 * best.num_l1_stages + 4})
    assert any(v.startswith("L1") for v in config_violations(desc, too_deep, arch))
    too_wide = GemmConfig(512, 256, 256, 256, 128, 128, 2)
    assert any("L0C" in v for v in config_violations(desc, too_wide, arch))


def test_deterministic_and_cached():
    arch = get_arch("950DT")
    descs = [GemmDesc(m, n, k) for m, n, k in [(4096, 7168, 16384), (128, 2112, 7168), (3000, 5000, 700)]]
    first = [get_best_config(d, arch) for d in descs]
    select._best.cache_clear()
    select._configs_cached.cache_clear()
    again = [get_best_config(d, arch) for d in descs]
    assert first == again
    assert [get_best_config(d, arch) for d in descs] == first


def test_published_case_fills_all_cores():
    arch = get_arch("950DT")
    for a, b in _pairs(arch):
        desc = GemmDesc(4096, 7168, 16384, a, b)
        c = get_best_config(desc, arch)
        tiles = -(-4096 // c.block_m) * -(-7168 // c.block_n)
        assert tiles % 32 == 0, (a, b, c)
        assert model_gemm(desc, c, arch).num_waves == tiles // 32


def test_path_follows_expected_m():
    arch = get_arch("950DT")
    assert get_best_config(GemmDesc(64, 7168, 7168), arch).path == "stream"
    assert get_best_config(GemmDesc(65, 7168, 7168), arch).path == "cube"
    stream = get_best_config(GemmDesc(48, 4096, 2048), arch)
    assert stream.path == "stream" and stream.block_m >= 48  # one M-block: each B tile read once
    # M-grouped: the rows per group decide.
    masked = GemmDesc(8 * 32, 4096, 7168, gemm_type="m_grouped_masked", num_groups=8)
    assert masked.expected_m == 32 and get_best_config(masked, arch).path == "stream"
    assert get_best_config(GemmDesc(8 * 512, 4096, 7168, gemm_type="m_grouped_masked", num_groups=8),
                           arch).path == "cube"


def test_schedule_uses_desc_core_count():
    arch = get_arch("950PR")
    for cores in (1, 7, 28):
        assert get_best_config(GemmDesc(1024, 1024, 1024, num_ai_cores=cores), arch).num_ai_cores == cores


def test_unsupported_problems_are_refused():
    with pytest.raises(ValueError, match="910B2 has no fp8"):
        get_best_config(GemmDesc(256, 256, 256, "fp8", "fp8", num_ai_cores=24), get_arch("910B2"))
    with pytest.raises(ValueError, match="not a supported pair"):
        get_best_config(GemmDesc(256, 256, 256, "fp4", "fp8"), get_arch("950DT"))
    with pytest.raises(ValueError, match="not a supported pair"):
        get_best_config(GemmDesc(256, 256, 256, "bf16", "fp8"), get_arch("950DT"))
    with pytest.raises(ValueError, match="num_ai_cores=33"):
        get_best_config(GemmDesc(256, 256, 256, num_ai_cores=33), get_arch("950DT"))
    with pytest.raises(ValueError, match="gemm_type"):
        get_best_config(GemmDesc(256, 256, 256, gemm_type="dense"), get_arch("950DT"))
    with pytest.raises(ValueError, match="m=0"):
        get_best_config(GemmDesc(0, 256, 256), get_arch("950DT"))


def test_print_config_once(monkeypatch, capsys):
    arch = get_arch("950DT")
    desc = GemmDesc(1000, 1000, 1000)
    config = get_best_config(desc, arch)
    monkeypatch.delenv("DG_PRINT_CONFIGS", raising=False)
    print_config_once(desc, config)
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("DG_PRINT_CONFIGS", "1")
    monkeypatch.setattr(select, "_printed", set())
    print_config_once(desc, config)
    print_config_once(desc, config)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "m=1000 n=1000 k=1000" in out and f"block {config.block_m}x" in out
    other = GemmDesc(1000, 1000, 1001)
    print_config_once(other, get_best_config(other, arch))
    assert capsys.readouterr().out.count("\n") == 1
