"""CPU benchmark of the indexer kernels (DeepSeek-V3.2's sparse-attention scorer) and the HC pre-norm GEMM beside the
code a user would otherwise write, in one run: vectorised numpy (FP8 decoded through a 256-entry table, the per-key
scale applied once per score column, chunked so the scores stay in memory), torch on the CPU where installed (the
einsum / relu / weighted sum a torch user writes, as in CUDA DeepGEMM's own reference: FP8 decoded with .float()
every call, fp32 scores; timed at torch's default thread count and at every other count, each its own library)
and, where installed, JAX (one jax.jit-compiled function). Every library is timed in its own steady state
(deep_gemm.testing.bench_steady: blocks of back-to-back calls per library, the first 50 ms of each block (at least
one call) discarded, blocks alternated, median over blocks); ratios are same-run. Each row prints the stand-in's
speedup over numpy, JAX, torch (default threads) and the best peer (per round the fastest of numpy, JAX and torch at
any thread count), issue 28's target where it sets one and the modelled Ascend 950DT time of the call (the
estimate_* functions). CPU numbers are CPU numbers; chip numbers are modelled.

    python bench/attention_bench.py --quick          # the issue's two target rows + HC pre-norm (minutes)
    python bench/attention_bench.py                  # H = 64, D = 128: 4k-64k keys, batch 1-64 (long on 2 cores)
    python bench/attention_bench.py --rows paged --no-jax --no-torch

Rows whose deep_gemm function is not in this checkout say so and time only the peers.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

NUM_HEADS, HEAD_DIM, PAGE_SIZE = 64, 128, 64
# Ragged prefill logits: (query rows, keys); paged decode: (batch, mean context length); HC pre-norm: (M, N, K)
RAGGED = [(64, 4096), (64, 16384), (64, 65536)]
PAGED = [(1, 8192), (4, 8192), (16, 8192), (64, 8192)]
HC = [(16, 24, 28672), (256, 24, 28672), (1024, 24, 28672)]
QUICK_RAGGED = [(32, 16384)]
QUICK_PAGED = [(16, 4096)]
QUICK_HC = [(16, 24, 28672), (256, 24, 28672)]
# Query rows per numpy / JAX chunk: the scores of a chunk (rows x H x keys fp32) stay within ~128 MiB at 64k keys.
Q_CHUNK = 8


# ---------------------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------------------
def _fp8(rng, shape):
    """Random FP8 e4m3 codes (no NaN) of values around +-1..8, as float8_e4m3fn."""
    import ml_dtypes

    codes = rng.integers(0, 256, size=shape, dtype=np.uint8)
    codes = (codes & 0x80) | (codes & 0x7F) % 0x50 + 0x20  # exponents 4..13: values 2^-3 .. 2^6
    return codes.view(ml_dtypes.float8_e4m3fn)


def ragged_inputs(rng, s: int, s_kv: int):
    """q (float8 [S, H, D]), kv (float8 [S_kv, D]), kv_scale fp32 [S_kv], weights bf16 [S, H], ks / ke int32 [S]:
    the last S tokens of an S_kv-token prefill, causal (row i sees keys [0, S_kv - S + i])."""
    import ml_dtypes

    q = _fp8(rng, (s, NUM_HEADS, HEAD_DIM))
    kv = _fp8(rng, (s_kv, HEAD_DIM))
    kv_scale = np.ldexp(np.float32(1), rng.integers(-8, -4, size=s_kv)).astype(np.float32)
    weights = (rng.standard_normal((s, NUM_HEADS)) * 0.1).astype(ml_dtypes.bfloat16)
    ks = np.zeros(s, np.int32)
    ke = (s_kv - s + 1 + np.arange(s)).astype(np.int32)
    return q, kv, kv_scale, weights, ks, ke


def paged_inputs(rng, batch: int, mean_ctx: int):
    """q float8 [B, 1, H, D], the uint8 paged cache in CUDA DeepGEMM's layout [pages, 64, 1, D + 4] (each page: its
    64 x D FP8 values, then its 64 fp32 scales), weights bf16 [B, H], context_lens int32 [B, 1], a shuffled
    block_table int32 [B, max_blocks] and max_context_len."""
    import ml_dtypes

    ctx = rng.integers(mean_ctx // 2, mean_ctx * 3 // 2 + 1, size=batch).astype(np.int32)
    max_ctx = int(ctx.max())
    max_blocks = -(-max_ctx // PAGE_SIZE)
    num_pages = batch * max_blocks
    block_table = rng.permutation(num_pages).astype(np.int32).reshape(batch, max_blocks)
    cache = np.zeros((num_pages, PAGE_SIZE, 1, HEAD_DIM + 4), np.uint8)
    flat = cache.reshape(num_pages, -1)
    flat[:, :PAGE_SIZE * HEAD_DIM] = _fp8(rng, (num_pages, PAGE_SIZE * HEAD_DIM)).view(np.uint8)
    scales = np.ldexp(np.float32(1), rng.integers(-8, -4, size=(num_pages, PAGE_SIZE))).astype(np.float32)
    flat[:, PAGE_SIZE * HEAD_DIM:] = scales.view(np.uint8)
    q = _fp8(rng, (batch, 1, NUM_HEADS, HEAD_DIM))
    weights = (rng.standard_normal((batch, NUM_HEADS)) * 0.1).astype(ml_dtypes.bfloat16)
    return q, cache, weights, ctx.reshape(batch, 1), block_table, max_ctx


def hc_inputs(rng, m: int, n: int, k: int):
    import ml_dtypes

    a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    b = (rng.standard_normal((n, k)) * 0.01).astype(np.float32)
    return a, b


# ---------------------------------------------------------------------------------------------------------------
# The numpy code a user would write (strongest reasonable vectorised formulation)
# ---------------------------------------------------------------------------------------------------------------
def _lut():
    from deep_gemm.utils import E4M3_DECODE_TABLE

    return E4M3_DECODE_TABLE.astype(np.float32)


def numpy_ragged_logits(q, kv, kv_scale, weights, ks, ke):
    """fp32 [S, S_kv]: sum_h relu(q[i, h] . kv[j] * kv_scale[j]) * weights[i, h] for j in [ks[i], ke[i]), else -inf.
    Table decode of the FP8 codes, one BLAS matmul per chunk of query rows over the chunk's key range, the key
    scale, ReLU and the head weights applied in place / by a batched matmul."""
    lut = _lut()
    s, h, d = q.shape
    s_kv = kv.shape[0]
    qf = lut[q.view(np.uint8)]
    kvf = lut[kv.view(np.uint8)]
    w = weights.astype(np.float32)
    out = np.full((s, s_kv), -np.inf, np.float32)
    for q0 in range(0, s, Q_CHUNK):
        q1 = min(s, q0 + Q_CHUNK)
        lo, hi = int(ks[q0:q1].min()), int(ke[q0:q1].max())
        if hi <= lo:
            continue
        scores = qf[q0:q1].reshape(-1, d) @ kvf[lo:hi].T
        scores *= kv_scale[lo:hi]
        np.maximum(scores, 0, out=scores)
        out[q0:q1, lo:hi] = np.matmul(w[q0:q1, None, :], scores.reshape(q1 - q0, h, hi - lo))[:, 0]
    cols = np.arange(s_kv)
    out[(cols[None] < ks[:, None]) | (cols[None] >= ke[:, None])] = -np.inf
    return out


def numpy_paged_logits(q, cache, weights, context_lens, block_table, max_ctx):
    """fp32 [B, max_ctx]: the same score over each sequence's cached tokens (j < context_lens[b]), else -inf. Pages
    gathered through the block table in one fancy index, values decoded by table, scales read from each page's
    tail; one batched matmul per batch."""
    lut = _lut()
    batch, _, h, d = q.shape
    nblk = -(-max_ctx // PAGE_SIZE)
    pages = cache.reshape(cache.shape[0], -1)[block_table[:, :nblk]]  # [B, nblk, page bytes]
    kvf = lut[pages[:, :, :PAGE_SIZE * d]].reshape(batch, nblk * PAGE_SIZE, d)
    scales = np.ascontiguousarray(pages[:, :, PAGE_SIZE * d:]).view(np.float32).reshape(batch, nblk * PAGE_SIZE)
    qf = lut[q.view(np.uint8)].reshape(batch, h, d)
    scores = np.matmul(qf, kvf.transpose(0, 2, 1))  # [B, H, T]
    scores *= scales[:, None, :]
    np.maximum(scores, 0, out=scores)
    out = np.matmul(weights.astype(np.float32)[:, None, :], scores)[:, 0, :max_ctx]
    out[np.arange(max_ctx)[None] >= context_lens[:, :1]] = -np.inf
    return out


def numpy_hc_prenorm(a, b):
    """(D = A @ B^T, sqr_sum = row sums of A^2) in fp32 (numpy has no TF32: the user gets full fp32 products)."""
    af = a.astype(np.float32)
    return af @ b.T, np.einsum("ij,ij->i", af, af)


# ---------------------------------------------------------------------------------------------------------------
# JAX (as a JAX user writes it: one jitted function, FP8 decoded with astype, inputs placed on the device once)
# ---------------------------------------------------------------------------------------------------------------
def jax_ragged_logits(q, kv, kv_scale, weights, ks, ke):
    import jax
    import jax.numpy as jnp

    s, h, d = q.shape
    s_kv = kv.shape[0]
    pad = -s % Q_CHUNK

    def f(q, kv, kv_scale, weights, ks, ke):
        kv_f = kv.astype(jnp.float32)
        cols = jnp.arange(s_kv)

        def chunk(args):
            qc, wc, ksc, kec = args
            scores = jnp.einsum("qhd,kd->qhk", qc.astype(jnp.float32), kv_f) * kv_scale
            logits = jnp.einsum("qhk,qh->qk", jnp.maximum(scores, 0), wc.astype(jnp.float32))
            return jnp.where((cols >= ksc[:, None]) & (cols < kec[:, None]), logits, -jnp.inf)

        qs = jnp.pad(q, ((0, pad), (0, 0), (0, 0))).reshape(-1, Q_CHUNK, h, d)
        ws = jnp.pad(weights, ((0, pad), (0, 0))).reshape(-1, Q_CHUNK, h)
        kss = jnp.pad(ks, (0, pad)).reshape(-1, Q_CHUNK)
        kes = jnp.pad(ke, (0, pad)).reshape(-1, Q_CHUNK)
        return jax.lax.map(chunk, (qs, ws, kss, kes)).reshape(-1, s_kv)[:s]

    fn = jax.jit(f)
    args = [jax.device_put(x) for x in (q, kv, kv_scale, weights, ks, ke)]
    return lambda: fn(*args).block_until_ready()


def jax_paged_logits(q, cache, weights, context_lens, block_table, max_ctx):
    import jax
    import jax.numpy as jnp
    import ml_dtypes

    batch, _, h, d = q.shape
    nblk = -(-max_ctx // PAGE_SIZE)
    values = cache.reshape(cache.shape[0], -1)[:, :PAGE_SIZE * d].view(ml_dtypes.float8_e4m3fn)
    values = values.reshape(-1, PAGE_SIZE, d)
    scales = np.ascontiguousarray(cache.reshape(cache.shape[0], -1)[:, PAGE_SIZE * d:]).view(np.float32)

    def f(q, values, scales, weights, context_lens, block_table):
        kv = values[block_table[:, :nblk]].reshape(batch, nblk * PAGE_SIZE, d).astype(jnp.float32)
        sc = scales[block_table[:, :nblk]].reshape(batch, nblk * PAGE_SIZE)
        scores = jnp.einsum("bhd,btd->bht", q.reshape(batch, h, d).astype(jnp.float32), kv) * sc[:, None, :]
        logits = jnp.einsum("bht,bh->bt", jnp.maximum(scores, 0), weights.astype(jnp.float32))[:, :max_ctx]
        return jnp.where(jnp.arange(max_ctx)[None] < context_lens[:, :1], logits, -jnp.inf)

    fn = jax.jit(f)
    args = [jax.device_put(x) for x in (q, values, scales, weights, context_lens, block_table)]
    return lambda: fn(*args).block_until_ready()


def jax_hc_prenorm(a, b):
    import jax
    import jax.numpy as jnp

    def f(a, b):
        af = a.astype(jnp.float32)
        return jnp.dot(af, b.T, preferred_element_type=jnp.float32), jnp.sum(af * af, axis=-1)

    fn = jax.jit(f)
    da, db = jax.device_put(a), jax.device_put(b)
    return lambda: jax.block_until_ready(fn(da, db))


# ---------------------------------------------------------------------------------------------------------------
# torch (as a torch user writes it, after CUDA DeepGEMM's reference: .float() decode every call, fp32 einsum, relu,
# weighted sum over heads, -inf outside each row's range; query rows chunked like numpy's so the scores fit memory)
# ---------------------------------------------------------------------------------------------------------------
def torch_ragged_logits(q, kv, kv_scale, weights, ks, ke):
    import torch

    from deep_gemm.testing.peers import torch_tensor

    s, h, d = q.shape
    s_kv = kv.shape[0]
    tq, tkv, tscale, tw = (torch_tensor(x) for x in (q, kv, kv_scale, weights))
    tks, tke = torch.from_numpy(ks.astype(np.int64)), torch.from_numpy(ke.astype(np.int64))
    bounds = [(q0, min(s, q0 + Q_CHUNK), int(ks[q0:q0 + Q_CHUNK].min()), int(ke[q0:q0 + Q_CHUNK].max()))
              for q0 in range(0, s, Q_CHUNK)]

    def call():
        qf = tq.float()
        kvf = tkv.float() * tscale[:, None]
        w = tw.float()
        out = torch.full((s, s_kv), float("-inf"))
        for q0, q1, lo, hi in bounds:
            if hi > lo:
                scores = torch.einsum("qhd,kd->qhk", qf[q0:q1], kvf[lo:hi])
                out[q0:q1, lo:hi] = torch.einsum("qhk,qh->qk", scores.relu(), w[q0:q1])
        cols = torch.arange(s_kv)
        return out.masked_fill_((cols[None] < tks[:, None]) | (cols[None] >= tke[:, None]), float("-inf"))

    return call


def torch_paged_logits(q, cache, weights, context_lens, block_table, max_ctx):
    import torch

    from deep_gemm.testing.peers import torch_tensor

    batch, _, h, d = q.shape
    nblk = -(-max_ctx // PAGE_SIZE)
    tq, tw = torch_tensor(q), torch_tensor(weights)
    flat = torch.from_numpy(cache.reshape(cache.shape[0], -1))
    table = torch.from_numpy(block_table[:, :nblk].astype(np.int64))
    ctx = torch.from_numpy(context_lens[:, :1].astype(np.int64))

    def call():
        pages = flat[table]  # [B, nblk, page bytes]
        kv = pages[..., :PAGE_SIZE * d].view(torch.float8_e4m3fn).float().reshape(batch, nblk * PAGE_SIZE, d)
        scales = pages[..., PAGE_SIZE * d:].contiguous().view(torch.float32).reshape(batch, nblk * PAGE_SIZE)
        scores = torch.einsum("bhd,btd->bht", tq.reshape(batch, h, d).float(), kv) * scales[:, None, :]
        logits = torch.einsum("bht,bh->bt", scores.relu(), tw.float())[:, :max_ctx]
        return logits.masked_fill_(torch.arange(max_ctx)[None] >= ctx, float("-inf"))

    return call


def torch_hc_prenorm(a, b):
    """(D = A @ B^T, sqr_sum) as a torch user writes it: the bf16 A cast to fp32 every call, one matmul and the row
    sums of its square (torch on the CPU has no TF32)."""
    from deep_gemm.testing.peers import torch_tensor

    ta, tb = torch_tensor(a), torch_tensor(b)

    def call():
        af = ta.float()
        return af @ tb.T, af.square().sum(-1)

    return call


def _add_torch(fns: dict, args, make) -> None:
    if args.torch:
        from deep_gemm.testing.peers import torch_variants

        fns.update(torch_variants(make()))


# ---------------------------------------------------------------------------------------------------------------
# deep_gemm (the stand-in) and its modelled chip time, where this checkout has them
# ---------------------------------------------------------------------------------------------------------------
def _dg(name: str):
    import deep_gemm

    try:
        return getattr(deep_gemm, name)
    except AttributeError:
        return None


def _finite_diff(x, y) -> float:
    """calc_diff over the entries both mark finite; inf if their -inf masks differ."""
    from deep_gemm.testing import calc_diff

    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if not np.array_equal(np.isfinite(x), np.isfinite(y)):
        return float("inf")
    keep = np.isfinite(x)
    return calc_diff(x[keep], y[keep])


def stand_in_ragged(q, kv, kv_scale, weights, ks, ke):
    fn = _dg("fp8_fp4_mqa_logits")
    if fn is None:
        return None
    return lambda: fn((q, None), (kv, kv_scale), weights, ks, ke, clean_logits=True)


def stand_in_paged(q, cache, weights, context_lens, block_table, max_ctx):
    fn, meta_fn = _dg("fp8_fp4_paged_mqa_logits"), _dg("get_paged_mqa_logits_metadata")
    if fn is None or meta_fn is None:
        return None
    # NOTES: the schedule is built once per decode step and shared by every layer, so it is outside the timing.
    meta = meta_fn(context_lens, NUM_HEADS)
    return lambda: fn(q, cache, weights, context_lens, block_table, meta, max_ctx)


def modelled_ragged_us(s: int, s_kv: int, ks, ke) -> str:
    est = _dg("estimate_mqa_logits")
    if est is None:
        return "n/a (no estimate_mqa_logits)"
    return f"{est(s, s_kv, NUM_HEADS, HEAD_DIM, cu_seq_len_k_start=ks, cu_seq_len_k_end=ke).time_us:.1f}"


def modelled_paged_us(context_lens) -> str:
    est = _dg("estimate_paged_mqa_logits")
    if est is None:
        return "n/a (no estimate_paged_mqa_logits)"
    return f"{est(context_lens.reshape(-1).tolist(), NUM_HEADS, HEAD_DIM, page_size=PAGE_SIZE).time_us:.1f}"


# ---------------------------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------------------------
HEADER = (f"{'row':<34} {'stand-in ms':>11} {'numpy ms':>9} {'JAX ms':>8} {'torch ms':>9} {'torch best':>12} "
          f"{'x numpy':>8} {'x JAX':>6} {'x torch':>7} {'x best':>7} {'target':>7} {'calc_diff':>9}  "
          f"modelled 950DT us")

# Issue 28's targets (the stand-in's speedup over the best peer): kind -> {shape-defining value: target}
TARGETS = {"ragged": {(32, 16384): 3.0}, "paged": {16: 3.0}, "hc": {16: 1.5, 256: 1.5}}


def target_for(kind: str, shape) -> float | None:
    """Issue 28's target of a row (ragged: (S, keys); paged: the batch; hc: M), None where it sets none."""
    key = tuple(shape) if kind == "ragged" else shape[0]
    return TARGETS.get(kind, {}).get(key)


