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


# -- Core claiming -------------------------------------------------------------------------------------------------
# NOTES: every threads-launcher entry takes a second hidden trailing argument, the launch's int64[3] core counter
# (jit/launch.py: one per launch, zeros at the start): [0] the logical cores claimed, [1] the entry calls finished,
# [2] the entry calls started (claim_slot: each call's own slot, for per-thread state kept across launches).
# Each thread running the entry claims the next unclaimed core with an atomic add until all NUM_AI_CORES are taken,
# so a thread that starts late (a woken worker) takes only what is left and the caller never waits for it to start.
# A core's result never depends on which thread ran it (each core starts from its own state), so the claim order
# changes no bit of the output. The entry's last act is the atomic add to [1] (release order: its writes become
# visible first), which the caller watches while the GIL is still its own (jit/launch.py).


def claim_core(counter) -> int:
    """The launch's next unclaimed logical core: counter[0] before an atomic increment (past the last core once every
    core is claimed). The plain-Python forms here serve kernels run without numba (tests)."""
    core = int(counter[0])
    counter[0] = core + 1
    return core


def finish_part(counter) -> None:
    """Count one finished entry call of the launch: counter[1] += 1, atomically (the entry's last act)."""
    counter[1] += 1


def _is_counter(counter) -> bool:
    return isinstance(counter, types.Array) and counter.dtype == types.int64


def _atomic_increment(slot: int, ordering: str):
    """An intrinsic ``f(counter) -> int64``: counter[slot] += 1 as one atomic read-modify-write with ``ordering``,
    returning the value before it."""

    def impl(typingctx, counter):
        if not _is_counter(counter):
            return None

        def codegen(context, builder, signature, args):
            data = context.make_array(signature.args[0])(context, builder, args[0]).data
            ptr = builder.gep(data, [context.get_constant(types.intp, slot)])
            return builder.atomic_rmw("add", ptr, context.get_constant(types.int64, 1), ordering)

        return types.int64(counter), codegen

    return intrinsic(impl)


_claim_next = _atomic_increment(0, "monotonic")
_claim_slot = _atomic_increment(2, "monotonic")
_count_finished = _atomic_increment(1, "release")


def claim_slot(counter) -> int:
    """This entry call's slot of the launch (0, 1, ... in the order the calls start): counter[2] before an atomic
    increment; -1 for a counter without that element. Mixed kernels pick their thread's cross-core state by it."""
    if len(counter) < 3:
        return -1
    slot = int(counter[2])
    counter[2] = slot + 1
    return slot


@overload(claim_core)
def _claim_core_impl(counter):
    return (lambda counter: _claim_next(counter)) if _is_counter(counter) else None


@overload(finish_part)
def _finish_part_impl(counter):
    if not _is_counter(counter):
        return None

    def impl(counter):
        _count_finished(counter)

    return impl


@overload(claim_slot)
def _claim_slot_impl(counter):
    if not _is_counter(counter):
        return None

    def impl(counter):
        return _claim_slot(counter) if counter.shape[0] >= 3 else -1
    return impl
