"""What the chip would do: ``estimate_mqa_logits`` / ``estimate_paged_mqa_logits``, the modelled Ascend time of the
MQA-logits calls with the config the kernel would use. The model is heuristics/mqa.py's."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from ..arch import ArchSpec
from ..heuristics.mqa import (
    MQA_DTYPES,
    MQA_FP4_HEAD_DIMS,
    MQA_HEAD_DIMS,
    MQA_MAX_HEADS,
    MQA_MIN_HEADS,
    PAGE_SIZES,
    MqaConfig,
    MqaCost,
    MqaDesc,
    get_best_mqa_config,
    model_mqa,
    model_paged_mqa,
)
from ._target import resolve_target


@dataclass(frozen=True)
class MqaEstimate:
    """Modelled (not measured) chip time of one MQA-logits call and what binds it. The ``*_us`` fields are each
    resource's busy time on the critical path (per-pipe: the busiest core's)."""

    kind: str  # "ragged" or "paged"
    num_heads: int
    head_dim: int
    q_dtype: str
    kv_dtype: str
    arch: str
    num_ai_cores: int
    config: MqaConfig
    time_us: float
    bound: str
    cube_us: float
    fixpipe_us: float
    vector_us: float
    mte2_us: float
    l2_us: float
    hbm_us: float
    launch_us: float
    num_tiles: int
    busiest_tiles: int
    pages_per_copy: int
    aiv_mte2_us: float
    hbm_bytes: int
    l2_bytes: int
    tflops: float
    problem: str

    def __str__(self) -> str:
        c = self.config
        gather = (f"; the AIC gathers {self.pages_per_copy} pages per GM -> L1 copy, the AIVs the scales "
                  f"({self.aiv_mte2_us:.2f} us per AIV)") if self.kind == "paged" else ""
        return "\n".join([
            f"modelled Ascend {self.arch} ({self.num_ai_cores} AI cores), {self.kind} MQA logits: {self.problem}, "
            f"H={self.num_heads} D={self.head_dim} {self.q_dtype}x{self.kv_dtype}",
            f"  time {self.time_us:.2f} us (modelled), {self.tflops:.1f} TFLOPS useful; bound: {self.bound}",
            f"  config: block_q {c.block_q}, block_kv {c.block_kv}, L1 stages {c.num_l1_stages}; "
            f"{self.num_tiles} tiles, {self.busiest_tiles} on the busiest core{gather}",
            f"  per resource (us): cube {self.cube_us:.2f}, fixpipe {self.fixpipe_us:.2f}, vector {self.vector_us:.2f},"
            f" mte2 {self.mte2_us:.2f}, l2 {self.l2_us:.2f}, hbm {self.hbm_us:.2f}, launch {self.launch_us:.2f}",
            f"  traffic: L2 -> L1 {self.l2_bytes / 1e6:.1f} MB, HBM {self.hbm_bytes / 1e6:.1f} MB",
        ])


def _estimate_target(num_heads: object, head_dim: object, q_dtype: str, kv_dtype: str, arch: object,
                     num_ai_cores: object) -> tuple[ArchSpec, int]:
    for name, value in (("num_heads", num_heads), ("head_dim", head_dim)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r}")
    if not (MQA_MIN_HEADS <= num_heads <= MQA_MAX_HEADS and num_heads % 4 == 0):
        raise ValueError(f"num_heads={num_heads} must be a multiple of 4 in [{MQA_MIN_HEADS}, {MQA_MAX_HEADS}]")
    if head_dim not in MQA_HEAD_DIMS:
        raise ValueError(f"head_dim={head_dim} must be one of {MQA_HEAD_DIMS}")
    for name, value in (("q_dtype", q_dtype), ("kv_dtype", kv_dtype)):
        if value not in MQA_DTYPES:
            raise ValueError(f"{name}={value!r}; allowed: {MQA_DTYPES}")
    if "fp4" in (q_dtype, kv_dtype) and head_dim not in MQA_FP4_HEAD_DIMS:
        raise ValueError(f"head_dim={head_dim} with FP4 must be one of {MQA_FP4_HEAD_DIMS} (as CUDA DeepGEMM's FP4 "
                         f"path)")
    spec, cores = resolve_target(arch, num_ai_cores)
    if not spec.has_fp8:
        raise ValueError(f"arch {spec.name} has no FP8/FP4 Cube path; the MQA logits need one")
    return spec, cores


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _int_arg(value: object, name: str) -> int:
    """An int (Python or numpy integer); TypeError naming ``name`` for a str, a float, a bool or anything else."""
    if not _is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r}")
    return int(value)


def _bool_arg(value: object, name: str) -> bool:
    # NOTES: bool("False") is True: a str (or an int) would silently pick the other branch
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}: {value!r}")
    return bool(value)


def _as_ints(values: object, name: str, length: int | None = None) -> list[int]:
    """A sequence of ints (a list, a tuple, a 1-D integer array) as a list; TypeError naming ``name`` for a str, a
    scalar or any non-integer entry (int("4") and int(4.7) would otherwise pass a wrong size on silently)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a sequence of ints, got {type(values).__name__}: {values!r}")
    out = list(values)
    for i, v in enumerate(out):
        if not _is_int(v):
            raise TypeError(f"{name}[{i}] must be an int, got {type(v).__name__}: {v!r}")
    out = [int(v) for v in out]
    if length is not None and len(out) != length:
        raise ValueError(f"len({name})={len(out)} must be {length}")
    return out


