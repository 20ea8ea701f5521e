"""Facts about numba and the modules the JIT generates that several JIT modules need (a leaf: imports none of them):
the generated modules' name mark, whose code an LLVM module holds, and the numba release whose private internals
deep_gemm relies on.
"""

from __future__ import annotations

KERNEL_MODULE_MARK = "_dg_kernel_"  # generated kernel modules are named _dg_kernel_<name>_<digest>


def code_owner(ll_module) -> str | None:
    """Whose functions an LLVM module (llvmlite) defines: "kernel" when one is a generated kernel's, else "device"
    when one is deep_gemm's (a device module), else None (numba's own, or a user's)."""
    owner = None
    for fn in ll_module.functions:
        if fn.is_declaration:
            continue
        if KERNEL_MODULE_MARK in fn.name:
            return "kernel"
        if owner is None and "deep_gemm" in fn.name:
            owner = "device"
    return owner

# NOTES: the private numba internals used here and in cache.py (CPUCodeLibrary._optimize_final_module, the layout
# of numba's .nbi index files) were read from this release; with any other numba they are left alone.
NUMBA_INTERNALS_VERSION = "0.68."


def numba_internals_known() -> bool:
    """True when the installed numba is the release whose private internals deep_gemm was written against."""
    import numba

    return numba.__version__.startswith(NUMBA_INTERNALS_VERSION)
