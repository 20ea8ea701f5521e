"""Grouped GEMM entry points for mixture-of-experts layers, with DeepGEMM-Ascend's names, argument order and defaults:
M-grouped contiguous (psum layout, and CUDA DeepGEMM's per-row layout), M-grouped masked, K-grouped contiguous.

Re-exports only (every name this module ever defined keeps working): the shared operand checks and group layouts
live in api/grouped_operands.py, the M-grouped plans and calls in api/m_grouped.py, the K-grouped ones in
api/k_grouped.py.
"""

from __future__ import annotations

from .grouped_operands import (  # noqa: F401
    _KIND_NAMES,
    _STORAGE,
    INT32,
    SF_LAYOUT_ALIGNMENT,
    GroupOperand,
    _check_int32_vector,
    _check_out,
    _check_positive_int,
    _group_sf,
    _kind_of,
    _padding_mask,
    _rows_view,
    _scales,
    _split_pair,
    _values,
    _zero_row_sf_pair,
    check_grouped_fp8_out,
    check_grouped_out,
    make_group_operand,
    per_row_groups,
    planned_group_rows,
    psum_groups,
)
from .k_grouped import (  # noqa: F401
    KGroupedPlan,
    _expand_compact_k_grouped_sf,
    _k_group_launch,
    _k_group_sf_blocks,
    _k_grouped_sf_any_alignment,
    _rebalance_k_groups,
    k_grouped_bf16_gemm_tn_contiguous,
    k_grouped_fp8_gemm_nt_contiguous,
    k_grouped_fp8_gemm_tn_contiguous,
    plan_k_grouped,
    run_k_grouped,
)
from .m_grouped import (  # noqa: F401
    MGroupedPlan,
    _a_rows,
    _check_pair_kinds,
    _launch,
    _launches,
    _live_rows,
    _operands_a_b,
    _reference_m_grouped,
    _store_fp8_rows,
    bf16_m_grouped_gemm_nt_masked,
    check_stacked_pair,
    fp8_m_grouped_gemm_nt_masked,
    m_grouped_bf16_gemm_nn_contiguous,
    m_grouped_bf16_gemm_nt_contiguous,
    m_grouped_bf16_gemm_nt_masked,
    m_grouped_fp8_fp4_gemm_nn_contiguous,
    m_grouped_fp8_fp4_gemm_nt_contiguous,
    m_grouped_fp8_fp4_gemm_nt_masked,
    m_grouped_fp8_gemm_nn_contiguous,
    m_grouped_fp8_gemm_nt_contiguous,
    m_grouped_fp8_gemm_nt_masked,
    plan_m_grouped_contiguous,
    plan_m_grouped_masked,
    rebalance_m_grouped_sf,
    run_m_grouped,
    store_rows,
)

__all__ = [
    "m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nn_contiguous",
    "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nn_contiguous",
    "m_grouped_bf16_gemm_nt_contiguous", "m_grouped_bf16_gemm_nn_contiguous",
    "m_grouped_fp8_fp4_gemm_nt_masked", "m_grouped_fp8_gemm_nt_masked", "m_grouped_bf16_gemm_nt_masked",
    "fp8_m_grouped_gemm_nt_masked", "bf16_m_grouped_gemm_nt_masked",
    "k_grouped_fp8_gemm_tn_contiguous", "k_grouped_fp8_gemm_nt_contiguous", "k_grouped_bf16_gemm_tn_contiguous",
]
