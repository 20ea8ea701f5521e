"""fp8_fp4_mega_moe on simulated ranks (deep_gemm.testing.spawn), by default the fused kernel (one launch per rank and
call; DG_MEGA_MOE_FUSED=0 runs the host pipeline instead): bitwise equal to the unfused baseline (DeepEP
expanded dispatch, M-grouped FP8 x FP4 GEMM, SwiGLU + weight + FP8 cast, M-grouped GEMM, single-reduction combine)
and within tolerance of the float64 reference; the cumulative statistics; the ring waves; upstream's checks, each
refused before anything is written; the views and the buffer size; transform_weights_for_mega_moe's layout."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest

import deep_gemm
from deep_gemm.heuristics.mega_moe import MegaMoeDesc
from deep_gemm.testing import spawn
from deep_gemm.testing.mega_moe import baseline_moe, check_rank, make_case
from deep_gemm.utils.formats import BF16_DTYPE, FP8_DTYPE

# NOTES: H = I = 512 in every case, so all of them share four compiled GEMM specializations (routed L1 / L2, shared
# L1 / L2); the float64 reference differs from the kernel by the bf16 L1 output and the FP8 requantisation only.
TOLERANCE = 1e-3
CASES = {
    "R2-E8-top2": (2, dict(E=8, T=48, K=2, H=512, I=512, S=0, tokens=[48, 20])),
    "R4-E16-top6-shared": (4, dict(E=16, T=32, K=6, H=512, I=512, S=1, tokens=[32, 0, 17, 32], clamp=2.5,
                                   empty_expert=5)),
}


@pytest.fixture(scope="module")
def compiled():
    """One fused call and its baseline in this process first: the four GEMM specializations land in the disk cache
    once, and every rank process loads them from there instead of compiling them side by side."""
    check_rank(0, 1, dict(E=8, T=16, K=2, H=512, I=512, S=1))


def _check_rank_counted(local_rank: int, num_ranks: int, config: dict) -> dict:
    """check_rank, plus how many fused-kernel launches the rank made (two calls: 2 on the fused path, else 0)."""
    from deep_gemm.kernels import mega_moe as k_mm

    out = check_rank(local_rank, num_ranks, config)
    out["fused_launches"] = k_mm.FUSED_LAUNCHES
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_fused_equals_baseline_on_ranks(name, compiled):
    from deep_gemm.api.mega_moe import fused_enabled

    num_ranks, config = CASES[name]
    results = spawn(_check_rank_counted, num_ranks, config, timeout=600)
    local = config["E"] // num_ranks
    for rank, r in enumerate(results):
        assert r["bitwise"] == [True, True], (name, rank)
        assert r["fused_launches"] == (2 if fused_enabled() else 0), (name, rank)
        assert all(d < TOLERANCE for d in r["diff"]), (name, rank, r["diff"])
        assert r["finite"]
        assert np.array_equal(r["stats"], sum(r["recv"])), (name, rank)  # two calls accumulated
        assert len(r["recv"][0]) == local
    # every route arrived somewhere: the ranks' received routes sum to the routed (non -1) ones
    total = sum(int(sum(r["recv"][0])) for r in results)
    assert total > 0
    if "empty_expert" in config:
        e = config["empty_expert"]
        assert all(results[e // local]["recv"][c][e % local] == 0 for c in range(2))


@pytest.mark.slow
def test_fused_equals_baseline_hidden_1024():
    """hidden 1024 (four more GEMM specializations, compiled in this process first)."""
    config = dict(E=16, T=32, K=4, H=1024, I=512, S=1, tokens=[32, 25])
    check_rank(0, 1, dict(config, E=8, T=8, tokens=[8]))
    results = spawn(check_rank, 2, config, timeout=1800)
    assert all(r["bitwise"] == [True, True] and max(r["diff"]) < TOLERANCE for r in results)


def test_fused_equals_baseline_on_a_gloo_group(compiled):
    """The same run with a torch.distributed gloo ProcessGroup as ``group`` (upstream's argument type); in the default
    run, since the README's test command installs torch (the ranks load the kernels the fixture compiled)."""
    pytest.importorskip("torch")
    num_ranks, config = CASES["R2-E8-top2"]
    results = spawn(check_rank, num_ranks, config, timeout=900, backend="gloo")
    assert all(r["bitwise"] == [True, True] and max(r["diff"]) < TOLERANCE for r in results)


# ---------------------------------------------------------------------------------------------------------------
# One rank, in this process
# ---------------------------------------------------------------------------------------------------------------
E, T, K, H, I, S = 8, 32, 2, 512, 512, 1


@pytest.fixture(scope="module")
def one_rank():
    case = make_case(0, 1, E, T, K, H, I, S, seed=3)
    sym = deep_gemm.SymmBuffer(None, E, T, K, H, I, S)
    sym.x[:T], sym.x_sf[:T], sym.topk_idx[:T], sym.topk_weights[:T] = (
        case.x, case.x_sf, case.topk_idx, case.topk_weights)
    l1, l2 = deep_gemm.transform_weights_for_mega_moe(case.l1, case.l2)
    s1, s2 = deep_gemm.transform_weights_for_mega_moe(case.shared_l1, case.shared_l2)
    return case, sym, l1, l2, s1, s2


def test_views_size_and_base(one_rank):
    _, sym, *_ = one_rank
    size, slicer = deep_gemm.get_symm_buffer_size_for_mega_moe(1, E, T, K, H, I, "fp8xfp4", "swiglu", S)
    assert size == sym.num_bytes and size % (2 << 20) == 0
    views = slicer(np.zeros(size, np.uint8))
    assert len(views) == 13
    assert (sym.x.dtype, sym.x.shape) == (FP8_DTYPE, (T, H))
    assert (sym.x_sf.dtype, sym.x_sf.shape) == (np.int16, (T, H // 64))
    assert (sym.topk_idx.dtype, sym.topk_idx.shape) == (np.int64, (T, K))
    assert (sym.topk_weights.dtype, sym.topk_weights.shape) == (np.float32, (T, K))
    assert sym.shared_l1_acts is sym.x and sym.shared_l2_acts.shape == (T, S * I)
    assert sym.expert_recv_count.shape == (1, E) and sym.l1_acts.shape[1] == H and sym.l2_acts.shape[1] == I
    assert np.shares_memory(sym.x, sym.buffer_ptrs[0])
    smaller = deep_gemm.SymmBuffer(None, E, T // 2, K, H, I, S, base=sym)
    assert np.shares_memory(smaller.x, sym.buffer)
    with pytest.raises(ValueError, match="needs"):
        deep_gemm.SymmBuffer(None, E, 64 * T, 8, H, 4 * I, 2, base=sym)


def test_transformed_weights_layout(one_rank):
    case, _, l1, l2, s1, s2 = one_rank
    assert l1[0].shape == (E, I // 128, 256, H // 2) and l1[1].shape == (E, I // 128, H // 64, 256)
    assert l2[0].shape == (E, H // 256, 256, I // 2) and l2[1].dtype == np.int16
    assert s1[0].shape == (S * I // 128, 256, H) and s1[0].dtype == FP8_DTYPE
    # block 0 holds gate rows 0..127 then up rows I..I+127; scale exponents + 6, transposed to [K/64, 256]
    assert np.array_equal(l1[0][0, 0, :128], case.l1[0][0, :128])
    assert np.array_equal(l1[0][0, 0, 128:], case.l1[0][0, I:I + 128])
    raw = case.l1[1][0, :128].view(np.uint16)
    got = l1[1][0, 0, :, :128].T.view(np.uint16)
    assert np.array_equal(got & 0xFF, (raw & 0xFF) + 6) and np.array_equal(got >> 8, (raw >> 8) + 6)
    # shared FP8 in NZ order: the first 32 bytes of row 1 follow those of row 0
    assert np.array_equal(s1[0].reshape(-1)[32:64].view(np.uint8), case.shared_l1[0][1, :32].view(np.uint8))
    bad = case.l1[1].copy()
    bad.view(np.uint16)[0, 0, 0] = 250
    with pytest.raises(ValueError, match="249, 254"):
        deep_gemm.transform_weights_for_mega_moe((case.l1[0], bad), case.l2)


def test_ring_waves_and_torch(one_rank, monkeypatch):
    """Rings of one 256-row block: the host pipeline's routes run in several waves, bitwise as in one; the fused
    kernel on that other buffer layout (its field offsets are runtime arguments) with y as a CPU torch tensor."""
    case, _, l1, l2, s1, s2 = one_rank
    monkeypatch.setattr(MegaMoeDesc, "num_ring_blocks", property(lambda self: 1))
    monkeypatch.setenv("DG_MEGA_MOE_FUSED", "0")
    sym = deep_gemm.SymmBuffer(None, E, T, K, H, I, S)
    sym.x[:T], sym.x_sf[:T], sym.topk_idx[:T], sym.topk_weights[:T] = (
        case.x, case.x_sf, case.topk_idx, case.topk_weights)
    assert sym.l1_acts.shape[0] == 256
    y = np.empty((T, H), BF16_DTYPE)
    deep_gemm.fp8_fp4_mega_moe(y, l1, l2, sym, s1, s2)
    yb, _ = baseline_moe(None, case, E, T)
    assert np.array_equal(y.view(np.uint16), yb.view(np.uint16))
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("DG_MEGA_MOE_FUSED", "1")
    yt = torch.empty((T, H), dtype=torch.bfloat16)
    deep_gemm.fp8_fp4_mega_moe(yt, l1, l2, sym, s1, s2)
    assert np.array_equal(yt.view(torch.int16).numpy().view(np.uint16), y.view(np.uint16))


def _bad_calls(case, sym, l1, l2, s1, s2, y, stats):
    wrong_l1 = (l1[0][:, :-1].copy(), l1[1][:, :-1].copy())
    return [
        (dict(recipe=(1, 128, 128)), ValueError, "recipe"),
        (dict(fast_math=False), ValueError, "fast_math"),
        (dict(activation="geglu"), ValueError, "activation"),
        (dict(activation_clamp=-1.0), ValueError, "activation_clamp"),
        (dict(y=np.empty((T, H), np.float32)), TypeError, "bfloat16"),
        (dict(y=np.empty((T + 1, H), BF16_DTYPE)), ValueError, "num_max_tokens_per_rank"),
        (dict(l1_weights=wrong_l1), ValueError, "l1_weights"),
        (dict(shared_l1_weights=None), ValueError, "shared weights"),
        (dict(cumulative_local_expert_recv_stats=np.zeros(E, np.int64)), ValueError, "cumulative"),
        (dict(sym_buffer=object()), TypeError, "SymmBuffer"),
    ]


def test_bad_input_refused_before_any_write(one_rank):
    case, sym, l1, l2, s1, s2 = one_rank
    y = np.full((T, H), 7, BF16_DTYPE)
    stats = np.full(E, 3, np.int32)
    before = sym.symmetric.all.copy()
    base = dict(y=y, l1_weights=l1, l2_weights=l2, sym_buffer=sym, shared_l1_weights=s1, shared_l2_weights=s2,
                cumulative_local_expert_recv_stats=stats)
    for change, error, message in _bad_calls(case, sym, l1, l2, s1, s2, y, stats):
        with pytest.raises(error, match=message):
            deep_gemm.fp8_fp4_mega_moe(**dict(base, **change))
    with deep_gemm.runtime_scope(num_ai_cores=16):
        with pytest.raises(ValueError, match="32 AI cores"):
            deep_gemm.fp8_fp4_mega_moe(**base)
    sym.topk_idx[0, 0] = E
    with pytest.raises(ValueError, match="expert indices"):
        deep_gemm.fp8_fp4_mega_moe(**base)
    sym.topk_idx[0, 0] = case.topk_idx[0, 0]
    assert np.array_equal(sym.symmetric.all, before)
    assert (y.astype(np.float32) == 7).all() and (stats == 3).all()


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_shared_experts=3), "num_shared_experts=3"),
    (dict(hidden=500), "hidden=500"),
    (dict(intermediate_hidden=256), "intermediate_hidden=256"),
    (dict(num_topk=33), "num_topk=33"),
    (dict(num_experts=0), "num_experts=0"),
    (dict(mma_type="fp8xfp8"), "mma_type"),
])
def test_buffer_configuration_refused(kwargs, message):
    args = dict(num_experts=E, num_max_tokens_per_rank=T, num_topk=K, hidden=H, intermediate_hidden=I)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        deep_gemm.SymmBuffer(None, **args)
    with pytest.raises(ValueError, match="2\\^24"):
        deep_gemm.get_symm_buffer_size_for_mega_moe(2, 16, 2**20, 16, H, I)


def test_example_moe_layer_runs(compiled):
    """examples/moe_layer.py (linked from the README) runs as a user runs it: two ranks, checked against float64."""
    example = pathlib.Path(__file__).resolve().parents[2] / "examples" / "moe_layer.py"
    run = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.count("calc_diff vs float64") == 2, run.stdout
