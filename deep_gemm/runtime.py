"""Runtime controls that kernels and the cost model read: AI-core count, modelled NPU, contiguous-layout alignment,
determinism. Process-wide, like DeepGEMM-Ascend's; ``runtime_scope`` sets them for a block and restores them.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import numpy as np

from . import envs
from .arch import ArchSpec, get_arch

_lock = threading.Lock()
_state: dict[str, object] = {}
# NOTES: inside a public call (call_state) every read returns the snapshot taken when the call began, so another
# thread's set_num_ai_cores / set_npu_arch mid-call cannot give one call two configurations.
_frozen = threading.local()

# NOTES: DeepGEMM-Ascend fixes the M/K alignment of contiguous grouped layouts at 256 (its BLOCK_M for M-grouped);
# here it is the default, and any multiple of 32 may be set (CUDA DeepGEMM's convention).
_MK_ALIGNMENT = 256


def _ensure_defaults() -> None:
    if _state:
        return
    # NOTES: build the defaults aside and publish them only once every check passed, so a bad environment
    # variable fails the same way on every call instead of leaving half-initialised state behind.
    arch = get_arch(envs.DG_NPU_ARCH.get())
    cores = envs.DG_NUM_AI_CORES.get()
    if cores is not None:
        _check_cores(cores, arch)
    _state.update(arch=arch, num_ai_cores=cores, mk_alignment=_MK_ALIGNMENT, deterministic=False, dry_run=False)


def _read() -> dict[str, object]:
    """The state this thread sees: its call's snapshot inside a public call, else the process-wide settings."""
    state = getattr(_frozen, "state", None)
    if state is not None:
        return state
    with _lock:
        _ensure_defaults()
        return dict(_state)


class call_state:
    """``with call_state():`` freezes the runtime settings for this thread for the block (one public call: the
    core count, arch, alignment, determinism and dry-run mode it reads are those at its start). Nested blocks join
    the outer one."""

    __slots__ = ("_outer",)

    def __enter__(self) -> None:
        self._outer = getattr(_frozen, "state", None)
        if self._outer is None:
            with _lock:
                _ensure_defaults()
                _frozen.state = dict(_state)

    def __exit__(self, *exc) -> None:
        if self._outer is None:
            _frozen.state = None


def _check_cores(n: object, arch: ArchSpec) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"num_ai_cores must be an int, got {type(n).__name__}: {n!r}")
    if not 0 < n <= arch.num_ai_cores:
        raise ValueError(f"num_ai_cores={n} must be in [1, {arch.num_ai_cores}] for arch {arch.name}")
    return int(n)


def set_num_ai_cores(num_ai_cores: int) -> None:
    """Set how many logical AI cores kernels are compiled and launched for (1 .. the arch's count)."""
    with _lock:
        _ensure_defaults()
        _state["num_ai_cores"] = _check_cores(num_ai_cores, _state["arch"])


def get_num_ai_cores() -> int:
    """The logical AI-core count kernels use: the last ``set_num_ai_cores``, else the arch's full count."""
    state = _read()
    n = state["num_ai_cores"]
    return state["arch"].num_ai_cores if n is None else n


# DeepGEMM's names: an "SM" is an AI core here.
set_num_sms = set_num_ai_cores
get_num_sms = get_num_ai_cores


def set_npu_arch(arch: str | ArchSpec) -> None:
    """Select the modelled NPU ("950DT" default, "950PR", "910B2"). A core count above the new arch's is reset."""
    spec = get_arch(arch)
    with _lock:
        _ensure_defaults()
        _state["arch"] = spec
        n = _state["num_ai_cores"]
        if n is not None and n > spec.num_ai_cores:
            _state["num_ai_cores"] = None


def get_npu_arch() -> str:
    """Name of the modelled NPU."""
    return get_arch_spec().name


def get_arch_spec() -> ArchSpec:
    """The ``ArchSpec`` of the modelled NPU."""
    return _read()["arch"]


def set_mk_alignment_for_contiguous_layout(value: int) -> None:
    """Set the M/K alignment of the contiguous grouped layouts: every group of an M-grouped psum layout starts at
    align(psum[g-1], value), every K group at align(end[g-1], value). Any positive multiple of 32 (CUDA DeepGEMM
    users pass 128); the default is DeepGEMM-Ascend's 256. Read once per call."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"mk alignment must be an int, got {type(value).__name__}: {value!r}")
    # NOTES: the M-grouped schedule starts its M blocks at each group's first row whatever the alignment, so any
    # start works there; 32 is the UE8M0 scale block along K, and a K group must start on a block boundary.
    if value < 32 or value % 32:
        raise ValueError(f"mk alignment for contiguous layout must be a positive multiple of 32, got {value}")
    with _lock:
        _ensure_defaults()
        _state["mk_alignment"] = int(value)


def get_mk_alignment_for_contiguous_layout() -> int:
    """The alignment set by ``set_mk_alignment_for_contiguous_layout`` (256 by default)."""
    return _read()["mk_alignment"]


def get_theoretical_mk_alignment_for_contiguous_layout(expected_m: int | None = None) -> int:
    """The alignment DeepGEMM-Ascend's kernels are built for (256, its M-grouped BLOCK_M, whatever ``expected_m``)."""
    return _MK_ALIGNMENT


def use_deterministic_algorithms(enabled: bool = True) -> None:
    """Deterministic mode, read by ``tf32_hc_prenorm_gemm`` (the one kernel that splits K on its own): its split
    count then depends only on the shape and the arch, never on the core count, and the splits are summed in split
    order, so D is bitwise the same across runs, thread counts and ``set_num_ai_cores``. The GEMM kernels never
    split K and are deterministic either way (every kernel here sums in a fixed order; on the chip, the
    non-deterministic HC pre-norm would add its splits with atomics)."""
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}: {enabled!r}")
    with _lock:
        _ensure_defaults()
        _state["deterministic"] = enabled


def get_deterministic_algorithms() -> bool:
    return _read()["deterministic"]


def set_dry_run(value: bool) -> None:
    """In dry-run mode GEMM calls validate and compile their kernel but neither launch it nor touch ``d``."""
    if not isinstance(value, bool):
        raise TypeError(f"dry_run must be a bool, got {type(value).__name__}: {value!r}")
    with _lock:
        _ensure_defaults()
        _state["dry_run"] = value


def get_dry_run() -> bool:
    return _read()["dry_run"]


@contextlib.contextmanager
def dry_run() -> Iterator[None]:
    """``with dry_run():`` compile without launching, then restore the previous mode."""
    previous = get_dry_run()
    set_dry_run(True)
    try:
        yield
    finally:
        set_dry_run(previous)


@contextlib.contextmanager
def runtime_scope(*, num_ai_cores: int | None = None, arch: str | None = None) -> Iterator[None]:
    """Set the arch and/or core count for a ``with`` block, restoring the previous settings after it."""
    with _lock:
        _ensure_defaults()
        saved = dict(_state)
    try:
        if arch is not None:
            set_npu_arch(arch)
        if num_ai_cores is not None:
            set_num_ai_cores(num_ai_cores)
        yield
    finally:
        with _lock:
            _state.clear()
            _state.update(saved)
