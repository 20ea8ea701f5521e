"""Mega MoE with DeepGEMM-Ascend 0.1.0's names, argument order and checks: ``SymmBuffer``,
``get_symm_buffer_size_for_mega_moe``, ``transform_weights_for_mega_moe``, ``fp8_fp4_mega_moe`` (one call per rank of
an expert-parallel group: dispatch, L1 GEMM, SwiGLU-quant, L2 GEMM, combine) and ``aclnn_fp8_fp4_mega_moe``, its
float64 reference. Checks, the shared experts of the fused path and the host pipeline's orchestration here; the fused
kernel and the host pipeline's phases are kernels/mega_moe.py's, the host pipeline's GEMMs the Cube kernels'.
"""

from __future__ import annotations

import numpy as np

from .. import envs, runtime
from ..heuristics.mega_moe import (
    BLOCK_N,
    MX_SF_DIVISOR,
    NUM_AI_CORES,
    MegaMoeDesc,
    check_mega_moe_desc,
    workspace_layout,
)
from ..kernels import mega_moe as k_mm
from ..utils.formats import BF16_DTYPE, FP8_DTYPE, PACKED_FP4_DTYPE, fp32_to_bf16_bits
from ..utils.layout import transform_sf_into_required_layout
from .guard import api_call, protect

# NOTES: the transformed FP4 scales carry +6 in the exponent: the AIV's FP4 -> FP8 conversion emits value * 2^-6.
FP4_SF_EXPONENT_SHIFT = 6
_VIEW_NAMES = ("x", "x_sf", "topk_idx", "topk_weights", "shared_l1_acts", "shared_l1_acts_sf", "shared_l2_acts",
               "shared_l2_acts_sf", "l1_acts", "l1_acts_sf", "l2_acts", "l2_acts_sf", "expert_recv_count")


def _check_str(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r}; allowed: {allowed}")


def _check_count(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r}")
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    return int(value)


def _desc(num_ranks, num_experts, num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden,
          num_shared_experts) -> MegaMoeDesc:
    values = [_check_count(n, v, 0 if n == "num_shared_experts" else 1) for n, v in (
        ("num_ranks", num_ranks), ("num_experts", num_experts), ("num_shared_experts", num_shared_experts),
        ("num_max_tokens_per_rank", num_max_tokens_per_rank), ("num_topk", num_topk), ("hidden", hidden),
        ("intermediate_hidden", intermediate_hidden))]
    desc = MegaMoeDesc(*values)
    check_mega_moe_desc(desc)
    return desc


# ---------------------------------------------------------------------------------------------------------------
# Symmetric buffer
# ---------------------------------------------------------------------------------------------------------------
def _slice_views(desc: MegaMoeDesc, buffer: np.ndarray) -> tuple:
    """Upstream's views of one rank's buffer (uint8, at least the workspace's bytes), in its order."""
    fields, size = workspace_layout(desc)
    if buffer.dtype != np.uint8 or buffer.ndim != 1 or buffer.nbytes < size:
        raise ValueError(f"buffer must be uint8 [>= {size}] (the workspace), got {buffer.dtype} {buffer.shape}")

    def view(name, dtype=None):
        f = fields[name]
        arr = buffer[f.offset:f.offset + f.nbytes].view(dtype or np.dtype(f.dtype))
        return arr.reshape(f.shape)

    x, x_sf = view("x", FP8_DTYPE), view("x_sf")
    has_shared = desc.num_shared_experts > 0
    return (x, x_sf, view("topk_idx"), view("topk_weights"), x, x_sf if has_shared else None,
            view("shared_l2_acts", FP8_DTYPE)[:, :desc.num_shared_experts * desc.intermediate_hidden]
            if has_shared else None, view("shared_l2_acts_sf") if has_shared else None,
            view("l1_acts", FP8_DTYPE), view("l1_acts_sf"), view("l2_acts", FP8_DTYPE), view("l2_acts_sf"),
            view("expert_recv_count"))