def torch_names(names) -> list[str]:
    return [n for n in names if n == "torch" or n.startswith("torch-")]


def row_figures(timing, names) -> dict:
    """One row's figures: every library's ms (torch at its default threads and at its best count), the stand-in's
    speedups over numpy, JAX, torch (default threads) and the best peer (None where not timed)."""
    def ms(name):
        return timing.median(name) * 1e3 if name in names else None

    def speedup(over):
        return timing.speedup("stand-in", over) if "stand-in" in names and over in names else None

    ts = torch_names(names)
    best = min(ts, key=timing.median) if ts else None
    peer_names = [n for n in names if n != "stand-in"]
    return {"stand_in_ms": ms("stand-in"), "numpy_ms": ms("numpy"), "jax_ms": ms("jax"), "torch_ms": ms("torch"),
            "torch_best_ms": ms(best) if best else None,
            "torch_best_threads": None if best is None else (
                _torch_default() if best == "torch" else int(best[len("torch-"):-1])),
            "x_numpy": speedup("numpy"), "x_jax": speedup("jax"), "x_torch": speedup("torch"),
            "x_best": timing.speedup("stand-in", peer_names) if "stand-in" in names and peer_names else None}


def _torch_default() -> int:
    from deep_gemm.testing.peers import torch_default_threads

    return torch_default_threads()


