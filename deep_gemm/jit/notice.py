"""The compile notice: when a build misses every cache (render -> translate -> numba compile, seconds), one line on
stderr if it is a terminal and one logging record (logger "deep_gemm.jit", INFO), again when the compile ends.

Imported only on a cache miss (logging is not imported on the cache-hit path). Knows nothing of GEMM: the label is
built from the naming conventions of template constants (SHAPE_*, BLOCK_*). DG_JIT_NOTICE=0 keeps only the logging
record; DG_JIT_DEBUG's output is separate.
"""

from __future__ import annotations

import logging
import sys
import time

from .. import envs

logger = logging.getLogger("deep_gemm.jit")

_SHAPE_PREFIX = "SHAPE_"
_DIM_ORDER = {"SHAPE_M": 0, "SHAPE_N": 1, "SHAPE_K": 2}
_MAX_OTHER = 4  # constants shown for a kernel that has no SHAPE_*/BLOCK_* ones


def describe(name: str, constants: dict) -> str:
    """``bf16_gemm (N=7168 K=2048, block 128x256)``: the compiled shape (non-zero SHAPE_*; 0 means a runtime dim), the
    tile (BLOCK_M x BLOCK_N), or else the first few constants other than NUM_AI_CORES."""
    parts = []
    dims = sorted((k for k, v in constants.items() if k.startswith(_SHAPE_PREFIX) and type(v) is int and v),
                  key=lambda k: (_DIM_ORDER.get(k, len(_DIM_ORDER)), k))  # M, N, K first, other SHAPE_* after
    shape = [f"{k[len(_SHAPE_PREFIX):]}={constants[k]}" for k in dims]
    if shape:
        parts.append(" ".join(shape))
    if "BLOCK_M" in constants and "BLOCK_N" in constants:
        parts.append(f"block {constants['BLOCK_M']}x{constants['BLOCK_N']}")
    if not parts:
        others = [f"{k}={v}" for k, v in sorted(constants.items()) if k != "NUM_AI_CORES"]
        parts.append(" ".join(others[:_MAX_OTHER] + (["..."] if len(others) > _MAX_OTHER else [])))
    label = ", ".join(p for p in parts if p)
    return f"{name} ({label})" if label else name


def _stderr_is_tty() -> bool:
    stream = sys.stderr
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class CompileNotice:
    """One compile being announced: created when the build misses, finished when numba has compiled the kernel."""

    __slots__ = ("label", "t0", "shown", "done")

    def __init__(self, name: str, constants: dict):
        self.label = describe(name, constants)
        self.t0 = time.perf_counter()
        self.shown = bool(envs.DG_JIT_NOTICE.get()) and _stderr_is_tty()
        self.done = False
        logger.info("compiling %s ...", self.label)
        if self.shown:
            print(f"deep_gemm: compiling {self.label} ...", file=sys.stderr, flush=True)

    def finish(self, failed: bool = False) -> float:
        """Report the end of the compile (once); returns the seconds since the notice."""
        seconds = time.perf_counter() - self.t0
        if self.done:
            return seconds
        self.done = True
        line = (f"compiling {self.label} failed after" if failed else f"compiled {self.label} in") + f" {seconds:.1f} s"
        logger.info("%s", line)  # NOTES: INFO also on failure: logging's last-resort handler prints WARNING and up
        if self.shown:
            print(f"deep_gemm: {line}", file=sys.stderr, flush=True)
        return seconds
