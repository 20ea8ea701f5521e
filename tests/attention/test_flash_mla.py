"""FlashMLA sparse decode (flash_mla_with_kvcache) and sparse prefill (flash_mla_sparse_fwd) against the float64
reference (deep_gemm/testing/flash_mla_reference.py) with FlashMLA's tolerances; the cache layouts; bitwise stability
across core counts; the Ascend limits and bad input refused; torch tensors. Shapes are small: h_q 64 and d 512 are
fixed by the Ascend limits, so s_q, topk and the caches stay small.

NOTES: kernels compiled here (each a few minutes of numba on a loaded 2-vCPU machine, then cached): the prefill on
2 cores and under DG_SYNC_CHECK on 1 core, the decode with a V4.1 FP8 main cache and an FP4 or an FP8 extra cache on 2
cores; the slow V3.2 test adds the d_qk 576 decode and prefill.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import deep_gemm
from deep_gemm.testing import flash_mla_reference as R

BF16 = np.dtype(ml_dtypes.bfloat16)
H = 64
PAGE = 16


def _bf16(rng, shape, scale=0.1, clip=1.0):
    return np.clip(rng.standard_normal(shape) * scale, -clip, clip).astype(BF16)


def _sink(rng):
    sink = rng.standard_normal(H).astype(np.float32)
    sink[[1, 5]] = np.inf
    sink[[2, 7]] = -np.inf
    return sink


def _to_f32(x):
    return np.asarray(x).astype(np.float32)


def _check_prefill(res, ref):
    out, max_logits, lse = res
    r_out, r_ml, r_lse = ref
    R.check_allclose("out", _to_f32(out), r_out, 8e-4, 3.01 / 128, 7e-6)
    R.check_allclose("max_logits", max_logits, r_ml, 1e-6, 2.01 / 65536)
    R.check_allclose("lse", lse, r_lse, 1e-6, 2.01 / 65536)


def _check_decode(res, ref):
    out, lse = res
    r_out, r_lse = ref
    R.check_allclose("out", _to_f32(out), r_out, 1e-3, 2.01 / 128, 5e-6)
    R.check_allclose("lse", lse, r_lse, 1e-6, 8.01 / 65536)


# ---------------------------------------------------------------------------------------------------------------
# Sparse prefill

def _prefill_case(seed=0, s_q=4, s_kv=200, topk=128):
    rng = np.random.default_rng(seed)
    q = _bf16(rng, (s_q, H, 512), 0.1, 10.0)
    kv = _bf16(rng, (s_kv, 1, 512), 0.1, 10.0)
    idx = np.stack([rng.permutation(s_kv)[:topk] for _ in range(s_q)]).astype(np.int32)
    idx[0, ::7] = -1  # invalid: -1, beyond s_kv, huge, very negative
    idx[1, ::5] = s_kv
    idx[1, 3] = 2147483647
    idx[2, 9] = -2147483648
    idx[3, :] = -1  # a query with no valid token: out 0, max_logits -inf, lse +inf
    topk_length = np.array([topk, 70, 0, topk], np.int32)
    return dict(q=q, kv=kv, indices=idx[:, None, :], sm_scale=0.5, attn_sink=_sink(rng), topk_length=topk_length)


@pytest.fixture(scope="module")
def prefill_case():
    case = _prefill_case()
    with deep_gemm.runtime_scope(num_ai_cores=2):
        res = deep_gemm.flash_mla_sparse_fwd(**case)
    return case, res


def test_prefill_matches_reference(prefill_case):
    case, res = prefill_case
    assert res[0].dtype == BF16 and res[0].shape == (4, H, 512)
    assert res[1].dtype == np.float32 and res[1].shape == (4, H) and res[2].shape == (4, H)
    ref = R.ref_sparse_prefill(case["q"], case["kv"], case["indices"], case["sm_scale"], 512, case["attn_sink"],
                               case["topk_length"])
    _check_prefill(res, ref)
    # lonely rows (topk_length 0, every index invalid) and +inf sinks give zeros
    out = _to_f32(res[0])
    assert not out[2].any() and not out[3].any() and not out[:, [1, 5]].any()
    assert np.isposinf(res[2][2]).all() and np.isneginf(res[1][3]).all()


def test_prefill_without_sink_or_lengths_bitwise_across_core_counts_and_sync_checked(prefill_case, monkeypatch):
    """2 cores, and 1 core under DG_SYNC_CHECK=1 (every SetFlag / WaitFlag and cross-core flag of the mixed kernel
    recorded and checked: a protocol error raises SyncCheckError): bitwise the same results."""
    from deep_gemm import envs

    case = dict(prefill_case[0], attn_sink=None, topk_length=None)
    ref = R.ref_sparse_prefill(case["q"], case["kv"], case["indices"], case["sm_scale"])
    with deep_gemm.runtime_scope(num_ai_cores=2):
        two = deep_gemm.flash_mla_sparse_fwd(**case)
    _check_prefill(two, ref)
    monkeypatch.setenv(envs.DG_SYNC_CHECK.name, "1")
    with deep_gemm.runtime_scope(num_ai_cores=1):
        one = deep_gemm.flash_mla_sparse_fwd(**case)
    for a, b in zip(two, one, strict=True):
        assert np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


# ---------------------------------------------------------------------------------------------------------------
# Sparse decode

def _paged(rng, layout, num_blocks, b, topk, nan_unused=True):
    """A quantized paged cache, its dequantized values, a block table and cache indices [b, s_q=2, topk]."""
    d = R.HEAD_DIMS[layout]
    k = _bf16(rng, (num_blocks, PAGE, 1, d))
    cache = R.quantize_k_cache(k, layout)
    values = R.dequantize_k_cache(cache, layout)
    blocks = num_blocks // b
    table = rng.permutation(num_blocks).astype(np.int32).reshape(b, blocks)
    abs_idx = np.stack([np.stack([rng.permutation(blocks * PAGE)[:topk] for _ in range(2)]) for _ in range(b)])
    abs_idx[0, 0, ::3] = -1
    idx = R.abs_indices2indices_in_kvcache(abs_idx.astype(np.int32), table, PAGE)
    return cache, values, idx


def _decode_case(seed, main, extra, b=2, topk=80, extra_topk=48):
    rng = np.random.default_rng(seed)
    d = R.HEAD_DIMS[main]
    q = _bf16(rng, (b, 2, H, d), 1.0)
    cache, values, idx = _paged(rng, main, 8, b, topk)
    case = dict(q=q, k_cache=cache, block_table=None, cache_seqlens=None, head_dim_v=512,
                softmax_scale=d ** -0.55, is_fp8_kvcache=True, indices=idx, attn_sink=_sink(rng),
                topk_length=np.array([topk, 33], np.int32)[:b])
    ref_args = dict(cache_values=values)
    if extra is not None:
        e_cache, e_values, e_idx = _paged(rng, extra, 8, b, extra_topk)
        case.update(extra_k_cache=e_cache, extra_indices_in_kvcache=e_idx,
                    extra_topk_length=np.array([0, extra_topk - 5], np.int32)[:b])
        ref_args.update(extra_cache_values=e_values)
    return case, ref_args


def _run_decode(case):
    meta, _ = deep_gemm.get_mla_metadata()
    return deep_gemm.flash_mla_with_kvcache(tile_scheduler_metadata=meta, **case)


def _ref_decode(case, ref_args):
    return R.ref_sparse_decode(case["q"], ref_args["cache_values"], case["indices"], case["softmax_scale"], 512,
                               case["attn_sink"], case["topk_length"], ref_args.get("extra_cache_values"),
                               case.get("extra_indices_in_kvcache"), case.get("extra_topk_length"))


def test_decode_v41_fp8_with_fp4_extra_cache():
    case, ref_args = _decode_case(1, "v41_fp8", "v41_fp4")
    with deep_gemm.runtime_scope(num_ai_cores=2):
        out, lse = _run_decode(case)
    assert out.dtype == BF16 and out.shape == (2, 2, H, 512) and lse.dtype == np.float32 and lse.shape == (2, H, 2)
    _check_decode((out, lse), _ref_decode(case, ref_args))


def test_decode_v41_fp8_main_only_and_fp8_extra():
    case, ref_args = _decode_case(2, "v41_fp8", "v41_fp8")
    main_only = {k: v for k, v in case.items() if not k.startswith("extra")}
    with deep_gemm.runtime_scope(num_ai_cores=2):
        _check_decode(_run_decode(main_only), _ref_decode(main_only, {"cache_values": ref_args["cache_values"]}))
        _check_decode(_run_decode(case), _ref_decode(case, ref_args))


@pytest.mark.slow
def test_v32_shapes():
    """CUDA FlashMLA's V3.2 shapes: the 656-byte cache (d_qk 576) in decode, d_qk 576 in prefill (48-token tiles)."""
    case, ref_args = _decode_case(3, "v32_fp8", None)
    with deep_gemm.runtime_scope(num_ai_cores=2):
        _check_decode(_run_decode(case), _ref_decode(case, ref_args))
    rng = np.random.default_rng(6)
    q, kv = _bf16(rng, (3, H, 576), 0.1, 10.0), _bf16(rng, (150, 1, 576), 0.1, 10.0)
    idx = np.stack([rng.permutation(150)[:100] for _ in range(3)]).astype(np.int32)[:, None, :]
    with deep_gemm.runtime_scope(num_ai_cores=2):
        res = deep_gemm.flash_mla_sparse_fwd(q, kv, idx, 0.05)
    _check_prefill(res, R.ref_sparse_prefill(q, kv, idx, 0.05))


