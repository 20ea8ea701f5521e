"""AIV intrinsics (deep_gemm.device vector / cast / datacopy / FixpipeToUB) against numpy references: elementwise and
scalar ops bit-exact, count covering part of a 2-D tile, NaN rules, Compare + Select masks, row / column reductions,
casts bit-exact with ml_dtypes and deep_gemm.utils (bf16 RNE, e4m3 saturating, UE8M0), strided padded copies."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from numba.core.errors import TypingError

from deep_gemm import device
from deep_gemm.jit import enums
from deep_gemm.utils import ceil_to_ue8m0, encode_e4m3, fp32_to_bf16_bits

RM = enums.RoundMode
F32 = np.float32


def _data(rng, shape, nan=False):
    x = (rng.standard_normal(shape) * 3).astype(F32)
    if nan:
        x.flat[::7] = np.nan
        x.flat[3::11] = np.inf
        x.flat[5::13] = -np.inf
    return x


def _bits(x):
    return np.ascontiguousarray(x).view(np.uint32 if x.dtype == F32 else np.uint8)


def _check_partial(got, want, before, count):
    """The first ``count`` elements (row-major) equal ``want``; the rest equal ``before``."""
    flat_got, flat_want, flat_before = got.reshape(-1), want.reshape(-1), before.reshape(-1)
    np.testing.assert_array_equal(_bits(flat_got[:count]), _bits(flat_want[:count].astype(got.dtype)))
    np.testing.assert_array_equal(_bits(flat_got[count:]), _bits(flat_before[count:]))


BINARY = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Max": np.maximum, "Min": np.minimum,
}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("shape,count", [((37,), 37), ((5, 12), 60), ((5, 12), 29)])
def test_binary_ops_bit_exact(rng, name, shape, count):
    a, b = _data(rng, shape, nan=True), _data(rng, shape)
    b[b == 0] = 1
    dst = _data(rng, shape)
    before = dst.copy()
    getattr(device, name)(dst, a, b, count)
    with np.errstate(all="ignore"):
        want = BINARY[name](a, b)
    _check_partial(dst, want, before, count)


def test_binary_ops_on_strided_views(rng):
    big = _data(rng, (8, 20))
    a = big[1:6, 2:14]  # non-contiguous 2-D views, as tile_view makes them
    b = big[2:7, 5:17]
    out = np.zeros((10, 30), F32)
    device.Mul(out[3:8, 4:16], a, b, 60)
    np.testing.assert_array_equal(out[3:8, 4:16], a * b)
    assert not out[:3].any() and not out[8:].any() and not out[:, :4].any() and not out[:, 16:].any()


def _copy_like(x, step):
    """A copy of the 2-D ``x`` whose columns are ``step`` elements apart (None: adjacent)."""
    if not step:
        return x.copy()
    out = np.full((x.shape[0], x.shape[1] * step), -9.0, x.dtype)[:, ::step]
    out[...] = x
    return out


def test_elementwise_ops_on_every_operand_layout(rng):
    """The row loops take raw pointers when columns are adjacent, in place with one pointer, and fall back to
    indexed loops for column-strided operands: every path gives numpy's bits, partial counts included."""
    x, y = _data(rng, (6, 40), nan=True), _data(rng, (6, 40))
    for cols in (slice(3, 23), slice(1, 40, 2)):  # adjacent columns; a column stride of two elements
        a, b = x[:, cols], y[:, cols]
        for count in (a.size, a.size - 7):
            with np.errstate(all="ignore"):
                for name, args, want in (("Mul", (a, b), a * b), ("Muls", (a, 0.3), a * F32(0.3)),
                                         ("Relu", (a,), np.where(a < 0, F32(0), a)),
                                         ("Axpy", (a, -1.5), b + a * F32(-1.5))):
                    dst = _copy_like(b, cols.step)  # same layout as the sources
                    before = dst.copy()
                    getattr(device, name)(dst, *args, count)
                    _check_partial(dst, want, before, count)
                    inplace = _copy_like(a, cols.step)
                    if name != "Axpy":  # dst is also the (first) source
                        getattr(device, name)(inplace, inplace, *args[1:], count)
                        _check_partial(inplace, want, a, count)
    # overlapping operands keep the instruction's sequential row-major meaning (each element reads its source
    # after the elements before it were written): a shifted in-place Adds is a running sum
    run = np.zeros(300, F32)
    device.Adds(run[1:], run[:-1], 1.0, 299)
    np.testing.assert_array_equal(run, np.arange(300, dtype=F32))