def _print_row(label, timing, names, diff, modelled, note="", target=None):
    f = row_figures(timing, names)

    def num(value, fmt=".2f"):
        return "-" if value is None else format(value, fmt)

    best = num(f["torch_best_ms"]) + (f"@{f['torch_best_threads']}t" if f["torch_best_threads"] else "")
    target_text = "-" if target is None else f">={target:.1f}x"
    if target is not None and f["x_best"] is not None:
        target_text += " ok" if f["x_best"] >= target else " MISS"
    diff_text = "-" if diff is None else f"{diff:.1e}"
    print(f"{label:<34} {num(f['stand_in_ms']):>11} {num(f['numpy_ms']):>9} {num(f['jax_ms']):>8} "
          f"{num(f['torch_ms']):>9} {best:>12} {num(f['x_numpy']):>8} {num(f['x_jax']):>6} {num(f['x_torch']):>7} "
          f"{num(f['x_best']):>7} {target_text:>7} {diff_text:>9}  {modelled}{'  ' + note if note else ''}",
          flush=True)


def _time(fns: dict, blocks: int, calls: int):
    from deep_gemm.testing import bench_steady

    return bench_steady(fns, num_blocks=blocks, calls_per_block=calls, num_warmups=1)


def run_ragged(shape, args, rng) -> None:
    s, s_kv = shape
    inputs = ragged_inputs(rng, s, s_kv)
    fns = {"numpy": lambda: numpy_ragged_logits(*inputs)}
    if args.jax:
        fns["jax"] = jax_ragged_logits(*inputs)
    _add_torch(fns, args, lambda: torch_ragged_logits(*inputs))
    dg = stand_in_ragged(*inputs)
    note, diff = "", None
    if dg is None:
        note = "fp8_fp4_mqa_logits is not in this checkout yet: peers only"
    else:
        fns = {"stand-in": dg, **fns}
        diff = _finite_diff(np.asarray(dg(), np.float32)[:, :s_kv], numpy_ragged_logits(*inputs))
    timing = _time(fns, args.blocks, args.calls)
    label = f"mqa_logits S={s} keys={s_kv} H={NUM_HEADS}"
    _print_row(label, timing, fns, diff, modelled_ragged_us(s, s_kv, inputs[4], inputs[5]), note,
               target_for("ragged", shape))


