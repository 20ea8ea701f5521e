"""The MQA-logits calling conventions of DeepGEMM-Ascend and CUDA DeepGEMM (issue 23): the paged varlen form
(``indices``, for the logits and the metadata), float32 logits (``logits_dtype``, numpy and torch dtypes), head_dim 32
and page size 32; against the float64 references and bitwise against the existing forms.

NOTES: kernels compiled here: none of their own; the shapes reuse the ragged FP8 kernel (block_q, head counts and
head dims are runtime values of one kernel), the paged FP8 ones of next_n = 1 and 2 and the synchronisation checker's
on 1 core (test_mqa_logits.py / test_paged_mqa_logits.py, shared through the session cache).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from test_mqa_logits import check_logits, fp8_cuda_inputs, reference
from test_paged_mqa_logits import block_table, make_problem, ragged_equivalent, run_paged, valid_diff
from test_paged_mqa_logits import reference as paged_reference

import deep_gemm
from deep_gemm.utils import per_token_cast_to_fp8

E4M3 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16


def bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint16 if x.dtype == BF16 else np.uint32)


def rounded(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bits, round to nearest even (ml_dtypes' cast)."""
    return x.astype(BF16).view(np.uint16)


# ---------------------------------------------------------------------------------------------------------------
# float32 logits


def test_ragged_fp32_logits_are_the_sums_bf16_rounds(rng):
    seq_len, seq_len_kv, num_heads, head_dim = 37, 300, 4, 64
    q, kv, w, (qx, kvx), (qd, kvd, scale) = fp8_cuda_inputs(rng, seq_len, seq_len_kv, num_heads, head_dim)
    ks = rng.integers(0, 150, seq_len).astype(np.int32)
    ke = np.minimum(ks + rng.integers(0, 200, seq_len), seq_len_kv).astype(np.int32)
    ks[2] = ke[2] = 9  # an empty range
    bf = deep_gemm.fp8_fp4_mqa_logits(q, kv, w, ks, ke)
    f32 = deep_gemm.fp8_fp4_mqa_logits(q, kv, w, ks, ke, logits_dtype=np.float32)
    assert f32.dtype == np.float32 and f32.shape == (seq_len, seq_len_kv)
    assert f32.strides == (384 * 4, 4)  # the row stride padded to 512 bytes: 300 -> 384 fp32 elements
    check_logits(f32, reference(qx, kvx, None, w, ks, ke), 1e-3)
    check_logits(f32, reference(qd, kvd, scale, w, ks, ke), 5e-6)
    np.testing.assert_array_equal(rounded(f32), bits(bf))  # -inf (clean_logits) included
    # the default is DeepGEMM-Ascend's bf16; ml_dtypes' bfloat16 names it
    np.testing.assert_array_equal(bits(deep_gemm.fp8_fp4_mqa_logits(q, kv, w, ks, ke, logits_dtype=BF16)), bits(bf))
    # compressed, without cleaning: the entries written are the same sums
    length = int((ke - ks).max())
    comp = deep_gemm.fp8_fp4_mqa_logits(q, kv, w, ks, ke, max_seqlen_k=length, clean_logits=False,
                                        logits_dtype=np.dtype(np.float32))
    for i in range(seq_len):
        np.testing.assert_array_equal(bits(comp[i, :ke[i] - ks[i]]), bits(f32[i, ks[i]:ke[i]]))


def test_paged_fp32_logits_and_varlen_fp32(rng):
    batch, num_heads, head_dim = 3, 64, 128
    ctx = np.array([[300], [0], [517]], np.int32)
    q_pair, kv, w, exact, deq = make_problem(rng, batch, 1, num_heads, head_dim, ctx)
    state = rng.bit_generator.state
    bf = run_paged(rng, q_pair, kv, w, ctx, 64, False, num_heads)
    rng.bit_generator.state = state  # the same block table
    f32 = run_paged_dtype(rng, q_pair, kv, w, ctx, 64, False, num_heads, np.float32)
    assert f32.dtype == np.float32 and f32.shape == (3, 517) and f32.strides == (640 * 4, 4)
    assert valid_diff(f32, paged_reference(*exact, w, ctx)) < 1e-3
    assert valid_diff(f32, paged_reference(*deq, w, ctx)) < 5e-6
    for i, n in enumerate(ctx[:, 0]):
        np.testing.assert_array_equal(rounded(f32[i, :n]), bits(bf[i, :n]))


