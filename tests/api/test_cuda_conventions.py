"""CUDA DeepGEMM's calling conventions on the grouped GEMMs: an mk alignment other than DeepGEMM-Ascend's 256 (the
M-grouped psum layout and the K-grouped layouts follow it, the schedule stays right) and ``ks_cpu`` holding each
group's K aligned up, checked against float64 references computed here and against the ``aclnn_*`` references.

Shapes follow tests/api/test_grouped.py (N = 64, K = 256 for M-grouped) so compiled kernels are shared.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import deep_gemm
from deep_gemm.testing import (
    assert_bitwise_equal,
    bf16_operand,
    calc_diff,
    dequantize_fp8,
    fp8_operand,
    grouped_layouts,
)

BF16 = ml_dtypes.bfloat16
N, K = 64, 256


@pytest.fixture
def alignment(request):
    """Sets the mk alignment for one test and restores DeepGEMM-Ascend's 256 after it."""
    deep_gemm.set_mk_alignment_for_contiguous_layout(request.param)
    try:
        yield request.param
    finally:
        deep_gemm.set_mk_alignment_for_contiguous_layout(256)


def _garbage(rng, shape, dtype=BF16):
    return rng.standard_normal(shape).astype(dtype)


def _bits(x):
    return x.view(np.uint16) if x.dtype == BF16 else x


def _starts(per_row, sizes):
    return [int(np.nonzero(per_row == g)[0][0]) if s else 0 for g, s in enumerate(sizes)]


# ------------------------------------------------------------------------------------------------------------------
# M-grouped contiguous at alignments 128 and 32


@pytest.mark.parametrize(("alignment", "kind", "sizes"), [
    (128, "fp8", [100, 0, 130, 1]),  # group starts 128 and 384: inside a 256-row BLOCK_M
    (32, "bf16", [7, 0, 40, 1, 300]),  # starts 32, 96, 128
], indirect=["alignment"], ids=["128-fp8", "32-bf16"])
def test_m_grouped_contiguous_at_smaller_alignment(rng, alignment, kind, sizes):
    assert deep_gemm.get_mk_alignment_for_contiguous_layout() == alignment
    psum, per_row, m = grouped_layouts(sizes, alignment=alignment, extra_rows=3)
    starts = _starts(per_row, sizes)
    assert any(s % 256 for s in starts)
    if kind == "fp8":
        x, sfx = fp8_operand(rng, m, K)
        a, a_val = (x, sfx), dequantize_fp8(x, sfx)
        bs = [fp8_operand(rng, N, K) for _ in sizes]
        b = (np.stack([q for q, _ in bs]), np.stack([s for _, s in bs]))
        b_vals = [dequantize_fp8(q, s) for q, s in bs]
        fn, ref_fn, tol = (deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous,
                           deep_gemm.aclnn_m_grouped_fp8_fp4_gemm_nt_contiguous, 1e-3)
    else:
        a = bf16_operand(rng, m, K)
        a_val = a.astype(np.float64)
        b = np.stack([bf16_operand(rng, N, K) for _ in sizes])
        b_vals = [b[g].astype(np.float64) for g in range(len(sizes))]
        fn, ref_fn, tol = (deep_gemm.m_grouped_bf16_gemm_nt_contiguous,
                           deep_gemm.aclnn_m_grouped_bf16_gemm_nt_contiguous, 1e-5)
    ref = np.zeros((m, N))
    for g, (s, rows) in enumerate(zip(starts, sizes, strict=True)):
        ref[s:s + rows] = a_val[s:s + rows] @ b_vals[g].T
    real, padding = per_row >= 0, per_row < 0

    d = _garbage(rng, (m, N))
    fn(a, b, d, psum)
    assert calc_diff(d[real].astype(np.float64), ref[real]) < tol
    assert not d[padding].astype(np.float32).any()  # ensure_zero_padding=True: written by the kernel
    d_ref = _garbage(rng, (m, N))
    ref_fn(a, b, d_ref, psum)
    assert calc_diff(d.astype(np.float64), d_ref.astype(np.float64)) < 1e-6
    assert not d_ref[padding].astype(np.float32).any()

    # The per-row layout gives the same D; ensure_zero_padding=False leaves the padding as it was
    d_rows = _garbage(rng, (m, N))
    fn(a, b, d_rows, per_row, use_psum_layout=False)
    assert_bitwise_equal(_bits(d_rows), _bits(d), "per-row vs psum layout")
    d_keep = _garbage(rng, (m, N))
    before = d_keep.copy()
    fn(a, b, d_keep, psum, ensure_zero_padding=False)
    assert_bitwise_equal(_bits(d_keep[padding]), _bits(before[padding]), "untouched padding")
    assert_bitwise_equal(_bits(d_keep[real]), _bits(d[real]), "same real rows")

    # A group ending before its start, align(previous end, alignment), is refused naming it
    if alignment == 128:
        with pytest.raises(ValueError, match=r"grouped_layout\[2\]=120 ends inside the alignment padding of the "
                                             r"previous group: group 2 starts at align\(100, 128\) = 128"):
            fn(a, b, _garbage(rng, (m, N)), np.array([100, 100, 120, 385], np.int32))


