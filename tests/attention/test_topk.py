"""deep_gemm.topk (DeepSelect's top-k) against the numpy reference (deep_gemm/testing/topk_reference.py), bit for
bit: ties, infinities and signed zeros, NaN under both policies, begin / end ranges, offsets, both index dtypes,
sorted and unsorted, refusals before anything is written, core-count stability and one torch call.

Kernels compiled here: bf16 x int32 and int64, fp32 x int32 and int64 (top-k tier 512), bf16 x int32 at tier 4096,
bf16 x int32 on one more core count.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import deep_gemm
from deep_gemm.testing.topk_reference import NAN_SENTINEL, topk_reference

BF16 = np.dtype(ml_dtypes.bfloat16)
POS_NAN = {BF16: 0x7FC1, np.dtype(np.float32): 0x7FC00001}
NEG_NAN = {BF16: -0x7F, np.dtype(np.float32): -0x3FFFFF}  # 0xFF81 / 0xFFC00001 as signed bits


def padded(b: int, vocab: int, dtype, fill=0.0) -> np.ndarray:
    """[b, vocab] whose rows are 32-byte aligned (a view of a wider array, as DeepSelect asks)."""
    dtype = np.dtype(dtype)
    per = 32 // dtype.itemsize
    base = np.full((b, max(-(-vocab // per) * per, per)), fill, dtype)
    return base[:, :vocab]


def tied(rng: np.random.Generator, b: int, vocab: int, dtype) -> np.ndarray:
    """Few distinct values (many ties), with +-inf and +-0 sprinkled in."""
    x = padded(b, vocab, dtype)
    x[:] = rng.integers(-3, 4, (b, vocab)).astype(np.float32) * 0.5
    special = rng.random((b, vocab))
    x[special < 0.02] = np.inf
    x[(special >= 0.02) & (special < 0.04)] = -np.inf
    x[(special >= 0.04) & (special < 0.1)] = -0.0
    return x


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.int16 if a.dtype == BF16 else np.int32)


def check(x, k, **kw):
    """Run deep_gemm.topk and the reference with the same arguments; assert bitwise equality."""
    platform = kw.pop("platform", "cuda")
    values, indices = deep_gemm.topk(x, k, **kw)
    ref_kw = {n: kw[n] for n in ("sorted", "begin", "end", "indices_type", "output_idx_offset", "idx_oob_fill_value",
                                 "value_oob_fill_value") if n in kw}
    ref_v, ref_i, nan_rows = topk_reference(x, k, platform=platform, **ref_kw)
    assert indices.dtype == np.dtype(kw.get("indices_type", np.int64))
    np.testing.assert_array_equal(indices, ref_i)
    if kw.get("return_value", True):
        np.testing.assert_array_equal(bits(values), bits(ref_v))
        assert values.strides[0] % 32 == 0
    else:
        assert values is None
    return values, indices, nan_rows


def ranges(rng, b, vocab):
    begin = rng.integers(0, vocab + 1, b).astype(np.int32)
    end = (begin + rng.integers(0, vocab + 1, b)).clip(0, vocab).astype(np.int32)
    begin[0], end[0] = 5, 5  # empty
    end[1] = vocab  # to the end
    begin[2], end[2] = 0, vocab  # the whole row
    return begin, end


@pytest.mark.parametrize("indices_type", [np.int32, np.int64])
def test_bf16_ties_ranges_offsets(rng, indices_type):
    b, vocab = 9, 5000
    x = tied(rng, b, vocab, BF16)
    offset = rng.integers(-(2**30), 2**30, b).astype(np.int32)
    begin, end = ranges(rng, b, vocab)
    for k in (1, 7, 100, 512):  # tier 512: several compactions per row (vocab > k + FILTER_B2)
        check(x, k, indices_type=indices_type)
        check(x, k, indices_type=indices_type, begin=begin, end=end, output_idx_offset=offset,
              idx_oob_fill_value=-77, value_oob_fill_value=3.25)
        check(x, k, indices_type=indices_type, end=end, sorted_index=True, return_value=False)
    # continuous data: few ties, compactions with a settling threshold
    y = padded(b, vocab, BF16)
    y[:] = rng.standard_normal((b, vocab))
    check(y, 300, indices_type=indices_type, end=end)
    # ascending and descending rows: the threshold rises on every tile / never moves
    z = padded(2, vocab, BF16)
    z[0] = np.arange(vocab, dtype=np.float32)
    z[1] = -np.arange(vocab, dtype=np.float32)
    check(z, 512, indices_type=indices_type)


@pytest.mark.parametrize("indices_type", [np.int32, np.int64])
def test_fp32_sorted_and_unsorted(rng, indices_type):
    b, vocab = 6, 3001
    x = tied(rng, b, vocab, np.float32)
    x[3] = rng.standard_normal(vocab)
    begin, end = ranges(rng, b, vocab)
    offset = rng.integers(-1000, 1000, b).astype(np.int32)
    for k in (1, 33, 500):
        check(x, k, indices_type=indices_type)
        check(x, k, indices_type=indices_type, sorted=True, begin=begin, end=end, output_idx_offset=offset)
    # sorted: values largest first, equal values in index order (the reference's order, checked directly too)
    v, i, _ = check(x, 64, indices_type=indices_type, sorted=True)
    assert (v[:, :-1] >= v[:, 1:]).all()


def test_short_rows_fill_and_offsets(rng):
    """DeepSelect's index-offset cases: exact-size, partial and empty rows; fills are never offset."""
    x = padded(5, 8192, BF16)
    x[:] = np.arange(8192, dtype=np.float32) % 251
    offsets = np.array([2**31 - 1, -(2**31), -1, 0, 1], np.int32)
    for end_value in (8192, 8, 3, 0):
        end = np.full(5, end_value, np.int32)
        for fill in (2**31 - 1, -(2**31), -1):
            check(x, 8, end=end, output_idx_offset=offsets, idx_oob_fill_value=fill, indices_type=np.int64)
            check(x, 8, end=end, output_idx_offset=offsets, idx_oob_fill_value=fill, indices_type=np.int32)
    # k larger than the vocabulary: everything, then the fills
    small = padded(3, 16, BF16)
    small[:] = rng.standard_normal((3, 16))
    check(small, 40, indices_type=np.int32)


