"""The mega MoE cost model (deep_gemm.heuristics.mega_moe, deep_gemm.estimate.mega_moe): the published EP8 rows within
10 %, the structure of the estimate (what grows with what, what binds where), the workspace layout, refusals."""

from __future__ import annotations

import pytest

from deep_gemm.estimate import published
from deep_gemm.estimate.mega_moe import PUBLISHED_EP8, estimate_mega_moe, main, published_checks
from deep_gemm.heuristics.mega_moe import BUFFER_ALIGNMENT, MegaMoeDesc, workspace_layout


def test_published_ep8_rows_within_ten_percent():
    rows = published_checks("950DT")
    assert len(rows) == len(PUBLISHED_EP8) == 4
    for row in rows:
        assert abs(row.error) < 0.10, (row.problem, row.published_us, row.modelled_us)
        assert row.family == "fp8_fp4_mega_moe" and row.terms
    # the convention: model_check prints them through the shared list
    assert "mega_moe" in published.FAMILY_MODULES
    assert [r.problem for r in published.published_checks("950DT") if r.family == "fp8_fp4_mega_moe"] == [
        r.problem for r in rows]


def test_vendor_tflops_formula_and_bounds():
    small = estimate_mega_moe(96, 5120, 2304, 64, arch="950DT")
    big = estimate_mega_moe(384, 7168, 3072, 16384, arch="950DT")
    assert small.tflops == pytest.approx(2 * 64 * 7 * 5120 * 2304 * 3 / (small.time_us * 1e-6) / 1e12)
    # decode-sized: a few rows per expert, the weights bind; prefill-sized: the Cube near its FP8 peak (865 TFLOPS)
    assert small.routed_rows_per_expert == 32 and small.bound == "cube/weights"
    assert big.bound == "cube" and 0.9 * 865 < big.tflops < 865
    assert big.link_us < big.gemm_us  # the pull and push hide under the GEMMs
    assert "modelled" in str(small) and "EP8" in str(small)


def test_estimate_grows_with_tokens_experts_and_shared():
    times = [estimate_mega_moe(96, 5120, 2304, t, arch="950DT").time_us for t in (64, 256, 1024, 4096)]
    assert times == sorted(times) and times[-1] > 4 * times[1]
    # more local experts at few tokens: more weights to stream
    assert estimate_mega_moe(192, 5120, 2304, 64, arch="950DT").time_us > times[0]
    no_shared = estimate_mega_moe(96, 5120, 2304, 64, num_shared_experts=0, arch="950DT")
    two_shared = estimate_mega_moe(96, 5120, 2304, 64, num_shared_experts=2, arch="950DT")
    assert no_shared.time_us < times[0] < two_shared.time_us
    assert [p for p, _ in no_shared.phases_us] == ["l1", "l2"]
    # fewer cores: slower
    assert estimate_mega_moe(96, 5120, 2304, 1024, arch="950DT", num_ai_cores=16).time_us > times[2]


def test_workspace_layout_is_aligned_and_sized():
    d = MegaMoeDesc(4, 16, 1, 128, 4, 1024, 512)
    fields, size = workspace_layout(d)
    assert size % BUFFER_ALIGNMENT == 0
    ends = [(f.offset, f.offset + f.nbytes) for f in fields.values()]
    assert all(a % 512 == 0 for a, _ in ends)
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(ends[:-1], ends[1:], strict=True))  # in order, no overlap
    assert ends[-1][1] <= size
    assert fields["combine_input"].shape == (4 + 1, 128, 1024)
    assert fields["expert_recv_count"].shape == (4, 4)
    assert fields["l1_acts"].shape[0] == d.num_ring_blocks * 256


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_experts=95), "multiple of num_ranks"),
    (dict(hidden=5000), "hidden=5000"),
    (dict(intermediate_hidden=256), "intermediate_hidden=256"),
    (dict(num_topk=33), "num_topk=33"),
    (dict(num_shared_experts=3), "num_shared_experts=3"),
    (dict(num_ranks=256), "num_ranks=256"),
    (dict(num_tokens=4096 * 1024), "2^24"),
])
def test_bad_configurations_refused(kwargs, message):
    args = dict(num_experts=96, hidden=5120, intermediate_hidden=2304, num_tokens=64)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message.replace("^", r"\^")):
        estimate_mega_moe(**args, arch="950DT")
    with pytest.raises(TypeError, match="num_tokens"):
        estimate_mega_moe(96, 5120, 2304, 64.0)
    with pytest.raises(ValueError, match="FP8"):
        estimate_mega_moe(96, 5120, 2304, 64, arch="910B2")


def test_cli(capsys):
    assert main(["96", "5120", "2304", "64", "--arch", "950DT"]) == 0
    assert "modelled" in capsys.readouterr().out
    assert main(["--published"]) == 0
    assert capsys.readouterr().out.count("published") == 4
    with pytest.raises(SystemExit) as e:
        main(["96", "5000", "2304", "64"])
    assert e.value.code == 2 and "hidden=5000" in capsys.readouterr().err
