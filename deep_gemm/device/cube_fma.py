"""The Cube's fp32 FMA path (device/cube.py calls it): raw pointers and vector helpers as LLVM IR, the L1 -> L0
copies with their UE8M0 scales and 8-row transposes, and the register-tiled micro-kernel (MR x NR of L0C in vector
accumulators updated with llvm.fma). The raw-pointer helpers serve the other device modules too.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..jit.numba_setup import apply_numba_settings, vector_width_bits
from ._bits import emit_decode, widen_to_i32

# NOTES: must run before the first @njit below can compile (numba reads it when building its CPU target).
apply_numba_settings()

# Register tile. LANES fp32 per full-width vector; a micro-tile is up to MR rows x NR columns of L0C held in
# MR * NR / LANES vector registers (AVX2: 6 x 16 -> 12 of the 16 ymm, plus 2 for B and 1 broadcast of A;
# AVX-512: 8 x 32 -> 16 of the 32 zmm).
LANES = max(vector_width_bits() // 32, 8)
NR = 2 * LANES
MR = 6 if LANES == 8 else 8
# NOTES: Mmad walks K in chunks of KC so one packed B panel (NR x KC fp32, 16 KiB on AVX2) stays in L1 while all
# row tiles of A stream past it.
KC = 256


def _ue8m0_table() -> np.ndarray:
    """2^(e-127) for every UE8M0 byte e, built from the float bits (exact): e=0 is the subnormal 2^-127, e=255 NaN."""
    bits = np.arange(256, dtype=np.uint32) << np.uint32(23)
    bits[0] = np.uint32(1) << np.uint32(22)  # 2^-127 = 0.5 * 2^-126: mantissa's top bit, exponent field 0
    bits[255] = np.uint32(0x7FC00000)  # the E8M0 NaN encoding
    return bits.view(np.float32)


UE8M0_SCALES = _ue8m0_table()

# ---------------------------------------------------------------------------------------------------------------
# Raw pointers and vector helpers (LLVM IR). NOTES: plain array indexing carries a negative-index wraparound
# select that keeps LLVM from proving addresses consecutive; the hot paths address memory through pointers.
# ---------------------------------------------------------------------------------------------------------------
_F32 = ir.FloatType()
_I32 = ir.IntType(32)
_V8 = ir.VectorType(_F32, 8)


@intrinsic
def _data_ptr(typingctx, arr):
    """Pointer to arr's first element (typed by its dtype)."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, signature, args):
        return context.make_array(signature.args[0])(context, builder, args[0]).data

    return types.CPointer(arr.dtype)(arr), codegen


@intrinsic
def _ptr_add(typingctx, ptr, offset):
    """ptr + offset elements."""
    if not isinstance(ptr, types.CPointer) or not isinstance(offset, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        off = context.cast(builder, args[1], signature.args[1], types.intp)
        return builder.gep(args[0], [off])

    return ptr(ptr, offset), codegen


def _vec_ptr(builder, ptr, offset, vty):
    return builder.bitcast(builder.gep(ptr, [offset]), vty.as_pointer())


def _splat(builder, scalar, vty):
    lanes = vty.count
    vec = builder.insert_element(ir.Constant(vty, ir.Undefined), scalar, ir.Constant(_I32, 0))
    return builder.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(_I32, lanes), [0] * lanes))


def _shuffle(builder, a, b, idx):
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, len(idx)), idx))


def _phis(builder, vty, first, first_block, second, second_block):
    """The values of two predecessor blocks merged where they meet: phi i takes ``first[i]`` from ``first_block`` and
    ``second[i]`` from ``second_block`` (both lists of ``vty`` values, the same length)."""
    merged = []
    for x, y in zip(first, second, strict=True):
        phi = builder.phi(vty)
        phi.add_incoming(x, first_block)
        phi.add_incoming(y, second_block)
        merged.append(phi)
    return merged


