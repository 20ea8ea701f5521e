"""Bit reinterpretation between uint32 and float32 inside Numba code (LLVM bitcasts; no memory round trip).

Used by the BF16 decode (bits << 16) and the Fixpipe rounding (fp32 -> bf16 bits); not exported to templates.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic


@intrinsic
def bits_to_f32(typingctx, x):
    """float32 whose bit pattern is the low 32 bits of the integer ``x``."""
    if not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        value = args[0]
        width = value.type.width
        if width > 32:
            value = builder.trunc(value, ir.IntType(32))
        elif width < 32:
            value = builder.zext(value, ir.IntType(32))
        return builder.bitcast(value, ir.FloatType())

    return types.float32(x), codegen


@intrinsic
def f32_to_bits(typingctx, x):
    """uint32 holding the bit pattern of the float32 ``x`` (a float64 argument is first rounded to float32)."""
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, signature, args):
        value = args[0]
        if isinstance(value.type, ir.DoubleType):
            value = builder.fptrunc(value, ir.FloatType())
        return builder.bitcast(value, ir.IntType(32))

    return types.uint32(x), codegen