# ------------------------------------------------------------------------------------------------------------------
# K-grouped at alignments 128 and 32; ks_cpu as upper bounds


def _k_grouped_problem(rng, kind, ks, alignment, m=48, n=N):
    psum, owner, k_total = grouped_layouts(ks, alignment=alignment)
    starts = _starts(owner, ks)
    if kind == "fp8":
        a_t, a_sf = fp8_operand(rng, m, k_total)
        b_t, b_sf = fp8_operand(rng, n, k_total)
        a_vals, b_vals = dequantize_fp8(a_t, a_sf), dequantize_fp8(b_t, b_sf)
        a, b = (np.ascontiguousarray(a_t.T), a_sf), (np.ascontiguousarray(b_t.T), b_sf)
    else:
        a_t, b_t = bf16_operand(rng, m, k_total), bf16_operand(rng, n, k_total)
        a_vals, b_vals = a_t.astype(np.float64), b_t.astype(np.float64)
        a, b = np.ascontiguousarray(a_t.T), np.ascontiguousarray(b_t.T)
    c = rng.standard_normal((len(ks), m, n)).astype(np.float32)
    ref = c.astype(np.float64).copy()
    for g, (s, kg) in enumerate(zip(starts, ks, strict=True)):
        ref[g] += a_vals[:, s:s + kg] @ b_vals[:, s:s + kg].T
    return a, b, psum, c, ref, starts


K_FN = {"fp8": (deep_gemm.k_grouped_fp8_gemm_tn_contiguous, deep_gemm.aclnn_k_grouped_fp8_gemm_tn_contiguous, 1e-3),
        "bf16": (deep_gemm.k_grouped_bf16_gemm_tn_contiguous, deep_gemm.aclnn_k_grouped_bf16_gemm_tn_contiguous, 1e-5)}


