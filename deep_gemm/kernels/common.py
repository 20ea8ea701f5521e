"""What the GEMM kernel families share on top of the kernel layer (family.py): the GemmDesc -> GemmConfig ->
capacity check -> template constants of a GEMM family, the per-call preparation, and GM arrays -> the flat views +
outer strides the kernels take.

Validation of user input is the API's job (deep_gemm/api); these functions trust their arguments' shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import envs, runtime
from ..arch import ArchSpec
from ..heuristics.config import GemmConfig, GemmDesc
from .family import KernelFamily, PreparedKernel

# NOTES: outputs and operands arrive as numpy arrays whose bits the kernels read; these dtypes are the storage
# the kernels are compiled for (views of other same-width dtypes are taken, never copies).
_OUT_STORAGE = {"bf16": np.uint16, "fp32": np.float32, "fp8": np.uint8}


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
    ``zero_padding`` (contiguous kind only, None for the others): the kernel writes zeros into the rows of D
    [0, max_group_rows) that no group owns (ensure_zero_padding), or leaves them untouched.
    """

    group_start: np.ndarray
    group_rows: np.ndarray
    max_group_rows: int
    group_stride_b: int
    group_stride_sfb: int = 0
    zero_padding: bool | None = None

    @property
    def num_groups(self) -> int:
        return int(self.group_rows.shape[0])

    def kernel_args(self, with_sf: bool) -> dict[str, object]:
        """The M-grouped entry parameters (templates/lib/gemm.asc.j2 grouped_params), by name."""
        args = {"gm_group_start": self.group_start, "gm_group_rows": self.group_rows, "num_groups": self.num_groups,
                "max_group_rows": self.max_group_rows, "group_stride_b": self.group_stride_b}
        if with_sf:
            args["group_stride_sfb"] = self.group_stride_sfb
        if self.zero_padding is not None:
            args["zero_padding"] = int(self.zero_padding)
        return args


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


def out_storage_dtype(out_dtype: str) -> type:
    """numpy storage dtype of D ("bf16" -> uint16 bits, "fp32" -> float32)."""
    return _OUT_STORAGE[out_dtype]


def out_dtype_of(d: np.ndarray) -> str:
    """"fp32" for a float32 D, "fp8" for e4m3 codes (uint8 or float8_e4m3fn: the FP8Quantization epilogue), else
    "bf16" (uint16 bits or ml_dtypes.bfloat16)."""
    if d.dtype == np.float32:
        return "fp32"
    return "fp8" if d.itemsize == 1 else "bf16"


def out_args(d: np.ndarray, out_dtype: str, sfd: np.ndarray | None) -> dict[str, object]:
    """The entry's D parameters by name: gm_d / stride_d, plus gm_sfd / stride_sfd (uint16 rows [N/64, >= M], the
    physical form of the int16 [M, N/64] scales with strides (1, M)) for FP8 output."""
    flat_d, stride_d = gm_view(d, out_storage_dtype(out_dtype))
    args = {"gm_d": flat_d, "stride_d": stride_d}
    if sfd is not None:
        args["gm_sfd"], args["stride_sfd"] = gm_view(sfd.T, np.uint16)
    return args


def compiled_shape(compiled_dims: str, m: int, n: int, k: int) -> dict[str, int]:
    """SHAPE_M/N/K template constants: the size for each letter of ``compiled_dims``, 0 (runtime) otherwise."""
    return {"SHAPE_M": m if "m" in compiled_dims else 0, "SHAPE_N": n if "n" in compiled_dims else 0,
            "SHAPE_K": k if "k" in compiled_dims else 0}


def gemm_constants(desc: GemmDesc, config: GemmConfig, compiled_dims: str, resident_a: bool,
                   l0_bf16: str | bool | None = None) -> dict[str, object]:
    """Every template constant of a GEMM kernel: the config's (BLOCK_M ... PATH), the compiled shape, the majors,
    the dtypes, the epilogue mode, the stream path's resident-A flag, the schedule (GEMM_TYPE) and the L0 type
    (CUBE_L0_BF16: the bf16 unit, "amx" or "dpbf16", or "" for fp32 L0; cube_l0_bf16() unless given)."""
    if l0_bf16 is None:
        l0_bf16 = cube_l0_bf16(desc.a_dtype, desc.b_dtype)
    l0_bf16 = l0_bf16 or ""
    if desc.gemm_type not in KERNEL_GEMM_TYPES:
        raise ValueError(f"gemm_type={desc.gemm_type!r} has no kernel schedule; allowed: {KERNEL_GEMM_TYPES}")
    constants = config.template_constants()
    constants.update(compiled_shape(compiled_dims, desc.m, desc.n, desc.k))
    constants.update(
        MAJOR_A=desc.major_a, MAJOR_B=desc.major_b, A_DTYPE=desc.a_dtype, B_DTYPE=desc.b_dtype,
        OUT_DTYPE=desc.out_dtype, WITH_ACCUMULATION=desc.with_accumulation, RESIDENT_A=resident_a,
        GEMM_TYPE=desc.gemm_type, CUBE_L0_BF16=l0_bf16,
    )
    return constants