SCALAR = {"Adds": np.add, "Muls": np.multiply, "Maxs": np.maximum, "Mins": np.minimum}


@pytest.mark.parametrize("name", sorted(SCALAR))
def test_scalar_ops_round_the_scalar_to_dst_dtype(rng, name):
    x = _data(rng, (4, 9), nan=True)
    dst = np.zeros_like(x)
    scalar = 0.1  # a Python float: the instruction must use float32(0.1), never compute in fp64
    getattr(device, name)(dst, x, scalar, x.size)
    with np.errstate(all="ignore"):
        want = SCALAR[name](x, F32(scalar))
    np.testing.assert_array_equal(_bits(dst), _bits(want.astype(F32)))


def test_axpy_accumulates_with_two_roundings(rng):
    x = _data(rng, (5, 12), nan=True)
    acc = _data(rng, (5, 12))
    dst = acc.copy()
    device.Axpy(dst, x, 0.1, 50)  # the scalar rounded to fp32; product rounded, then the sum; tail untouched
    with np.errstate(all="ignore"):
        want = (acc + (x * F32(0.1)).astype(F32)).astype(F32)
    _check_partial(dst, want, acc, 50)
    # on row views (the MQA reduction over heads: one Axpy per head into one logits row)
    out = np.zeros((2, 12), F32)
    device.Axpy(out[1:2, 2:9], x[3:4, 0:7], -2.0, 7)
    np.testing.assert_array_equal(out[1, 2:9], x[3, :7] * F32(-2.0))
    assert not out[0].any() and not out[1, :2].any() and not out[1, 9:].any()


def test_unary_ops(rng):
    x = _data(rng, (6, 10), nan=True)
    x[0, :3] = [-0.0, 0.0, -1e-45]
    for name, ref in (("Abs", np.abs), ("Relu", lambda v: np.where(v < 0, F32(0), v))):
        dst = np.full_like(x, 7.0)
        getattr(device, name)(dst, x, 55)
        _check_partial(dst, ref(x), np.full_like(x, 7.0), 55)
    # Exp: libm expf, within one ulp of the correctly rounded result (fp64 exp rounded once to fp32)
    y = np.linspace(-80, 80, 4001, dtype=F32)
    dst = np.empty_like(y)
    device.Exp(dst, y, y.size)
    with np.errstate(over="ignore"):
        want = np.exp(y.astype(np.float64)).astype(F32)
    ulps = np.abs(dst.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))
    assert ulps.max() <= 1
    special = np.array([np.nan, np.inf, -np.inf, 0.0, 100.0], F32)
    out = np.empty_like(special)
    device.Exp(out, special, 5)
    assert np.isnan(out[0]) and out[1] == np.inf and out[2] == 0 and out[3] == 1 and out[4] == np.inf


def test_duplicate_partial_and_int(rng):
    dst = np.zeros((3, 5), np.int32)
    device.Duplicate(dst, 9.7, 8)  # converted to the dtype of dst (int32 9), first 8 elements only
    want = np.zeros(15, np.int32)
    want[:8] = 9
    np.testing.assert_array_equal(dst.reshape(-1), want)
    # strided columns (every other one of the parent, which is never written) and pointer rows, whole and partial
    parent = np.zeros((3, 6), F32)
    device.Duplicate(parent[:, ::2], -1.5, 7)
    assert parent[:, 1::2].tolist() == [[0.0] * 3] * 3
    assert parent[:, ::2].reshape(-1).tolist() == [-1.5] * 7 + [0.0] * 2
    bf16 = np.zeros((2, 4), np.uint16)
    device.Duplicate(bf16, np.uint16(0xFF80), 8)  # bf16 -inf bits, the MQA kernels' masked-logit row
    assert (bf16 == 0xFF80).all()
    device.Duplicate(bf16, np.uint16(1), 0)
    assert (bf16 == 0xFF80).all()
    with pytest.raises(ValueError, match="count exceeds"):
        device.Duplicate(bf16, np.uint16(1), 9)
    assert (bf16 == 0xFF80).all()