def run_paged(shape, args, rng) -> None:
    batch, mean_ctx = shape
    inputs = paged_inputs(rng, batch, mean_ctx)
    fns = {"numpy": lambda: numpy_paged_logits(*inputs)}
    if args.jax:
        fns["jax"] = jax_paged_logits(*inputs)
    _add_torch(fns, args, lambda: torch_paged_logits(*inputs))
    dg = stand_in_paged(*inputs)
    note, diff = "", None
    if dg is None:
        note = "fp8_fp4_paged_mqa_logits is not in this checkout yet: peers only"
    else:
        fns = {"stand-in": dg, **fns}
        # NOTES: the paged kernel leaves positions at or past a sequence's context length as they are (CUDA
        # DeepGEMM's clean_logits=False): compare the valid positions only.
        valid = np.arange(inputs[5])[None] < inputs[3][:, :1]
        diff = _finite_diff(np.asarray(dg(), np.float32)[:, :inputs[5]][valid], numpy_paged_logits(*inputs)[valid])
    timing = _time(fns, args.blocks, args.calls)
    label = f"paged_mqa B={batch} ctx~{mean_ctx} page={PAGE_SIZE}"
    _print_row(label, timing, fns, diff, modelled_paged_us(inputs[3]), note, target_for("paged", shape))