# ---------------------------------------------------------------------------------------------------------------
# Layouts: quantise -> dequantise round trips, the bytes where they are

@pytest.mark.parametrize("layout", ["v41_fp8", "v32_fp8", "v41_fp4"])
def test_layout_round_trip(layout):
    rng = np.random.default_rng(4)
    d = R.HEAD_DIMS[layout]
    k = _bf16(rng, (3, 5, 1, d), 0.3)
    cache = R.quantize_k_cache(k, layout)
    assert cache.dtype == np.uint8 and cache.shape == (3, 5, 1, R.TOKEN_BYTES[layout])
    values = R.dequantize_k_cache(cache, layout)
    # the dequantized values are a fixed point of quantise -> dequantise (a scale may move by a power of two when the
    # block's maximum rounded to a binade edge; the values do not)
    again = R.dequantize_k_cache(R.quantize_k_cache(values, layout), layout)
    assert np.array_equal(again.view(np.uint16), values.view(np.uint16))
    err = np.abs(values.astype(np.float32) - k.astype(np.float32)).max()
    assert err <= {"v41_fp8": 1 / 16, "v32_fp8": 1 / 16, "v41_fp4": 0.15}[layout]  # half an ulp of the largest


def test_layout_bytes():
    k = np.zeros((1, 2, 1, 512), BF16)
    k[0, 0, 0, :] = 1.0
    k[0, 0, 0, 40] = 3.0
    v41 = R.quantize_k_cache(k, "v41_fp8")[0, 0, 0]
    # scale of the first 32 dims: 2^ceil(log2(3 / 448)) = 2^-7 (UE8M0 byte 120); later blocks 2^-8 (119)
    assert v41[512] == 127 - 8 and v41[513] == 127 - 7 and list(v41[514:528]) == [119] * 14
    assert v41[0] == np.float32(256.0).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    fp4 = R.quantize_k_cache(k, "v41_fp4")[0, 0, 0]
    # 1.0 / (1 / 6) = 6: code 7 in both nibbles; scale e4m3(1 / 6) per 16 dims
    assert fp4[0] == 0x77 and fp4[256] == np.float32(1 / 6).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    v32 = R.quantize_k_cache(np.concatenate([k, np.ones((1, 2, 1, 64), BF16)], axis=-1), "v32_fp8")[0, 0, 0]
    assert v32[512:516].view(np.float32)[0] == 2.0 ** -7 and v32[528:530].view(BF16)[0] == 1.0
    assert np.array_equal(R.dequantize_k_cache(R.quantize_k_cache(k, "v41_fp8"), "v41_fp8"), k)


