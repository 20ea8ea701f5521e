"""The Cube's AMX path (device/cube.py calls it): bf16 L0 buffers in the tile unit's layouts, their VNNI packing,
and TDPBF16PS blocks into fp32 L0C, emitted only where the host's LLVM may select AMX instructions.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..jit import amx
from ..jit.numba_setup import apply_numba_settings, host_cpu_features
from .cube_fma import (
    _F32,
    _I32,
    _as_intp,
    _is_l1_ptr,
    _load8,
    _phis,
    _splat,
    _transpose_square,
    _vec_ptr,
)

# NOTES: must run before the first @njit below can compile (numba reads it when building its CPU target).
apply_numba_settings()

# ---------------------------------------------------------------------------------------------------------------
# The AMX path: bf16 L0 buffers and TDPBF16PS. NOTES: when both operands are exact in bf16 (BF16; FP8 and FP4
# codes times a power-of-two scale) the templates give L0A/L0B the chip's own layout idea (operand dtype in L0,
# here uint16 bf16 bits) and the Cube runs on the CPU's AMX tile unit: one TDPBF16PS multiplies a 16 x 32 bf16 A
# tile by a 32 x 16 B tile into a 16 x 16 fp32 C tile (products exact, fp32 accumulation in the unit's own order
# within each 32-K step), ~6x the FMA micro-kernel per core on this CPU. Layouts (uint16 elements):
# - L0A: [round_up(mad_m, 16)][round_up(mad_k, 32)] row-major, K zero-padded (rows past mad_m are never stored).
# - L0B: panels of 16 B rows, [ceil(mad_n / 16)][round_up(mad_k, 32) / 2][16][2]: K pairs interleaved per column
#   (the unit's "VNNI" B layout), rows past mad_n and K past mad_k zero.
# Results depend only on the K steps' order (32-K steps from k = 0), not on tiling, threads or core count.
# ---------------------------------------------------------------------------------------------------------------
AMX_T = 16  # tile rows (M, and pair rows of B) and fp32 columns of C
AMX_K = 32  # bf16 K per tile step (64-byte tile rows)
_I8 = ir.IntType(8)
_I1 = ir.IntType(1)
_I16 = ir.IntType(16)
_I64 = ir.IntType(64)
_P8 = _I8.as_pointer()
# NOTES: AMX instructions are emitted only where LLVM may select them; elsewhere the bf16 path raises first.
AMX_SUPPORTED = amx.supported()
_AMX_CODEGEN = AMX_SUPPORTED and {"+amx-tile", "+amx-bf16"} <= set(host_cpu_features().split(","))


def _amx_config() -> np.ndarray:
    """The 64-byte tile configuration (palette 1): all 8 tiles 16 rows x 64 bytes."""
    cfg = np.zeros(64, dtype=np.uint8)
    cfg[0] = 1
    cfg[16:32].view(np.uint16)[:8] = 64
    cfg[48:56] = AMX_T
    return cfg


AMX_CONFIG = _amx_config()


@intrinsic
def _ptr_as_f32(typingctx, arr):
    """Pointer to arr's data as float32* (whatever its dtype): the L0 paths are chosen at run time by itemsize, and
    both must type-check for either buffer dtype."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.bitcast(data, _F32.as_pointer())

    return types.CPointer(types.float32)(arr), codegen