def _estimate(kind: str, desc: MqaDesc, config: MqaConfig, spec: ArchSpec, cost: MqaCost, problem: str):
    return MqaEstimate(
        kind=kind, num_heads=desc.num_heads, head_dim=desc.head_dim, q_dtype=desc.q_dtype, kv_dtype=desc.kv_dtype,
        arch=spec.name, num_ai_cores=desc.num_ai_cores, config=config, time_us=cost.time_s * 1e6, bound=cost.bound,
        cube_us=cost.cube_s * 1e6, fixpipe_us=cost.fixpipe_s * 1e6, vector_us=cost.vector_s * 1e6,
        mte2_us=cost.mte2_s * 1e6, l2_us=cost.l2_s * 1e6, hbm_us=cost.hbm_s * 1e6, launch_us=cost.launch_s * 1e6,
        num_tiles=cost.num_tiles, busiest_tiles=cost.busiest_tiles, pages_per_copy=cost.pages_per_copy,
        aiv_mte2_us=cost.aiv_mte2_s * 1e6,
        hbm_bytes=cost.hbm_bytes, l2_bytes=cost.l2_bytes, tflops=cost.flops / cost.time_s / 1e12, problem=problem)


def estimate_mqa_logits(seq_len: int, seq_len_kv: int, num_heads: int = 64, head_dim: int = 128,
                        q_dtype: str = "fp8", kv_dtype: str = "fp8", *, cu_seq_len_k_start=None,
                        cu_seq_len_k_end=None, kv_scale_per_key: bool = True, arch=None,
                        num_ai_cores: int | None = None) -> MqaEstimate:
    """Modelled chip time of fp8_fp4_mqa_logits with the config the kernel would use: ``seq_len`` query rows,
    ``seq_len_kv`` keys, row i over [ks[i], ke[i]) (``cu_seq_len_k_start`` / ``_end``; default: every key).
    kv_scale_per_key: CUDA DeepGEMM's fp32 scale per key (an extra Vector pass) rather than MX scales. ``arch`` /
    ``num_ai_cores`` default to deep_gemm.runtime (env DG_NPU_ARCH, DG_NUM_AI_CORES). Nothing is run."""
    spec, cores = _estimate_target(num_heads, head_dim, q_dtype, kv_dtype, arch, num_ai_cores)
    for name, value in (("seq_len", seq_len), ("seq_len_kv", seq_len_kv)):
        if not 0 <= _int_arg(value, name) < 2**31:
            raise ValueError(f"{name}={value!r} must be an int in [0, 2^31)")
    seq_len, seq_len_kv = int(seq_len), int(seq_len_kv)
    token_scale = _bool_arg(kv_scale_per_key, "kv_scale_per_key")
    ks = ke = None
    if (cu_seq_len_k_start is None) != (cu_seq_len_k_end is None):
        raise ValueError("pass both cu_seq_len_k_start and cu_seq_len_k_end, or neither")
    if cu_seq_len_k_start is not None:
        ks = _as_ints(cu_seq_len_k_start, "cu_seq_len_k_start", seq_len)
        ke = _as_ints(cu_seq_len_k_end, "cu_seq_len_k_end", seq_len)
        for i, (s, e) in enumerate(zip(ks, ke, strict=True)):
            if not 0 <= s <= e <= seq_len_kv:
                raise ValueError(f"row {i}: [{s}, {e}) must satisfy 0 <= ks <= ke <= seq_len_kv={seq_len_kv}")
    desc = MqaDesc(num_heads, head_dim, q_dtype, kv_dtype, cores)
    config = get_best_mqa_config(desc, spec)
    cost = model_mqa(desc, config, spec, seq_len=seq_len, seq_len_kv=seq_len_kv, ks=ks, ke=ke,
                     token_scale=token_scale)
    return _estimate("ragged", desc, config, spec, cost, f"{seq_len} queries x {seq_len_kv} keys")