@pytest.mark.parametrize("mode", ["LT", "GT", "EQ", "LE", "GE", "NE"])
def test_compare_select(rng, mode):
    a = rng.integers(-3, 4, size=(5, 7)).astype(F32)
    b = rng.integers(-3, 4, size=(5, 7)).astype(F32)
    a[0, 0] = np.nan
    count = 31
    mask = np.full(5, 0xFF, np.uint8)
    device.Compare(mask, a, b, getattr(enums.CMPMODE, mode), count)
    ops = {"LT": np.less, "GT": np.greater, "EQ": np.equal, "LE": np.less_equal, "GE": np.greater_equal,
           "NE": np.not_equal}
    want_bits = ops[mode](a, b).reshape(-1)[:count]
    got_bits = np.unpackbits(mask, bitorder="little")[:count].astype(bool)
    np.testing.assert_array_equal(got_bits, want_bits)
    assert mask[4] == 0xFF  # bytes past the count are untouched

    dst = np.zeros_like(a)
    device.Select(dst, mask, a, b, enums.SELMODE.VSEL_TENSOR_TENSOR_MODE, count)
    _check_partial(dst, np.where(ops[mode](a, b), a, b), np.zeros_like(a), count)
    dst2 = np.zeros_like(a)
    device.Select(dst2, mask, a, -1.5, enums.SELMODE.VSEL_TENSOR_SCALAR_MODE, count)
    _check_partial(dst2, np.where(ops[mode](a, b), a, F32(-1.5)), np.zeros_like(a), count)


def test_select_mode_must_match_src1(rng):
    a = np.zeros((2, 4), F32)
    mask = np.zeros(1, np.uint8)
    with pytest.raises(ValueError, match="SELMODE"):
        device.Select(a, mask, a, 1.0, enums.SELMODE.VSEL_TENSOR_TENSOR_MODE, 8)


def test_shape_and_count_errors():
    a = np.zeros((2, 4), F32)
    with pytest.raises(ValueError, match="count"):
        device.Add(a, a, a, 9)
    with pytest.raises(ValueError, match="shapes"):
        device.Add(a, a, np.zeros((4, 2), F32), 8)


def _seq_sum(x, axis):
    """Left-to-right fp32 sums (cumsum is sequential) along ``axis``."""
    return np.take(np.cumsum(x, axis=axis, dtype=F32), -1, axis=axis)


@pytest.mark.parametrize("pattern", ["AR", "RA"])
def test_reductions(rng, pattern):
    x = _data(rng, (6, 11))
    axis = 1 if pattern == "AR" else 0
    n = x.shape[1 - axis]
    dst = np.full(n + 2, 5.0, F32)
    device.ReduceMax(dst, x, getattr(enums.ReducePattern, pattern))
    np.testing.assert_array_equal(dst[:n], x.max(axis=axis))
    assert (dst[n:] == 5).all()
    device.ReduceSum(dst, x, getattr(enums.ReducePattern, pattern))
    np.testing.assert_array_equal(_bits(dst[:n]), _bits(_seq_sum(x, axis)))
    # NaN anywhere in a row / column makes its max NaN (the amax of a per-token cast sees it)
    x[2, 3] = np.nan
    device.ReduceMax(dst, x, getattr(enums.ReducePattern, pattern))
    np.testing.assert_array_equal(np.isnan(dst[:n]), np.isnan(x.max(axis=axis)))


