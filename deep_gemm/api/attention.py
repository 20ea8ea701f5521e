"""The sparse-attention indexer's public functions under their former module path: the ragged family lives in
api/mqa_logits.py, the paged one (with build_paged_kv_cache) in api/paged_mqa_logits.py. deep_gemm/__init__.py
exports them from here; both new modules are the home of their code.
"""

from __future__ import annotations

from .mqa_logits import LOGITS_ROW_ALIGN_BYTES, fp8_fp4_mqa_logits, fp8_mqa_logits
from .paged_mqa_logits import (
    build_paged_kv_cache,
    fp8_fp4_paged_mqa_logits,
    fp8_paged_mqa_logits,
    get_paged_mqa_logits_metadata,
)

__all__ = [
    "LOGITS_ROW_ALIGN_BYTES", "fp8_fp4_mqa_logits", "fp8_mqa_logits", "get_paged_mqa_logits_metadata",
    "fp8_fp4_paged_mqa_logits", "fp8_paged_mqa_logits", "build_paged_kv_cache",
]
