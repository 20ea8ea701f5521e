"""The process-wide numba settings the fast kernels need, applied once before deep_gemm's first compile.

NOTES: numba ships with LLVM's SLP vectorizer off, which leaves register-tiled micro-kernels scalar; and on
AVX-512 hosts LLVM prefers 256-bit vectors unless told otherwise. Both settings are read when numba builds its
CPU target (the first compile in the process) and are part of numba's cache key. Set DG_JIT_FAST_MATH_SETUP=0
to leave numba exactly as the user configured it. Three compile-time savings live here too: generated kernels and
thin device wrappers skip numba's second full module optimization (DG_JIT_KERNEL_OPT, see
_install_cheap_kernel_link), only kernel entries get machine code at once (DG_JIT_LAZY_CODEGEN, jit/lazy_codegen.py)
and numba's first use does not import scipy (DG_JIT_DEFER_SCIPY, see _defer_scipy_probe).
"""

from __future__ import annotations

import os
import sys
import threading

from .. import envs

# NOTES: re-exported: the rest of the JIT reads them from here or from numba_facts (the leaf)
from .numba_facts import KERNEL_MODULE_MARK, NUMBA_INTERNALS_VERSION, code_owner, numba_internals_known  # noqa: F401

_lock = threading.Lock()
_applied: dict[str, object] | None = None


def host_cpu_features() -> str:
    """The host's LLVM feature string, as numba would use it."""
    from .native import host_cpu

    return host_cpu()[1]


def apply_numba_settings() -> dict[str, object]:
    """Turn on SLP vectorization and full-width vectors, and the kernel compile-time settings (idempotent).
    Returns what was applied (the codegen-relevant entries are part of the JIT cache key)."""
    global _applied
    with _lock:
        if _applied is not None:
            return _applied
        import numba

        from .numba_cache import install as install_verified_cache

        # NOTES: before any deep_gemm function is decorated: their cache=True then uses deep_gemm's verified cache
        # under the kernel cache root (numba_cache.py); independent of DG_JIT_FAST_MATH_SETUP.
        install_verified_cache()
        _install_interrupt_safe_refresh()
        if numba_internals_known():
            from .native import install_object_capture

            install_object_capture()
        deferred = _defer_scipy_probe()
        if not envs.DG_JIT_FAST_MATH_SETUP.get():
            _applied = {"enabled": False}
            return _applied
        numba.config.SLP_VECTORIZE = 1
        applied: dict[str, object] = {"enabled": True, "SLP_VECTORIZE": 1}
        if envs.DG_JIT_KERNEL_OPT.get() == "cheap":
            applied["KERNEL_OPT"] = "cheap" if _install_cheap_kernel_link() else "full (numba internals differ)"
        from .lazy_codegen import install as install_lazy_codegen

        applied["lazy_codegen"] = install_lazy_codegen()
        if not numba.config.CPU_FEATURES:
            features = host_cpu_features()
            if "+avx512f" in features.split(","):
                numba.config.CPU_FEATURES = features + ",-prefer-256-bit"
                applied["CPU_FEATURES"] = numba.config.CPU_FEATURES
        _applied = applied
        if deferred:
            applied["scipy_probe_deferred"] = True
        return applied


CODEGEN_SETTINGS = ("enabled", "SLP_VECTORIZE", "CPU_FEATURES", "KERNEL_OPT")


def codegen_settings() -> dict[str, object]:
    """The settings of apply_numba_settings() that change generated code (part of the JIT cache key), without
    importing numba when it is not loaded yet: what apply_numba_settings() will apply is predicted from the
    environment, numba's installed version and the host's CPU features (LLVM's view, through llvmlite).

    NOTES: a cached kernel's key must be computable in a process that never imports numba (its native code runs
    without it). Once numba is loaded (or the settings applied) the applied values are used; a test checks that
    the prediction equals them.
    """
    if _applied is not None or "numba" in sys.modules:
        return {k: v for k, v in apply_numba_settings().items() if k in CODEGEN_SETTINGS}
    if not envs.DG_JIT_FAST_MATH_SETUP.get():
        return {"enabled": False}
    out: dict[str, object] = {"enabled": True, "SLP_VECTORIZE": 1}
    if envs.DG_JIT_KERNEL_OPT.get() == "cheap":
        from .cache import tool_versions

        known = tool_versions()["numba"].startswith(NUMBA_INTERNALS_VERSION)
        out["KERNEL_OPT"] = "cheap" if known else "full (numba internals differ)"
    # numba reads NUMBA_CPU_FEATURES into numba.config.CPU_FEATURES; apply_numba_settings then leaves it alone.
    if not os.environ.get("NUMBA_CPU_FEATURES"):
        features = host_cpu_features()
        if "+avx512f" in features.split(","):
            out["CPU_FEATURES"] = features + ",-prefer-256-bit"
    return out


# NOTES: a device library is a thin wrapper when its linked callees are at least this many times its own code
# (LLVM bitcode bytes before and after linking)
THIN_WRAPPER_RATIO = 4


