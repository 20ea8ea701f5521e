"""The process-wide numba settings the fast kernels need, applied once before deep_gemm's first compile.

NOTES: numba ships with LLVM's SLP vectorizer off, which leaves register-tiled micro-kernels scalar; and on
AVX-512 hosts LLVM prefers 256-bit vectors unless told otherwise. Both settings are read when numba builds its
CPU target (the first compile in the process) and are part of numba's cache key. Set DG_JIT_FAST_MATH_SETUP=0
to leave numba exactly as the user configured it.
"""

from __future__ import annotations

import threading

from .. import envs

_lock = threading.Lock()
_applied: dict[str, object] | None = None


def host_cpu_features() -> str:
    """The host's LLVM feature string, as numba would use it."""
    import llvmlite.binding as llvm

    return llvm.get_host_cpu_features().flatten()


def apply_numba_settings() -> dict[str, object]:
    """Turn on SLP vectorization and full-width vectors (idempotent). Returns what was applied."""
    global _applied
    with _lock:
        if _applied is not None:
            return _applied
        import numba

        if not envs.DG_JIT_FAST_MATH_SETUP.get():
            _applied = {"enabled": False}
            return _applied
        numba.config.SLP_VECTORIZE = 1
        applied: dict[str, object] = {"enabled": True, "SLP_VECTORIZE": 1}
        if not numba.config.CPU_FEATURES:
            features = host_cpu_features()
            if "+avx512f" in features.split(","):
                numba.config.CPU_FEATURES = features + ",-prefer-256-bit"
                applied["CPU_FEATURES"] = numba.config.CPU_FEATURES
        _applied = applied
        return applied


def vector_width_bits() -> int:
    """Widest float vector the host runs at full rate: 512 (AVX-512), 256 (AVX2) or 128."""
    features = set(host_cpu_features().split(","))
    if "+avx512f" in features:
        return 512
    if "+avx2" in features or "+avx" in features:
        return 256
    return 128
