"""The MQA-logits cost model and the kernels stay in step: the work the model charges per core (heuristics/mqa.py
ragged_work / paged_work over mqa_tile_work: MADs, FixPipe's bf16 bytes, the head reduction's Vector instructions and
lanes, key bytes GM -> L1 after L0B residency) equals what the real kernels count at their own instruction sites
(kernels.mqa_logits.count_work, lib/mqa.asc.j2 gm_work), and the time model's per-tile FixPipe and Vector terms are
that work at the chip's rates.

Shapes reuse the FP8 kernels the other MQA tests compile (block_kv 256 on 32 cores).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import deep_gemm
from deep_gemm import runtime
from deep_gemm.heuristics.model import AIVS_PER_CORE, MEMORY_FIGURES
from deep_gemm.heuristics.mqa import (
    VECTOR_BF16_PER_CYCLE,
    VECTOR_ISSUE_CYCLES,
    WORK_FIELDS,
    MqaDesc,
    _tile_pipes,
    get_best_mqa_config,
    mqa_tile_work,
    paged_work,
    ragged_work,
)
from deep_gemm.kernels.mqa_logits import count_work
from deep_gemm.utils import per_token_cast_to_fp8

E4M3 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16


def kernel_counts(run) -> list[dict[str, int]]:
    with count_work() as runs:
        run()
    assert len(runs) == 1
    counts = runs[0]
    return [{k: int(counts[k][c]) for k in counts} for c in range(len(counts["mads"]))]


def assert_same_work(got, model):
    assert len(got) == len(model)
    for core, (g, m) in enumerate(zip(got, model, strict=True)):
        assert {k: g[k] for k in WORK_FIELDS} == m, f"core {core}"


def other_vector(tiles):
    """The stand-in's Vector instructions besides the head reduction: the bf16 logits cast per tile (the widening,
    and with the per-key scale the Mul and ReLU, run inside each query row's head-sum VF)."""
    return tiles


