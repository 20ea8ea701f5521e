"""C arithmetic that Python spells differently, callable from numba-compiled kernels and from plain Python.

``c_div``/``c_mod``: integer ``/`` and ``%`` truncate toward zero as in C (Python's ``//`` and ``%`` floor);
with a floating operand ``c_div`` is true division. The translator emits these only where it cannot prove both
operands non-negative (then it emits ``//`` and ``%``).
"""

from __future__ import annotations

import numbers

from numba import types
from numba.extending import intrinsic, overload

from .numba_setup import apply_numba_settings

apply_numba_settings()


def c_div(a, b):
    """C ``a / b``: truncating for two integers, true division otherwise."""
    if not (_is_int(a) and _is_int(b)):
        return a / b
    q = abs(int(a)) // abs(int(b))
    return q if (a < 0) == (b < 0) else -q


def c_mod(a, b):
    """C ``a % b`` for integers: the remainder has the sign of ``a``."""
    if not (_is_int(a) and _is_int(b)):
        raise TypeError(f"C % needs integer operands, got {a!r} % {b!r}")
    r = abs(int(a)) % abs(int(b))
    return r if a >= 0 else -r


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral)  # bool and numpy integers included


_INTEGRAL = (types.Integer, types.Boolean)  # C promotes bool to int


@overload(c_div)
def _c_div_impl(a, b):
    if isinstance(a, _INTEGRAL) and isinstance(b, _INTEGRAL):

        def impl(a, b):
            q = (a + 0) // (b + 0)  # + 0: bool -> int
            # NOTES: floor and truncation differ only when the division is inexact and the signs differ.
            if ((a < 0) != (b < 0)) and q * b != a:
                q += 1
            return q

        return impl
    if isinstance(a, (types.Number, types.Boolean)) and isinstance(b, (types.Number, types.Boolean)):

        def impl(a, b):
            return a / b

        return impl
    return None


@overload(c_mod)
def _c_mod_impl(a, b):
    if isinstance(a, _INTEGRAL) and isinstance(b, _INTEGRAL):

        def impl(a, b):
            return a - c_div(a, b) * b

        return impl
    return None


# -- Cooperative cancel --------------------------------------------------------------------------------------------
# NOTES: every kernel entry takes one hidden trailing argument, a uint8[1] cancel flag (CompiledKernel passes the
# current call's flag; deep_gemm.api.guard sets it on Ctrl-C). The translator checks it once per logical core and at
# the top of every persistent tile loop (a loop stepping by GetBlockNum()), so a long launch stops between tiles.
# The flag is written by another thread while the kernel runs, so it is read with an atomic (monotonic) load: a
# plain load could be hoisted out of the tile loop by LLVM.


def cancel_requested(flag) -> bool:
    """True once the launch's cancel flag (uint8[1]) is set."""
    return bool(flag[0])


@intrinsic
def _load_flag(typingctx, flag):
    if not (isinstance(flag, types.Array) and flag.dtype == types.uint8):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.load_atomic(data, "monotonic", 1)

    return types.uint8(flag), codegen


@overload(cancel_requested)
def _cancel_requested_impl(flag):
    if isinstance(flag, types.Array) and flag.dtype == types.uint8:

        def impl(flag):
            return _load_flag(flag) != 0

        return impl
    return None
