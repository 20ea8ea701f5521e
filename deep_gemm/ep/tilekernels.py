"""TileKernels' MoE helpers for the unfused (baseline) MoE path, with TileKernels' signatures and contracts, in numpy
(vectorised; no numba, nothing compiled).

- ``get_fused_mapping(topk_idx, num_experts, num_expanded_tokens, alignment, force_no_sync=False)`` ->
  ``(pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_end,
  num_tokens_per_expert, num_tokens_per_expert_list)``: the expert-major fused layout, expert e's routes at
  ``[expert_start[e], expert_end[e])`` in ascending (token, slot) order, each expert's count padded to ``alignment``
  (``num_tokens_per_expert`` is the padded count, as upstream's); padding positions -1 in the ``pos_to_*`` maps;
  ``num_expanded_tokens=0`` sizes the layout exactly (the list filled), else that many positions.
- ``expand_to_fused(x, token_topk_to_pos, pos_to_expert)``, ``expand_to_fused_with_sf((x, sf), num_per_channels,
  token_topk_to_pos, pos_to_expert, use_tma_aligned_col_major_sf=False)``: rows copied to their positions, the rest 0.
- ``reduce_fused(x | (x, x_sf), topk_weights, token_topk_to_pos, fp8_format='', sf=None, out=None)``: per token,
  ``acc = fma(row, weight * x_sf, acc)`` in fp32 over the slots in order (one rounding per step: a true fused
  multiply-add), times ``sf[0]``, cast once to the input dtype or e4m3.
- ``swiglu_forward_and_per_token_cast(x, fmt, num_per_channels, pos_to_token_topk=None, topk_weights=None,
  pos_to_expert=None, use_tma_aligned_col_major_sf=False, round_sf=False, use_packed_ue8m0=False,
  swiglu_clamp_value=None, clamped_count=None, sf_clamp_min=None)`` -> ``(e4m3 [N, H], sf)``: fp32
  ``left / (1 + exp(-left)) * right`` (left clamped above, right both sides), times the route's weight, rows of
  padding (``pos_to_expert < 0``) zero, then per ``(1, num_per_channels)`` block amax (at least 1e-4) / 448 as the
  dequant scale (``round_sf``: rounded up to a power of two), values times its reciprocal, clamped to +-448, cast RNE.
- ``fma_fp32(a, b, c)``: the correctly rounded fp32 ``a * b + c`` (numpy has no fused multiply-add).

NOTES: numpy's float32 ``exp`` stands in for the GPU's; results are bitwise reproducible here, not across libms.
"""

from __future__ import annotations

import numpy as np

from ..api.guard import api_call, protect
from ..utils.formats import BF16_DTYPE, FP8_DTYPE
from ..utils.math import align
from ._checks import array, positive_int

FP8_MAX = np.float32(448.0)
FP8_SF_CLAMP_MIN = np.float32(1e-4)  # TileKernels' minimum amax for e4m3


def _int_map(value, name: str, shape: tuple) -> np.ndarray:
    value = array(value, name, len(shape))
    if value.dtype.kind not in "iu" or value.shape != shape:
        raise ValueError(f"{name} must be an integer array of shape {list(shape)}: {value.shape=} {value.dtype=}")
    return value


# ------------------------------------------------------------------------------------------------------------------
# Exact fp32 fused multiply-add


def fma_fp32(a, b, c) -> np.ndarray:
    """fp32 ``a * b + c`` rounded once (RNE): the product is exact in float64, the float64 sum's error is recovered
    exactly (two-sum), and a float64 sum that lands exactly on a float32 midpoint is resolved by that error's sign."""
    a64, b64, c64 = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, c))
    p = a64 * b64
    s = p + c64
    with np.errstate(invalid="ignore", over="ignore"):
        bv = s - p
        err = (p - (s - bv)) + (c64 - bv)
        r = s.astype(np.float32)
        r64 = r.astype(np.float64)
        diff = s - r64
        toward = np.nextafter(r, np.where(diff > 0, np.float32(np.inf), np.float32(-np.inf)).astype(np.float32))
        half = (toward.astype(np.float64) - r64) / 2
        fix = np.isfinite(s) & (diff != 0) & (diff == half) & (err != 0) & (np.sign(err) == np.sign(diff))
    return np.where(fix, toward, r).astype(np.float32)


