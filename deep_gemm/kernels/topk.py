"""Top-k launcher: DeepSelect's per-row top-k through templates/topk.asc.j2 (the kernel family TOPK), a Vector
kernel with one block per AIV. Inputs arrive validated (api/topk.py); this module binds them to the entry.
"""

from __future__ import annotations

import numpy as np

from .. import envs
from ..arch import ArchSpec
from ..heuristics.topk import TOPK_TIERS, TopkConfig, TopkDesc, get_topk_config
from .common import current_target
from .family import KernelFamily, PreparedKernel


def _template_constants(desc: TopkDesc, config: TopkConfig, arch: ArchSpec) -> dict[str, object]:
    consts = config.template_constants()
    consts.update(DTYPE=desc.dtype, IDX_DTYPE=desc.idx_dtype, UB_BYTES=arch.ub_bytes)
    return consts


TOPK = KernelFamily("topk", select_config=get_topk_config, template_constants=_template_constants)


def prepare_topk(num_rows: int, vocab: int, topk: int, dtype: str, idx_dtype: str,
                 config: TopkConfig | None = None) -> PreparedKernel:
    """The prepared kernel for the current runtime target (core count, arch): one per (top-k tier, dtypes)."""
    num_ai_cores, arch = current_target()
    tier = next(t for t in TOPK_TIERS if topk <= t)
    sync_check = envs.DG_SYNC_CHECK.get()
    key = ("topk", tier, dtype, idx_dtype, num_ai_cores, arch.name, config, sync_check)
    prepared = TOPK.lookup(key)
    if prepared is None:
        desc = TopkDesc(num_rows=0, vocab=0, topk=tier, dtype=dtype, idx_dtype=idx_dtype, num_ai_cores=num_ai_cores)
        prepared = TOPK.prepare(desc, arch=arch, config=config, memo_key=key, sync_check=sync_check)
    return prepared


def _flat(x: np.ndarray) -> np.ndarray:
    """A flat view spanning every element of the 2-D ``x`` (non-negative row stride, unit last stride; no copy)."""
    if x.size == 0:
        return np.zeros(1, x.dtype)
    span = (x.shape[0] - 1) * (x.strides[0] // x.itemsize) + x.shape[1]
    return np.lib.stride_tricks.as_strided(x, shape=(span,), strides=(x.itemsize,))


def launch_topk(bits: np.ndarray, topk: int, begin: np.ndarray, end: np.ndarray, offset: np.ndarray,
                values: np.ndarray | None, indices: np.ndarray, nan_rows: np.ndarray, *, sorted_value: bool,
                ascend_nan: bool, idx_fill: int, value_fill_bits: int, config: TopkConfig | None = None) -> TopkConfig:
    """Run (or in dry-run mode only build) the kernel; returns its config.

    bits: the input's float bits, int16 (bf16) or int32 (fp32) [b, vocab], unit last stride; begin / end / offset:
    int32 [b]; values: the bits' dtype [b, topk] or None; indices: int32 / int64 [b, topk]; nan_rows: int32 [b]
    (written: 1 where the row's NaN check found one). Reads runtime.get_num_ai_cores(), get_arch_spec(),
    get_dry_run(); env DG_SYNC_CHECK.
    """
    b, vocab = bits.shape
    dtype = "bf16" if bits.dtype == np.int16 else "fp32"
    idx_dtype = "int32" if indices.dtype == np.int32 else "int64"
    prepared = prepare_topk(b, vocab, topk, dtype, idx_dtype, config)
    out_values = values.view(bits.dtype) if values is not None else np.zeros((1, 1), bits.dtype)
    prepared.launch(
        gm_input=_flat(bits), stride_input=bits.strides[0] // bits.itemsize if b > 1 else vocab,
        gm_values=_flat(out_values), stride_values=out_values.strides[0] // out_values.itemsize,
        gm_indices=_flat(indices), stride_indices=indices.strides[0] // indices.itemsize,
        gm_begin=begin, gm_end=end, gm_offset=offset, gm_nan=nan_rows, num_rows=b, topk=topk,
        return_value=int(values is not None), sorted_value=int(sorted_value), ascend_nan=int(ascend_nan),
        idx_fill=idx_fill, value_fill_bits=value_fill_bits,
    )
    return prepared.config