def _install_cheap_kernel_link() -> bool:
    """Skip numba's second, full module optimization where it would only optimize code again: for libraries of
    generated kernels, and for thin device wrappers.

    NOTES: numba links the already-optimized IR of every callee into each caller's library and runs two O3 module
    pipelines over the result (a "cheap" one, then the full one) before generating code. For a translated kernel
    that is ~95 % device code (optimized once already in its own library), so the full pass costs a third of each
    specialization's compile. A device function whose own code is a small part of its library (a wrapper that
    checks its arguments and calls a pointer-based core: load_l0b, mmad, DataCopyPad, the head sums ...) is the
    same case on a smaller scale, once per level of a call chain (ragged MQA logits, cold cache: ~0.7 s of the
    first call's ~1.7 s of module passes went to such libraries). Both get numba's cheap module pipeline only (it
    still inlines and vectorizes loops); the code they link was fully optimized in its own library. Device
    functions with their own loops keep numba's two passes. DG_JIT_KERNEL_OPT=full restores numba's behaviour.
    """
    from numba.core import codegen

    cls = codegen.CPUCodeLibrary
    if getattr(cls, "_dg_cheap_kernel_link", False):
        return True
    # NOTES: this replaces private numba methods; it is installed only where numba's internals have the shape it
    # was written against (numba_internals_known), and numba keeps its own behaviour anywhere else.
    pass_manager = getattr(codegen.CPUCodegen, "_module_pass_manager", None)
    original = getattr(cls, "_optimize_final_module", None)
    original_finalize = getattr(cls, "finalize", None)
    if pass_manager is None or original is None or original_finalize is None or not numba_internals_known():
        return False

    def finalize(self):
        # NOTES: numba links the callees in here; until then the final module holds the library's own code (only
        # deep_gemm's device functions are measured: numba optimizes anyone else's code as it always does)
        if self._linking_libraries and code_owner(self._final_module) == "device":
            self._dg_own_bytes = len(self._final_module.as_bitcode())
        return original_finalize(self)

    def _optimize_final_module(self):
        kernel = code_owner(self._final_module) == "kernel"
        own_bytes = getattr(self, "_dg_own_bytes", None)
        thin = (not kernel and own_bytes is not None
                and own_bytes * THIN_WRAPPER_RATIO <= len(self._final_module.as_bitcode()))
        self._dg_module_passes = "cheap" if kernel or thin else "numba"
        if not kernel and not thin:
            return original(self)
        cg = self._codegen
        mpm, mpb = cg._module_pass_manager(loop_vectorize=cg._loopvect, slp_vectorize=False, opt=cg._opt_level,
                                           cost="cheap")
        mpm.run(self._final_module, mpb)

    cls.finalize = finalize
    cls._optimize_final_module = _optimize_final_module
    cls._dg_cheap_kernel_link = True
    return True


def _install_interrupt_safe_refresh() -> None:
    """Hold SIGINT while numba installs new typing and lowering registrations (its contexts' refresh()).

    NOTES: refresh() takes each registration from a generator and then inserts it; a KeyboardInterrupt between the
    two loses that registration for the life of the process. The first compile of a process installs thousands of
    them (some 100 ms), so a Ctrl-C there left numba unable to type np.empty ("Unknown attribute '_allocate'") and
    every later kernel failed. Held, the interrupt is raised right after the refresh, inside the same compile.
    """
    from numba.core import base
    from numba.core.typing import context

    from .interrupt import HeldSigint

    for cls in (context.BaseContext, base.BaseContext):
        if cls.__dict__.get("_dg_held_refresh"):
            continue
        original = cls.refresh

        def refresh(self, _original=original):
            with HeldSigint():
                return _original(self)

        cls.refresh = refresh
        cls._dg_held_refresh = True


def _defer_scipy_probe() -> bool:
    """Import numba.np.arraymath with scipy.linalg hidden, so numba's first use does not import scipy.

    NOTES: numba imports scipy.linalg (about 1 s cold on these machines) when its CPU target first loads, only to
    set a flag that lets np.cov/np.corrcoef use a BLAS inner product. Every other BLAS/LAPACK-backed numba
    function imports scipy itself when it is compiled, so hiding it for this one import changes nothing else.
    Done only when neither module is loaded yet; DG_JIT_DEFER_SCIPY=0 leaves numba alone.
    """
    blas = "scipy.linalg.cython_blas"
    if not envs.DG_JIT_DEFER_SCIPY.get() or "numba.np.arraymath" in sys.modules or blas in sys.modules:
        return False
    sys.modules[blas] = None  # an import of it now raises ImportError
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        if sys.modules.get(blas, 0) is None:
            del sys.modules[blas]
    return True


def vector_width_bits() -> int:
    """Widest float vector the host runs at full rate: 512 (AVX-512), 256 (AVX2) or 128."""
    features = set(host_cpu_features().split(","))
    if "+avx512f" in features:
        return 512
    if "+avx2" in features or "+avx" in features:
        return 256
    return 128