def test_nan_policies(rng):
    b, vocab, k = 6, 2048, 64
    x = padded(b, vocab, BF16)
    x[:] = rng.standard_normal((b, vocab))
    xb = bits(x)
    xb[1, 100] = POS_NAN[BF16]
    xb[2, 7] = NEG_NAN[BF16]  # below -inf in the order: never selected, still detected
    xb[3, 2000] = POS_NAN[BF16]
    end = np.full(b, vocab, np.int32)
    end[3] = 50  # row 3's NaN lies outside its range
    end[4] = 40
    xb[4, 10] = POS_NAN[BF16]  # a short row (40 <= k) with a NaN
    # abort: ValueError, and the caller's output_idx is untouched
    out = np.full((b, k), -5, np.int32)
    with pytest.raises(ValueError, match="row 1 holds a NaN"):
        deep_gemm.topk(x, k, end=end, indices_type=np.int32, output_idx=out)
    assert (out == -5).all()
    # CUDA policy: index 0 of a checked row; rows of at most k elements are not checked
    _, idx, nan_rows = check(x, k, end=end, indices_type=np.int32, abort_when_nan_found=False)
    assert nan_rows.tolist() == [False, True, True, False, False, False]
    assert (idx[[1, 2], 0] == NAN_SENTINEL).all() and (idx[[1, 2], 1:] != NAN_SENTINEL).all()
    # a short row never aborts on CUDA
    deep_gemm.topk(x[4:5], k, end=end[4:5], indices_type=np.int32)
    # fp32
    y = padded(2, 1000, np.float32)
    y[:] = rng.standard_normal((2, 1000))
    bits(y)[1, 999] = NEG_NAN[np.dtype(np.float32)]
    check(y, 10, indices_type=np.int32, sorted=True, abort_when_nan_found=False)
    with pytest.raises(ValueError, match="NaN"):
        deep_gemm.topk(y, 10)