@pytest.mark.parametrize(("alignment", "kind", "ks"), [
    (128, "fp8", [128, 0, 96, 160]),  # starts 0, 128, 256
    (32, "fp8", [32, 96, 0, 64]),  # group 1 starts at K 32: an odd UE8M0 block, mid-pair
    (32, "bf16", [32, 96, 0, 64]),
], indirect=["alignment"], ids=["128-fp8", "32-fp8", "32-bf16"])
def test_k_grouped_at_smaller_alignment_and_aligned_ks_cpu(rng, alignment, kind, ks):
    a, b, psum, c, ref, starts = _k_grouped_problem(rng, kind, ks, alignment)
    fn, ref_fn, tol = K_FN[kind]
    aligned_ks = [-(-kg // alignment) * alignment for kg in ks]
    d = _garbage(rng, c.shape, np.float32)
    fn(a, b, d, aligned_ks, psum, c=c)  # CUDA DeepGEMM's tests pass the aligned sizes
    assert calc_diff(d.astype(np.float64), ref) < tol
    for g in (g for g, kg in enumerate(ks) if kg == 0):
        assert_bitwise_equal(d[g], c[g], "empty K group: D = C")
    d_real = _garbage(rng, c.shape, np.float32)
    fn(a, b, d_real, list(ks), psum, c=c)  # the real sizes, as before
    assert_bitwise_equal(d_real, d, "ks_cpu real vs aligned")
    d_ref = _garbage(rng, c.shape, np.float32)
    ref_fn(a, b, d_ref, None, psum, c=c)
    assert calc_diff(d.astype(np.float64), d_ref.astype(np.float64)) < 1e-6
    # Any other ks_cpu is refused, naming the index, before D is written
    bad = list(aligned_ks)
    bad[3] += alignment
    before = d.copy()
    with pytest.raises(ValueError, match=rf"ks_cpu\[3\]={bad[3]} disagrees with grouped_layout, which gives group "
                                         rf"3 K={ks[3]}; ks_cpu\[3\] must be {ks[3]} or align"):
        fn(a, b, d, bad, psum, c=c)
    assert_bitwise_equal(d, before, "d untouched")


@pytest.mark.parametrize("alignment", [128], indirect=True)
def test_k_grouped_per_group_layout_at_alignment_128(rng, alignment):
    ks = [128, 256, 0, 128]
    a, b, psum, c, ref, _ = _k_grouped_problem(rng, "bf16", ks, alignment)
    d = _garbage(rng, c.shape, np.float32)
    deep_gemm.k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks, np.array(ks, np.int32), c=c, use_psum_layout=False)
    assert calc_diff(d.astype(np.float64), ref) < 1e-5
    with pytest.raises(ValueError, match=r"grouped_layout\[1\]=192 .* must be a non-negative multiple of 128"):
        deep_gemm.k_grouped_bf16_gemm_tn_contiguous(a, b, d, None, np.array([128, 192, 64, 128], np.int32), c=c,
                                                    use_psum_layout=False)


def test_ks_cpu_must_match_at_the_default_alignment(rng):
    a, b, psum, c, ref, _ = _k_grouped_problem(rng, "bf16", [256, 100], 256)
    d = _garbage(rng, c.shape, np.float32)
    deep_gemm.k_grouped_bf16_gemm_tn_contiguous(a, b, d, [256, 256], psum, c=c)  # align(100, 256)
    assert calc_diff(d.astype(np.float64), ref) < 1e-5
    with pytest.raises(ValueError, match=r"ks_cpu\[1\]=128 disagrees .* must be 100 or align\(100, 256\) = 256"):
        deep_gemm.k_grouped_bf16_gemm_tn_contiguous(a, b, d, [256, 128], psum, c=c)


# ------------------------------------------------------------------------------------------------------------------
# einsum('bmk,bnk->mn'): the batch reduction


def test_einsum_bmk_bnk_mn_sums_over_the_batch(rng):
    nb, m, k = 3, 20, K
    x = rng.standard_normal((nb, m, k)).astype(BF16)
    y = rng.standard_normal((nb, N, k)).astype(BF16)
    ref = np.einsum("bmk,bnk->mn", x.astype(np.float64), y.astype(np.float64))
    # fp32 D accumulating in place (c=d, CUDA DeepGEMM's form)
    c = rng.standard_normal((m, N)).astype(np.float32)
    d32 = c.copy()
    deep_gemm.einsum("bmk,bnk->mn", x, y, d32, c=d32)
    assert calc_diff(d32.astype(np.float64), ref + c) < 1e-5
    d_ref = c.copy()
    deep_gemm.aclnn_einsum("bmk,bnk->mn", x, y, d_ref, c=d_ref)
    assert calc_diff(d32.astype(np.float64), d_ref.astype(np.float64)) < 1e-6
    # bf16 D without c: rounded once from the fp32 sum
    d16 = _garbage(rng, (m, N))
    deep_gemm.einsum("bmk,bnk->mn", x, y, d16)
    d32_plain = _garbage(rng, (m, N), np.float32)
    deep_gemm.einsum("bmk,bnk->mn", x, y, d32_plain)
    assert_bitwise_equal(_bits(d16), _bits(d32_plain.astype(BF16)), "bf16 D = round(fp32 sum)")
    assert calc_diff(d16.astype(np.float64), ref) < 1e-5
    # Bad input is refused before anything is written
    before = d16.copy()
    with pytest.raises(ValueError, match=r"A and B disagree on the batch count b"):
        deep_gemm.einsum("bmk,bnk->mn", x, y[:2], d16)
    with pytest.raises(ValueError, match=r"d must have shape \(20, 64\)"):
        deep_gemm.einsum("bmk,bnk->mn", x, y, np.zeros((m, N + 1), BF16))
    with pytest.raises(ValueError, match=r"bmk,bnk->mn is a bf16 einsum only"):
        deep_gemm.fp8_einsum("bmk,bnk->mn", (x, None), (y, None), d16)
    assert_bitwise_equal(_bits(d16), _bits(before), "d untouched")


# ------------------------------------------------------------------------------------------------------------------
# fp8_gemm_nt_skip_head_mid


@pytest.mark.parametrize("head_splits", [(32, 16, 32), (64, 32, 0), (16, 0, 48)], ids=str)
def test_skip_head_mid_writes_left_and_right_and_leaves_mid(rng, head_splits):
    left, mid, right = head_splits
    m, n = 20, 128
    heads, width = n // (left + right), left + mid + right
    x, sfx = fp8_operand(rng, m, K)
    w, sfw = fp8_operand(rng, n, K)
    dense = np.empty((m, n), BF16)
    deep_gemm.fp8_gemm_nt((x, sfx), (w, sfw), dense)
    full = np.empty((m, n + heads * mid), BF16)
    full[...] = _garbage(rng, full.shape)
    before = full.copy()
    d = full  # a C-contiguous D; its mid columns keep their garbage
    deep_gemm.fp8_gemm_nt_skip_head_mid((x, sfx), (w, sfw), d, head_splits)
    ref = dequantize_fp8(x, sfx) @ dequantize_fp8(w, sfw).T
    for h in range(heads):
        o, g = h * width, h * (left + right)
        assert_bitwise_equal(_bits(d[:, o:o + left]), _bits(dense[:, g:g + left]), f"head {h} left")
        assert_bitwise_equal(_bits(d[:, o + left + mid:o + width]), _bits(dense[:, g + left:g + left + right]),
                             f"head {h} right")
        assert_bitwise_equal(_bits(d[:, o + left:o + left + mid]), _bits(before[:, o + left:o + left + mid]),
                             f"head {h} mid untouched")
        got = np.concatenate([d[:, o:o + left], d[:, o + left + mid:o + width]], axis=1).astype(np.float64)
        assert calc_diff(got, ref[:, g:g + left + right]) < 1e-3


def test_skip_head_mid_bad_input(rng):
    x, sfx = fp8_operand(rng, 20, K)
    w, sfw = fp8_operand(rng, 128, K)
    d = _garbage(rng, (20, 160))
    before = d.copy()
    for splits, err, msg in [
        ((48, 16, 32), ValueError, r"N=128 must be divisible by left \+ right = 80"),
        ((32, 8, 32), ValueError, r"d must have shape \(m, n\) = \(20, 144\)"),
        ((0, 16, 0), ValueError, "left \\+ right must be > 0"),
        ((32, -1, 32), ValueError, "head_splits mid=-1 must be a non-negative int"),
        ((32, 16), TypeError, r"head_splits must be a \(left, mid, right\) tuple"),
    ]:
        with pytest.raises(err, match=msg):
            deep_gemm.fp8_gemm_nt_skip_head_mid((x, sfx), (w, sfw), d, splits)
    with pytest.raises(ValueError, match="sfb: fp32 sf must hold exact non-negative powers of two"):
        deep_gemm.fp8_gemm_nt_skip_head_mid((x, sfx), (w, sfw * np.float32(3)), d, (32, 16, 32))
    assert_bitwise_equal(_bits(d), _bits(before), "d untouched")


# ------------------------------------------------------------------------------------------------------------------
# FP8 output (FP8Quantization) on the M-grouped, masked, batched and einsum calls


def _fp8_of(x32):
    """(e4m3 codes as uint8, packed UE8M0 pairs as uint16 [rows, N/64]) of per_token_cast_to_fp8(x32)."""
    from deep_gemm.utils import per_token_cast_to_fp8

    codes, sf = per_token_cast_to_fp8(np.ascontiguousarray(x32, np.float32), use_ue8m0=True, gran_k=32)
    e = (sf.view(np.uint32) >> 23).astype(np.uint16)
    return codes.view(np.uint8), e[:, 0::2] | (e[:, 1::2] << 8)


FP8_DTYPE = ml_dtypes.float8_e4m3fn


@pytest.mark.parametrize("kind", ["fp8", "bf16"])
def test_fp8_output_m_grouped_contiguous(rng, kind):
    from deep_gemm.epilogue import FP8Quantization

    sizes = [5, 0, 1, 300]
    psum, per_row, m = grouped_layouts(sizes, extra_rows=3)
    if kind == "fp8":
        a = fp8_operand(rng, m, K)
        bs = [fp8_operand(rng, N, K) for _ in sizes]
        b = (np.stack([q for q, _ in bs]), np.stack([s for _, s in bs]))
        fn = deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous
    else:
        a = bf16_operand(rng, m, K)
        b = np.stack([bf16_operand(rng, N, K) for _ in sizes])
        fn = deep_gemm.m_grouped_bf16_gemm_nt_contiguous
    d32 = np.empty((m, N), np.float32)
    fn(a, b, d32, psum)
    d32[per_row < 0] = 0  # padding rows quantize as zeros
    codes, pairs = _fp8_of(d32)
    d = rng.integers(0, 255, (m, N), dtype=np.uint8).view(FP8_DTYPE)
    sfd = np.full((N // 64, m), 7, np.int16).T
    fn(a, b, d, psum, epilogue=FP8Quantization(sfd))
    assert_bitwise_equal(d.view(np.uint8), codes, "codes = per_token_cast_to_fp8 of the fp32 result")
    assert_bitwise_equal(sfd.view(np.uint16), pairs, "scales")
    # ensure_zero_padding=False leaves the padding rows (and their scales) as they were
    d_keep = rng.integers(0, 255, (m, N), dtype=np.uint8).view(FP8_DTYPE)
    sfd_keep = np.full((N // 64, m), 7, np.int16).T
    before = d_keep.copy()
    fn(a, b, d_keep, psum, ensure_zero_padding=False, epilogue=FP8Quantization(sfd_keep))
    pad, real = per_row < 0, per_row >= 0
    assert_bitwise_equal(d_keep.view(np.uint8)[pad], before.view(np.uint8)[pad], "untouched padding")
    assert (sfd_keep[pad] == 7).all()
    assert_bitwise_equal(d_keep.view(np.uint8)[real], codes[real], "real rows")
    # N % 64, a bf16 D or a wrong sfd are refused before anything is written
    with pytest.raises(TypeError, match="FP8Quantization epilogue"):
        fn(a, b, np.zeros((m, N), BF16), psum, epilogue=FP8Quantization(sfd))
    with pytest.raises(ValueError, match=r"sfd must have shape \(m, n // 64\)"):
        fn(a, b, d, psum, epilogue=FP8Quantization(np.zeros((m, 2), np.int16)))


def test_fp8_output_masked_never_writes_past_masked_m(rng):
    from deep_gemm.epilogue import FP8Quantization

    masked_m = np.array([0, 40, 1, 17], np.int32)
    g, max_m = len(masked_m), 40
    ops_a = [fp8_operand(rng, max_m, K) for _ in range(g)]
    ops_b = [fp8_operand(rng, N, K) for _ in range(g)]
    a = (np.stack([q for q, _ in ops_a]), np.stack([s for _, s in ops_a]))
    b = (np.stack([q for q, _ in ops_b]), np.stack([s for _, s in ops_b]))
    d32 = np.empty((g, max_m, N), np.float32)
    deep_gemm.m_grouped_fp8_fp4_gemm_nt_masked(a, b, d32, masked_m, 16)
    d = np.full((g, max_m, N), 0x55, np.uint8).view(FP8_DTYPE)
    sfd = np.full((g, N // 64, max_m), 7, np.int16).transpose(0, 2, 1)
    deep_gemm.m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked_m, 16, epilogue=FP8Quantization(sfd))
    for gi, mm in enumerate(masked_m):
        codes, pairs = _fp8_of(d32[gi, :mm])
        assert_bitwise_equal(d.view(np.uint8)[gi, :mm], codes, f"group {gi} codes")
        assert_bitwise_equal(sfd.view(np.uint16)[gi, :mm], pairs, f"group {gi} scales")
        assert (d.view(np.uint8)[gi, mm:] == 0x55).all() and (sfd[gi, mm:] == 7).all()


def test_fp8_output_bmm_pair_form_and_einsum(rng):
    from deep_gemm.epilogue import FP8Quantization

    nb, m = 3, 20
    ops_a = [fp8_operand(rng, m, K) for _ in range(nb)]
    ops_b = [fp8_operand(rng, N, K) for _ in range(nb)]
    a = (np.stack([q for q, _ in ops_a]), np.stack([s for _, s in ops_a]))
    b = (np.stack([q for q, _ in ops_b]), np.stack([s for _, s in ops_b]))
    d32 = np.empty((nb, m, N), np.float32)
    deep_gemm.fp8_bmm(a, b, d32)
    d = np.empty((nb, m, N), FP8_DTYPE)
    sfd = np.empty((nb * N // 64, m), np.int16).T  # DeepGEMM-Ascend's [M, B * N/64], strides (1, M)
    deep_gemm.fp8_bmm(a, b, (d, sfd))
    for i in range(nb):
        codes, pairs = _fp8_of(d32[i])
        assert_bitwise_equal(d.view(np.uint8)[i], codes, f"batch {i} codes")
        assert_bitwise_equal(sfd.view(np.uint16)[:, i * (N // 64):(i + 1) * (N // 64)], pairs, f"batch {i} scales")
    with pytest.raises(ValueError, match="takes no c"):
        deep_gemm.fp8_bmm(a, b, (d, sfd), c=np.zeros_like(d))
    # einsum 'bhd,bhr->hdr' (D in batch order h): the same FP8 output, through epilogue=
    bsz, h, dim, r = 32, 2, 64, 64
    x = rng.standard_normal((bsz, h, dim)).astype(BF16)
    y = rng.standard_normal((bsz, h, r)).astype(BF16)
    e32 = np.empty((h, dim, r), np.float32)
    deep_gemm.einsum("bhd,bhr->hdr", x, y, e32)
    e8 = np.empty((h, dim, r), FP8_DTYPE)
    sfe = np.empty((h, r // 64, dim), np.int16).transpose(0, 2, 1)
    deep_gemm.einsum("bhd,bhr->hdr", x, y, e8, epilogue=FP8Quantization(sfe))
    for i in range(h):
        codes, pairs = _fp8_of(e32[i])
        assert_bitwise_equal(e8.view(np.uint8)[i], codes, f"head {i} codes")
        assert_bitwise_equal(sfe.view(np.uint16)[i], pairs, f"head {i} scales")
    with pytest.raises(ValueError, match="needs D in batch order"):
        deep_gemm.einsum("bhr,hdr->bhd", np.zeros((4, h, 64), BF16), np.zeros((h, 64, 64), BF16),
                         np.empty((4, h, 64), FP8_DTYPE), epilogue=FP8Quantization(np.empty((4, 2), np.int16)))


def test_fp8_output_grouped_passes_the_sync_checker(rng, monkeypatch):
    """The grouped AIV walk (templates/lib/gemm.asc.j2 grouped_aiv_tile_loop) under DG_SYNC_CHECK=1: every cross-core
    flag of the AIC -> AIV hand-off matches, on an odd core count, with groups starting inside an M block."""
    from deep_gemm import envs, runtime
    from deep_gemm.epilogue import FP8Quantization

    monkeypatch.setenv(envs.DG_SYNC_CHECK.name, "1")
    sizes = [5, 0, 1, 300]
    psum, per_row, m = grouped_layouts(sizes, extra_rows=3)
    a = bf16_operand(rng, m, K)
    b = np.stack([bf16_operand(rng, N, K) for _ in sizes])
    with runtime.runtime_scope(num_ai_cores=3):
        d32 = np.empty((m, N), np.float32)
        deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, d32, psum)
        d = np.empty((m, N), FP8_DTYPE)
        sfd = np.empty((N // 64, m), np.int16).T
        deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, d, psum, epilogue=FP8Quantization(sfd))
    d32[per_row < 0] = 0
    codes, pairs = _fp8_of(d32)
    assert_bitwise_equal(d.view(np.uint8), codes, "codes")
    assert_bitwise_equal(sfd.view(np.uint16), pairs, "scales")


# ------------------------------------------------------------------------------------------------------------------
# K-grouped scales in CUDA DeepGEMM's compact per-group forms


@pytest.mark.parametrize("alignment", [256, 128], indirect=True)
def test_k_grouped_compact_scales_give_the_bits_of_the_full_form(rng, alignment):
    ks = [128, 0, 96, 160] if alignment == 128 else [256, 0, 96]
    a, b, psum, c, ref, starts = _k_grouped_problem(rng, "fp8", ks, alignment)
    d_full = _garbage(rng, c.shape, np.float32)
    deep_gemm.k_grouped_fp8_gemm_tn_contiguous(a, b, d_full, ks, psum, c=c)
    assert calc_diff(d_full.astype(np.float64), ref) < 1e-3

    def compact(sf):  # fp32 [sum_g ceil(K_g / 32), MN]: each group's own K blocks, one after another
        return np.ascontiguousarray(np.concatenate(
            [sf[:, s // 32:s // 32 + -(-kg // 32)].T for s, kg in zip(starts, ks, strict=True) if kg]))

    (a_t, sfa), (b_t, sfb) = a, b
    forms = {"fp32 compact": (compact(sfa), compact(sfb))}
    forms["int32 packed"] = tuple(deep_gemm.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(
        compact(sf), psum, ks, 32) for sf in (sfa, sfb))
    for name, (ca, cb) in forms.items():
        d = _garbage(rng, c.shape, np.float32)
        deep_gemm.k_grouped_fp8_gemm_tn_contiguous((a_t, ca), (b_t, cb), d, ks, psum, c=c)
        assert_bitwise_equal(d, d_full, name)
