"""``estimate_hc_prenorm_gemm``: the modelled Ascend 950 time of a ``tf32_hc_prenorm_gemm`` call (no NPU needed),
with the config the kernel would use and what binds it, and the vendor's published rows beside the model
(``published_checks``). The model is heuristics/hc_prenorm.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import runtime
from ..arch import ArchSpec, get_arch
from ..heuristics.hc_prenorm import (
    HF32_FLOPS_FRACTION,
    MAX_N,
    HcPrenormConfig,
    HcPrenormDesc,
    get_hc_prenorm_config,
    model_hc_prenorm,
)
from ._target import check_size, resolve_target
from .published import PublishedCheck


@dataclass(frozen=True)
class HcPrenormEstimate:
    """Modelled (not measured) chip time of one HC pre-norm GEMM call; ``*_us`` are the busiest core's pipe busy
    times (Cube, MTE1, the AIC's MTE2 for B, one AIV's MTE2 for A, its Vector unit and UB -> L1 copies) and the chip's
    HBM and L2 traffic; ``fill_us`` what the first token block exposes, ``store_us`` the store phases that sum the
    splits (FixPipe, barriers)."""

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
    mte1_us: float
    mte2_us: float
    aiv_mte2_us: float
    vector_us: float
    ub_to_l1_us: float
    hbm_us: float
    l2_us: float
    fill_us: float
    store_us: float
    reduce_us: float
    launch_us: float
    hbm_bytes: int
    flops: float
    num_units: int
    num_waves: int
    active_cores: int = 0

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
            f"  config: block_m {c.block_m}, block_n {c.block_n}, block_k {c.block_k}, {c.num_splits} K splits "
            f"x {c.cores_per_split} cores, {c.num_l0c_stages} token blocks in L0C"
            f"{', splits summed in split order' if c.reduce_splits else ''}; {self.num_units} units, "
            f"{self.num_waves} on the busiest core, {self.active_cores} cores",
            f"  per resource (us): cube {self.cube_us:.2f} (HF32 at {HF32_FLOPS_FRACTION:g}x the BF16 rate), "
            f"mte1 {self.mte1_us:.2f}, mte2 (B) {self.mte2_us:.2f}, aiv mte2 (A) {self.aiv_mte2_us:.2f}, "
            f"vector {self.vector_us:.2f}, ub->l1 {self.ub_to_l1_us:.2f}, l2 {self.l2_us:.2f}, hbm {self.hbm_us:.2f}, "
            f"fill {self.fill_us:.2f}, store {self.store_us:.2f}, launch {self.launch_us:.2f}",
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
        mte1_us=cost.mte1_s * 1e6, mte2_us=cost.mte2_s * 1e6, aiv_mte2_us=cost.aiv_mte2_s * 1e6,
        vector_us=cost.vector_s * 1e6, ub_to_l1_us=cost.ub_to_l1_s * 1e6, hbm_us=cost.hbm_s * 1e6,
        l2_us=cost.l2_s * 1e6, fill_us=cost.fill_s * 1e6, store_us=cost.store_s * 1e6, reduce_us=cost.reduce_s * 1e6,
        launch_us=cost.launch_s * 1e6, hbm_bytes=cost.hbm_bytes, flops=cost.flops, num_units=cost.num_units,
        num_waves=cost.num_waves, active_cores=cost.active_cores,
    )


# Published rows ----------------------------------------------------------------------------------------------

# Source: DeepGEMM-Ascend README (release 2026-09-30), as quoted in issue 25: Ascend 950DT, bench_msprof with a cold
# L2; tf32_hc_prenorm_gemm with N = 24, K = 28672 (hc = 4 x hidden 7168), no caller split (num_splits=None: the
# kernel splits K and adds the splits itself), deterministic mode off (DeepGEMM's default). The benchmark's M values
# are those of DeepGEMM's tests/test_hyperconnection.py (13, 137, 4096, 8192); only M = 13 and M = 4096 are quoted.
# (M, N, K, microseconds, TFLOPS)
PUBLISHED = (
    (13, 24, 28672, 6.0, 3),
    (4096, 24, 28672, 72.3, 78),
)
_SOURCE = "DeepGEMM-Ascend README 2026-09-30 (950DT, bench_msprof, cold L2), via issue 25"


def published_checks(arch: str = "950DT") -> list[PublishedCheck]:
    """The published HC pre-norm rows beside the model on ``arch`` with all its AI cores."""
    rows = []
    for m, n, k, us, _tflops in PUBLISHED:
        cores = get_arch(arch).num_ai_cores
        est = estimate_hc_prenorm_gemm(m, n, k, deterministic=False, arch=arch, num_ai_cores=cores)
        terms = (("cube", est.cube_us), ("mte2 B", est.mte2_us), ("aiv mte2 A", est.aiv_mte2_us),
                 ("vector", est.vector_us), ("ub->l1", est.ub_to_l1_us), ("l2", est.l2_us), ("hbm", est.hbm_us),
                 ("fill", est.fill_us), ("store", est.store_us), ("launch", est.launch_us))
        c = est.config
        rows.append(PublishedCheck(
            family="tf32_hc_prenorm_gemm", problem=f"M={m} N={n} K={k} ({c.num_splits} splits x {c.cores_per_split})",
            published_us=us, modelled_us=est.time_us, bound=est.bound, source=_SOURCE, terms=terms))
    return rows