def test_ascend_platform(rng):
    b, vocab, k = 6, 2048, 64
    x = padded(b, vocab, BF16)
    x[:] = rng.integers(-2, 3, (b, vocab))
    xb = bits(x)
    xb[1, 100] = POS_NAN[BF16]
    xb[4, 10] = NEG_NAN[BF16]
    end = np.full(b, vocab, np.int32)
    end[4] = 40  # short row: checked on Ascend
    deep_gemm.set_topk_platform("ascend")
    try:
        assert deep_gemm.get_topk_platform() == "ascend"
        _, idx, nan_rows = check(x, k, end=end, indices_type=np.int32, abort_when_nan_found=False, platform="ascend")
        assert nan_rows.tolist() == [False, True, False, False, True, False]
        assert (idx[[1, 4]] == NAN_SENTINEL).all()
        check(x[[0, 2, 3]], k, indices_type=np.int32, sorted_index=True, platform="ascend")
        out = np.full((b, k), 9, np.int32)
        with pytest.raises(ValueError, match="row 1 holds a NaN"):
            deep_gemm.topk(x, k, indices_type=np.int32, output_idx=out)
        assert (out == 9).all()
        # the Ascend kernel's restrictions
        with pytest.raises(TypeError, match="int32"):
            deep_gemm.topk(x, k)  # int64 indices by default
        with pytest.raises(TypeError, match="bfloat16"):
            deep_gemm.topk(padded(2, 64, np.float32), 4, indices_type=np.int32)
        with pytest.raises(ValueError, match="sorted"):
            deep_gemm.topk(x, k, indices_type=np.int32, sorted=True)
    finally:
        deep_gemm.set_topk_platform("cuda")
    with pytest.raises(ValueError, match="platform"):
        deep_gemm.set_topk_platform("npu")


def test_caller_output_and_layout(rng):
    b, vocab, k = 4, 1024, 24
    x = padded(b, vocab, BF16)
    x[:] = rng.standard_normal((b, vocab))
    backing = np.full((b, 40), -123, np.int64)  # rows 320 bytes apart
    out = backing[:, :k]
    v, idx = deep_gemm.topk(x, k, output_idx=out)
    assert idx is out and (backing[:, k:] == -123).all()
    np.testing.assert_array_equal(out, topk_reference(x, k)[1])
    assert deep_gemm.get_stride_requirement() == (32, 32)
    v, idx = deep_gemm.topk(x, 3)
    assert v.shape == idx.shape == (b, 3) and v.strides[0] % 32 == 0 and idx.strides[0] % 32 == 0
    # no rows: empty outputs, nothing launched
    v, idx = deep_gemm.topk(padded(0, 64, BF16), 5)
    assert v.shape == idx.shape == (0, 5)
    # DeepSelect's package interface
    from deep_gemm import deep_select

    np.testing.assert_array_equal(deep_select.topk(x, k)[1], out)
    assert deep_select.get_stride_requirement() == (32, 32)


