"""The JIT: render Ascend-C-style templates (jinja2), translate them (tree-sitter-cpp) to Python calling
deep_gemm.device intrinsics, compile with numba, cache in memory and on disk. Knows nothing of GEMM.

Importing this package does not import numba; build() does.
"""

from .compile import CompiledKernel, add_listener, build, clear_memory_cache, stats
from .errors import CacheCorruptError, CompileError, JITError, RenderError, TranslateError
from .render import render
from .signature import ArgumentError, EntrySignature

__all__ = [
    "build", "CompiledKernel", "stats", "add_listener", "clear_memory_cache", "render",
    "JITError", "RenderError", "TranslateError", "CompileError", "CacheCorruptError", "ArgumentError", "EntrySignature",
]
