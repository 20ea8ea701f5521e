"""Expert parallelism on simulated ranks: process groups, symmetric buffers, DeepEP-style dispatch / combine, and
TileKernels' MoE helpers.

- ``group``: ``ShmGroup`` (ranks of ``deep_gemm.testing.spawn``), ``TorchGroup`` (a torch.distributed gloo group),
  ``LocalGroup`` (one rank), ``as_group``, ``RankFailedError``;
- ``symm``: ``SymmetricBuffer(group, nbytes)`` with ``.local`` / ``.all`` ([num_ranks, nbytes] uint8) views;
- ``buffer``: ``ElasticBuffer`` (DeepEP's dispatch / combine / get_dispatch_layout), ``EPHandle``, ``EventOverlap``;
- ``reference``: DeepEP's reference dispatch / combine in numpy (every rank's inputs in, one rank's result out).
"""

from .buffer import TOPK_IDX_DTYPE as topk_idx_t
from .buffer import ElasticBuffer, EPHandle, EventOverlap
from .group import LocalGroup, RankFailedError, ShmGroup, TorchGroup, as_group
from .symm import SymmetricBuffer

__all__ = [
    "SymmetricBuffer", "ElasticBuffer", "EPHandle", "EventOverlap", "topk_idx_t",
    "RankFailedError", "ShmGroup", "TorchGroup", "LocalGroup", "as_group",
]
