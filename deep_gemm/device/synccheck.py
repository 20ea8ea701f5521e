"""The synchronisation checker (DG_SYNC_CHECK=1): records every SetFlag / WaitFlag / PipeBarrier and cross-core flag
of a kernel, per sub-core in program order, and reports the first protocol error with its kernel.asc line.

On the CPU one sub-core's pipes run in program order, so a broken event protocol computes the right numbers here
and hangs (or races) on the chip. The checker finds it: a WaitFlag without a matching earlier SetFlag (the chip
would hang), a SetFlag set again before it was waited (the first set is lost), an event id outside 0..7, pipe
events left set at kernel end (rings not drained), cross-core flags set but never waited. Not template-callable:
the translator emits these calls in place of the no-op SetFlag / WaitFlag when the checker is on.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..jit import enums
from ..jit.numba_setup import apply_numba_settings
from .crosscore import NUM_CROSS_FLAG_IDS, NUM_SUB_CORES, SUB_CORE_NAMES, SubCoreError, template_location
from .sync import NUM_EVENT_IDS

# NOTES: must run before the first @njit below can compile (numba reads it when building its CPU target).
apply_numba_settings()

NUM_HARD_EVENTS = len(enums.SCOPED["HardEvent"])
NUM_PIPES = len(enums.BARE)

# Finding kinds
WAIT_WITHOUT_SET = 1
SET_NEVER_WAITED = 2
ID_OUT_OF_RANGE = 3
ARMED_AT_END = 4
CROSS_SET_NEVER_WAITED = 5
BAD_PIPE = 6
KIND_TEXT = {
    WAIT_WITHOUT_SET: "WaitFlag<HardEvent::{event}>({id}) without a matching earlier SetFlag (would hang)",
    SET_NEVER_WAITED: "SetFlag<HardEvent::{event}>({id}) set again before it was waited (the earlier set is lost)",
    ID_OUT_OF_RANGE: "event id {id} of HardEvent::{event} is outside 0..7",
    ARMED_AT_END: "SetFlag<HardEvent::{event}>({id}) still set at kernel end (ring not drained)",
    CROSS_SET_NEVER_WAITED: "CrossCoreSetFlag({id}) to {event} never waited by kernel end",
    BAD_PIPE: "PipeBarrier on an unknown pipe {id}",
}
_EVENT_NAMES = {v: k for k, v in enums.SCOPED["HardEvent"].items()}

# findings layout: [0] count, then the first finding: kind, event, id, line, sub-core
FINDINGS_SIZE = 6


class SyncCheckError(SubCoreError):
    """The synchronisation checker found a protocol error. Attributes: kernel, core, sub_core, kind (text), line
    (of kernel.asc), where (template file and line), count (findings on this core)."""

    @property
    def line(self) -> int:
        return int(self.args[6])

    @property
    def count(self) -> int:
        return int(self.args[7])

    @property
    def where(self) -> str | None:
        return template_location(self.args[8], self.line)

    @property
    def kind(self) -> str:
        kind, event, event_id = (int(a) for a in self.args[3:6])
        if kind == CROSS_SET_NEVER_WAITED:
            event_name = SUB_CORE_NAMES[event]
        else:
            event_name = _EVENT_NAMES.get(event, str(event))
        return KIND_TEXT.get(kind, f"finding {kind}").format(event=event_name, id=event_id)

    def __str__(self) -> str:
        if len(self.args) != 9:
            return super().__str__()
        more = f" ({self.count - 1} more finding{'s' if self.count != 2 else ''} on this core)" if self.count > 1 \
            else ""
        where = f" ({self.where})" if self.where else ""
        return (f"sync check failed in kernel {self.kernel} on logical core {self.core}, {self.sub_core}: {self.kind} "
                f"at kernel.asc line {self.line}{where}{more}")


@njit(cache=True)
def new_check_state():
    """(events, findings) of one sub-core: events int64 [HardEvent, id, (set count, line of the last set)]."""
    return np.zeros((NUM_HARD_EVENTS, NUM_EVENT_IDS, 2), np.int64), np.zeros(FINDINGS_SIZE, np.int64)


@njit(cache=True)
def _record(findings, kind, event, event_id, line, sub):
    findings[0] += 1
    if findings[0] == 1:
        findings[1] = kind
        findings[2] = event
        findings[3] = event_id
        findings[4] = line
        findings[5] = sub


@njit(cache=True)
def check_set_flag(events, findings, event, event_id, line, sub):
    """SetFlag<event>(event_id) at kernel.asc ``line``: out-of-range id, or a set not yet waited, is a finding."""
    if event_id < 0 or event_id >= NUM_EVENT_IDS:
        _record(findings, ID_OUT_OF_RANGE, event, event_id, line, sub)
        return
    if events[event, event_id, 0] > 0:
        _record(findings, SET_NEVER_WAITED, event, event_id, events[event, event_id, 1], sub)
    events[event, event_id, 0] = 1
    events[event, event_id, 1] = line


@njit(cache=True)
def check_wait_flag(events, findings, event, event_id, line, sub):
    """WaitFlag<event>(event_id) at ``line``: a wait with no earlier set is a finding; otherwise it consumes it."""
    if event_id < 0 or event_id >= NUM_EVENT_IDS:
        _record(findings, ID_OUT_OF_RANGE, event, event_id, line, sub)
        return
    if events[event, event_id, 0] == 0:
        _record(findings, WAIT_WITHOUT_SET, event, event_id, line, sub)
    events[event, event_id, 0] = 0


@njit(cache=True)
def check_pipe_barrier(findings, pipe, line, sub):
    """PipeBarrier<pipe>() at ``line``: recorded; an unknown pipe is a finding."""
    if pipe < 0 or pipe >= NUM_PIPES:
        _record(findings, BAD_PIPE, 0, pipe, line, sub)


@njit(cache=True)
def check_end(events, findings, sub):
    """At the end of a sub-core's kernel body: every event still set is a finding (with the line that set it)."""
    for event in range(events.shape[0]):
        for event_id in range(events.shape[1]):
            if events[event, event_id, 0] > 0:
                _record(findings, ARMED_AT_END, event, event_id, events[event, event_id, 1], sub)


@njit(cache=True)
def check_cross_end(flags, set_lines, findings):
    """At the end of a mixed core: a cross-core flag set but never waited is a finding (the line of its last set;
    ``set_lines`` [receiver, flag id])."""
    for receiver in range(NUM_SUB_CORES):
        for sender in range(NUM_SUB_CORES):
            for flag_id in range(NUM_CROSS_FLAG_IDS):
                if flags[receiver, sender, flag_id] > 0:
                    _record(findings, CROSS_SET_NEVER_WAITED, receiver, flag_id, set_lines[receiver, flag_id],
                            sender)


@njit(cache=True)
def merge_findings(into, findings):
    """Add the findings of one sub-core to the core's (the first finding stays the first)."""
    if findings[0] > 0:
        first = into[0] == 0
        into[0] += findings[0]
        if first:
            for i in range(1, FINDINGS_SIZE):
                into[i] = findings[i]
