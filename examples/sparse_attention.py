"""DeepSeek sparse attention, one decode step on the CPU stand-in: the indexer's MQA logits over a paged FP8 key
cache -> top-k per query token (DeepSelect's topk) -> FlashMLA's sparse decode over the same pages of the
V4.1 FP8 latent cache (528-byte tokens). Run: python examples/sparse_attention.py"""
import ml_dtypes
import numpy as np

import deep_gemm
from deep_gemm.utils import per_token_cast_to_fp8

rng = np.random.default_rng(0)
batch, ctx, page, topk, heads = 2, 300, 64, 128, 64
pages = -(-ctx // page)
block_table = rng.permutation(batch * pages).astype(np.int32).reshape(batch, pages)
context_lens = np.array([ctx, 200], np.int32)

# The indexer: FP8 keys (head dim 128, a scale per key) in pages, its q and head weights
keys, key_sf = per_token_cast_to_fp8(rng.standard_normal((batch * ctx, 128)), use_ue8m0=False, gran_k=128)
index_cache = deep_gemm.build_paged_kv_cache((keys.reshape(batch, ctx, 128), key_sf.reshape(batch, ctx)),
                                             block_table, batch * pages, page, context_lens)
index_q = rng.standard_normal((batch, 1, heads, 128)).astype(ml_dtypes.float8_e4m3fn)
weights = rng.standard_normal((batch, heads)).astype(np.float32)
meta = deep_gemm.get_paged_mqa_logits_metadata(context_lens, heads)
logits = deep_gemm.fp8_fp4_paged_mqa_logits(index_q, index_cache, weights, context_lens, block_table, meta, ctx,
                                            logits_dtype=np.float32)

# Top-k per query token over its context; rows shorter than topk are padded with -1 (no token)
_, chosen = deep_gemm.topk(logits, topk, end=context_lens, indices_type=np.int32, idx_oob_fill_value=-1)
indices = deep_gemm.abs_indices2indices_in_kvcache(chosen.reshape(batch, 1, topk), block_table, page)

# FlashMLA's sparse decode over the selected tokens of the V4.1 FP8 latent cache (the same pages)
latent = (rng.standard_normal((batch * pages, page, 1, 512)) * 0.1).astype(ml_dtypes.bfloat16)
kv_cache = deep_gemm.quantize_k_cache(latent, "v41_fp8")
q = rng.standard_normal((batch, 1, 64, 512)).astype(ml_dtypes.bfloat16)
sched, _ = deep_gemm.get_mla_metadata()
out, lse = deep_gemm.flash_mla_with_kvcache(q, kv_cache, block_table, context_lens, 512, sched,
                                            softmax_scale=512 ** -0.5, is_fp8_kvcache=True, indices=indices)
print(f"out {out.shape} {out.dtype}, lse {lse.shape}: lse[0, :4, 0] = {lse[0, :4, 0]}")
