"""MQA-logits launchers: the ragged kernel (templates/mqa_logits.asc.j2, family MQA_LOGITS) and the paged one
(templates/paged_mqa_logits.asc.j2, family PAGED_MQA_LOGITS), mixed Cube + Vector kernels sharing lib/mqa.asc.j2.
Inputs arrive validated and in the kernels' layouts (deep_gemm/api/mqa_logits.py, paged_mqa_logits.py); nothing
here computes logits. ``count_work()`` collects the kernels' own work counters (FixPipe bytes, Vector instructions,
...) per launch, which the cost model is tested against.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import numpy as np

from .. import envs
from ..arch import ArchSpec
from ..heuristics.mqa import MqaConfig, MqaDesc, config_violations, get_best_mqa_config
from .common import cube_l0_bf16, current_target, gm_view
from .family import KernelFamily, PreparedKernel

# NOTES: a 1-element stand-in for absent scale tensors (the kernels read them only when their flag is set).
_NO_SF = np.zeros(1, np.int16)
_NO_SCALE = np.ones(1, np.float32)
# NOTES: the logits output of the dtype not written (the kernels write gm_logits or gm_logits_f32, by logits_f32).
_NO_LOGITS_BF16 = np.zeros(1, np.uint16)
_NO_LOGITS_F32 = np.zeros(1, np.float32)


# The kernels' work counters (lib/mqa.asc.j2 W_*): int64 per core and slot.
WORK_SLOTS = 11
WORK_NAMES = ("fixpipe_bytes", "fixpipe_tiles", "reduce_instructions", "reduce_lanes", "key_bytes", "mads",
              "other_vector_instructions", "key_copies", "scale_copies", "scale_l1_copies", "scale_bytes")
_counting = threading.local()


@contextlib.contextmanager
def count_work() -> Iterator[list[dict[str, np.ndarray]]]:
    """Within the block, every MQA-logits launch of this thread appends its work counters: a dict of WORK_NAMES ->
    int64 [cores] (what each core's AIC / AIVs issued, added up by the kernel itself at each instruction site)."""
    runs: list[dict[str, np.ndarray]] = []
    previous = getattr(_counting, "runs", None)
    _counting.runs = runs
    try:
        yield runs
    finally:
        _counting.runs = previous


def _work_buffer(num_ai_cores: int) -> np.ndarray:
    return np.zeros(num_ai_cores * WORK_SLOTS, np.int64)


def _record_work(work: np.ndarray, num_ai_cores: int) -> None:
    runs = getattr(_counting, "runs", None)
    if runs is not None:
        per_core = work.reshape(num_ai_cores, WORK_SLOTS)
        runs.append({name: per_core[:, i].copy() for i, name in enumerate(WORK_NAMES)})


def _logits_args(logits: np.ndarray) -> dict[str, object]:
    """The kernels' logits arguments for uint16 (bf16 bits) or fp32 ``logits``: the GM views and the flag."""
    if logits.dtype == np.float32:
        flat, stride = gm_view(logits, np.float32)
        return dict(gm_logits=_NO_LOGITS_BF16, gm_logits_f32=flat, stride_logits=stride, logits_f32=1)
    flat, stride = gm_view(logits, np.uint16)
    return dict(gm_logits=flat, gm_logits_f32=_NO_LOGITS_F32, stride_logits=stride, logits_f32=0)


def _template_constants(desc: MqaDesc, config: MqaConfig, arch: ArchSpec,
                        cube_l0_bf16: str = "") -> dict[str, object]:
    problems = config_violations(desc, config, arch)
    if problems:
        raise ValueError(f"MQA-logits config {config} does not fit arch {arch.name}: {'; '.join(problems)}")
    constants = config.template_constants()
    constants.update(Q_DTYPE=desc.q_dtype, KV_DTYPE=desc.kv_dtype, NUM_AI_CORES=desc.num_ai_cores,
                     UB_BYTES=arch.ub_bytes, CUBE_L0_BF16=cube_l0_bf16)
    return constants


MQA_LOGITS = KernelFamily("mqa_logits", select_config=get_best_mqa_config, template_constants=_template_constants)
PAGED_MQA_LOGITS = KernelFamily("paged_mqa_logits", select_config=get_best_mqa_config,
                                template_constants=_template_constants)


def prepare_mqa(num_heads: int, head_dim: int, q_dtype: str, kv_dtype: str, next_n: int = 0,
                config: MqaConfig | None = None) -> PreparedKernel:
    """The prepared ragged (next_n == 0) or paged kernel for the current runtime target (core count, arch)."""
    num_ai_cores, arch = current_target()
    family = PAGED_MQA_LOGITS if next_n else MQA_LOGITS
    sync_check = envs.DG_SYNC_CHECK.get()
    # NOTES: FP8 and FP4 q / kv are exact in bf16: the Cube may run on bf16 L0 (part of the key, as for the GEMMs).
    l0_bf16 = cube_l0_bf16(q_dtype, kv_dtype)
    key = (num_heads, head_dim, q_dtype, kv_dtype, next_n, num_ai_cores, arch.name, config, sync_check, l0_bf16)
    prepared = family.lookup(key)
    if prepared is None:
        # NOTES: the paged kernel's layout is a runtime flag; the desc's layout field only feeds the cost model.
        desc = MqaDesc(num_heads=num_heads, head_dim=head_dim, q_dtype=q_dtype, kv_dtype=kv_dtype,
                       num_ai_cores=num_ai_cores, next_n=next_n)
        prepared = family.prepare(desc, arch=arch, config=config, options={"cube_l0_bf16": l0_bf16}, memo_key=key,
                                  sync_check=sync_check)
    return prepared


def launch_mqa_logits(q: np.ndarray, sfq: np.ndarray | None, kv: np.ndarray, sfkv: np.ndarray | None,
                      kv_scale: np.ndarray | None, weights: np.ndarray, ks: np.ndarray, ke: np.ndarray,
                      logits: np.ndarray, *, num_heads: int, head_dim: int, q_dtype: str, kv_dtype: str,
                      compressed: bool, clean_logits: bool, config: MqaConfig | None = None) -> MqaConfig:
    """Run the ragged kernel; returns its config.

    q: uint8 [S * H, >= D storage] (row = query row * H + head; FP4 packed two per byte); kv: uint8 [S_kv, >= D
    storage]; sfq / sfkv: int16 required layout [ceil(D / 64), S * H] / [ceil(D / 64), S_kv] (UE8M0 pairs) or None;
    kv_scale: fp32 [S_kv] or None; weights: fp32 [S, >= H]; ks / ke: int32 [S]; logits: uint16 (bf16 bits) or fp32
    (the sums the bf16 form rounds) [S, >= out_cols] with unit column stride, written at [i, j - (ks[i] if
    compressed else 0)] for j in [ks[i], ke[i]) and, with clean_logits, -inf everywhere else in [0, out_cols).
    """
    prepared = prepare_mqa(num_heads, head_dim, q_dtype, kv_dtype, 0, config)
    seq_len, out_cols = logits.shape
    flat_q, stride_q = gm_view(q, np.uint8)
    flat_kv, stride_kv = gm_view(kv, np.uint8)
    flat_w, stride_w = gm_view(weights, np.float32)
    args = dict(gm_q=flat_q, stride_q=stride_q, gm_kv=flat_kv, stride_kv=stride_kv,
                gm_kv_scale=_NO_SCALE if kv_scale is None else kv_scale, gm_weights=flat_w, stride_w=stride_w,
                gm_ks=ks, gm_ke=ke, **_logits_args(logits), seq_len=seq_len,
                seq_len_kv=kv.shape[0], out_cols=out_cols, q_mx=int(sfq is not None), kv_mx=int(sfkv is not None),
                kv_token_scale=int(kv_scale is not None), compressed=int(compressed), clean_logits=int(clean_logits),
                num_heads=num_heads, head_dim=head_dim, block_q=prepared.config.block_q)
    args["gm_sfq"], args["stride_sfq"] = (_NO_SF, 0) if sfq is None else gm_view(sfq, np.int16)
    args["gm_sfkv"], args["stride_sfkv"] = (_NO_SF, 0) if sfkv is None else gm_view(sfkv, np.int16)
    cores = current_target()[0]
    args["gm_work"] = work = _work_buffer(cores)
    prepared.launch(**args)
    _record_work(work, cores)
    return prepared.config


def launch_paged_mqa_logits(q: np.ndarray, sfq: np.ndarray | None, cache: np.ndarray, block_table: np.ndarray,
                            context_lens: np.ndarray, schedule_meta: np.ndarray, weights: np.ndarray,
                            logits: np.ndarray, *, batch: int, next_n: int, num_heads: int, head_dim: int,
                            q_dtype: str, kv_dtype: str, page_size: int, ascend_kv_layout: bool,
                            config: MqaConfig | None = None) -> MqaConfig:
    """Run the paged kernel; returns its config.

    q: uint8 [B * next_n * H, >= D storage]; sfq: int16 [D / 64, B * next_n * H] or None; cache: the uint8 paged
    cache, C-contiguous, [num_blocks * page_size * token_bytes] (heuristics.mqa.paged_token_bytes); block_table:
    int32 [B, >= pages] with unit column stride; context_lens: int32 [B * next_n] (per query token); schedule_meta:
    int32 [cores + 1, 2] (get_paged_mqa_logits_metadata for these context lens, heads and cores); weights: fp32
    [B * next_n, >= H]; logits: uint16 (bf16 bits) or fp32 [B * next_n, >= max context], written at j <
    context_lens.
    """
    prepared = prepare_mqa(num_heads, head_dim, q_dtype, kv_dtype, next_n, config)
    d_storage = head_dim if kv_dtype == "fp8" else head_dim // 2
    if ascend_kv_layout:
        token = d_storage + head_dim // 32
        # values and scales of a token side by side: the values at the token's start, its scales right after
        data_stride, sf_offset, sf_stride = token, d_storage, token
    else:
        token = d_storage + 4
        # a page: page_size rows of values, then page_size 4-byte scales
        data_stride, sf_offset, sf_stride = d_storage, page_size * d_storage, 4
    flat_q, stride_q = gm_view(q, np.uint8)
    flat_bt, stride_bt = gm_view(block_table, np.int32)
    flat_w, stride_w = gm_view(weights, np.float32)
    cache = cache.reshape(-1)
    args = dict(gm_q=flat_q, stride_q=stride_q, gm_cache=cache, gm_cache_f32=cache.view(np.float32),
                gm_block_table=flat_bt, stride_bt=stride_bt, gm_context_lens=context_lens,
                gm_meta=schedule_meta.reshape(-1), gm_weights=flat_w, stride_w=stride_w, **_logits_args(logits),
                batch=batch, next_n=next_n, page_size=page_size,
                page_bytes=page_size * token, data_stride=data_stride, sf_offset=sf_offset, sf_stride=sf_stride,
                q_mx=int(sfq is not None),
                kv_mx=int(ascend_kv_layout or kv_dtype == "fp4"),
                kv_token_scale=int(not ascend_kv_layout and kv_dtype == "fp8"), num_heads=num_heads,
                head_dim=head_dim, block_q=prepared.config.block_q)
    args["gm_sfq"], args["stride_sfq"] = (_NO_SF, 0) if sfq is None else gm_view(sfq, np.int16)
    cores = current_target()[0]
    args["gm_work"] = work = _work_buffer(cores)
    prepared.launch(**args)
    _record_work(work, cores)
    return prepared.config
