"""What the chip would do: ``estimate_flash_mla_sparse_fwd`` (sparse prefill) and ``estimate_flash_mla_with_kvcache``
(sparse decode), the modelled Ascend time of FlashMLA's calls with the config the kernels would use, and the
published rows. The model is heuristics/flash_mla.py's."""

from __future__ import annotations

from dataclasses import dataclass

from ..heuristics.flash_mla import (
    D_V,
    H_Q,
    TOKEN_BYTES,
    FlashMlaConfig,
    FlashMlaCost,
    FlashMlaDesc,
    get_flash_mla_config,
    model_flash_mla,
)
from ._target import check_size, resolve_target
from .published import PublishedCheck

_DECODE_MAIN = ("v41_fp8", "v32_fp8")
_DECODE_EXTRA = ("v41_fp8", "v41_fp4", "v32_fp8")


@dataclass(frozen=True)
class FlashMlaEstimate:
    """Modelled (not measured) chip time of one FlashMLA call and what binds it (``*_us``: each resource's busy
    time, per-pipe the busiest core's)."""

    kind: str  # "prefill" or "decode"
    arch: str
    num_ai_cores: int
    config: FlashMlaConfig
    time_us: float
    bound: str
    cube_us: float
    fixpipe_us: float
    vector_us: float
    mte2_us: float
    mte3_us: float
    l2_us: float
    hbm_us: float
    launch_us: float
    num_units: int
    busiest_units: int
    tiles_per_unit: float
    tflops: float
    problem: str

    def __str__(self) -> str:
        return "\n".join([
            f"modelled Ascend {self.arch} ({self.num_ai_cores} AI cores), FlashMLA sparse {self.kind}: {self.problem}",
            f"  time {self.time_us:.1f} us (modelled), {self.tflops:.1f} TFLOPS; bound: {self.bound}",
            f"  B_TOPK {self.config.b_topk}: {self.num_units} units (query tokens x 64 heads), {self.busiest_units} on "
            f"the busiest core, {self.tiles_per_unit:g} tiles each",
            f"  per resource (us): cube {self.cube_us:.1f}, fixpipe {self.fixpipe_us:.1f}, vector {self.vector_us:.1f},"
            f" mte2 {self.mte2_us:.1f}, mte3 {self.mte3_us:.1f}, l2 {self.l2_us:.1f}, hbm {self.hbm_us:.1f}, "
            f"launch + fill {self.launch_us:.1f}",
        ])


def _estimate(kind: str, desc: FlashMlaDesc, config: FlashMlaConfig, spec, cost: FlashMlaCost,
              problem: str) -> FlashMlaEstimate:
    return FlashMlaEstimate(
        kind=kind, arch=spec.name, num_ai_cores=desc.num_ai_cores, config=config, time_us=cost.time_s * 1e6,
        bound=cost.bound, cube_us=cost.cube_s * 1e6, fixpipe_us=cost.fixpipe_s * 1e6, vector_us=cost.vector_s * 1e6,
        mte2_us=cost.mte2_s * 1e6, mte3_us=cost.mte3_s * 1e6, l2_us=cost.l2_s * 1e6, hbm_us=cost.hbm_s * 1e6,
        launch_us=cost.launch_s * 1e6, num_units=cost.num_units, busiest_units=cost.busiest_units,
        tiles_per_unit=cost.tiles_per_unit, tflops=cost.flops / cost.time_s / 1e12, problem=problem)


def estimate_flash_mla_sparse_fwd(s_q: int, s_kv: int, topk: int, d_qk: int = 512, *, arch=None,
                                  num_ai_cores: int | None = None) -> FlashMlaEstimate:
    """Modelled chip time of flash_mla_sparse_fwd: ``s_q`` query tokens x 64 heads, ``topk`` bf16 tokens each of a
    kv of ``s_kv`` (d_qk 512 or 576, d_v 512). FLOPs counted as FlashMLA's tests do: 2 s_q topk h_q (d_qk + d_v).
    ``arch`` / ``num_ai_cores`` default to deep_gemm.runtime. Nothing is run."""
    s_q, s_kv, topk = check_size("s_q", s_q), check_size("s_kv", s_kv), check_size("topk", topk)
    if d_qk not in (512, 576):
        raise ValueError(f"d_qk={d_qk!r} must be 512 or 576")
    spec, cores = resolve_target(arch, num_ai_cores)
    desc = FlashMlaDesc("prefill", "bf16", "none", d_qk, cores)
    config = get_flash_mla_config(desc, spec)
    # NOTES: the kv (s_kv rows of bf16) is read from HBM once when it fits L2; the gathers hit L2.
    unique = min(s_kv, s_q * topk) * d_qk * 2
    cost = model_flash_mla(desc, config, spec, num_units=s_q, main_tokens=topk, unique_bytes=unique)
    return _estimate("prefill", desc, config, spec, cost, f"s_q {s_q}, s_kv {s_kv}, topk {topk}, d_qk {d_qk}")


