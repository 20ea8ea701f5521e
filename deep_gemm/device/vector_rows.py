"""The Vector unit's fp32 row loops as explicit SIMD (device/vector.py calls them): elementwise add / sub / mul / div
of a row (tensor op tensor, tensor op scalar) and the row sums of a tile, emitted as LLVM IR.

Per element the arithmetic is the scalar loop's, one IEEE operation in the same order, so results are bitwise those
of the plain loops (NaN payloads included: a vector lane follows the scalar instruction's rules).
NOTES: numba's loops over a UB row vectorise too, but each row pays LLVM's run-time overlap checks and a scalar
epilogue; with the short rows of the kernels' tiles (64 fp32) that was most of an instruction's time: a 64 x 64 Mul
over a strided view 395 -> 291 ns, a 16 x 64 one 138 -> 68 ns. The overlap checks move to the caller, once per
instruction (vector.py: exactly in place, or not overlapping at all; anything else keeps the plain loops).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..jit.numba_setup import apply_numba_settings
from .cube_fma import LANES, _as_intp, _shuffle, _splat, _vec_ptr

# NOTES: must run before anything here can compile (numba reads it when building its CPU target).
apply_numba_settings()

_F32 = ir.FloatType()
_I32 = ir.IntType(32)
_VF = ir.VectorType(_F32, LANES)
_VI = ir.VectorType(_I32, LANES)
OPS = ("fadd", "fsub", "fmul", "fdiv")


def _masked(builder, name, fnty):
    return cgutils.get_or_insert_function(builder.module, fnty, f"llvm.masked.{name}.v{LANES}f32.p0")


def _lane_mask(builder, count):
    """<LANES x i1>: the first ``count`` (an intp in 0 .. LANES) lanes on."""
    iota = ir.Constant(_VI, list(range(LANES)))
    return builder.icmp_unsigned("<", iota, _splat(builder, builder.trunc(count, _I32), _VI))


def _row_codegen(op: str, scalar: bool):
    """pd[j] = pa[j] op pb[j] (or op the scalar) for j < n: whole vectors, then one masked vector for the rest."""

    def codegen(context, builder, signature, args):
        pd, pa, other = args[0], args[1], args[2]
        n = _as_intp(context, builder, args[3], signature.args[3])
        intp = n.type
        zero = ir.Constant(intp, 0)
        full = builder.and_(n, ir.Constant(intp, ~(LANES - 1)))
        b_vec = _splat(builder, other, _VF) if scalar else None

        def apply(x, y):
            return getattr(builder, op)(x, y)

        pre = builder.block
        loop = builder.append_basic_block("row.vec")
        tail = builder.append_basic_block("row.tail")
        builder.cbranch(builder.icmp_signed(">", full, zero), loop, tail)
        builder.position_at_end(loop)
        j = builder.phi(intp)
        j.add_incoming(zero, pre)
        x = builder.load(_vec_ptr(builder, pa, j, _VF), align=4)
        y = b_vec if scalar else builder.load(_vec_ptr(builder, other, j, _VF), align=4)
        builder.store(apply(x, y), _vec_ptr(builder, pd, j, _VF), align=4)
        j_next = builder.add(j, ir.Constant(intp, LANES))
        j.add_incoming(j_next, builder.block)
        builder.cbranch(builder.icmp_signed("<", j_next, full), loop, tail)

        builder.position_at_end(tail)
        rest = builder.sub(n, full)
        with builder.if_then(builder.icmp_signed(">", rest, zero)):
            mask = _lane_mask(builder, rest)
            load = _masked(builder, "load", ir.FunctionType(_VF, [_VF.as_pointer(), _I32, mask.type, _VF]))
            store = _masked(builder, "store", ir.FunctionType(ir.VoidType(), [_VF, _VF.as_pointer(), _I32, mask.type]))
            align, undef = ir.Constant(_I32, 4), ir.Constant(_VF, None)
            x = builder.call(load, [_vec_ptr(builder, pa, full, _VF), align, mask, undef])
            y = b_vec if scalar else builder.call(load, [_vec_ptr(builder, other, full, _VF), align, mask, undef])
            builder.call(store, [apply(x, y), _vec_ptr(builder, pd, full, _VF), align, mask])
        return context.get_dummy_value()

    return codegen


def _is_f32_ptr(p) -> bool:
    return isinstance(p, types.CPointer) and p.dtype == types.float32


def _make_row2(op: str):
    def typer(typingctx, pd, pa, pb, n):
        if _is_f32_ptr(pd) and _is_f32_ptr(pa) and _is_f32_ptr(pb) and isinstance(n, types.Integer):
            return types.void(pd, pa, pb, n), _row_codegen(op, False)
        return None

    typer.__name__ = f"row2_{op}"
    return intrinsic(typer)


def _make_row1(op: str):
    def typer(typingctx, pd, pa, value, n):
        if _is_f32_ptr(pd) and _is_f32_ptr(pa) and value == types.float32 and isinstance(n, types.Integer):
            return types.void(pd, pa, value, n), _row_codegen(op, True)
        return None

    typer.__name__ = f"row1_{op}"
    return intrinsic(typer)


# row2_<op>(pd, pa, pb, n): pd[j] = pa[j] <op> pb[j]; row1_<op>(pd, pa, value, n): pd[j] = pa[j] <op> value (fp32)
row2_fadd, row2_fsub, row2_fmul, row2_fdiv = (_make_row2(op) for op in OPS)
row1_fadd, row1_fmul = _make_row1("fadd"), _make_row1("fmul")


def _transpose(builder, rows):
    """LANES vectors (rows) -> LANES vectors (columns): butterfly stages of 2-input shuffles."""
    rows = list(rows)
    b = LANES // 2
    while b:
        lo_idx = [lane if lane & b == 0 else LANES + lane - b for lane in range(LANES)]
        hi_idx = [lane + b if lane & b == 0 else LANES + lane for lane in range(LANES)]
        for i in range(LANES):
            if i & b == 0:
                x, y = rows[i], rows[i | b]
                rows[i], rows[i | b] = _shuffle(builder, x, y, lo_idx), _shuffle(builder, x, y, hi_idx)
        b //= 2
    return rows


@intrinsic
def row_sums_f32(typingctx, pd, ps, ld, cols):
    """pd[i] = ps[i * ld + 0] + ps[i * ld + 1] + ... + ps[i * ld + vcols - 1] for LANES rows i, where vcols =
    cols rounded down to a multiple of LANES (>= LANES), added in index order: LANES x LANES blocks transposed in
    registers, so lane i adds row i's columns one after another (the scalar loop's order and roundings)."""
    if not (_is_f32_ptr(pd) and _is_f32_ptr(ps) and isinstance(ld, types.Integer)
            and isinstance(cols, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        pd, ps = args[0], args[1]
        ld = _as_intp(context, builder, args[2], signature.args[2])
        cols = _as_intp(context, builder, args[3], signature.args[3])
        intp = ld.type
        vcols = builder.and_(cols, ir.Constant(intp, ~(LANES - 1)))
        offsets = [builder.mul(ld, ir.Constant(intp, r)) for r in range(LANES)]

        def block_columns(c0):
            return _transpose(builder, [builder.load(_vec_ptr(builder, ps, builder.add(off, c0), _VF), align=4)
                                        for off in offsets])

        first = block_columns(ir.Constant(intp, 0))
        acc = first[0]
        for v in first[1:]:
            acc = builder.fadd(acc, v)
        pre = builder.block
        loop = builder.append_basic_block("sums.block")
        done = builder.append_basic_block("sums.done")
        step = ir.Constant(intp, LANES)
        builder.cbranch(builder.icmp_signed("<", step, vcols), loop, done)
        builder.position_at_end(loop)
        c0 = builder.phi(intp)
        c0.add_incoming(step, pre)
        acc_phi = builder.phi(_VF)
        acc_phi.add_incoming(acc, pre)
        running = acc_phi
        for v in block_columns(c0):
            running = builder.fadd(running, v)
        c_next = builder.add(c0, step)
        last = builder.block
        c0.add_incoming(c_next, last)
        acc_phi.add_incoming(running, last)
        builder.cbranch(builder.icmp_signed("<", c_next, vcols), loop, done)
        builder.position_at_end(done)
        out = builder.phi(_VF)
        out.add_incoming(acc, pre)
        out.add_incoming(running, last)
        builder.store(out, _vec_ptr(builder, pd, ir.Constant(intp, 0), _VF), align=4)
        return context.get_dummy_value()

    return types.void(pd, ps, ld, cols), codegen