@intrinsic
def _ptr_as_u16(typingctx, arr):
    """Pointer to arr's data as uint16* (see _ptr_as_f32)."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.bitcast(data, _I16.as_pointer())

    return types.CPointer(types.uint16)(arr), codegen


def _to_bf16(builder, v):
    """<n x float> -> <n x i16>: the high halves (bf16 bits). Exact for the values this path takes (BF16, FP8 and
    FP4 values times a power of two); any other fp32 value is truncated toward zero."""
    ity = ir.VectorType(_I32, v.type.count)
    bits = builder.lshr(builder.bitcast(v, ity), ir.Constant(ity, [16] * v.type.count))
    return builder.trunc(bits, ir.VectorType(_I16, v.type.count))


# NOTES: FP8 e4m3 codes straight to bf16 bits in 16-bit lanes (one zmm per 32 codes instead of two of fp32), where
# the host's LLVM may select AVX512-BW word permutes. A code's unscaled bf16 bits: (low7 << 4) + (120 << 7) for a
# normal code (e4m3's exponent and mantissa fields land in bf16's, rebiased by 120), m * 2^-9 for the seven
# subnormals, 0 for zero, 0x7FC0 for NaN (all 128 in one word table, _E4M3_BF16_TABLE); the sign is bit 7 moved to
# bit 15. A UE8M0 scale 2^s then adds s to the exponent field (s << 7), which is the exact product as long as no
# scaled value leaves the normal range: |value| in [2^-9, 448] times 2^s stays normal for s in [E4M3_SCALE_LO,
# E4M3_SCALE_HI] - 127. Where a scale is outside (any of a B panel's 16-row step; an A row's 32-K step), the codes
# take the fp32 path (decode, multiply, high half); both give the same bits wherever the fast one applies
# (tests/device/test_cube.py checks every code and edge scale).
# Measured: a 128 x 256 FP8 L0B load with scales 5.07 -> 2.52 us; FP8 128x7168x2048 (2 threads) 6.68-7.01 ->
# 5.96-6.15 ms a call with fp32 scales, 6.34-6.52 -> 5.65-5.66 with packed ones. Then (one thread, 128 x 256 with
# scales) the word table instead of the shift-add-select decode, and A on it in 32-K steps: L0A 2.42 -> 1.22 us, L0B
# 2.40 -> 1.82 us.
_LUT_DECODE = "+avx512bw" in host_cpu_features().split(",")
E4M3_SCALE_LO, E4M3_SCALE_HI = 10, 246
_E4M3_SUBNORMAL_BF16 = [0] + [int(np.float32(m * 2.0**-9).view(np.uint32)) >> 16 for m in range(1, 8)]


def _i16v(values):
    """A <32 x i16> constant: ``values`` (a list of 32) or one value in every lane."""
    return ir.Constant(ir.VectorType(_I16, 32), list(values) if isinstance(values, (list, tuple)) else [values] * 32)


def _e4m3_bf16_table() -> list[int]:
    """The unscaled, unsigned bf16 bits of e4m3 codes 0..127: 0, the seven subnormals, the normals, 0x7FC0 (NaN)."""
    return ([0] + _E4M3_SUBNORMAL_BF16[1:] + [(low << 4) + (120 << 7) for low in range(8, 127)] + [0x7FC0])


_E4M3_BF16_TABLE = _e4m3_bf16_table()


def _e4m3_to_bf16(builder, raw, shift):
    """<32 x i8> e4m3 codes -> <32 x i16> bf16 bits, the exponent field raised by ``shift`` (an i16 value, s << 7;
    None: unscaled). The low 7 bits index a 128-entry word table (two 2-register word permutes, picked by bit 6),
    the shift is added to every code but zero and NaN, and bit 7 becomes the sign."""
    vty = ir.VectorType(_I16, 32)
    permi2w = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [vty, vty, vty]),
                                             "llvm.x86.avx512.vpermi2var.hi.512")
    c = builder.zext(raw, vty)
    tab = [_i16v(_E4M3_BF16_TABLE[32 * t:32 * t + 32]) for t in range(4)]
    # NOTES: the permutes read only the index's low 6 bits, so the code goes in as it is (sign bit included)
    lo = builder.call(permi2w, [tab[0], c, tab[1]])
    hi = builder.call(permi2w, [tab[2], c, tab[3]])
    bits = builder.select(builder.icmp_unsigned("!=", builder.and_(c, _i16v(0x40)), _i16v(0)), hi, lo)
    if shift is not None:
        # zero (0) and NaN (0x7FC0) keep their bits: every other entry lies in [0x3B00, 0x43E0]
        finite = builder.icmp_unsigned("<", builder.sub(bits, _i16v(1)), _i16v(0x7000))
        bits = builder.select(finite, builder.add(bits, _splat(builder, shift, vty)), bits)
    return builder.or_(bits, builder.and_(builder.shl(c, _i16v(8)), _i16v(0x8000)))


def _e4m3_rows_bf16(builder, sp, ss, shifts):
    """16 rows of 32 e4m3 codes (row r at sp + r * ss) as <16 x i32> of bf16 pairs, row r's exponent field raised
    by shifts[r] (an i16 value: s << 7, or None for unscaled)."""
    rows = []
    for r in range(16):
        off = builder.mul(ss, ir.Constant(ss.type, r))
        raw = builder.load(_vec_ptr(builder, sp, off, ir.VectorType(_I8, 32)), align=1)
        bits = _e4m3_to_bf16(builder, raw, None if shifts is None else shifts[r])
        rows.append(builder.bitcast(bits, ir.VectorType(_I32, 16)))
    return rows


@intrinsic
def _copy16_bf16(typingctx, dst, src, scale):
    """dst[0:16] = bf16(value(src[0:16]) * scale): one vector load, decode, multiply, 16-bit store (the fp32 path;
    A's loads take it for 16-K chunks only: whole 32-K steps go through _copy32_bf16)."""

    def codegen(context, builder, signature, args):
        d, s, sc = args
        zero = ir.Constant(_I64, 0)
        v16 = ir.VectorType(_F32, 16)
        v = builder.fmul(_load8(context, builder, signature.args[1], s, zero, lanes=16), _splat(builder, sc, v16))
        builder.store(_to_bf16(builder, v), _vec_ptr(builder, d, zero, ir.VectorType(_I16, 16)), align=2)
        return context.get_dummy_value()

    if not (isinstance(dst, types.CPointer) and dst.dtype == types.uint16 and _is_l1_ptr(src)):
        return None
    return types.void(dst, src, types.float32), codegen


def _fp32_path_bf16(context, builder, src_type, d, s, offset, scale):
    """16 L1 elements at s + offset decoded to fp32, times ``scale`` (a float), cut to bf16 and stored at d + offset."""
    v16 = ir.VectorType(_F32, 16)
    v = builder.fmul(_load8(context, builder, src_type, s, offset, lanes=16), _splat(builder, scale, v16))
    builder.store(_to_bf16(builder, v), _vec_ptr(builder, d, offset, ir.VectorType(_I16, 16)), align=2)


def _shift_in_range(builder, e):
    """(i1: whether UE8M0 exponent e (an i32) lets the 16-bit decode apply its scale, i16: (e - 127) << 7)."""
    inside = builder.icmp_unsigned("<=", builder.sub(e, ir.Constant(_I32, E4M3_SCALE_LO)),
                                   ir.Constant(_I32, E4M3_SCALE_HI - E4M3_SCALE_LO))
    return inside, builder.trunc(builder.shl(builder.sub(e, ir.Constant(_I32, 127)), ir.Constant(_I32, 7)), _I16)


@intrinsic
def _copy32_bf16(typingctx, dst, src, exponent, scale):
    """dst[0:32] = bf16(value(src[0:32]) * scale), scale = 2^(exponent - 127) (the caller passes both: the UE8M0
    byte as an integer and its fp32 value). FP8 codes go straight to bf16 bits in 16-bit lanes (see _LUT_DECODE)
    when the exponent is inside the decode's range; otherwise, and for other L1 types, two fp32-path halves."""

    def codegen(context, builder, signature, args):
        d, s, e, sc = args
        zero, half = ir.Constant(_I64, 0), ir.Constant(_I64, 16)
        src_type = signature.args[1]
        if not (_LUT_DECODE and src_type.dtype == types.uint8):
            _fp32_path_bf16(context, builder, src_type, d, s, zero, sc)
            _fp32_path_bf16(context, builder, src_type, d, s, half, sc)
            return context.get_dummy_value()
        # NOTES: the 16-bit decode runs whatever the exponent (its result overwritten where it is out of range), so
        # it sits in a block every call executes and LLVM keeps its tables in registers across a caller's loop (in
        # a branch they were reloaded from the constant pool per call: a 64 x 256 L0A load 1.10 -> 0.68 us)
        inside, shift = _shift_in_range(builder, context.cast(builder, e, signature.args[2], types.int32))
        raw = builder.load(_vec_ptr(builder, s, zero, ir.VectorType(_I8, 32)), align=1)
        builder.store(_e4m3_to_bf16(builder, raw, shift), _vec_ptr(builder, d, zero, ir.VectorType(_I16, 32)), align=2)
        with builder.if_then(builder.not_(inside), likely=False):
            _fp32_path_bf16(context, builder, src_type, d, s, zero, sc)
            _fp32_path_bf16(context, builder, src_type, d, s, half, sc)
        return context.get_dummy_value()

    if not (isinstance(dst, types.CPointer) and dst.dtype == types.uint16 and _is_l1_ptr(src)
            and isinstance(exponent, types.Integer)):
        return None
    return types.void(dst, src, exponent, types.float32), codegen


@intrinsic
def _to_bf16_bits(typingctx, x):
    """bf16 bits (uint16) of one fp32 value (its high half; see _to_bf16)."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        v1 = ir.VectorType(_F32, 1)
        v = builder.insert_element(ir.Constant(v1, ir.Undefined), args[0], ir.Constant(_I32, 0))
        return builder.extract_element(_to_bf16(builder, v), ir.Constant(_I32, 0))

    return types.uint16(x), codegen


def _vnni_codegen(scaled: bool):
    """Codegen of one 32-K step of a B panel (see _vnni16x32): 16 row loads (decoded, scaled and cut to bf16; FP8
    codes straight to bf16 bits when every scale of the step allows, see _LUT_DECODE; unscaled BF16 bits loaded as
    16 dwords of bf16 pairs as they are), a 16 x 16 dword transpose in 4 butterfly stages of 2-input shuffles, 16
    stores."""

    def float_rows(context, builder, signature, args, sp, ss, v16, raw):
        rows = []
        for r in range(16):
            off = builder.mul(ss, ir.Constant(ss.type, r))
            if raw:
                rows.append(builder.load(_vec_ptr(builder, sp, off, v16), align=2))
                continue
            v = _load8(context, builder, signature.args[1], sp, off, lanes=32)
            if scaled:
                sc = builder.load(builder.gep(args[3], [ir.Constant(_I64, r)]))
                v = builder.fmul(v, _splat(builder, sc, ir.VectorType(_F32, 32)))
            rows.append(builder.bitcast(_to_bf16(builder, v), v16))
        return rows

    def codegen(context, builder, signature, args):
        d, sp = args[0], args[1]
        ss = _as_intp(context, builder, args[2], signature.args[2])
        v16 = ir.VectorType(_I32, 16)
        raw = not scaled and signature.args[1].dtype == types.uint16
        if not (_LUT_DECODE and signature.args[1].dtype == types.uint8):
            rows = float_rows(context, builder, signature, args, sp, ss, v16, raw)
        elif not scaled:
            rows = _e4m3_rows_bf16(builder, sp, ss, None)
        else:
            # the scales' exponent fields (a set sign bit reads as >= 256: out of range too)
            vf = ir.VectorType(_F32, 16)
            exps = builder.lshr(builder.bitcast(builder.load(builder.bitcast(args[3], vf.as_pointer()), align=4),
                                                v16), ir.Constant(v16, [23] * 16))
            inside = builder.and_(builder.icmp_unsigned(">=", exps, ir.Constant(v16, [E4M3_SCALE_LO] * 16)),
                                  builder.icmp_unsigned("<=", exps, ir.Constant(v16, [E4M3_SCALE_HI] * 16)))
            reduce_and = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.IntType(1), [inside.type]), "llvm.vector.reduce.and.v16i1")
            all_inside = builder.call(reduce_and, [inside])
            shifted = builder.trunc(builder.shl(builder.sub(exps, ir.Constant(v16, [127] * 16)),
                                                ir.Constant(v16, [7] * 16)), ir.VectorType(_I16, 16))
            with builder.if_else(all_inside) as (fast, slow):
                with fast:
                    shifts = [builder.extract_element(shifted, ir.Constant(_I32, r)) for r in range(16)]
                    fast_rows = _e4m3_rows_bf16(builder, sp, ss, shifts)
                    fast_block = builder.block
                with slow:
                    slow_rows = float_rows(context, builder, signature, args, sp, ss, v16, raw)
                    slow_block = builder.block
            rows = _phis(builder, v16, fast_rows, fast_block, slow_rows, slow_block)
        rows = _transpose_square(builder, rows)
        for p in range(16):
            builder.store(rows[p], _vec_ptr(builder, d, ir.Constant(_I64, 32 * p), v16), align=2)
        return context.get_dummy_value()

    return codegen


@intrinsic
def _vnni16x32_e8(typingctx, dst, src, src_stride, exponents, exp_stride):
    """_vnni16x32 with row r's scale 2^(e - 127), e the UE8M0 byte at exponents + r * exp_stride, when the 16-bit
    FP8 decode applies: every e inside its range and L1 holding FP8 codes. Returns whether it did the step (False:
    the caller redoes it on the fp32 path; what was written is not the step's value)."""
    if not (isinstance(dst, types.CPointer) and dst.dtype == types.uint16 and _is_l1_ptr(src)
            and isinstance(exponents, types.CPointer) and exponents.dtype == types.uint8):
        return None

    def codegen(context, builder, signature, args):
        if not (_LUT_DECODE and signature.args[1].dtype == types.uint8):
            return ir.Constant(_I1, 0)
        d, sp, pe = args[0], args[1], args[3]
        ss = _as_intp(context, builder, args[2], signature.args[2])
        es = _as_intp(context, builder, args[4], signature.args[4])
        inside, shifts = ir.Constant(_I1, 1), []
        for r in range(16):
            e = builder.zext(builder.load(builder.gep(pe, [builder.mul(es, ir.Constant(es.type, r))])), _I32)
            ok, shift = _shift_in_range(builder, e)
            inside = builder.and_(inside, ok)
            shifts.append(shift)
        # NOTES: the step is decoded and stored whatever the exponents (the caller overwrites it when one is out of
        # range), so the decode's tables stay in registers across the caller's loop (see _copy32_bf16)
        rows = _transpose_square(builder, _e4m3_rows_bf16(builder, sp, ss, shifts))
        for p in range(16):
            builder.store(rows[p], _vec_ptr(builder, d, ir.Constant(_I64, 32 * p), ir.VectorType(_I32, 16)), align=2)
        return inside

    return types.boolean(dst, src, src_stride, exponents, exp_stride), codegen


@intrinsic
def _vnni16x32(typingctx, dst, src, src_stride, scales):
    """One 32-K step of a B panel: for 16 L1 rows r (at src + r * src_stride) and K pairs p < 16,
    dst[p * 32 + 2 * r + t] = bf16(value(src[r * src_stride + 2 * p + t]) * scales[r]). Each row is 16 dwords of
    bf16 pairs, so the step is a 16 x 16 dword transpose."""
    if not (isinstance(dst, types.CPointer) and dst.dtype == types.uint16 and _is_l1_ptr(src)
            and isinstance(scales, types.CPointer) and scales.dtype == types.float32):
        return None
    return types.void(dst, src, src_stride, scales), _vnni_codegen(True)


@intrinsic
def _vnni16x32_unscaled(typingctx, dst, src, src_stride):
    """_vnni16x32 with every scale 1 (BF16 bits move as they are: no decode, no multiply)."""
    if not (isinstance(dst, types.CPointer) and dst.dtype == types.uint16 and _is_l1_ptr(src)):
        return None
    return types.void(dst, src, src_stride), _vnni_codegen(False)


def _amx_fn(builder, name, arg_types):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), arg_types), name)