def _register_loop(builder, count, acc0, name, step):
    """``for k in range(count)`` (count: an intp) with the vectors ``acc0`` as loop-carried registers (phis):
    ``step(k, accs)`` emits one iteration and returns the new accumulators. Returns them after the loop (acc0 when
    count <= 0), the builder positioned after it."""
    intp = count.type
    pre = builder.block
    loop = builder.append_basic_block(name)
    done = builder.append_basic_block(f"{name}.done")
    builder.cbranch(builder.icmp_signed(">", count, ir.Constant(intp, 0)), loop, done)
    builder.position_at_end(loop)
    k = builder.phi(intp)
    k.add_incoming(ir.Constant(intp, 0), pre)
    accs = []
    for x in acc0:
        phi = builder.phi(x.type)
        phi.add_incoming(x, pre)
        accs.append(phi)
    new = step(k, accs)
    k_next = builder.add(k, ir.Constant(intp, 1))
    tail = builder.block
    k.add_incoming(k_next, tail)
    for phi, x in zip(accs, new, strict=True):
        phi.add_incoming(x, tail)
    builder.cbranch(builder.icmp_signed("<", k_next, count), loop, done)
    builder.position_at_end(done)
    return _phis(builder, acc0[0].type, acc0, pre, new, tail)


def _transpose_square(builder, rows):
    """n vectors of n lanes (the rows of an n x n block, n a power of two) -> its n columns: log2(n) butterfly stages
    of 2-input shuffles (the stage of width b swaps the off-diagonal b-blocks of rows i and i | b)."""
    rows = list(rows)
    n = len(rows)
    b = n // 2
    while b:
        lo_idx = [lane if lane & b == 0 else n + lane - b for lane in range(n)]
        hi_idx = [lane + b if lane & b == 0 else n + lane for lane in range(n)]
        for i in range(n):
            if i & b == 0:
                x, y = rows[i], rows[i | b]
                rows[i], rows[i | b] = _shuffle(builder, x, y, lo_idx), _shuffle(builder, x, y, hi_idx)
        b //= 2
    return rows


def _as_intp(context, builder, value, ty):
    return context.cast(builder, value, ty, types.intp)


# NOTES: L1 holds either fp32 values or the operand's own codes (uint8 = FP8 e4m3fn, uint16 = BF16 bits), as the
# chip's L1 holds the operand's dtype; the loads below decode codes in registers on their way to L0 (fused with the
# scale and the packing), so no fp32 copy of an operand tile is ever written to memory.
_CODE_KINDS = {types.uint8: "e4m3", types.uint16: "bf16"}


def _is_l1_ptr(ptr) -> bool:
    return isinstance(ptr, types.CPointer) and (ptr.dtype == types.float32 or ptr.dtype in _CODE_KINDS)


def _load8(context, builder, ptr_type, ptr, offset, lanes=8):
    """<lanes x float> from consecutive L1 elements at ptr + offset (decoded when L1 holds codes; unaligned)."""
    if ptr_type.dtype == types.float32:
        return builder.load(_vec_ptr(builder, ptr, offset, ir.VectorType(_F32, lanes)), align=4)
    elem = context.get_value_type(ptr_type.dtype)
    raw = builder.load(_vec_ptr(builder, ptr, offset, ir.VectorType(elem, lanes)), align=1)
    return emit_decode(builder, widen_to_i32(builder, raw), _CODE_KINDS[ptr_type.dtype])


@intrinsic
def _l1_to_f32(typingctx, x):
    """fp32 value of one L1 element: an fp32 as is, a uint8 FP8 e4m3fn code or uint16 BF16 bits decoded."""
    if x == types.float32:
        return types.float32(x), lambda context, builder, signature, args: args[0]
    if x in _CODE_KINDS:
        kind = _CODE_KINDS[x]

        def codegen(context, builder, signature, args):
            return emit_decode(builder, widen_to_i32(builder, args[0]), kind)

        return types.float32(x), codegen
    return None


