"""deep_gemm: DeepGEMM-Ascend's API on numpy arrays (and CPU torch tensors), run on CPU cores standing in for Ascend
AI cores.

Re-exports only. Names resolve lazily on first use, so ``import deep_gemm`` neither imports numba nor compiles.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {}


def _export(module: str, *names: str) -> None:
    for name in names:
        _EXPORTS[name] = module


# Runtime
_export(
    ".runtime",
    "set_num_ai_cores", "get_num_ai_cores", "set_num_sms", "get_num_sms", "set_npu_arch", "get_npu_arch",
    "get_arch_spec", "set_mk_alignment_for_contiguous_layout", "get_mk_alignment_for_contiguous_layout",
    "get_theoretical_mk_alignment_for_contiguous_layout", "use_deterministic_algorithms",
    "get_deterministic_algorithms", "runtime_scope", "set_dry_run", "get_dry_run", "dry_run",
)

# FP8/FP4 GEMMs
_export(
    ".api.gemm",
    "fp8_fp4_gemm_nt", "fp8_fp4_gemm_nn", "fp8_fp4_gemm_tn", "fp8_fp4_gemm_tt",
    "fp8_gemm_nt", "fp8_gemm_nn", "fp8_gemm_tn", "fp8_gemm_tt",
    # CUDA DeepGEMM's per-head column gap (its attention.hpp)
    "fp8_gemm_nt_skip_head_mid",
    # BF16 GEMMs
    "bf16_gemm_nt", "bf16_gemm_nn", "bf16_gemm_tn", "bf16_gemm_tt",
)

# Grouped GEMMs for mixture-of-experts (FP8/FP4, then BF16; CUDA DeepGEMM's legacy masked names last)
_export(
    ".api.grouped",
    "m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nn_contiguous",
    "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nn_contiguous",
    "m_grouped_fp8_fp4_gemm_nt_masked", "m_grouped_fp8_gemm_nt_masked",
    "k_grouped_fp8_gemm_tn_contiguous", "k_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_bf16_gemm_nt_contiguous", "m_grouped_bf16_gemm_nn_contiguous", "m_grouped_bf16_gemm_nt_masked",
    "k_grouped_bf16_gemm_tn_contiguous",
    "fp8_m_grouped_gemm_nt_masked", "bf16_m_grouped_gemm_nt_masked",
)

# Einsum and batched GEMMs
_export(".api.einsum", "einsum", "fp8_einsum", "fp8_bmm", "bf16_bmm")

# Attention: the sparse-attention indexer's MQA logits (CUDA DeepGEMM's legacy name last)
_export(
    ".api.attention",
    "fp8_fp4_mqa_logits", "get_paged_mqa_logits_metadata", "fp8_fp4_paged_mqa_logits", "build_paged_kv_cache",
    "fp8_mqa_logits", "fp8_paged_mqa_logits",
)

# FlashMLA's sparse attention (decode on the co-located FP8 KV cache, prefill) and its cache quantisers
_export(".api.flash_mla", "get_mla_metadata", "flash_mla_with_kvcache", "flash_mla_sparse_fwd", "FlashMLASchedMeta")
_export(".testing.flash_mla_reference", "quantize_k_cache", "dequantize_k_cache", "abs_indices2indices_in_kvcache")

# Reference GEMMs (numpy), the cross-check DeepGEMM-Ascend runs against ACLNN
_export(
    ".api.reference",
    "aclnn_fp8_fp4_gemm_nt", "aclnn_fp8_fp4_gemm_nn", "aclnn_fp8_fp4_gemm_tn", "aclnn_fp8_fp4_gemm_tt",
    "aclnn_bf16_gemm_nt", "aclnn_bf16_gemm_nn", "aclnn_bf16_gemm_tn", "aclnn_bf16_gemm_tt",
    "cublaslt_gemm_nt", "cublaslt_gemm_nn", "cublaslt_gemm_tn", "cublaslt_gemm_tt",
    "aclnn_m_grouped_fp8_fp4_gemm_nt_contiguous", "aclnn_m_grouped_fp8_fp4_gemm_nn_contiguous",
    "aclnn_m_grouped_fp8_fp4_gemm_nt_masked", "aclnn_k_grouped_fp8_gemm_tn_contiguous",
    "aclnn_m_grouped_bf16_gemm_nt_contiguous", "aclnn_m_grouped_bf16_gemm_nn_contiguous",
    "aclnn_m_grouped_bf16_gemm_nt_masked", "aclnn_k_grouped_bf16_gemm_tn_contiguous",
    "aclnn_fp8_bmm", "aclnn_bf16_bmm", "aclnn_einsum", "aclnn_fp8_einsum",
)

# Layout
_export(
    ".utils.layout",
    "transform_sf_into_required_layout", "transform_k_grouped_sf_into_required_layout",
    "unpack_sf_from_required_layout",
)

# CUDA DeepGEMM's TMA-aligned scale layouts (the GEMMs accept what they produce)
_export(
    ".utils.tma",
    "get_tma_aligned_size", "get_mn_major_tma_aligned_tensor", "get_mn_major_tma_aligned_packed_ue8m0_tensor",
    "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor",
)

# Locality domains (no-ops on Ascend: one domain)
_export(
    ".locality_domain",
    "get_num_locality_domains", "is_localization_available", "localize", "is_localized", "destroy_localizer",
)

# HyperConnection
_export(".api.hc_prenorm", "tf32_hc_prenorm_gemm")

# Sparse attention: DeepSelect's top-k (deep_gemm.deep_select mirrors the deep_select package)
_export(".api.topk", "topk", "get_stride_requirement", "set_topk_platform", "get_topk_platform")

# Mega MoE
_export(".api.mega_moe", "SymmBuffer", "get_symm_buffer_size_for_mega_moe", "transform_weights_for_mega_moe",
        "fp8_fp4_mega_moe", "aclnn_fp8_fp4_mega_moe")

# Expert parallelism on simulated ranks: symmetric buffers, DeepEP's dispatch / combine, TileKernels' MoE helpers
_export(".ep", "SymmetricBuffer", "ElasticBuffer", "EPHandle", "RankFailedError")
_export(
    ".ep.tilekernels",
    "get_fused_mapping", "expand_to_fused", "expand_to_fused_with_sf", "reduce_fused",
    "swiglu_forward_and_per_token_cast",
)

# Chip model
_export(
    ".estimate",
    "estimate_gemm", "GemmEstimate", "estimate_mqa_logits", "estimate_paged_mqa_logits", "MqaEstimate",
    "estimate_hc_prenorm_gemm", "HcPrenormEstimate", "estimate_flash_mla_with_kvcache", "estimate_flash_mla_sparse_fwd",
    "FlashMlaEstimate", "estimate_mega_moe", "MegaMoeEstimate",
)

# Submodules
# NOTES: deep_gemm.epilogue holds DeepGEMM-Ascend's epilogue classes (Epilogue, Identity, Alpha, FP8Quantization).
_SUBMODULES = (
    "utils", "testing", "heuristics", "jit", "device", "kernels", "api", "envs", "runtime", "epilogue", "estimate",
    "deep_select", "ep",
)


# NOTES: every exported function but the runtime controls (they take no arrays) takes CPU torch tensors wherever it
# takes numpy arrays, zero-copy both ways (deep_gemm/_torch.py); torch is never imported for it.
_NO_ARRAYS = (".runtime",)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        if _EXPORTS[name] not in _NO_ARRAYS:
            from ._torch import accepts_torch

            value = accepts_torch(value, __name__ if getattr(value, "__name__", None) in _EXPORTS else None)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'deep_gemm' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBMODULES))


__all__ = sorted(_EXPORTS)
