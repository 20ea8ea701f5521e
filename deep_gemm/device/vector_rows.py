"""The Vector unit's fp32 row sums, and sums of squares, as explicit SIMD (device/vector.py's ReduceSum AR and
cast.py's CastReduceSumSquares call them), emitted as LLVM IR: LANES rows at a time, each LANES x LANES block
transposed in registers, so lane i adds row i's columns one after another: the element loop's additions in its order
(bitwise its result; which NaN an addition of two NaNs passes on is the compiler's choice either way). A 64 x 64
strided tile: 743 -> ~200 ns.

NOTES: explicit SIMD for the elementwise instructions (Add, Mul, ...) was tried too: a 64 x 64 strided Mul 395 ->
~290 ns, but picking it per instruction needs the element function at compile time (an inlined overload), which made
a mixed kernel's cold compile ~2.5 s longer (HC pre-norm 18.1 -> 21.1 s) for ~5% of an HC call; not kept.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..jit.numba_setup import apply_numba_settings
from .cube_fma import LANES, _as_intp, _transpose_square, _vec_ptr

# NOTES: must run before anything here can compile (numba reads it when building its CPU target).
apply_numba_settings()

_F32 = ir.FloatType()
_VF = ir.VectorType(_F32, LANES)


def _is_f32_ptr(p) -> bool:
    return isinstance(p, types.CPointer) and p.dtype == types.float32


def _row_sums(name: str, square: bool, doc: str):
    """An intrinsic ``name(pd, ps, ld, cols)``: LANES rows' sums of their first vcols elements (squared first, one
    rounding each, when ``square``)."""

    def row_sums(typingctx, pd, ps, ld, cols):
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

            def load(off):
                v = builder.load(_vec_ptr(builder, ps, off, _VF), align=4)
                return builder.fmul(v, v) if square else v  # no fast-math flags: rounded, never fused with the add

            def block_columns(c0):
                return _transpose_square(builder, [load(builder.add(off, c0)) for off in offsets])

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

    row_sums.__name__ = row_sums.__qualname__ = name
    row_sums.__doc__ = doc
    return intrinsic(row_sums)


row_sums_f32 = _row_sums("row_sums_f32", False, """pd[i] = ps[i * ld + 0] + ... + ps[i * ld + vcols - 1] for LANES
    rows i, where vcols = cols rounded down to a multiple of LANES (>= LANES), added in index order: LANES x
    LANES blocks transposed in registers, so lane i adds row i's columns one after another (the scalar loop's order
    and roundings).""")

row_square_sums_f32 = _row_sums("row_square_sums_f32", True, """As row_sums_f32 with each element squared first (one
    fp32 rounding, then the addition's): pd[i] = ps[i * ld]^2 + ps[i * ld + 1]^2 + ... in index order.""")