@intrinsic
def _copy8_scaled(typingctx, dst, src, scale):
    """dst[0:8] = value(src[0:8]) * scale (one vector load, decode, multiply, store; unaligned)."""

    def codegen(context, builder, signature, args):
        d, s, sc = args
        zero = ir.Constant(ir.IntType(64), 0)
        v = _load8(context, builder, signature.args[1], s, zero)
        v = builder.fmul(v, _splat(builder, sc, _V8))
        builder.store(v, _vec_ptr(builder, d, zero, _V8), align=4)
        return context.get_dummy_value()

    if not (isinstance(dst, types.CPointer) and dst.dtype == types.float32 and _is_l1_ptr(src)):
        return None
    return types.void(dst, src, types.float32), codegen


@intrinsic
def _copy16_scaled(typingctx, dst, src, scale):
    """dst[0:16] = value(src[0:16]) * scale: _copy8_scaled on a 512-bit vector (AVX-512 hosts; LLVM splits it in
    two elsewhere)."""

    def codegen(context, builder, signature, args):
        d, s, sc = args
        zero = ir.Constant(ir.IntType(64), 0)
        v16 = ir.VectorType(_F32, 16)
        v = _load8(context, builder, signature.args[1], s, zero, lanes=16)
        v = builder.fmul(v, _splat(builder, sc, v16))
        builder.store(v, _vec_ptr(builder, d, zero, v16), align=4)
        return context.get_dummy_value()

    if not (isinstance(dst, types.CPointer) and dst.dtype == types.float32 and _is_l1_ptr(src)):
        return None
    return types.void(dst, src, types.float32), codegen


def _transpose8_codegen(width):
    """Codegen of an 8-row x ``width``-column (8 or 16) in-register transpose: dst[j * dst_stride + r] =
    value(src[r * src_stride + j]) * s_r. 8 vector loads of ``width`` lanes (decoded when L1 holds codes), unpack /
    shuffle steps inside each 256-bit half (a 16-wide row holds two 8 x 8 blocks side by side), ``width`` stores of
    8 lanes."""
    halves = width // 8

    def rep(idx, span):
        # the same 8-lane pattern in every 8-lane half; indices of the second operand start at ``span``
        return [(i - 8 + span if i >= 8 else i) + 8 * h for h in range(halves) for i in idx] if halves > 1 else idx

    def codegen(context, builder, signature, args):
        d, sp = args[0], args[2]
        ds = _as_intp(context, builder, args[1], signature.args[1])
        ss = _as_intp(context, builder, args[3], signature.args[3])
        scale = ir.Constant(_V8, ir.Undefined)
        for r in range(8):
            scale = builder.insert_element(scale, args[4 + r], ir.Constant(_I32, r))
        rows = [_load8(context, builder, signature.args[2], sp, builder.mul(ss, ir.Constant(ss.type, r)), width)
                for r in range(8)]
        # Interleave row pairs, then pairs of pairs (within 128-bit lanes), then gather 128-bit quarters.
        t = []
        for r in range(0, 8, 2):
            t.append(_shuffle(builder, rows[r], rows[r + 1], rep([0, 8, 1, 9, 4, 12, 5, 13], width)))
            t.append(_shuffle(builder, rows[r], rows[r + 1], rep([2, 10, 3, 11, 6, 14, 7, 15], width)))
        u = []
        for base in (0, 4):
            for half in (0, 1):
                a, b = t[base + half], t[base + 2 + half]
                u.append(_shuffle(builder, a, b, rep([0, 1, 8, 9, 4, 5, 12, 13], width)))
                u.append(_shuffle(builder, a, b, rep([2, 3, 10, 11, 6, 7, 14, 15], width)))
        for j in range(width):
            h, jj = divmod(j, 8)
            lo, hi = u[jj % 4], u[4 + jj % 4]
            quarter = [0, 1, 2, 3] if jj < 4 else [4, 5, 6, 7]
            idx = [8 * h + q for q in quarter] + [width + 8 * h + q for q in quarter]
            col = builder.fmul(_shuffle(builder, lo, hi, idx), scale)
            builder.store(col, _vec_ptr(builder, d, builder.mul(ds, ir.Constant(ds.type, j)), _V8), align=4)
        return context.get_dummy_value()

    return codegen