# ---------------------------------------------------------------------------------------------------------------
# The Ascend limits and bad input, refused before anything is written or compiled

def _small_decode():
    rng = np.random.default_rng(5)
    cache = R.quantize_k_cache(_bf16(rng, (2, PAGE, 1, 512)), "v41_fp8")
    q = _bf16(rng, (1, 1, H, 512))
    idx = np.zeros((1, 1, 8), np.int32)
    return dict(q=q, k_cache=cache, block_table=None, cache_seqlens=None, head_dim_v=512, is_fp8_kvcache=True,
                indices=idx)


@pytest.mark.parametrize("change, error", [
    (dict(q=np.zeros((1, 1, 128, 512), BF16)), "h_q=128"),
    (dict(q=np.zeros((1, 1, H, 576), BF16)), "d_qk=576"),
    (dict(q=np.zeros((1, 1, H, 512), np.float32)), "bfloat16"),
    (dict(indices=None), "dense decode"),
    (dict(is_fp8_kvcache=False), "is_fp8_kvcache"),
    (dict(causal=True), "causal"),
    (dict(head_dim_v=576), "head_dim_v"),
    (dict(num_splits=4), "num_splits"),
    (dict(k_cache=np.zeros((2, 1, 1, 528), np.uint8)), "page_block_size 1"),
    (dict(k_cache=np.zeros((2, PAGE, 1, 288), np.uint8)), "FP4"),
    (dict(k_cache=np.zeros((2, PAGE, 1, 600), np.uint8)), "600 bytes"),
    (dict(indices=np.zeros((1, 1, 8), np.int64)), "int32"),
    (dict(topk_length=np.zeros(2, np.int32)), "topk_length"),
    (dict(attn_sink=np.zeros(H, np.float64)), "attn_sink"),
    (dict(extra_k_cache=np.zeros((2, PAGE, 1, 528), np.uint8)), "together"),
    (dict(extra_k_cache=np.zeros((2, PAGE, 1, 656), np.uint8), extra_indices_in_kvcache=np.zeros((1, 1, 4),
                                                                                                  np.int32)),
     "cannot extend"),
])
def test_decode_refuses_bad_input(change, error):
    case = dict(_small_decode(), **change)
    meta, _ = deep_gemm.get_mla_metadata()
    with pytest.raises((ValueError, TypeError), match=error):
        deep_gemm.flash_mla_with_kvcache(tile_scheduler_metadata=meta, **case)
    assert not meta.have_initialized and meta.config is None


