"""Pure (GemmDesc, ArchSpec) -> GemmConfig choices and the Ascend cost model; no numpy arrays, no numba."""

from .arch import ARCHS, ArchSpec, get_arch
from .config import GemmConfig, GemmDesc, buffer_bytes
