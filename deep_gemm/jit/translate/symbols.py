"""The translator's records, shared by its mixins (a leaf of the sub-package): the kernel entry's ABI (EntryParam),
a function's signature (FuncSig), a local symbol (Sym) and the state of the function being translated (FuncCtx)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tree_sitter import Node

from .ctype import CType


@dataclass(frozen=True)
class EntryParam:
    """One parameter of the kernel entry, as a launcher binds it: ``name``; ``c_type``, the C spelling without the
    name (macros such as __gm__ blanked, e.g. "GM_ADDR", "uint32_t", "const GlobalTensor<float>&"); ``kind``:
    "pointer" (GM_ADDR, T*, GlobalTensor/LocalTensor, passed as a numpy array) or "scalar" (passed as a Python/numpy
    number); ``dtype``: the numpy name of the scalar or of the element type ("uint8" for GM_ADDR), None if unknown;
    ``ndim``: the array rank a pointer takes (1 for T* and GM_ADDR; 0 = any rank for tensors and scalars)."""

    name: str
    c_type: str
    kind: str
    dtype: str | None
    ndim: int = 0


@dataclass
class FuncSig:
    name: str
    params: list[tuple[str, CType]]
    ret: CType
    is_entry: bool
    node: Node
    abi: tuple[EntryParam, ...] = ()  # the parameters as EntryParam, in order


@dataclass
class Sym:
    ctype: CType
    const: bool = False
    line: int = 0


@dataclass
class FuncCtx:
    sig: FuncSig
    scopes: list[dict[str, Sym]] = field(default_factory=list)
    loops: list[list[str] | None] = field(default_factory=list)  # per loop: update lines to run before continue
    const_values: dict[str, object] = field(default_factory=dict)
    cancel: bool = False  # the cancel flag (CANCEL) is in scope: persistent tile loops check it
    owners: dict[int, list[str]] = field(default_factory=dict)  # scope depth -> owners of the buffers it allocated
