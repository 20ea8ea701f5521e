"""DeepSeek's sparse attention end to end, one decode step: the indexer's paged MQA logits -> deep_gemm.topk ->
FlashMLA's sparse decode on the V4.1 FP8 latent cache over the same pages, against a float64 reference of the whole
chain (reference logits, their top-k, attention over the dequantized cache). examples/sparse_attention.py is the
same chain without the reference; it is run here too."""

from __future__ import annotations

import pathlib
import runpy

import ml_dtypes
import numpy as np

import deep_gemm
from deep_gemm.testing import flash_mla_reference as R
from deep_gemm.utils import per_token_cast_to_fp8

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn


def test_mqa_logits_topk_sparse_decode_chain():
    rng = np.random.default_rng(7)
    batch, ctx, page, topk, heads = 2, 300, 64, 128, 64
    pages = -(-ctx // page)
    table = rng.permutation(batch * pages).astype(np.int32).reshape(batch, pages)
    lens = np.array([ctx, 100], np.int32)  # row 1 has fewer tokens than topk: the rest is -1
    keys, key_sf = per_token_cast_to_fp8(rng.standard_normal((batch * ctx, 128)), use_ue8m0=False, gran_k=128)
    index_cache = deep_gemm.build_paged_kv_cache((keys.reshape(batch, ctx, 128), key_sf.reshape(batch, ctx)),
                                                 table, batch * pages, page, lens)
    index_q = rng.standard_normal((batch, 1, heads, 128)).astype(E4M3)
    weights = rng.standard_normal((batch, heads)).astype(np.float32)
    latent = (rng.standard_normal((batch * pages, page, 1, 512)) * 0.1).astype(BF16)
    kv_cache = deep_gemm.quantize_k_cache(latent, "v41_fp8")
    q = rng.standard_normal((batch, 1, 64, 512)).astype(BF16)
    with deep_gemm.runtime_scope(num_ai_cores=2):
        meta = deep_gemm.get_paged_mqa_logits_metadata(lens, heads)
        logits = deep_gemm.fp8_fp4_paged_mqa_logits(index_q, index_cache, weights, lens, table, meta, ctx,
                                                    logits_dtype=np.float32)
        _, chosen = deep_gemm.topk(logits, topk, end=lens, indices_type=np.int32, idx_oob_fill_value=-1)
        indices = deep_gemm.abs_indices2indices_in_kvcache(chosen.reshape(batch, 1, topk), table, page)
        sched, _ = deep_gemm.get_mla_metadata()
        out, lse = deep_gemm.flash_mla_with_kvcache(q, kv_cache, table, lens, 512, sched, softmax_scale=512 ** -0.5,
                                                    is_fp8_kvcache=True, indices=indices)

    # The float64 chain: logits from the dequantized keys, their top-k over each context, attention over the
    # dequantized latent cache
    k64 = (keys.astype(np.float64) * key_sf).reshape(batch, ctx, 128)
    scores = np.einsum("bhd,bjd->bhj", index_q[:, 0].astype(np.float64), k64)
    ref_logits = (np.maximum(scores, 0) * weights[:, :, None].astype(np.float64)).sum(axis=1)
    ref_abs = np.full((batch, 1, topk), -1, np.int32)
    for b in range(batch):
        order = np.argsort(-ref_logits[b, :lens[b]], kind="stable")
        if lens[b] > topk:
            # NOTES: the data must separate the k-th from the (k+1)-th logit by far more than fp32 rounding, else
            # the comparison of the selections below would test rounding, not the chain
            gap = ref_logits[b, order[topk - 1]] - ref_logits[b, order[topk]]
            assert gap > 1e-4 * np.abs(ref_logits[b]).max()
        ref_abs[b, 0, :min(topk, lens[b])] = np.sort(order[:topk])
    got = np.sort(np.where(chosen < 0, np.iinfo(np.int32).max, chosen), axis=1)
    want = np.sort(np.where(ref_abs[:, 0] < 0, np.iinfo(np.int32).max, ref_abs[:, 0]), axis=1)
    assert np.array_equal(got, want)
    ref_idx = R.abs_indices2indices_in_kvcache(ref_abs, table, page)
    r_out, r_lse = R.ref_sparse_decode(q, R.dequantize_k_cache(kv_cache, "v41_fp8"), ref_idx, 512 ** -0.5)
    R.check_allclose("out", out.astype(np.float32), r_out, 1e-3, 2.01 / 128, 5e-6)
    R.check_allclose("lse", lse, r_lse, 1e-6, 8.01 / 65536)


def test_example_runs(capsys):
    example = pathlib.Path(__file__).resolve().parents[2] / "examples" / "sparse_attention.py"
    with deep_gemm.runtime_scope(num_ai_cores=2):
        runpy.run_path(str(example), run_name="__main__")
    assert "out (2, 1, 64, 512)" in capsys.readouterr().out
