"""Testing helpers (public, like DeepGEMM's): metrics, the numpy reference GEMM, CPU timing (the steady-state
protocol, the machine's description and FMA peak, the numpy / JAX peers the benches compare with), test-data
generators."""

from .bench import STEADY_PROTOCOL, PairedTiming, SteadyTiming, bench, bench_paired, bench_steady
from .dist import init_dist, spawn  # noqa: F401 - simulated ranks (not torch-wrapped: they take no arrays)
from .generators import (
    FP4_SF_CHOICES,
    FP8_SF_CHOICES,
    bf16_operand,
    fp4_operand,
    fp8_operand,
    grouped_layouts,
    random_fp4_codes,
    random_fp8_codes,
    random_sf,
)
from .machine import FmaPeak, describe_machine, measure_fma_peak
from .numeric import assert_bitwise_equal, calc_diff, count_bytes
from .par_compile import par_compile
from .peers import jax_version, numpy_fp4_gemm, numpy_fp8_gemm, numpy_fp8_gemm_naive
from .reference import dequantize_fp4, dequantize_fp8, reference_gemm

__all__ = [
    "calc_diff", "count_bytes", "assert_bitwise_equal",
    "dequantize_fp8", "dequantize_fp4", "reference_gemm",
    "bench", "bench_paired", "PairedTiming", "bench_steady", "SteadyTiming", "STEADY_PROTOCOL", "par_compile",
    "fp8_operand", "fp4_operand", "bf16_operand", "random_fp8_codes", "random_fp4_codes", "random_sf",
    "grouped_layouts",
    "describe_machine", "measure_fma_peak", "FmaPeak",
    "numpy_fp8_gemm", "numpy_fp4_gemm", "numpy_fp8_gemm_naive", "jax_version",
    "FP8_SF_CHOICES", "FP4_SF_CHOICES",
]

# NOTES: the functions above take CPU torch tensors wherever they take numpy arrays and return torch tensors for
# them, zero-copy (deep_gemm/_torch.py); the submodules keep the numpy-only originals.
from .._torch import wrap_exports as _wrap_exports  # noqa: E402

_wrap_exports(globals(), __all__, __name__)
