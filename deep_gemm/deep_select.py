"""DeepSelect's package interface on deep_gemm's top-k: ``from deep_gemm import deep_select`` stands in for
``import deep_select`` (``deep_select.topk``, ``deep_select.get_stride_requirement``). Re-exports only; the
functions take CPU torch tensors as every deep_gemm function does.
"""

from __future__ import annotations

from .api.topk import get_stride_requirement, get_topk_platform, set_topk_platform, topk

__all__ = ["topk", "get_stride_requirement", "set_topk_platform", "get_topk_platform"]

from ._torch import wrap_exports as _wrap_exports  # noqa: E402

_wrap_exports(globals(), __all__, __name__)
