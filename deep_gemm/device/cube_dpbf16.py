"""The Cube's AVX512-BF16 path (device/cube.py calls it): Mmad on the AMX path's bf16 L0 layouts (so the L0 loads,
their FP8 -> bf16 decode and the subnormal fallback are shared) with a register-blocked VDPBF16PS micro-kernel
into fp32 L0C, emitted only where the host's LLVM may select AVX512-BF16 instructions.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..jit import cpu_features
from ..jit.numba_setup import apply_numba_settings
from .cube_amx import AMX_K, AMX_T, _round_up
from .cube_fma import MR, _as_intp, _data_ptr, _ptr_add, _register_loop, _row_tile, _splat, _vec_ptr

# NOTES: must run before the first @njit below can compile (numba reads it when building its CPU target).
apply_numba_settings()

# ---------------------------------------------------------------------------------------------------------------
# The AVX512-BF16 path. NOTES: L0A / L0B are the AMX path's (cube_amx.py): A rows of round_up(mad_k, 32) bf16, so
# a K pair of row i is one dword; B in 16-row panels of K pairs, [panel][k // 2][16][2], so a K pair of a panel is
# one 64-byte vector of 16 dword pairs. One VDPBF16PS adds, in each of 16 fp32 lanes (C columns), the products of
# a broadcast A pair and a B panel pair: lane j += a[2q + 1] * b[j, 2q + 1], then += a[2q] * b[j, 2q] (products
# exact, each addition rounded to nearest even; input and output subnormals read and written as zero, as on the
# AMX unit). The micro-kernel keeps an mr x 32 C block (mr <= MR = 8 rows, 2 panels) in 2 mr zmm accumulators
# through its K loop: per K pair 2 B vector loads, mr broadcast A dwords, 2 mr VDPBF16PS. Each C element's sum
# runs over the K pairs in order from k = 0 (zero K padding adds +0), so results depend on the K order only, not
# on tiling, K chunks, threads or core count.
# ---------------------------------------------------------------------------------------------------------------
DP_COLS = 2 * AMX_T  # C columns of one micro-tile: two 16-row B panels
# NOTES: the K loop runs in chunks of DP_KC K (128 pairs): the 2-panel B chunk (16 KiB) stays in L1 while every
# row tile of A streams past it. Chunks store and reload C exactly (fp32), so they do not change any result.
DP_KC = 256
DPBF16_SUPPORTED = cpu_features.dpbf16_supported()
_F32 = ir.FloatType()
_I1 = ir.IntType(1)
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_V16F = ir.VectorType(_F32, 16)
_V16I = ir.VectorType(_I32, 16)
_M16 = ir.VectorType(_I1, 16)


class _BFloat(ir.Type):
    """LLVM's bfloat (llvmlite's IR builder has no bf16 type): the operand type of the VDPBF16PS intrinsic."""

    def _to_string(self):
        return "bfloat"

    def __eq__(self, other):
        return isinstance(other, _BFloat)

    def __hash__(self):
        return hash("bfloat")


_V32BF = ir.VectorType(_BFloat(), 32)


def _dpbf16(builder, acc, a, b):
    """acc (<16 x float>) + the pair products of a and b (<16 x i32>, bf16 pairs): one VDPBF16PS."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16F, [_V16F, _V32BF, _V32BF]),
                                        "llvm.x86.avx512bf16.dpbf16ps.512")
    return builder.call(fn, [acc, builder.bitcast(a, _V32BF), builder.bitcast(b, _V32BF)])


def _mangled(vty) -> str:
    return f"v16{'f32' if vty == _V16F else 'i32'}.p0"


def _masked_load(builder, ptr, mask, vty):
    """A 16-lane vector (vty) from ptr; lanes off in mask are zero and not read."""
    fnty = ir.FunctionType(vty, [vty.as_pointer(), _I32, _M16, vty])
    fn = cgutils.get_or_insert_function(builder.module, fnty, f"llvm.masked.load.{_mangled(vty)}")
    return builder.call(fn, [ptr, ir.Constant(_I32, 4), mask, ir.Constant(vty, None)])


def _masked_store(builder, value, ptr, mask):
    """value's lanes on in mask to ptr (the others not written)."""
    vty = value.type
    fnty = ir.FunctionType(ir.VoidType(), [vty, vty.as_pointer(), _I32, _M16])
    fn = cgutils.get_or_insert_function(builder.module, fnty, f"llvm.masked.store.{_mangled(vty)}")
    builder.call(fn, [value, ptr, ir.Constant(_I32, 4), mask])


