"""GEMM epilogues, as DeepGEMM-Ascend's ``deep_gemm.epilogue``: what the kernel does to the fp32 accumulator tile
before D is written. Pass one as ``epilogue=`` to the dense FP8/FP4 and BF16 GEMMs; the M-grouped contiguous and
masked GEMMs, bmm and einsum take Identity() and FP8Quantization(sfd) (their sfd layouts: api/grouped.py
``check_grouped_fp8_out``).

``Identity()``: D = A @ B^T (the default). ``Alpha(alpha)``: D = alpha * A @ B^T. ``FP8Quantization(sfd)``: D is
float8_e4m3fn and every row's every 32 columns get one UE8M0 scale (amax-based, as
``deep_gemm.utils.per_token_cast_to_fp8(..., use_ue8m0=True, gran_k=32)``), packed two to an int16 in ``sfd`` of
shape [M, N/64] with strides (1, M); N must be a multiple of 64 and there is no C. ``alpha``, an epilogue and FP8
output exclude each other, as upstream. The checks of the arguments happen in the GEMM call (before anything is
written); these classes only carry the parameters.
"""

from __future__ import annotations

import math
import sys

import numpy as np

__all__ = ["Epilogue", "Identity", "Alpha", "FP8Quantization"]


def _is_torch_tensor(x: object) -> bool:
    # NOTES: asked of sys.modules, so torch is never imported here (and deep_gemm._torch, the boundary layer above the
    # API, is not imported by this lower one)
    tensor = getattr(sys.modules.get("torch"), "Tensor", None)
    return tensor is not None and isinstance(x, tensor)


class Epilogue:
    """Base class of the GEMM epilogues."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Identity(Epilogue):
    """D = A @ B^T (+ C): no epilogue operator."""


class Alpha(Epilogue):
    """D = alpha * A @ B^T (+ C), alpha a finite float (applied to the fp32 accumulator before rounding)."""

    def __init__(self, alpha: float):
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)):
            raise TypeError(f"Alpha(alpha): alpha must be a float, got {type(alpha).__name__}: {alpha!r}")
        if not math.isfinite(float(alpha)):
            raise ValueError(f"Alpha(alpha): alpha must be finite, got {alpha!r}")
        self.alpha = float(alpha)

    def __repr__(self) -> str:
        return f"Alpha({self.alpha!r})"


class FP8Quantization(Epilogue):
    """D in float8_e4m3fn with one UE8M0 scale per row per 32 columns, written to ``sfd``: int16 [M, N/64] with
    strides (1, M) (the Ascend scale layout: the low byte is the scale of the even 32 columns, the high byte of
    the odd ones). D = codes * scale reproduces the fp32 GEMM output to FP8 precision."""

    def __init__(self, sfd: np.ndarray):
        if not isinstance(sfd, np.ndarray) and not _is_torch_tensor(sfd):
            raise TypeError(f"FP8Quantization(sfd): sfd must be a numpy.ndarray or a CPU torch tensor, got "
                            f"{type(sfd).__name__}")
        self.sfd = sfd

    def __repr__(self) -> str:
        return f"FP8Quantization(sfd: {self.sfd.dtype}{list(self.sfd.shape)})"


def is_fp8_output(epilogue: object) -> bool:
    """Whether ``epilogue`` asks for FP8 output; TypeError for anything that is neither None nor an Epilogue."""
    if epilogue is not None and not isinstance(epilogue, Epilogue):
        raise TypeError(f"epilogue must be a deep_gemm.epilogue.Epilogue or None, got {type(epilogue).__name__}: "
                        f"{epilogue!r}")
    return isinstance(epilogue, FP8Quantization)


def check_epilogue(epilogue: object, alpha: object, d: np.ndarray, c: object, m: int, n: int):
    """Validate an epilogue call of a dense GEMM; returns (alpha as float or None, sfd or None). Writes nothing.

    Rules (as upstream): ``epilogue`` is None or an Epilogue; Alpha(...) excludes ``alpha``; FP8Quantization needs
    D float8_e4m3fn [M, N] (unit-stride rows), N % 64 == 0, no C, no alpha, sfd int16 [M, N/64] with strides
    (1, M) (bytes (2, 2M)), not overlapping D; a float8_e4m3fn D needs FP8Quantization.
    """
    from .utils.formats import FP8_DTYPE

    if epilogue is not None and not isinstance(epilogue, Epilogue):
        raise TypeError(f"epilogue must be a deep_gemm.epilogue.Epilogue or None, got {type(epilogue).__name__}: "
                        f"{epilogue!r}")
    is_fp8_d = isinstance(d, np.ndarray) and d.dtype == FP8_DTYPE
    if isinstance(epilogue, Alpha):
        if alpha is not None:
            raise ValueError(f"alpha={alpha!r} and epilogue={epilogue!r} exclude each other; pass one of them")
        alpha = epilogue.alpha
    if not isinstance(epilogue, FP8Quantization):
        if is_fp8_d:
            raise TypeError(f"d has dtype {d.dtype}: FP8 output needs epilogue=FP8Quantization(sfd), got "
                            f"epilogue={epilogue!r}")
        return alpha, None
    # FP8Quantization
    if alpha is not None:
        raise ValueError(f"alpha={alpha!r} and FP8 output (epilogue={epilogue!r}) exclude each other")
    if c is not None:
        raise ValueError("FP8 output (epilogue=FP8Quantization) takes no c: the kernel cannot accumulate into "
                         f"FP8 codes (got c with shape {getattr(c, 'shape', None)})")
    if not isinstance(d, np.ndarray) or d.dtype != FP8_DTYPE:
        raise TypeError(f"d must be float8_e4m3fn with epilogue=FP8Quantization, got d.dtype="
                        f"{getattr(d, 'dtype', type(d).__name__)}")
    if n % 64:
        raise ValueError(f"FP8 output needs N % 64 == 0 (one int16 sfd element per 64 columns), got n={n}")
    sfd = epilogue.sfd
    if sfd.dtype != np.int16:
        raise TypeError(f"sfd must be int16 (two UE8M0 bytes per element), got sfd.dtype={sfd.dtype}")
    want = (m, n // 64)
    if sfd.shape != want:
        raise ValueError(f"sfd must have shape (m, n // 64) = {want}, got sfd.shape={sfd.shape}")
    if sfd.size and sfd.strides != (2, 2 * m):
        if not (m == 1 and sfd.strides[1] == 2) and not (n // 64 == 1 and sfd.strides[0] == 2):
            raise ValueError(f"sfd must be MN-major with strides (1, m) = (1, {m}) elements, got strides(bytes)="
                             f"{sfd.strides} (make it with np.empty((n // 64, m), np.int16).T)")
    if not sfd.flags.writeable:
        raise ValueError("sfd is read-only; pass a writable array")
    if np.shares_memory(sfd, d):
        raise ValueError("sfd shares memory with d; they must be separate arrays")
    return None, sfd
