"""EP dispatch / combine (deep_gemm.ep.ElasticBuffer) on R simulated ranks, bitwise against the numpy port of
DeepEP's reference functions: plain and expanded (psum layout) dispatch, bf16 and FP8-with-scales rows, -1 routes,
empty experts, a rank with no tokens, cached dispatch, cumulative stats, combine with and without bias."""

from __future__ import annotations

import numpy as np
import pytest

import deep_gemm
from deep_gemm.ep import ElasticBuffer, reference
from deep_gemm.testing import init_dist, spawn
from deep_gemm.utils.formats import BF16_DTYPE, FP8_DTYPE
from deep_gemm.utils.math import align


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint8).reshape(-1) if a.size else np.zeros(0, np.uint8)


def same(a, b, what):
    assert a.shape == b.shape, f"{what}: {a.shape} != {b.shape}"
    assert a.dtype == b.dtype, f"{what}: {a.dtype} != {b.dtype}"
    assert np.array_equal(bits(a), bits(b)), f"{what} differs"


def make_inputs(case: dict, num_ranks: int):
    """Every rank's inputs (the same on every rank: seeded)."""
    rng = np.random.default_rng(case["seed"])
    hidden, num_topk, num_experts = case["hidden"], case["num_topk"], case["num_experts"]
    banned = set(case.get("empty_experts", ()))
    allowed = np.array([e for e in range(num_experts) if e not in banned])
    xs, idxs, ws = [], [], []
    for r in range(num_ranks):
        t = case["tokens"][r % len(case["tokens"])]
        if case["fp8"]:
            codes = rng.integers(0, 0x7E, (t, hidden), dtype=np.uint8) | (rng.integers(0, 2, (t, hidden),
                                                                                      dtype=np.uint8) << 7)
            sf = np.exp2(rng.integers(-4, 5, (t, hidden // 128))).astype(np.float32)
            xs.append((codes.view(FP8_DTYPE), sf))
        else:
            xs.append(rng.standard_normal((t, hidden)).astype(BF16_DTYPE))
        idx = np.argsort(rng.random((t, allowed.size)), axis=1)[:, :num_topk]
        idx = allowed[idx].astype(np.int64)
        idx[rng.random((t, num_topk)) < case["masked"]] = -1
        w = rng.random((t, num_topk)).astype(np.float32)
        w[idx < 0] = 0
        idxs.append(idx)
        ws.append(w)
    return xs, idxs, ws


def route_data(src_token_global_idx, t_max, num_topk, hidden, num_ranks, seed=0):
    """Per-route expert outputs [N, K, H] bf16: DeepEP's generated rows, each element times +2^26, -2^26 or 1 (a
    hash of route and column), so that fp32 sums cancel and the accumulation order shows in the bits."""
    gen = reference.generate_pre_combine_data(src_token_global_idx, t_max, num_topk, hidden, num_ranks, seed)
    s = np.asarray(src_token_global_idx, np.int64)[:, None, None] * num_topk + np.arange(num_topk)[None, :, None]
    pick = (s * 2654435761 + np.arange(hidden) * 40503) % 3
    return (gen.astype(np.float32) * np.array([2.0 ** 26, -2.0 ** 26, 1.0], np.float32)[pick]).astype(BF16_DTYPE)


def run_cases(rank, num_ranks, cases):
    _, _, group = init_dist(rank, num_ranks)
    buffer = ElasticBuffer(group, num_max_tokens_per_rank=max(max(c["tokens"]) for c in cases), hidden=512,
                           num_topk=4)
    summary = []
    for case in cases:
        xs, idxs, ws = make_inputs(case, num_ranks)
        t_max, num_experts, num_topk, hidden = max(case["tokens"]), case["num_experts"], case["num_topk"], \
            case["hidden"]
        num_local = num_experts // num_ranks
        alignment = case["alignment"]
        x, topk_idx, topk_w = xs[rank], idxs[rank], ws[rank]
        ref_x, ref_idx, ref_w, ref_src, ref_counts = reference.dispatch(rank, xs, idxs, ws, t_max, num_experts)

        # Dispatch layout (local)
        per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, num_experts)
        owner = np.where(topk_idx >= 0, topk_idx // num_local, -1)
        assert np.array_equal(in_rank, (owner[:, :, None] == np.arange(num_ranks)).any(1))
        assert np.array_equal(per_rank, in_rank.sum(0))
        assert np.array_equal(per_expert, np.bincount(topk_idx[topk_idx >= 0], minlength=num_experts))

        # Plain dispatch: bitwise the reference, in ascending source order
        stats = np.zeros(num_local, np.int32)
        recv_x, recv_idx, recv_w, handle, event = buffer.dispatch(
            x, topk_idx=topk_idx, topk_weights=topk_w, num_experts=num_experts, num_max_tokens_per_rank=t_max,
            expert_alignment=alignment, cumulative_local_expert_recv_stats=stats)
        event.current_stream_wait()
        if case["fp8"]:
            same(recv_x[0], ref_x[0], "recv_x"), same(recv_x[1], ref_x[1], "recv_sf")
        else:
            same(recv_x, ref_x, "recv_x")
        same(recv_idx, ref_idx, "recv_topk_idx")
        same(recv_w, ref_w, "recv_topk_weights")
        same(handle.recv_src_metadata[:, 0], ref_src, "src_token_global_idx")
        assert np.array_equal(np.diff(handle.psum_num_recv_tokens_per_scaleup_rank, prepend=0), ref_counts)
        counts = np.array([(ref_idx == e).sum() for e in range(num_local)])
        assert np.array_equal(stats, counts)
        assert handle.num_recv_tokens_per_expert_list == [align(int(c), alignment) for c in counts]

        # Cached dispatch replays the routing
        cached_x, cached_idx, _, _, _ = buffer.dispatch(x, handle=handle)
        same(cached_x[0] if case["fp8"] else cached_x, ref_x[0] if case["fp8"] else ref_x, "cached recv_x")
        same(cached_idx, ref_idx, "cached recv_topk_idx")

        # Expanded dispatch: expert by expert in the psum layout, padding zero
        ex_x, ex_idx, ex_w, ex_handle, _ = buffer.dispatch(
            x, topk_idx=topk_idx, topk_weights=topk_w, num_experts=num_experts, num_max_tokens_per_rank=t_max,
            expert_alignment=alignment, do_expand=True, do_zero_padding=True)
        assert ex_idx is None
        psum = ex_handle.psum_num_recv_tokens_per_expert
        assert psum.dtype == np.int32 and psum.shape == (num_local,)
        ex_rows, ex_sf = ex_x if case["fp8"] else (ex_x, None)
        ref_rows, ref_sf = ref_x if case["fp8"] else (ref_x, None)
        assert ex_rows.shape[0] == ex_handle.num_expanded_tokens == sum(align(int(c), alignment) for c in counts)
        start = 0
        for e in range(num_local):
            j, k = np.nonzero(ref_idx == e)
            assert start % alignment == 0 and psum[e] == start + j.size
            same(ex_rows[start: psum[e]], ref_rows[j], f"expert {e} rows")
            if ex_sf is not None:
                same(ex_sf[start: psum[e]], ref_sf[j], f"expert {e} scales")
            same(ex_w[start: psum[e]], ref_w[j, k], f"expert {e} weights")
            end = align(int(psum[e]), alignment)
            assert not bits(ex_rows[psum[e]: end]).any() and not ex_w[psum[e]: end].any()
            assert np.array_equal(ex_handle.recv_src_metadata[j, 2 + k], np.arange(start, psum[e]))
            start = end
        assert (ex_handle.recv_src_metadata[:, 2:][ref_idx < 0] == -1).all()

        # Combine, expanded: each expanded row holds its route's generated output
        gen = route_data(ref_src, t_max, num_topk, hidden, num_ranks, case["seed"])
        expert_out = np.zeros((ex_handle.num_expanded_tokens, hidden), BF16_DTYPE)
        meta = ex_handle.recv_src_metadata[:, 2:]
        j, k = np.nonzero(meta >= 0)
        expert_out[meta[j, k]] = gen[j, k]
        num_tokens = topk_idx.shape[0]
        src_y = route_data(rank * t_max + np.arange(num_tokens), t_max, num_topk, hidden, num_ranks, case["seed"])
        src_y[topk_idx < 0] = 0
        bias = None
        if case.get("bias"):
            rng = np.random.default_rng(case["seed"] + rank)
            bias = tuple(rng.standard_normal((src_y.shape[0], hidden)).astype(BF16_DTYPE)
                         for _ in range(case["bias"]))
            bias = bias[0] if len(bias) == 1 else bias
        ref_y = reference.combine(src_y, topk_idx, num_experts, num_ranks, bias)
        y, y_w, _ = buffer.combine(expert_out, ex_handle, topk_weights=ex_w, bias=bias)
        same(y, ref_y, "combined (expanded)")
        same(y_w, topk_w, "combined topk weights (expanded)")

        # Combine, plain: one locally reduced row per received token
        local_gen = gen.copy()
        local_gen[recv_idx < 0] = 0
        y2, y2_w, _ = buffer.combine(reference.ordered_accumulate(local_gen), handle, topk_weights=recv_w, bias=bias)
        same(y2, ref_y, "combined (plain)")
        same(y2_w, topk_w, "combined topk weights (plain)")
        summary.append((int(handle.num_recv_tokens), int(ex_handle.num_expanded_tokens), counts.tolist()))
    buffer.destroy()
    return summary


CASES = [
    dict(seed=1, tokens=[24, 17, 0, 9], hidden=256, num_topk=4, num_experts=16, masked=0.2, alignment=8, fp8=False,
         empty_experts=(3, 12), bias=1),
    dict(seed=2, tokens=[12, 0, 30, 5], hidden=512, num_topk=2, num_experts=8, masked=0.3, alignment=1, fp8=True),
    dict(seed=3, tokens=[16, 16, 3, 16], hidden=128, num_topk=3, num_experts=8, masked=0.0, alignment=256,
         fp8=False, bias=2),
]


@pytest.mark.parametrize("num_ranks", [1, 2, 4, 8])
def test_dispatch_combine_bitwise(num_ranks):
    cases = [dict(c, num_experts=max(c["num_experts"], num_ranks)) for c in CASES]
    summaries = spawn(run_cases, num_ranks, cases, timeout=300)
    assert len(summaries) == num_ranks
    for c, case in enumerate(cases):
        # Every route arrives exactly once somewhere
        xs, idxs, _ = make_inputs(case, num_ranks)
        routes = sum(int((i >= 0).sum()) for i in idxs)
        assert sum(sum(s[c][2]) for s in summaries) == routes


def test_expanded_layout_is_the_grouped_gemm_psum_layout():
    """The expanded rows and psum feed the M-grouped GEMM contract: expert g's rows times its weights."""
    _, _, group = init_dist(0, 1)
    rng = np.random.default_rng(5)
    t, hidden, n, num_experts = 40, 128, 64, 4
    x = rng.standard_normal((t, hidden)).astype(BF16_DTYPE)
    topk_idx = np.stack([rng.permutation(num_experts)[:2] for _ in range(t)]).astype(np.int64)
    topk_idx[:5, 1] = -1
    buffer = ElasticBuffer(group)
    recv_x, _, _, handle, _ = buffer.dispatch(x, topk_idx=topk_idx, num_experts=num_experts, expert_alignment=256,
                                              do_expand=True)
    weights = rng.standard_normal((num_experts, n, hidden)).astype(BF16_DTYPE)
    d = np.zeros((recv_x.shape[0], n), BF16_DTYPE)
    deep_gemm.aclnn_m_grouped_bf16_gemm_nt_contiguous(recv_x, weights, d, handle.grouped_layout)
    start = 0
    for e in range(num_experts):
        tokens = np.nonzero((topk_idx == e).any(1))[0]
        end = int(handle.grouped_layout[e])
        assert end - start == tokens.size and start % 256 == 0
        want = x[tokens].astype(np.float64) @ weights[e].astype(np.float64).T
        np.testing.assert_allclose(d[start:end].astype(np.float64), want, rtol=2e-2, atol=2e-2)
        start = align(end, 256)


def test_bad_arguments_raise_before_sending():
    _, _, group = init_dist(0, 1)
    buffer = ElasticBuffer(group, num_max_tokens_per_rank=8)
    x = np.zeros((4, 64), BF16_DTYPE)
    idx = np.zeros((4, 2), np.int64)
    with pytest.raises(ValueError, match="num_experts"):
        buffer.dispatch(x, topk_idx=idx, num_experts=0)
    with pytest.raises(ValueError, match="topk_idx must lie"):
        buffer.dispatch(x, topk_idx=idx + 9, num_experts=8)
    with pytest.raises(ValueError, match="num_max_tokens_per_rank"):
        buffer.dispatch(np.zeros((9, 64), BF16_DTYPE), topk_idx=np.zeros((9, 2), np.int64), num_experts=8)
    with pytest.raises(ValueError, match="topk_weights"):
        buffer.dispatch(x, topk_idx=idx, topk_weights=np.zeros((4, 2), np.float64), num_experts=8)
    _, _, _, handle, _ = buffer.dispatch(x, topk_idx=idx, num_experts=8)
    with pytest.raises(ValueError, match="rows"):
        buffer.combine(np.zeros((3, 64), BF16_DTYPE), handle)
    with pytest.raises(ValueError, match="topk_idx=None"):
        buffer.dispatch(x, topk_idx=idx, handle=handle)


def test_torch_tensors_in_and_out():
    torch = pytest.importorskip("torch")
    _, _, group = init_dist(0, 1)
    buffer = ElasticBuffer(group)
    x = torch.randn(6, 64, dtype=torch.bfloat16)
    idx = torch.tensor([[0, 1], [1, -1], [2, 3], [3, 0], [-1, -1], [2, 1]], dtype=torch.int64)
    recv_x, recv_idx, _, handle, _ = buffer.dispatch(x, topk_idx=idx, num_experts=4)
    assert isinstance(recv_x, torch.Tensor) and recv_x.dtype == torch.bfloat16
    assert torch.equal(recv_x[:5], x[[0, 1, 2, 3, 5]]) and torch.equal(recv_idx, idx[[0, 1, 2, 3, 5]])
    y, _, _ = buffer.combine(recv_x, handle)
    assert isinstance(y, torch.Tensor) and torch.equal(y[[0, 1, 2, 3, 5]], x[[0, 1, 2, 3, 5]])
    assert not y[4].any()


def run_gloo(rank, num_ranks):
    _, _, group = init_dist(rank, num_ranks, backend="gloo")
    # a symmetric buffer over the torch group: remote stores through shared memory
    symm = deep_gemm.SymmetricBuffer(group, 64)
    symm.all[1 - rank, rank] = 10 + rank
    symm.barrier()
    stored = symm.local[:2].tolist()
    symm.close()
    case = dict(CASES[0], tokens=[10, 3], num_experts=8)
    xs, idxs, ws = make_inputs(case, num_ranks)
    ref_x, ref_idx, ref_w, ref_src, _ = reference.dispatch(rank, xs, idxs, ws, 10, 8)
    src_y = route_data(rank * 10 + np.arange(xs[rank].shape[0]), 10, case["num_topk"], case["hidden"], num_ranks)
    src_y[idxs[rank] < 0] = 0
    paths = []
    for use_shared_memory in (True, False):
        buffer = ElasticBuffer(group, num_max_tokens_per_rank=10)
        buffer.transport.uses_shared_memory = use_shared_memory  # NOTES: False takes the across-hosts path
        recv_x, recv_idx, recv_w, handle, _ = buffer.dispatch(xs[rank], topk_idx=idxs[rank], topk_weights=ws[rank],
                                                              num_experts=8)
        same(recv_x, ref_x, "recv_x"), same(recv_idx, ref_idx, "recv_idx"), same(recv_w, ref_w, "recv_w")
        gen = route_data(ref_src, 10, case["num_topk"], case["hidden"], num_ranks)
        gen[recv_idx < 0] = 0
        y, _, _ = buffer.combine(reference.ordered_accumulate(gen), handle)
        same(y, reference.combine(src_y, idxs[rank], 8, num_ranks), "combined")
        paths.append((type(buffer.group).__name__, buffer.transport.symm is not None))
        buffer.destroy()
    return stored, paths


def test_torch_gloo_group_two_processes():
    pytest.importorskip("torch")
    results = spawn(run_gloo, 2, timeout=300)
    assert [r[0] for r in results] == [[0, 11], [10, 0]]
    assert [r[1] for r in results] == [[("TorchGroup", True), ("TorchGroup", False)]] * 2


def test_combine_data_shows_the_accumulation_order():
    """The combine checks above can fail: on their data another order (no per-rank reduce, or ranks in rank order)
    changes the bits of some tokens."""
    case = dict(CASES[2], num_experts=8)
    num_ranks, t_max = 4, max(case["tokens"])
    _, idxs, _ = make_inputs(case, num_ranks)
    changed = 0
    for rank in range(num_ranks):
        idx = idxs[rank]
        y = route_data(rank * t_max + np.arange(idx.shape[0]), t_max, case["num_topk"], case["hidden"], num_ranks)
        y[idx < 0] = 0
        ref = reference.combine(y, idx, 8, num_ranks)
        flat = reference.combine(y, idx, 8, num_ranks, reduce_in_local=False)
        changed += int((ref.view(np.uint16) != flat.view(np.uint16)).any(axis=1).sum())
    assert changed > 0


def run_single_reduction(rank, num_ranks, cases):
    """Expanded combine under both allow_multiple_reduction settings, against upstream's two reference recipes."""
    _, _, group = init_dist(rank, num_ranks)
    t_cap = max(max(c["tokens"]) for c in cases)
    multi = ElasticBuffer(group, num_max_tokens_per_rank=t_cap, hidden=512, num_topk=4)
    single = ElasticBuffer(group, num_max_tokens_per_rank=t_cap, hidden=512, num_topk=4,
                           allow_multiple_reduction=False)
    assert multi.allow_multiple_reduction is True and single.allow_multiple_reduction is False
    changed = []
    for case in cases:
        xs, idxs, ws = make_inputs(case, num_ranks)
        t_max, num_experts, num_topk, hidden = max(case["tokens"]), case["num_experts"], case["num_topk"], \
            case["hidden"]
        x, topk_idx, topk_w = xs[rank], idxs[rank], ws[rank]
        num_tokens = topk_idx.shape[0]
        src_y = route_data(rank * t_max + np.arange(num_tokens), t_max, num_topk, hidden, num_ranks, case["seed"])
        src_y[topk_idx < 0] = 0
        bias = None
        if case.get("bias"):
            rng = np.random.default_rng(case["seed"] + rank)
            bias = tuple(rng.standard_normal((num_tokens, hidden)).astype(BF16_DTYPE) for _ in range(case["bias"]))
            bias = bias[0] if len(bias) == 1 else bias
        ref_multi = reference.combine(src_y, topk_idx, num_experts, num_ranks, bias)
        ref_single = reference.combine(src_y, topk_idx, num_experts, num_ranks, bias, reduce_in_local=False)
        changed.append(int((ref_multi.view(np.uint16) != ref_single.view(np.uint16)).any(axis=1).sum()))
        for buffer, ref, what in ((multi, ref_multi, "multiple"), (single, ref_single, "single")):
            _, _, ex_w, handle, _ = buffer.dispatch(
                x, topk_idx=topk_idx, topk_weights=topk_w, num_experts=num_experts, num_max_tokens_per_rank=t_max,
                expert_alignment=case["alignment"], do_expand=True)
            ref_src = handle.recv_src_metadata[:, 0]
            gen = route_data(ref_src, t_max, num_topk, hidden, num_ranks, case["seed"])
            expert_out = np.zeros((handle.num_expanded_tokens, hidden), BF16_DTYPE)
            meta = handle.recv_src_metadata[:, 2:]
            j, k = np.nonzero(meta >= 0)
            expert_out[meta[j, k]] = gen[j, k]
            y, y_w, _ = buffer.combine(expert_out, handle, bias=bias)
            same(y, ref, f"combined (expanded, {what} reduction)")
            assert y_w is None
            # A plain combine's rows are one per (token, rank) already: the same under both settings
            _, recv_idx, _, plain, _ = buffer.dispatch(x, topk_idx=topk_idx, num_experts=num_experts,
                                                       num_max_tokens_per_rank=t_max)
            gen[recv_idx < 0] = 0
            y2, _, _ = buffer.combine(reference.ordered_accumulate(gen), plain, bias=bias)
            same(y2, ref_multi, f"combined (plain, {what} reduction)")
    multi.destroy()
    single.destroy()
    return changed


@pytest.mark.parametrize("num_ranks", [2, 4])
def test_combine_without_multiple_reduction_bitwise(num_ranks):
    cases = [dict(c, num_experts=max(c["num_experts"], num_ranks)) for c in CASES]
    changed = spawn(run_single_reduction, num_ranks, cases, timeout=300)
    assert len(changed) == num_ranks
    # The two settings differ in the bits on this data, so each comparison above can fail
    assert sum(sum(c) for c in changed) > 0


def test_combine_without_multiple_reduction_refuses_bad_input():
    _, _, group = init_dist(0, 1)
    with pytest.raises(TypeError, match="allow_multiple_reduction"):
        ElasticBuffer(group, allow_multiple_reduction="no")
    buffer = ElasticBuffer(group, num_max_tokens_per_rank=8, hidden=64, num_topk=2, allow_multiple_reduction=False)
    x = np.ones((6, 64), BF16_DTYPE)
    idx = np.array([[0, 1], [1, -1], [2, 3], [3, 0], [-1, -1], [2, 1]], np.int64)
    w = np.full((6, 2), 0.5, np.float32)
    ex_x, _, ex_w, handle, _ = buffer.dispatch(x, topk_idx=idx, topk_weights=w, num_experts=4, do_expand=True)
    before = buffer.transport.symm.local.copy()
    with pytest.raises(ValueError, match="topk_weights=None"):
        buffer.combine(ex_x, handle, topk_weights=ex_w)
    with pytest.raises(ValueError, match="bias"):
        buffer.combine(ex_x, handle, bias=np.zeros((5, 64), BF16_DTYPE))
    assert np.array_equal(buffer.transport.symm.local, before)
    y, y_w, _ = buffer.combine(ex_x, handle)
    assert y_w is None
    same(y, np.array([[2], [1], [2], [2], [0], [2]], np.float32).repeat(64, 1).astype(BF16_DTYPE), "combined")
    buffer.destroy()
