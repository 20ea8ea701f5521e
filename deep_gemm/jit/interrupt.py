"""Interrupt safety of a call that launches kernels: under Ctrl-C a call either completes or leaves its outputs exactly
as they were, and a long launch stops between tiles. Knows nothing of GEMM: a call names its outputs and its work.

A ``CallScope`` spans one user call (deep_gemm.api.guard opens it around every public function). The call names its
outputs with ``protect(*arrays, work=flops)`` right before it first writes them. Then, on the main thread, SIGINT is
answered in one of three ways:

- a *cancellable* call (``work`` at least CANCEL_WORK, the default SIGINT handler in place): its outputs are copied
  aside by ``protect``; a SIGINT outside a launch raises KeyboardInterrupt at once, one during a launch sets the
  launch's cancel flag, which every kernel checks between tiles and between logical cores (jit/cruntime.py
  cancel_requested; the translator adds the checks), so the launch ends within a tile's time and KeyboardInterrupt is
  raised after it. Either way the outputs are copied back before the exception leaves the call.
- a short call with small outputs (at most RESTORE_BYTES) is *restorable*: its outputs are copied aside too, a
  SIGINT between launches (a compile, a host pass) raises at once and the outputs are copied back; a launch (a few
  milliseconds) runs to its end first (jit/launch.py holds the signal for it).
- any other call (short with large outputs, or a SIGINT handler installed by the user): a SIGINT that arrives after
  ``protect`` is held until the call has completed, then handed to the previous handler.
Before ``protect`` nothing has been written and a SIGINT is handled at once, as without a scope.

Off the main thread no signal arrives, and a scope only carries the (never set) cancel flag.
"""

from __future__ import annotations

import signal
import threading

import numpy as np

# NOTES: a call of at least this many FLOP (about 5-20 ms on one CPU core) pays for a copy of its outputs, so that it
# can stop mid-launch; below it a launch runs to its end (well within the 0.5 s a user waits for Ctrl-C).
CANCEL_WORK = 2 ** 31
# A short call whose outputs total at most this many bytes keeps a copy of them, so that it can stop between launches.
RESTORE_BYTES = 8 << 20

# NOTES: the C functions behind signal.getsignal/signal.signal: the Python wrappers convert handlers to and from
# enums and cost ~12 us per launch on a loaded machine (most of a small kernel's dispatch); these cost under 1 us.
# Same semantics (SIG_DFL/SIG_IGN come back as the ints the enums compare equal to).
try:
    from _signal import default_int_handler as _default_int_handler
    from _signal import getsignal as _getsignal
    from _signal import signal as _setsignal
except ImportError:  # another Python implementation
    _getsignal, _setsignal, _default_int_handler = signal.getsignal, signal.signal, signal.default_int_handler

# The flag of a launch outside any scope (kernels called directly): never set.
_NEVER = np.zeros(1, np.uint8)
_local = threading.local()