def estimate_paged_mqa_logits(context_lens, num_heads: int = 64, head_dim: int = 128, q_dtype: str = "fp8",
                              kv_dtype: str = "fp8", *, page_size: int = 64, use_ascend_kv_layout: bool = False,
                              arch=None, num_ai_cores: int | None = None) -> MqaEstimate:
    """Modelled chip time of fp8_fp4_paged_mqa_logits for ``context_lens`` ([B] or [B][next_n] ints), pages of
    ``page_size`` keys in either cache layout, gathered as the chip does (two pages of values per AIC copy, the
    scales by the AIVs; heuristics/mqa.py PAGES_PER_COPY). Nothing is run."""
    spec, cores = _estimate_target(num_heads, head_dim, q_dtype, kv_dtype, arch, num_ai_cores)
    if _int_arg(page_size, "page_size") not in PAGE_SIZES:
        raise ValueError(f"page_size={page_size!r} must be one of {PAGE_SIZES}")
    ascend = _bool_arg(use_ascend_kv_layout, "use_ascend_kv_layout")
    if isinstance(context_lens, (str, bytes)) or not hasattr(context_lens, "__iter__"):
        raise TypeError(f"context_lens must be a sequence ([B] or [B][next_n]) of ints, got "
                        f"{type(context_lens).__name__}: {context_lens!r}")
    rows = [r if hasattr(r, "__iter__") else [r] for r in context_lens]  # a str row is refused by _as_ints
    ctx = [_as_ints(r, f"context_lens[{b}]") for b, r in enumerate(rows)]
    next_n = len(ctx[0]) if ctx else 1
    if any(len(r) != next_n for r in ctx) or next_n == 0:
        raise ValueError("context_lens rows must all have next_n >= 1 entries")
    if any(v < 0 for r in ctx for v in r):
        raise ValueError("context_lens must be >= 0")
    desc = MqaDesc(num_heads, head_dim, q_dtype, kv_dtype, cores, next_n=next_n,
                   ascend_kv_layout=ascend)
    config = get_best_mqa_config(desc, spec)
    cost = model_paged_mqa(desc, config, spec, context_lens=ctx, page_size=page_size)
    layout = "Ascend" if ascend else "CUDA DeepGEMM"
    return _estimate("paged", desc, config, spec, cost,
                     f"batch {len(ctx)} x next_n {next_n}, {layout} cache layout, pages of {page_size}")


# ---------------------------------------------------------------------------------------------------------------
# Published rows

# NOTES: the vendor's MQA-logits figures (issue 25, quoting the DeepGEMM-Ascend README of 2026-09-30: 950DT, CANN 9.20,
# bench_msprof, cold L2); the configurations are those of DeepGEMM-Ascend's benchmark script (its
# tests/test_attention.py: run_mqa_logits_case / test_paged_mqa_logits, read in the public index), FP8 and FP4 with
# its MX scales (UE8M0 per 32 of head_dim; its API takes no other form) and bf16 weights:
# - prefill, mode Causal: 4096 queries, 8192 keys, row i sees [0, i + 4096) (ke = arange(S) + S_kv - S), 32 heads,
#   head_dim 128, FP8: 302.6 us (the issue writes [0, 4096 + i + 1); the script's ks / ke are used);
# - paged decode: 256 requests, context U[0.7, 1.3) x 8192 per request (torch.randint), U{3..7} query tokens per
#   request (the script's default --min-tpr 3 --max-tpr 7; token t of a request sees context + t keys, and its
#   "256 query rows" are the requests: the GB/s it prints, 2006, is the bytes of ~1280 tokens' logits plus the
#   requests' unique KV over 150.9 us), 32 heads, head_dim 128, pages of 64 (its first page size; it also runs 128):
#   FP8 150.9 us, FP4 124.2 us. Its draws are not published: a seeded draw of the same distributions stands in, and
#   a request is one batch row of the stand-in's paged kernel (its tokens share the request's KV, as the chip's q
#   block does), in the Ascend layout; the gather is the chip's (two pages of values per AIC copy, the UE8M0 scales
#   by the AIVs: heuristics/mqa.py PAGES_PER_COPY), the same for FP8 and FP4. The script's pages hold a page's
#   values then its scales ([page_size * data_bytes | page_size * sf_bytes]) and its default is
#   use_ascend_kv_layout=False (the flag permutes the values into 32-byte columns and the scales into 16-token
#   fragments inside the page); the chip's gather and bytes are the same either way, so the row does not depend on it.
PUBLISHED_RAGGED: tuple[tuple[int, int, int, int, str, float], ...] = (
    # (seq_len, seq_len_kv, num_heads, head_dim, dtype, us): mode Causal
    (4096, 8192, 32, 128, "fp8", 302.6),
)
PUBLISHED_PAGED: tuple[tuple[int, int, int, int, int, int, str, float], ...] = (
    # (requests, avg context, min / max tokens per request, num_heads, head_dim, dtype, us): pages of 64
    (256, 8192, 3, 7, 32, 128, "fp8", 150.9),
    (256, 8192, 3, 7, 32, 128, "fp4", 124.2),
)
PUBLISHED_PAGE_SIZE = 64
_SOURCE = "DeepGEMM-Ascend README 2026-09-30 (950DT, CANN 9.20, bench_msprof, cold L2), via issue 25"