@pytest.mark.parametrize("mx", [False, True])
def test_ragged_kernel_counts_match_the_model(rng, mx):
    cores = runtime.get_num_ai_cores()
    num_heads, head_dim = 32, 128
    arch = runtime.get_arch_spec()
    config = get_best_mqa_config(MqaDesc(num_heads, head_dim, num_ai_cores=cores), arch)
    # full rows (keys resident in L0B after each core's first two tiles) when mx, ragged ranges (empty rows, rows
    # ending inside a tile) otherwise
    seq_len, seq_len_kv = (300, 300) if mx else (37, 300)
    q = rng.standard_normal((seq_len, num_heads, head_dim)).astype(np.float32)
    kv = rng.standard_normal((seq_len_kv, head_dim)).astype(np.float32)
    w = rng.standard_normal((seq_len, num_heads)).astype(BF16)
    if mx:
        q8, q_sf = per_token_cast_to_fp8(q.reshape(-1, head_dim), use_ue8m0=True, gran_k=32)
        kv8, kv_sf = per_token_cast_to_fp8(kv, use_ue8m0=True, gran_k=32)
        qp = (q8.reshape(seq_len, num_heads, head_dim), q_sf.reshape(seq_len, num_heads, -1))
        kvp = (kv8, kv_sf)
        ks, ke = np.zeros(seq_len, np.int32), np.full(seq_len, seq_len_kv, np.int32)
    else:
        kv8, kv_sf = per_token_cast_to_fp8(kv, use_ue8m0=False, gran_k=head_dim)
        qp, kvp = (q.astype(E4M3), None), (kv8, kv_sf[:, 0].copy())
        ks = rng.integers(0, seq_len_kv // 2, seq_len).astype(np.int32)
        ke = np.minimum(ks + rng.integers(0, seq_len_kv, seq_len), seq_len_kv).astype(np.int32)
        ks[1], ke[1] = 5, 5
        ks[2], ke[2] = 260, 270  # only the second key tile
    got = kernel_counts(lambda: deep_gemm.fp8_fp4_mqa_logits(qp, kvp, w, ks, ke))
    desc = MqaDesc(num_heads, head_dim, num_ai_cores=cores)
    model = ragged_work(desc, config, seq_len=seq_len, seq_len_kv=seq_len_kv, ks=ks.tolist(), ke=ke.tolist(),
                        token_scale=not mx)
    assert_same_work(got, model)
    assert sum(m["mads"] for m in model) > cores // 2  # the shapes exercise most cores
    if mx:  # residency: a core loads its key block into each of its two L0B stages once, then never again
        assert all(m["mads"] > 2 for m in model)
        assert sum(m["key_bytes"] for m in model) <= 2 * cores * config.block_kv * (head_dim + head_dim // 32)
    for g in got:  # the stand-in's other Vector instructions: the logits cast
        assert g["other_vector_instructions"] == other_vector(g["mads"])


@pytest.mark.parametrize("ascend", [True, False])
def test_paged_kernel_counts_match_the_model(rng, ascend):
    cores = runtime.get_num_ai_cores()
    batch, next_n, num_heads, head_dim, page = 3, 1, 64, 128, 64
    ctx = np.array([[300], [0], [517]], np.int32)
    length = int(ctx.max())
    q = rng.standard_normal((batch * next_n * num_heads, head_dim)).astype(np.float32)
    k = rng.standard_normal((batch * length, head_dim)).astype(np.float32)
    w = rng.standard_normal((batch * next_n, num_heads)).astype(BF16)
    qp = (q.astype(E4M3).reshape(batch, next_n, num_heads, head_dim), None)
    if ascend:
        kc, ksf = per_token_cast_to_fp8(k, use_ue8m0=True, gran_k=32)
        kv = (kc.reshape(batch, length, head_dim), ksf.reshape(batch, length, head_dim // 32))
    else:
        kc, ksf = per_token_cast_to_fp8(k, use_ue8m0=False, gran_k=head_dim)
        kv = (kc.reshape(batch, length, head_dim), ksf[:, 0].reshape(batch, length))
    max_pages = -(-length // page) + 1
    num_blocks = batch * max_pages + 3
    table = rng.permutation(num_blocks)[:batch * max_pages].reshape(batch, max_pages).astype(np.int32)
    cache = deep_gemm.build_paged_kv_cache(kv, table, num_blocks, page, use_ascend_kv_layout=ascend)
    meta = deep_gemm.get_paged_mqa_logits_metadata(ctx, num_heads)
    got = kernel_counts(lambda: deep_gemm.fp8_fp4_paged_mqa_logits(qp, cache, w, ctx, table, meta, length,
                                                                   use_ascend_kv_layout=ascend))
    desc = MqaDesc(num_heads, head_dim, num_ai_cores=cores, next_n=next_n, ascend_kv_layout=ascend)
    config = get_best_mqa_config(desc, runtime.get_arch_spec())
    model = paged_work(desc, config, context_lens=ctx.tolist())
    assert_same_work(got, model)
    assert sum(m["mads"] for m in model) == 2 + 3  # units of 256 keys: 300 -> 2, 0 -> 0, 517 -> 3


def test_time_model_charges_the_counted_work_at_the_chip_rates():
    """A full tile's FixPipe and Vector terms are mqa_tile_work at 64 bf16 elements per FixPipe cycle and the AIVs'
    bf16 head reduction (alternate tiles per AIV)."""
    arch = deep_gemm.arch.get_arch("950DT")
    for num_heads, token_scale in ((32, False), (64, True)):
        desc = MqaDesc(num_heads, 128, num_ai_cores=32)
        c = get_best_mqa_config(desc, arch)
        pipes = _tile_pipes(desc, c, arch, c.block_q * num_heads, c.block_kv, token_scale, 1, 1)
        work = mqa_tile_work(desc, c.block_q, c.block_kv, token_scale)
        assert work.fixpipe_bytes == c.block_q * num_heads * c.block_kv * 2
        assert pipes["fixpipe"] * arch.clock_hz == pytest.approx(work.fixpipe_bytes / 2 /
                                                                 MEMORY_FIGURES.fixpipe_elems_per_cycle)
        reduce_cycles = work.reduce_lanes / VECTOR_BF16_PER_CYCLE + work.q_rows * VECTOR_ISSUE_CYCLES
        assert pipes["vector"] * arch.clock_hz * AIVS_PER_CORE >= reduce_cycles
        assert (pipes["vector"] * arch.clock_hz * AIVS_PER_CORE == pytest.approx(reduce_cycles)) == (not token_scale)


def test_fixpipe_relu_rounds_the_relu_to_bf16():
    """FixpipeToUBRelu (the MQA kernels' FixPipe): ub = bf16_rne(relu(l0c)) in the block, NaN / -0.0 kept, the rest of
    the UB tile untouched; fp32 UB tiles get relu(l0c) as is."""
    from deep_gemm import device

    rng = np.random.default_rng(5)
    l0c = (rng.standard_normal((16, 40)) * 3).astype(np.float32)
    l0c[0, :3] = [np.nan, -0.0, -np.inf]
    ub = np.full((20, 48), 0x1234, np.uint16)
    device.FixpipeToUBRelu(ub, l0c, 13, 37)
    relu = np.where(l0c < 0, np.float32(0), l0c)
    np.testing.assert_array_equal(ub[:13, :37], relu[:13, :37].astype(BF16).view(np.uint16))
    assert (ub[13:] == 0x1234).all() and (ub[:, 37:] == 0x1234).all()
    f32 = np.zeros((16, 40), np.float32)
    device.FixpipeToUBRelu(f32, l0c, 16, 40)
    np.testing.assert_array_equal(f32.view(np.uint32), relu.view(np.uint32))
    with pytest.raises(IndexError):
        device.FixpipeToUBRelu(ub, l0c, 17, 8)


@pytest.mark.parametrize("kind,ascend", [("fp8", True), ("fp8", False), ("fp4", True), ("fp4", False)])
def test_paged_gather_moves_the_counted_key_bytes(kind, ascend):
    """The time model's paged gather (the chip's: values on the AIC two pages per copy, scales on the AIVs) moves,
    unit by unit, exactly the key bytes paged_work counts (and the kernel counts, test above): values plus scales."""
    from deep_gemm.heuristics.mqa import paged_scale_bytes, paged_unit_list, storage_bytes

    cores = 32
    desc = MqaDesc(32, 128, kind, kind, num_ai_cores=cores, next_n=5, ascend_kv_layout=ascend)
    config = get_best_mqa_config(desc, deep_gemm.arch.get_arch("950DT"))
    ctx = [[700 + 37 * b + t for t in range(5)] for b in range(9)]
    flat = paged_unit_list(ctx, config.block_q)
    per_token = storage_bytes(kind, 128) + paged_scale_bytes(kind, 128, ascend)
    assert sum(m["key_bytes"] for m in paged_work(desc, config, context_lens=ctx)) == \
        sum(n for _, n in flat) * per_token
    assert all(rows in (config.block_q, 5 % config.block_q) for rows, _ in flat)  # a row's last atom is short


def _paged_cache(rng, kind, ascend, batch, length, num_heads, head_dim, page):
    """q, a paged cache (its pages drawn from a shuffled pool: page pairs lie forward and backward), its table."""
    q = rng.standard_normal((batch * num_heads, head_dim)).astype(np.float32)
    k = rng.standard_normal((batch * length, head_dim)).astype(np.float32)
    if kind == "fp8":
        qp = (q.astype(E4M3).reshape(batch, 1, num_heads, head_dim), None)
        kc, ksf = per_token_cast_to_fp8(k, use_ue8m0=ascend, gran_k=32 if ascend else head_dim)
        sf = ksf.reshape(batch, length, head_dim // 32) if ascend else ksf[:, 0].reshape(batch, length)
        kv = (kc.reshape(batch, length, head_dim), sf)
    else:
        from deep_gemm.utils.math import per_token_cast_to_fp4

        q4, qsf = per_token_cast_to_fp4(q, use_ue8m0=True, gran_k=32)
        k4, ksf = per_token_cast_to_fp4(k, use_ue8m0=True, gran_k=32)
        qp = (q4.reshape(batch, 1, num_heads, head_dim // 2), qsf.reshape(batch, 1, num_heads, -1))
        kv = (k4.reshape(batch, length, head_dim // 2), ksf.reshape(batch, length, -1))
    max_pages = -(-length // page) + 1
    num_blocks = batch * max_pages + 3
    table = rng.permutation(num_blocks)[:batch * max_pages].reshape(batch, max_pages).astype(np.int32)
    cache = deep_gemm.build_paged_kv_cache(kv, table, num_blocks, page, use_ascend_kv_layout=ascend)
    return qp, cache, table


# (kv dtype, Ascend layout, page size): both dtypes, both layouts, pages of 32 and 64 (the FP8 / FP4 kernels of the
# tests above and of test_paged_mqa_logits.py: 64 / 16 heads, head_dim 128)
PAGED_GATHERS = [("fp8", True, 64), ("fp8", False, 32), ("fp8", True, 32), ("fp8", False, 64), ("fp4", True, 32),
                 ("fp4", False, 64)]


@pytest.mark.parametrize("kind,ascend,page", PAGED_GATHERS)
def test_paged_kernel_copies_match_the_model(rng, kind, ascend, page):
    """The paged kernel gathers as the model charges it (heuristics/mqa.py _paged_unit_pipes, PAGES_PER_COPY), core
    by core: per unit of n keys, ceil(ceil(n / page) / 2) AIC copies of key values GM -> L1 (a lone last page when
    the page count is odd), as many AIV copies of their scales GM -> UB, one UB -> L1 copy for MX scales (none for
    CUDA's fp32 per-key scales, which stay in UB), the values' and the scales' bytes; and the rest of the work as
    paged_work counts it."""
    from deep_gemm.heuristics.mqa import (
        PAGES_PER_COPY,
        paged_scale_bytes,
        paged_unit_list,
        split_units,
        storage_bytes,
    )

    cores = runtime.get_num_ai_cores()
    num_heads, head_dim = (64, 128) if kind == "fp8" else (16, 128)
    # contexts with odd page counts per unit (170: 3 pages of 64; 300 - 256 = 44: one page), partial last pages,
    # an empty row and units of full pages
    ctx = np.array([[300], [0], [517], [170], [97]], np.int32)
    batch, length = ctx.shape[0], int(ctx.max())
    qp, cache, table = _paged_cache(rng, kind, ascend, batch, length, num_heads, head_dim, page)
    w = rng.standard_normal((batch, num_heads)).astype(BF16)
    meta = deep_gemm.get_paged_mqa_logits_metadata(ctx, num_heads)
    got = kernel_counts(lambda: deep_gemm.fp8_fp4_paged_mqa_logits(qp, cache, w, ctx, table, meta, length,
                                                                   use_ascend_kv_layout=ascend))
    desc = MqaDesc(num_heads, head_dim, kind, kind, num_ai_cores=cores, next_n=1, ascend_kv_layout=ascend)
    config = get_best_mqa_config(desc, runtime.get_arch_spec())
    assert_same_work(got, paged_work(desc, config, context_lens=ctx.tolist()))
    token_scale = kind == "fp8" and not ascend
    flat = paged_unit_list(ctx.tolist(), config.block_q)
    starts = split_units(len(flat), cores)
    odd = 0
    for core in range(cores):
        units = flat[starts[core]:starts[core + 1]]
        pages = [-(-n // page) for _, n in units]
        copies = sum(-(-p // PAGES_PER_COPY) for p in pages)
        odd += sum(p % 2 for p in pages)
        keys = sum(n for _, n in units)
        want = {"key_copies": copies, "scale_copies": copies, "scale_l1_copies": 0 if token_scale else len(units),
                "scale_bytes": keys * paged_scale_bytes(kind, head_dim, ascend)}
        assert {k: got[core][k] for k in want} == want, f"core {core}"
        assert got[core]["key_bytes"] - got[core]["scale_bytes"] == keys * storage_bytes(kind, head_dim)
    assert odd > 0 and sum(g["key_copies"] for g in got) > 0  # some unit ends on a lone page