@intrinsic
def _transpose8x16_scaled(typingctx, dst, dst_stride, src, src_stride, s0, s1, s2, s3, s4, s5, s6, s7):
    """_transpose8x8_scaled over 16 K columns at once (16-lane loads and decodes; two 8 x 8 blocks per shuffle)."""
    if not (isinstance(dst, types.CPointer) and dst.dtype == types.float32 and _is_l1_ptr(src)):
        return None
    f32 = types.float32
    return types.void(dst, dst_stride, src, src_stride, f32, f32, f32, f32, f32, f32, f32, f32), _transpose8_codegen(16)


@intrinsic
def _transpose8x8_scaled(typingctx, dst, dst_stride, src, src_stride, s0, s1, s2, s3, s4, s5, s6, s7):
    """dst[j * dst_stride + r] = value(src[r * src_stride + j]) * s_r for r, j in 0..7: an in-register 8 x 8
    transpose (unpack / shuffle / 128-bit lane permutes), 8 vector loads (decoded when L1 holds codes), 8 stores."""

    def codegen(context, builder, signature, args):
        d, sp = args[0], args[2]
        ds = _as_intp(context, builder, args[1], signature.args[1])
        ss = _as_intp(context, builder, args[3], signature.args[3])
        scale = ir.Constant(_V8, ir.Undefined)
        for r in range(8):
            scale = builder.insert_element(scale, args[4 + r], ir.Constant(_I32, r))
        rows = [_load8(context, builder, signature.args[2], sp, builder.mul(ss, ir.Constant(ss.type, r)))
                for r in range(8)]
        # Interleave row pairs, then pairs of pairs (within 128-bit lanes), then swap 128-bit halves.
        t = []
        for r in range(0, 8, 2):
            t.append(_shuffle(builder, rows[r], rows[r + 1], [0, 8, 1, 9, 4, 12, 5, 13]))
            t.append(_shuffle(builder, rows[r], rows[r + 1], [2, 10, 3, 11, 6, 14, 7, 15]))
        u = []
        for base in (0, 4):
            for half in (0, 1):
                a, b = t[base + half], t[base + 2 + half]
                u.append(_shuffle(builder, a, b, [0, 1, 8, 9, 4, 5, 12, 13]))
                u.append(_shuffle(builder, a, b, [2, 3, 10, 11, 6, 7, 14, 15]))
        for j in range(8):
            lo, hi = u[j % 4], u[4 + j % 4]
            idx = [0, 1, 2, 3, 8, 9, 10, 11] if j < 4 else [4, 5, 6, 7, 12, 13, 14, 15]
            col = builder.fmul(_shuffle(builder, lo, hi, idx), scale)
            builder.store(col, _vec_ptr(builder, d, builder.mul(ds, ir.Constant(ds.type, j)), _V8), align=4)
        return context.get_dummy_value()

    if not (isinstance(dst, types.CPointer) and dst.dtype == types.float32 and _is_l1_ptr(src)):
        return None
    f32 = types.float32
    return types.void(dst, dst_stride, src, src_stride, f32, f32, f32, f32, f32, f32, f32, f32), codegen


