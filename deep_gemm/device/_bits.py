"""Bit reinterpretation between uint32 and float32 inside Numba code (LLVM bitcasts; no memory round trip).

Used by the decodes of BF16 (bits << 16), FP8 e4m3 and FP4 e2m1 codes (GM -> L1 copies and the L1 -> L0 loads that
decode codes held in L1) and the fp32 -> bf16 rounding (Fixpipe, Cast); not exported to templates.
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


@intrinsic
def round_bf16(typingctx, x):
    """bf16 bits (uint16) of the float32 ``x``, rounded to nearest even; NaN -> quiet NaN 0x7FC0 with x's sign
    (f32_to_bf16_bits' bits, without a branch). See emit_round_bf16."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        bits = emit_round_bf16(builder, builder.bitcast(args[0], ir.IntType(32)))
        return builder.trunc(bits, ir.IntType(16))

    return types.uint16(x), codegen


def _const(ty, value):
    """An LLVM constant of scalar or vector type ``ty`` (splat for vectors)."""
    if isinstance(ty, ir.VectorType):
        return ir.Constant(ty, [value] * ty.count)
    return ir.Constant(ty, value)


def emit_decode(builder, c, kind: str):
    """LLVM IR decoding ``c`` (i32 or a vector of i32 holding codes) to fp32 (or a float vector of c's width).

    kind: "bf16" (bits << 16), "e4m3" (FP8 e4m3fn, low 8 bits) or "e2m1" (FP4, low 4 bits). All in 32-bit integer
    lanes: numba's own integer typing widens to 64 bits, which halves the vector width of decode loops.
    NOTES: e4m3: (code & 0x7F) << 20 puts the exponent and mantissa in fp32's fields; adding 120 to the exponent
    turns bias 7 into fp32's 127. Subnormal codes (e = 0) are m * 2^-9, from an int -> float conversion, so no fp32
    subnormal is ever formed (they cost a microcode assist per vector on this CPU, which doubled the decode time).
    NaN codes 0x7F / 0xFF become a quiet NaN with the code's sign. e2m1 likewise: re-bias by 126, subnormal m * 0.5.
    """
    ity = c.type
    fty = ir.VectorType(ir.FloatType(), ity.count) if isinstance(ity, ir.VectorType) else ir.FloatType()

    def k(v):
        return _const(ity, v)

    if kind == "bf16":
        return builder.bitcast(builder.shl(c, k(16)), fty)
    if kind == "e4m3":
        low = builder.and_(c, k(0x7F))
        normal = builder.add(builder.shl(low, k(20)), k(120 << 23))
        sub = builder.fmul(builder.uitofp(builder.and_(c, k(0x7)), fty), _const(fty, 2.0**-9))
        bits = builder.select(builder.icmp_unsigned("<", low, k(0x08)), builder.bitcast(sub, ity), normal)
        bits = builder.select(builder.icmp_unsigned("==", low, k(0x7F)), k(0x7FC00000), bits)
        sign = builder.shl(builder.and_(c, k(0x80)), k(24))
    elif kind == "e2m1":
        low = builder.and_(c, k(0x7))
        normal = builder.add(builder.shl(low, k(22)), k(126 << 23))
        sub = builder.fmul(builder.uitofp(builder.and_(c, k(0x1)), fty), _const(fty, 0.5))
        bits = builder.select(builder.icmp_unsigned("<", low, k(0x2)), builder.bitcast(sub, ity), normal)
        sign = builder.shl(builder.and_(c, k(0x8)), k(28))
    else:
        raise ValueError(f"unknown code kind {kind!r}")
    return builder.bitcast(builder.or_(bits, sign), fty)


def emit_round_bf16(builder, bits):
    """LLVM IR rounding fp32 bit patterns (i32 or a vector of i32) to bf16 bits, kept in the low 16 bits of each
    32-bit lane: round to nearest even, NaN -> quiet NaN 0x7FC0 with the sign.

    NOTES: in 32-bit lanes: numba's integer typing widens uint32 arithmetic to 64 bits, which halved the vector
    width of the rounding loops (FixPipe's bf16 hand-off, Cast) and stored through 64 -> 16-bit truncations. No
    non-NaN pattern can carry out of 32 bits (-Inf, 0xFF800000, + 0x8000 < 2^32); NaN patterns take the select.
    """
    ity = bits.type

    def k(v):
        return _const(ity, v)

    lsb = builder.and_(builder.lshr(bits, k(16)), k(1))
    rounded = builder.lshr(builder.add(builder.add(bits, k(0x7FFF)), lsb), k(16))
    quiet = builder.or_(builder.and_(builder.lshr(bits, k(16)), k(0x8000)), k(0x7FC0))
    is_nan = builder.icmp_unsigned(">", builder.and_(bits, k(0x7FFFFFFF)), k(0x7F800000))
    return builder.select(is_nan, quiet, rounded)


def widen_to_i32(builder, x):
    """Zero-extend (or truncate) an integer or integer vector to 32-bit lanes."""
    i32 = ir.IntType(32)
    ty = ir.VectorType(i32, x.type.count) if isinstance(x.type, ir.VectorType) else i32
    width = (x.type.element if isinstance(x.type, ir.VectorType) else x.type).width
    if width < 32:
        return builder.zext(x, ty)
    if width > 32:
        return builder.trunc(x, ty)
    return x


def decode_codegen(kind: str):
    """numba intrinsic codegen decoding one integer code (see emit_decode)."""

    def codegen(context, builder, signature, args):
        return emit_decode(builder, widen_to_i32(builder, args[0]), kind)

    return codegen


@intrinsic
def decode_e4m3(typingctx, code):
    """fp32 value of one FP8 e4m3fn code (integer, low 8 bits): exact; NaN codes -> quiet NaN with the code's sign."""
    if not isinstance(code, types.Integer):
        return None
    return types.float32(code), decode_codegen("e4m3")


@intrinsic
def decode_e2m1(typingctx, nibble):
    """fp32 value of one FP4 e2m1 code (the low 4 bits of the integer ``nibble``): exact."""
    if not isinstance(nibble, types.Integer):
        return None
    return types.float32(nibble), decode_codegen("e2m1")


@intrinsic
def decode_bf16(typingctx, bits):
    """fp32 value of bf16 bits (integer, low 16 bits): exact widening (bits << 16)."""
    if not isinstance(bits, types.Integer):
        return None
    return types.float32(bits), decode_codegen("bf16")
