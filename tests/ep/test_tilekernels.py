"""TileKernels' MoE helpers (deep_gemm.ep.tilekernels) against straightforward per-route loops: the fused mapping's
contract (upstream's own checks), expand with and without scales, the ordered FMA reduce, the SwiGLU + weight +
per-token FP8 cast; and the exact fp32 fused multiply-add they rest on."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import deep_gemm
from deep_gemm.ep import tilekernels as tk
from deep_gemm.utils.formats import BF16_DTYPE, FP8_DTYPE


def routing(seed, num_tokens=37, num_topk=4, num_experts=8, masked=0.2, banned=(5,)):
    rng = np.random.default_rng(seed)
    allowed = np.array([e for e in range(num_experts) if e not in banned])
    idx = allowed[np.argsort(rng.random((num_tokens, allowed.size)), axis=1)[:, :num_topk]].astype(np.int64)
    idx[rng.random(idx.shape) < masked] = -1
    return idx


def bits_equal(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(
        np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


# ------------------------------------------------------------------------------------------------------------------
# get_fused_mapping


@pytest.mark.parametrize("alignment", [1, 16, 64])
def test_get_fused_mapping_contract(alignment):
    idx = routing(alignment)
    num_tokens, num_topk = idx.shape
    (p2e, p2t, p2tk, tk2p, start, end, per_expert, per_expert_list) = tk.get_fused_mapping(idx, 8, 0, alignment)
    assert per_expert.tolist() == per_expert_list
    pos = 0
    for e in range(8):
        routes = [(t, k) for t in range(num_tokens) for k in range(num_topk) if idx[t, k] == e]
        n = -(-len(routes) // alignment) * alignment
        assert start[e] == pos and end[e] == pos + n and per_expert[e] == n
        # ascending (token, slot) order, then padding
        assert [(p2t[pos + i], p2tk[pos + i] % num_topk) for i in range(len(routes))] == routes
        assert (p2e[pos: pos + len(routes)] == e).all() and (p2e[pos + len(routes): pos + n] == -1).all()
        pos += n
    assert p2e.shape == (pos,)
    live = p2e >= 0
    t, k = p2tk[live] // num_topk, p2tk[live] % num_topk
    assert np.array_equal(tk2p[t, k], np.nonzero(live)[0]) and np.array_equal(idx[t, k], p2e[live])
    assert np.array_equal(p2t[live], t) and ((p2t < 0) == ~live).all() and ((p2tk < 0) == ~live).all()
    assert (tk2p[idx < 0] == -1).all()
    # a given size keeps its padding positions (-1) and leaves the list empty
    sized = tk.get_fused_mapping(idx, 8, pos + 40, alignment)
    assert sized[0].shape == (pos + 40,) and (sized[0][pos:] == -1).all() and sized[7] == []
    assert np.array_equal(sized[3], tk2p)
    with pytest.raises(ValueError, match="num_expanded_tokens"):
        tk.get_fused_mapping(idx, 8, 1, alignment)


def test_get_fused_mapping_bad_input():
    with pytest.raises(TypeError, match="int64"):
        tk.get_fused_mapping(np.zeros((2, 2), np.int32), 4, 0, 8)
    with pytest.raises(ValueError, match="topk_idx must lie"):
        tk.get_fused_mapping(np.full((2, 2), 4, np.int64), 4, 0, 8)
    empty = tk.get_fused_mapping(np.zeros((0, 2), np.int64), 4, 0, 8)
    assert empty[0].shape == (0,) and empty[3].shape == (0, 2) and empty[7] == [0, 0, 0, 0]


# ------------------------------------------------------------------------------------------------------------------
# expand_to_fused(_with_sf)


@pytest.mark.parametrize("col_major", [False, True])
def test_expand_to_fused_with_sf(col_major):
    idx = routing(3)
    rng = np.random.default_rng(0)
    p2e, _, _, tk2p, *_ = tk.get_fused_mapping(idx, 8, 0, 32)
    data = rng.integers(0, 0x7E, (idx.shape[0], 256), dtype=np.uint8).view(FP8_DTYPE)
    sf = rng.random((idx.shape[0], 2)).astype(np.float32)
    out, out_sf = tk.expand_to_fused_with_sf((data, sf), 128, tk2p, p2e, use_tma_aligned_col_major_sf=col_major)
    plain = tk.expand_to_fused(data, tk2p, p2e)
    want = np.zeros((p2e.size, 256), np.uint8)
    want_sf = np.zeros((p2e.size, 2), np.float32)
    for t in range(idx.shape[0]):
        for k in range(idx.shape[1]):
            if tk2p[t, k] >= 0:
                want[tk2p[t, k]] = data[t].view(np.uint8)
                want_sf[tk2p[t, k]] = sf[t]
    assert bits_equal(out.view(np.uint8), want) and bits_equal(plain.view(np.uint8), want)
    assert np.array_equal(out_sf, want_sf)
    if col_major:
        assert out_sf.strides[0] == 4 and out_sf.strides[1] == 4 * (-(-p2e.size // 4) * 4)


# ------------------------------------------------------------------------------------------------------------------
# fma_fp32 and reduce_fused


def correctly_rounded(a, b, c, r):
    """r is the RNE fp32 rounding of the exact a*b + c."""
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    lo = np.nextafter(r, np.float32(-np.inf))
    hi = np.nextafter(r, np.float32(np.inf))
    d = abs(exact - Fraction(float(r)))
    d_lo, d_hi = abs(exact - Fraction(float(lo))), abs(exact - Fraction(float(hi)))
    if d < d_lo and d < d_hi:
        return True
    return (d == d_lo or d == d_hi) and d <= min(d_lo, d_hi) and int(np.float32(r).view(np.uint32)) % 2 == 0


def test_fma_fp32_is_correctly_rounded():
    rng = np.random.default_rng(1)
    a = (rng.standard_normal(3000) * np.exp2(rng.integers(-10, 10, 3000))).astype(np.float32)
    b = rng.standard_normal(3000).astype(np.float32)
    c = (-(a.astype(np.float64) * b) * (1 + rng.standard_normal(3000) * 1e-6)).astype(np.float32)  # cancellation
    r = tk.fma_fp32(a, b, c)
    assert all(correctly_rounded(*v) for v in zip(a, b, c, r, strict=True))
    # float64 midpoint ties that naive (float64 sum -> float32) double rounding gets wrong: r odd, exact value just
    # below the midpoint to its even neighbour
    base = np.float32(1.0) + np.float32(2.0 ** -23)  # odd mantissa
    ulp = np.float32(2.0 ** -23)
    a = np.float32(1 + 2.0 ** -20) * np.float32(ulp / 2)
    b = np.float32(1 - 2.0 ** -20)
    naive = np.float32(np.float64(a) * np.float64(b) + np.float64(base))
    fused = tk.fma_fp32(a, b, base)
    assert correctly_rounded(a, b, base, fused) and fused == base and naive != base


@pytest.mark.parametrize("with_sf", [False, True])
def test_reduce_fused_ordered_fma(with_sf):
    idx = routing(4)
    rng = np.random.default_rng(2)
    p2e, _, _, tk2p, *_ = tk.get_fused_mapping(idx, 8, 0, 16)
    x = rng.standard_normal((p2e.size, 256)).astype(BF16_DTYPE)
    w = rng.random(idx.shape).astype(np.float32)
    row_sf = np.exp2(rng.integers(-3, 3, p2e.size)).astype(np.float32)
    arg = (x, row_sf) if with_sf else x
    got = tk.reduce_fused(arg, w, tk2p)
    want = np.zeros((idx.shape[0], 256), np.float32)
    for t in range(idx.shape[0]):
        for k in range(idx.shape[1]):
            p = tk2p[t, k]
            if p >= 0:
                s = w[t, k] * (row_sf[p] if with_sf else np.float32(1))
                want[t] = tk.fma_fp32(x[p].astype(np.float32), np.float32(s), want[t])
    assert bits_equal(got, want.astype(BF16_DTYPE))
    # FP8 output with a scale, written into out
    out = np.zeros((idx.shape[0], 256), FP8_DTYPE)
    scale = np.array([0.25], np.float32)
    assert tk.reduce_fused(arg, w, tk2p, fp8_format="e4m3", sf=scale, out=out) is out
    assert bits_equal(out, (want * scale[0]).astype(FP8_DTYPE))
    with pytest.raises(ValueError, match="sf"):
        tk.reduce_fused(arg, w, tk2p, sf=scale)
    with pytest.raises(ValueError, match="hidden % 256"):
        tk.reduce_fused(x[:, :128], w, tk2p)


# ------------------------------------------------------------------------------------------------------------------
# swiglu_forward_and_per_token_cast


def swiglu_cast_reference(x, npc, p2tk, w, p2e, clamp, round_sf):
    """One row at a time, one block at a time, as TileKernels' torch reference composes swiglu_forward and cast."""
    n, hidden = x.shape[0], x.shape[1] // 2
    q = np.zeros((n, hidden), FP8_DTYPE)
    sf = np.zeros((n, hidden // npc), np.float32)
    for i in range(n):
        g, u = x[i, :hidden].astype(np.float32), x[i, hidden:].astype(np.float32)
        if clamp is not None:
            g, u = np.minimum(g, np.float32(clamp)), np.clip(u, np.float32(-clamp), np.float32(clamp))
        y = g / (np.float32(1) + np.exp(-g)) * u
        if p2tk is not None:
            y = y * (w.reshape(-1)[p2tk[i]] if p2tk[i] >= 0 else np.float32(0))
        if p2e is not None and p2e[i] < 0:
            y = np.zeros_like(y)
        for b in range(hidden // npc):
            blk = y[b * npc:(b + 1) * npc]
            amax = max(np.float32(np.abs(blk).max()), np.float32(1e-4))
            s = np.float32(amax / np.float32(448))
            if round_sf:
                s = np.uint32((int(np.float32(s).view(np.uint32)) + 0x7FFFFF) & 0x7F800000).view(np.float32)
                inv = np.float32(1) / s
            else:
                inv = np.float32(448) / amax
            q[i, b * npc:(b + 1) * npc] = np.clip(blk * inv, np.float32(-448), np.float32(448)).astype(FP8_DTYPE)
            sf[i, b] = s
    return q, sf


@pytest.mark.parametrize("npc,round_sf,clamp,with_weights", [
    (128, True, None, True), (128, False, 0.5, False), (256, True, 10.0, True), (32, True, 2.0, True)])
def test_swiglu_forward_and_per_token_cast(npc, round_sf, clamp, with_weights):
    idx = routing(5)
    rng = np.random.default_rng(6)
    p2e, _, p2tk, _, *_ = tk.get_fused_mapping(idx, 8, 0, 16)
    x = (rng.standard_normal((p2e.size, 512)) * 3).astype(BF16_DTYPE)
    w = rng.random(idx.shape).astype(np.float32)
    count = np.zeros(3, np.int64) if clamp is not None else None
    q, sf = tk.swiglu_forward_and_per_token_cast(
        x, "e4m3", npc, pos_to_token_topk=p2tk if with_weights else None, topk_weights=w if with_weights else None,
        pos_to_expert=p2e, round_sf=round_sf, swiglu_clamp_value=clamp, clamped_count=count)
    want_q, want_sf = swiglu_cast_reference(x, npc, p2tk if with_weights else None, w, p2e, clamp, round_sf)
    assert bits_equal(q, want_q) and bits_equal(sf, want_sf)
    if clamp is not None:
        v = x.astype(np.float32)
        assert count.tolist() == [int((v[:, :256] > clamp).sum()), int((v[:, 256:] > clamp).sum()),
                                  int((v[:, 256:] < -clamp).sum())]
    if round_sf:
        assert not (sf.view(np.uint32) & 0x807FFFFF).any()  # powers of two


def test_swiglu_cast_packed_ue8m0_layout():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((10, 2048)).astype(BF16_DTYPE)
    q, sf = tk.swiglu_forward_and_per_token_cast(x, "e4m3", 128, round_sf=True)
    q2, packed = tk.swiglu_forward_and_per_token_cast(x, "e4m3", 128, round_sf=True,
                                                      use_tma_aligned_col_major_sf=True, use_packed_ue8m0=True)
    assert bits_equal(q, q2) and packed.shape == (10, 2) and packed.dtype == np.int32 and packed.strides == (4, 48)
    exponents = np.stack([(packed >> (8 * i)) & 0xFF for i in range(4)], axis=-1).reshape(10, 8)
    assert np.array_equal(exponents, sf.view(np.uint32) >> 23)
    with pytest.raises(ValueError, match="round_sf"):
        tk.swiglu_forward_and_per_token_cast(x, "e4m3", 128, use_packed_ue8m0=True)
    with pytest.raises(ValueError, match="num_per_channels"):
        tk.swiglu_forward_and_per_token_cast(x, "e4m3", 64)


def test_exported_with_torch():
    torch = pytest.importorskip("torch")
    idx = torch.from_numpy(routing(8))
    p2e, p2t, p2tk, tk2p, *_ = deep_gemm.get_fused_mapping(idx, 8, 0, 16)
    assert isinstance(tk2p, torch.Tensor) and tk2p.dtype == torch.int32
    x = torch.randn(idx.shape[0], 256, dtype=torch.bfloat16)
    y = deep_gemm.reduce_fused(deep_gemm.expand_to_fused(x, tk2p, p2e), None, tk2p)
    ones = (idx >= 0).sum(1, keepdim=True).to(torch.float32)
    assert torch.equal(y, (x.float() * ones).to(torch.bfloat16))