def _make_microkernel(mr: int, nv: int = NR // LANES, masked: bool = False):
    """The Mmad micro-kernel for an mr x (nv * LANES) tile, as an intrinsic:
    ``uk(kc, pa, lda, pb, pc, ldc, init)``: C[i, 0:nv * LANES] (= 0 if init) += sum_k pa[i * lda + k] *
    pb[k * NR + 0:nv * LANES] for i < mr, with C[i, j] at pc[i * ldc + j]. Accumulators live in mr * nv vector
    registers through the whole K loop; each K step is nv vector loads of B, mr broadcasts of A and mr * nv FMAs.
    ``masked``: one more argument, ``tail`` (1..LANES), the lanes of C's last vector that are read and written (the
    last, partial panel of a tile whose columns end inside it); the rest of that vector is neither read nor written,
    and the FMAs of its lanes are discarded."""
    vty = ir.VectorType(_F32, LANES)

    def codegen(context, builder, signature, args):
        intp = context.get_value_type(types.intp)
        kc = _as_intp(context, builder, args[0], signature.args[0])
        pa, pb, pc = args[1], args[3], args[4]
        lda = _as_intp(context, builder, args[2], signature.args[2])
        ldc = _as_intp(context, builder, args[5], signature.args[5])
        init = context.cast(builder, args[6], signature.args[6], types.boolean)
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vty, [vty, vty, vty]), f"llvm.fma.v{LANES}f32"
        )
        zero = ir.Constant(vty, [0.0] * LANES)
        mask = None
        if masked:
            tail = builder.trunc(_as_intp(context, builder, args[7], signature.args[7]), _I32)
            iota = ir.Constant(ir.VectorType(_I32, LANES), list(range(LANES)))
            mask = builder.icmp_unsigned("<", iota, _splat(builder, tail, ir.VectorType(_I32, LANES)))

        # Load (or zero) the C tile.
        c_ptrs, acc0 = [], []
        for i in range(mr):
            row = builder.mul(ldc, ir.Constant(intp, i))
            for v in range(nv):
                p = _vec_ptr(builder, pc, builder.add(row, ir.Constant(intp, LANES * v)), vty)
                c_ptrs.append(p)
                if masked and v == nv - 1:
                    acc0.append(builder.select(init, zero, _masked_load(builder, p, mask, vty)))
                else:
                    acc0.append(builder.select(init, zero, builder.load(p, align=4)))
        a_rows = [builder.gep(pa, [builder.mul(lda, ir.Constant(intp, i))]) for i in range(mr)]

        # K loop: accumulators are loop-carried phis (registers).
        def k_step(k, accs):
            b_off = builder.mul(k, ir.Constant(intp, NR))
            bs = [builder.load(_vec_ptr(builder, pb, builder.add(b_off, ir.Constant(intp, LANES * v)), vty),
                               align=4) for v in range(nv)]
            new = []
            for i in range(mr):
                a = _splat(builder, builder.load(builder.gep(a_rows[i], [k]), align=4), vty)
                for v in range(nv):
                    new.append(builder.call(fma, [a, bs[v], accs[i * nv + v]]))
            return new

        final = _register_loop(builder, kc, acc0, "mmad.k", k_step)

        # Store the C tile.
        for n, (p, x) in enumerate(zip(c_ptrs, final, strict=True)):
            if masked and n % nv == nv - 1:
                _masked_store(builder, x, p, mask)
            else:
                builder.store(x, p, align=4)
        return context.get_dummy_value()

    def pointers_ok(pa, pb, pc):
        return all(isinstance(p, types.CPointer) and p.dtype == types.float32 for p in (pa, pb, pc))

    if masked:
        def typer(typingctx, kc, pa, lda, pb, pc, ldc, init, tail):
            return (types.void(kc, pa, lda, pb, pc, ldc, init, tail), codegen) if pointers_ok(pa, pb, pc) else None
    else:
        def typer(typingctx, kc, pa, lda, pb, pc, ldc, init):
            return (types.void(kc, pa, lda, pb, pc, ldc, init), codegen) if pointers_ok(pa, pb, pc) else None

    typer.__name__ = f"_microkernel_{mr}x{nv * LANES}{'_masked' if masked else ''}"
    return intrinsic(typer)


def _masked_load(builder, ptr, mask, vty):
    """A vector (vty) from ptr; lanes off in mask are zero and not read."""
    fnty = ir.FunctionType(vty, [vty.as_pointer(), _I32, mask.type, vty])
    fn = cgutils.get_or_insert_function(builder.module, fnty, f"llvm.masked.load.v{vty.count}f32.p0")
    return builder.call(fn, [ptr, ir.Constant(_I32, 4), mask, ir.Constant(vty, None)])