def _lane_mask(builder, n):
    """<16 x i1> with the first clamp(n, 0, 16) lanes on (n: an intp)."""
    intp = n.type
    zero, full = ir.Constant(intp, 0), ir.Constant(intp, 16)
    n = builder.select(builder.icmp_signed("<", n, zero), zero, builder.select(builder.icmp_signed(">", n, full),
                                                                               full, n))
    bits = builder.sub(builder.shl(ir.Constant(intp, 1), n), ir.Constant(intp, 1))
    return builder.bitcast(builder.trunc(bits, _I16), _M16)


def _make_dp_kernel(mr: int):
    """The AVX512-BF16 micro-kernel of an mr x 32 C block, as an intrinsic:
    ``uk(npairs, pa, lda, pb, ldb, pc, ldc, cols, init)``: for rows i < mr and columns j < cols (1 <= cols <= 32),
    C[i, j] (= 0 if init) += sum over K pairs q < npairs of the pair products of A row i (pa + i * lda, bf16) and B
    column j (panel j // 16 at pb + (j // 16) * ldb, pair q at 32 q, lane j % 16), C[i, j] at pc[i * ldc + j].
    Columns past cols are neither read nor written, in C or in B (masked loads)."""

    def codegen(context, builder, signature, args):
        intp = context.get_value_type(types.intp)
        const = lambda v: ir.Constant(intp, v)  # noqa: E731
        npairs = _as_intp(context, builder, args[0], signature.args[0])
        lda = _as_intp(context, builder, args[2], signature.args[2])
        ldb = _as_intp(context, builder, args[4], signature.args[4])
        ldc = _as_intp(context, builder, args[6], signature.args[6])
        cols = _as_intp(context, builder, args[7], signature.args[7])
        init = context.cast(builder, args[8], signature.args[8], types.boolean)
        pa, pb, pc = args[1], args[3], args[5]
        masks = [_lane_mask(builder, cols), _lane_mask(builder, builder.sub(cols, const(16)))]
        zero = ir.Constant(_V16F, None)
        # NOTES: with cols <= 16 the second panel and C's second vector are wholly masked off, and their addresses
        # may lie past the end of L0B / L0C (an odd panel count, the last C row): an AVX-512 masked access whose
        # masked-off lanes reach memory that is not mapped takes a slow assist on every access (seen: a 16 x 16-block
        # FP8 GEMM's worker thread, whose buffers sat at the end of its malloc arena, ran 15x slower than the main
        # thread). They then point at the first panel and vector instead: the same lanes stay off, nothing changes.
        second = builder.icmp_signed(">", cols, const(16))
        step_c = builder.select(second, const(16), const(0))
        step_b = builder.select(second, ldb, const(0))

        # Load (or zero) the C block.
        c_ptrs, acc0 = [], []
        for i in range(mr):
            row = builder.mul(ldc, const(i))
            for v in range(2):
                p = _vec_ptr(builder, pc, builder.add(row, step_c) if v else row, _V16F)
                c_ptrs.append(p)
                acc0.append(builder.select(init, zero, _masked_load(builder, p, masks[v], _V16F)))
        a_rows = [builder.bitcast(builder.gep(pa, [builder.mul(lda, const(i))]), _I32.as_pointer()) for i in range(mr)]
        b_panels = [builder.bitcast(builder.gep(pb, [step_b if v else const(0)]), _V16I.as_pointer())
                    for v in range(2)]

        # K loop over pairs: accumulators are loop-carried phis (registers).
        def pair_step(q, accs):
            bs = [_masked_load(builder, builder.gep(b_panels[v], [q]), masks[v], _V16I) for v in range(2)]
            new = []
            for i in range(mr):
                a = _splat(builder, builder.load(builder.gep(a_rows[i], [q]), align=2), _V16I)
                for v in range(2):
                    new.append(_dpbf16(builder, accs[2 * i + v], a, bs[v]))
            return new

        final = _register_loop(builder, npairs, acc0, "dpbf16.k", pair_step)

        # Store the C block.
        for n, (p, x) in enumerate(zip(c_ptrs, final, strict=True)):
            _masked_store(builder, x, p, masks[n % 2])
        return context.get_dummy_value()

    def typer(typingctx, npairs, pa, lda, pb, ldb, pc, ldc, cols, init):
        if not (isinstance(pa, types.CPointer) and pa.dtype == types.uint16 and isinstance(pb, types.CPointer)
                and pb.dtype == types.uint16 and isinstance(pc, types.CPointer) and pc.dtype == types.float32):
            return None
        return types.void(npairs, pa, lda, pb, ldb, pc, ldc, cols, init), codegen

    typer.__name__ = f"_dp_kernel_{mr}x{DP_COLS}"
    return intrinsic(typer)


