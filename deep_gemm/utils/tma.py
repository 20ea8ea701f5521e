"""CUDA DeepGEMM's TMA-aligned scale layouts, as layout utilities: code ported from CUDA DeepGEMM prepares its
scales with these, and the GEMMs here accept what they produce (fp32 MN-major, or int32-packed UE8M0).

``get_mn_major_tma_aligned_tensor``: fp32 [(G,) MN, SF_K] stored MN-major with MN padded to a multiple of 4 (the
padding is zero here). ``get_mn_major_tma_aligned_packed_ue8m0_tensor``: int32 [(G,) MN, ceil(SF_K / 4)], each
element the exponent bytes of 4 consecutive K scales (byte j = scale 4i + j), same storage. The Ascend kernels'
own layout (int16 pairs) is ``transform_sf_into_required_layout``'s.
"""

from __future__ import annotations

import numpy as np

from .math import align, ceil_div


def get_tma_aligned_size(x: int, element_size: int) -> int:
    """``x`` rounded up to a whole 16 bytes of ``element_size``-byte elements."""
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 0:
        raise TypeError(f"x must be a non-negative int, got {x!r}")
    if isinstance(element_size, bool) or not isinstance(element_size, (int, np.integer)) or element_size <= 0 \
            or 16 % element_size:
        raise ValueError(f"element_size must divide 16, got {element_size=}")
    return align(int(x), 16 // int(element_size))


def _mn_major(values: np.ndarray, dtype) -> np.ndarray:
    """[(G,) MN, K] values stored MN-major with MN padded to the TMA alignment (zeros in the padding)."""
    *lead, mn, k = values.shape
    tma_mn = get_tma_aligned_size(mn, np.dtype(dtype).itemsize)
    out = np.zeros((*lead, k, tma_mn), dtype)
    out[..., :mn] = np.swapaxes(values, -1, -2)
    return np.swapaxes(out, -1, -2)[..., :mn, :]


def _check_fp32_sf(sf: object, name: str = "sf") -> np.ndarray:
    if not isinstance(sf, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(sf).__name__}")
    if sf.dtype != np.float32 or sf.ndim not in (2, 3):
        raise TypeError(f"{name} must be float32 [(G,) MN, SF_K], got {sf.dtype} {sf.shape}")
    return sf


def get_mn_major_tma_aligned_tensor(sf: np.ndarray) -> np.ndarray:
    """fp32 scales [(G,) MN, SF_K] in the MN-major TMA-aligned layout (strides (1, tma_mn) per group). An input
    already in that layout is returned as is."""
    sf = _check_fp32_sf(sf)
    mn = sf.shape[-2]
    tma_mn = get_tma_aligned_size(mn, 4)
    if sf.strides[-2] == 4 and (sf.shape[-1] <= 1 or sf.strides[-1] == 4 * tma_mn):
        return sf
    return _mn_major(sf, np.float32)


def get_mn_major_tma_aligned_packed_ue8m0_tensor(sf: np.ndarray, psum_layout=None) -> np.ndarray:
    """fp32 power-of-two scales [(G,) MN, SF_K] as int32 [(G,) MN, ceil(SF_K / 4)]: 4 exponent bytes per element
    (the first K scale in the low byte; missing ones 0), MN-major and TMA-aligned. ``psum_layout`` is accepted for
    CUDA DeepGEMM's signature: rows in the gaps between groups are packed too (their values are never read)."""
    sf = _check_fp32_sf(sf)
    bits = np.ascontiguousarray(sf).view(np.uint32)
    if (bits & 0x807FFFFF).any():
        raise ValueError("sf must hold non-negative powers of two (UE8M0 values) to be packed")
    codes = (bits >> 23).astype(np.uint8)
    *lead, mn, k = codes.shape
    padded = np.zeros((*lead, mn, align(k, 4)), np.uint8)
    padded[..., :k] = codes
    return _mn_major(padded.view(np.int32), np.int32)


def get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(sf: np.ndarray, grouped_layout, ks_cpu, gran_k: int,
                                                            k_alignment: int = 128,
                                                            use_psum_layout: bool = False) -> np.ndarray:
    """K-grouped fp32 scales [sum_g ceil(K_g / gran_k), MN] (each group's rows one after another) as int32
    [sum_g ceil(K_g / (4 * gran_k)), MN]: every group packed 4 rows at a time on its own (a group's last element is
    zero-padded, never mixed with the next group's). ``ks_cpu``: the K of each group."""
    del grouped_layout, k_alignment, use_psum_layout  # the group sizes come from ks_cpu
    if not isinstance(sf, np.ndarray) or sf.dtype != np.float32 or sf.ndim != 2:
        raise TypeError(f"sf must be float32 [sum_sf_k, MN], got {getattr(sf, 'dtype', type(sf).__name__)}")
    if not isinstance(gran_k, (int, np.integer)) or isinstance(gran_k, bool) or gran_k not in (32, 128):
        raise ValueError(f"gran_k must be 32 or 128, got {gran_k!r}")
    ks = [int(x) for x in ks_cpu]
    rows = [ceil_div(kg, gran_k) for kg in ks]
    if sum(rows) != sf.shape[0]:
        raise ValueError(f"sf has {sf.shape[0]} scale rows; ks_cpu={ks} with gran_k={gran_k} needs {sum(rows)}")
    bits = np.ascontiguousarray(sf).view(np.uint32)
    if (bits & 0x807FFFFF).any():
        raise ValueError("sf must hold non-negative powers of two (UE8M0 values) to be packed")
    codes = (bits >> 23).astype(np.uint8)
    out, r0 = [], 0
    for n_rows in rows:
        block = np.zeros((align(n_rows, 4), sf.shape[1]), np.uint8)
        block[:n_rows] = codes[r0:r0 + n_rows]
        out.append(np.ascontiguousarray(block.reshape(-1, 4, sf.shape[1]).transpose(0, 2, 1)).view(np.int32)[..., 0])
        r0 += n_rows
    return np.concatenate(out, axis=0) if out else np.zeros((0, sf.shape[1]), np.int32)
