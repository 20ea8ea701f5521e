"""The Cube stand-in: L1 -> L0A/L0B loads (UE8M0 block scales folded in) and Mmad into L0C, as Numba device
functions; a register-tiled fp32 FMA micro-kernel does the work. Not here: GM -> L1 decode (copy.py), FixPipe.

Contract (all ``@njit(cache=True)``, callable from generated kernels; sizes in elements):
- ``l0a_size(mad_m, mad_k)`` / ``l0b_size(mad_n, mad_k)``: elements of one L0A / L0B buffer (either L0 dtype).
- ``load_l0a(l0a, l1a, sf_l1a, row0, k0, mad_m, mad_k, with_sf)``: l1a[row0:row0+mad_m, k0:k0+mad_k] (times
  2^(e-127), e = sf_l1a[row, k // 32], when with_sf) into the contiguous 1-D buffer l0a: fp32, or uint16 bf16 bits
  (the AMX path below; the values must be exact in bf16). ``load_l0b`` the same for B. Fast path: unit K stride
  in L1, mad_k a multiple of 8 (with scales also k0 % 8 == 0); else scalar.
- ``mmad(l0c, l0a, l0b, mad_m, mad_n, mad_k, init)``: l0c[:mad_m, :mad_n] (= if init, else +=) A @ B^T. fp32 L0:
  one fp32 FMA chain per element along K. Any mad_m works at full speed from 4 rows up, so the small-M "stream"
  path uses the same call (mad_m = 16 runs as 6 + 6 + 4-row tiles; each B panel chunk comes from memory once).
  bf16 L0: TDPBF16PS on the host's AMX unit, fp32 accumulation in 32-K steps (see "The AMX path").
The fp32 L0 layouts are private (only these functions read or write them):
- L0A: rows x K, [mad_m][mad_k] (a scaled copy; the micro-kernel broadcasts A from it).
- L0B: K-major panels of NR rows (16 on AVX2, the Cube fractal's width), [ceil(mad_n / NR)][mad_k][NR], rows past
  mad_n zero. Packing transposes 8 rows x 16 (or 8) K columns in registers.
NOTES: the micro-kernel is LLVM IR emitted by an ``@intrinsic``: MR x NR of L0C in MR * NR / LANES vector
accumulators updated with ``llvm.fma`` (AVX2: 6 x 16 in 12 ymm). Unlike numba's SLP vectorizer on scalar code
(which spilled the 6 x 16 tile), its code does not depend on vectorizer settings or fastmath flags.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from ..jit import amx
from ..jit.numba_setup import apply_numba_settings, host_cpu_features, vector_width_bits
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


def _make_microkernel(mr: int):
    """The Mmad micro-kernel for an mr x NR tile, as an intrinsic:
    ``uk(kc, pa, lda, pb, pc, ldc, init)``: C[i, 0:NR] (= 0 if init) += sum_k pa[i * lda + k] * pb[k * NR + 0:NR]
    for i < mr, with C[i, j] at pc[i * ldc + j]. Accumulators live in mr * NR / LANES vector registers through the
    whole K loop; each K step is NR / LANES vector loads of B, mr broadcasts of A and mr * NR / LANES FMAs."""
    nv = NR // LANES
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

        # Load (or zero) the C tile.
        c_ptrs, acc0 = [], []
        for i in range(mr):
            row = builder.mul(ldc, ir.Constant(intp, i))
            for v in range(nv):
                p = _vec_ptr(builder, pc, builder.add(row, ir.Constant(intp, LANES * v)), vty)
                c_ptrs.append(p)
                acc0.append(builder.select(init, zero, builder.load(p, align=4)))
        a_rows = [builder.gep(pa, [builder.mul(lda, ir.Constant(intp, i))]) for i in range(mr)]

        # K loop: accumulators are loop-carried phis (registers).
        pre = builder.block
        loop = builder.append_basic_block("mmad.k")
        done = builder.append_basic_block("mmad.k.done")
        builder.cbranch(builder.icmp_signed(">", kc, ir.Constant(intp, 0)), loop, done)
        builder.position_at_end(loop)
        k = builder.phi(intp)
        k.add_incoming(ir.Constant(intp, 0), pre)
        accs = []
        for x in acc0:
            phi = builder.phi(vty)
            phi.add_incoming(x, pre)
            accs.append(phi)
        b_off = builder.mul(k, ir.Constant(intp, NR))
        bs = [builder.load(_vec_ptr(builder, pb, builder.add(b_off, ir.Constant(intp, LANES * v)), vty), align=4)
              for v in range(nv)]
        new = []
        for i in range(mr):
            a = _splat(builder, builder.load(builder.gep(a_rows[i], [k]), align=4), vty)
            for v in range(nv):
                new.append(builder.call(fma, [a, bs[v], accs[i * nv + v]]))
        k_next = builder.add(k, ir.Constant(intp, 1))
        tail = builder.block
        k.add_incoming(k_next, tail)
        for phi, x in zip(accs, new, strict=True):
            phi.add_incoming(x, tail)
        builder.cbranch(builder.icmp_signed("<", k_next, kc), loop, done)

        # Store the C tile.
        builder.position_at_end(done)
        final = []
        for x0, x in zip(acc0, new, strict=True):
            phi = builder.phi(vty)
            phi.add_incoming(x0, pre)
            phi.add_incoming(x, tail)
            final.append(phi)
        for p, x in zip(c_ptrs, final, strict=True):
            builder.store(x, p, align=4)
        return context.get_dummy_value()

    def typer(typingctx, kc, pa, lda, pb, pc, ldc, init):
        if not all(isinstance(p, types.CPointer) and p.dtype == types.float32 for p in (pa, pb, pc)):
            return None
        return types.void(kc, pa, lda, pb, pc, ldc, init), codegen

    typer.__name__ = f"_microkernel_{mr}x{NR}"
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


@intrinsic
def _copy16_bf16(typingctx, dst, src, scale):
    """dst[0:16] = bf16(value(src[0:16]) * scale): one vector load, decode, multiply, 16-bit store."""

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
    """Codegen of one 32-K step of a B panel (see _vnni16x32): 16 row loads (decoded, scaled and cut to bf16, or,
    for unscaled BF16 bits, loaded as 16 dwords of bf16 pairs as they are), a 16 x 16 dword transpose in 4
    butterfly stages of 2-input shuffles, 16 stores."""

    def codegen(context, builder, signature, args):
        d, sp = args[0], args[1]
        ss = _as_intp(context, builder, args[2], signature.args[2])
        v16 = ir.VectorType(_I32, 16)
        raw = not scaled and signature.args[1].dtype == types.uint16
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
        # Butterfly transpose: the stage of width b swaps the off-diagonal b-blocks of rows i and i | b.
        for b in (8, 4, 2, 1):
            lo_idx = [lane if lane & b == 0 else 16 + lane - b for lane in range(16)]
            hi_idx = [lane + b if lane & b == 0 else 16 + lane for lane in range(16)]
            for i in range(16):
                if i & b == 0:
                    x, y = rows[i], rows[i | b]
                    rows[i], rows[i | b] = _shuffle(builder, x, y, lo_idx), _shuffle(builder, x, y, hi_idx)
        for p in range(16):
            builder.store(rows[p], _vec_ptr(builder, d, ir.Constant(_I64, 32 * p), v16), align=2)
        return context.get_dummy_value()

    return codegen


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


# ---------------------------------------------------------------------------------------------------------------
# The Cube contract
# NOTES: each public function checks its arguments, turns its arrays into pointers plus strides and calls one
# pointer-based core. The cores have a single signature whatever the layouts of the caller's views, so numba
# compiles (and caches) the heavy code once; each new layout combination only compiles a thin wrapper.
# ---------------------------------------------------------------------------------------------------------------


@njit(cache=True)
def l0a_size(mad_m, mad_k):
    """Elements of one L0A buffer for a mad_m x mad_k tile (Ascend L0A, 64 KiB on the chip): enough for the fp32
    layout and for the bf16 (AMX) layout's 16-row x 32-K padding."""
    return _round_up(mad_m, AMX_T) * _round_up(mad_k, AMX_K)


