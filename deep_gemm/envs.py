"""Every environment variable deep_gemm reads, declared once: name, type, default, accepted values and meaning.

Read them through the accessors here (never ``os.environ`` elsewhere), so the README table and the code agree.
Every variable that is set is parsed when this module is imported (check_environment): a bad value fails at the
start with a ValueError naming the variable and the value, not inside the first GEMM call. Knows nothing else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class EnvVar:
    name: str
    kind: type
    default: object
    doc: str
    choices: tuple[str, ...] = ()  # str: the accepted values (case is ignored; get() returns the spelling here)
    minimum: int | None = None  # int: the smallest accepted value
    ignored_prefix: str = ""  # str with choices: a prefix a value may carry ("Ascend950PR" for DG_NPU_ARCH)

    def get(self):
        """The variable's value now (the default when unset or empty). Raises ValueError naming the variable, its
        value and what is accepted when the value does not parse."""
        raw = os.environ.get(self.name)
        if raw is None or raw == "":
            return self.default
        return self.parse(raw)

    def parse(self, raw: str):
        text = raw.strip()
        if self.kind is bool:
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
            raise self._invalid(raw, f"a boolean: {', '.join(_TRUE)} or {', '.join(_FALSE)}")
        if self.kind is int:
            floor = f" >= {self.minimum}" if self.minimum is not None else ""
            try:
                value = int(text)
            except ValueError:
                raise self._invalid(raw, f"an integer{floor}") from None
            if self.minimum is not None and value < self.minimum:
                raise self._invalid(raw, f"an integer{floor}")
            return value
        if self.choices:
            key = self._canonical(text)
            for choice in self.choices:
                if self._canonical(choice) == key:
                    return choice
            raise self._invalid(raw, f"one of {', '.join(self.choices)}")
        return raw

    def _canonical(self, text: str) -> str:
        key = text.strip().upper()
        prefix = self.ignored_prefix.upper()
        if prefix and key.startswith(prefix):
            key = key[len(prefix):].strip().lstrip("_-")
        return key

    def _invalid(self, raw: str, expected: str) -> ValueError:
        return ValueError(f"environment variable {self.name}={raw!r} is invalid: expected {expected} ({self.doc}); "
                          f"unset it or set a valid value")


ENV_VARS: dict[str, EnvVar] = {}


def _declare(name: str, kind: type, default: object, doc: str, **checks) -> EnvVar:
    var = EnvVar(name, kind, default, doc, **checks)
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
    minimum=0,
)
DG_PRINT_CONFIGS = _declare("DG_PRINT_CONFIGS", bool, False, "Print each distinct GEMM problem and its config once")
DG_JIT_FAST_MATH_SETUP = _declare(
    "DG_JIT_FAST_MATH_SETUP", bool, True,
    "Let deep_gemm turn on numba's SLP vectorizer and full-width vectors before its first compile (0 to opt out)",
)
DG_JIT_NOTICE = _declare(
    "DG_JIT_NOTICE", bool, True,
    "Print one line on stderr, when it is a terminal, as a kernel starts and ends compiling (0: only the logging "
    "record of logger deep_gemm.jit)",
)
DG_JIT_WARMUP = _declare(
    "DG_JIT_WARMUP", bool, True,
    "While a kernel compiles cold, compile the device functions it will call in a second process on a spare CPU "
    "(0: off; off anyway on one CPU)",
)
DG_TEST_MAX_WORKERS = _declare(
    "DG_TEST_MAX_WORKERS", int, None, "Worker processes for parallel precompilation (default: CPU count)", minimum=1
)

# Runtime defaults
# NOTES: the names of deep_gemm/arch.py's ARCHS, matched as get_arch matches them (importing the heuristics here
# would cost every process that runs a cached kernel); tests/jit/test_cache_damage.py checks the two agree.
DG_NPU_ARCH = _declare("DG_NPU_ARCH", str, "950DT", "Default modelled NPU: 950DT, 950PR or 910B2",
                       choices=("950DT", "950PR", "910B2"), ignored_prefix="Ascend")
DG_NUM_AI_CORES = _declare("DG_NUM_AI_CORES", int, None, "Default logical AI-core count (default: the arch's count)",
                           minimum=1)
DG_JIT_DEFER_SCIPY = _declare(
    "DG_JIT_DEFER_SCIPY", bool, True,
    "Skip numba's import-time scipy.linalg probe (~0.3-1 s per process); np.dot/linalg in numba still import it",
)
DG_JIT_LAUNCHER = _declare(
    "DG_JIT_LAUNCHER", str, "threads",
    "How a kernel's logical AI cores map to CPU threads: threads (deep_gemm's pool, nogil kernel) or prange (numba)",
    choices=("threads", "prange"),
)
DG_JIT_KERNEL_OPT = _declare(
    "DG_JIT_KERNEL_OPT", str, "cheap",
    "Module optimization of kernels and thin device wrappers after linking: cheap (default, faster compile) or full",
    choices=("cheap", "full"),
)
DG_JIT_LAZY_CODEGEN = _declare(
    "DG_JIT_LAZY_CODEGEN", bool, True,
    "Generate machine code and numba's call wrappers only for kernel entries and functions called from Python "
    "(jit/lazy_codegen.py); 0 keeps numba's eager code generation",
)
DG_JIT_NATIVE = _declare(
    "DG_JIT_NATIVE", bool, True,
    "Keep native code in the kernel cache (numba's machine code linked with the C compiler into native-*.so) and "
    "run cached kernels from it without importing numba (0: always the numba path)",
)
DG_CUBE_AMX = _declare(
    "DG_CUBE_AMX", bool, True,
    "Run the Cube on the CPU's AMX tile unit (bf16 tiles, fp32 accumulation) when both operands are exact in bf16 "
    "(BF16, FP8, FP4) and the CPU and kernel offer AMX-BF16 (0: the next path, DG_CUBE_DPBF16's or the fp32 FMA "
    "micro-kernel)",
)
DG_CUBE_DPBF16 = _declare(
    "DG_CUBE_DPBF16", bool, True,
    "Where the AMX path is not taken: run the Cube on the CPU's AVX512-BF16 dot products (VDPBF16PS: bf16 pairs, "
    "fp32 accumulation) when both operands are exact in bf16 and the CPU and LLVM offer AVX512-BF16 (0: the fp32 "
    "FMA micro-kernel)",
)
DG_MEGA_MOE_FUSED = _declare(
    "DG_MEGA_MOE_FUSED", bool, True,
    "Run fp8_fp4_mega_moe as the fused mixed kernel (templates/mega_moe.asc.j2, one launch per rank; 0: the host "
    "pipeline of kernels/mega_moe.py's phases around the M-grouped GEMM kernels, the same bits)",
)
DG_SYNC_CHECK = _declare(
    "DG_SYNC_CHECK", bool, False,
    "Synchronisation checker: kernels record every SetFlag/WaitFlag/PipeBarrier and cross-core flag and raise "
    "SyncCheckError on a protocol error (separate cache entries)",
)


def check_environment() -> None:
    """Parse every declared variable that is set; one ValueError naming each invalid one (variable and value)."""
    problems = []
    for var in ENV_VARS.values():
        try:
            var.get()
        except ValueError as e:
            problems.append(str(e))
    if problems:
        raise ValueError("\n".join(problems))


# NOTES: at import, so a bad value (DG_JIT_DEBUG=yes) fails before any work, with the variable in the message, instead
# of from deep inside the first GEMM call; get() still checks a value set after the import.
check_environment()
