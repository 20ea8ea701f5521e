"""``estimate_hc_prenorm_gemm``: the modelled Ascend 950 time of a ``tf32_hc_prenorm_gemm`` call (no NPU needed),
with the config the kernel would use and what binds it. The model is heuristics/hc_prenorm.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import runtime
from ..arch import ArchSpec
from ..heuristics.hc_prenorm import (
    HF32_FLOPS_FRACTION,
    MAX_N,
    HcPrenormConfig,
    HcPrenormDesc,
    get_hc_prenorm_config,
    model_hc_prenorm,
)
from ._target import check_size, resolve_target


@dataclass(frozen=True)
class HcPrenormEstimate:
    """Modelled (not measured) chip time of one HC pre-norm GEMM call; ``*_us`` are busy times on the critical path
    (Cube, the AIC's MTE2 and the AIVs' squares per core over its waves; HBM and L2 for the chip), ``reduce_us`` the
    SyncAll() + reduction phase of a kernel-side split."""

    m: int
    n: int
    k: int
    num_splits: int | None
    deterministic: bool
    arch: str
    num_ai_cores: int
    time_us: float
    bound: str
    config: HcPrenormConfig
    cube_us: float
    mte2_us: float
    vector_us: float
    hbm_us: float
    l2_us: float
    reduce_us: float
    launch_us: float
    hbm_bytes: int
    flops: float
    num_units: int
    num_waves: int

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_bytes / (self.time_us * 1e-6)

    def __str__(self) -> str:
        c = self.config
        splits = f"num_splits={self.num_splits}" if self.num_splits else f"kernel split {c.num_splits}"
        return "\n".join([
            f"modelled Ascend {self.arch} ({self.num_ai_cores} AI cores), tf32_hc_prenorm_gemm: M={self.m} N={self.n} "
            f"K={self.k} ({splits}{', deterministic' if self.deterministic else ''})",
            f"  time {self.time_us:.2f} us (modelled), HBM {self.hbm_bytes / 1e6:.1f} MB at "
            f"{self.hbm_bytes_per_s / 1e12:.2f} TB/s; bound: {self.bound}",
            f"  config: block_m {c.block_m}, block_n {c.block_n}, block_k {c.block_k}, {c.num_splits} K splits"
            f"{' summed after SyncAll()' if c.reduce_splits else ''}; {self.num_units} units in {self.num_waves} waves",
            f"  per resource (us): cube {self.cube_us:.2f} (HF32 at {HF32_FLOPS_FRACTION:g}x the BF16 rate, assumed), "
            f"mte2 {self.mte2_us:.2f}, vector {self.vector_us:.2f}, l2 {self.l2_us:.2f}, hbm {self.hbm_us:.2f}, "
            f"reduce {self.reduce_us:.2f}, launch {self.launch_us:.2f}",
        ])


def estimate_hc_prenorm_gemm(m: int, n: int, k: int, num_splits: int | None = None, *,
                             deterministic: bool | None = None, arch: str | ArchSpec | None = None,
                             num_ai_cores: int | None = None) -> HcPrenormEstimate:
    """Modelled chip time of ``tf32_hc_prenorm_gemm`` on A [m, k] bf16, B [n, k] fp32 (k % 64 == 0, n % 8 == 0,
    n <= 128), with the config the kernel would pick. ``deterministic`` defaults to
    ``get_deterministic_algorithms()``; ``arch`` and ``num_ai_cores`` to the runtime's (env DG_NPU_ARCH,
    DG_NUM_AI_CORES), as ``estimate_gemm``."""
    # Argument checks
    m, n, k = check_size("m", m), check_size("n", n), check_size("k", k)
    if m == 0:
        raise ValueError("m=0: an empty call launches no kernel; nothing to model")
    if k == 0 or k % 64:
        raise ValueError(f"k={k} must be a positive multiple of 64")
    if n == 0 or n % 8 or n > MAX_N:
        raise ValueError(f"n={n} must be a multiple of 8 in [8, {MAX_N}]")
    if num_splits is not None:
        num_splits = check_size("num_splits", num_splits)
        if not 1 <= num_splits <= k // 64:
            raise ValueError(f"num_splits={num_splits} must be in [1, k / 64 = {k // 64}] (k={k})")
    if deterministic is None:
        deterministic = runtime.get_deterministic_algorithms()
    elif not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool or None, got {deterministic!r}")
    spec, cores = resolve_target(arch, num_ai_cores)

    # Model
    desc = HcPrenormDesc(m, n, k, num_splits or 0, cores, deterministic)
    config = get_hc_prenorm_config(desc, spec)
    cost = model_hc_prenorm(desc, config, spec)
    return HcPrenormEstimate(
        m=m, n=n, k=k, num_splits=num_splits, deterministic=deterministic, arch=spec.name, num_ai_cores=cores,
        time_us=cost.time_s * 1e6, bound=cost.bound, config=config, cube_us=cost.cube_s * 1e6,
        mte2_us=cost.mte2_s * 1e6, vector_us=cost.vector_s * 1e6, hbm_us=cost.hbm_s * 1e6, l2_us=cost.l2_s * 1e6,
        reduce_us=cost.reduce_s * 1e6, launch_us=cost.launch_s * 1e6, hbm_bytes=cost.hbm_bytes, flops=cost.flops,
        num_units=cost.num_units, num_waves=cost.num_waves,
    )
