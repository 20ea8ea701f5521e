"""The Numba stand-ins for Ascend AI-core intrinsics that kernel templates call (each the executable spec of one
instruction), plus the host-side capacity check. Importing this package imports numba (never done by
``import deep_gemm``).

Template-callable intrinsics are the names in ``__all__``; each is an ``@njit(cache=True)`` function.
"""

from __future__ import annotations

from ..jit.numba_setup import apply_numba_settings

# NOTES: must run before any intrinsic below compiles (numba reads it when building its CPU target).
apply_numba_settings()

from .capacity import (  # noqa: E402
    BufferCapacityError,
    arch_capacity,
    check_buffer_capacity,
    keeps_a_resident,
    num_mad_tiles,
)
from .cast import (  # noqa: E402
    Cast,
    CastAxpyRows,
    CastFromUE8M0,
    CastMulReluAxpyRows,
    CastReduceSumSquares,
    CastToUE8M0,
)
from .copy import (  # noqa: E402
    FP4_E2M1_VALUES,
    FP8_E4M3_VALUES,
    copy_gm_to_l1_bf16,
    copy_gm_to_l1_fp4,
    copy_gm_to_l1_fp4_bursts,
    copy_gm_to_l1_fp8,
    copy_gm_to_l1_fp8_bursts,
    copy_gm_to_l1_sf,
    copy_gm_to_l1_tf32,
)
from .cube import l0a_size, l0b_size, load_l0a, load_l0b, mmad  # noqa: E402
from .datacopy import DataCopy, DataCopyBursts, DataCopyPad  # noqa: E402
from .fixpipe import Fixpipe, FixpipeToUB, InitGlobalMemory, bf16_bits_to_f32, f32_to_bf16_bits  # noqa: E402
from .fixpipe_relu import FixpipeToUBRelu  # noqa: E402
from .scheduler import (  # noqa: E402
    get_grouped_block,
    get_grouped_num_tiles,
    get_padding_run,
    get_swizzled_block,
    grouped_tile_order,
    tile_order,
)
from .select import CountNaN, OrderKeys, RadixSelect, TopkCompact, TopkFilter, TopkSortDesc  # noqa: E402
from .sync import NUM_EVENT_IDS, PipeBarrier, SetFlag, WaitFlag  # noqa: E402
from .tensor import slot_view, tile_view  # noqa: E402
from .vector import (  # noqa: E402
    Abs,
    Add,
    Adds,
    Axpy,
    Compare,
    Div,
    Duplicate,
    Exp,
    Max,
    Maxs,
    Min,
    Mins,
    Mul,
    Muls,
    ReduceMax,
    ReduceSum,
    Relu,
    Select,
    Sub,
)

# Intrinsics a template may call (the translator resolves calls against this list).
__all__ = [
    # MTE2: GM -> L1
    "copy_gm_to_l1_fp8", "copy_gm_to_l1_fp4", "copy_gm_to_l1_bf16", "copy_gm_to_l1_sf", "copy_gm_to_l1_tf32",
    "copy_gm_to_l1_fp8_bursts", "copy_gm_to_l1_fp4_bursts",
    # MTE1 + Cube (device/cube.py)
    "l0a_size", "l0b_size", "load_l0a", "load_l0b", "mmad",
    # FixPipe: L0C -> GM, L0C -> UB; GM fill
    "Fixpipe", "FixpipeToUB", "InitGlobalMemory", "FixpipeToUBRelu",
    # AIV: GM <-> UB (MTE2 / MTE3)
    "DataCopy", "DataCopyPad", "DataCopyBursts",
    # AIV: Vector unit (device/vector.py, device/cast.py)
    "Add", "Sub", "Mul", "Div", "Max", "Min", "Adds", "Muls", "Axpy", "Maxs", "Mins", "Abs", "Exp", "Relu", "Duplicate",
    "Compare", "Select", "ReduceMax", "ReduceSum", "Cast", "CastReduceSumSquares", "CastAxpyRows",
    "CastMulReluAxpyRows", "CastToUE8M0", "CastFromUE8M0",
    # AIV: top-k selection (device/select.py)
    "OrderKeys", "CountNaN", "TopkFilter", "RadixSelect", "TopkCompact", "TopkSortDesc",
    # Pipe synchronisation
    "SetFlag", "WaitFlag", "PipeBarrier",
    # Scheduler
    "get_swizzled_block", "get_grouped_num_tiles", "get_grouped_block", "get_padding_run",
    # LocalTensor views
    "slot_view", "tile_view",
]
