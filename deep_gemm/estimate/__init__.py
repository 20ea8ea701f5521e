"""The chip model's public face: what each call would cost on an Ascend NPU, one module per kernel family.

``estimate_gemm`` (dense, grouped, batched GEMMs; ``python -m deep_gemm.estimate M N K``), ``estimate_mqa_logits``
and ``estimate_paged_mqa_logits``, ``estimate_hc_prenorm_gemm``, ``estimate_flash_mla_with_kvcache`` and
``estimate_flash_mla_sparse_fwd``, ``estimate_mega_moe`` (``python -m deep_gemm.estimate.mega_moe``). The models
themselves live in ``deep_gemm.heuristics`` (the same arithmetic the kernels' config choice uses); every estimator
resolves its arch and core count through ``_target.resolve_target``. Predictions only: nothing is run or measured.
"""

from ._target import MAX_SIZE
from .flash_mla import FlashMlaEstimate, estimate_flash_mla_sparse_fwd, estimate_flash_mla_with_kvcache
from .gemm import DTYPES, MAX_TENSOR_BYTES, GemmEstimate, estimate_gemm, main
from .hc_prenorm import HcPrenormEstimate, estimate_hc_prenorm_gemm
from .mega_moe import MegaMoeEstimate, estimate_mega_moe
from .mqa_logits import MqaEstimate, estimate_mqa_logits, estimate_paged_mqa_logits

__all__ = [
    "DTYPES", "MAX_SIZE", "MAX_TENSOR_BYTES",
    "FlashMlaEstimate", "GemmEstimate", "HcPrenormEstimate", "MegaMoeEstimate", "MqaEstimate",
    "estimate_flash_mla_sparse_fwd", "estimate_flash_mla_with_kvcache", "estimate_gemm", "estimate_hc_prenorm_gemm",
    "estimate_mega_moe", "estimate_mqa_logits", "estimate_paged_mqa_logits", "main",
]
