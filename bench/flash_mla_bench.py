"""CPU benchmark of FlashMLA's sparse prefill (flash_mla_sparse_fwd) and sparse decode (flash_mla_with_kvcache on the
V4.1 FP8 cache with an FP4 extra cache) beside the code a user would otherwise write, in one run: vectorised numpy
(gather the selected tokens, dequantize them, fp32 scores, softmax, fp32 output, in query chunks) and torch on the
CPU where installed (the same steps in torch ops, as FlashMLA's own tests/ref.py writes them). Every library is
timed in its own steady state (deep_gemm.testing.bench_steady); ratios are same-run. Each row also prints the modelled
Ascend 950DT time of the call (deep_gemm.estimate_flash_mla_*). CPU numbers are CPU numbers; chip numbers are
modelled.

    python bench/flash_mla_bench.py --quick      # one small row of each (minutes: the kernels compile first)
    python bench/flash_mla_bench.py              # larger rows
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np

import deep_gemm
from deep_gemm.testing import bench_steady
from deep_gemm.testing import flash_mla_reference as R

BF16 = np.dtype(ml_dtypes.bfloat16)
H, PAGE = 64, 64
# prefill: (s_q, s_kv, topk); decode: (batch, topk, extra_topk)
PREFILL = [(32, 4096, 512), (128, 8192, 640)]
DECODE = [(8, 128, 512), (32, 128, 512)]
QUICK_PREFILL = [(16, 2048, 256)]
QUICK_DECODE = [(4, 128, 256)]
CHUNK = 8


def _softmax_out(q, kv, valid, scale, sink):
    """numpy: q [n, h, d] fp32, kv [n, t, d] fp32 (gathered), valid [n, t] -> bf16 out [n, h, 512], lse [n, h]."""
    p = np.einsum("nhd,ntd->nht", q, kv) * np.float32(scale)
    p = np.where(valid[:, None, :], p, -np.inf)
    m = p.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(p - m)
    s = e.sum(axis=-1)
    out = np.einsum("nht,ntd->nhd", e, kv[..., :512])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        lse = np.where(s > 0, np.log(s) + m[..., 0], np.inf)
        den = s + (np.exp(sink[None, :] - m[..., 0]) if sink is not None else 0)
        out = np.where(s[..., None] > 0, out / den[..., None], 0)
    return out.astype(BF16), lse.astype(np.float32)


def prefill_numpy(q, kv, indices, scale, sink):
    s_q = q.shape[0]
    out = np.empty((s_q, H, 512), BF16)
    lse = np.empty((s_q, H), np.float32)
    kvf = kv[:, 0, :].astype(np.float32)
    for i in range(0, s_q, CHUNK):
        idx = indices[i:i + CHUNK, 0, :]
        valid = (idx >= 0) & (idx < kv.shape[0])
        g = kvf[np.where(valid, idx, 0)]
        out[i:i + CHUNK], lse[i:i + CHUNK] = _softmax_out(q[i:i + CHUNK].astype(np.float32), g, valid, scale, sink)
    return out, lse


def decode_numpy(q, cache, idx, e_cache, e_idx, scale, sink):
    """Gather the selected tokens' bytes from both caches, dequantize them (the layouts' own rules), attend."""
    n = q.shape[0] * q.shape[1]
    parts, valids = [], []
    for c, layout, ix in ((cache, "v41_fp8", idx), (e_cache, "v41_fp4", e_idx)):
        flat = c.reshape(-1, c.shape[-1])
        ix = ix.reshape(n, -1)
        valid = (ix >= 0) & (ix < flat.shape[0])
        g = flat[np.where(valid, ix, 0)].reshape(n * ix.shape[1], 1, 1, -1)
        parts.append(R.dequantize_k_cache(g, layout).astype(np.float32).reshape(n, ix.shape[1], 512))
        valids.append(valid)
    out, lse = _softmax_out(q.reshape(n, H, 512).astype(np.float32), np.concatenate(parts, 1),
                            np.concatenate(valids, 1), scale, sink)
    return out, lse


def prefill_torch(torch, q, kv, indices, scale, sink):
    q = torch.from_numpy(q.view(np.int16)).view(torch.bfloat16).float()
    kvf = torch.from_numpy(kv[:, 0, :].view(np.int16)).view(torch.bfloat16).float()
    idx = torch.from_numpy(indices[:, 0, :]).long()
    sink_t = torch.from_numpy(sink)
    outs = []
    for i in range(0, q.shape[0], CHUNK):
        ix = idx[i:i + CHUNK]
        valid = (ix >= 0) & (ix < kvf.shape[0])
        g = kvf[ix.clamp(0, kvf.shape[0] - 1)]
        p = torch.einsum("nhd,ntd->nht", q[i:i + CHUNK], g) * scale
        p = p.masked_fill(~valid[:, None, :], float("-inf"))
        lse = torch.logsumexp(p, dim=-1)
        lse_o = torch.logsumexp(torch.stack([lse, sink_t.expand_as(lse)]), dim=0)
        lse_o = lse_o.masked_fill(lse_o == float("-inf"), float("inf"))
        outs.append((torch.exp(p - lse_o[..., None]) @ g[..., :512]).to(torch.bfloat16))
    return torch.cat(outs)


def decode_torch(torch, q, cache, idx, e_cache, e_idx, scale, sink):
    """The decode in torch: gather the token bytes, dequantize (FP8: e4m3 x 2^(e - 127) per 32; FP4: e2m1 pairs x
    e4m3 per 16), fp32 attention, the sink as FlashMLA's reference applies it."""
    n = q.shape[0] * q.shape[1]
    e2m1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    parts, valids = [], []
    for c, fp4, ix in ((cache, False, idx), (e_cache, True, e_idx)):
        flat = torch.from_numpy(c.reshape(-1, c.shape[-1]))
        ix = torch.from_numpy(ix.reshape(n, -1)).long()
        valid = (ix >= 0) & (ix < flat.shape[0])
        g = flat[ix.clamp(0, flat.shape[0] - 1)]
        if fp4:
            codes = torch.stack([g[..., :256] & 15, g[..., :256] >> 4], dim=-1).reshape(n, -1, 32, 16).long()
            sc = g[..., 256:288].contiguous().view(torch.float8_e4m3fn).float()
            v = (e2m1[codes] * sc[..., None]).reshape(n, -1, 512)
        else:
            vals = g[..., :512].contiguous().view(torch.float8_e4m3fn).float().reshape(n, -1, 16, 32)
            v = (vals * torch.exp2(g[..., 512:528].float() - 127)[..., None]).reshape(n, -1, 512)
        parts.append(v.to(torch.bfloat16).float())
        valids.append(valid)
    kv, valid = torch.cat(parts, 1), torch.cat(valids, 1)
    qf = torch.from_numpy(q.reshape(n, H, 512).view(np.int16)).view(torch.bfloat16).float()
    p = (qf @ kv.transpose(1, 2)) * scale
    p = p.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(p, dim=-1)
    out = torch.exp(p - lse[..., None]) @ kv
    out = out * (1 / (1 + torch.exp(torch.from_numpy(sink)[None, :] - lse)))[..., None]
    return out.to(torch.bfloat16), lse