@intrinsic
def _amx_load_config(typingctx, cfg):
    """LDTILECFG from the 64-byte configuration at cfg (per thread; every bf16 Mmad loads it first)."""

    def codegen(context, builder, signature, args):
        if _AMX_CODEGEN:
            builder.call(_amx_fn(builder, "llvm.x86.ldtilecfg", [_P8]), [builder.bitcast(args[0], _P8)])
        return context.get_dummy_value()

    if not isinstance(cfg, types.CPointer):
        return None
    return types.void(cfg), codegen


def _make_amx_block(tm: int, tn: int):
    """The bf16 Mmad of a (16 tm) x (16 tn) C block, 1 <= tm, tn <= 2, as an intrinsic:
    ``blk(nk, pa, lda, pb, ldb, pc, ldc, init)``: C tiles (tm x tn, in tiles 0-3) zeroed (init) or loaded from pc
    (row stride ldc fp32), then nk 32-K steps: A tiles (4, 5) from pa + step * 32 (row stride lda bf16), B tiles
    (6, 7) from pb + step * 512 (panel stride ldb bf16), one TDPBF16PS per C tile; C stored back."""

    def codegen(context, builder, signature, args):
        if not _AMX_CODEGEN:
            return context.get_dummy_value()
        nk = _as_intp(context, builder, args[0], signature.args[0])
        lda = _as_intp(context, builder, args[2], signature.args[2])
        ldb = _as_intp(context, builder, args[4], signature.args[4])
        ldc = _as_intp(context, builder, args[6], signature.args[6])
        init = context.cast(builder, args[7], signature.args[7], types.boolean)
        pa = builder.bitcast(args[1], _P8)
        pb = builder.bitcast(args[3], _P8)
        pc = builder.bitcast(args[5], _P8)
        load = _amx_fn(builder, "llvm.x86.tileloadd64", [_I8, _P8, _I64])
        store = _amx_fn(builder, "llvm.x86.tilestored64", [_I8, _P8, _I64])
        zero = _amx_fn(builder, "llvm.x86.tilezero", [_I8])
        dot = _amx_fn(builder, "llvm.x86.tdpbf16ps", [_I8, _I8, _I8])
        i8 = lambda v: ir.Constant(_I8, v)  # noqa: E731
        i64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
        c_bytes = builder.mul(ldc, i64(4))
        a_bytes = builder.mul(lda, i64(2))
        b_panel = builder.mul(ldb, i64(2))
        a_tile2 = builder.mul(a_bytes, i64(AMX_T))
        c_row16 = builder.mul(c_bytes, i64(AMX_T))
        tiles = [(i, j) for i in range(tm) for j in range(tn)]

        def c_ptr(i, j):
            return builder.gep(pc, [builder.add(builder.mul(c_row16, i64(i)), i64(64 * j))])

        with builder.if_else(init) as (then, otherwise):
            with then:
                for t, _ in enumerate(tiles):
                    builder.call(zero, [i8(t)])
            with otherwise:
                for t, (i, j) in enumerate(tiles):
                    builder.call(load, [i8(t), c_ptr(i, j), c_bytes])
        with cgutils.for_range(builder, nk) as loop:
            step = loop.index
            a0 = builder.gep(pa, [builder.mul(step, i64(2 * AMX_K))])
            b0 = builder.gep(pb, [builder.mul(step, i64(2 * AMX_K * AMX_T))])
            for i in range(tm):
                builder.call(load, [i8(4 + i), builder.gep(a0, [builder.mul(a_tile2, i64(i))]), a_bytes])
            for j in range(tn):
                builder.call(load, [i8(6 + j), builder.gep(b0, [builder.mul(b_panel, i64(j))]), i64(4 * AMX_T)])
            for t, (i, j) in enumerate(tiles):
                builder.call(dot, [i8(t), i8(4 + i), i8(6 + j)])
        for t, (i, j) in enumerate(tiles):
            builder.call(store, [i8(t), c_ptr(i, j), c_bytes])
        return context.get_dummy_value()

    def typer(typingctx, nk, pa, lda, pb, ldb, pc, ldc, init):
        if not (isinstance(pa, types.CPointer) and pa.dtype == types.uint16 and isinstance(pb, types.CPointer)
                and pb.dtype == types.uint16 and isinstance(pc, types.CPointer) and pc.dtype == types.float32):
            return None
        return types.void(nk, pa, lda, pb, ldb, pc, ldc, init), codegen

    typer.__name__ = f"_amx_block_{tm}x{tn}"
    return intrinsic(typer)


_amx11 = _make_amx_block(1, 1)
_amx12 = _make_amx_block(1, 2)
_amx21 = _make_amx_block(2, 1)
_amx22 = _make_amx_block(2, 2)


@njit(cache=True)
def _amx_block(tm, tn, nk, pa, lda, pb, ldb, pc, ldc, init):
    if tm == 2 and tn == 2:
        _amx22(nk, pa, lda, pb, ldb, pc, ldc, init)
    elif tm == 2:
        _amx21(nk, pa, lda, pb, ldb, pc, ldc, init)
    elif tn == 2:
        _amx12(nk, pa, lda, pb, ldb, pc, ldc, init)
    else:
        _amx11(nk, pa, lda, pb, ldb, pc, ldc, init)


@njit(cache=True, inline="always")
def _round_up(x, m):
    return (x + m - 1) // m * m
