"""The MQA-logits cost model and config choice (deep_gemm.heuristics.mqa): legal configs only, the estimates'
structure (what grows with what, the paged gather: page pairs on the AIC, scales on the AIVs), refusals of bad
arguments."""

from __future__ import annotations

import pytest

import deep_gemm
from deep_gemm.arch import get_arch
from deep_gemm.heuristics.mqa import (
    MAX_MAD_ROWS,
    MqaDesc,
    candidate_mqa_configs,
    config_violations,
    get_best_mqa_config,
    split_units,
)

ARCH = get_arch("950DT")


@pytest.mark.parametrize("num_heads", [4, 8, 32, 36, 64])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_configs_are_legal_and_fill_the_mad(num_heads, head_dim):
    for desc in (MqaDesc(num_heads, head_dim), MqaDesc(num_heads, head_dim, next_n=2)):
        cands = candidate_mqa_configs(desc, ARCH)
        assert cands and all(not config_violations(desc, c, ARCH) for c in cands)
        best = get_best_mqa_config(desc, ARCH)
        assert best in cands and best.block_q * num_heads <= MAX_MAD_ROWS
    assert get_best_mqa_config(MqaDesc(num_heads, head_dim, next_n=1), ARCH).block_kv == 256


def test_ragged_estimate_grows_with_keys_and_names_its_bound():
    causal = [deep_gemm.estimate_mqa_logits(2048, n, cu_seq_len_k_start=[0] * 2048,
                                            cu_seq_len_k_end=[n - 2048 + i + 1 for i in range(2048)],
                                            num_ai_cores=32, arch="950DT") for n in (4096, 16384)]
    assert causal[1].time_us > 2 * causal[0].time_us
    full = deep_gemm.estimate_mqa_logits(2048, 16384, num_ai_cores=32, arch="950DT")
    assert full.time_us > causal[1].time_us and full.num_tiles > causal[1].num_tiles
    assert full.bound in ("cube", "fixpipe", "vector", "mte2", "mte1", "l2", "hbm")
    text = str(full)
    assert "modelled" in text and "H=64 D=128" in text
    # MX scales skip the AIVs' per-key multiply
    mx = deep_gemm.estimate_mqa_logits(2048, 16384, kv_scale_per_key=False, num_ai_cores=32, arch="950DT")
    assert mx.vector_us < full.vector_us


def test_ragged_estimate_charges_key_loads_only_where_keys_are_not_resident():
    """The ragged kernel skips a tile's key copies when its L0B stage still holds the block: with full ranges and
    key blocks dividing 2 x cores, a core loads keys only for its first two tiles; otherwise every tile loads."""
    def est(keys, cores):
        return deep_gemm.estimate_mqa_logits(64, keys, num_ai_cores=cores, arch="950DT")

    block_kv = est(16384, 32).config.block_kv
    resident, moving = est(64 * block_kv, 32), est(65 * block_kv, 32)  # 64 key blocks | 2 x 32 cores; 65 do not
    assert resident.l2_bytes < moving.l2_bytes / 8
    assert resident.mte2_us < 0.6 * moving.mte2_us  # what remains: the q panels
    # the same call on 31 cores: 64 blocks no longer divide 62, every tile loads its keys
    assert est(64 * block_kv, 31).l2_bytes > 8 * resident.l2_bytes


def test_paged_estimate_gathers_page_pairs_and_scales_on_the_aivs():
    """The chip's gather (DeepGEMM-Ascend's paged kernel): the AIC copies the values two pages per copy, in either
    layout; the scales never ride with them: the AIVs copy them (and, MX scales, on to L1)."""
    from deep_gemm.heuristics.model import MEMORY_FIGURES

    ctx = [[8192]] * 16
    ascend = deep_gemm.estimate_paged_mqa_logits(ctx, page_size=64, use_ascend_kv_layout=True, arch="950DT",
                                                 num_ai_cores=32)
    cuda = deep_gemm.estimate_paged_mqa_logits(ctx, page_size=64, arch="950DT", num_ai_cores=32)
    assert ascend.pages_per_copy == cuda.pages_per_copy == 2
    assert ascend.mte2_us == pytest.approx(cuda.mte2_us)  # the same FP8 values on the AIC in both layouts
    assert ascend.aiv_mte2_us > cuda.aiv_mte2_us > 0  # MX scales go on UB -> L1; the fp32 ones stay in UB
    assert ascend.time_us <= cuda.time_us  # CUDA's per-key scale costs the AIVs a Mul and a ReLU
    assert ascend.num_tiles == 16 * 8192 // 256 and ascend.busiest_tiles == 16
    big_pages = deep_gemm.estimate_paged_mqa_logits(ctx, page_size=128, arch="950DT", num_ai_cores=32)
    # a unit of 256 keys: 4 pages of 64 in 2 copies, 2 pages of 128 in 1; the bytes are the same
    issue_us = MEMORY_FIGURES.copy_issue_s * 1e6
    assert cuda.mte2_us - big_pages.mte2_us == pytest.approx(cuda.busiest_tiles * issue_us)
    fp4 = deep_gemm.estimate_paged_mqa_logits(ctx, q_dtype="fp4", kv_dtype="fp4", use_ascend_kv_layout=True,
                                              arch="950DT", num_ai_cores=32)
    assert fp4.pages_per_copy == 2 and fp4.mte2_us < ascend.mte2_us  # half the value bytes, the same copies
    assert fp4.aiv_mte2_us == pytest.approx(ascend.aiv_mte2_us)  # the same UE8M0 bytes per token


def test_paged_estimate_charges_short_atoms_their_own_rows():
    """A batch row's last atom of fewer tokens runs a MAD of its own rows: 5 tokens (atoms 4 + 1) cost less than two
    full atoms (8 tokens), more than one."""
    def est(tokens):
        return deep_gemm.estimate_paged_mqa_logits([[8192] * tokens] * 64, num_heads=32, arch="950DT",
                                                   num_ai_cores=32, use_ascend_kv_layout=True)
    four, five, eight = est(4), est(5), est(8)
    assert five.config.block_q == eight.config.block_q == 4
    assert five.num_tiles == eight.num_tiles == 2 * four.num_tiles
    assert four.cube_us < five.cube_us < eight.cube_us
    assert five.fixpipe_us == pytest.approx(four.fixpipe_us * 5 / 4)  # FixPipe's bytes: the tokens' rows


@pytest.mark.parametrize("total,cores", [(0, 4), (5, 32), (100, 32), (1000, 7)])
def test_split_units_equal_shares(total, cores):
    starts = split_units(total, cores)
    shares = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert starts[0] == 0 and starts[-1] == total and max(shares) - min(shares) <= 1


@pytest.mark.parametrize("kwargs,error,pattern", [
    ({"num_heads": 6}, ValueError, "num_heads=6"),
    ({"head_dim": 96}, ValueError, "head_dim=96"),
    ({"q_dtype": "bf16"}, ValueError, "q_dtype='bf16'"),
    ({"arch": "910B2"}, ValueError, "910B2 has no FP8"),
    ({"num_ai_cores": 33, "arch": "950DT"}, ValueError, "num_ai_cores=33"),
    ({"cu_seq_len_k_start": [0] * 8, "cu_seq_len_k_end": [9] * 8}, ValueError, "row 0"),
    ({"cu_seq_len_k_start": [0] * 8}, ValueError, "pass both"),
])
def test_estimate_refuses_bad_arguments(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        deep_gemm.estimate_mqa_logits(8, 8, **kwargs)