@pytest.mark.parametrize("rows, cols", [(1, 5), (15, 16), (16, 16), (17, 47), (33, 64), (64, 64), (40, 100)])
def test_row_sums_in_simd_blocks_keep_the_sequential_order(rng, rows, cols):
    # fp32 ReduceSum AR runs LANES rows at a time, transposed in registers, the columns past the last whole vector
    # added per row after them: every row's sum is still src[0] + src[1] + ... (bits of a left-to-right cumsum), on a
    # strided view too; NaN, Inf and -0.0 (whose sum with +0.0 is +0.0) as the loop gives them.
    big = _data(rng, (rows, cols + 9))
    big[0, :] = -0.0
    big[1 % rows, 3:] = 0.0
    big[2 % rows, 1], big[3 % rows, [0, cols - 1]] = np.nan, (np.inf, -np.inf)  # a few rows only: the rest stay finite
    for x in (big[:, :cols], np.ascontiguousarray(big[:, :cols])):
        dst = np.full(rows + 1, 7.0, F32)
        device.ReduceSum(dst, x, enums.ReducePattern.AR)
        with np.errstate(invalid="ignore"):  # Inf + -Inf in a row
            want = _seq_sum(x, 1)
        _assert_same_f32(dst[:rows], want)
        assert dst[rows] == 7.0


@pytest.mark.parametrize("rows, cols, chunk", [(1, 5, 128), (15, 16, 8), (16, 256, 128), (17, 47, 16), (33, 200, 128),
                                              (64, 256, 128), (40, 100, 64)])
def test_widening_and_row_sums_of_squares_are_cast_mul_reduce_sum_add(rng, rows, cols, chunk):
    # CastReduceSumSquares (the HC AIVs' VF) keeps the squares in registers: the fp32 tile and every row's running sum
    # are the bits of Cast, then per chunk Mul into a squares tile, ReduceSum AR and Add (SIMD row blocks, strided
    # views, the element path, specials: NaN, +-Inf, a square that overflows fp32)
    values = _data(rng, (rows, cols + 9))
    values[0, :] = -0.0
    values[2 % rows, 1], values[3 % rows, [0, cols - 1]] = np.nan, (np.inf, -np.inf)
    values[4 % rows, 2] = 3e20
    big = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    start = _data(rng, (rows,))
    for src in (big[:, :cols], np.ascontiguousarray(big[:, :cols]), np.asfortranarray(big[:, :cols])):
        tile, sums = np.full((rows, cols), 5.0, F32), np.append(start, 7.0).astype(F32)
        device.CastReduceSumSquares(tile, src, sums, chunk)
        want_tile, want = np.empty((rows, cols), F32), start.copy()
        device.Cast(want_tile, src, enums.RoundMode.CAST_NONE, rows * cols)
        for c0 in range(0, cols, chunk):
            part = np.ascontiguousarray(want_tile[:, c0:c0 + chunk])
            sq, blk = np.empty_like(part), np.empty(rows, F32)
            device.Mul(sq, part, part, part.size)
            device.ReduceSum(blk, sq, enums.ReducePattern.AR)
            device.Add(want, want, blk, rows)
        _assert_same_f32(tile, want_tile)
        _assert_same_f32(sums[:rows], want)
        assert sums[rows] == 7.0
    with pytest.raises(ValueError, match="one element per row"):
        device.CastReduceSumSquares(np.zeros((rows, cols), F32), big[:, :cols], np.zeros(rows - 1, F32), chunk)
    with pytest.raises(TypingError, match="widens bf16"):
        device.CastReduceSumSquares(np.zeros((rows, cols), F32), np.zeros((rows, cols), F32), np.zeros(rows, F32), 8)


@pytest.mark.parametrize("heads, cols, count", [(1, 5, 5), (4, 16, 16), (5, 37, 30), (8, 256, 256), (13, 100, 64),
                                                (64, 256, 250)])