def gemm_template_constants(desc: GemmDesc, config: GemmConfig, arch: ArchSpec, *,
                            compiled_dims: str, cube_l0_bf16: str | bool | None = None) -> dict[str, object]:
    """A GEMM family's template constants (KernelFamily.template_constants): decides the resident-A panel and checks
    the config against the chip's buffers first. Raises device.BufferCapacityError for a config the chip could not
    hold (the analogue of the real kernel's static_asserts)."""
    from ..heuristics.capacity import check_buffer_capacity, keeps_a_resident

    resident_a = keeps_a_resident(desc, config, arch, k_is_compiled="k" in compiled_dims)
    check_buffer_capacity(desc, config, arch, resident_a=resident_a)
    constants = gemm_constants(desc, config, compiled_dims, resident_a, cube_l0_bf16)
    if desc.out_dtype == "fp8":  # the FP8Quantization epilogue: a mixed kernel; the AIVs' UB stages and size
        from ..heuristics.config import EPILOGUE_UB_STAGES

        constants.update(NUM_UB_STAGES=EPILOGUE_UB_STAGES, UB_BYTES=arch.ub_bytes)
    return constants


# Operand dtypes whose every value (times a power-of-two scale) is exact in bf16: the Cube may run them on bf16 L0.
BF16_EXACT_DTYPES = ("bf16", "fp8", "fp4")


def cube_l0_bf16(*operand_dtypes: str) -> str:
    """The unit a kernel built now runs these operands' Mmads on when it keeps them in bf16 L0 buffers: "amx" (the
    host's AMX tile unit) or "dpbf16" (its AVX512-BF16 dot products), as jit.cpu_features.cube_bf16_unit() picks
    it (which asks the OS for the tile state first, so a kernel rendered for AMX never runs in a process without
    that permission); "" (false) when some operand is not exact in bf16 or no bf16 unit is enabled (fp32 L0, the
    FMA Cube). The unit is a template constant (CUBE_L0_BF16), so it is part of every kernel's key and source."""
    for dtype in operand_dtypes:
        if dtype not in BF16_EXACT_DTYPES:
            return ""
    return (_cube_bf16_unit or _bind_cube_bf16_unit())()


# NOTES: jit.cpu_features is imported on the first call, not with this module (importing deep_gemm.jit costs tens of
# ms), and then kept here: an import statement per call would cost about a microsecond of every GEMM's dispatch.
_cube_bf16_unit = None


def _bind_cube_bf16_unit():
    global _cube_bf16_unit
    from ..jit.cpu_features import cube_bf16_unit

    _cube_bf16_unit = cube_bf16_unit
    return cube_bf16_unit


def _select_config(desc: GemmDesc, arch: ArchSpec) -> GemmConfig:
    from ..heuristics import get_best_config

    return get_best_config(desc, arch)


def _print_config(desc: GemmDesc, config: GemmConfig) -> None:
    from ..heuristics import print_config_once

    print_config_once(desc, config)


def gemm_family(name: str, template: str | None = None) -> KernelFamily:
    """A dense GEMM kernel family: the heuristic's config (heuristics.get_best_config), gemm_template_constants,
    DG_PRINT_CONFIGS reporting."""
    return KernelFamily(name, select_config=_select_config, template_constants=gemm_template_constants,
                        template=template, on_prepared=_print_config)


def prepare_gemm(family: KernelFamily, m: int, n: int, k: int, a_dtype: str, b_dtype: str, out_dtype: str,
                 major_a: str, major_b: str, with_accumulation: bool, compiled_dims: str,
                 config: GemmConfig | None = None, gemm_type: str = "normal", num_groups: int = 1,
                 l0_bf16: bool = True) -> PreparedKernel:
    """The prepared kernel of one dense GEMM call, for the current runtime target (core count, arch); ``l0_bf16``
    False keeps fp32 L0 (the FMA Cube) where cube_l0_bf16() would choose bf16.

    NOTES: the dispatch fast path looks a plain tuple of the call's parameters up first; the GemmDesc is built only
    the first time a problem is seen.
    """
    num_ai_cores, arch = current_target()
    # NOTES: DG_SYNC_CHECK builds other kernels (the checker's): part of the key, and an option of the build.
    sync_check = envs.DG_SYNC_CHECK.get()
    # NOTES: and the Cube's unit for bf16 L0, "" for fp32 L0 (DG_CUBE_AMX / DG_CUBE_DPBF16 may change between
    # calls): another kernel.
    key = (m, n, k, a_dtype, b_dtype, out_dtype, major_a, major_b, with_accumulation, compiled_dims, num_ai_cores,
           arch.name, config, gemm_type, num_groups, sync_check, cube_l0_bf16(a_dtype, b_dtype) if l0_bf16 else "")
    prepared = family.lookup(key)
    if prepared is None:
        desc = GemmDesc(m=m, n=n, k=k, a_dtype=a_dtype, b_dtype=b_dtype, out_dtype=out_dtype, major_a=major_a,
                        major_b=major_b, with_accumulation=with_accumulation, num_ai_cores=num_ai_cores,
                        gemm_type=gemm_type, num_groups=num_groups)
        prepared = family.prepare(desc, arch=arch, config=config,
                                  options={"compiled_dims": compiled_dims, "cube_l0_bf16": key[-1]},
                                  memo_key=key, sync_check=sync_check)
    return prepared


def current_target() -> tuple[int, ArchSpec]:
    """(num_ai_cores, arch spec) the kernels are compiled and launched for (runtime settings)."""
    return runtime.get_num_ai_cores(), runtime.get_arch_spec()