def run_hc(shape, args, rng) -> None:
    m, n, k = shape
    a, b = hc_inputs(rng, m, n, k)
    d = np.empty((m, n), np.float32)
    sqr = np.empty(m, np.float32)
    fns = {"numpy": lambda: numpy_hc_prenorm(a, b)}
    if args.jax:
        fns["jax"] = jax_hc_prenorm(a, b)
    _add_torch(fns, args, lambda: torch_hc_prenorm(a, b))
    dg = _dg("tf32_hc_prenorm_gemm")
    note, diff, modelled = "", None, "n/a"
    if dg is None:
        note = "tf32_hc_prenorm_gemm is not in this checkout yet: peers only"
    else:
        fns = {"stand-in": lambda: dg(a, b, d, sqr), **fns}
        from deep_gemm.testing import calc_diff

        fns["stand-in"]()
        ref_d, ref_s = numpy_hc_prenorm(a, b)
        diff = max(calc_diff(d, ref_d), calc_diff(sqr, ref_s))
        modelled = f"{_dg('estimate_hc_prenorm_gemm')(m, n, k).time_us:.1f}"
    timing = _time(fns, args.blocks, args.calls)
    _print_row(f"hc_prenorm M={m} N={n} K={k}", timing, fns, diff, modelled, note, target_for("hc", shape))


