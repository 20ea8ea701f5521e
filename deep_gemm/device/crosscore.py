"""Cross-core synchronisation of a mixed (Cube + Vector) AI core: the flag counters behind ``CrossCoreSetFlag`` /
``CrossCoreWaitFlag``, the shared Unified Buffers of the two AIVs, and the error raised when a wait can never return.

These are not template-callable: the translator emits calls to them (with the sub-core index and the template line)
when it translates a mixed kernel. How a mixed kernel runs on the CPU: each logical AI core is three sub-cores, the
AIC (sub 0) and AIV0 / AIV1 (subs 1, 2), each a numba generator running the kernel body; a CrossCoreWaitFlag whose
flag is not set yields to the core's scheduler, which resumes the sub-cores round-robin on one CPU thread. A round
in which every live sub-core is waiting and no flag was set is a deadlock: the scheduler raises KernelDeadlockError.

Flag semantics (flag ids 0..15 per receiving sub-core, counting sets; a wait consumes one):
  mode 2 (AIC <-> AIVs of one core): a set by the AIC counts for each AIV; a set by an AIV counts for the AIC, and
         the AIC's wait returns once *both* AIVs have set (it consumes one set of each), as on the chip.
  mode 1 (AIV <-> AIV of one core): a set by one AIV counts for the other.
  mode 0 (all cores of one kind, across AI cores) is not supported: use SyncAll(), which splits the kernel.
"""

from __future__ import annotations

import sys

import numpy as np
from numba import carray, njit, types
from numba.extending import intrinsic, overload

from ..jit.numba_setup import apply_numba_settings
from .vector import _itemsize

# NOTES: must run before the first @njit below can compile (numba reads it when building its CPU target).
apply_numba_settings()

NUM_CROSS_FLAG_IDS = 16  # intra-block events of the 950 (deepgemm_ascend_api.md section 7)
NUM_SUB_CORES = 3  # AIC, AIV0, AIV1
SUB_CORE_NAMES = ("AIC", "AIV0", "AIV1")
MODE_AIV_PAIR = 1
MODE_AIC_AIV = 2
DEFAULT_UB_BYTES = 253952  # 248 KiB usable per AIV on the 950 (CANN INI ub_size)
UB_ALIGN = 32

# info layout: [0] number of sets so far (the scheduler's progress counter), then per sub-core (flag id, line) of the
# wait it is blocked in, then per AIV the byte range [lo, hi) of its UB that UBTensor views have addressed since the
# core started (lo >= hi: none; reset_cross_state zeroes only that range).
INFO_UB_RANGE = 1 + 2 * NUM_SUB_CORES
INFO_SIZE = INFO_UB_RANGE + 2 * 2


def template_location(module_name: str, line: int) -> str | None:
    """"<template file>:<line>" of kernel.asc line ``line`` of a generated kernel module (its _DG_WHERE table)."""
    module = sys.modules.get(module_name)
    return getattr(module, "_DG_WHERE", {}).get(int(line)) if module is not None else None


class SubCoreError(RuntimeError):
    """An error raised on one sub-core of a logical core: args start with (kernel, core, sub-core index)."""

    @property
    def kernel(self) -> str:
        return self.args[0]

    @property
    def core(self) -> int:
        return int(self.args[1])

    @property
    def sub_core(self) -> str:
        return SUB_CORE_NAMES[int(self.args[2])]


class KernelDeadlockError(SubCoreError):
    """A CrossCoreWaitFlag of a mixed kernel can never return: every live sub-core of a logical core waits and no
    flag can change. Attributes: kernel, core, sub_core ("AIC", "AIV0", "AIV1"), event_id, line (of kernel.asc),
    where (template file and line), num_waiting (sub-cores blocked)."""

    @property
    def event_id(self) -> int:
        return int(self.args[3])

    @property
    def line(self) -> int:
        return int(self.args[4])

    @property
    def num_waiting(self) -> int:
        return int(self.args[5])

    @property
    def where(self) -> str | None:
        return template_location(self.args[6], self.line)

    def __str__(self) -> str:
        if len(self.args) != 7:
            return super().__str__()
        others = self.num_waiting - 1
        where = f" ({self.where})" if self.where else ""
        return (f"deadlock in kernel {self.kernel}: on logical core {self.core}, {self.sub_core} waits in "
                f"CrossCoreWaitFlag({self.event_id}) at kernel.asc line {self.line}{where}, and no set can reach it "
                f"({others} other sub-core{'s' if others != 1 else ''} of the core also waiting, the rest finished)")


