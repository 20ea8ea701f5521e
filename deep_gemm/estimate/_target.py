"""What every estimator shares: the size check and the one arch / core-count resolver.

An estimate models a chip, not this CPU: ``arch`` defaults to the runtime's (env DG_NPU_ARCH), and the core count
to the runtime's ``get_num_ai_cores()`` when the arch is the runtime's own, else to all of that arch's AI cores.
"""

from __future__ import annotations

import numbers

from .. import runtime
from ..arch import ARCHS, ArchSpec, get_arch

MAX_SIZE = 2**32 - 1


def short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def check_size(name: str, value: object) -> int:
    """A positive int (Python or numpy integer) no larger than MAX_SIZE: TypeError naming ``name`` for anything but
    an integer (a str, a float, a bool), ValueError for one out of range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive integer, got {type(value).__name__}: {name}={short(value)}")
    value = int(value)
    if value < 1:
        raise ValueError(f"{name}={value} must be >= 1")
    if value > MAX_SIZE:
        raise ValueError(f"{name}={short(value)} exceeds {MAX_SIZE} (2^32 - 1): the kernels index it as a uint32")
    return value


def resolve_target(arch: str | ArchSpec | None, num_ai_cores: object) -> tuple[ArchSpec, int]:
    """(arch spec, AI cores) an estimate models; ValueError naming ``arch`` / ``num_ai_cores`` when out of range."""
    if arch is None:
        spec = runtime.get_arch_spec()
    else:
        try:
            spec = get_arch(arch)
        except ValueError:
            raise ValueError(f"arch={arch!r}; allowed: {tuple(ARCHS)}") from None
    if num_ai_cores is None:
        # NOTES: the runtime's core count belongs to the runtime's arch; another arch defaults to all its cores.
        same_arch = arch is None or spec.name == runtime.get_npu_arch()
        cores = min(runtime.get_num_ai_cores(), spec.num_ai_cores) if same_arch else spec.num_ai_cores
    else:
        cores = check_size("num_ai_cores", num_ai_cores)
        if cores > spec.num_ai_cores:
            raise ValueError(f"num_ai_cores={cores} must be in [1, {spec.num_ai_cores}] for arch {spec.name}")
    return spec, cores