def _masked_store(builder, value, ptr, mask):
    """value's lanes on in mask to ptr (the others not written)."""
    vty = value.type
    fnty = ir.FunctionType(ir.VoidType(), [vty, vty.as_pointer(), _I32, mask.type])
    fn = cgutils.get_or_insert_function(builder.module, fnty, f"llvm.masked.store.v{vty.count}f32.p0")
    builder.call(fn, [value, ptr, ir.Constant(_I32, 4), mask])


def _make_paired_tail_microkernel(pairs: int):
    """The last, partial panel's micro-kernel when its columns are LANES + tail (1 <= tail <= LANES / 2), for 2 *
    pairs rows, as an intrinsic ``up(kc, pa, lda, pb, pc, ldc, init, tail)`` with _make_microkernel's semantics.
    Rows 2p and 2p + 1 share one accumulator for their last columns: lanes 0 .. LANES/2 - 1 hold row 2p's, the
    rest row 2p + 1's (B's K step there is its LANES/2 tail columns twice, A's a broadcast of each row's element),
    so each K step is 3 FMAs per row pair instead of 4, the masked layout's second vector being half idle. Every C
    element still takes its FMAs in K order: the same bits. (The HC pre-norm GEMM's N = 24 runs here.)"""
    vty = ir.VectorType(_F32, LANES)
    half = LANES // 2
    hty = ir.VectorType(_F32, half)

    def codegen(context, builder, signature, args):
        intp = context.get_value_type(types.intp)
        const = lambda v: ir.Constant(intp, v)  # noqa: E731
        kc = _as_intp(context, builder, args[0], signature.args[0])
        pa, pb, pc = args[1], args[3], args[4]
        lda = _as_intp(context, builder, args[2], signature.args[2])
        ldc = _as_intp(context, builder, args[5], signature.args[5])
        init = context.cast(builder, args[6], signature.args[6], types.boolean)
        tail = builder.trunc(_as_intp(context, builder, args[7], signature.args[7]), _I32)
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vty, [vty, vty, vty]), f"llvm.fma.v{LANES}f32"
        )
        iota = ir.Constant(ir.VectorType(_I32, half), list(range(half)))
        mask = builder.icmp_unsigned("<", iota, _splat(builder, tail, ir.VectorType(_I32, half)))
        zero, hzero = ir.Constant(vty, [0.0] * LANES), ir.Constant(hty, [0.0] * half)
        both = list(range(LANES))

        # Load (or zero) the C tile: per row its first LANES columns, per row pair the packed tail.
        rows = 2 * pairs
        full_ptrs, tail_ptrs, full0, pack0 = [], [], [], []
        for i in range(rows):
            row = builder.mul(ldc, const(i))
            full_ptrs.append(_vec_ptr(builder, pc, row, vty))
            tail_ptrs.append(_vec_ptr(builder, pc, builder.add(row, const(LANES)), hty))
            full0.append(builder.select(init, zero, builder.load(full_ptrs[i], align=4)))
        for p in range(pairs):
            lo = builder.select(init, hzero, _masked_load(builder, tail_ptrs[2 * p], mask, hty))
            hi = builder.select(init, hzero, _masked_load(builder, tail_ptrs[2 * p + 1], mask, hty))
            pack0.append(_shuffle(builder, lo, hi, both))
        acc0 = full0 + pack0
        a_rows = [builder.gep(pa, [builder.mul(lda, const(i))]) for i in range(rows)]

        def k_step(k, accs):
            b_off = builder.mul(k, const(NR))
            b_full = builder.load(_vec_ptr(builder, pb, b_off, vty), align=4)
            b_half = builder.load(_vec_ptr(builder, pb, builder.add(b_off, const(LANES)), hty), align=4)
            b_twice = _shuffle(builder, b_half, b_half, list(range(half)) * 2)
            new = [None] * len(accs)
            for p in range(pairs):
                a0 = _splat(builder, builder.load(builder.gep(a_rows[2 * p], [k]), align=4), vty)
                a1 = _splat(builder, builder.load(builder.gep(a_rows[2 * p + 1], [k]), align=4), vty)
                new[2 * p] = builder.call(fma, [a0, b_full, accs[2 * p]])
                new[2 * p + 1] = builder.call(fma, [a1, b_full, accs[2 * p + 1]])
                mixed = _shuffle(builder, a0, a1, [0] * half + [LANES] * half)
                new[rows + p] = builder.call(fma, [mixed, b_twice, accs[rows + p]])
            return new

        final = _register_loop(builder, kc, acc0, "mmad.pair.k", k_step)

        # Store the C tile.
        for i in range(rows):
            builder.store(final[i], full_ptrs[i], align=4)
        for p in range(pairs):
            packed = final[rows + p]
            _masked_store(builder, _shuffle(builder, packed, packed, list(range(half))), tail_ptrs[2 * p], mask)
            _masked_store(builder, _shuffle(builder, packed, packed, list(range(half, LANES))), tail_ptrs[2 * p + 1],
                          mask)
        return context.get_dummy_value()

    def typer(typingctx, kc, pa, lda, pb, pc, ldc, init, tail):
        if not all(isinstance(p, types.CPointer) and p.dtype == types.float32 for p in (pa, pb, pc)):
            return None
        return types.void(kc, pa, lda, pb, pc, ldc, init, tail), codegen

    typer.__name__ = f"_microkernel_{2 * pairs}x{LANES}+pairs"
    return intrinsic(typer)


