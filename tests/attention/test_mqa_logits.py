"""fp8_fp4_mqa_logits (ragged key ranges) against float64 references: CUDA DeepGEMM's FP8 form (q without scales,
an fp32 scale per key) and DeepGEMM-Ascend's MX forms (UE8M0 scales per 32 of head_dim, FP8 and FP4), ragged and
empty ranges, every head-count class the kernel's block_q depends on and both head dims, the compressed mode, the
-inf mask, the padded row stride, bitwise equality over core counts and reruns, and bad input.

NOTES: one kernel serves every head count and head dim of a dtype pair (they are runtime arguments), so these tests
compile two: FP8 and FP4 on 32 cores. Bitwise equality on 1 and 32 cores, with the synchronisation checker, is in
test_paged_mqa_logits.py (one checked kernel per template).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import deep_gemm
from deep_gemm.testing import calc_diff
from deep_gemm.utils import per_token_cast_to_fp8
from deep_gemm.utils.math import cast_back_from_fp4, per_token_cast_to_fp4

E4M3 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16


def ranges(rng, seq_len, seq_len_kv):
    """Ragged [ks, ke): causal-like windows, empty rows (ks == ke, also at 0 and at the end), a full row, ranges
    starting and ending inside and on tile boundaries."""
    ks = rng.integers(0, seq_len_kv // 2, seq_len)
    ke = np.minimum(ks + rng.integers(0, seq_len_kv, seq_len), seq_len_kv)
    ks[0], ke[0] = 0, seq_len_kv
    ks[1], ke[1] = 5, 5
    ks[2], ke[2] = 0, 0
    ks[3], ke[3] = seq_len_kv, seq_len_kv
    ks[4], ke[4] = 256, 257
    ks[-1], ke[-1] = 127, seq_len_kv - 1
    return ks.astype(np.int32), ke.astype(np.int32)


def reference(q, kv, kv_scale, weights, ks, ke):
    """float64 logits [S, S_kv], -inf outside [ks, ke): sum_h relu(q[i, h] . kv[j] * scale[j]) * w[i, h]."""
    q, kv, w = (np.asarray(x, np.float64) for x in (q, kv, weights))
    scores = np.einsum("shd,jd->shj", q, kv)
    if kv_scale is not None:
        scores = scores * np.asarray(kv_scale, np.float64)[None, None, :]
    logits = (np.maximum(scores, 0) * w[:, :, None]).sum(axis=1)
    cols = np.arange(kv.shape[0])[None, :]
    return np.where((cols >= ks[:, None]) & (cols < ke[:, None]), logits, -np.inf)


def check_logits(got, ref, tol):
    got = got.astype(np.float64)
    mask = np.isfinite(ref)
    np.testing.assert_array_equal(np.isneginf(got), ~mask)  # identical -inf masks (clean_logits)
    assert calc_diff(got[mask], ref[mask]) < tol


def fp8_cuda_inputs(rng, seq_len, seq_len_kv, num_heads, head_dim):
    """CUDA DeepGEMM's FP8 form: q cast to e4m3 as is, kv per key with an fp32 scale; the exact (unquantized)
    inputs and the dequantized ones."""
    q = rng.standard_normal((seq_len, num_heads, head_dim)).astype(np.float32)
    kv = rng.standard_normal((seq_len_kv, head_dim)).astype(np.float32)
    w = rng.standard_normal((seq_len, num_heads)).astype(BF16)
    q8 = q.astype(E4M3)
    kv8, kv_sf = per_token_cast_to_fp8(kv, use_ue8m0=False, gran_k=head_dim)
    return (q8, None), (kv8, kv_sf[:, 0].copy()), w, (q, kv), (q8.astype(np.float64), kv8.astype(np.float64),
                                                                kv_sf[:, 0])


@pytest.mark.parametrize("num_heads,head_dim", [(4, 64), (32, 128), (64, 128)])
def test_fp8_cuda_form_against_references(rng, num_heads, head_dim):
    seq_len, seq_len_kv = 37, 300  # partial query blocks and key tiles
    q, kv, w, (qx, kvx), (qd, kvd, scale) = fp8_cuda_inputs(rng, seq_len, seq_len_kv, num_heads, head_dim)
    ks, ke = ranges(rng, seq_len, seq_len_kv)
    logits = deep_gemm.fp8_fp4_mqa_logits(q, kv, w, ks, ke)
    assert logits.dtype == BF16 and logits.shape == (seq_len, seq_len_kv)
    assert logits.strides == (512 * 2, 2)  # row stride padded to 512 bytes: 300 -> 512 elements
    check_logits(logits, reference(qx, kvx, None, w, ks, ke), 1e-3)
    check_logits(logits, reference(qd, kvd, scale, w, ks, ke), 5e-6)
    # weights in fp32 (CUDA DeepGEMM's dtype) give the same bits; reruns are bitwise identical
    again = deep_gemm.fp8_fp4_mqa_logits(q, kv, w.astype(np.float32), ks, ke)
    np.testing.assert_array_equal(again.view(np.uint16), logits.view(np.uint16))


def test_reversed_and_strided_operands_give_the_same_bits(rng):
    # views with negative or non-unit strides are laid out on the host; the kernel sees the same values
    seq_len, seq_len_kv, num_heads, head_dim = 9, 300, 4, 64
    q, kv, w, _, _ = fp8_cuda_inputs(rng, seq_len, seq_len_kv, num_heads, head_dim)
    ks, ke = ranges(rng, seq_len, seq_len_kv)
    logits = deep_gemm.fp8_fp4_mqa_logits(q, kv, w, ks, ke)
    kv_rev = (kv[0][::-1].copy()[::-1], kv[1][::-1].copy()[::-1])  # same values, negative row strides
    q_rev = (q[0][::-1].copy()[::-1], None)
    assert kv_rev[0].strides[0] < 0 and q_rev[0].strides[0] < 0
    wide = np.zeros((seq_len_kv, 2 * head_dim), kv[0].dtype)
    wide[:, ::2] = kv[0]
    for args in ((q_rev, kv_rev), (q, (wide[:, ::2], kv[1]))):
        got = deep_gemm.fp8_fp4_mqa_logits(*args, w[::-1].copy()[::-1], ks, ke)
        np.testing.assert_array_equal(got.view(np.uint16), logits.view(np.uint16))


def test_ascend_mx_forms_fp8(rng):
    seq_len, seq_len_kv, num_heads, head_dim = 20, 300, 16, 128
    q = rng.standard_normal((seq_len * num_heads, head_dim)).astype(np.float32)
    kv = rng.standard_normal((seq_len_kv, head_dim)).astype(np.float32) * 3
    w = rng.standard_normal((seq_len, num_heads)).astype(BF16)
    q8, q_sf = per_token_cast_to_fp8(q, use_ue8m0=True, gran_k=32)
    kv8, kv_sf = per_token_cast_to_fp8(kv, use_ue8m0=True, gran_k=32)
    ks, ke = ranges(rng, seq_len, seq_len_kv)
    q8 = q8.reshape(seq_len, num_heads, head_dim)
    q_sf = q_sf.reshape(seq_len, num_heads, head_dim // 32)
    logits = deep_gemm.fp8_fp4_mqa_logits((q8, q_sf), (kv8, kv_sf), w, ks, ke)
    qd = (q8.astype(np.float64) * np.repeat(q_sf, 32, axis=-1))
    kvd = kv8.astype(np.float64) * np.repeat(kv_sf, 32, axis=-1)
    check_logits(logits, reference(q.reshape(seq_len, num_heads, head_dim), kv, None, w, ks, ke), 1e-3)
    check_logits(logits, reference(qd, kvd, None, w, ks, ke), 5e-6)
    # DeepGEMM-Ascend's int16 pairs (required layout, MN-major) give the same bits
    sfq16 = deep_gemm.transform_sf_into_required_layout(q_sf.reshape(-1, head_dim // 32), seq_len * num_heads,
                                                        head_dim, (1, 32))
    sfkv16 = deep_gemm.transform_sf_into_required_layout(kv_sf, seq_len_kv, head_dim, (1, 32))
    packed = deep_gemm.fp8_fp4_mqa_logits((q8, sfq16.reshape(seq_len, num_heads, head_dim // 64)), (kv8, sfkv16), w,
                                          ks, ke)
    np.testing.assert_array_equal(packed.view(np.uint16), logits.view(np.uint16))


@pytest.mark.parametrize("num_heads,head_dim", [(8, 64), (64, 128)])
def test_fp4_against_references(rng, num_heads, head_dim):
    seq_len, seq_len_kv = 24, 280
    q = rng.standard_normal((seq_len * num_heads, head_dim)).astype(np.float32)
    kv = rng.standard_normal((seq_len_kv, head_dim)).astype(np.float32)
    w = rng.standard_normal((seq_len, num_heads)).astype(BF16)
    q4, q_sf = per_token_cast_to_fp4(q, use_ue8m0=True, gran_k=32)
    kv4, kv_sf = per_token_cast_to_fp4(kv, use_ue8m0=True, gran_k=32)
    ks, ke = ranges(rng, seq_len, seq_len_kv)
    shape = (seq_len, num_heads)
    logits = deep_gemm.fp8_fp4_mqa_logits((q4.reshape(*shape, head_dim // 2), q_sf.reshape(*shape, -1)),
                                          (kv4, kv_sf), w, ks, ke)
    qd = cast_back_from_fp4(q4, q_sf, gran_k=32).reshape(*shape, head_dim)
    kvd = cast_back_from_fp4(kv4, kv_sf, gran_k=32)
    check_logits(logits, reference(q.reshape(*shape, head_dim), kv, None, w, ks, ke), 0.02)
    check_logits(logits, reference(qd, kvd, None, w, ks, ke), 5e-6)
    # CUDA DeepGEMM's FP4 scale form (int32, four UE8M0 bytes) gives the same bits
    q_i32 = per_token_cast_to_fp4(q, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)[1]
    kv_i32 = per_token_cast_to_fp4(kv, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)[1]
    cuda = deep_gemm.fp8_fp4_mqa_logits((q4.reshape(*shape, head_dim // 2), q_i32.reshape(shape)),
                                        (kv4, kv_i32.reshape(-1)), w, ks, ke)
    np.testing.assert_array_equal(cuda.view(np.uint16), logits.view(np.uint16))


def test_compressed_mode_and_legacy_name(rng):
    seq_len, seq_len_kv, num_heads, head_dim = 30, 400, 4, 64
    q, kv, w, _, _ = fp8_cuda_inputs(rng, seq_len, seq_len_kv, num_heads, head_dim)
    ks, ke = ranges(rng, seq_len, seq_len_kv)
    full = deep_gemm.fp8_fp4_mqa_logits(q, kv, w, ks, ke)
    max_len = int((ke - ks).max())
    for clean in (True, False):
        comp = deep_gemm.fp8_fp4_mqa_logits(q, kv, w, ks, ke, max_seqlen_k=max_len, clean_logits=clean)
        assert comp.shape == (seq_len, max_len) and comp.strides[0] % 512 == 0
        for i in range(seq_len):
            n = ke[i] - ks[i]
            np.testing.assert_array_equal(comp[i, :n].view(np.uint16), full[i, ks[i]:ke[i]].view(np.uint16))
            if clean:
                assert np.isneginf(comp[i, n:].astype(np.float32)).all()
    # CUDA DeepGEMM's legacy name and argument order (clean_logits, max_seqlen_k)
    legacy = deep_gemm.fp8_mqa_logits(q, kv, w, ks, ke, False, max_len)
    for i in range(seq_len):
        n = ke[i] - ks[i]
        np.testing.assert_array_equal(legacy[i, :n].view(np.uint16), full[i, ks[i]:ke[i]].view(np.uint16))
    # without clean_logits, only the rows' ranges are defined: the same bits as with it
    unclean = deep_gemm.fp8_fp4_mqa_logits(q, kv, w, ks, ke, clean_logits=False)
    for i in range(seq_len):
        np.testing.assert_array_equal(unclean[i, ks[i]:ke[i]].view(np.uint16), full[i, ks[i]:ke[i]].view(np.uint16))


def test_empty_problems(rng):
    q, kv, w, _, _ = fp8_cuda_inputs(rng, 3, 0, 4, 64)
    zeros = np.zeros(3, np.int32)
    assert deep_gemm.fp8_fp4_mqa_logits(q, kv, w, zeros, zeros).shape == (3, 0)
    q, kv, w, _, _ = fp8_cuda_inputs(rng, 0, 10, 4, 64)
    empty = np.zeros(0, np.int32)
    assert deep_gemm.fp8_fp4_mqa_logits(q, kv, w, empty, empty).shape == (0, 10)


def _bad_cases():
    rng = np.random.default_rng(1)
    q, kv, w, _, _ = fp8_cuda_inputs(rng, 6, 50, 8, 64)
    ks = np.zeros(6, np.int32)
    ke = np.full(6, 50, np.int32)
    q3 = rng.standard_normal((6, 6, 64)).astype(E4M3)
    q68 = rng.standard_normal((6, 68, 64)).astype(E4M3)
    q96 = rng.standard_normal((6, 8, 96)).astype(E4M3)
    ks_big = ks.copy()
    ks_big[4] = 7
    ke_small = ke.copy()
    ke_small[4] = 3
    ke_far = ke.copy()
    ke_far[2] = 51
    return {
        "heads not a multiple of 4": (((q3, None), kv, w[:, :6], ks, ke), {}, ValueError, "num_heads=6"),
        "heads above 64": (((q68, None), kv, np.zeros((6, 68), BF16), ks, ke), {}, ValueError, "num_heads=68"),
        "head_dim 96": (((q96, None), kv, w, ks, ke), {}, ValueError, "head_dim=96"),
        "ks > ke": ((q, kv, w, ks_big, ke_small), {}, ValueError,
                    r"cu_seq_len_k_start\[4\]=7 > cu_seq_len_k_end\[4\]=3"),
        "ke beyond keys": ((q, kv, w, ks, ke_far), {}, ValueError, r"cu_seq_len_k_end\[2\]=51 is beyond the 50 keys"),
        "too long for max_seqlen_k": ((q, kv, w, ks, ke), {"max_seqlen_k": 40}, ValueError, "row 0.*max_seqlen_k=40"),
        "q dtype": (((q[0].astype(np.float32), None), kv, w, ks, ke), {}, TypeError, r"q\[0\] must be float8"),
        "weights dtype": ((q, kv, w.astype(np.float16), ks, ke), {}, TypeError, "weights.dtype=float16"),
        "weights shape": ((q, kv, w[:, :4], ks, ke), {}, ValueError, r"weights.shape=\(6, 4\)"),
        "ks dtype": ((q, kv, w, ks.astype(np.float32), ke), {}, TypeError, "cu_seq_len_k_start.dtype=float32"),
        "kv scale length": ((q, (kv[0], kv[1][:10]), w, ks, ke), {}, ValueError, r"kv\[1\].shape=\(10,\)"),
        "kv head dim": ((q, (kv[0][:, :32], kv[1]), w, ks, ke), {}, ValueError, r"kv\[0\].shape=\(50, 32\)"),
        "q not a pair": ((q[0], kv, w, ks, ke), {}, TypeError, "q must be a"),
        "max_seqlen_k bool (CUDA order)": ((q, kv, w, ks, ke, True), {}, TypeError, "clean_logits first"),
        "non power-of-two MX scale": (((q[0], np.full((6, 8, 2), 0.3, np.float32)), kv, w, ks, ke), {}, ValueError,
                                      r"q\[1\]"),
    }


BAD = _bad_cases()


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_names_argument_and_index(case):
    args, kwargs, error, pattern = BAD[case]
    before = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    with pytest.raises(error, match=pattern):
        deep_gemm.fp8_fp4_mqa_logits(*args, **kwargs)
    for a, b in zip(args, before, strict=True):  # inputs untouched
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