def run_paged_dtype(rng, q_pair, kv, w, ctx, page_size, ascend, num_heads, logits_dtype, **kwargs):
    """run_paged with a logits dtype (the same block table for the same rng state)."""
    batch, length = ctx.shape[0], kv[0].shape[1]
    max_pages = -(-length // page_size) + 1
    num_blocks = batch * max_pages + 3
    table = block_table(rng, batch, max_pages, num_blocks)
    cache = deep_gemm.build_paged_kv_cache(kv, table, num_blocks, page_size, use_ascend_kv_layout=ascend)
    meta = deep_gemm.get_paged_mqa_logits_metadata(ctx, num_heads)
    return deep_gemm.fp8_fp4_paged_mqa_logits(q_pair, cache, w, ctx, table, meta, length,
                                              use_ascend_kv_layout=ascend, logits_dtype=logits_dtype, **kwargs)


def test_torch_dtype_objects(rng):
    torch = pytest.importorskip("torch")
    seq_len, seq_len_kv, num_heads, head_dim = 5, 40, 4, 64
    q, kv, w, _, _ = fp8_cuda_inputs(rng, seq_len, seq_len_kv, num_heads, head_dim)
    ks = np.zeros(seq_len, np.int32)
    ke = np.full(seq_len, seq_len_kv, np.int32)
    f32 = deep_gemm.fp8_fp4_mqa_logits(q, kv, w, ks, ke, logits_dtype=torch.float32)
    assert f32.dtype == np.float32
    np.testing.assert_array_equal(bits(deep_gemm.fp8_fp4_mqa_logits(q, kv, w, ks, ke, logits_dtype=torch.float)),
                                  bits(f32))
    bf = deep_gemm.fp8_fp4_mqa_logits(q, kv, w, ks, ke, logits_dtype=torch.bfloat16)
    assert bf.dtype == BF16
    np.testing.assert_array_equal(rounded(f32), bits(bf))
    # torch tensors in: a float32 torch tensor out, the same values
    t = deep_gemm.fp8_fp4_mqa_logits((torch.from_numpy(q[0].view(np.uint8)).view(torch.float8_e4m3fn), None),
                                     (torch.from_numpy(kv[0].view(np.uint8)).view(torch.float8_e4m3fn),
                                      torch.from_numpy(kv[1])), torch.from_numpy(w.astype(np.float32)),
                                     torch.from_numpy(ks), torch.from_numpy(ke), logits_dtype=torch.float32)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
    np.testing.assert_array_equal(t.numpy().view(np.uint32), bits(f32))
    with pytest.raises(TypeError, match="logits_dtype=torch.float16 must be float32 or bfloat16"):
        deep_gemm.fp8_fp4_mqa_logits(q, kv, w, ks, ke, logits_dtype=torch.float16)


@pytest.mark.parametrize("bad", [np.float16, np.int8, "float64", None])
def test_logits_dtype_refused(bad):
    q = (np.zeros((2, 4, 64), E4M3), None)
    kv = (np.zeros((8, 64), E4M3), np.ones(8, np.float32))
    w = np.ones((2, 4), np.float32)
    ks, ke = np.zeros(2, np.int32), np.full(2, 8, np.int32)
    with pytest.raises(TypeError, match="logits_dtype=.* must be float32 or bfloat16"):
        deep_gemm.fp8_fp4_mqa_logits(q, kv, w, ks, ke, logits_dtype=bad)
    cache = np.zeros((1, 64, 1, 68), np.uint8)
    ctx = np.array([[8]], np.int32)
    meta = deep_gemm.get_paged_mqa_logits_metadata(ctx, 4)
    with pytest.raises(TypeError, match="logits_dtype"):
        deep_gemm.fp8_fp4_paged_mqa_logits((np.zeros((1, 1, 4, 64), E4M3), None), cache, w[:1], ctx,
                                           np.zeros((1, 1), np.int32), meta, 8, logits_dtype=bad)


# ---------------------------------------------------------------------------------------------------------------
# The paged varlen form (indices)


def varlen_problem(rng, tokens_per_request, request_ctx, num_heads, head_dim, page_size, ascend):
    """DeepGEMM-Ascend's varlen test data: request r has tokens_per_request[r] query tokens, token o of it sees
    request_ctx[r] + o keys of the request's own keys; indices = the request of each token; block_table and
    context_lens per token (the request's row repeated)."""
    tokens = np.asarray(tokens_per_request)
    num_req = tokens.size
    indices = np.repeat(np.arange(num_req), tokens).astype(np.int32)
    offsets = np.concatenate([np.arange(n) for n in tokens])
    ctx = (np.repeat(request_ctx, tokens) + offsets).astype(np.int32)[:, None]
    length = int(ctx.max())
    num_tokens = int(tokens.sum())
    k = rng.standard_normal((num_req * length, head_dim)).astype(np.float32)
    kc, ksf = per_token_cast_to_fp8(k, use_ue8m0=ascend, gran_k=32 if ascend else head_dim)
    kd = kc.astype(np.float64) * (np.repeat(ksf, 32, axis=1) if ascend else ksf)
    kv_sf = ksf.reshape(num_req, length, -1) if ascend else ksf[:, 0].reshape(num_req, length)
    max_pages = -(-length // page_size)
    num_blocks = num_req * max_pages + 2
    table = rng.permutation(num_blocks)[:num_req * max_pages].reshape(num_req, max_pages).astype(np.int32)
    cache = deep_gemm.build_paged_kv_cache((kc.reshape(num_req, length, head_dim), kv_sf), table, num_blocks,
                                           page_size, use_ascend_kv_layout=ascend)
    q = rng.standard_normal((num_tokens, 1, num_heads, head_dim)).astype(E4M3)
    w = rng.standard_normal((num_tokens, num_heads)).astype(BF16)
    # float64 reference: token t over the keys of its request, j < ctx[t]
    keys = kd.reshape(num_req, length, head_dim)[indices]  # [T, L, D]
    ref = paged_reference(q.astype(np.float64), keys, w, ctx)
    return q, cache, w, ctx, table[indices], indices, ref


@pytest.mark.parametrize("ascend,page_size", [(False, 64), (True, 32)])
def test_varlen_against_reference_and_per_token_rows(rng, ascend, page_size):
    num_heads, head_dim = 64, 128
    q, cache, w, ctx, table, indices, ref = varlen_problem(rng, [3, 1, 2, 4], [300, 0, 517, 63], num_heads,
                                                           head_dim, page_size, ascend)
    meta = deep_gemm.get_paged_mqa_logits_metadata(ctx, num_heads, indices)
    np.testing.assert_array_equal(meta, deep_gemm.get_paged_mqa_logits_metadata(ctx, num_heads))
    max_len = int(ctx.max())
    logits = deep_gemm.fp8_fp4_paged_mqa_logits((q, None), cache, w, ctx, table, meta, max_len, indices, ascend)
    assert logits.dtype == BF16 and logits.shape == (indices.size, max_len)
    assert valid_diff(logits, ref) < 5e-6
    # bitwise that of the call without indices (every token its own batch row) ...
    plain = deep_gemm.fp8_fp4_paged_mqa_logits((q, None), cache, w, ctx, table, meta, max_len,
                                               use_ascend_kv_layout=ascend)
    # ... and of each token alone, on another core count (another schedule)
    with deep_gemm.runtime_scope(num_ai_cores=3):
        alone = []
        for t in range(indices.size):
            m = deep_gemm.get_paged_mqa_logits_metadata(ctx[t:t + 1], num_heads, indices[t:t + 1])
            alone.append(deep_gemm.fp8_fp4_paged_mqa_logits((q[t:t + 1], None), cache, w[t:t + 1], ctx[t:t + 1],
                                                            table[t:t + 1], m, max_len, indices[t:t + 1], ascend))
    for t, n in enumerate(ctx[:, 0]):
        np.testing.assert_array_equal(bits(logits[t, :n]), bits(plain[t, :n]))
        np.testing.assert_array_equal(bits(logits[t, :n]), bits(alone[t][0, :n]))
    # fp32 logits in the varlen form: the sums the bf16 ones round
    f32 = deep_gemm.fp8_fp4_paged_mqa_logits((q, None), cache, w, ctx, table, meta, max_len, indices=indices,
                                             use_ascend_kv_layout=ascend, logits_dtype=np.float32)
    for t, n in enumerate(ctx[:, 0]):
        np.testing.assert_array_equal(rounded(f32[t, :n]), bits(logits[t, :n]))


def test_varlen_cuda_legacy_name(rng):
    num_heads, head_dim = 64, 128
    q, cache, w, ctx, table, indices, ref = varlen_problem(rng, [2, 2], [100, 200], num_heads, head_dim, 64, False)
    meta = deep_gemm.get_paged_mqa_logits_metadata(ctx, num_heads, indices=indices)
    got = deep_gemm.fp8_paged_mqa_logits(q, cache, w, ctx, table, meta, int(ctx.max()), False, indices)
    assert valid_diff(got, ref) < 5e-6


def _varlen_bad_cases():
    rng = np.random.default_rng(5)
    num_heads = 64
    q, cache, w, ctx, table, indices, _ = varlen_problem(rng, [2, 3], [70, 130], num_heads, 128, 64, False)
    meta = deep_gemm.get_paged_mqa_logits_metadata(ctx, num_heads, indices)
    args = [(q, None), cache, w, ctx, table, meta, int(ctx.max()), indices]

    def with_(i, value):
        out = list(args)
        out[i] = value
        return out

    negative = indices.copy()
    negative[3] = -1
    other_row = table.copy()
    other_row[1, 1] = table[1, 1] + 1 if table[1, 1] + 1 < cache.shape[0] else 0
    longer = ctx.copy()
    longer[0, 0] = ctx[1, 0] + 1  # token 0 sees past its request's last token (token 1)
    longer_meta = deep_gemm.get_paged_mqa_logits_metadata(longer, num_heads)
    q2 = np.zeros((2, 2, num_heads, 128), E4M3)
    return {
        "indices length": (with_(7, indices[:4]), ValueError, r"indices.shape=\(4,\) must be \(5,\)"),
        "indices dtype": (with_(7, indices.astype(np.float32)), TypeError, "indices.dtype=float32"),
        "negative index": (with_(7, negative), ValueError, r"indices\[3\]=-1 is negative"),
        "block table row differs": (with_(4, other_row), ValueError,
                                    r"block_table\[1, 1\]=\d+ differs from block_table\[0, 1\]=\d+: tokens of one "
                                    r"request \(indices\[1\]=0"),
        "context past the request's": ([args[0], cache, w, longer, table, longer_meta, int(longer.max()), indices],
                                       ValueError, r"context_lens\[0\]=\d+ exceeds context_lens\[1\]"),
        "next_n 2": ([(q2, None), cache, w[:4], ctx[:2].repeat(2, 1), table[:2],
                      deep_gemm.get_paged_mqa_logits_metadata(ctx[:2].repeat(2, 1), num_heads), 200,
                      indices[:2]], ValueError, r"with indices \(varlen mode\) q must be \[num_tokens, 1"),
    }


VARLEN_BAD = _varlen_bad_cases()


@pytest.mark.parametrize("case", sorted(VARLEN_BAD))
def test_varlen_bad_input(case):
    args, error, pattern = VARLEN_BAD[case]
    with pytest.raises(error, match=pattern):
        deep_gemm.fp8_fp4_paged_mqa_logits(*args)


def test_varlen_metadata_refusals():
    ctx = np.array([[5], [6], [7]], np.int32)
    with pytest.raises(ValueError, match=r"indices\[1\]=-2 is negative"):
        deep_gemm.get_paged_mqa_logits_metadata(ctx, 8, np.array([0, -2, 1], np.int32))
    with pytest.raises(ValueError, match=r"indices.shape=\(2,\) must be \(3,\)"):
        deep_gemm.get_paged_mqa_logits_metadata(ctx, 8, np.array([0, 1], np.int32))
    with pytest.raises(ValueError, match=r"with indices \(varlen mode\) it must be \[num_tokens, 1\]"):
        deep_gemm.get_paged_mqa_logits_metadata(np.ones((3, 2), np.int32), 8, np.zeros(3, np.int32))


# ---------------------------------------------------------------------------------------------------------------
# head_dim 32 and page size 32


def test_head_dim_32_ragged(rng):
    seq_len, seq_len_kv, num_heads, head_dim = 37, 300, 4, 32
    q, kv, w, (qx, kvx), (qd, kvd, scale) = fp8_cuda_inputs(rng, seq_len, seq_len_kv, num_heads, head_dim)
    ks = np.zeros(seq_len, np.int32)
    ke = (np.arange(seq_len) * 8 + 4).astype(np.int32)
    logits = deep_gemm.fp8_fp4_mqa_logits(q, kv, w, ks, ke)
    check_logits(logits, reference(qx, kvx, None, w, ks, ke), 1e-3)
    check_logits(logits, reference(qd, kvd, scale, w, ks, ke), 5e-6)
    # the MX forms: one UE8M0 scale per row (fp32 [.., 1], int16 [.., 1] with the exponent in the low byte)
    qm, q_sf = per_token_cast_to_fp8(qx.reshape(-1, head_dim), use_ue8m0=True, gran_k=32)
    km, k_sf = per_token_cast_to_fp8(kvx, use_ue8m0=True, gran_k=32)
    qm = qm.reshape(seq_len, num_heads, head_dim)
    mx = deep_gemm.fp8_fp4_mqa_logits((qm, q_sf.reshape(seq_len, num_heads, 1)), (km, k_sf), w, ks, ke)
    deq_q = (qm.astype(np.float64) * q_sf.reshape(seq_len, num_heads, 1))
    check_logits(mx, reference(deq_q, km.astype(np.float64) * k_sf, None, w, ks, ke), 5e-6)
    exps = lambda sf: ((sf.view(np.uint32) >> 23).astype(np.int16))  # noqa: E731
    packed = deep_gemm.fp8_fp4_mqa_logits((qm, exps(q_sf).reshape(seq_len, num_heads, 1)), (km, exps(k_sf)), w,
                                          ks, ke)
    np.testing.assert_array_equal(bits(packed), bits(mx))
    with pytest.raises(ValueError, match="head_dim=32 with packed FP4"):
        deep_gemm.fp8_fp4_mqa_logits((np.zeros((2, 4, 16), np.int8), np.ones((2, 4, 1), np.float32)),
                                     (np.zeros((8, 16), np.int8), np.ones((8, 1), np.float32)), w[:2], ks[:2], ke[:2])


@pytest.mark.parametrize("ascend", [False, True])
def test_head_dim_32_and_page_32_paged(rng, ascend):
    batch, num_heads, head_dim = 3, 64, 32
    ctx = np.array([[300], [1], [95]], np.int32)
    q_pair, kv, w, exact, deq = make_problem(rng, batch, 1, num_heads, head_dim, ctx, cuda_scales=not ascend)
    logits = run_paged(rng, q_pair, kv, w, ctx, 32, ascend, num_heads)
    # NOTES: against the unquantized inputs the error is the quantization's: UE8M0 scales per 32 values (Ascend
    # layout) lose up to a bit more than an fp32 scale per key does at head_dim 32
    assert valid_diff(logits, paged_reference(*exact, w, ctx)) < (2e-3 if ascend else 1e-3)
    assert valid_diff(logits, paged_reference(*deq, w, ctx)) < 5e-6
    ragged = ragged_equivalent(q_pair, kv, w, ctx)
    page64 = run_paged(rng, q_pair, kv, w, ctx, 64, ascend, num_heads)
    for i, n in enumerate(ctx[:, 0]):
        np.testing.assert_array_equal(bits(logits[i, :n]), bits(ragged[i, :n]))
        np.testing.assert_array_equal(bits(logits[i, :n]), bits(page64[i, :n]))


def test_page_32_head_dim_128(rng):
    batch, num_heads, head_dim = 2, 64, 128
    ctx = np.array([[33], [260]], np.int32)
    q_pair, kv, w, exact, deq = make_problem(rng, batch, 1, num_heads, head_dim, ctx, cuda_scales=False)
    logits = run_paged(rng, q_pair, kv, w, ctx, 32, True, num_heads)
    assert valid_diff(logits, paged_reference(*deq, w, ctx)) < 5e-6
    page128 = run_paged(rng, q_pair, kv, w, ctx, 128, True, num_heads)
    for i, n in enumerate(ctx[:, 0]):
        np.testing.assert_array_equal(bits(logits[i, :n]), bits(page128[i, :n]))
    est = deep_gemm.estimate_paged_mqa_logits(ctx, num_heads, head_dim, page_size=32, use_ascend_kv_layout=True)
    assert est.time_us > 0
    with pytest.raises(ValueError, match="page_size=16 must be one of"):
        deep_gemm.build_paged_kv_cache(kv, np.zeros((2, 20), np.int32), 4, 16)


def test_fp32_logits_under_the_sync_checker(monkeypatch, rng):
    """The fp32 output path (and its -inf fill) under DG_SYNC_CHECK=1 on 1 logical core, bitwise equal to 32 cores
    (the kernels of test_paged_mqa_logits.py's sync-check test: ragged H = 4, paged H = 8 next_n = 2)."""
    from deep_gemm import envs

    seq_len, seq_len_kv, num_heads, head_dim = 40, 520, 4, 64
    q, kv, w, _, _ = fp8_cuda_inputs(rng, seq_len, seq_len_kv, num_heads, head_dim)
    ks = rng.integers(0, 300, seq_len).astype(np.int32)
    ke = np.minimum(ks + rng.integers(0, 300, seq_len), seq_len_kv).astype(np.int32)
    ctx = np.array([[150, 151], [0, 1], [70, 71]], np.int32)
    pq, pkv, pw, _, _ = make_problem(rng, 3, 2, 8, 64, ctx, cuda_scales=False)
    state = rng.bit_generator.state
    outs = {}
    for cores, check in ((32, "0"), (1, "1")):
        monkeypatch.setenv(envs.DG_SYNC_CHECK.name, check)
        with deep_gemm.runtime_scope(num_ai_cores=cores):
            rng.bit_generator.state = state  # the same block tables
            outs[cores] = (deep_gemm.fp8_fp4_mqa_logits(q, kv, w, ks, ke, logits_dtype=np.float32),
                           run_paged_dtype(rng, pq, pkv, pw, ctx, 64, True, 8, np.float32))
    np.testing.assert_array_equal(bits(outs[1][0]), bits(outs[32][0]))
    assert np.isneginf(outs[1][0][0, :ks[0]]).all()
    for i, n in enumerate(ctx.reshape(-1)):
        np.testing.assert_array_equal(bits(outs[1][1][i, :n]), bits(outs[32][1][i, :n]))
