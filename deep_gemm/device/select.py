"""The AIV instructions of a top-k selection (templates/topk.asc.j2), on UB tensors of float *bits*: order keys,
the NaN count, the threshold filter with its compress store, the radix select of a candidate buffer, its stable
compaction and the candidate sort. Each is the executable spec of one step the chip's Vector unit runs as a short
sequence of instructions (compare, select, squeeze / GatherMask, cumulative histogram, Sort); none reads GM.

Float bits arrive as signed integers of the float's width (bf16 as int16, fp32 as int32). Their *order key* is
``s ^ ((s >> (w - 1)) & (2**(w - 1) - 1))`` (w the width): a signed integer whose order is the float order, with -0
below +0, a negative NaN below -inf and a positive NaN above +inf (a radix select's key: DeepSelect's order). The
map is its own inverse (OrderKeys turns keys back into bits). Candidates are (key, index) pairs in two 1-D UB tensors
(keys int32, indices int32), kept in ascending index order by every instruction here.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from ..jit.numba_setup import apply_numba_settings

# NOTES: must run before the first @njit below can compile (numba reads it when building its CPU target).
apply_numba_settings()

RADIX_BITS = 8  # the digit of the radix select: 256 bins, as the AIV's cumulative histogram
RADIX_BINS = 1 << RADIX_BITS
HIST_SIZE = 4 * RADIX_BINS  # the histogram scratch RadixSelect takes
FILTER_CHUNK = 64  # one 64-bit mask per step
_GATHER_BITS = np.uint64(0x0102040810204080)  # (w * this) >> 56: the low bits of w's 8 bytes as 8 bits


def _width(x):
    raise NotImplementedError("numba-only helper")


@overload(_width)
def _width_impl(x):
    if isinstance(x, types.Array) and isinstance(x.dtype, types.Integer) and x.dtype.bitwidth in (16, 32):
        bits = x.dtype.bitwidth
        return lambda x: bits
    return None


@njit(cache=True, inline="always")
def _key(s, width):
    """The order key of float bits ``s`` (an int of ``width`` bits, sign-extended)."""
    if width == 16:
        return s ^ ((s >> 15) & 0x7FFF)
    return s ^ ((s >> 31) & 0x7FFFFFFF)


@njit(cache=True, inline="always")
def _is_nan(s, width):
    if width == 16:
        return (s & 0x7FFF) > 0x7F80
    return (s & 0x7FFFFFFF) > 0x7F800000


@intrinsic
def _ptr(typingctx, arr):
    """Pointer to the first element of a C-contiguous tensor (numba-only): plain loops over it vectorise, where
    indexing carries numba's wraparound and run-time strides."""
    if not isinstance(arr, types.Array) or arr.layout != "C":
        return None

    def codegen(context, builder, signature, args):
        return context.make_array(signature.args[0])(context, builder, args[0]).data

    return types.CPointer(arr.dtype)(arr), codegen


@intrinsic
def _ptr_at(typingctx, ptr, offset):
    """ptr + offset elements (numba-only)."""
    if not isinstance(ptr, types.CPointer) or not isinstance(offset, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.gep(args[0], [context.cast(builder, args[1], signature.args[1], types.intp)])

    return ptr(ptr, offset), codegen


@intrinsic
def _cttz(typingctx, x):
    """The number of trailing zero bits of a non-zero uint64 (numba-only; LLVM's cttz: one tzcnt)."""
    if not isinstance(x, types.Integer) or x.bitwidth != 64 or x.signed:
        return None

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(64), [ir.IntType(64), ir.IntType(1)])
        fn = builder.module.declare_intrinsic("llvm.cttz", [ir.IntType(64)], fnty)
        return builder.call(fn, [args[0], ir.Constant(ir.IntType(1), 1)])

    return types.uint64(x), codegen


@njit(cache=True, inline="always")
def _check(x, count):
    if count < 0 or count > x.size:
        raise ValueError("topk intrinsic: count exceeds a tensor", count, x.size)


@njit(cache=True)
def OrderKeys(dst, src, count):  # noqa: N802
    """dst[i] = the order key of the float bits src[i] for i < count, or back (the map is an involution). The
    narrower of the two int16 / int32 tensors gives the float's width: bf16 bits (int16) <-> keys (int16 or int32);
    fp32 bits (int32) <-> keys (int32). C-contiguous tensors (1-D, or a 2-D row tile read in row-major order)."""
    _check(src, count)
    _check(dst, count)
    w = min(_width(src), _width(dst))
    pd, ps = _ptr(dst), _ptr(src)
    for i in range(count):
        pd[i] = _key(ps[i], w)