@pytest.mark.parametrize("scaled", [False, True])
def test_head_sums_are_the_cast_mul_relu_axpy_chain(rng, heads, cols, count, scaled):
    # CastAxpyRows / CastMulReluAxpyRows (the MQA AIVs' head-reduction VF) give the bits of the instruction chain the
    # kernels issued before: Cast to fp32, (Mul by the key scales, Relu,) Muls by head 0's weight, one Axpy per head;
    # on pointer rows (four heads a pass and the rest), strided views and the element path; NaN, +-Inf, -0.0, a
    # product that overflows and a head that cancels
    values = _data(rng, (heads, cols + 7))
    values[0, :3] = (-0.0, np.nan, np.inf)
    values[-1, 3:5] = (-np.inf, 3e38)
    src = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    scale = np.abs(_data(rng, (1, cols))) + F32(0.25)
    scale[0, 5 % cols] = -1.5  # a negative scale: the ReLU drops the positive scores
    weights = _data(rng, (1, heads + 3))
    weights[0, heads // 2] = -weights[0, 0]
    for s in (src[:, :cols], np.ascontiguousarray(src[:, :cols]), np.asfortranarray(src[:, :cols])):
        got = np.full((1, cols), 7.0, F32)
        want = got.copy()
        wide = np.empty((heads, cols), F32)
        device.Cast(wide, s, RM.CAST_NONE, heads * cols)
        with np.errstate(invalid="ignore", over="ignore"):
            if scaled:
                device.CastMulReluAxpyRows(got, s, scale, weights, count)
                device.Mul(wide, wide, np.repeat(scale, heads, axis=0), heads * cols)
                device.Relu(wide, wide, heads * cols)
            else:
                device.CastAxpyRows(got, s, weights, count)
            device.Muls(want, wide[0:1], weights[0, 0], count)
            for h in range(1, heads):
                device.Axpy(want, wide[h:h + 1], weights[0, h], count)
        _assert_same_f32(got, want)
        assert (got[0, count:] == 7.0).all()
    # a 1-D dst row and a strided one
    flat = np.zeros(cols, F32)
    strided = np.zeros((1, 2 * cols), F32)[:, ::2]
    with np.errstate(invalid="ignore", over="ignore"):
        if scaled:
            device.CastMulReluAxpyRows(flat, src[:, :cols], scale, weights, count)
            device.CastMulReluAxpyRows(strided, src[:, :cols], scale, weights, count)
        else:
            device.CastAxpyRows(flat, src[:, :cols], weights, count)
            device.CastAxpyRows(strided, src[:, :cols], weights, count)
    _assert_same_f32(flat[:count], got[0, :count])
    _assert_same_f32(strided[0, :count], got[0, :count])


def test_head_sums_refuse_bad_operands():
    src = np.zeros((4, 8), np.uint16)
    with pytest.raises(ValueError, match="one element per src row"):
        device.CastAxpyRows(np.zeros(8, F32), src, np.zeros(3, F32), 8)
    with pytest.raises(ValueError, match="as wide as src"):
        device.CastMulReluAxpyRows(np.zeros(8, F32), src, np.zeros(7, F32), np.zeros(4, F32), 8)
    with pytest.raises(ValueError, match="count exceeds"):
        device.CastAxpyRows(np.zeros(8, F32), src, np.zeros(4, F32), 9)
    with pytest.raises(TypingError, match="need fp32, bf16"):
        device.CastAxpyRows(np.zeros(8, F32), src.astype(F32), np.zeros(4, F32), 8)


def _assert_same_f32(got, want, err_msg=""):
    """Bit-equal fp32, except that a NaN only has to be a NaN (which operand's sign and payload an IEEE operation
    passes on is the compiler's choice: LLVM may commute an addition)."""
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan, err_msg=err_msg)
    np.testing.assert_array_equal(_bits(np.where(nan, 0, got)), _bits(np.where(nan, 0, want)), err_msg=err_msg)