# ------------------------------------------------------------------------------------------------------------------
# Mapping, expand, reduce


@api_call
def get_fused_mapping(topk_idx, num_experts: int, num_expanded_tokens: int, alignment: int,
                      force_no_sync: bool = False):
    """The fused expert-major layout of a routing (see the module docstring)."""
    topk_idx = array(topk_idx, "topk_idx", 2)
    if topk_idx.dtype != np.int64:
        raise TypeError(f"topk_idx must be int64: {topk_idx.dtype=}")
    num_experts = positive_int(num_experts, "num_experts")
    alignment = positive_int(alignment, "alignment")
    if isinstance(num_expanded_tokens, bool) or not isinstance(num_expanded_tokens, (int, np.integer)) \
            or num_expanded_tokens < 0:
        raise ValueError(f"num_expanded_tokens must be a non-negative int: {num_expanded_tokens=}")
    num_tokens, num_topk = topk_idx.shape
    if topk_idx.size and (topk_idx.min() < -1 or topk_idx.max() >= num_experts):
        raise ValueError(f"topk_idx must lie in [-1, num_experts): min={topk_idx.min()} max={topk_idx.max()}")

    flat = topk_idx.reshape(-1)
    counts = np.bincount(flat[flat >= 0], minlength=num_experts).astype(np.int64)
    aligned = np.array([align(int(c), alignment) for c in counts], np.int64)
    expert_end = np.cumsum(aligned)
    expert_start = expert_end - aligned
    should_sync = num_expanded_tokens == 0 and not force_no_sync
    if num_expanded_tokens == 0:
        num_expanded_tokens = (num_tokens * num_topk + (alignment - 1) * num_experts) // alignment * alignment
    if int(expert_end[-1]) > num_expanded_tokens:
        raise ValueError(f"num_expanded_tokens is too small for the routing: {num_expanded_tokens=} "
                         f"needed={int(expert_end[-1])}")

    # Positions: expert by expert, routes in ascending flat (token * K + slot) order
    routes = np.nonzero(flat >= 0)[0]
    experts = flat[routes]
    order = np.argsort(experts, kind="stable")
    routes, experts = routes[order], experts[order]
    first = np.searchsorted(experts, np.arange(num_experts))
    pos = expert_start[experts] + np.arange(routes.size) - first[experts]
    pos_to_expert = np.full(num_expanded_tokens, -1, np.int32)
    pos_to_token = np.full(num_expanded_tokens, -1, np.int32)
    pos_to_token_topk = np.full(num_expanded_tokens, -1, np.int32)
    token_topk_to_pos = np.full(num_tokens * num_topk, -1, np.int32)
    pos_to_expert[pos] = experts
    pos_to_token[pos] = routes // num_topk
    pos_to_token_topk[pos] = routes
    token_topk_to_pos[routes] = pos
    num_tokens_per_expert = aligned.astype(np.int32)
    num_tokens_per_expert_list: list[int] = []
    if should_sync:
        num_tokens_per_expert_list = num_tokens_per_expert.tolist()
        total = int(expert_end[-1])
        pos_to_expert, pos_to_token, pos_to_token_topk = pos_to_expert[:total], pos_to_token[:total], \
            pos_to_token_topk[:total]
    return (pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos.reshape(num_tokens, num_topk),
            expert_start.astype(np.int32), expert_end.astype(np.int32), num_tokens_per_expert,
            num_tokens_per_expert_list)