def get_symm_buffer_size_for_mega_moe(num_ranks: int, num_experts: int, num_max_tokens_per_rank: int, num_topk: int,
                                      hidden: int, intermediate_hidden: int, mma_type: str = "fp8xfp4",
                                      activation: str = "swiglu", num_shared_experts: int = 0):
    """(bytes of one rank's symmetric buffer, a function slicing a uint8 buffer into upstream's 13 views: x, x_sf,
    topk_idx, topk_weights, shared_l1_acts, shared_l1_acts_sf, shared_l2_acts, shared_l2_acts_sf, l1_acts,
    l1_acts_sf, l2_acts, l2_acts_sf, expert_recv_count). The size is a multiple of 2 MiB; upstream's checks apply."""
    _check_str("mma_type", mma_type, ("fp8xfp4",))
    _check_str("activation", activation, ("swiglu",))
    desc = _desc(num_ranks, num_experts, num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden,
                 num_shared_experts)
    return workspace_layout(desc)[1], lambda buffer: _slice_views(desc, np.asarray(buffer))


class SymmBuffer:
    """One rank's mega MoE workspace, mapped by every rank of ``group`` (collective: every rank constructs it, in
    the same order as its other symmetric allocations). ``group``: a deep_gemm.ep group, a torch.distributed
    ProcessGroup (ranks on this host) or None (the default group). ``base``: an earlier SymmBuffer whose allocation
    this configuration shares (it must fit). Views (upstream's): x float8_e4m3fn [T, H], x_sf int16 [T, H/64] (UE8M0
    pairs, row-major), topk_idx int64 [T, K] (-1: no expert), topk_weights float32 [T, K], shared_l1_acts (= x),
    shared_l1_acts_sf, shared_l2_acts [T, S*I], shared_l2_acts_sf, l1_acts / l1_acts_sf / l2_acts / l2_acts_sf (the
    activation rings), expert_recv_count int32 [R, E/R]; ``num_bytes``; ``buffer_ptrs``: every rank's buffer (uint8
    views). ``destroy()`` drops the references only (the mapping lives until every view is gone)."""

    def __init__(self, group, num_experts: int, num_max_tokens_per_rank: int, num_topk: int, hidden: int,
                 intermediate_hidden: int, num_shared_experts: int = 0, mma_type: str = "fp8xfp4",
                 activation: str = "swiglu", base: SymmBuffer | None = None):
        from ..ep import SymmetricBuffer, as_group

        _check_str("mma_type", mma_type, ("fp8xfp4",))
        _check_str("activation", activation, ("swiglu",))
        group = as_group(group)
        self.desc = _desc(group.num_ranks, num_experts, num_max_tokens_per_rank, num_topk, hidden,
                          intermediate_hidden, num_shared_experts)
        self.num_bytes = workspace_layout(self.desc)[1]
        if base is not None:
            if not isinstance(base, SymmBuffer) or base.symmetric is None:
                raise ValueError(f"base must be a live SymmBuffer, got {base!r}")
            if base.group is not group:
                raise ValueError(f"base belongs to another group: base.group={base.group!r} group={group!r}")
            if self.num_bytes > base.symmetric.nbytes:
                raise ValueError(f"the reused mega MoE config needs {self.num_bytes} bytes, but base's buffer has "
                                 f"{base.symmetric.nbytes}")
            self.symmetric = base.symmetric
        else:
            self.symmetric = SymmetricBuffer(group, self.num_bytes)
        self.group = group
        self.rank, self.num_ranks = group.rank, group.num_ranks
        (self.num_experts, self.num_max_tokens_per_rank, self.num_topk, self.hidden, self.intermediate_hidden,
         self.num_shared_experts, self.mma_type, self.activation) = (
            num_experts, num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden, num_shared_experts,
            mma_type, activation)
        self.buffer = self.symmetric.local[:self.num_bytes]
        self.buffer_ptrs = [self.symmetric.all[r, :self.num_bytes] for r in range(self.num_ranks)]
        for name, v in zip(_VIEW_NAMES, _slice_views(self.desc, self.buffer), strict=True):
            setattr(self, name, v)
        self._views = k_mm.RankViews.of(self.desc, self.rank, self.symmetric.all[:, :self.num_bytes])

    def barrier(self) -> None:
        self.symmetric.barrier()

    def destroy(self) -> None:
        for name in _VIEW_NAMES + ("buffer", "buffer_ptrs", "symmetric", "_views", "group"):
            setattr(self, name, None)

    def __repr__(self) -> str:
        d = self.desc
        return (f"SymmBuffer(rank={self.rank}, num_ranks={self.num_ranks}, E={d.num_experts}, "
                f"T={d.num_max_tokens_per_rank}, K={d.num_topk}, H={d.hidden}, I={d.intermediate_hidden}, "
                f"S={d.num_shared_experts}, "
                f"num_bytes={self.num_bytes})")