@pytest.mark.parametrize("name, op", [("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply),
                                      ("Div", np.divide)])
def test_elementwise_rows_match_the_element_loop_for_every_aliasing(rng, name, op):
    # fp32 add / sub / mul / div over vectorised rows give the element loop's result whether dst is apart from the
    # sources, exactly in place, or overlapping a source at an offset (each element sees the earlier writes). Row
    # lengths around the vector width, a partial last row (count), NaN / Inf operands.
    fn = getattr(device, name)
    with np.errstate(all="ignore"):
        for cols in (1, 7, 8, 15, 16, 17, 31, 33, 64):
            buf = _data(rng, (6, cols + 40))
            other = _data(rng, (6, cols + 40))
            buf[1, ::5], other[2, 1::4] = np.nan, np.inf  # two rows of NaN / Inf operands; the others finite
            count = 5 * cols + cols // 2  # five rows and part of the sixth
            cases = {
                "apart": (buf[:, :cols], other[:, 3:3 + cols], other[:, 20:20 + cols]),
                "in place": (buf[:, :cols], buf[:, :cols], other[:, :cols]),
                "overlap +1": (buf[:, 1:1 + cols], buf[:, :cols], other[:, :cols]),
                "overlap -1": (buf[:, :cols], buf[:, 1:1 + cols], other[:, :cols]),
            }
            for case, (d, a, b) in cases.items():
                want_buf, want_other = buf.copy(), other.copy()
                fn(d, a, b, count)
                got = (buf.copy(), other.copy())
                buf[...], other[...] = want_buf, want_other
                # the expected result: the same element loop in Python on copies of the same memory
                exp_d = _offset_view(want_buf, want_other, d, buf, other)
                exp_a = _offset_view(want_buf, want_other, a, buf, other)
                exp_b = _offset_view(want_buf, want_other, b, buf, other)
                for k in range(count):
                    i, j = divmod(k, cols)
                    exp_d[i, j] = op(exp_a[i, j], exp_b[i, j])
                _assert_same_f32(got[0], want_buf, err_msg=f"{name} {case} cols={cols}")
                _assert_same_f32(got[1], want_other, err_msg=f"{name} {case} cols={cols}")
                buf[...], other[...] = got


def _offset_view(new_buf, new_other, view, buf, other):
    """The view of ``new_buf`` / ``new_other`` at the place ``view`` has in ``buf`` / ``other``."""
    for old, new in ((buf, new_buf), (other, new_other)):
        if np.shares_memory(view, old):
            start = (view.ctypes.data - old.ctypes.data) // 4
            r, c = divmod(start, old.shape[1])
            return new[r:r + view.shape[0], c:c + view.shape[1]]
    raise AssertionError("view of neither buffer")


@pytest.mark.parametrize("name, op", [("Adds", np.add), ("Muls", np.multiply)])
def test_scalar_rows_match_the_element_loop(rng, name, op):
    fn = getattr(device, name)
    with np.errstate(all="ignore"):
        for cols in (3, 16, 17, 64):
            src = _data(rng, (5, cols + 8))[:, 2:2 + cols]
            src[1, ::3] = np.nan
            for d in (np.zeros((5, cols), F32), src):  # apart, and in place
                a = src.copy()
                count = 4 * cols + 1
                keep = d.copy()
                fn(d, src, -1.75, count)
                want = keep.copy()
                want.reshape(-1)[:count] = op(a.reshape(-1)[:count], F32(-1.75))
                _assert_same_f32(d, want)


def _special_f32(rng):
    hi = rng.integers(0, 1 << 16, size=3000, dtype=np.uint32) << 16
    tails = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x80000, 0x7FFFF, 0x100000], np.uint32)
    rand = rng.integers(0, 1 << 32, size=20000, dtype=np.uint32)
    e4m3_range = (rng.standard_normal(20000) * 100).astype(F32).view(np.uint32)
    tiny = (rng.standard_normal(5000) * 2**-8).astype(F32).view(np.uint32)
    return np.concatenate([(hi[:, None] | tails[None, :]).reshape(-1), rand, e4m3_range, tiny]).view(F32)