@njit(cache=True)
def CountNaN(src, count):  # noqa: N802
    """The number of NaNs among the float bits src[:count] (int16 bf16 / int32 fp32): the AIV's compare x == x."""
    _check(src, count)
    w = _width(src)
    ps = _ptr(src)
    n = 0
    for i in range(count):
        n += _is_nan(ps[i], w)
    return n


@njit(cache=True)
def TopkFilter(cand_key, cand_idx, start, src, count, threshold, idx_base):  # noqa: N802
    """Append the elements of src[:count] (float bits) whose order key exceeds ``threshold`` to the candidates, from
    position ``start`` on, in order: cand_key = the key, cand_idx = idx_base + i. Returns how many it appended.

    The chip's sequence: compare with the threshold, then a compress store (squeeze) of the keys and of an arange of
    indices under the compare mask. Per step of FILTER_CHUNK elements: one min / max reduction of the raw bits
    rejects a step with no key above the threshold (keys of non-negative bits are the bits, keys of negative bits
    fall as the bits rise), which is most steps once the threshold has settled; otherwise the compare mask (one
    byte per element, compared on the raw bits) is walked a set bit at a time, or, when many pass (a young
    threshold), every element is stored and the passing ones kept."""
    _check(src, count)
    if start < 0 or start + count > cand_key.size or start + count > cand_idx.size:
        raise ValueError("TopkFilter: the candidates cannot hold the tile", start, count, cand_key.size)
    w = _width(src)
    neg_base = -(1 << (w - 1)) - 1  # key(s) = neg_base - s for negative bits s
    below = neg_base - threshold  # for a negative threshold: negative bits s pass iff s < below
    ps = _ptr(src)
    pk = _ptr_at(_ptr(cand_key), start)
    pi = _ptr_at(_ptr(cand_idx), start)
    words = np.zeros(FILTER_CHUNK // 8, np.uint64)
    pw = _ptr(words)
    pf = _ptr(words.view(np.uint8))
    n = 0
    for c0 in range(0, count, FILTER_CHUNK):
        c1 = min(c0 + FILTER_CHUNK, count)
        hi = ps[c0]
        lo = ps[c0]
        for i in range(c0 + 1, c1):
            hi = max(hi, ps[i])
            lo = min(lo, ps[i])
        passing = 0
        if threshold >= 0:
            if hi <= threshold:
                continue
            for i in range(c0, c1):
                f = ps[i] > threshold
                pf[i - c0] = f
                passing += f
        else:
            if hi < 0 and lo >= below:
                continue
            for i in range(c0, c1):
                f = (ps[i] >= 0) | (ps[i] < below)
                pf[i - c0] = f
                passing += f
        for i in range(c1 - c0, FILTER_CHUNK):
            pf[i] = 0
        if passing * 4 <= FILTER_CHUNK:
            # the byte mask as one bit per element (a multiply gathers a word's 8 low bits), walked by set bit
            m = np.uint64(0)
            for j in range(FILTER_CHUNK // 8):
                m |= ((pw[j] * _GATHER_BITS) >> np.uint64(56)) << np.uint64(8 * j)
            while m != 0:
                i = c0 + np.int64(_cttz(m))
                pk[n] = _key(ps[i], w)
                pi[n] = idx_base + i
                n += 1
                m &= m - np.uint64(1)
        else:
            for i in range(c0, c1):
                k = _key(ps[i], w)
                pk[n] = k
                pi[n] = idx_base + i
                n += k > threshold
    return n


@njit(cache=True)
def RadixSelect(state, keys, count, k, hist, key_bits):  # noqa: N802
    """The k-th largest of keys[:count] (order keys of ``key_bits`` = 16 or 32 bits) by MSD radix select over
    RADIX_BITS-bit digits, one cumulative histogram per digit in ``hist`` (>= HIST_SIZE int32: the stand-in counts
    into 4 interleaved histograms and sums them, so that runs of equal digits do not wait on each other): state[0] =
    that key (the threshold), state[1] = how many keys equal to it belong to the k largest (the keys above it number
    k - state[1]). Requires 1 <= k <= count."""
    _check(keys, count)
    if k < 1 or k > count:
        raise ValueError("RadixSelect: k must be in [1, count]", k, count)
    if hist.size < HIST_SIZE or state.size < 2:
        raise ValueError("RadixSelect: hist needs HIST_SIZE entries and state two", hist.size, state.size)
    pk, ph = _ptr(keys), _ptr(hist)
    bias = 1 << (key_bits - 1)  # keys as unsigned: key + bias
    prefix = 0  # the threshold's digits found so far (unsigned), above `shift`
    need = k  # how many of the keys matching the prefix still belong to the top k
    shift = key_bits
    mask = RADIX_BINS - 1
    while shift > 0:
        shift -= RADIX_BITS
        for b in range(HIST_SIZE):
            ph[b] = 0
        high = shift + RADIX_BITS
        if high == key_bits:
            quads = count // 4 * 4
            for i in range(0, quads, 4):
                ph[((pk[i] + bias) >> shift) & mask] += 1
                ph[RADIX_BINS + (((pk[i + 1] + bias) >> shift) & mask)] += 1
                ph[2 * RADIX_BINS + (((pk[i + 2] + bias) >> shift) & mask)] += 1
                ph[3 * RADIX_BINS + (((pk[i + 3] + bias) >> shift) & mask)] += 1
            for i in range(quads, count):
                ph[((pk[i] + bias) >> shift) & mask] += 1
        else:
            for i in range(count):
                u = pk[i] + bias
                if (u >> high) == prefix:
                    ph[(i & 3) * RADIX_BINS + ((u >> shift) & mask)] += 1
        for b in range(RADIX_BINS):
            ph[b] += ph[RADIX_BINS + b] + ph[2 * RADIX_BINS + b] + ph[3 * RADIX_BINS + b]
        # the digit from the top where the running count reaches `need`
        b = RADIX_BINS - 1
        while ph[b] < need:
            need -= ph[b]
            b -= 1
        prefix = (prefix << RADIX_BITS) | b
    state[0] = prefix - bias
    state[1] = need


@njit(cache=True)
def TopkCompact(keys, idx, count, threshold, equal_take):  # noqa: N802
    """Keep, in place and in order, the candidates whose key exceeds ``threshold`` and the first ``equal_take`` whose
    key equals it (the lowest indices win a tie); returns how many remain. After RadixSelect: exactly k."""
    _check(keys, count)
    _check(idx, count)
    pk, pi = _ptr(keys), _ptr(idx)
    n = 0
    for i in range(count):
        key = pk[i]
        if key > threshold or (key == threshold and equal_take > 0):
            if key == threshold:
                equal_take -= 1
            pk[n] = key
            pi[n] = pi[i]
            n += 1
    return n


@njit(cache=True)
def TopkSortDesc(keys, idx, count, tmp_keys, tmp_idx):  # noqa: N802
    """Sort the candidates by key, largest first, stably (equal keys keep their order: the lower index first), in
    place; tmp_keys / tmp_idx are scratch of at least ``count`` entries (the Sort API's temporary buffer). A
    bottom-up merge sort."""
    _check(keys, count)
    _check(idx, count)
    _check(tmp_keys, count)
    _check(tmp_idx, count)
    width = 1
    src_k, src_i, dst_k, dst_i = keys, idx, tmp_keys, tmp_idx
    swapped = False
    while width < count:
        for lo in range(0, count, 2 * width):
            mid = min(lo + width, count)
            hi = min(lo + 2 * width, count)
            a, b, o = lo, mid, lo
            while a < mid and b < hi:
                if src_k[b] > src_k[a]:  # strictly larger: equal keys keep the left run's first
                    dst_k[o] = src_k[b]
                    dst_i[o] = src_i[b]
                    b += 1
                else:
                    dst_k[o] = src_k[a]
                    dst_i[o] = src_i[a]
                    a += 1
                o += 1
            while a < mid:
                dst_k[o] = src_k[a]
                dst_i[o] = src_i[a]
                a += 1
                o += 1
            while b < hi:
                dst_k[o] = src_k[b]
                dst_i[o] = src_i[b]
                b += 1
                o += 1
        src_k, dst_k = dst_k, src_k
        src_i, dst_i = dst_i, src_i
        swapped = not swapped
        width *= 2
    if swapped:
        for i in range(count):
            keys[i] = tmp_keys[i]
            idx[i] = tmp_idx[i]
