"""Every environment variable deep_gemm reads, declared once: name, type, default and meaning.

Read them through the accessors here (never ``os.environ`` elsewhere), so the README table and the code agree.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    name: str
    kind: type
    default: object
    doc: str

    def get(self):
        raw = os.environ.get(self.name)
        if raw is None or raw == "":
            return self.default
        if self.kind is bool:
            return raw.strip().lower() not in ("0", "false", "no", "off")
        if self.kind is int:
            try:
                return int(raw)
            except ValueError as e:
                raise ValueError(f"{self.name}={raw!r} is not an integer") from e
        return raw


ENV_VARS: dict[str, EnvVar] = {}


def _declare(name: str, kind: type, default: object, doc: str) -> EnvVar:
    var = EnvVar(name, kind, default, doc)
    ENV_VARS[name] = var
    return var


# JIT
DG_JIT_CACHE_DIR = _declare(
    "DG_JIT_CACHE_DIR", str, None,
    "Kernel cache root (entries, and numba's files of deep_gemm's device code under numba/); default: jit_cache/ "
    "of a writable source checkout, else the user cache directory, else a temp dir; none writable: in memory",
)
DG_JIT_DEBUG = _declare(
    "DG_JIT_DEBUG", int, 0,
    "JIT log level: 1 cache hits/misses and timings, 2 + configs, 3 + rendered source, 4 + translated source",
)
DG_PRINT_CONFIGS = _declare("DG_PRINT_CONFIGS", bool, False, "Print each distinct GEMM problem and its config once")
DG_JIT_FAST_MATH_SETUP = _declare(
    "DG_JIT_FAST_MATH_SETUP", bool, True,
    "Let deep_gemm turn on numba's SLP vectorizer and full-width vectors before its first compile (0 to opt out)",
)
DG_TEST_MAX_WORKERS = _declare(
    "DG_TEST_MAX_WORKERS", int, None, "Worker processes for parallel precompilation (default: CPU count)"
)

# Runtime defaults
DG_NPU_ARCH = _declare("DG_NPU_ARCH", str, "950DT", "Default modelled NPU: 950DT, 950PR or 910B2")
DG_NUM_AI_CORES = _declare("DG_NUM_AI_CORES", int, None, "Default logical AI-core count (default: the arch's count)")
DG_JIT_DEFER_SCIPY = _declare(
    "DG_JIT_DEFER_SCIPY", bool, True,
    "Skip numba's import-time scipy.linalg probe (~0.3-1 s per process); np.dot/linalg in numba still import it",
)
DG_JIT_LAUNCHER = _declare(
    "DG_JIT_LAUNCHER", str, "threads",
    "How a kernel's logical AI cores map to CPU threads: threads (deep_gemm's pool, nogil kernel) or prange (numba)",
)
DG_JIT_KERNEL_OPT = _declare(
    "DG_JIT_KERNEL_OPT", str, "cheap",
    "Module optimization of generated kernels after linking device code: cheap (default, faster compile) or full",
)
DG_JIT_NATIVE = _declare(
    "DG_JIT_NATIVE", bool, True,
    "Keep native code in the kernel cache (numba's machine code linked with the C compiler into native-*.so) and "
    "run cached kernels from it without importing numba (0: always the numba path)",
)
DG_CUBE_AMX = _declare(
    "DG_CUBE_AMX", bool, True,
    "Run the Cube on the CPU's AMX tile unit (bf16 tiles, fp32 accumulation) when both operands are exact in bf16 "
    "(BF16, FP8, FP4) and the CPU and kernel offer AMX-BF16 (0: the fp32 FMA micro-kernel everywhere)",
)
DG_SYNC_CHECK = _declare(
    "DG_SYNC_CHECK", bool, False,
    "Synchronisation checker: kernels record every SetFlag/WaitFlag/PipeBarrier and cross-core flag and raise "
    "SyncCheckError on a protocol error (separate cache entries)",
)
