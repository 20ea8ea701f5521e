"""Pure (GemmDesc, ArchSpec) -> GemmConfig choices and the Ascend cost model; no numpy arrays, no numba.

``get_best_config`` searches the legal configs (``candidate_configs``) for the fastest under ``model_gemm``;
``deep_gemm.estimate_gemm`` reports the same model's prediction for users.
"""

from ..arch import ARCHS, ArchSpec, get_arch
from .config import (
    GemmConfig,
    GemmDesc,
    buffer_bytes,
    check_desc,
    config_violations,
    cube_operand_bits,
    stream_l1_bytes,
)
from .model import GemmCost, keeps_a_resident, model_gemm
from .select import candidate_configs, get_best_config, get_best_config_and_cost, print_config_once