def estimate_flash_mla_with_kvcache(batch: int, s_q: int, topk: int, extra_topk: int = 0, *,
                                    kv_layout: str = "v41_fp8", extra_kv_layout: str = "v41_fp8",
                                    unique_tokens: int | None = None, arch=None,
                                    num_ai_cores: int | None = None) -> FlashMlaEstimate:
    """Modelled chip time of flash_mla_with_kvcache's sparse decode: ``batch`` x ``s_q`` query tokens (folded into
    units) x 64 heads, ``topk`` tokens of the main cache (``kv_layout``) and ``extra_topk`` of the extra one each.
    ``unique_tokens``: distinct (main + extra) tokens read from HBM (default: every selected token). FLOPs as
    FlashMLA's tests count them: 2 h_q attended (d_qk + d_v). Nothing is run."""
    batch, s_q, topk = check_size("batch", batch), check_size("s_q", s_q), check_size("topk", topk)
    if kv_layout not in _DECODE_MAIN:
        raise ValueError(f"kv_layout={kv_layout!r} must be one of {_DECODE_MAIN}")
    if extra_topk:
        extra_topk = check_size("extra_topk", extra_topk)
        if extra_kv_layout not in _DECODE_EXTRA:
            raise ValueError(f"extra_kv_layout={extra_kv_layout!r} must be one of {_DECODE_EXTRA}")
    d_qk = 576 if kv_layout == "v32_fp8" else 512
    spec, cores = resolve_target(arch, num_ai_cores)
    desc = FlashMlaDesc("decode", kv_layout, extra_kv_layout if extra_topk else "none", d_qk, cores)
    config = get_flash_mla_config(desc, spec)
    units = batch * s_q
    unique = None
    if unique_tokens is not None:
        per = (topk * TOKEN_BYTES[kv_layout] + extra_topk * TOKEN_BYTES.get(extra_kv_layout, 0)) / (topk + extra_topk)
        unique = check_size("unique_tokens", unique_tokens) * per
    cost = model_flash_mla(desc, config, spec, num_units=units, main_tokens=topk, extra_tokens=extra_topk,
                           unique_bytes=unique)
    extra = f" + {extra_topk} {extra_kv_layout}" if extra_topk else ""
    return _estimate("decode", desc, config, spec, cost, f"b {batch} x s_q {s_q}, topk {topk} {kv_layout}{extra}")


# ---------------------------------------------------------------------------------------------------------------
# Published rows

# NOTES: FlashMLA's Ascend deep dive (docs/20260930-ascend-prefill-deep-dive.md, deepseek-ai/FlashMLA): "Under
# typical workloads of the DeepSeek V4.1 model, this kernel reaches 410 TFlops during prefill and 360 TFlops during
# decoding". The doc names no shape; the V4.1 performance cases of the same release's tests are:
#   tests/test-sparse-prefill.py performance_case_templates: d_qk 512, h_q 64, topk 512 + 128, s_q 4096, s_kv in
#     {4096, 8192, 32768}, attn_sink on;
#   tests/test-sparse-decode.py base_and_bszs (the "Production cases"): h_q 64, s_q 4 (folded into the batch on
#     Ascend), topk 128 of s_k 256 (page 256) + extra_topk 512 of extra_s_k 2048 (page 64), V4.1 FP8 main cache, FP8
#     or FP4 extra cache, b in {64, 128, 256, 512}.
# The published time of a row is its FLOPs (FlashMLA's count_flop_and_mem_vol*) at the quoted TFLOPS.
_SOURCE = "FlashMLA docs/20260930-ascend-prefill-deep-dive.md (V4.1 typical workloads; shapes: tests/test-sparse-*.py)"
PREFILL_TFLOPS = 410.0
DECODE_TFLOPS = 360.0
PREFILL_ROWS = tuple((4096, s_kv, 640) for s_kv in (4096, 8192, 32768))
DECODE_ROWS = tuple((b, extra) for extra in ("v41_fp8", "v41_fp4") for b in (64, 128, 256, 512))


def _expected_unique(pool: int, picks: int, draws: int) -> float:
    """Distinct tokens when ``draws`` queries each pick ``picks`` of ``pool`` tokens at random (the tests' indices)."""
    return pool * (1.0 - (1.0 - picks / pool) ** draws)


def published_checks(arch: str = "950DT") -> list[PublishedCheck]:
    """The deep dive's 410 TFLOPS prefill and 360 TFLOPS decode, against the model on the V4.1 performance shapes."""
    if arch != "950DT":
        return []
    rows = []
    for s_q, s_kv, topk in PREFILL_ROWS:
        est = estimate_flash_mla_sparse_fwd(s_q, s_kv, topk, arch=arch, num_ai_cores=32)
        flops = 2.0 * s_q * topk * H_Q * (512 + D_V)
        rows.append(PublishedCheck(
            family="flash_mla_sparse_fwd", problem=f"prefill s_q {s_q} s_kv {s_kv} topk {topk} h_q 64 d_qk 512 bf16",
            published_us=flops / (PREFILL_TFLOPS * 1e12) * 1e6, modelled_us=est.time_us, bound=est.bound,
            source=_SOURCE, terms=_terms(est)))
    for b, extra in DECODE_ROWS:
        unique = round(b * (_expected_unique(256, 128, 4) + _expected_unique(2048, 512, 4)))
        est = estimate_flash_mla_with_kvcache(b, 4, 128, 512, kv_layout="v41_fp8", extra_kv_layout=extra,
                                              unique_tokens=unique, arch=arch, num_ai_cores=32)
        flops = 2.0 * H_Q * b * 4 * (128 + 512) * (512 + D_V)
        rows.append(PublishedCheck(
            family="flash_mla_with_kvcache",
            problem=f"decode b {b} s_q 4 topk 128 (v41_fp8) + 512 ({extra}) h_q 64",
            published_us=flops / (DECODE_TFLOPS * 1e12) * 1e6, modelled_us=est.time_us, bound=est.bound,
            source=_SOURCE, terms=_terms(est)))
    return rows


def _terms(est: FlashMlaEstimate) -> tuple[tuple[str, float], ...]:
    return (("cube", est.cube_us), ("fixpipe", est.fixpipe_us), ("vector", est.vector_us), ("mte2", est.mte2_us),
            ("mte3", est.mte3_us), ("l2", est.l2_us), ("hbm", est.hbm_us), ("launch", est.launch_us))