@njit(cache=True)
def new_cross_state(ub_bytes):
    """(flags, set_lines, info, ub) of one logical core: flags int64 [receiver sub, sender sub, flag id] counting
    sets not yet consumed; set_lines [receiver sub, flag id]: kernel.asc line of the last set (for the checker);
    info (see INFO_SIZE); ub uint8 [2, ub_bytes], the Unified Buffers of AIV0 and AIV1 (zeroed)."""
    flags = np.zeros((NUM_SUB_CORES, NUM_SUB_CORES, NUM_CROSS_FLAG_IDS), np.int64)
    set_lines = np.zeros((NUM_SUB_CORES, NUM_CROSS_FLAG_IDS), np.int64)
    info = np.zeros(INFO_SIZE, np.int64)
    ub = np.zeros((2, ub_bytes), np.uint8)
    for aiv in range(2):
        info[INFO_UB_RANGE + 2 * aiv] = ub_bytes
    return flags, set_lines, info, ub


# A launch thread's cross-core state kept across launches (the launcher's pool, jit/compiled_kernel.py): one uint8 row
# per thread holding flags | set_lines | info | UB of AIV0 | UB of AIV1 (the UBs from a 64-byte aligned offset).
_FLAGS_BYTES = NUM_SUB_CORES * NUM_SUB_CORES * NUM_CROSS_FLAG_IDS * 8
_LINES_BYTES = NUM_SUB_CORES * NUM_CROSS_FLAG_IDS * 8
_INFO_BYTES = -(-INFO_SIZE * 8 // 64) * 64
_UB_OFFSET = _FLAGS_BYTES + _LINES_BYTES + _INFO_BYTES


def cross_pool_row_bytes(ub_bytes: int) -> int:
    """Bytes of one row of a cross-core state pool for UBs of ``ub_bytes``."""
    return _UB_OFFSET + 2 * ub_bytes


def new_cross_pool(rows: int, ub_bytes: int) -> np.ndarray:
    """A pool of ``rows`` cross-core states, each as new_cross_state makes it (zeros; no UB range addressed)."""
    pool = np.zeros((rows, cross_pool_row_bytes(ub_bytes)), np.uint8)
    info = pool[:, _FLAGS_BYTES + _LINES_BYTES:_UB_OFFSET].view(np.int64)
    for aiv in range(2):
        info[:, INFO_UB_RANGE + 2 * aiv] = ub_bytes
    return pool


@njit(cache=True)
def cross_state_from_pool(pool, slot, ub_bytes):
    """(flags, set_lines, info, ub) of a launch thread: row ``slot`` of ``pool`` (new_cross_pool; kept across
    launches, so the UB is not zeroed again per launch: the scheduler's reset_cross_state zeroes what the last core
    addressed). Raises ValueError when the pool has no such row or rows of another size (the caller sizes it by the
    launch's thread count: jit/compiled_kernel.py cross_pool).

    NOTES: a new state per launch thread zeroed both whole UBs (2 x 248 KiB) in every launch of every phase: ~10 us
    of a small mixed call (an HC pre-norm GEMM of 16 x 24 x 512 took 0.077 ms). No fallback to a new state either:
    its four np.zeros types were ~0.2 s of a mixed kernel's cold compile."""
    if slot < 0 or slot >= pool.shape[0] or pool.shape[1] != _UB_OFFSET + 2 * ub_bytes:
        raise ValueError("mixed kernel launch: the cross-core state pool has no row for this launch thread (slot, "
                         "rows, row bytes, UB bytes)", slot, pool.shape[0], pool.shape[1], ub_bytes)
    base = pool[slot].ctypes.data
    flags = carray(_address_as_ptr(base, np.int64), (NUM_SUB_CORES, NUM_SUB_CORES, NUM_CROSS_FLAG_IDS))
    set_lines = carray(_address_as_ptr(base + _FLAGS_BYTES, np.int64), (NUM_SUB_CORES, NUM_CROSS_FLAG_IDS))
    info = carray(_address_as_ptr(base + _FLAGS_BYTES + _LINES_BYTES, np.int64), (INFO_SIZE,))
    ub = carray(_address_as_ptr(base + _UB_OFFSET, np.uint8), (2, ub_bytes))
    return flags, set_lines, info, ub


@njit(cache=True)
def reset_cross_state(flags, set_lines, info, ub):
    """Make a used cross-core state (new_cross_state, cross_state_from_pool) as new for the next logical core: flags,
    lines and info zeroed, and each UB zeroed over the byte range its UBTensor views addressed (the rest is still
    zero: every UB byte a kernel can write is inside a view), so a core never sees what the previous one left.

    NOTES: zeroing both whole UBs (2 x 248 KiB) was the largest fixed cost of a small mixed launch: ~5-8 us per
    logical core and phase, every core of the grid, idle or not."""
    flags[:] = 0
    set_lines[:] = 0
    ub_bytes = ub.shape[1]
    for aiv in range(2):
        lo = info[INFO_UB_RANGE + 2 * aiv]
        hi = info[INFO_UB_RANGE + 2 * aiv + 1]
        if lo < hi:
            ub[aiv, lo:hi] = 0
    info[:] = 0
    for aiv in range(2):
        info[INFO_UB_RANGE + 2 * aiv] = ub_bytes


@njit(cache=True)
def _check_id(flag_id, line):
    if flag_id < 0 or flag_id >= NUM_CROSS_FLAG_IDS:
        raise ValueError("cross-core flag id out of range 0..15 (id, kernel.asc line)", flag_id, line)


@njit(cache=True)
def cross_core_set(flags, set_lines, info, sub, mode, flag_id, line):
    """CrossCoreSetFlag<mode, pipe>(flag_id) executed by sub-core ``sub`` at kernel.asc ``line`` (see the module
    docstring)."""
    _check_id(flag_id, line)
    if mode == MODE_AIC_AIV:
        if sub == 0:
            for aiv in range(1, NUM_SUB_CORES):
                flags[aiv, 0, flag_id] += 1
                set_lines[aiv, flag_id] = line
        else:
            flags[0, sub, flag_id] += 1
            set_lines[0, flag_id] = line
    elif mode == MODE_AIV_PAIR:
        if sub == 0:
            raise ValueError("CrossCoreSetFlag mode 1 (AIV <-> AIV) called on the AIC (kernel.asc line)", line)
        flags[3 - sub, sub, flag_id] += 1
        set_lines[3 - sub, flag_id] = line
    else:
        raise ValueError("CrossCoreSetFlag: mode must be 1 (AIV <-> AIV) or 2 (AIC <-> AIV) (mode, line)", mode, line)
    info[0] += 1


@njit(cache=True)
def cross_core_try_wait(flags, info, sub, flag_id, line):
    """CrossCoreWaitFlag(flag_id) of sub-core ``sub``: consume the matching set(s) and return True, or record what
    ``sub`` waits for (for the deadlock report) and return False (the generated code then yields)."""
    _check_id(flag_id, line)
    if sub == 0:
        if flags[0, 1, flag_id] > 0 and flags[0, 2, flag_id] > 0:
            flags[0, 1, flag_id] -= 1
            flags[0, 2, flag_id] -= 1
            return True
    else:
        for sender in range(NUM_SUB_CORES):
            if flags[sub, sender, flag_id] > 0:
                flags[sub, sender, flag_id] -= 1
                return True
    info[1 + 2 * sub] = flag_id
    info[2 + 2 * sub] = line
    return False


@intrinsic
def _address_as_ptr(typingctx, address, dtype):
    """The integer ``address`` as a pointer to elements of the numpy dtype class ``dtype``."""
    if not isinstance(address, types.Integer) or not isinstance(dtype, types.NumberClass):
        return None
    ptr_type = types.CPointer(dtype.dtype)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(ptr_type))

    return ptr_type(address, dtype), codegen


