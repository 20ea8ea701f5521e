"""Paged MQA logits: get_paged_mqa_logits_metadata (equal shares, the core count recorded), build_paged_kv_cache in
both layouts, fp8_fp4_paged_mqa_logits against float64 references and bitwise against the ragged kernel on the same
keys (both layouts, page sizes 64 and 128, non-contiguous block tables, next_n 1 and 2, FP8 and FP4), bitwise equal
on 1 and 32 cores, and bad input refused before anything is written.

NOTES: kernels compiled here: paged FP8 and FP4 on 32 cores, and the synchronisation checker's ragged and paged FP8
kernels on 1 core (the ragged FP8 / FP4 kernels of test_mqa_logits.py are shared through the session cache).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import deep_gemm
from deep_gemm.heuristics.mqa import PAGED_SPLIT_KV, paged_atom_tokens
from deep_gemm.testing import calc_diff
from deep_gemm.utils import per_token_cast_to_fp8
from deep_gemm.utils.math import cast_back_from_fp4, per_token_cast_to_fp4

E4M3 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16


def block_table(rng, batch, max_pages, num_blocks):
    """A non-contiguous table: every row's pages drawn without repetition from a shuffled pool."""
    pool = rng.permutation(num_blocks)[:batch * max_pages]
    return pool.reshape(batch, max_pages).astype(np.int32)