def _positive(name):
    def parse(text):
        value = int(text)
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be >= 1, got {value}")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    epilog = ("Timing: every library in its own steady state: blocks of back-to-back calls per library, the calls "
              "of each block's first 50 ms (at least one) discarded, blocks alternated between libraries, median of "
              "its block figures.")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=epilog,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the two target rows (16k keys, batch 16) + HC")
    parser.add_argument("--rows", default="ragged,paged,hc", help="comma list of ragged, paged, hc")
    parser.add_argument("--blocks", type=_positive("--blocks"), default=3, help="rounds of blocks (default 3)")
    parser.add_argument("--calls", type=_positive("--calls"), default=2, help="timed calls per block (default 2)")
    parser.add_argument("--no-jax", dest="jax", action="store_false", help="skip the JAX peer")
    parser.add_argument("--no-torch", dest="torch", action="store_false", help="skip the torch peer")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    bad = [r for r in rows if r not in ("ragged", "paged", "hc")]
    if bad or not rows:
        parser.error(f"--rows: unknown row kind(s) {bad or rows}; allowed: ragged, paged, hc")

    from deep_gemm import runtime
    from deep_gemm.testing import describe_machine, jax_version
    from deep_gemm.testing.peers import torch_thread_counts, torch_version

    if args.jax and jax_version() is None:
        print("JAX is not installed: the JAX column is skipped")
        args.jax = False
    if args.torch and torch_version() is None:
        print("torch is not installed (pip install deep_gemm[torch]): the torch columns are skipped")
        args.torch = False
    print(describe_machine())
    torch_text = (f"torch {torch_version()} (default {_torch_default()} threads, also timed at "
                  f"{', '.join(map(str, torch_thread_counts()))})" if args.torch else "torch -")
    print(f"JAX {jax_version() or '-'}; {torch_text}; deep_gemm: {runtime.get_num_ai_cores()} logical AI cores "
          f"({runtime.get_npu_arch()} configs); load average at start {os.getloadavg()[0]:.2f}")
    from deep_gemm.testing.bench import WARM_BLOCK_S

    warm_ms = WARM_BLOCK_S * 1000
    print(f"protocol: bench_steady, {args.blocks} blocks x {args.calls} timed calls per library (after "
          f"{warm_ms:g} ms of discarded calls per block, at least one; 1 warm-up call each); ratios: median over "
          f"rounds of the same-round block ratios")
    print(HEADER)
    rng = np.random.default_rng(args.seed)
    start = time.time()
    plan = {"ragged": (QUICK_RAGGED if args.quick else RAGGED, run_ragged),
            "paged": (QUICK_PAGED if args.quick else PAGED, run_paged),
            "hc": (QUICK_HC if args.quick else HC, run_hc)}
    for kind in rows:
        shapes, run = plan[kind]
        for shape in shapes:
            run(shape, args, rng)
    print(f"done in {time.time() - start:.0f} s; load average at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