def test_bad_input_refused(rng):
    x = padded(3, 256, BF16)
    x[:] = rng.standard_normal((3, 256))
    out = np.full((3, 8), 7, np.int64)
    cases = [
        (ValueError, "topk", dict(topk=0)), (ValueError, "topk", dict(topk=4097)), (TypeError, "topk", dict(topk=True)),
        (TypeError, "input", dict(input=x.astype(np.float16))), (ValueError, "2-D", dict(input=x[0])),
        (ValueError, "stride", dict(input=np.zeros((3, 250), BF16))),
        (ValueError, "hint", dict(hint=np.zeros(3, np.int32))),
        (TypeError, "begin", dict(begin=np.zeros(3, np.int64))), (ValueError, "end", dict(end=np.zeros(2, np.int32))),
        (ValueError, "end=257", dict(end=np.full(3, 257, np.int32))),
        (ValueError, "begin=9", dict(begin=np.full(3, 9, np.int32), end=np.full(3, 8, np.int32))),
        (ValueError, "begin=-1", dict(begin=np.full(3, -1, np.int32))),
        (ValueError, "float32", dict(sorted=True)),
        (ValueError, "together", dict(input=x.astype(np.float32), sorted=True, sorted_index=True)),
        (ValueError, "return_value", dict(input=x.astype(np.float32), sorted=True, return_value=False)),
        (TypeError, "indices_type", dict(indices_type=np.int16)),
        (TypeError, "output_idx.dtype", dict(indices_type=np.int32)),
        (ValueError, "shape", dict(output_idx=np.zeros((3, 9), np.int64))),
        (ValueError, "32 bytes", dict(output_idx=np.zeros((3, 9), np.int64)[:, :8])),
        (ValueError, "alias", dict(output_idx=np.zeros((3, 8), np.int64), input=None)),
        (ValueError, "int32", dict(idx_oob_fill_value=2**31)),
        (TypeError, "bool", dict(return_value=1)),
        (ValueError, "vocab", dict(input=np.zeros((1, 2**23), BF16))),
    ]
    for err, match, kw in cases:
        args = dict(input=x, topk=8, output_idx=out)
        args.update(kw)
        if args["input"] is None:  # the output aliases the input
            args["input"] = args["output_idx"].view(BF16)[:, :32]
        with pytest.raises(err, match=match):
            deep_gemm.topk(**args)
        assert (out == 7).all(), (match, kw)


def test_large_topk_and_core_counts(rng):
    """The 4096 tier (the indexer's k = 2048) and the same bits on another core count."""
    b, vocab = 5, 12288
    x = padded(b, vocab, BF16)
    x[:] = rng.standard_normal((b, vocab))
    x[2] = rng.integers(-2, 3, vocab)  # ties at the threshold
    begin, end = ranges(rng, b, vocab)
    for k in (2048, 3000):
        check(x, k, indices_type=np.int32, begin=begin, end=end)
    # the largest values exactly where a long row's threshold sample looks (every 16th of 16384): the sampled
    # threshold lets too few through and the row is scanned again
    y = padded(2, 16384, BF16)
    y[:] = rng.standard_normal((2, 16384))
    y[0, ::16] = 100.0
    y[1, 8::16] = 100.0
    check(y, 2048, indices_type=np.int32)
    ref = deep_gemm.topk(x, 300, indices_type=np.int32, end=end)
    with deep_gemm.runtime_scope(num_ai_cores=3):
        other = deep_gemm.topk(x, 300, indices_type=np.int32, end=end)
    np.testing.assert_array_equal(bits(ref[0]), bits(other[0]))
    np.testing.assert_array_equal(ref[1], other[1])


def test_torch_call(rng):
    torch = pytest.importorskip("torch")
    x = padded(4, 2048, BF16)
    x[:] = rng.standard_normal((4, 2048))
    t = torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
    out = torch.full((4, 64), -1, dtype=torch.int32)
    end = torch.tensor([2048, 100, 0, 64], dtype=torch.int32)
    v, idx = deep_gemm.topk(t, 64, end=end, indices_type=torch.int32, output_idx=out)
    assert idx is out and v.dtype == torch.bfloat16
    ref_v, ref_i, _ = topk_reference(x, 64, end=end.numpy(), indices_type=np.int32)
    np.testing.assert_array_equal(out.numpy(), ref_i)
    np.testing.assert_array_equal(v.view(torch.int16).numpy(), bits(ref_v))
