"""Shared launcher logic of the GEMM kernel families: GemmDesc -> config -> capacity check -> template constants ->
jit.build, memoized per problem; GM arrays -> the flat views + outer strides the kernels take; dry-run compiles.

Validation of user input is the API's job (deep_gemm/api); these functions trust their arguments' shapes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from .. import runtime
from ..heuristics.arch import ArchSpec
from ..heuristics.config import GemmConfig, GemmDesc

# NOTES: outputs and operands arrive as numpy arrays whose bits the kernels read; these dtypes are the storage
# the kernels are compiled for (views of other same-width dtypes are taken, never copies).
_STORAGE = {"fp8": np.uint8, "fp4": np.uint8, "bf16": np.uint16}
_OUT_STORAGE = {"bf16": np.uint16, "fp32": np.float32}


# NOTES: the schedules the GEMM templates implement: one M x N grid, or the M-grouped walk over each group's rows
# (contiguous, masked and batched differ only in where the host says the groups are). K-grouped calls launch the
# normal schedule once per group.
KERNEL_GEMM_TYPES = ("normal", "m_grouped_contiguous", "m_grouped_masked", "batched")


@dataclass(frozen=True)
class GroupedLayout:
    """Where an M-grouped launch's groups are, as its kernel reads them from GM.

    Group g owns rows [group_start[g], group_start[g] + clamp(group_rows[g], 0, max_group_rows)) of A and D (both
    int32 [G], C-contiguous; group_rows is masked_m itself for the masked kind, read by the kernel only), and its B
    (and B's scales) start ``group_stride_b`` (``group_stride_sfb``) elements after group g - 1's.
    """

    group_start: np.ndarray
    group_rows: np.ndarray
    max_group_rows: int
    group_stride_b: int
    group_stride_sfb: int = 0

    @property
    def num_groups(self) -> int:
        return int(self.group_rows.shape[0])

    def kernel_args(self, with_sf: bool) -> tuple:
        args = (self.group_start, self.group_rows, int(self.num_groups), int(self.max_group_rows),
                int(self.group_stride_b))
        return args + (int(self.group_stride_sfb),) if with_sf else args


@dataclass(frozen=True)
class PreparedGemm:
    """What one problem resolves to: its desc, the chosen config, the template constants and the kernel."""

    desc: GemmDesc
    config: GemmConfig
    constants: dict
    kernel: object  # deep_gemm.jit.CompiledKernel


_prepared: dict[tuple, PreparedGemm] = {}
_prepared_lock = threading.Lock()


def gm_view(x: np.ndarray, storage: type) -> tuple[np.ndarray, int]:
    """(flat 1-D view, outer stride in elements) of 2-D storage with unit last stride, as the kernels take GM.

    The view covers exactly the bytes the rows span (no copy); non-tight rows keep their stride. Same-width
    dtypes are reinterpreted (e.g. float8_e4m3fn or int8 codes -> uint8, bfloat16 -> uint16).
    """
    if x.dtype != storage:
        x = x.view(storage)
    rows, cols = x.shape
    if x.flags.c_contiguous:
        return x.reshape(-1), cols
    stride = x.strides[0] // x.itemsize
    flat = np.lib.stride_tricks.as_strided(x, shape=((rows - 1) * stride + cols,), strides=(x.itemsize,))
    return flat, stride


def sf_view(sf: np.ndarray) -> tuple[np.ndarray, int]:
    """(flat int16 view, row stride in int16) of a required-layout scale tensor [ceil(K/64), MN] (or its uint8
    view [ceil(K/64), 2 * MN])."""
    if sf.dtype != np.int16:
        sf = sf.view(np.int16)
    return gm_view(sf, np.int16)


def storage_dtype(dtype: str) -> type:
    """numpy storage dtype of an operand kind ("fp8", "fp4", "bf16")."""
    return _STORAGE[dtype]


def out_storage_dtype(out_dtype: str) -> type:
    """numpy storage dtype of D ("bf16" -> uint16 bits, "fp32" -> float32)."""
    return _OUT_STORAGE[out_dtype]


def out_dtype_of(d: np.ndarray) -> str:
    """"fp32" for a float32 D, else "bf16" (uint16 bits or ml_dtypes.bfloat16)."""
    return "fp32" if d.dtype == np.float32 else "bf16"


def compiled_shape(compiled_dims: str, m: int, n: int, k: int) -> dict[str, int]:
    """SHAPE_M/N/K template constants: the size for each letter of ``compiled_dims``, 0 (runtime) otherwise."""
    return {"SHAPE_M": m if "m" in compiled_dims else 0, "SHAPE_N": n if "n" in compiled_dims else 0,
            "SHAPE_K": k if "k" in compiled_dims else 0}


def gemm_constants(desc: GemmDesc, config: GemmConfig, compiled_dims: str, resident_a: bool) -> dict[str, object]:
    """Every template constant of a GEMM kernel: the config's (BLOCK_M ... PATH), the compiled shape, the majors,
    the dtypes, the epilogue mode, the stream path's resident-A flag and the schedule (GEMM_TYPE)."""
    if desc.gemm_type not in KERNEL_GEMM_TYPES:
        raise ValueError(f"gemm_type={desc.gemm_type!r} has no kernel schedule; allowed: {KERNEL_GEMM_TYPES}")
    constants = config.template_constants()
    constants.update(compiled_shape(compiled_dims, desc.m, desc.n, desc.k))
    constants.update(
        MAJOR_A=desc.major_a, MAJOR_B=desc.major_b, A_DTYPE=desc.a_dtype, B_DTYPE=desc.b_dtype,
        OUT_DTYPE=desc.out_dtype, WITH_ACCUMULATION=desc.with_accumulation, RESIDENT_A=resident_a,
        GEMM_TYPE=desc.gemm_type,
    )
    return constants


def prepare_gemm(kernel_name: str, desc: GemmDesc, compiled_dims: str, arch: ArchSpec,
                 config: GemmConfig | None = None) -> PreparedGemm:
    """Resolve (memoized per problem) the config and the built kernel of ``desc``.

    ``config`` overrides the heuristic (tests and benchmarks); otherwise heuristics.get_best_config decides.
    Raises device.BufferCapacityError for a config the chip could not hold.
    """
    key = (kernel_name, desc, compiled_dims, arch.name, config)
    prepared = _prepared.get(key)
    if prepared is not None:
        return prepared
    # Heavy imports only on the first call of a problem: deep_gemm.device pulls in numba.
    from .. import jit
    from ..device.capacity import check_buffer_capacity, keeps_a_resident
    from ..heuristics import get_best_config, print_config_once

    if config is None:
        config = get_best_config(desc, arch)
    resident_a = keeps_a_resident(desc, config, arch, k_is_compiled="k" in compiled_dims)
    check_buffer_capacity(desc, config, arch, resident_a=resident_a)
    constants = gemm_constants(desc, config, compiled_dims, resident_a)
    kernel = jit.build(kernel_name, constants)
    print_config_once(desc, config)
    prepared = PreparedGemm(desc, config, constants, kernel)
    with _prepared_lock:
        _prepared.setdefault(key, prepared)
    return _prepared[key]


def current_target() -> tuple[int, ArchSpec]:
    """(num_ai_cores, arch spec) the kernels are compiled and launched for (runtime settings)."""
    return runtime.get_num_ai_cores(), runtime.get_arch_spec()


def run_or_compile(prepared: PreparedGemm, args: tuple) -> None:
    """Launch the kernel on ``args``; in dry-run mode compile it for their types (filling the caches) instead."""
    if runtime.get_dry_run():
        compile_for(prepared, args)
    else:
        prepared.kernel(*args)


def compile_for(prepared: PreparedGemm, args: tuple) -> None:
    """Compile (or load from numba's cache) the kernel for the types of ``args`` without running it."""
    prepared.kernel.compile(*args)


def dummy_gm(dtype: type) -> np.ndarray:
    """A one-element array with the numba type of a flat GM view of ``dtype`` (for compiling without data)."""
    return np.zeros(1, dtype)
