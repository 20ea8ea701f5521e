"""Public helpers: number formats (FP8/FP4/BF16), DeepGEMM's quantization math, and the Ascend scale-factor layout."""

from .formats import (
    BF16_DTYPE,
    E2M1_DECODE_TABLE,
    E2M1_MAX,
    E2M1_THRESHOLDS,
    E4M3_DECODE_TABLE,
    E4M3_MAX,
    FP8_DTYPE,
    PACKED_FP4_DTYPE,
    bf16_bits_to_fp32,
    decode_e2m1,
    decode_e4m3,
    encode_e2m1,
    encode_e4m3,
    fp8_codes,
    fp32_to_bf16_bits,
    is_bf16,
    is_fp8,
    is_packed_fp4,
    pack_fp4,
    round_to_tf32,
    unpack_fp4,
)
from .layout import (
    is_required_sf_layout,
    transform_k_grouped_sf_into_required_layout,
    transform_sf_into_required_layout,
    unpack_sf_from_required_layout,
)
from .math import (
    align,
    cast_back_from_fp4,
    ceil_div,
    ceil_to_ue8m0,
    pack_ue8m0_to_int,
    per_block_cast_to_fp8,
    per_channel_cast_to_fp8,
    per_custom_dims_cast_to_fp8,
    per_token_cast_to_fp4,
    per_token_cast_to_fp8,
    transpose_packed_fp4,
    unpack_ue8m0_from_int,
)
from .tma import (  # noqa: E402
    get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor,
    get_mn_major_tma_aligned_packed_ue8m0_tensor,
    get_mn_major_tma_aligned_tensor,
    get_tma_aligned_size,
)

__all__ = [
    # Formats
    "FP8_DTYPE", "BF16_DTYPE", "PACKED_FP4_DTYPE", "E4M3_MAX", "E2M1_MAX",
    "E4M3_DECODE_TABLE", "E2M1_DECODE_TABLE", "E2M1_THRESHOLDS",
    "is_fp8", "is_packed_fp4", "is_bf16", "fp8_codes", "encode_e4m3", "decode_e4m3", "encode_e2m1", "decode_e2m1",
    "pack_fp4", "unpack_fp4", "fp32_to_bf16_bits", "bf16_bits_to_fp32", "round_to_tf32",
    # Math
    "ceil_div", "align", "ceil_to_ue8m0", "pack_ue8m0_to_int", "unpack_ue8m0_from_int",
    "per_token_cast_to_fp8", "per_channel_cast_to_fp8", "per_block_cast_to_fp8", "per_custom_dims_cast_to_fp8",
    "per_token_cast_to_fp4", "cast_back_from_fp4", "transpose_packed_fp4",
    # Layout
    "transform_sf_into_required_layout", "transform_k_grouped_sf_into_required_layout",
    "unpack_sf_from_required_layout", "is_required_sf_layout",
    # CUDA DeepGEMM's TMA-aligned scale layouts
    "get_tma_aligned_size", "get_mn_major_tma_aligned_tensor", "get_mn_major_tma_aligned_packed_ue8m0_tensor",
    "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor",
]

# NOTES: the functions above take CPU torch tensors wherever they take numpy arrays and return torch tensors for
# them, zero-copy (deep_gemm/_torch.py); the submodules keep the numpy-only originals.
from .._torch import wrap_exports as _wrap_exports  # noqa: E402

_wrap_exports(globals(), __all__, __name__)
