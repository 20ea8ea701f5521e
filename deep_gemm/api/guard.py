"""The call guard every public entry point runs under: one reading of the runtime settings per call, and interrupt
safety (a call either completes or leaves its outputs as they were; a long launch stops on Ctrl-C within a tile's
time). The mechanism is the JIT's (jit/interrupt.py); here are the decorator and ``protect``.
"""

from __future__ import annotations

import functools

from .. import runtime
from ..jit import interrupt

# A call names its outputs right before it first writes them: protect(d, c_out, work=flops).
protect = interrupt.protect


def api_call(fn):
    """Run ``fn`` as one public call: runtime settings frozen for its duration (runtime.call_state) and its outputs
    interrupt-safe (jit/interrupt.py). Nested public calls join the outer one."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with interrupt.scope(), runtime.call_state():
            return fn(*args, **kwargs)

    return call