def paged_benchmark_context_lens(requests: int, avg_kv: int, min_tokens: int, max_tokens: int,
                                 seed: int = 0) -> list[list[int]]:
    """Context lengths per request and query token as DeepGEMM-Ascend's paged benchmark draws them (a seeded
    stand-in for its unpublished draws): a request's context U[0.7, 1.3) x avg_kv, its tokens U{min..max}, token t
    seeing context + t keys."""
    import random

    rng = random.Random(seed)
    rows = []
    for _ in range(requests):
        tokens = rng.randint(min_tokens, max_tokens)
        ctx = rng.randrange(int(0.7 * avg_kv), int(1.3 * avg_kv))
        rows.append([ctx + t for t in range(tokens)])
    return rows


def _terms(cost: MqaCost) -> tuple[tuple[str, float], ...]:
    return (("cube", cost.cube_s * 1e6), ("fixpipe", cost.fixpipe_s * 1e6), ("vector", cost.vector_s * 1e6),
            ("mte2", cost.mte2_s * 1e6), ("aiv_mte2", cost.aiv_mte2_s * 1e6), ("l2", cost.l2_s * 1e6),
            ("hbm", cost.hbm_s * 1e6), ("launch", cost.launch_s * 1e6))


def published_checks(arch: str = "950DT") -> list:
    """The published MQA-logits rows (ragged prefill, paged decode FP8 and FP4) beside the model on ``arch`` with
    all its AI cores and the config the kernels would pick."""
    from .published import PublishedCheck

    spec = resolve_target(arch, None)[0]
    cores = spec.num_ai_cores
    rows = []
    for seq_len, seq_len_kv, heads, head_dim, dtype, us in PUBLISHED_RAGGED:
        desc = MqaDesc(heads, head_dim, dtype, dtype, cores)
        config = get_best_mqa_config(desc, spec)
        ke = [i + seq_len_kv - seq_len for i in range(seq_len)]
        cost = model_mqa(desc, config, spec, seq_len=seq_len, seq_len_kv=seq_len_kv, ks=[0] * seq_len, ke=ke,
                         token_scale=False)
        rows.append(PublishedCheck(
            family="fp8_fp4_mqa_logits",
            problem=f"{dtype} S={seq_len} S_kv={seq_len_kv} causal H={heads} D={head_dim} "
                    f"({config.block_q} x {config.block_kv} tiles)",
            published_us=us, modelled_us=cost.time_s * 1e6, bound=cost.bound, source=_SOURCE, terms=_terms(cost)))
    for requests, avg_kv, lo, hi, heads, head_dim, dtype, us in PUBLISHED_PAGED:
        ctx = paged_benchmark_context_lens(requests, avg_kv, lo, hi)
        desc = MqaDesc(heads, head_dim, dtype, dtype, cores, next_n=hi, ascend_kv_layout=True)
        config = get_best_mqa_config(desc, spec)
        cost = model_paged_mqa(desc, config, spec, context_lens=ctx, page_size=PUBLISHED_PAGE_SIZE)
        rows.append(PublishedCheck(
            family="fp8_fp4_paged_mqa_logits",
            problem=f"{dtype} B={requests} x {lo}-{hi} tokens ctx~{avg_kv} page={PUBLISHED_PAGE_SIZE} H={heads} "
                    f"D={head_dim} ({config.block_q}-token atoms)",
            published_us=us, modelled_us=cost.time_s * 1e6, bound=cost.bound, source=_SOURCE, terms=_terms(cost)))
    return rows