@njit(cache=True)
def ub_tensor(ub, info, aiv, byte_offset, rows, cols, dtype):
    """UBTensor<T>(aiv, byte_offset, rows, cols): a [rows, cols] view of type T of the UB of AIV ``aiv`` (0 or 1)
    from ``byte_offset`` (a multiple of 32). Both sub-cores of a hand-off address the same bytes: the AIC's FixPipe
    writes what the AIV reads. Raises ValueError when the tensor leaves the UB or is misaligned. Widens the UB's
    addressed range in ``info`` (what reset_cross_state zeroes for the next core)."""
    itemsize = _itemsize(dtype)
    nbytes = rows * cols * itemsize
    if aiv < 0 or aiv > 1:
        raise ValueError("UBTensor: aiv must be 0 or 1", aiv)
    if byte_offset < 0 or byte_offset % UB_ALIGN != 0 or rows < 0 or cols < 0:
        raise ValueError("UBTensor: byte_offset must be a non-negative multiple of 32", byte_offset)
    if byte_offset + nbytes > ub.shape[1]:
        raise ValueError("UBTensor: the tensor exceeds the Unified Buffer (offset, bytes, UB bytes)", byte_offset,
                         nbytes, ub.shape[1])
    if nbytes > 0:
        slot = INFO_UB_RANGE + 2 * aiv
        if byte_offset < info[slot]:
            info[slot] = byte_offset
        if byte_offset + nbytes > info[slot + 1]:
            info[slot + 1] = byte_offset + nbytes
    # NOTES: a borrowed view (no reference count): the UB outlives every sub-core generator that addresses it (the
    # launch loop owns it), and views without a count make the AIVs' many short instructions cheap (numba counts
    # every array view atomically: tens of ns per view on the vector hot path).
    return carray(_address_as_ptr(ub[aiv].ctypes.data + byte_offset, dtype), (rows, cols))