def test_cast_bf16_and_e4m3_bit_exact(rng):
    x = _special_f32(rng)
    bf = np.empty(x.size, np.uint16)
    device.Cast(bf, x, RM.CAST_RINT, x.size)
    np.testing.assert_array_equal(bf, fp32_to_bf16_bits(x))
    codes = np.empty(x.size, np.uint8)
    device.Cast(codes, x, RM.CAST_RINT, x.size)
    nan = np.isnan(x)
    # saturating: clip to +-448 first, then the library's RNE encode (ml_dtypes)
    want = encode_e4m3(np.clip(x, -448, 448)).view(np.uint8)
    np.testing.assert_array_equal(codes[~nan], want[~nan])
    assert (codes[nan] & 0x7F == 0x7F).all()
    # round trip: decode (the GM -> L1 path's decode) of every finite code is exact
    all_codes = np.arange(256, dtype=np.uint8)
    back = np.empty(256, F32)
    device.Cast(back, all_codes, RM.CAST_NONE, 256)
    want_back = all_codes.view(ml_dtypes.float8_e4m3fn).astype(F32)
    finite = ~np.isnan(want_back)
    np.testing.assert_array_equal(back[finite], want_back[finite])
    again = np.empty(256, np.uint8)
    device.Cast(again, back, RM.CAST_RINT, 256)
    np.testing.assert_array_equal(again[finite], all_codes[finite])


def test_cast_on_views_and_partial_counts(rng):
    """Cast's pointer rows (adjacent columns) and indexed fallback (a column stride) give the same bits, with partial
    counts leaving the rest of dst untouched: fp32 -> bf16 (RNE, NaN quieted), bf16 -> fp32 (exact)."""
    x = _data(rng, (6, 40), nan=True)
    bits = fp32_to_bf16_bits(x)
    with pytest.raises(ValueError, match="CAST_RINT"):
        device.Cast(np.zeros(4, np.uint16), x[0, :4], RM.CAST_NONE, 4)
    for cols in (slice(3, 23), slice(1, 40, 2)):
        a, b = x[:, cols], bits[:, cols]
        for count in (a.size, a.size - 7):
            rounded = np.full(a.shape, 7, np.uint16)
            device.Cast(rounded, a, RM.CAST_RINT, count)
            _check_partial(rounded, np.ascontiguousarray(b), np.full(a.shape, 7, np.uint16), count)
            wide = _copy_like(np.full(a.shape, 5, F32), cols.step)
            device.Cast(wide, b, RM.CAST_NONE, count)
            _check_partial(wide, b.view(ml_dtypes.bfloat16).astype(F32), np.full(a.shape, 5, F32), count)


def test_axpy_takes_bf16_into_fp32(rng):
    """The mixed-precision Axpy (bf16 src, fp32 dst; the MQA head reduction) gives the bits of widening the source
    first, on both loop paths and with a partial count; other dtype pairs are refused."""
    x = _data(rng, (5, 24), nan=True)
    bits = fp32_to_bf16_bits(x)
    for cols in (slice(2, 19), slice(0, 24, 3)):
        b = bits[:, cols]
        widened = b.view(ml_dtypes.bfloat16).astype(F32)
        for count in (b.size, b.size - 5):
            acc = _data(rng, b.shape)
            got, want = acc.copy(), acc.copy()
            device.Axpy(got, b, -0.3, count)
            device.Axpy(want, widened, -0.3, count)
            np.testing.assert_array_equal(_bits(got), _bits(want))
    with pytest.raises(TypingError, match="src must have dst's dtype"):
        device.Axpy(np.zeros(4, F32), np.zeros(4, np.float64), 1.0, 4)


def test_cast_ue8m0(rng):
    x = np.abs(_special_f32(rng))
    x = x[np.isfinite(x)]
    e = np.empty(x.size, np.uint8)
    device.CastToUE8M0(e, x, RM.CAST_CEIL, x.size)
    np.testing.assert_array_equal(e, (ceil_to_ue8m0(x).view(np.uint32) >> 23).astype(np.uint8))
    device.CastToUE8M0(e, x, RM.CAST_TRUNC, x.size)
    np.testing.assert_array_equal(e, (x.view(np.uint32) >> 23).astype(np.uint8))
    with pytest.raises(ValueError, match="round_mode"):
        device.CastToUE8M0(e, x, RM.CAST_RINT, 4)
    every = np.arange(256, dtype=np.uint8)
    back = np.empty(256, F32)
    device.CastFromUE8M0(back, every, 256)
    np.testing.assert_array_equal(back[1:255], np.ldexp(F32(1), every[1:255].astype(np.int32) - 127))
    assert back[0] == F32(2.0**-127) and np.isnan(back[255])


