"""The device module of the fused mega MoE kernel (templates/mega_moe.asc.j2): every intrinsic of deep_gemm.device
plus what a kernel that talks to other ranks through the symmetric buffer needs.

- ``AtomicLoad(gm, index)`` / ``AtomicStore(gm, index, value)``: an acquire load / release store of one int64 GM
  element (the UB remote atomics' ordering: stores before a release store are seen by a rank whose acquire load
  sees it). A plain load in a spin loop could be hoisted out of the loop by LLVM; these never are.
- ``WaitAtLeast(gm, index, target, timeout_ns)``: spin (then sleep, 50 us doubling up to 2 ms) until the int64 at
  ``index`` is >= ``target``; 0 when it is, 1 once ``timeout_ns`` passed first (the kernel turns that into its error
  status: a rank barrier never hangs).
- ``ExpRow(dst, dst_off, src, src_off, count)``: dst[dst_off + i] = e^src[src_off + i] for fp32 GM rows, computed by
  numpy's own float32 exp (called back through numba's object mode): the unfused baseline's SwiGLU is numpy's, and
  the fused kernel is held to bitwise equality with it (libm's expf, device.Exp, differs from it by an ulp at
  times). The chip's AIV Exp is its own; this stand-in matches the baseline instead.
- ``F32Bits(x)`` / ``F32FromBits(u)``: the bit pattern of a float32 and back; ``Bf16ToF32(bits)``,
  ``F32ToBf16(x)`` (RNE, ml_dtypes' rounding), ``F32ToE4M3(x)`` (RNE, saturated to +-448): the AIV's casts.
- ``SleepNs(ns)``: a host sleep (tests make a rank late with it).
"""

from __future__ import annotations

import time

import numpy as np
from llvmlite import ir
from numba import njit, objmode, types
from numba.extending import intrinsic

from . import *  # noqa: F403 (the kernel calls the whole device module through this one)
from . import __all__ as _DEVICE_ALL
from ._bits import bits_to_f32, f32_to_bits
from .cast import f32_to_e4m3_sat
from .fixpipe import bf16_bits_to_f32, f32_to_bf16_bits

_I64 = ir.IntType(64)


def _element_ptr(context, builder, array_type, array, index):
    data = context.make_array(array_type)(context, builder, array).data
    return builder.gep(data, [index])


@intrinsic
def _load_acquire(typingctx, arr, index):
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64 and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        idx = context.cast(builder, args[1], signature.args[1], types.intp)
        return builder.load_atomic(_element_ptr(context, builder, signature.args[0], args[0], idx), "acquire", 8)

    return types.int64(arr, index), codegen


@intrinsic
def _store_release(typingctx, arr, index, value):
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64 and isinstance(index, types.Integer)
            and isinstance(value, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        idx = context.cast(builder, args[1], signature.args[1], types.intp)
        val = context.cast(builder, args[2], signature.args[2], types.int64)
        builder.store_atomic(val, _element_ptr(context, builder, signature.args[0], args[0], idx), "release", 8)
        return context.get_dummy_value()

    return types.void(arr, index, value), codegen


@njit(cache=True)
def AtomicLoad(gm, index):  # noqa: N802
    """Acquire load of the int64 ``gm[index]`` (bounds-checked)."""
    if index < 0 or index >= gm.size:
        raise IndexError("AtomicLoad: index out of the GM buffer")
    return _load_acquire(gm, index)


@njit(cache=True)
def AtomicStore(gm, index, value):  # noqa: N802
    """Release store of ``value`` into the int64 ``gm[index]`` (bounds-checked)."""
    if index < 0 or index >= gm.size:
        raise IndexError("AtomicStore: index out of the GM buffer")
    _store_release(gm, index, value)


@njit(cache=True)
def _monotonic_ns():
    with objmode(t="int64"):
        t = time.monotonic_ns()
    return t


@njit(cache=True)
def SleepNs(ns):  # noqa: N802
    """Sleep ``ns`` nanoseconds on the host (releases the CPU)."""
    with objmode():
        time.sleep(ns * 1e-9)


# NOTES: spins this many loads before the first sleep; a barrier every rank reaches together costs no sleep.
_SPINS = 2000
_SLEEP_NS = 50_000
_MAX_SLEEP_NS = 2_000_000


@njit(cache=True)
def WaitAtLeast(gm, index, target, timeout_ns):  # noqa: N802
    """0 once the int64 ``gm[index]`` (acquire loads) is >= ``target``; 1 when ``timeout_ns`` passes first."""
    for _ in range(_SPINS):
        if AtomicLoad(gm, index) >= target:
            return 0
    start = _monotonic_ns()
    nap = _SLEEP_NS
    while AtomicLoad(gm, index) < target:
        if _monotonic_ns() - start > timeout_ns:
            return 1
        SleepNs(nap)
        nap = min(nap * 2, _MAX_SLEEP_NS)
    return 0


@njit(cache=True)
def _exp_rows(dst, src):
    with objmode():
        np.exp(src, out=dst)


@njit(cache=True)
def ExpRow(dst, dst_off, src, src_off, count):  # noqa: N802
    """dst[dst_off : dst_off + count] = numpy's float32 exp of src[src_off : src_off + count] (fp32 GM)."""
    if count <= 0:
        return
    if dst_off < 0 or src_off < 0 or dst_off + count > dst.size or src_off + count > src.size:
        raise IndexError("ExpRow: range out of the GM buffer")
    _exp_rows(dst[dst_off:dst_off + count], src[src_off:src_off + count])


@njit(cache=True)
def F32Bits(x):  # noqa: N802
    """uint32 bit pattern of the float32 ``x``."""
    return f32_to_bits(np.float32(x))


@njit(cache=True)
def F32FromBits(u):  # noqa: N802
    """float32 whose bits are the low 32 bits of ``u``."""
    return bits_to_f32(u)


@njit(cache=True)
def Bf16ToF32(bits):  # noqa: N802
    """float32 value of bf16 bits (exact)."""
    return bf16_bits_to_f32(bits)


@njit(cache=True)
def F32ToBf16(x):  # noqa: N802
    """bf16 bits (uint16) of the float32 ``x``, round to nearest even."""
    return f32_to_bf16_bits(np.float32(x))


@njit(cache=True)
def F32ToE4M3(x):  # noqa: N802
    """FP8 e4m3fn code (uint8) of the float32 ``x``: RNE, saturated to +-448."""
    return f32_to_e4m3_sat(np.float32(x))


__all__ = list(_DEVICE_ALL) + ["AtomicLoad", "AtomicStore", "WaitAtLeast", "ExpRow", "F32Bits", "F32FromBits",
                               "Bf16ToF32", "F32ToBf16", "F32ToE4M3", "SleepNs"]
