"""Static checks of a kernel config against the chip's buffers: the stand-in's analogue of the kernels'
``static_assert``s. A config whose buffers overflow L1/L0A/L0B/L0C/UB, or whose tiles the templates cannot walk,
is refused before anything is rendered or launched. Pure Python (no numba): a process running cached native kernels
checks configs without importing the device package (which re-exports these names).
"""

from __future__ import annotations

from ..arch import ArchSpec
from .config import GemmConfig, GemmDesc, buffer_bytes, stream_l1_bytes
from .model import keeps_a_resident as model_keeps_a_resident


class BufferCapacityError(ValueError):
    """A kernel config needs more bytes of an on-chip buffer than the arch has (or breaks a tiling rule)."""


def arch_capacity(arch: ArchSpec) -> dict[str, int]:
    """Bytes of each on-chip buffer of ``arch``, keyed like ``buffer_bytes``."""
    return {"L1": arch.l1_bytes, "L0A": arch.l0a_bytes, "L0B": arch.l0b_bytes, "L0C": arch.l0c_bytes,
            "UB": arch.ub_bytes}


def num_mad_tiles(config: GemmConfig) -> int:
    """MAD_M x MAD_N accumulators one BLOCK_M x BLOCK_N output tile needs in L0C at once."""
    return (config.block_m // config.mad_m) * (config.block_n // config.mad_n)


def keeps_a_resident(desc: GemmDesc, config: GemmConfig, arch: ArchSpec, k_is_compiled: bool) -> bool:
    """Whether the stream path keeps the whole A panel in L1: the cost model's rule (the panel fits beside the B
    stages and a core reuses it), and only with K compiled in (the chip sizes L1 statically); otherwise A streams
    through the L1 ring like B.

    NOTES: one rule for the kernel and the model, so the model prices the kernel that runs. DeepGEMM-Ascend's
    resident-operand refinements likewise apply only when K is a compile-time constant.
    """
    return k_is_compiled and model_keeps_a_resident(desc, config, arch)


def check_buffer_capacity(desc: GemmDesc, config: GemmConfig, arch: ArchSpec, *,
                          resident_a: bool = False) -> dict[str, int]:
    """Raise BufferCapacityError if ``config`` cannot run ``desc`` on ``arch``; return the bytes per buffer.

    Checks: every buffer of ``heuristics.config.buffer_bytes`` fits the arch; the L0C holds every MAD accumulator
    of a block (the templates keep them across the K loop); with ``resident_a`` (stream path), the resident A
    panel fits L1 beside the B stages; tiles divide (BLOCK_* by MAD_*), K blocks are whole 32-K scale blocks,
    core counts agree.
    """
    c = config
    # Tiling rules the templates rely on
    for name, block, mad in (("m", c.block_m, c.mad_m), ("n", c.block_n, c.mad_n), ("k", c.block_k, c.mad_k)):
        if mad < 1 or block < mad or block % mad:
            raise BufferCapacityError(f"block_{name}={block} must be a positive multiple of mad_{name}={mad} ({c})")
    if desc.has_sf and c.block_k % 64:
        raise BufferCapacityError(f"block_k={c.block_k} must be a multiple of 64 with scale factors ({c})")
    if min(c.num_l1_stages, c.num_l0_stages, c.num_l0c_stages, c.num_l1_sf_stages, c.sf_k_blocks) < 1:
        raise BufferCapacityError(f"every stage count and sf_k_blocks must be >= 1 ({c})")
    if c.num_ai_cores != desc.num_ai_cores:
        raise BufferCapacityError(f"config.num_ai_cores={c.num_ai_cores} != desc.num_ai_cores={desc.num_ai_cores}")
    if not 1 <= c.num_ai_cores <= arch.num_ai_cores:
        raise BufferCapacityError(f"num_ai_cores={c.num_ai_cores} is not in [1, {arch.num_ai_cores}] on {arch.name}")
    if c.path not in ("cube", "stream"):
        raise BufferCapacityError(f"path={c.path!r} must be 'cube' or 'stream'")

    # Buffer capacities
    need = dict(buffer_bytes(desc, c))
    need["L0C"] = max(need["L0C"], num_mad_tiles(c) * c.mad_m * c.mad_n * 4)
    if resident_a:
        if c.path != "stream":
            raise BufferCapacityError(f"a resident A panel is only used on the stream path, not {c.path!r}")
        need["L1"] = max(need["L1"], stream_l1_bytes(desc, c))
    capacity = arch_capacity(arch)
    for name, nbytes in need.items():
        if nbytes > capacity[name]:
            raise BufferCapacityError(
                f"{name} overflow: the {c.path} kernel config needs {nbytes} bytes of {name}, the {arch.name} has "
                f"{capacity[name]} (m={desc.m} n={desc.n} k={desc.k} {desc.a_dtype}x{desc.b_dtype}; {c})"
            )
    return need