def test_datacopy_strided_padded(rng):
    gm = rng.standard_normal(200).astype(F32)
    ub = np.full((6, 16), -9.0, F32)
    device.DataCopyPad(ub, gm, 7, 30, 4, 11, 0.5)
    want = np.full((6, 16), -9.0, F32)
    for r in range(4):
        want[r, :11] = gm[7 + 30 * r: 18 + 30 * r]
        want[r, 11:] = 0.5
    np.testing.assert_array_equal(ub, want)
    out = np.zeros(200, F32)
    device.DataCopyPad(out, ub, 3, 40, 4, 13, 0)
    want_out = np.zeros(200, F32)
    for r in range(4):
        want_out[3 + 40 * r: 16 + 40 * r] = ub[r, :13]
    np.testing.assert_array_equal(out, want_out)
    flat = np.zeros(10, F32)
    device.DataCopy(flat, gm, 10)
    np.testing.assert_array_equal(flat, gm[:10])
    before = out.copy()
    with pytest.raises(IndexError, match="GM"):
        device.DataCopyPad(out, ub, 100, 40, 4, 13, 0)
    np.testing.assert_array_equal(out, before)  # refused before anything is written
    with pytest.raises(IndexError, match="UB"):
        device.DataCopyPad(ub, gm, 0, 10, 7, 4, 0)
    # the indexed loops (a column-strided UB tile, a strided GM view) and the pointer loops agree; gm_stride 0
    # repeats one GM row into every UB row (the MQA kernels' key-scale tile)
    strided_ub = np.full((6, 32), -9.0, F32)[:, ::2]
    device.DataCopyPad(strided_ub, np.repeat(gm, 2)[::2], 7, 30, 4, 11, 0.5)
    np.testing.assert_array_equal(strided_ub, want)
    strided_out = np.zeros(400, F32)
    device.DataCopyPad(strided_out[::2], strided_ub, 3, 40, 4, 13, 0)
    np.testing.assert_array_equal(strided_out[::2], want_out)
    rows = np.zeros((5, 8), F32)
    device.DataCopyPad(rows, gm, 20, 0, 5, 8, 0)
    np.testing.assert_array_equal(rows, np.tile(gm[20:28], (5, 1)))


@pytest.mark.parametrize("ub_dtype", [np.float32, np.uint16])
def test_fixpipe_to_ub(rng, ub_dtype):
    l0c = _special_f32(rng)[:16 * 24].reshape(16, 24)
    ub = np.zeros((20, 32), ub_dtype)
    device.FixpipeToUB(ub, l0c, 13, 21)
    want = np.zeros((20, 32), ub_dtype)
    block = l0c[:13, :21]
    want[:13, :21] = block if ub_dtype == np.float32 else fp32_to_bf16_bits(np.ascontiguousarray(block))
    np.testing.assert_array_equal(ub.view(np.uint32 if ub_dtype == np.float32 else np.uint16),
                                  want.view(np.uint32 if ub_dtype == np.float32 else np.uint16))
    # a column-strided L0C view (the indexed loop) and an adjacent one (the pointer loop) give the same bits
    strided = np.zeros((20, 32), ub_dtype)
    device.FixpipeToUB(strided, np.repeat(l0c, 2, axis=1)[:, ::2], 13, 21)
    np.testing.assert_array_equal(strided.view(np.uint8), ub.view(np.uint8))


def test_every_vector_intrinsic_is_exported_and_documented():
    names = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Adds", "Muls", "Axpy", "Maxs", "Abs", "Exp", "Relu",
             "Duplicate", "Compare", "Select", "Cast", "CastToUE8M0", "CastFromUE8M0", "ReduceMax", "ReduceSum",
             "CastReduceSumSquares", "CastAxpyRows", "CastMulReluAxpyRows", "DataCopy", "DataCopyPad", "FixpipeToUB"]
    for name in names:
        assert name in device.__all__
        assert getattr(device, name).__doc__.startswith(name.split("To")[0][:4])
