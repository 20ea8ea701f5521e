"""HC pre-norm GEMM launcher: D = A @ B^T in HF32 and the row sums of squares of A, K split into partial sums,
through templates/tf32_hc_prenorm_gemm.asc.j2 (the kernel family TF32_HC_PRENORM_GEMM; DeepGEMM-Ascend's structure:
heuristics/hc_prenorm.py). Inputs arrive validated (api/hc_prenorm.py).
"""

from __future__ import annotations

import numpy as np

from .. import envs
from ..arch import ArchSpec
from ..heuristics.hc_prenorm import HcPrenormConfig, HcPrenormDesc, get_hc_prenorm_config
from .common import current_target
from .family import KernelFamily, PreparedKernel


def _template_constants(desc: HcPrenormDesc, config: HcPrenormConfig, arch: ArchSpec) -> dict[str, object]:
    """The template's constants: the config's, N and K compiled in (M is a runtime dim), the UB size."""
    from ..device.capacity import arch_capacity  # imports numba

    consts = config.template_constants()
    consts.update(SHAPE_N=desc.n, SHAPE_K=desc.k, UB_BYTES=arch.ub_bytes)
    # NOTES: the chip's buffers, as the GEMM families check theirs: L1 holds one hidden block of B (the A tiles reach
    # L1 from the AIVs' UB, read in place on the stand-in); the L0 operands are fp32 (HF32 on the chip: 4 bytes).
    cap = arch_capacity(arch)
    half = config.block_m // 2
    l0b_slots = config.block_k // config.mad_k if config.keep_l0b else 2
    need = {
        "L1": config.block_n * config.block_k * 4 + config.num_cast_stages * 2 * half * config.block_k * 4,
        "L0A": 2 * half * config.mad_k * 4, "L0B": l0b_slots * config.block_n * config.mad_k * 4,
        "L0C": config.num_l0c_stages * config.block_m * config.block_n * 4,
    }
    for name, nbytes in need.items():
        if nbytes > cap[name]:
            from ..device.capacity import BufferCapacityError

            raise BufferCapacityError(f"{name} overflow: {config} needs {nbytes} bytes, {arch.name} has {cap[name]}")
    return consts


TF32_HC_PRENORM_GEMM = KernelFamily(
    "tf32_hc_prenorm_gemm", select_config=get_hc_prenorm_config,
    template_constants=lambda desc, config, arch: _template_constants(desc, config, arch),
)


def prepare_hc_prenorm(m: int, n: int, k: int, num_splits: int, deterministic: bool,
                       config: HcPrenormConfig | None = None) -> PreparedKernel:
    """The prepared kernel of one call for the current runtime target (core count, arch)."""
    num_ai_cores, arch = current_target()
    sync_check = envs.DG_SYNC_CHECK.get()
    key = ("hc", m, n, k, num_splits, deterministic, num_ai_cores, arch.name, config, sync_check)
    prepared = TF32_HC_PRENORM_GEMM.lookup(key)
    if prepared is None:
        desc = HcPrenormDesc(m=m, n=n, k=k, num_splits=num_splits, num_ai_cores=num_ai_cores,
                             deterministic=deterministic)
        prepared = TF32_HC_PRENORM_GEMM.prepare(desc, arch=arch, config=config, memo_key=key, sync_check=sync_check)
    return prepared


def _flat(x: np.ndarray) -> np.ndarray:
    """A flat view spanning every element of ``x`` (non-negative strides, unit last stride; no copy)."""
    if x.flags.c_contiguous:
        return x.reshape(-1)  # NOTES: a few hundred ns; as_strided below costs ~6 us a call
    span = 1 + sum((size - 1) * stride for size, stride in zip(x.shape, x.strides, strict=True)) // x.itemsize
    return np.lib.stride_tricks.as_strided(x, shape=(span,), strides=(x.itemsize,))


def launch_hc_prenorm(a: np.ndarray, b: np.ndarray, d: np.ndarray, sqr_sum: np.ndarray, num_splits: int,
                      deterministic: bool, config: HcPrenormConfig | None = None) -> HcPrenormConfig:
    """Run (or in dry-run mode only build) the kernel; returns its config.

    a: bf16 [m, k] (uint16 bits or ml_dtypes.bfloat16), b: float32 [n, k], both with unit last stride. d: float32
    [m, n] (num_splits 0) or [num_splits, m, n]; sqr_sum: float32 [m] or [num_splits, m]; unit last strides.
    Reads runtime.get_num_ai_cores(), get_arch_spec(), get_dry_run(); env DG_SYNC_CHECK.
    """
    m, k = a.shape
    n = b.shape[0]
    prepared = prepare_hc_prenorm(m, n, k, num_splits, deterministic, config)
    cfg: HcPrenormConfig = prepared.config
    flat_a = _flat(a.view(np.uint16))
    d3 = d if d.ndim == 3 else d[None]
    s2 = sqr_sum if sqr_sum.ndim == 2 else sqr_sum[None]
    args = dict(gm_a=flat_a, stride_a=a.strides[0] // 2, gm_b=_flat(b), stride_b=b.strides[0] // 4,
                shape_m=m, shape_n=n, shape_k=k)
    if cfg.reduce_splits:
        # NOTES: the kernel's own splits land in a scratch workspace; the reduction phase writes d and sqr_sum.
        ws_d = np.empty((cfg.num_splits, m, n), np.float32)
        ws_sqr = np.empty((cfg.num_splits, m), np.float32)
        args.update(gm_d=ws_d.reshape(-1), stride_d=n, split_stride_d=m * n, gm_sqr=ws_sqr.reshape(-1),
                    split_stride_sqr=m, gm_out_d=_flat(d3[0]), stride_out_d=d3.strides[1] // 4,
                    gm_out_sqr=_flat(s2[0]))
    else:
        args.update(gm_d=_flat(d3), stride_d=d3.strides[1] // 4, split_stride_d=d3.strides[0] // 4,
                    gm_sqr=_flat(s2), split_stride_sqr=s2.strides[0] // 4)
    prepared.launch(**args)
    return cfg
