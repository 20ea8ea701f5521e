"""The fused mega MoE kernel (templates/mega_moe.asc.j2): one mixed launch per rank and call does the dispatch, both
rank barriers, the pull, L1, the SwiGLU-quant epilogue, L2, the push and the combine, bitwise equal to the unfused
baseline, without the host pipeline's M-grouped GEMM launches; the host pipeline (DG_MEGA_MOE_FUSED=0) still gives
the same bits; a rank barrier that times out raises a clear error instead of hanging. The multi-rank cases are
tests/ep/test_mega_moe.py's (the fused kernel is the default). Every case has H = I = 512: one build of the kernel
serves them all (ranks, experts, top-k and tokens are runtime arguments)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from deep_gemm.api import mega_moe as api_mm
from deep_gemm.heuristics.mega_moe import MegaMoeDesc, workspace_layout
from deep_gemm.kernels import mega_moe as k_mm
from deep_gemm.testing.mega_moe import check_rank, make_case
from deep_gemm.utils.formats import BF16_DTYPE

ONE_RANK = dict(E=8, T=16, K=2, H=512, I=512, S=1)


def _refuse_routed_host_gemms(*args, **kwargs):
    raise AssertionError("the fused path ran a host GEMM for the routed experts")


def test_fused_kernel_one_rank(monkeypatch):
    """Two calls (other routes the second time) on one buffer: bitwise the baseline, two launches, no host GEMM."""
    monkeypatch.setenv("DG_MEGA_MOE_FUSED", "1")
    monkeypatch.setattr(api_mm, "_gemm", _refuse_routed_host_gemms)
    before = k_mm.FUSED_LAUNCHES
    r = check_rank(0, 1, ONE_RANK)
    assert r["bitwise"] == [True, True], r
    assert all(d < 1e-3 for d in r["diff"]), r["diff"]
    assert np.array_equal(r["stats"], sum(r["recv"]))
    assert k_mm.FUSED_LAUNCHES == before + 2


def test_host_pipeline_still_bitwise(monkeypatch):
    monkeypatch.setenv("DG_MEGA_MOE_FUSED", "0")
    before = k_mm.FUSED_LAUNCHES
    r = check_rank(0, 1, ONE_RANK)
    assert r["bitwise"] == [True, True], r
    assert k_mm.FUSED_LAUNCHES == before


def test_switch_refuses_bad_value(monkeypatch):
    monkeypatch.setenv("DG_MEGA_MOE_FUSED", "maybe")  # (envs.py: 1/0, true/false, yes/no, on/off)
    with pytest.raises(ValueError, match="DG_MEGA_MOE_FUSED"):
        api_mm.fused_enabled()
    with pytest.raises(ValueError, match="seconds"):
        k_mm.set_barrier_timeout(0)


def test_rank_barrier_timeout_raises():
    """Rank 0 of a two-rank buffer whose rank 1 never calls: the first barrier times out, the kernel skips every
    later phase (y untouched) and the launch raises MegaMoeBarrierTimeout naming the barrier and the missing rank."""
    moe = MegaMoeDesc(2, 8, 0, 16, 2, 512, 512)
    fields, size = workspace_layout(moe)
    all_bytes = np.zeros((2, size), np.uint8)
    views = k_mm.RankViews.of(moe, 0, all_bytes)
    case = make_case(0, 2, 8, 16, 2, 512, 512, 0, seed=1)
    views.x[:16], views.x_sf[:16] = case.x.view(np.uint8), case.x_sf
    views.topk_idx[:16], views.topk_weights[:16] = case.topk_idx, case.topk_weights
    l1, l2 = api_mm.transform_weights_for_mega_moe(case.l1, case.l2)
    ws = k_mm.FusedWorkspace.of(moe, 32)
    y = np.full((16, 512), 3, BF16_DTYPE)
    previous = k_mm.set_barrier_timeout(1.5)
    try:
        start = time.monotonic()
        with pytest.raises(k_mm.MegaMoeBarrierTimeout, match="rank barrier 1 of 2 timed out after 1.5 s waiting "
                                                             "for rank 1"):
            k_mm.launch_fused(all_bytes, 0, moe, ws, api_mm._fused_weights(l1), api_mm._fused_weights(l2), y, 16,
                              float("inf"), None)
        assert time.monotonic() - start >= 1.5
    finally:
        k_mm.set_barrier_timeout(previous)
    assert (y.astype(np.float32) == 3).all()
    # rank 0 did arrive: its epoch is in both ranks' signal word for rank 0
    sync = all_bytes[:, fields["sync"].offset:fields["sync"].offset + 8 * 6].view(np.int64)
    assert sync[0, 0] == 1 and sync[1, 0] == 1 and sync[0, 1] == 0