def test_metadata_is_filled_once_and_checked():
    meta, none = deep_gemm.get_mla_metadata(1, 2, x=3)
    assert none is None and isinstance(meta, deep_gemm.FlashMLASchedMeta) and not meta.have_initialized
    case = _small_decode()
    with pytest.raises(TypeError, match="FlashMLASchedMeta"):
        deep_gemm.flash_mla_with_kvcache(tile_scheduler_metadata=object(), **case)
    # an empty batch returns at once but fills the metadata; a later call of another shape is refused
    empty = dict(case, q=np.zeros((0, 1, H, 512), BF16), indices=np.zeros((0, 1, 8), np.int32))
    out, lse = deep_gemm.flash_mla_with_kvcache(tile_scheduler_metadata=meta, **empty)
    assert out.shape == (0, 1, H, 512) and lse.shape == (0, H, 1) and meta.have_initialized
    with pytest.raises(ValueError, match="disagrees"):
        deep_gemm.flash_mla_with_kvcache(tile_scheduler_metadata=meta, **case)


@pytest.mark.parametrize("change, error", [
    (dict(q=np.zeros((2, 128, 512), BF16)), "h_q=128"),
    (dict(q=np.zeros((2, H, 256), BF16), kv=np.zeros((10, 1, 256), BF16)), "d_qk=256"),
    (dict(kv=np.zeros((10, 2, 512), BF16)), "kv must be"),
    (dict(kv=np.zeros((10, 1, 1024), BF16)[:, :, ::2]), "contiguous"),
    (dict(indices=np.zeros((2, 2, 8), np.int32)), "indices"),
    (dict(indices=np.zeros((2, 1, 8), np.uint32)), "int32"),
    (dict(d_v=256), "d_v"),
    (dict(sm_scale="0.5"), "sm_scale"),
    (dict(topk_length=np.zeros(3, np.int32)), "topk_length"),
    (dict(attn_sink=np.zeros(32, np.float32)), "attn_sink"),
])
def test_prefill_refuses_bad_input(change, error):
    case = dict(q=np.zeros((2, H, 512), BF16), kv=np.zeros((10, 1, 512), BF16),
                indices=np.zeros((2, 1, 8), np.int32), sm_scale=0.5)
    case.update(change)
    with pytest.raises((ValueError, TypeError), match=error):
        deep_gemm.flash_mla_sparse_fwd(**case)


