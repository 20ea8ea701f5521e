"""The host's AVX512-BF16 dot products (VDPBF16PS), as the Cube's bf16 path where there is no AMX tile unit, and the
choice of the Cube's bf16 unit for kernels built now.

VDPBF16PS multiplies the two bf16 halves of each 32-bit lane of two vectors and adds both products into an fp32
lane (the high pair first, then the low one, each addition rounded; input and output subnormals read and written
as zero): on one core it does twice the FLOPs of fp32 FMAs at the same instruction rate. It needs no permission of
the OS, only the CPU flag and an LLVM that may select it for the host. Imports nothing heavy: the LLVM view of the
host is the kernel cache's record (native_target.host_cpu), asked of llvmlite only once per machine. Probes nothing
at import: the CPU is asked on the first call that needs the answer, once per process.
"""

from __future__ import annotations

import functools
import os
import platform
import sys

from .. import envs
from . import amx

# The values of cube_bf16_unit(): the Cube's unit for bf16 L0 buffers, "" for fp32 L0 (the FMA micro-kernel).
UNIT_AMX = "amx"
UNIT_DPBF16 = "dpbf16"


def _llvm_may_select_dpbf16() -> bool:
    """Whether numba's LLVM target for this process has +avx512bf16: the host's features, unless NUMBA_CPU_NAME /
    NUMBA_CPU_FEATURES name another target (then only an explicit +avx512bf16 there counts)."""
    if os.environ.get("NUMBA_CPU_NAME") or os.environ.get("NUMBA_CPU_FEATURES"):
        return "+avx512bf16" in os.environ.get("NUMBA_CPU_FEATURES", "").split(",")
    from .native_target import host_cpu

    return {"+avx512f", "+avx512bf16"} <= set(host_cpu()[1].split(","))


@functools.cache
def dpbf16_supported() -> bool:
    """True when the CPU has AVX512-BF16 (and AVX-512F) and numba's LLVM target may emit VDPBF16PS (asked once)."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    if not {"avx512f", "avx512_bf16"} <= amx._cpu_flags():
        return False
    return _llvm_may_select_dpbf16()


def dpbf16_enabled() -> bool:
    """Whether kernels built now may put bf16-exact operands on the AVX512-BF16 path (``dpbf16_supported()`` and
    ``DG_CUBE_DPBF16``); the AMX path, where enabled, comes first."""
    return envs.DG_CUBE_DPBF16.get() and dpbf16_supported()


def _choose_unit() -> str:
    if amx.enabled():
        return UNIT_AMX
    if dpbf16_enabled():
        return UNIT_DPBF16
    return ""


# (DG_CUBE_AMX's raw value, DG_CUBE_DPBF16's raw value) -> the unit they chose last; the first entry never matches.
_unit_memo: tuple[tuple[str | None, str | None] | None, str] = (None, "")
_UNIT_VARS = (envs.DG_CUBE_AMX.name, envs.DG_CUBE_DPBF16.name)


def cube_bf16_unit() -> str:
    """The unit a kernel built now runs bf16-exact operands on: "amx" (jit.amx.enabled()), else "dpbf16"
    (dpbf16_enabled()), else "" (fp32 L0 on the FMA micro-kernel). Follows DG_CUBE_AMX / DG_CUBE_DPBF16 as they
    are at the call.

    NOTES: every GEMM call asks (twice: the scale split and the kernel's memo key), so the answer is kept with the
    two variables' raw strings: a call reads them (two environ lookups) and compares them with the last ones; only
    a change parses them again (a bad value still raises each time) and asks the CPU probes (cached per process)."""
    global _unit_memo
    get = os.environ.get
    raw = (get(_UNIT_VARS[0]), get(_UNIT_VARS[1]))
    memo = _unit_memo
    if memo[0] == raw:
        return memo[1]
    unit = _choose_unit()
    _unit_memo = (raw, unit)
    return unit