class CallScope:
    """The interrupt state of one call (see the module docstring). ``flag``: the cancel flag its launches pass to
    the kernels; ``cancellable``: decided by the first ``protect``; ``in_launch``: a launch runs on the main thread."""

    __slots__ = ("flag", "cancellable", "restorable", "written", "in_launch", "backups", "pending", "previous",
                 "depth", "on_main")

    def __init__(self):
        self.flag = np.zeros(1, np.uint8)
        self.cancellable = False
        self.restorable = False
        self.written = False
        self.in_launch = False
        self.backups: list[tuple[np.ndarray, np.ndarray]] = []
        self.pending = None
        self.previous = None
        self.depth = 0
        self.on_main = False

    # -- the scope ------------------------------------------------------------------------------------------------

    def __enter__(self) -> CallScope:
        self.depth += 1
        if self.depth > 1:
            return self
        _local.call = self
        if threading.current_thread() is threading.main_thread():
            previous = _getsignal(signal.SIGINT)
            if callable(previous):
                try:
                    _setsignal(signal.SIGINT, self._on_sigint)
                except ValueError:  # not the main interpreter
                    return self
                self.previous = previous
                self.on_main = True
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.depth -= 1
        if self.depth > 0:
            return
        _local.call = None
        if self.on_main:
            _setsignal(signal.SIGINT, self.previous)
        if exc_type is not None and self.backups:
            # NOTES: interrupted (or failed) after the outputs were touched: put them back as the caller had them.
            for array, saved in self.backups:
                np.copyto(array, saved)
        self.backups = []
        pending, self.pending = self.pending, None
        if exc_type is None and pending is not None:
            self.previous(*pending)  # held while the call ran; default_int_handler raises KeyboardInterrupt here

    def _on_sigint(self, signum, frame) -> None:
        if not self.written:
            self.previous(signum, frame)  # nothing written yet: as if no scope were open
        elif self.in_launch:  # a cancellable launch
            self.flag[0] = 1  # the kernels stop at their next tile; the launch then raises
        elif self.restorable:
            raise KeyboardInterrupt  # the scope copies the outputs back
        elif self.pending is None:
            self.pending = (signum, frame)

    # -- what a call says -----------------------------------------------------------------------------------------

    def protect(self, arrays, work: float | None) -> None:
        if not self.written:
            self.written = True
            default = self.on_main and self.previous is _default_int_handler
            self.cancellable = default and work is not None and work >= CANCEL_WORK
            small = sum(a.nbytes for a in arrays if a is not None) <= RESTORE_BYTES
            self.restorable = default and (self.cancellable or small)
        if self.restorable:
            for array in arrays:
                if array is not None and not any(array is a for a, _ in self.backups):
                    self.backups.append((array, array.copy()))

    def raise_if_cancelled(self) -> None:
        """After a launch: a cancelled launch ends the call with KeyboardInterrupt (its outputs are restored)."""
        if self.flag[0]:
            raise KeyboardInterrupt


class HeldSigint:
    """On the main thread, holds SIGINT for the duration of a block (a launch, numba's registry refresh) and hands
    it to the previous handler after.

    Off the main thread (signals are only ever handled on the main thread) or when SIGINT's handler was not
    installed from Python, it does nothing.
    """

    __slots__ = ("_previous", "_pending")

    def __init__(self):
        self._previous = None
        self._pending: list = []

    def _hold(self, signum, frame) -> None:
        self._pending.append((signum, frame))

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self
        previous = _getsignal(signal.SIGINT)
        if previous is None:
            return self
        try:
            _setsignal(signal.SIGINT, self._hold)
        except ValueError:  # not the main interpreter
            return self
        self._previous = previous
        return self

    def __exit__(self, *exc) -> None:
        previous = self._previous
        if previous is None:
            return
        _setsignal(signal.SIGINT, previous)
        if not self._pending:
            return
        signum, frame = self._pending[0]
        if callable(previous):
            previous(signum, frame)  # default_int_handler raises KeyboardInterrupt here
        elif previous == signal.SIG_DFL:
            signal.raise_signal(signum)
        # SIG_IGN: the interrupt is ignored, as it would have been without the hold


def scope() -> CallScope:
    """The current thread's call scope (joined when one is open: nested public calls form one call)."""
    call = getattr(_local, "call", None)
    return call if call is not None else CallScope()


def current() -> CallScope | None:
    return getattr(_local, "call", None)


def protect(*arrays, work: float | None = None) -> None:
    """Name the outputs the current call is about to write (None entries are skipped) and its work in FLOP (or the
    equivalent). Outside a scope, does nothing."""
    call = getattr(_local, "call", None)
    if call is not None:
        call.protect(arrays, work)


def cancel_flag() -> np.ndarray:
    """The cancel flag a launch passes to its kernel: the current call's, else one that is never set."""
    call = getattr(_local, "call", None)
    return _NEVER if call is None else call.flag
