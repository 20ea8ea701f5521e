"""The host's AMX tile unit, as the Cube's fast path: whether this process may use AMX-BF16 (TDPBF16PS).

Linux hands out the tile data state (XTILEDATA, 8 KiB per thread) only to a process that asks for it
(``arch_prctl(ARCH_REQ_XCOMP_PERM)``); a tile instruction without that permission is a SIGILL. ``supported()``
asks once per process, so every caller that decides to run bf16-tile code (kernel template constants, the device
layer at import) calls it first. Imports nothing heavy: a fresh process that runs a cached native kernel asks here
too.
"""

from __future__ import annotations

import ctypes
import functools
import platform
import sys

from .. import envs

_SYS_ARCH_PRCTL = 158  # x86-64
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


@functools.cache
def _cpu_flags() -> frozenset[str]:
    """The first CPU's flags in /proc/cpuinfo (read once per process; empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.cache
def supported() -> bool:
    """True when the CPU has AMX-BF16 and the kernel granted this process the tile state (asked once)."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    if not {"amx_tile", "amx_bf16"} <= _cpu_flags():
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def enabled() -> bool:
    """Whether kernels built now put bf16-exact operands on the AMX path (``supported()`` and ``DG_CUBE_AMX``)."""
    return envs.DG_CUBE_AMX.get() and supported()