def test_prefill_early_return():
    out, ml, lse = deep_gemm.flash_mla_sparse_fwd(np.zeros((3, H, 512), BF16), np.zeros((10, 1, 512), BF16),
                                                  np.zeros((3, 1, 0), np.int32), 0.5)
    assert not _to_f32(out).any() and np.isneginf(ml).all() and np.isposinf(lse).all()


# ---------------------------------------------------------------------------------------------------------------
# torch tensors: one call each, the same bits as numpy

def test_torch_tensors(prefill_case):
    torch = pytest.importorskip("torch")
    case, res = prefill_case
    t = {k: (torch.from_numpy(v.view(np.int16)).view(torch.bfloat16) if v.dtype == BF16 else torch.from_numpy(v))
         for k, v in case.items() if isinstance(v, np.ndarray)}
    with deep_gemm.runtime_scope(num_ai_cores=2):
        out, ml, lse = deep_gemm.flash_mla_sparse_fwd(sm_scale=case["sm_scale"], **t)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert np.array_equal(out.view(torch.int16).numpy(), res[0].view(np.int16))
    assert np.array_equal(lse.numpy(), res[2]) and np.array_equal(ml.numpy(), res[1])
    dcase, _ = _decode_case(1, "v41_fp8", "v41_fp4")
    with deep_gemm.runtime_scope(num_ai_cores=2):
        ref_out, ref_lse = _run_decode(dcase)
        td = {k: (torch.from_numpy(v.view(np.int16)).view(torch.bfloat16) if v.dtype == BF16 else torch.from_numpy(v))
              if isinstance(v, np.ndarray) else v for k, v in dcase.items()}
        out, lse = _run_decode(td)
    assert isinstance(lse, torch.Tensor) and np.array_equal(out.view(torch.int16).numpy(), ref_out.view(np.int16))
    assert np.array_equal(lse.numpy(), ref_lse)


# ---------------------------------------------------------------------------------------------------------------
# The chip model (estimate_flash_mla_*) and its published rows

def test_estimates_follow_the_kernels_structure():
    est = deep_gemm.estimate_flash_mla_sparse_fwd(4096, 32768, 640, arch="950DT", num_ai_cores=32)
    # Cube busy time = FlashMLA's FLOP count at the 950DT's BF16 peak (every tile is whole: 640 = 10 x 64)
    flops = 2 * 4096 * 640 * 64 * 1024
    assert est.cube_us == pytest.approx(flops / (32 * 8192 * 1.65e9) * 1e6, rel=1e-9)
    assert est.tiles_per_unit == 10 and est.busiest_units == 128 and est.time_us >= est.fixpipe_us
    fp8 = deep_gemm.estimate_flash_mla_with_kvcache(64, 4, 128, 512, extra_kv_layout="v41_fp8", arch="950DT")
    fp4 = deep_gemm.estimate_flash_mla_with_kvcache(64, 4, 128, 512, extra_kv_layout="v41_fp4", arch="950DT")
    assert fp4.hbm_us < fp8.hbm_us and fp4.l2_us < fp8.l2_us  # 288-byte tokens against 528
    with pytest.raises(ValueError, match="kv_layout"):
        deep_gemm.estimate_flash_mla_with_kvcache(1, 1, 64, kv_layout="v41_fp4")
    with pytest.raises(TypeError, match="s_q"):
        deep_gemm.estimate_flash_mla_sparse_fwd("4096", 1, 64)


def test_published_rows():
    from deep_gemm.estimate.flash_mla import published_checks
    from deep_gemm.estimate.published import FAMILY_MODULES

    assert "flash_mla" in FAMILY_MODULES
    rows = published_checks("950DT")
    assert len(rows) == 11 and {r.family for r in rows} == {"flash_mla_sparse_fwd", "flash_mla_with_kvcache"}
    prefill = rows[0]
    assert prefill.published_us == pytest.approx(2 * 4096 * 640 * 64 * 1024 / 410e12 * 1e6)
    assert all(np.isfinite(r.error) and abs(r.error) < 0.5 for r in rows)
    assert published_checks("910B2") == []
