"""Ascend NPU specs as data: the numbers every capacity rule, the cost model and the device stand-in read.

Figures: shared reference ascend_hardware.md (CANN platform INIs) and DeepGEMM-Ascend's heuristics (section 7).
"""

from __future__ import annotations

from dataclasses import dataclass

KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True)
class ArchSpec:
    name: str
    num_ai_cores: int
    clock_hz: float
    l1_bytes: int
    l0a_bytes: int
    l0b_bytes: int
    l0c_bytes: int
    ub_bytes: int  # usable UB per AIV
    l2_bytes: int
    bf16_flops_per_cycle: int  # per core; FP8 x2, FP4 x4 where supported
    has_fp8: bool
    hbm_bytes_per_s: float  # effective GM (HBM) bandwidth, whole chip
    l2_bytes_per_s: float  # effective L2 bandwidth, whole chip
    gm_to_l1_bytes_per_cycle: int  # MTE2, per core
    l1_to_l0_bytes_per_cycle: int  # MTE1, per core
    sf_l1_to_l0_bytes_per_cycle: int
    fixpipe_bytes_per_cycle: int  # L0C -> UB/GM, per core
    l2_sector_bytes: int = 128
    frac_mn: int = 16  # Cube fractal rows
    c0_bytes: int = 32  # Cube fractal row width in bytes

    def flops_per_cycle(self, dtype: str) -> int:
        """Cube FLOP per cycle per core for an operand dtype ("bf16", "fp8" or "fp4")."""
        if dtype == "bf16":
            return self.bf16_flops_per_cycle
        if not self.has_fp8:
            raise ValueError(f"arch {self.name} has no {dtype} Cube path (it supports bf16 only)")
        return self.bf16_flops_per_cycle * {"fp8": 2, "fp4": 4}[dtype]

    def peak_flops(self, dtype: str, num_ai_cores: int | None = None) -> float:
        cores = self.num_ai_cores if num_ai_cores is None else num_ai_cores
        return cores * self.flops_per_cycle(dtype) * self.clock_hz


ASCEND_950DT = ArchSpec(
    name="950DT", num_ai_cores=32, clock_hz=1.65e9,
    l1_bytes=512 * KiB, l0a_bytes=64 * KiB, l0b_bytes=64 * KiB, l0c_bytes=256 * KiB, ub_bytes=248 * KiB,
    l2_bytes=128 * MiB, bf16_flops_per_cycle=8192, has_fp8=True,
    hbm_bytes_per_s=3.5e12, l2_bytes_per_s=4.5e12,
    gm_to_l1_bytes_per_cycle=256, l1_to_l0_bytes_per_cycle=256, sf_l1_to_l0_bytes_per_cycle=32,
    fixpipe_bytes_per_cycle=128,
)
# NOTES: the 28-core 950PR (PCIe / Atlas 350 tier) with 1.6 TB/s HBM and 112 MiB L2 (CANN INI 957bx).
ASCEND_950PR = ArchSpec(
    name="950PR", num_ai_cores=28, clock_hz=1.65e9,
    l1_bytes=512 * KiB, l0a_bytes=64 * KiB, l0b_bytes=64 * KiB, l0c_bytes=256 * KiB, ub_bytes=248 * KiB,
    l2_bytes=112 * MiB, bf16_flops_per_cycle=8192, has_fp8=True,
    hbm_bytes_per_s=1.6e12, l2_bytes_per_s=4.6e12,
    gm_to_l1_bytes_per_cycle=256, l1_to_l0_bytes_per_cycle=256, sf_l1_to_l0_bytes_per_cycle=32,
    fixpipe_bytes_per_cycle=128,
)
# NOTES: 910B2 (A2): 24 cores at 1.8 GHz, L0C 128 KiB, UB 192 KiB, L2 192 MiB, 1.6 TB/s HBM, no FP8 Cube.
ASCEND_910B2 = ArchSpec(
    name="910B2", num_ai_cores=24, clock_hz=1.8e9,
    l1_bytes=512 * KiB, l0a_bytes=64 * KiB, l0b_bytes=64 * KiB, l0c_bytes=128 * KiB, ub_bytes=192 * KiB,
    l2_bytes=192 * MiB, bf16_flops_per_cycle=8192, has_fp8=False,
    hbm_bytes_per_s=1.6e12, l2_bytes_per_s=4.75e12,
    gm_to_l1_bytes_per_cycle=256, l1_to_l0_bytes_per_cycle=256, sf_l1_to_l0_bytes_per_cycle=32,
    fixpipe_bytes_per_cycle=256,
)

ARCHS: dict[str, ArchSpec] = {a.name: a for a in (ASCEND_950DT, ASCEND_950PR, ASCEND_910B2)}


def get_arch(name: str | ArchSpec) -> ArchSpec:
    """Look an arch up by name ("950DT", "950PR", "910B2"; case and an "Ascend" prefix are ignored)."""
    if isinstance(name, ArchSpec):
        return name
    if not isinstance(name, str):
        raise TypeError(f"arch must be a str or ArchSpec, got {type(name).__name__}: {name!r}")
    key = name.strip().upper().removeprefix("ASCEND").strip().lstrip("_-")
    for arch in ARCHS.values():
        if arch.name.upper() == key:
            return arch
    raise ValueError(f"unknown arch {name!r}; known: {sorted(ARCHS)}")