def make_problem(rng, batch, next_n, num_heads, head_dim, ctx, kind="fp8", cuda_scales=True):
    """Dense keys per batch row [B, L, D] quantized (FP8: a per-key fp32 scale when cuda_scales, else UE8M0 per
    32; FP4: UE8M0 per 32), q [B, next_n, H, D], weights; plus the exact and dequantized values."""
    length = int(np.max(ctx)) if np.size(ctx) else 0
    q = rng.standard_normal((batch * next_n * num_heads, head_dim)).astype(np.float32)
    k = rng.standard_normal((batch * length, head_dim)).astype(np.float32)
    w = rng.standard_normal((batch * next_n, num_heads)).astype(BF16)
    if kind == "fp8":
        qc = q.astype(E4M3)
        q_pair, qd = (qc.reshape(batch, next_n, num_heads, head_dim), None), qc.astype(np.float64)
        if cuda_scales:
            kc, ksf = per_token_cast_to_fp8(k, use_ue8m0=False, gran_k=head_dim)
            kd = kc.astype(np.float64) * ksf
            kv_sf = ksf[:, 0].reshape(batch, length)
        else:
            kc, ksf = per_token_cast_to_fp8(k, use_ue8m0=True, gran_k=32)
            kd = kc.astype(np.float64) * np.repeat(ksf, 32, axis=1)
            kv_sf = ksf.reshape(batch, length, head_dim // 32)
        kv = (kc.reshape(batch, length, head_dim), kv_sf)
    else:
        q4, qsf = per_token_cast_to_fp4(q, use_ue8m0=True, gran_k=32)
        k4, ksf = per_token_cast_to_fp4(k, use_ue8m0=True, gran_k=32)
        q_pair = (q4.reshape(batch, next_n, num_heads, head_dim // 2), qsf.reshape(batch, next_n, num_heads, -1))
        qd = cast_back_from_fp4(q4, qsf, gran_k=32)
        kd = cast_back_from_fp4(k4, ksf, gran_k=32)
        kv = (k4.reshape(batch, length, head_dim // 2), ksf.reshape(batch, length, -1))
    shape = (batch, next_n, num_heads, head_dim)
    return q_pair, kv, w, (q.reshape(shape), k.reshape(batch, length, head_dim)), \
        (qd.reshape(shape), kd.reshape(batch, length, head_dim))


def reference(q, k, w, ctx):
    """float64 [B * next_n, max ctx]: row (b, t), key j < ctx[b, t]; NaN elsewhere (undefined)."""
    batch, next_n = ctx.shape
    length = k.shape[1]
    scores = np.einsum("bthd,bjd->bthj", np.asarray(q, np.float64), np.asarray(k, np.float64))
    logits = (np.maximum(scores, 0) * np.asarray(w, np.float64).reshape(batch, next_n, -1, 1)).sum(axis=2)
    valid = np.arange(length)[None, None, :] < ctx[:, :, None]
    return np.where(valid, logits, np.nan).reshape(batch * next_n, length)


def valid_diff(got, ref):
    mask = ~np.isnan(ref)  # entries past a token's context are undefined (left as allocated)
    return calc_diff(got[:, :ref.shape[1]][mask].astype(np.float64), ref[mask])


def ragged_equivalent(q_pair, kv, w, ctx):
    """The same logits through the ragged kernel: every row's keys one after another, row (b, t) over its own keys,
    compressed so column j is key j of its batch row."""
    batch, next_n = ctx.shape
    values, sf = kv
    length = values.shape[1]
    ks = np.repeat(np.arange(batch) * length, next_n).astype(np.int32)
    ke = (ks + ctx.reshape(-1)).astype(np.int32)
    qv, qsf = q_pair
    q_flat = (qv.reshape(batch * next_n, *qv.shape[2:]), None if qsf is None else qsf.reshape(batch * next_n,
                                                                                               *qsf.shape[2:]))
    kv_flat = (values.reshape(batch * length, -1), sf.reshape(batch * length, *sf.shape[2:]))
    return deep_gemm.fp8_fp4_mqa_logits(q_flat, kv_flat, w, ks, ke, max_seqlen_k=length, clean_logits=False)


def run_paged(rng, q_pair, kv, w, ctx, page_size, ascend, num_heads):
    batch = ctx.shape[0]
    length = kv[0].shape[1]
    max_pages = -(-length // page_size) + 1
    num_blocks = batch * max_pages + 3
    table = block_table(rng, batch, max_pages, num_blocks)
    cache = deep_gemm.build_paged_kv_cache(kv, table, num_blocks, page_size, use_ascend_kv_layout=ascend)
    meta = deep_gemm.get_paged_mqa_logits_metadata(ctx, num_heads)
    return deep_gemm.fp8_fp4_paged_mqa_logits(q_pair, cache, w, ctx, table, meta, length,
                                              use_ascend_kv_layout=ascend)


@pytest.mark.parametrize("page_size", [64, 128])
@pytest.mark.parametrize("ascend", [True, False])
def test_paged_fp8_both_layouts(rng, page_size, ascend):
    batch, next_n, num_heads, head_dim = 3, 1, 64, 128
    ctx = np.array([[300], [0], [517]], np.int32)  # a row without context, partial pages and units
    q_pair, kv, w, exact, deq = make_problem(rng, batch, next_n, num_heads, head_dim, ctx, cuda_scales=not ascend)
    logits = run_paged(rng, q_pair, kv, w, ctx, page_size, ascend, num_heads)
    # the row stride padded to 512 bytes: 517 -> 768 elements
    assert logits.dtype == BF16 and logits.shape == (3, 517) and logits.strides == (768 * 2, 2)
    assert valid_diff(logits, reference(*exact, w, ctx)) < 1e-3
    assert valid_diff(logits, reference(*deq, w, ctx)) < 5e-6
    ragged = ragged_equivalent(q_pair, kv, w, ctx)
    for i in range(batch):
        n = ctx[i, 0]
        np.testing.assert_array_equal(logits[i, :n].view(np.uint16), ragged[i, :n].view(np.uint16))


def test_paged_next_n_2(rng):
    batch, next_n, num_heads, head_dim = 4, 2, 8, 64
    assert paged_atom_tokens(next_n, num_heads) == 2  # both tokens of a row in one MAD
    ctx = np.array([[65, 66], [129, 130], [0, 1], [400, 401]], np.int32)
    q_pair, kv, w, exact, deq = make_problem(rng, batch, next_n, num_heads, head_dim, ctx)
    logits = run_paged(rng, q_pair, kv, w, ctx, 64, False, num_heads)
    assert valid_diff(logits, reference(*exact, w, ctx)) < 1e-3
    assert valid_diff(logits, reference(*deq, w, ctx)) < 5e-6
    ragged = ragged_equivalent(q_pair, kv, w, ctx)
    for i, n in enumerate(ctx.reshape(-1)):
        np.testing.assert_array_equal(logits[i, :n].view(np.uint16), ragged[i, :n].view(np.uint16))


@pytest.mark.parametrize("ascend", [True, False])
def test_paged_fp4(rng, ascend):
    batch, next_n, num_heads, head_dim = 2, 1, 16, 128
    ctx = np.array([[200], [333]], np.int32)
    q_pair, kv, w, exact, deq = make_problem(rng, batch, next_n, num_heads, head_dim, ctx, kind="fp4")
    logits = run_paged(rng, q_pair, kv, w, ctx, 128 if ascend else 64, ascend, num_heads)
    assert valid_diff(logits, reference(*exact, w, ctx)) < 0.02
    assert valid_diff(logits, reference(*deq, w, ctx)) < 5e-6
    ragged = ragged_equivalent(q_pair, kv, w, ctx)
    for i in range(batch):
        np.testing.assert_array_equal(logits[i, :ctx[i, 0]].view(np.uint16), ragged[i, :ctx[i, 0]].view(np.uint16))


@pytest.mark.parametrize("cores", [1, 7, 32])
@pytest.mark.parametrize("next_n,num_heads", [(1, 64), (2, 8), (3, 64)])
def test_metadata_equal_shares(rng, cores, next_n, num_heads):
    ctx = rng.integers(0, 3000, (37, next_n)).astype(np.int32)
    ctx[5] = 0
    atom = paged_atom_tokens(next_n, num_heads)
    units = [-(-int(ctx[b, t0:t0 + atom].max()) // PAGED_SPLIT_KV) for b in range(37) for t0 in range(0, next_n, atom)]
    starts = np.concatenate([[0], np.cumsum(units)])
    with deep_gemm.runtime_scope(num_ai_cores=cores):
        meta = deep_gemm.get_paged_mqa_logits_metadata(ctx, num_heads)
    assert meta.dtype == np.int32 and meta.shape == (cores + 1, 2)
    assert tuple(meta[-1]) == (len(units), 0)
    position = [int(starts[a] + s) for a, s in meta]  # each core's first unit in the flat order
    shares = np.diff(position)
    assert position[0] == 0 and position[-1] == starts[-1]
    assert shares.max() - shares.min() <= 1
    for a, s in meta[:-1]:
        assert a == len(units) or 0 <= s < max(units[a], 1)


def test_metadata_cuda_call_form():
    ctx = np.array([[300], [5]], np.int32)
    with deep_gemm.runtime_scope(num_ai_cores=4):
        meta = deep_gemm.get_paged_mqa_logits_metadata(ctx, 64)
        np.testing.assert_array_equal(deep_gemm.get_paged_mqa_logits_metadata(ctx, 64, 4), meta)  # num_sms
        with pytest.raises(ValueError, match="num_sms=32"):
            deep_gemm.get_paged_mqa_logits_metadata(ctx, 64, 32)
        # DeepGEMM-Ascend's varlen form: one atom per token, the schedule of [T, 1] context lengths
        np.testing.assert_array_equal(deep_gemm.get_paged_mqa_logits_metadata(ctx, 64, np.arange(2, dtype=np.int32)),
                                      meta)
        with pytest.raises(ValueError, match="num_heads=66"):
            deep_gemm.get_paged_mqa_logits_metadata(ctx, 66)


def test_build_paged_kv_cache_layouts(rng):
    batch, head_dim, page_size = 2, 64, 64
    ctx = np.array([[70], [64]], np.int32)
    _, kv, _, _, _ = make_problem(rng, batch, 1, 4, head_dim, ctx, cuda_scales=True)
    table = np.array([[3, 0], [1, 2]], np.int32)
    cuda = deep_gemm.build_paged_kv_cache(kv, table, 4, page_size)
    assert cuda.shape == (4, 64, 1, head_dim + 4) and cuda.dtype == np.uint8
    page = cuda[0].reshape(-1)  # row 0's keys 64..69
    np.testing.assert_array_equal(page[:6 * head_dim], kv[0][0, 64:70].view(np.uint8).reshape(-1))
    np.testing.assert_array_equal(page[64 * head_dim:64 * head_dim + 24].view(np.float32), kv[1][0, 64:70])
    assert not page[6 * head_dim:64 * head_dim].any()
    _, kv_mx, _, _, _ = make_problem(rng, batch, 1, 4, head_dim, ctx, cuda_scales=False)
    ascend = deep_gemm.build_paged_kv_cache(kv_mx, table, 4, page_size, use_ascend_kv_layout=True)
    assert ascend.shape == (4, 64, 1, head_dim + 2)
    token = ascend[3, 5, 0]  # row 0, key 5: its values, then its two UE8M0 exponents
    np.testing.assert_array_equal(token[:head_dim], kv_mx[0][0, 5].view(np.uint8))
    np.testing.assert_array_equal(token[head_dim:], (kv_mx[1][0, 5].view(np.uint32) >> 23).astype(np.uint8))
    with pytest.raises(ValueError, match=r"block_table\[1, 0\]=3 is also block_table\[0, 0\]"):
        deep_gemm.build_paged_kv_cache(kv, np.array([[3, 0], [3, 2]], np.int32), 4, page_size)


def _paged_bad_cases():
    rng = np.random.default_rng(3)
    batch, num_heads, head_dim, page_size = 2, 8, 64, 64
    ctx = np.array([[100], [64]], np.int32)
    q_pair, kv, w, _, _ = make_problem(rng, batch, 1, num_heads, head_dim, ctx)
    table = np.array([[0, 1], [2, 3]], np.int32)
    cache = deep_gemm.build_paged_kv_cache(kv, table, 4, page_size)
    meta = deep_gemm.get_paged_mqa_logits_metadata(ctx, num_heads)
    args = [q_pair, cache, w, ctx, table, meta, 100]

    def with_(i, value):
        out = list(args)
        out[i] = value
        return out

    past = table.copy()
    past[1, 0] = 4
    with deep_gemm.runtime_scope(num_ai_cores=7):
        meta7 = deep_gemm.get_paged_mqa_logits_metadata(ctx, num_heads)
    stale = deep_gemm.get_paged_mqa_logits_metadata(np.array([[600], [64]], np.int32), num_heads)
    return {
        "block table past the cache": (with_(4, past), ValueError, r"block_table\[1, 0\]=4 points past the cache's 4"),
        "context beyond max_context_len": (with_(6, 80), ValueError, r"context_lens\[0, 0\]=100 exceeds "
                                                                     r"max_context_len=80"),
        "metadata for 7 cores": (with_(5, meta7), ValueError, "built for 7 AI cores"),
        "metadata of other context lens": (with_(5, stale), ValueError, r"schedule_meta\[\d+\]"),
        "cache dtype": (with_(1, cache.view(np.int8)), TypeError, "kv_cache.dtype=int8"),
        "cache strides": (with_(1, np.asfortranarray(cache)), ValueError, "kv_cache.strides"),
        "cache width": (with_(1, np.ascontiguousarray(cache[..., :60])), ValueError,
                        r"kv_cache.shape=\(4, 64, 1, 60\)"),
        "heads": (with_(0, (np.zeros((2, 1, 6, 64), E4M3), None)), ValueError, "num_heads=6"),
        "weights shape": (with_(2, w[:, :4]), ValueError, r"weights.shape=\(2, 4\)"),
        "context dtype": (with_(3, ctx.astype(np.float32)), TypeError, "context_lens.dtype=float32"),
        "negative context": (with_(3, -ctx), ValueError, r"context_lens\[\(0, 0\)\]=-100 is negative"),
        "clean_logits (CUDA position)": (args + [True], ValueError, "clean_logits=True is not supported"),
    }


PAGED_BAD = _paged_bad_cases()


@pytest.mark.parametrize("case", sorted(PAGED_BAD))
def test_paged_bad_input(case):
    args, error, pattern = PAGED_BAD[case]
    snapshot = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    with pytest.raises(error, match=pattern):
        deep_gemm.fp8_fp4_paged_mqa_logits(*args)
    for a, b in zip(args, snapshot, strict=True):  # the cache, the table and the metadata untouched
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_sync_checker_and_1_vs_32_cores(monkeypatch, rng):
    """Both MQA templates under DG_SYNC_CHECK=1 (every SetFlag / WaitFlag and cross-core flag recorded and checked;
    a protocol error raises SyncCheckError) on 1 logical core, bitwise equal to the plain kernels on 32 cores (other
    schedules and paged metadata; the checker only records flags)."""
    from deep_gemm import envs

    # ragged: FP8, CUDA form, ragged and empty ranges
    seq_len, seq_len_kv, num_heads, head_dim = 40, 520, 4, 64
    q = rng.standard_normal((seq_len, num_heads, head_dim)).astype(E4M3)
    kv, kv_sf = per_token_cast_to_fp8(rng.standard_normal((seq_len_kv, head_dim)).astype(np.float32), False, 64)
    w = rng.standard_normal((seq_len, num_heads)).astype(BF16)
    ks = rng.integers(0, 300, seq_len).astype(np.int32)
    ke = np.minimum(ks + rng.integers(0, 300, seq_len), seq_len_kv).astype(np.int32)
    ks[3] = ke[3] = 17
    # paged: both layouts, next_n 2
    ctx = np.array([[150, 151], [0, 1], [70, 71]], np.int32)
    pq, pkv, pw, _, _ = make_problem(rng, 3, 2, 8, 64, ctx, cuda_scales=False)
    pq_c, pkv_c, pw_c, _, _ = make_problem(rng, 3, 2, 8, 64, ctx, cuda_scales=True)
    state = rng.bit_generator.state
    outs = {}
    for cores, check in ((32, "0"), (1, "1")):
        monkeypatch.setenv(envs.DG_SYNC_CHECK.name, check)
        with deep_gemm.runtime_scope(num_ai_cores=cores):
            rng.bit_generator.state = state  # the same block tables
            outs[cores] = (deep_gemm.fp8_fp4_mqa_logits((q, None), (kv, kv_sf[:, 0].copy()), w, ks, ke),
                           run_paged(rng, pq, pkv, pw, ctx, 64, True, 8),
                           run_paged(rng, pq_c, pkv_c, pw_c, ctx, 128, False, 8))
    np.testing.assert_array_equal(outs[1][0].view(np.uint16), outs[32][0].view(np.uint16))
    for k in (1, 2):
        for i, n in enumerate(ctx.reshape(-1)):
            np.testing.assert_array_equal(outs[1][k][i, :n].view(np.uint16), outs[32][k][i, :n].view(np.uint16))