# ---------------------------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------------------------
def _exponent_pairs(sf_int16: np.ndarray) -> np.ndarray:
    """int16 UE8M0 pairs [..., MN, K/64] -> uint8 exponents [..., MN, K/64, 2] (even block first)."""
    bits = np.ascontiguousarray(sf_int16).view(np.uint16)
    return np.stack([(bits & 0xFF).astype(np.uint8), (bits >> 8).astype(np.uint8)], axis=-1)


def _pairs_to_int16(exps: np.ndarray) -> np.ndarray:
    e = exps.astype(np.uint16)
    return (e[..., 0] | (e[..., 1] << np.uint16(8))).view(np.int16)


def _transform_one(name: str, weights, n_logical: int, k: int, is_l1: bool) -> tuple[np.ndarray, np.ndarray]:
    """One linear's (w, sf) -> the kernel's blocks: [(E,) n_blocks, 256, K(/2)] and SF [(E,) n_blocks, K/64, 256]."""
    if not isinstance(weights, (tuple, list)) or len(weights) != 2:
        raise TypeError(f"{name} must be a (weights, scale factors) pair, got {type(weights).__name__}")
    w, sf = np.asarray(weights[0]), np.asarray(weights[1])
    routed = w.dtype == PACKED_FP4_DTYPE
    if not routed and w.dtype != FP8_DTYPE:
        raise TypeError(f"{name}[0] must be packed FP4 int8 [E, N, K/2] (routed) or float8_e4m3fn [N, K] (shared), "
                        f"got {w.dtype}")
    if routed and w.ndim != 3 or not routed and w.ndim != 2:
        raise ValueError(f"{name}[0] must be {'[E, N, K/2]' if routed else '[N, K]'}, got {w.shape}")
    groups = w.shape[0] if routed else 1
    n = w.shape[-2]
    k = w.shape[-1] * (2 if routed else 1)
    if n % BLOCK_N or (is_l1 and n % 2):
        raise ValueError(f"{name}[0] has N={n}: must be a multiple of {BLOCK_N}")
    if k % MX_SF_DIVISOR:
        raise ValueError(f"{name}[0] has K={k}: must be a multiple of {MX_SF_DIVISOR}")
    del n_logical
    req = transform_sf_into_required_layout(sf, n, k, (1, 1, 32), num_groups=groups if routed else None,
                                            is_sfa=False)
    req = req.reshape(groups, n, k // MX_SF_DIVISOR)
    w3 = w.reshape(groups, n, w.shape[-1])
    if is_l1:  # gate rows [0, N/2), up rows [N/2, N) -> per 256-row block 128 gate rows, then the same 128 up rows
        half = n // 2
        order = np.stack([np.arange(half).reshape(-1, 128), half + np.arange(half).reshape(-1, 128)], axis=1)
        order = order.reshape(-1)
        w3, req = w3[:, order], req[:, order]
    exps = _exponent_pairs(req)
    if routed:
        bad = (exps > 255 - FP4_SF_EXPONENT_SHIFT - 1) & (exps != 255)
        if bad.any():
            raise ValueError(f"{name}[1] holds a UE8M0 exponent in [249, 254]: the +{FP4_SF_EXPONENT_SHIFT} of the "
                             f"FP4 -> FP8 conversion would overflow (exponents must be 0..248 or 255)")
        exps = np.where(exps == 255, exps, exps + FP4_SF_EXPONENT_SHIFT).astype(np.uint8)
    sf_out = _pairs_to_int16(exps).reshape(groups, n // BLOCK_N, BLOCK_N, k // MX_SF_DIVISOR).transpose(0, 1, 3, 2)
    sf_out = np.ascontiguousarray(sf_out)
    if routed:
        w_out = np.ascontiguousarray(w3.reshape(groups, n // BLOCK_N, BLOCK_N, k // 2))
    else:  # NZ: per 256-row block, 32-byte K blocks of every row, then the next 32 bytes
        blocks = w3.reshape(n // BLOCK_N, BLOCK_N, k // 32, 32).transpose(0, 2, 1, 3)
        w_out = np.ascontiguousarray(blocks).reshape(n // BLOCK_N, BLOCK_N, k)
        sf_out = sf_out[0]
    return w_out, sf_out


def transform_weights_for_mega_moe(l1_weights, l2_weights, activation: str = "swiglu"):
    """The kernel's weight layout, once per model load. Routed: l1 = (packed FP4 int8 [E/R, 2I, H/2], scales
    [E/R, 2I, H/32] fp32 or int16 [E/R, 2I, H/64]), gate rows first then up rows; l2 = ([E/R, H, I/2], scales).
    Shared (float8_e4m3fn, no expert dim): l1 [2 S I, H], l2 [H, S I]. Returns ((w, sf), (w, sf)): L1 gate/up
    interleaved per 128 rows in 256-row blocks, [E/R, I/128, 256, H/2] int8 (shared FP8 [S I/128, 256, H] in NZ
    order: 32-byte K blocks), scales int16 [.., n_blocks, K/64, 256] (FP4 exponents + 6); L2 likewise without the
    interleave."""
    _check_str("activation", activation, ("swiglu",))
    l1 = _transform_one("l1_weights", l1_weights, 0, 0, True)
    l2 = _transform_one("l2_weights", l2_weights, 0, 0, False)
    return l1, l2


def _untransform(w: np.ndarray, sf: np.ndarray, routed: bool) -> tuple[np.ndarray, np.ndarray]:
    """The kernel layout back to GEMM operands: B [(E,) N, K(/2)] in the transformed row order (L1 interleaved) and
    its int16 scales [(E,) N, K/64] MN-major, exponents without the FP4 shift."""
    if routed:
        e, nb, _, kh = w.shape
        b = w.reshape(e, nb * BLOCK_N, kh)
        exps = _exponent_pairs(sf)  # [E, nb, K/64, 256, 2]
        exps = np.where(exps == 255, exps, exps - FP4_SF_EXPONENT_SHIFT).astype(np.uint8)
        pairs = _pairs_to_int16(exps)  # [E, nb, K/64, 256]
        sfb = pairs.transpose(0, 2, 1, 3).reshape(e, -1, nb * BLOCK_N)  # [E, K/64, N]
        return b, np.ascontiguousarray(sfb).transpose(0, 2, 1)
    nb, _, k = w.shape
    b = np.ascontiguousarray(w.reshape(nb, k // 32, BLOCK_N, 32).transpose(0, 2, 1, 3)).reshape(nb * BLOCK_N, k)
    sfb = np.ascontiguousarray(sf.transpose(1, 0, 2).reshape(-1, nb * BLOCK_N))  # [K/64, N]
    return b, sfb.T


def _check_weights(name: str, weights, shape: tuple[int, ...], routed: bool) -> None:
    if not isinstance(weights, (tuple, list)) or len(weights) != 2:
        raise TypeError(f"{name} must be a (weights, scale factors) pair from transform_weights_for_mega_moe")
    w, sf = weights
    dtype = PACKED_FP4_DTYPE if routed else FP8_DTYPE
    k = shape[-1] * (2 if routed else 1)
    sf_shape = shape[:-2] + (k // MX_SF_DIVISOR, BLOCK_N)
    if not isinstance(w, np.ndarray) or w.dtype != dtype or w.shape != shape or not w.flags.c_contiguous:
        raise ValueError(f"{name}[0] must be contiguous {dtype} {shape}, got "
                         f"{getattr(w, 'dtype', type(w).__name__)} {getattr(w, 'shape', '')}")
    if not isinstance(sf, np.ndarray) or sf.dtype != np.int16 or sf.shape != sf_shape or not sf.flags.c_contiguous:
        raise ValueError(f"{name}[1] must be contiguous int16 {sf_shape}, got "
                         f"{getattr(sf, 'dtype', type(sf).__name__)} {getattr(sf, 'shape', '')}")


# ---------------------------------------------------------------------------------------------------------------
# The call
# ---------------------------------------------------------------------------------------------------------------
def _check_call(y, l1_weights, l2_weights, sym_buffer, shared_l1_weights, shared_l2_weights,
                cumulative_local_expert_recv_stats, recipe, activation, activation_clamp, fast_math):
    """Upstream's checks (csrc/apis/mega_moe.hpp); returns (desc, num_tokens, clamp as bf16 fp32)."""
    if not isinstance(sym_buffer, SymmBuffer) or sym_buffer.symmetric is None:
        raise TypeError(f"sym_buffer must be a live SymmBuffer, got {type(sym_buffer).__name__}")
    if tuple(recipe) != (1, 1, 32):
        raise ValueError(f"recipe={tuple(recipe)}; only (1, 1, 32) is supported")
    _check_str("activation", activation, ("swiglu",))
    if fast_math is not True:
        raise ValueError(f"fast_math={fast_math!r}: the kernel has only the fast-math path (must be True)")
    cores = runtime.get_num_ai_cores()
    if cores != NUM_AI_CORES:
        raise ValueError(f"get_num_ai_cores()={cores} (arch {runtime.get_npu_arch()}): fp8_fp4_mega_moe is written "
                         f"for {NUM_AI_CORES} AI cores (upstream's num_sms == {NUM_AI_CORES})")
    d = sym_buffer.desc
    if not isinstance(y, np.ndarray) or y.dtype != BF16_DTYPE or y.ndim != 2 or not y.flags.c_contiguous:
        raise TypeError(f"y must be a contiguous bfloat16 [num_tokens, hidden] array, got "
                        f"{getattr(y, 'dtype', type(y).__name__)} {getattr(y, 'shape', '')}")
    if y.shape[0] > d.num_max_tokens_per_rank or y.shape[1] != d.hidden:
        raise ValueError(f"y.shape={y.shape} must be [<= num_max_tokens_per_rank={d.num_max_tokens_per_rank}, "
                         f"hidden={d.hidden}]")
    if (shared_l1_weights is not None) != (d.num_shared_experts > 0) or (
            shared_l2_weights is not None) != (d.num_shared_experts > 0):
        raise ValueError(f"shared weights must be given exactly when num_shared_experts > 0 "
                         f"(num_shared_experts={d.num_shared_experts})")
    local, h, i, si = d.num_local_experts, d.hidden, d.intermediate_hidden, d.num_shared_experts * d.intermediate_hidden
    _check_weights("l1_weights", l1_weights, (local, i // 128, BLOCK_N, h // 2), True)
    _check_weights("l2_weights", l2_weights, (local, h // BLOCK_N, BLOCK_N, i // 2), True)
    if d.num_shared_experts:
        _check_weights("shared_l1_weights", shared_l1_weights, (si // 128, BLOCK_N, h), False)
        _check_weights("shared_l2_weights", shared_l2_weights, (h // BLOCK_N, BLOCK_N, si), False)
    stats = cumulative_local_expert_recv_stats
    if stats is not None and (not isinstance(stats, np.ndarray) or stats.dtype != np.int32 or stats.size != local
                              or not stats.flags.c_contiguous):
        raise ValueError(f"cumulative_local_expert_recv_stats must be contiguous int32 with {local} elements, got "
                         f"{getattr(stats, 'dtype', type(stats).__name__)} {getattr(stats, 'shape', '')}")
    clamp = float("inf") if activation_clamp is None else activation_clamp
    if isinstance(clamp, bool) or not isinstance(clamp, (int, float, np.floating, np.integer)) or not clamp >= 0:
        raise ValueError(f"activation_clamp={activation_clamp!r} must be None or a number >= 0")
    clamp = float(np.float32(clamp).astype(BF16_DTYPE).astype(np.float32))
    n = y.shape[0]
    idx = sym_buffer.topk_idx[:n]
    if idx.size and (idx.min() < -1 or idx.max() >= d.num_experts):
        raise ValueError(f"sym_buffer.topk_idx[:{n}] holds expert indices in [{idx.min()}, {idx.max()}]: must be -1 "
                         f"or in [0, num_experts={d.num_experts})")
    return d, n, clamp


def _gemm(a, sfa, b, sfb, psum, n):
    """One routed GEMM on the Cube kernels: M-grouped contiguous FP8 x FP4 (psum layout) into bf16."""
    from .m_grouped import m_grouped_fp8_fp4_gemm_nt_contiguous

    out = np.empty((a.shape[0], n), BF16_DTYPE)
    sfa_mn = np.ascontiguousarray(sfa.T).T
    m_grouped_fp8_fp4_gemm_nt_contiguous((a, sfa_mn), (b, sfb), out, psum)
    return out


def _dense(a, sfa, b, sfb):
    """One shared-expert GEMM on the Cube kernels: FP8 x FP8 into bf16."""
    from .gemm import fp8_gemm_nt

    out = np.empty((a.shape[0], b.shape[0]), BF16_DTYPE)
    fp8_gemm_nt((a, np.ascontiguousarray(sfa.T).T), (b, sfb), out)
    return out


def fused_enabled() -> bool:
    """Whether fp8_fp4_mega_moe runs as the fused kernel (templates/mega_moe.asc.j2, one mixed launch per rank) or
    as the host pipeline of kernels/mega_moe.py's phases around the M-grouped GEMM kernels: DG_MEGA_MOE_FUSED
    (read per call)."""
    return envs.DG_MEGA_MOE_FUSED.get()


def _shared_experts(v, d, n, shared_l1_weights, shared_l2_weights, clamp) -> None:
    """The shared experts on this rank's own tokens, into combine slot K (two FP8 x FP8 GEMM launches)."""
    i = d.intermediate_hidden
    ws1, sfs1 = _untransform(*shared_l1_weights, False)
    ws2, sfs2 = _untransform(*shared_l2_weights, False)
    h = _dense(v.x[:n].view(FP8_DTYPE), v.x_sf[:n], ws1, sfs1)
    codes, sf = k_mm.swiglu_quant(h.view(np.uint16), np.ones(n, np.float32), clamp, interleaved=True)
    si = d.num_shared_experts * i
    v.shared_l2_acts[:n, :si] = codes.view(np.uint8)
    s_sf = v.shared_l2_acts_sf[:n * si // MX_SF_DIVISOR].reshape(n, si // MX_SF_DIVISOR)
    s_sf[...] = sf
    out = _dense(v.shared_l2_acts[:n, :si].view(FP8_DTYPE), s_sf, ws2, sfs2)
    v.combine_input[d.num_topk, :n] = out.view(np.uint16)


def _fused_weights(weights) -> tuple[np.ndarray, np.ndarray]:
    """Transformed routed weights -> the fused kernel's (flat packed FP4 codes, flat scales [E/R, K/64, N])."""
    w, sf = weights
    _, sfb = _untransform(w, sf, True)  # [E, N, K/64], a transposed view of the contiguous [E, K/64, N]
    return w.reshape(-1).view(np.uint8), np.ascontiguousarray(sfb.transpose(0, 2, 1)).reshape(-1)


def _fused_call(y, l1_weights, l2_weights, sym_buffer, shared_l1_weights, shared_l2_weights, stats, d, n,
                clamp) -> None:
    """The fused path: the shared experts (if any) on the host's GEMM kernels into combine slot K, then one launch
    of the mega_moe kernel (dispatch, both barriers, pull, L1, SwiGLU-quant, L2, push, combine)."""
    if getattr(sym_buffer, "_out_of_step", False):
        raise RuntimeError("sym_buffer's rank barriers are out of step after a timed-out call: make a new SymmBuffer")
    protect(y, stats, work=2.0 * n * (d.num_topk + d.num_shared_experts) * 3 * d.hidden * d.intermediate_hidden)
    v = sym_buffer._views
    w1, w2 = _fused_weights(l1_weights), _fused_weights(l2_weights)
    if d.num_shared_experts and n:
        _shared_experts(v, d, n, shared_l1_weights, shared_l2_weights, clamp)
    ws = getattr(sym_buffer, "_fused_ws", None)
    if ws is None:
        ws = sym_buffer._fused_ws = k_mm.FusedWorkspace.of(d, runtime.get_num_ai_cores())
    try:
        k_mm.launch_fused(sym_buffer.symmetric.all, sym_buffer.rank, d, ws, w1, w2, y, n, clamp, stats)
    except k_mm.MegaMoeBarrierTimeout:
        sym_buffer._out_of_step = True
        raise


@api_call
def fp8_fp4_mega_moe(y, l1_weights, l2_weights, sym_buffer, shared_l1_weights=None, shared_l2_weights=None,
                     cumulative_local_expert_recv_stats=None, recipe=(1, 1, 32), activation="swiglu",
                     activation_clamp=None, fast_math=True) -> None:
    """This rank's part of one expert-parallel MoE layer (every rank of ``sym_buffer``'s group calls it together).

    Before the call: ``sym_buffer.x[:T]`` (float8_e4m3fn), ``x_sf[:T]`` (int16 UE8M0 pairs per 64 channels),
    ``topk_idx[:T]`` (int64, -1: no expert) and ``topk_weights[:T]`` hold this rank's T = y.shape[0] tokens.
    Weights from ``transform_weights_for_mega_moe`` (this rank's E/R experts; the shared experts' only when
    num_shared_experts > 0). Writes y (bf16 [T, H]) = per token, in fp32, the sum over its routed experts in top-k
    order of L2(SwiGLU(L1 x) * weight), then the shared experts', rounded once; the SwiGLU output is requantised to
    FP8 (UE8M0 per 32) as the kernel does; ``activation_clamp`` (rounded to bf16) clamps gate from above and up on
    both sides. ``cumulative_local_expert_recv_stats`` (int32 [E/R]) += the routes each local expert received.
    Needs get_num_ai_cores() == 32 (the chip kernel's core count). Runs as the fused kernel (templates/mega_moe.asc.j2:
    one mixed launch, plus two shared-expert GEMM launches when num_shared_experts > 0) unless DG_MEGA_MOE_FUSED=0
    picks the host pipeline (same bits; docs/mega_moe.md). A rank barrier of the fused kernel that waits longer than
    kernels.mega_moe.set_barrier_timeout() (300 s) raises MegaMoeBarrierTimeout.
    """
    # Checks (nothing written before they pass; every rank checks its own arguments)
    d, n, clamp = _check_call(y, l1_weights, l2_weights, sym_buffer, shared_l1_weights, shared_l2_weights,
                              cumulative_local_expert_recv_stats, recipe, activation, activation_clamp, fast_math)
    if fused_enabled():
        _fused_call(y, l1_weights, l2_weights, sym_buffer, shared_l1_weights, shared_l2_weights,
                    cumulative_local_expert_recv_stats, d, n, clamp)
        return
    v = sym_buffer._views
    w1, sf1 = _untransform(*l1_weights, True)
    w2, sf2 = _untransform(*l2_weights, True)
    protect(y, cumulative_local_expert_recv_stats, work=2.0 * n * (d.num_topk + d.num_shared_experts) * 3 * d.hidden
            * d.intermediate_hidden)

    # Dispatch: metadata into the experts' ranks, then every rank's counts are in
    k_mm.dispatch_metadata(v, n)
    sym_buffer.barrier()
    pool = k_mm.plan_pool(v)

    # Routed experts, one ring wave at a time: pull, L1, SwiGLU-quant, L2, push
    i = d.intermediate_hidden
    for wave in k_mm.ring_waves(pool, d.num_ring_blocks):
        firsts, psum, rows = k_mm.wave_layout(v, pool, wave)
        k_mm.pull_rows(v, pool, wave, firsts)
        h = _gemm(v.l1_acts[:rows].view(FP8_DTYPE), v.l1_acts_sf[:rows], w1, sf1, psum, 2 * i)
        weights = np.zeros(rows, np.float32)
        for (_, p0, nr), r0 in zip(wave, firsts, strict=True):
            weights[r0:r0 + nr] = pool.weight[p0:p0 + nr]
        codes, sf = k_mm.swiglu_quant(h.view(np.uint16), weights, clamp, interleaved=True)
        v.l2_acts[:rows] = codes.view(np.uint8)
        l2_sf = v.l2_acts_sf[:rows * i // MX_SF_DIVISOR].reshape(rows, i // MX_SF_DIVISOR)
        l2_sf[...] = sf
        out = _gemm(v.l2_acts[:rows].view(FP8_DTYPE), l2_sf, w2, sf2, psum, d.hidden)
        k_mm.push_rows(v, pool, wave, firsts, out.view(np.uint16))

    # Shared experts on this rank's own tokens, into combine slot K
    if d.num_shared_experts and n:
        _shared_experts(v, d, n, shared_l1_weights, shared_l2_weights, clamp)

    # Combine: every rank's rows are in; the ordered reduce, then the statistics
    sym_buffer.barrier()
    y.view(np.uint16)[...] = k_mm.combine_reduce(v, n, d.num_shared_experts > 0)
    if cumulative_local_expert_recv_stats is not None:
        stats = cumulative_local_expert_recv_stats.reshape(-1)
        stats += pool.expert_rows.astype(np.int32)


# ---------------------------------------------------------------------------------------------------------------
# Reference
# ---------------------------------------------------------------------------------------------------------------
def _dequant_rows(codes: np.ndarray, sf_int16: np.ndarray) -> np.ndarray:
    """FP8 codes [M, K] (uint8 / e4m3) with int16 UE8M0 pairs [M, K/64] -> float64 values."""
    values = codes.view(FP8_DTYPE).astype(np.float64)
    exps = _exponent_pairs(sf_int16).reshape(codes.shape[0], -1).astype(np.float64)
    return values * np.repeat(np.exp2(exps - 127), 32, axis=1)[:, :codes.shape[1]]


def _dequant_weights(b: np.ndarray, sfb: np.ndarray, routed: bool) -> np.ndarray:
    from ..utils.formats import decode_e2m1, unpack_fp4

    values = decode_e2m1(unpack_fp4(b.view(np.uint8), axis=-1)).astype(np.float64) if routed else \
        b.view(FP8_DTYPE).astype(np.float64)
    exps = _exponent_pairs(sfb).reshape(*sfb.shape[:-1], -1).astype(np.float64)
    return values * np.repeat(np.exp2(exps - 127), 32, axis=-1)


def _exchange(group, blocks: list) -> list:
    """all_to_all of uint8 blocks in rounds small enough for the group's mailbox."""
    limit = 1 << 20
    rounds = max(group.all_gather_object(-(-sum(b.nbytes for b in blocks) // limit)))
    parts = [[] for _ in blocks]
    for r in range(max(rounds, 1)):
        sent = []
        for b in blocks:
            step = -(-b.nbytes // max(rounds, 1))
            sent.append(b[r * step:(r + 1) * step])
        for src, got in enumerate(group.all_to_all_bytes(sent)):
            parts[src].append(got)
    return [np.concatenate(p) if p else np.zeros(0, np.uint8) for p in parts]


@api_call
def aclnn_fp8_fp4_mega_moe(y, l1_weights, l2_weights, sym_buffer, shared_l1_weights=None, shared_l2_weights=None,
                           cumulative_local_expert_recv_stats=None, recipe=(1, 1, 32), activation="swiglu",
                           activation_clamp=None, fast_math=True) -> None:
    """Reference for ``fp8_fp4_mega_moe`` (same arguments, every rank calls it together): float64 GEMMs of the
    dequantised inputs and weights, SwiGLU and the sum over experts in float64 (no bf16 rounding of the L1 output, no
    FP8 requantisation), routed rows exchanged through the group's all-to-all; y and the statistics as the kernel's.
    """
    d, n, clamp = _check_call(y, l1_weights, l2_weights, sym_buffer, shared_l1_weights, shared_l2_weights,
                              cumulative_local_expert_recv_stats, recipe, activation, activation_clamp, fast_math)
    group, rank, k, local = sym_buffer.group, sym_buffer.rank, d.num_topk, d.num_local_experts
    w1 = _dequant_weights(*_untransform(*l1_weights, True), True)
    w2 = _dequant_weights(*_untransform(*l2_weights, True), True)
    protect(y, cumulative_local_expert_recv_stats)
    sizes = group.all_gather_object(n)
    sym_buffer.barrier()  # every rank's inputs are in its buffer
    v = sym_buffer._views

    def swiglu(h, weight):
        blocks = h.reshape(h.shape[0], -1, 2, 128)
        gate = np.minimum(blocks[:, :, 0].reshape(h.shape[0], -1), clamp)
        up = np.clip(blocks[:, :, 1].reshape(h.shape[0], -1), -clamp, clamp)
        return gate * up / (1.0 + np.exp(-gate)) * weight[:, None]

    blocks, received = [], np.zeros(local, np.int64)
    for src in range(d.num_ranks):
        idx = v.all_topk_idx[src, :sizes[src]]
        rows, outs = [], []
        for le in range(local):
            t, kk = np.nonzero(idx == rank * local + le)
            received[le] += t.size
            if t.size:
                x = _dequant_rows(v.all_x[src, t], v.all_x_sf[src, t])
                a = swiglu(x @ w1[le].T, v.all_topk_weights[src, t, kk].astype(np.float64))
                rows.append(t * k + kk)
                outs.append(a @ w2[le].T)
        tt = np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, np.int64)
        vals = np.concatenate(outs) if outs else np.zeros((0, d.hidden))
        blocks.append(np.concatenate([tt.view(np.uint8), vals.reshape(-1).view(np.uint8)]))
    acc = np.zeros((n, d.hidden), np.float64)
    for got in _exchange(group, blocks):
        count = got.nbytes // (8 + 8 * d.hidden)
        tt = got[:8 * count].view(np.int64)
        vals = got[8 * count:].view(np.float64).reshape(count, d.hidden)
        np.add.at(acc, tt // k, vals)
    if d.num_shared_experts and n:
        ws1 = _dequant_weights(*_untransform(*shared_l1_weights, False), False)
        ws2 = _dequant_weights(*_untransform(*shared_l2_weights, False), False)
        x = _dequant_rows(v.x[:n], v.x_sf[:n])
        acc += swiglu(x @ ws1.T, np.ones(n)) @ ws2.T
    sym_buffer.barrier()  # nobody changes its inputs before every rank has read them
    y.view(np.uint16)[...] = fp32_to_bf16_bits(acc.astype(np.float32))
    if cumulative_local_expert_recv_stats is not None:
        cumulative_local_expert_recv_stats.reshape(-1)[...] += received.astype(np.int32)