_uk1 = _make_microkernel(1)
_uk2 = _make_microkernel(2)
_uk3 = _make_microkernel(3)
_uk4 = _make_microkernel(4)
_uk5 = _make_microkernel(5)
_uk6 = _make_microkernel(6)
# NOTES: 7- and 8-row tiles exist only where MR = 8 (AVX-512); elsewhere the names alias the 6-row kernel so the
# dispatch below compiles, and _row_tile never asks for them.
_uk7 = _make_microkernel(7) if MR >= 7 else _uk6
_uk8 = _make_microkernel(8) if MR >= 8 else _uk6


@njit(cache=True)
def _microkernel(mr, kc, pa, lda, pb, pc, ldc, init):
    """Dispatch an mr-row tile (1 <= mr <= MR) to its register-tiled micro-kernel."""
    if mr == 6:
        _uk6(kc, pa, lda, pb, pc, ldc, init)
    elif mr == 4:
        _uk4(kc, pa, lda, pb, pc, ldc, init)
    elif mr == 5:
        _uk5(kc, pa, lda, pb, pc, ldc, init)
    elif mr == 8:
        _uk8(kc, pa, lda, pb, pc, ldc, init)
    elif mr == 7:
        _uk7(kc, pa, lda, pb, pc, ldc, init)
    elif mr == 3:
        _uk3(kc, pa, lda, pb, pc, ldc, init)
    elif mr == 2:
        _uk2(kc, pa, lda, pb, pc, ldc, init)
    else:
        _uk1(kc, pa, lda, pb, pc, ldc, init)