@njit(cache=True)
def l0b_size(mad_n, mad_k):
    """Elements of one L0B buffer for a mad_n x mad_k tile (Ascend L0B, 64 KiB): NR-row panels (fp32) or 16-row
    panels (bf16), K padded to 32."""
    return ((mad_n + NR - 1) // NR) * NR * _round_up(mad_k, AMX_K)


@njit(cache=True, inline="always")
def _check_load(l0, l1, sf_l1, row0, k0, rows, mad_k, with_sf, size):
    if row0 < 0 or k0 < 0 or rows < 0 or mad_k < 0:
        raise ValueError("cube load: negative row0, k0 or tile size")
    if row0 + rows > l1.shape[0] or k0 + mad_k > l1.shape[1]:
        raise ValueError("cube load: the tile exceeds the L1 buffer")
    if l0.size < size:
        raise ValueError("cube load: the L0 buffer is smaller than l0a_size / l0b_size")
    if l0.itemsize != 4 and l0.itemsize != 2:
        raise ValueError("cube load: the L0 buffer must be fp32 or uint16 (bf16 bits)")
    if l0.strides[0] != l0.itemsize:
        raise ValueError("cube load: the L0 buffer must be contiguous")
    if l0.itemsize == 2 and not AMX_SUPPORTED:
        raise ValueError("cube load: a bf16 (uint16) L0 buffer needs the AMX path, which this CPU or kernel lacks")
    if with_sf and rows > 0 and mad_k > 0:
        if row0 + rows > sf_l1.shape[0] or (k0 + mad_k - 1) // 32 >= sf_l1.shape[1]:
            raise ValueError("cube load: the tile exceeds the L1 scale-factor buffer")


@njit(cache=True)
def _sf_scale(psf, sf_rs, sf_cs, row, k, with_sf):
    """2^(e-127) of L1 row ``row``, K column ``k`` (1 without scales); e at psf[row * sf_rs + (k // 32) * sf_cs]."""
    if with_sf:
        return UE8M0_SCALES[psf[row * sf_rs + (k // 32) * sf_cs]]
    return np.float32(1.0)


@njit(cache=True)
def _load_a_core(pd, ps, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_m, mad_k, with_sf):
    """L0A[i * mad_k + kk] = L1[row0 + i, k0 + kk] * scale, L1 element (r, c) at ps[r * ld + c * cs]."""
    # NOTES: the 8-wide vector path needs unit K stride and, with scales, no 32-K block straddling 8 columns.
    kv = 0 if cs != 1 or (with_sf and k0 % 8 != 0) else mad_k - mad_k % 8
    # NOTES: 16 lanes at a time where a 16-chunk never straddles a 32-K scale block (k0 % 16 == 0), then 8
    kw = 0 if cs != 1 or k0 % 16 != 0 else mad_k - mad_k % 16
    for i in range(mad_m):
        row = row0 + i
        src = _ptr_add(ps, row * ld + k0 * cs)
        dst = _ptr_add(pd, i * mad_k)
        s = np.float32(1.0)
        for kk in range(0, kw, 16):
            if with_sf and (kk == 0 or (k0 + kk) % 32 == 0):
                s = _sf_scale(psf, sf_rs, sf_cs, row, k0 + kk, with_sf)
            _copy16_scaled(_ptr_add(dst, kk), _ptr_add(src, kk), s)
        for kk in range(kw, kv, 8):
            if with_sf and (kk == 0 or (k0 + kk) % 32 == 0):
                s = _sf_scale(psf, sf_rs, sf_cs, row, k0 + kk, with_sf)
            _copy8_scaled(_ptr_add(dst, kk), _ptr_add(src, kk), s)
        for kk in range(kv, mad_k):
            dst[kk] = _l1_to_f32(src[kk * cs]) * _sf_scale(psf, sf_rs, sf_cs, row, k0 + kk, with_sf)


@njit(cache=True, inline="always")
def _row_scales8(psf, r, sf_rs, sf_cs, k):
    """2^(e-127) of L1 rows r .. r + 7 at K column k (the 32-K block k // 32)."""
    e = _ptr_add(psf, r * sf_rs + (k // 32) * sf_cs)
    return (UE8M0_SCALES[e[0]], UE8M0_SCALES[e[sf_rs]], UE8M0_SCALES[e[2 * sf_rs]], UE8M0_SCALES[e[3 * sf_rs]],
            UE8M0_SCALES[e[4 * sf_rs]], UE8M0_SCALES[e[5 * sf_rs]], UE8M0_SCALES[e[6 * sf_rs]],
            UE8M0_SCALES[e[7 * sf_rs]])


@njit(cache=True)
def _load_b_core(pd, ps, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_n, mad_k, with_sf):
    """L0B panel p, K step kk, lane j = L1[row0 + p * NR + j, k0 + kk] * scale (0 past mad_n); strides as above."""
    kv = 0 if cs != 1 or (with_sf and k0 % 8 != 0) else mad_k - mad_k % 8
    kw = 0 if cs != 1 or k0 % 16 != 0 else mad_k - mad_k % 16
    num_panels = (mad_n + NR - 1) // NR
    for p in range(num_panels):
        panel = _ptr_add(pd, p * mad_k * NR)
        for g in range(0, NR, 8):
            r0 = p * NR + g  # first of these 8 rows, relative to row0
            k_scalar = 0
            if r0 + 8 <= mad_n:
                # 8 full rows: 8 x 8 in-register transposes, scales fetched once per 32-K block
                k_scalar = kv
                src = _ptr_add(ps, (row0 + r0) * ld + k0)
                dst = _ptr_add(panel, g)
                r = row0 + r0
                s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(1.0)
                # 16 K columns per transpose where a 16-chunk never straddles a 32-K scale block, then 8
                for kk in range(0, kw, 16):
                    if with_sf and (kk == 0 or (k0 + kk) % 32 == 0):
                        s0, s1, s2, s3, s4, s5, s6, s7 = _row_scales8(psf, r, sf_rs, sf_cs, k0 + kk)
                    _transpose8x16_scaled(
                        _ptr_add(dst, kk * NR), NR, _ptr_add(src, kk), ld, s0, s1, s2, s3, s4, s5, s6, s7
                    )
                for kk in range(kw, kv, 8):
                    if with_sf and (kk == 0 or (k0 + kk) % 32 == 0):
                        s0, s1, s2, s3, s4, s5, s6, s7 = _row_scales8(psf, r, sf_rs, sf_cs, k0 + kk)
                    _transpose8x8_scaled(
                        _ptr_add(dst, kk * NR), NR, _ptr_add(src, kk), ld, s0, s1, s2, s3, s4, s5, s6, s7
                    )
            # Scalar rest: the K tail, and rows past mad_n (zero padding of the last panel)
            for rr in range(8):
                row = r0 + rr
                for kk in range(k_scalar, mad_k):
                    v = np.float32(0.0)
                    if row < mad_n:
                        k = k0 + kk
                        v = _l1_to_f32(ps[(row0 + row) * ld + k * cs]) * _sf_scale(psf, sf_rs, sf_cs, row0 + row, k,
                                                                                   with_sf)
                    panel[kk * NR + g + rr] = v


@njit(cache=True)
def _load_a_bf16_core(pd, ps, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_m, mad_k, with_sf):
    """bf16 L0A: pd[i * kp + kk] = bf16(L1[row0 + i, k0 + kk] * scale), kp = round_up(mad_k, 32), K pad zero."""
    kp = _round_up(mad_k, AMX_K)
    kw = 0 if cs != 1 or k0 % 16 != 0 else mad_k - mad_k % 16
    for i in range(mad_m):
        row = row0 + i
        src = _ptr_add(ps, row * ld + k0 * cs)
        dst = _ptr_add(pd, i * kp)
        s = np.float32(1.0)
        for kk in range(0, kw, 16):
            if with_sf and (kk == 0 or (k0 + kk) % 32 == 0):
                s = _sf_scale(psf, sf_rs, sf_cs, row, k0 + kk, with_sf)
            _copy16_bf16(_ptr_add(dst, kk), _ptr_add(src, kk), s)
        for kk in range(kw, mad_k):
            dst[kk] = _to_bf16_bits(_l1_to_f32(src[kk * cs]) * _sf_scale(psf, sf_rs, sf_cs, row, k0 + kk, with_sf))
        for kk in range(mad_k, kp):
            dst[kk] = 0


@njit(cache=True)
def _load_b_bf16_core(pd, ps, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_n, mad_k, with_sf):
    """bf16 L0B: panel p, K pair q, lane j, half t at pd[p * kp * 16 + q * 32 + 2 * j + t] = bf16(L1[row0 + p * 16
    + j, k0 + 2 q + t] * scale), 0 past mad_n and past mad_k."""
    kp = _round_up(mad_k, AMX_K)
    # NOTES: whole 32-K steps of 16 rows go through the in-register transpose when each step sits in one scale block
    fast = cs == 1 and (not with_sf or k0 % 32 == 0)
    scales = np.empty(AMX_T, dtype=np.float32)
    psc = _data_ptr(scales)
    num_panels = (mad_n + AMX_T - 1) // AMX_T
    for p in range(num_panels):
        panel = _ptr_add(pd, p * kp * AMX_T)
        r0 = p * AMX_T
        kv = mad_k - mad_k % AMX_K if fast and r0 + AMX_T <= mad_n else 0
        for kk in range(0, kv, AMX_K):
            src = _ptr_add(ps, (row0 + r0) * ld + k0 + kk)
            if with_sf:
                for j in range(AMX_T):
                    scales[j] = _sf_scale(psf, sf_rs, sf_cs, row0 + r0 + j, k0 + kk, with_sf)
                _vnni16x32(_ptr_add(panel, kk * AMX_T), src, ld, psc)
            else:
                _vnni16x32_unscaled(_ptr_add(panel, kk * AMX_T), src, ld)
        for j in range(AMX_T):
            row = r0 + j
            for kk in range(kv, kp):
                v = np.uint16(0)
                if row < mad_n and kk < mad_k:
                    k = k0 + kk
                    v = _to_bf16_bits(_l1_to_f32(ps[(row0 + row) * ld + k * cs])
                                      * _sf_scale(psf, sf_rs, sf_cs, row0 + row, k, with_sf))
                panel[(kk // 2) * 2 * AMX_T + 2 * j + kk % 2] = v


@njit(cache=True)
def _mmad_amx_core(pc, ldc, csc, pa, pb, mad_m, mad_n, mad_k, init):
    """The Cube on the AMX unit: C element (i, j) at pc[i * ldc + j * csc]; A, B in the bf16 L0 layouts. Blocks of
    2 x 2 C tiles (32 x 32); a block that is partial (or a strided L0C) goes through a scratch tile so no element
    of L0C outside mad_m x mad_n is read or written."""
    kp = _round_up(mad_k, AMX_K)
    nk = kp // AMX_K
    _amx_load_config(_data_ptr(AMX_CONFIG))
    scratch = np.empty((2 * AMX_T, 2 * AMX_T), dtype=np.float32)
    psc = _data_ptr(scratch)
    for i0 in range(0, mad_m, 2 * AMX_T):
        rows = min(2 * AMX_T, mad_m - i0)
        tm = (rows + AMX_T - 1) // AMX_T
        pa_i = _ptr_add(pa, i0 * kp)
        for j0 in range(0, mad_n, 2 * AMX_T):
            cols = min(2 * AMX_T, mad_n - j0)
            tn = (cols + AMX_T - 1) // AMX_T
            pb_j = _ptr_add(pb, (j0 // AMX_T) * kp * AMX_T)
            if csc == 1 and rows == tm * AMX_T and cols == tn * AMX_T:
                _amx_block(tm, tn, nk, pa_i, kp, pb_j, kp * AMX_T, _ptr_add(pc, i0 * ldc + j0), ldc, init)
                continue
            if not init:
                for i in range(rows):
                    for j in range(cols):
                        scratch[i, j] = pc[(i0 + i) * ldc + (j0 + j) * csc]
            _amx_block(tm, tn, nk, pa_i, kp, pb_j, kp * AMX_T, psc, 2 * AMX_T, init)
            for i in range(rows):
                for j in range(cols):
                    pc[(i0 + i) * ldc + (j0 + j) * csc] = scratch[i, j]


@njit(cache=True, inline="always")
def _sf_args(sf_l1):
    """Pointer and element strides of the uint8 scale buffer."""
    return _data_ptr(sf_l1), sf_l1.strides[0], sf_l1.strides[1]


# NOTES: the L0 element type picks the path when numba types the call (an itemsize test would be a run-time one:
# numba keeps an array's itemsize in the array, so every kernel would compile and carry both paths).
def _load_a_path(l0a, pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_m, mad_k, with_sf):
    """L1 -> L0A on the path of l0a's element type: bf16 bits (AMX layout) or fp32 (numba-only)."""
    raise NotImplementedError("numba-only helper")


@overload(_load_a_path)
def _load_a_path_impl(l0a, pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_m, mad_k, with_sf):
    if l0a.dtype == types.uint16:
        def bf16(l0a, pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_m, mad_k, with_sf):
            _load_a_bf16_core(_ptr_as_u16(l0a), pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_m, mad_k, with_sf)
        return bf16

    def f32(l0a, pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_m, mad_k, with_sf):
        _load_a_core(_ptr_as_f32(l0a), pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_m, mad_k, with_sf)
    return f32


def _load_b_path(l0b, pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_n, mad_k, with_sf):
    """L1 -> L0B on the path of l0b's element type (numba-only)."""
    raise NotImplementedError("numba-only helper")


@overload(_load_b_path)
def _load_b_path_impl(l0b, pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_n, mad_k, with_sf):
    if l0b.dtype == types.uint16:
        def bf16(l0b, pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_n, mad_k, with_sf):
            _load_b_bf16_core(_ptr_as_u16(l0b), pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_n, mad_k, with_sf)
        return bf16

    def f32(l0b, pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_n, mad_k, with_sf):
        _load_b_core(_ptr_as_f32(l0b), pl1, ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_n, mad_k, with_sf)
    return f32


def _mmad_path(l0c, l0a, l0b, mad_m, mad_n, mad_k, init):
    """The Cube on the path of the L0 element type: AMX for bf16 bits, FMA for fp32 (numba-only)."""
    raise NotImplementedError("numba-only helper")


@overload(_mmad_path)
def _mmad_path_impl(l0c, l0a, l0b, mad_m, mad_n, mad_k, init):
    if l0a.dtype == types.uint16:
        def amx(l0c, l0a, l0b, mad_m, mad_n, mad_k, init):
            _mmad_amx_core(_data_ptr(l0c), l0c.strides[0] // 4, l0c.strides[1] // 4, _ptr_as_u16(l0a),
                           _ptr_as_u16(l0b), mad_m, mad_n, mad_k, init)
        return amx

    def fma(l0c, l0a, l0b, mad_m, mad_n, mad_k, init):
        _mmad_core(_data_ptr(l0c), l0c.strides[0] // 4, l0c.strides[1] // 4, _ptr_as_f32(l0a), _ptr_as_f32(l0b),
                   mad_m, mad_n, mad_k, init)
    return fma


@njit(cache=True)
def load_l0a(l0a, l1a, sf_l1a, row0, k0, mad_m, mad_k, with_sf):
    """LoadData L1 -> L0A (asc_copy_l12l0a; asc_copy_l12l0a_mx with scales).

    l0a: contiguous fp32 1-D [>= l0a_size(mad_m, mad_k)]; l1a: [block_m, block_k] (rows x K; any strides, unit
    K stride is the fast path) of fp32 values, or of codes decoded here: uint8 FP8 e4m3fn, uint16 BF16 bits;
    sf_l1a: uint8 UE8M0 exponents [block_m, block_k // 32] (read only when with_sf).
    Packs l1a[row0:row0+mad_m, k0:k0+mad_k] (rows x K), each value times 2^(e-127) of its 32-K block when with_sf
    (exact: a power of two).
    """
    _check_load(l0a, l1a, sf_l1a, row0, k0, mad_m, mad_k, with_sf, l0a_size(mad_m, mad_k))
    psf, sf_rs, sf_cs = _sf_args(sf_l1a)
    ld, cs = l1a.strides[0] // l1a.itemsize, l1a.strides[1] // l1a.itemsize
    _load_a_path(l0a, _data_ptr(l1a), ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_m, mad_k, with_sf)


@njit(cache=True)
def load_l0b(l0b, l1b, sf_l1b, row0, k0, mad_n, mad_k, with_sf):
    """LoadData L1 -> L0B (asc_copy_l12l0b; asc_copy_l12l0b_mx with scales).

    l0b: contiguous fp32 1-D [>= l0b_size(mad_n, mad_k)]; l1b: [block_n, block_k] (rows x K; fp32, uint8 FP8 or
    uint16 BF16 codes, as load_l0a); sf_l1b: uint8
    [block_n, block_k // 32] (read only when with_sf). Packs l1b[row0:row0+mad_n, k0:k0+mad_k], times 2^(e-127) per
    32-K block when with_sf, into K-major panels of NR rows (transposed 8 x 8 blocks at a time).
    """
    _check_load(l0b, l1b, sf_l1b, row0, k0, mad_n, mad_k, with_sf, l0b_size(mad_n, mad_k))
    psf, sf_rs, sf_cs = _sf_args(sf_l1b)
    ld, cs = l1b.strides[0] // l1b.itemsize, l1b.strides[1] // l1b.itemsize
    _load_b_path(l0b, _data_ptr(l1b), ld, cs, psf, sf_rs, sf_cs, row0, k0, mad_n, mad_k, with_sf)


@njit(cache=True)
def _mmad_core(pc, ldc, csc, pa, pb, mad_m, mad_n, mad_k, init):
    """The Cube on pointers: C element (i, j) at pc[i * ldc + j * csc]; A, B in the packed L0 layouts."""
    if csc != 1:
        # Column-strided L0C (not a layout the kernels use): plain loops, same K order (multiply, then add).
        for i in range(mad_m):
            for j in range(mad_n):
                b = _ptr_add(pb, (j // NR) * mad_k * NR + j % NR)
                acc = np.float32(0.0) if init else pc[i * ldc + j * csc]
                for kk in range(mad_k):
                    acc += pa[i * mad_k + kk] * b[kk * NR]
                pc[i * ldc + j * csc] = acc
        return
    full_panels = mad_n // NR
    for kc0 in range(0, mad_k, KC):
        kc = min(KC, mad_k - kc0)
        first = init and kc0 == 0
        for p in range(full_panels):
            pbp = _ptr_add(pb, p * mad_k * NR + kc0 * NR)
            i0 = 0
            while i0 < mad_m:
                mr = _row_tile(i0, mad_m)
                _microkernel(mr, kc, _ptr_add(pa, i0 * mad_k + kc0), mad_k, pbp, _ptr_add(pc, i0 * ldc + p * NR),
                             ldc, first)
                i0 += mr
        if mad_n % NR != 0:
            _mmad_partial_panel(pc, ldc, pa, pb, mad_m, mad_n, mad_k, kc0, kc, first)


@njit(cache=True)
def _mmad_partial_panel(pc, ldc, pa, pb, mad_m, mad_n, mad_k, kc0, kc, first):
    """The last, partial B panel (mad_n % NR != 0, only when NR > 16), through a scratch C tile so no column of
    L0C past mad_n is touched."""
    p = mad_n // NR
    cols = mad_n - p * NR
    scratch = np.zeros((MR, NR), dtype=np.float32)
    ps = _data_ptr(scratch)
    ld_scratch = scratch.shape[1]  # NOTES: NR as a runtime value; a literal argument would compile a second variant
    pbp = _ptr_add(pb, p * mad_k * NR + kc0 * NR)
    i0 = 0
    while i0 < mad_m:
        mr = _row_tile(i0, mad_m)
        for i in range(mr):
            for j in range(cols):
                scratch[i, j] = pc[(i0 + i) * ldc + p * NR + j]
        _microkernel(mr, kc, _ptr_add(pa, i0 * mad_k + kc0), mad_k, pbp, ps, ld_scratch, first)
        for i in range(mr):
            for j in range(cols):
                pc[(i0 + i) * ldc + p * NR + j] = scratch[i, j]
        i0 += mr


@njit(cache=True)
def mmad(l0c, l0a, l0b, mad_m, mad_n, mad_k, init):
    """Mmad (asc_mmad / asc_mmad_mx): the Cube. l0c[:mad_m, :mad_n] = (init) or += A @ B^T, fp32 accumulation.

    l0c: fp32 2-D [>= mad_m, >= mad_n] (any strides; a view is fine); l0a / l0b: contiguous buffers filled by
    load_l0a / load_l0b with the same mad sizes. Any mad_m >= 1 runs at full speed from 4 rows up (small-M / stream
    path included: each B panel chunk is read from memory once and from L1 by every row tile). fp32 L0: each C
    element is one fp32 FMA chain along K; bf16 (uint16) L0: TDPBF16PS over 32-K steps from k = 0 (the AMX path).
    Either way results do not depend on tiling, threads or core count. With init, L0C is written without being
    read.
    """
    if mad_m < 0 or mad_n < 0 or mad_k < 0:
        raise ValueError("mmad: negative tile size")
    if mad_m > l0c.shape[0] or mad_n > l0c.shape[1]:
        raise ValueError("mmad: L0C is smaller than mad_m x mad_n")
    if l0a.size < l0a_size(mad_m, mad_k) or l0b.size < l0b_size(mad_n, mad_k):
        raise ValueError("mmad: L0A / L0B smaller than l0a_size / l0b_size")
    if l0a.itemsize != l0b.itemsize or (l0a.itemsize != 4 and l0a.itemsize != 2):
        raise ValueError("mmad: L0A and L0B must both be fp32 or both uint16 (bf16 bits)")
    if l0a.strides[0] != l0a.itemsize or l0b.strides[0] != l0b.itemsize:
        raise ValueError("mmad: L0A / L0B must be contiguous")
    if l0a.itemsize == 2 and not AMX_SUPPORTED:
        raise ValueError("mmad: bf16 (uint16) L0 buffers need the AMX path, which this CPU or kernel lacks")
    if mad_m == 0 or mad_n == 0:
        return
    if mad_k == 0:
        if init:
            l0c[:mad_m, :mad_n] = 0.0
        return
    _mmad_path(l0c, l0a, l0b, mad_m, mad_n, mad_k, bool(init))
