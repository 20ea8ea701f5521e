"""FlashMLA sparse-attention launchers: the sparse decode (templates/flash_mla_decode.asc.j2, family
FLASH_MLA_DECODE) and the sparse prefill (templates/flash_mla_prefill.asc.j2, FLASH_MLA_PREFILL), mixed Cube + Vector
kernels sharing lib/flash_mla.asc.j2. Inputs arrive validated and flattened (deep_gemm/api/flash_mla*.py); the
kernels write bf16 out and per head (softmax max, sum of exponentials, max logit); lse = max + log(sum) is folded
here (the AIVs have no log instruction in this stand-in).
"""

from __future__ import annotations

import numpy as np

from .. import envs
from ..arch import ArchSpec
from ..heuristics.flash_mla import (
    H_Q,
    RESCALE_THRES,
    FlashMlaConfig,
    FlashMlaDesc,
    config_violations,
    get_flash_mla_config,
)
from .common import current_target
from .family import KernelFamily, PreparedKernel

_NO_U8 = np.zeros(32, np.uint8)
_NO_I32 = np.zeros(1, np.int32)
_NO_F32 = np.zeros(1, np.float32)


def _template_constants(desc: FlashMlaDesc, config: FlashMlaConfig, arch: ArchSpec) -> dict[str, object]:
    problems = config_violations(desc, config, arch)
    if problems:
        raise ValueError(f"FlashMLA config {config} does not fit arch {arch.name}: {'; '.join(problems)}")
    constants = config.template_constants()
    constants.update(H_Q=H_Q, D_QK=desc.d_qk, D_V=512, NUM_AI_CORES=desc.num_ai_cores, UB_BYTES=arch.ub_bytes,
                     RESCALE_THRES=RESCALE_THRES, MAIN_FORMAT=desc.main_format, EXTRA_FORMAT=desc.extra_format)
    return constants


FLASH_MLA_DECODE = KernelFamily("flash_mla_decode", select_config=get_flash_mla_config,
                                template_constants=_template_constants)
FLASH_MLA_PREFILL = KernelFamily("flash_mla_prefill", select_config=get_flash_mla_config,
                                 template_constants=_template_constants)


def prepare_flash_mla(kind: str, main_format: str, extra_format: str, d_qk: int,
                      config: FlashMlaConfig | None = None) -> PreparedKernel:
    """The prepared decode or prefill kernel for the current runtime target (core count, arch)."""
    num_ai_cores, arch = current_target()
    family = FLASH_MLA_DECODE if kind == "decode" else FLASH_MLA_PREFILL
    sync_check = envs.DG_SYNC_CHECK.get()
    key = (kind, main_format, extra_format, d_qk, num_ai_cores, arch.name, config, sync_check)
    prepared = family.lookup(key)
    if prepared is None:
        desc = FlashMlaDesc(kind=kind, main_format=main_format, extra_format=extra_format, d_qk=d_qk,
                            num_ai_cores=num_ai_cores)
        prepared = family.prepare(desc, arch=arch, config=config, memo_key=key, sync_check=sync_check)
    return prepared


def _cache_args(cache: np.ndarray | None, prefix: str) -> dict[str, np.ndarray]:
    """uint8 / uint16 / fp32 views of one flat byte cache (the kernels read each field in its own type)."""
    if cache is None:
        return {f"gm_{prefix}cache": _NO_U8, f"gm_{prefix}cache_u16": _NO_U8.view(np.uint16),
                f"gm_{prefix}cache_f32": _NO_U8.view(np.float32)}
    flat = cache.reshape(-1)
    pad = (-flat.size) % 4
    if pad:
        flat = np.concatenate([flat, np.zeros(pad, np.uint8)])
    return {f"gm_{prefix}cache": flat, f"gm_{prefix}cache_u16": flat.view(np.uint16),
            f"gm_{prefix}cache_f32": flat.view(np.float32)}


def fold_lse(stats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lse, max_logits) fp32 of the kernels' per-head (max, sum, max logit): max + log(sum); +inf where sum = 0."""
    m = stats[:, 0].astype(np.float64)
    s = stats[:, 1].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(s > 0, m + np.log(np.where(s > 0, s, 1.0)), np.inf)
    return lse.astype(np.float32), stats[:, 2].copy()


def launch_flash_mla(kind: str, q: np.ndarray, cache: np.ndarray, main_format: str, indices: np.ndarray,
                     topk_length: np.ndarray | None, num_tokens: int, page_size: int, page_bytes: int,
                     out: np.ndarray, sm_scale: float, attn_sink: np.ndarray | None, *,
                     extra: tuple | None = None, config: FlashMlaConfig | None = None) -> np.ndarray:
    """Run one kernel; returns the fp32 stats [units * 64, 3] (max used by the exponentials, sum, max logit).

    q: uint16 bf16 bits [units * 64, d_qk], C-contiguous; cache: the uint8 bytes (a bf16 kv as its bytes for the
    prefill); indices: int32 [units, topk] C-contiguous; topk_length: int32 [units] or None; out: uint16 [units * 64,
    512] C-contiguous; extra: (cache, format, indices, topk_length, num_tokens, page_size, page_bytes) or None.
    """
    units = indices.shape[0]
    d_qk = q.shape[1]
    extra_format = "none" if extra is None else extra[1]
    prepared = prepare_flash_mla(kind, main_format, extra_format, d_qk, config)
    cores = prepared.desc.num_ai_cores
    b_topk = prepared.config.b_topk
    stats = np.zeros((units * H_Q, 3), np.float32)
    # NOTES: an index list with no column is passed as a 1-element stand-in (the kernels read it only below topk)
    args = dict(gm_q=q.reshape(-1), **_cache_args(cache, ""), gm_idx=indices.reshape(-1) if indices.size else _NO_I32,
                gm_len=_NO_I32 if topk_length is None else topk_length,
                gm_sink=np.zeros(H_Q, np.float32) if attn_sink is None else attn_sink,
                gm_out=out.reshape(-1), gm_stats=stats.reshape(-1),
                gm_ws_kv=np.zeros(cores * b_topk * d_qk, np.uint16),
                gm_ws_s=np.zeros(cores * H_Q * b_topk, np.uint16), num_units=units, topk=indices.shape[1],
                num_tokens=num_tokens, page_size=page_size, page_bytes=page_bytes, sm_scale=float(sm_scale),
                with_sink=int(attn_sink is not None), with_len=int(topk_length is not None))
    if extra is None:
        args.update(**_cache_args(None, "extra_"), gm_idx_extra=_NO_I32, gm_len_extra=_NO_I32, extra_topk=0,
                    extra_num_tokens=0, extra_page_size=1, extra_page_bytes=0, with_len_extra=0)
    else:
        e_cache, _, e_idx, e_len, e_tokens, e_page, e_page_bytes = extra
        args.update(**_cache_args(e_cache, "extra_"), gm_idx_extra=e_idx.reshape(-1) if e_idx.size else _NO_I32,
                    gm_len_extra=_NO_I32 if e_len is None else e_len, extra_topk=e_idx.shape[1],
                    extra_num_tokens=e_tokens, extra_page_size=e_page, extra_page_bytes=e_page_bytes,
                    with_len_extra=int(e_len is not None))
    prepared.launch(**args)
    return stats