_dp1 = _make_dp_kernel(1)
_dp2 = _make_dp_kernel(2)
_dp3 = _make_dp_kernel(3)
_dp4 = _make_dp_kernel(4)
_dp5 = _make_dp_kernel(5)
_dp6 = _make_dp_kernel(6)
# NOTES: as in cube_fma: 7- and 8-row kernels exist only where MR = 8; elsewhere the names alias the 6-row one.
_dp7 = _make_dp_kernel(7) if MR >= 7 else _dp6
_dp8 = _make_dp_kernel(8) if MR >= 8 else _dp6


@njit(cache=True)
def _dp_kernel(mr, npairs, pa, lda, pb, ldb, pc, ldc, cols, init):
    """Dispatch an mr-row block (1 <= mr <= MR) to its AVX512-BF16 micro-kernel."""
    if mr == 8:
        _dp8(npairs, pa, lda, pb, ldb, pc, ldc, cols, init)
    elif mr == 6:
        _dp6(npairs, pa, lda, pb, ldb, pc, ldc, cols, init)
    elif mr == 7:
        _dp7(npairs, pa, lda, pb, ldb, pc, ldc, cols, init)
    elif mr == 4:
        _dp4(npairs, pa, lda, pb, ldb, pc, ldc, cols, init)
    elif mr == 5:
        _dp5(npairs, pa, lda, pb, ldb, pc, ldc, cols, init)
    elif mr == 3:
        _dp3(npairs, pa, lda, pb, ldb, pc, ldc, cols, init)
    elif mr == 2:
        _dp2(npairs, pa, lda, pb, ldb, pc, ldc, cols, init)
    else:
        _dp1(npairs, pa, lda, pb, ldb, pc, ldc, cols, init)


@njit(cache=True)
def _mmad_dpbf16_core(pc, ldc, csc, pa, pb, mad_m, mad_n, mad_k, init):
    """The Cube on AVX512-BF16: C element (i, j) at pc[i * ldc + j * csc]; A, B in the bf16 L0 layouts (row stride
    kp = round_up(mad_k, 32) bf16, panel stride 16 kp). K in chunks of DP_KC; per chunk, 32-column groups of C
    (two B panels) outermost, row tiles inside. A column-strided L0C goes through a scratch block, so no element
    of L0C outside mad_m x mad_n is read or written."""
    kp = _round_up(mad_k, AMX_K)
    # NOTES: one call of the micro-kernel dispatch (its 8 row variants are most of this function's code: a second
    # call site, for the scratch block, would double what numba optimizes and LLVM emits here and in every caller);
    # the block's C pointer and row stride pick L0C itself or the scratch block. The scratch block is made only for
    # a column-strided L0C (not a layout the kernels use).
    strided = csc != 1
    scratch = np.empty((MR if strided else 1, DP_COLS), dtype=np.float32)
    psc = _data_ptr(scratch)
    for kc0 in range(0, kp, DP_KC):
        npairs = min(DP_KC, kp - kc0) // 2
        first = init and kc0 == 0
        for j0 in range(0, mad_n, DP_COLS):
            cols = min(DP_COLS, mad_n - j0)
            pb_j = _ptr_add(pb, (j0 // AMX_T) * kp * AMX_T + kc0 * AMX_T)
            i0 = 0
            while i0 < mad_m:
                mr = _row_tile(i0, mad_m)
                pa_i = _ptr_add(pa, i0 * kp + kc0)
                pc_blk, ld_blk = _ptr_add(pc, i0 * ldc + j0), ldc
                if strided:
                    pc_blk, ld_blk = psc, DP_COLS
                    if not first:
                        for i in range(mr):
                            for j in range(cols):
                                scratch[i, j] = pc[(i0 + i) * ldc + (j0 + j) * csc]
                _dp_kernel(mr, npairs, pa_i, kp, pb_j, kp * AMX_T, pc_blk, ld_blk, cols, first)
                if strided:
                    for i in range(mr):
                        for j in range(cols):
                            pc[(i0 + i) * ldc + (j0 + j) * csc] = scratch[i, j]
                i0 += mr
