"""The JIT's exceptions: one base class, one subclass per phase. Each names the phase, the kernel and the cache key.

No logic lives here beyond formatting; the phases raise them (render.py, translate/, compile.py, cache.py).
"""

from __future__ import annotations


class JITError(Exception):
    """Base of every deep_gemm.jit error.

    Attributes: ``phase`` ("render", "translate", "compile", "cache", "run"), ``kernel`` (the build name or None),
    ``key`` (the cache digest or None), ``detail`` (the message without the header).
    """

    phase = "jit"

    def __init__(self, detail: str, *, kernel: str | None = None, key: str | None = None, phase: str | None = None):
        self.detail = detail
        self.kernel = kernel
        self.key = key
        if phase is not None:
            self.phase = phase
        super().__init__(detail)

    def __str__(self) -> str:
        head = f"[{self.phase}] kernel {self.kernel or '?'}"
        if self.key:
            head += f" (key {self.key})"
        return f"{head}: {self.detail}"

    def with_context(self, *, kernel: str | None = None, key: str | None = None) -> JITError:
        """Fill in kernel/key when a lower layer raised without knowing them; returns self."""
        if kernel and not self.kernel:
            self.kernel = kernel
        if key and not self.key:
            self.key = key
        return self


class RenderError(JITError):
    """jinja2 failed: missing template, undefined variable (named), template syntax error, bad constant."""

    phase = "render"


class TranslateError(JITError):
    """The rendered C++ is outside the supported subset, or does not parse. Carries a caret excerpt."""

    phase = "translate"


class CompileError(JITError):
    """Importing or numba-compiling the translated kernel failed. The entry keeps kernel.asc and kernel.py."""

    phase = "compile"


class CacheCorruptError(JITError):
    """A cache entry is unreadable or inconsistent; raised only when it cannot be rebuilt."""

    phase = "cache"


class KernelRunError(JITError):
    """A kernel's native library returned a failure status during a launch: the launch's outputs are invalid
    (possibly partly written). Carries ``status`` (the native status)."""

    phase = "run"

    def __init__(self, detail: str, *, status: int, kernel: str | None = None, key: str | None = None):
        super().__init__(detail, kernel=kernel, key=key)
        self.status = status