def _prefill_case(rng, s_q, s_kv, topk):
    q = (rng.standard_normal((s_q, H, 512)) * 0.1).astype(BF16)
    kv = (rng.standard_normal((s_kv, 1, 512)) * 0.1).astype(BF16)
    idx = np.stack([rng.permutation(s_kv)[:topk] for _ in range(s_q)]).astype(np.int32)[:, None, :]
    return q, kv, idx, rng.standard_normal(H).astype(np.float32)


def _decode_case(rng, b, topk, extra_topk):
    blocks = b * -(-max(2 * topk, 2 * extra_topk) // PAGE)
    cache = R.quantize_k_cache((rng.standard_normal((blocks, PAGE, 1, 512)) * 0.1).astype(BF16), "v41_fp8")
    e_cache = R.quantize_k_cache((rng.standard_normal((blocks, PAGE, 1, 512)) * 0.1).astype(BF16), "v41_fp4")
    idx = rng.integers(0, blocks * PAGE, (b, 1, topk)).astype(np.int32)
    e_idx = rng.integers(0, blocks * PAGE, (b, 1, extra_topk)).astype(np.int32)
    q = rng.standard_normal((b, 1, H, 512)).astype(BF16)
    return q, cache, idx, e_cache, e_idx, rng.standard_normal(H).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--blocks", type=int, default=3)
    args = parser.parse_args()
    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            torch = None
    rng = np.random.default_rng(0)
    print(f"FlashMLA sparse attention on {deep_gemm.get_num_ai_cores()} logical AI cores (CPU; loaded machine: "
          f"other work shares it); same-run ratios, deep_gemm's speedup over each peer")
    for s_q, s_kv, topk in QUICK_PREFILL if args.quick else PREFILL:
        prefill_row(rng, torch, args.blocks, s_q, s_kv, topk)
    for b, topk, extra in QUICK_DECODE if args.quick else DECODE:
        decode_row(rng, torch, args.blocks, b, topk, extra)


def prefill_row(rng, torch, blocks: int, s_q: int, s_kv: int, topk: int) -> None:
    q, kv, idx, sink = _prefill_case(rng, s_q, s_kv, topk)
    fns = {"deep_gemm": lambda: deep_gemm.flash_mla_sparse_fwd(q, kv, idx, 0.5, attn_sink=sink),
           "numpy": lambda: prefill_numpy(q, kv, idx, 0.5, sink)}
    if torch is not None:
        fns["torch"] = lambda: prefill_torch(torch, q, kv, idx, 0.5, sink)
    t = bench_steady(fns, num_blocks=blocks, calls_per_block=1)
    est = deep_gemm.estimate_flash_mla_sparse_fwd(s_q, s_kv, topk, num_ai_cores=32, arch="950DT")
    peers = "  ".join(f"x{t.ratio(p, 'deep_gemm'):.2f} vs {p} ({t.median(p) * 1e3:.1f} ms)" for p in fns
                      if p != "deep_gemm")
    print(f"prefill s_q {s_q:4d} s_kv {s_kv:5d} topk {topk:4d}: deep_gemm {t.median('deep_gemm') * 1e3:8.1f} ms  "
          f"{peers}  | modelled 950DT {est.time_us:.1f} us ({est.bound})")


def decode_row(rng, torch, blocks: int, b: int, topk: int, extra: int) -> None:
    q, cache, idx, e_cache, e_idx, sink = _decode_case(rng, b, topk, extra)
    meta, _ = deep_gemm.get_mla_metadata()
    fns = {"deep_gemm": lambda: deep_gemm.flash_mla_with_kvcache(
               q, cache, None, None, 512, meta, softmax_scale=0.05, is_fp8_kvcache=True, indices=idx,
               attn_sink=sink, extra_k_cache=e_cache, extra_indices_in_kvcache=e_idx),
           "numpy": lambda: decode_numpy(q, cache, idx, e_cache, e_idx, 0.05, sink)}
    if torch is not None:
        fns["torch"] = lambda: decode_torch(torch, q, cache, idx, e_cache, e_idx, 0.05, sink)
    t = bench_steady(fns, num_blocks=blocks, calls_per_block=1)
    est = deep_gemm.estimate_flash_mla_with_kvcache(b, 1, topk, extra, extra_kv_layout="v41_fp4", num_ai_cores=32,
                                                    arch="950DT")
    peers = "  ".join(f"x{t.ratio(p, 'deep_gemm'):.2f} vs {p} ({t.median(p) * 1e3:.1f} ms)" for p in fns
                      if p != "deep_gemm")
    print(f"decode b {b:3d} topk {topk} v41_fp8 + {extra} v41_fp4: deep_gemm {t.median('deep_gemm') * 1e3:8.1f} ms  "
          f"{peers}  | modelled 950DT {est.time_us:.1f} us ({est.bound})")

if __name__ == "__main__":
    main()
