"""The JIT: render Ascend-C-style templates (jinja2), translate them (tree-sitter-cpp) to Python calling
deep_gemm.device intrinsics, compile with numba, cache in memory and on disk. Knows nothing of GEMM.

Importing this package imports neither numba nor jinja2; build() imports jinja2 when it renders a kernel and
numba when it compiles one or runs it without native code.
"""

from .compile import CompiledKernel, add_listener, build, clear_memory_cache, stats
from .errors import CacheCorruptError, CompileError, JITError, KernelRunError, RenderError, TranslateError
from .signature import ArgumentError, EntrySignature

__all__ = [
    "build", "CompiledKernel", "stats", "add_listener", "clear_memory_cache", "render",
    "JITError", "RenderError", "TranslateError", "CompileError", "CacheCorruptError", "KernelRunError", "ArgumentError",
    "EntrySignature",
]


def __getattr__(name: str):
    if name == "render":  # jinja2 is imported on first use
        from .render import render

        return render
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