# The last, partial panel of a tile (mad_n % NR != 0): one vector (_ut*) when its columns fit one, else two (_uu*),
# the last vector masked to the columns that are there.
_ut = [_make_microkernel(mr, 1, True) for mr in range(1, MR + 1)]
_uu = [_make_microkernel(mr, NR // LANES, True) for mr in range(1, MR + 1)]
_ut1, _ut2, _ut3, _ut4, _ut5, _ut6 = _ut[:6]
_uu1, _uu2, _uu3, _uu4, _uu5, _uu6 = _uu[:6]
# NOTES: as _uk7 / _uk8: the 7- and 8-row names alias the 6-row kernels where MR = 6.
_ut7, _ut8 = (_ut[6], _ut[7]) if MR >= 8 else (_ut6, _ut6)
_uu7, _uu8 = (_uu[6], _uu[7]) if MR >= 8 else (_uu6, _uu6)
# NOTES: paired tails where a vector holds two half-rows of 8 (AVX-512); with 8 lanes (AVX2) the names alias _uu2 so
# the dispatch compiles, and PAIRED_TAIL keeps it from being taken.
PAIRED_TAIL = LANES == 16
_up1, _up2, _up3, _up4 = ([_make_paired_tail_microkernel(p) for p in range(1, 5)] if PAIRED_TAIL else [_uu2] * 4)


@njit(cache=True)
def _microkernel_tail(mr, cols, kc, pa, lda, pb, pc, ldc, init):
    """An mr-row tile (1 <= mr <= MR) of the last, partial panel: C columns 0 .. cols - 1 (1 <= cols < NR) only,
    read and written through a lane mask; B's panel as every panel (NR lanes a K step, rows past mad_n zero)."""
    if cols <= LANES:
        if mr == 8:
            _ut8(kc, pa, lda, pb, pc, ldc, init, cols)
        elif mr == 7:
            _ut7(kc, pa, lda, pb, pc, ldc, init, cols)
        elif mr == 6:
            _ut6(kc, pa, lda, pb, pc, ldc, init, cols)
        elif mr == 5:
            _ut5(kc, pa, lda, pb, pc, ldc, init, cols)
        elif mr == 4:
            _ut4(kc, pa, lda, pb, pc, ldc, init, cols)
        elif mr == 3:
            _ut3(kc, pa, lda, pb, pc, ldc, init, cols)
        elif mr == 2:
            _ut2(kc, pa, lda, pb, pc, ldc, init, cols)
        else:
            _ut1(kc, pa, lda, pb, pc, ldc, init, cols)
        return
    last = cols - LANES
    if PAIRED_TAIL and last <= LANES // 2 and mr >= 2:
        # rows in pairs sharing their tails' vector (_up*), an odd last row alone
        pairs = mr // 2
        if pairs == 4:
            _up4(kc, pa, lda, pb, pc, ldc, init, last)
        elif pairs == 3:
            _up3(kc, pa, lda, pb, pc, ldc, init, last)
        elif pairs == 2:
            _up2(kc, pa, lda, pb, pc, ldc, init, last)
        else:
            _up1(kc, pa, lda, pb, pc, ldc, init, last)
        if mr % 2:
            _uu1(kc, _ptr_add(pa, (mr - 1) * lda), lda, pb, _ptr_add(pc, (mr - 1) * ldc), ldc, init, last)
        return
    if mr == 8:
        _uu8(kc, pa, lda, pb, pc, ldc, init, last)
    elif mr == 7:
        _uu7(kc, pa, lda, pb, pc, ldc, init, last)
    elif mr == 6:
        _uu6(kc, pa, lda, pb, pc, ldc, init, last)
    elif mr == 5:
        _uu5(kc, pa, lda, pb, pc, ldc, init, last)
    elif mr == 4:
        _uu4(kc, pa, lda, pb, pc, ldc, init, last)
    elif mr == 3:
        _uu3(kc, pa, lda, pb, pc, ldc, init, last)
    elif mr == 2:
        _uu2(kc, pa, lda, pb, pc, ldc, init, last)
    else:
        _uu1(kc, pa, lda, pb, pc, ldc, init, last)


@njit(cache=True, inline="always")
def _row_tile(i0, mad_m):
    """Rows of the micro-tile starting at row i0: MR, except that a short remainder is balanced with the tile
    before it (MR=6: 16 -> 6+6+4, 32 -> 6*4+4+4, 7 -> 4+3), so no tile is thinner than MR/2 when mad_m >= MR."""
    rest = mad_m - i0
    if rest <= MR:
        return rest
    if rest < MR + MR // 2 + 1 and rest % MR != 0 and rest % MR < MR // 2 + 1:
        return (rest + 1) // 2
    return MR