@njit(cache=True)
def local_tensor(local, sub, byte_offset, shape, dtype):
    """``AllocTensor<T>(shape)`` of a mixed kernel's sub-core ``sub``: a borrowed view (no reference count) of type T
    of row ``sub`` of ``local``, the launch thread's local memory (uint8 [3, bytes], which the launch loop owns and
    which outlives every generator that addresses it), from ``byte_offset``; the translator gives each buffer of a
    sub-core body its own offset. Not zeroed (AllocTensor's memory is not). Raises ValueError when it leaves the row."""
    nbytes = _itemsize(dtype)
    for n in shape:
        nbytes *= n
    if sub < 0 or sub >= local.shape[0] or byte_offset < 0 or byte_offset + nbytes > local.shape[1]:
        raise ValueError("AllocTensor: the buffer leaves the sub-core's local memory (sub, offset, bytes, size)", sub,
                         byte_offset, nbytes, local.shape[1])
    return carray(_address_as_ptr(local[sub].ctypes.data + byte_offset, dtype), shape)


def borrow(arr):
    """A view of ``arr`` (same data, shape, strides) that holds no reference: the mixed kernel's scheduler hands
    these to its sub-core generators. In plain Python (kernels run uncompiled in tests) it is ``arr`` itself.

    NOTES: numba never releases what a nopython generator captured (measured: every launch of a mixed kernel kept
    its array arguments, the output included, and the cross-core state alive forever). The scheduler owns the real
    references and outlives its generators, so borrowed views are safe there and nothing leaks."""
    return arr


@overload(borrow)
def _borrow_impl(arr):
    if isinstance(arr, types.Array):
        return lambda arr: _borrowed(arr)
    return None


def keep_alive(arr):
    """Nothing, as a call numba keeps: a mixed kernel's sub-core body names the owner of each of its run-time-sized
    local buffers here at the end of the buffer's C++ scope, so the owner (and its memory) lives at least as long as the
    borrowed view (``borrow``) the kernel body addresses it through. In plain Python it does nothing either."""
    return None


@overload(keep_alive)
def _keep_alive_impl(arr):
    if isinstance(arr, types.Array):
        return lambda arr: None
    return None


@intrinsic
def _borrowed(typingctx, arr):
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, signature, args):
        src = context.make_array(signature.args[0])(context, builder, args[0])
        dst = context.make_array(signature.return_type)(context, builder)
        for name in ("nitems", "itemsize", "data", "shape", "strides"):
            setattr(dst, name, getattr(src, name))
        dst.meminfo = context.get_constant_null(types.MemInfoPointer(signature.args[0].dtype))
        dst.parent = context.get_constant_null(types.pyobject)
        return dst._getvalue()

    return arr(arr), codegen