def _check_expand(x, token_topk_to_pos, pos_to_expert):
    x = array(x, "x", 2)
    token_topk_to_pos = array(token_topk_to_pos, "token_topk_to_pos", 2)
    token_topk_to_pos = _int_map(token_topk_to_pos, "token_topk_to_pos", (x.shape[0], token_topk_to_pos.shape[1]))
    pos_to_expert = array(pos_to_expert, "pos_to_expert", 1)
    pos = token_topk_to_pos.reshape(-1)
    if pos.size and pos.max() >= pos_to_expert.shape[0]:
        raise ValueError(f"token_topk_to_pos points past pos_to_expert: max={pos.max()} {pos_to_expert.shape=}")
    return x, pos, pos_to_expert.shape[0]


@api_call
def expand_to_fused(x, token_topk_to_pos, pos_to_expert) -> np.ndarray:
    """x [T, H] -> [num_expanded_tokens, H]: row t at every position of its slots, zeros elsewhere."""
    x, pos, num_expanded = _check_expand(x, token_topk_to_pos, pos_to_expert)
    num_topk = token_topk_to_pos.shape[1]
    out = np.zeros((num_expanded, x.shape[1]), x.dtype)
    valid = pos >= 0
    out[pos[valid]] = x[np.nonzero(valid)[0] // num_topk]
    return out


@api_call
def expand_to_fused_with_sf(x, num_per_channels: int, token_topk_to_pos, pos_to_expert,
                            use_tma_aligned_col_major_sf: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(data [T, H], sf [T, H / num_per_channels]) -> the expanded pair; sf MN-major with rows padded to 4 when
    ``use_tma_aligned_col_major_sf``."""
    if not isinstance(x, tuple) or len(x) != 2:
        raise TypeError(f"x must be a (data, sf) pair: {type(x).__name__}")
    if num_per_channels not in (32, 128):
        raise ValueError(f"num_per_channels must be 32 or 128: {num_per_channels=}")
    data, sf = x
    data, pos, num_expanded = _check_expand(data, token_topk_to_pos, pos_to_expert)
    sf = array(sf, "x[1] (sf)", 2)
    if sf.shape[0] != data.shape[0]:
        raise ValueError(f"sf must have one row per token: {sf.shape=} {data.shape=}")
    num_topk = token_topk_to_pos.shape[1]
    out = np.zeros((num_expanded, data.shape[1]), data.dtype)
    if use_tma_aligned_col_major_sf:
        out_sf = np.zeros((sf.shape[1], align(num_expanded, 4)), sf.dtype)[:, :num_expanded].T
    else:
        out_sf = np.zeros((num_expanded, sf.shape[1]), sf.dtype)
    valid = pos >= 0
    src = np.nonzero(valid)[0] // num_topk
    out[pos[valid]] = data[src]
    out_sf[pos[valid]] = sf[src]
    return out, out_sf


@api_call
def reduce_fused(x, topk_weights, token_topk_to_pos, fp8_format: str = "", sf=None, out=None) -> np.ndarray:
    """[num_expanded_tokens, H] -> [T, H]: fp32 fused multiply-adds over each token's slots in order."""
    x, x_sf = x if isinstance(x, tuple) else (x, None)
    x = array(x, "x", 2)
    num_expanded, hidden = x.shape
    token_topk_to_pos = array(token_topk_to_pos, "token_topk_to_pos", 2)
    if token_topk_to_pos.dtype.kind not in "iu":
        raise TypeError(f"token_topk_to_pos must be integer: {token_topk_to_pos.dtype=}")
    num_tokens, num_topk = token_topk_to_pos.shape
    if hidden % 256:
        raise ValueError(f"reduce_fused needs hidden % 256 == 0: {hidden=}")
    if fp8_format not in ("", "e4m3"):
        raise ValueError(f"fp8_format must be '' or 'e4m3': {fp8_format=}")
    if fp8_format == "" and sf is not None:
        raise ValueError("only FP8 output (fp8_format='e4m3') takes sf")
    out_dtype = FP8_DTYPE if fp8_format == "e4m3" else x.dtype
    if topk_weights is not None:
        topk_weights = array(topk_weights, "topk_weights", 2)
        if topk_weights.shape != (num_tokens, num_topk):
            raise ValueError(f"topk_weights must be [{num_tokens}, {num_topk}]: {topk_weights.shape=}")
    if x_sf is not None:
        x_sf = array(x_sf, "x[1] (per-row sf)", None).reshape(-1)
        if x_sf.shape[0] != num_expanded:
            raise ValueError(f"the per-row sf must have {num_expanded} entries: {x_sf.shape=}")
    if sf is not None:
        sf = np.asarray(array(sf, "sf"), np.float32).reshape(-1)
    pos = token_topk_to_pos
    if pos.size and pos.max() >= num_expanded:
        raise ValueError(f"token_topk_to_pos points past x: max={pos.max()} {num_expanded=}")
    if out is not None:
        out = array(out, "out", 2)
        if out.shape != (num_tokens, hidden) or out.dtype != out_dtype:
            raise ValueError(f"out must be {out_dtype} [{num_tokens}, {hidden}]: {out.shape=} {out.dtype=}")

    acc = np.zeros((num_tokens, hidden), np.float32)
    for k in range(num_topk):
        valid = pos[:, k] >= 0
        if not valid.any():
            continue
        rows = pos[valid, k]
        s = np.ones(rows.size, np.float32) if topk_weights is None else topk_weights[valid, k].astype(np.float32)
        if x_sf is not None:
            s = s * x_sf[rows].astype(np.float32)
        acc[valid] = fma_fp32(x[rows].astype(np.float32), s[:, None], acc[valid])
    if sf is not None:
        acc = acc * sf[0]
    result = acc.astype(out_dtype)
    if out is None:
        return result
    protect(out)
    out[...] = result
    return out


# ------------------------------------------------------------------------------------------------------------------
# SwiGLU, top-k weight and per-token FP8 cast


def _cast_sf_layout(sf_bits: np.ndarray, use_tma_aligned_col_major_sf: bool, use_packed_ue8m0: bool) -> np.ndarray:
    rows, cols = sf_bits.shape
    if not use_tma_aligned_col_major_sf:
        return sf_bits.view(np.float32)
    padded = np.zeros((align(rows, 4), align(cols, 4 if use_packed_ue8m0 else 1)), np.uint32)
    padded[:rows, :cols] = sf_bits
    if use_packed_ue8m0:
        packed = (padded >> 23).astype(np.uint8).view(np.int32)  # 4 exponent bytes per int32, first in the low byte
        return np.ascontiguousarray(packed.T).T[:rows]
    return np.ascontiguousarray(padded.view(np.float32).T).T[:rows]


@api_call
def swiglu_forward_and_per_token_cast(x, fmt: str, num_per_channels: int, pos_to_token_topk=None, topk_weights=None,
                                      pos_to_expert=None, use_tma_aligned_col_major_sf: bool = False,
                                      round_sf: bool = False, use_packed_ue8m0: bool = False,
                                      swiglu_clamp_value: float | None = None, clamped_count=None,
                                      sf_clamp_min: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """x [N, 2H] bf16/fp32 (gate | up halves) -> (e4m3 [N, H], sf); see the module docstring."""
    x = array(x, "x", 2)
    if x.dtype not in (BF16_DTYPE, np.dtype(np.float32)):
        raise TypeError(f"x must be bf16 or fp32: {x.dtype=}")
    num_rows, hidden2 = x.shape
    hidden = hidden2 // 2
    if hidden2 % 2 or hidden % 128:
        raise ValueError(f"x must be [N, 2H] with H % 128 == 0: {x.shape=}")
    if fmt != "e4m3":
        raise ValueError(f"fmt must be 'e4m3': {fmt=}")
    if num_per_channels not in (32, 128, hidden):
        raise ValueError(f"num_per_channels must be 32, 128 or the hidden size {hidden}: {num_per_channels=}")
    if use_tma_aligned_col_major_sf and num_per_channels == hidden and hidden not in (32, 128):
        raise ValueError("use_tma_aligned_col_major_sf needs num_per_channels 32 or 128")
    if use_packed_ue8m0 and not (round_sf and use_tma_aligned_col_major_sf):
        raise ValueError("use_packed_ue8m0 needs round_sf=True and use_tma_aligned_col_major_sf=True")
    if pos_to_token_topk is not None:
        pos_to_token_topk = _int_map(pos_to_token_topk, "pos_to_token_topk", (num_rows,))
        if topk_weights is None:
            raise ValueError("pos_to_token_topk needs topk_weights")
        topk_weights = array(topk_weights, "topk_weights", 2)
        if pos_to_token_topk.size and pos_to_token_topk.max() >= topk_weights.size:
            raise ValueError(f"pos_to_token_topk points past topk_weights: max={pos_to_token_topk.max()} "
                             f"{topk_weights.shape=}")
    if pos_to_expert is not None:
        pos_to_expert = _int_map(pos_to_expert, "pos_to_expert", (num_rows,))
    if clamped_count is not None:
        if swiglu_clamp_value is None:
            raise ValueError("clamped_count needs swiglu_clamp_value")
        clamped_count = array(clamped_count, "clamped_count", 1)
        if clamped_count.shape != (3,) or clamped_count.dtype != np.int64:
            raise ValueError(f"clamped_count must be int64 [3]: {clamped_count.shape=} {clamped_count.dtype=}")

    # SwiGLU in fp32
    v = x.astype(np.float32)
    left, right = v[:, :hidden], v[:, hidden:]
    if swiglu_clamp_value is not None:
        c = np.float32(swiglu_clamp_value)
        if clamped_count is not None:
            protect(clamped_count)
            clamped_count += np.array([(left > c).sum(), (right > c).sum(), (right < -c).sum()], np.int64)
        left, right = np.minimum(left, c), np.clip(right, -c, c)
    out = left / (np.float32(1) + np.exp(-left)) * right
    if pos_to_token_topk is not None:
        w = np.zeros(num_rows, np.float32)
        live = pos_to_token_topk >= 0
        w[live] = topk_weights.reshape(-1)[pos_to_token_topk[live]].astype(np.float32)
        out = out * w[:, None]
    if pos_to_expert is not None:
        out[pos_to_expert < 0] = 0

    # Per (1, num_per_channels) block cast
    blocks = out.reshape(num_rows, hidden // num_per_channels, num_per_channels)
    clamp_min = FP8_SF_CLAMP_MIN if sf_clamp_min is None else np.float32(sf_clamp_min)
    amax = np.maximum(np.abs(blocks).max(axis=-1, initial=np.float32(-1)), clamp_min)
    dequant = (amax / FP8_MAX).astype(np.float32)
    bits = dequant.view(np.uint32)
    if round_sf:
        bits = ((bits.astype(np.uint64) + 0x007FFFFF) & 0x7F800000).astype(np.uint32)
        rounded = bits.view(np.float32)
        with np.errstate(divide="ignore"):
            quant = np.where(rounded == 0, np.float32(0), np.float32(1) / rounded)
    else:
        with np.errstate(divide="ignore"):
            quant = np.where(bits == 0, np.float32(0), FP8_MAX / amax)
    q = np.clip(blocks * quant.astype(np.float32)[..., None], -FP8_MAX, FP8_MAX).reshape(num_rows, hidden)
    return q.astype(FP8_DTYPE), _cast_sf_layout(bits, use_tma_aligned_col_major_sf, use_packed_ue8m0)
