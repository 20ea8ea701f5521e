"""Integer values of the Ascend C enumerations and named constants a template may spell (``HardEvent::MTE2_MTE1``,
``Major::K``, ``PIPE_MTE2`` ...). The translator turns them into module constants of the generated kernel; device
functions that need to tell them apart import the same tables from here. The numbers are ours (the chip's are not
public and nothing on the CPU depends on them); only their distinctness matters.
"""

from __future__ import annotations

# Pipe pairs of SetFlag/WaitFlag: source pipe _ waiting pipe (ascend_hardware.md A6), in the documented order.
_HARD_EVENTS = (
    "MTE2_MTE1 MTE1_MTE2 MTE1_M M_MTE1 MTE2_V V_MTE2 MTE3_V V_MTE3 M_V V_M V_V MTE3_MTE1 MTE1_MTE3 MTE1_V MTE2_M "
    "M_MTE2 V_MTE1 M_FIX FIX_M MTE3_MTE2 MTE2_MTE3 S_V V_S S_MTE2 MTE2_S S_MTE3 MTE3_S MTE2_FIX FIX_MTE2 FIX_S M_S "
    "FIX_MTE3"
).split()

# Scoped enumerations: `Scope::NAME` -> int.
SCOPED: dict[str, dict[str, int]] = {
    "HardEvent": {name: i for i, name in enumerate(_HARD_EVENTS)},
    "Major": {"K": 0, "MN": 1},
    "GemmType": {"Normal": 0, "MGroupedContiguousWithPsumLayout": 1, "KGroupedContiguousWithPsumLayout": 2,
                 "Batched": 3},
    "TPosition": {name: i for i, name in enumerate(
        "GM A1 B1 A2 B2 C1 C2 CO1 CO2 VECIN VECOUT VECCALC TSCM".split())},
    # Vector unit (device/vector.py, device/cast.py)
    "CMPMODE": {name: i for i, name in enumerate("LT GT EQ LE GE NE".split())},
    "SELMODE": {"VSEL_CMPMASK_SPR": 0, "VSEL_TENSOR_SCALAR_MODE": 1, "VSEL_TENSOR_TENSOR_MODE": 2},
    "RoundMode": {name: i for i, name in enumerate(
        "CAST_NONE CAST_RINT CAST_FLOOR CAST_CEIL CAST_ROUND CAST_TRUNC CAST_ODD".split())},
    # Reduce the last axis (one result per row) or the first (one per column)
    "ReducePattern": {"AR": 0, "RA": 1},
    "pipe_t": {},  # filled below: PIPE_* are also reachable as pipe_t::PIPE_*
}

# Unscoped named constants: `NAME` -> int.
BARE: dict[str, int] = {name: i for i, name in enumerate(
    "PIPE_S PIPE_V PIPE_M PIPE_MTE1 PIPE_MTE2 PIPE_MTE3 PIPE_FIX PIPE_ALL".split())}
SCOPED["pipe_t"] = dict(BARE)

# Namespaces a qualified name may start with that mean nothing on the CPU (`AscendC::SetFlag` == `SetFlag`).
IGNORED_NAMESPACES = frozenset({"AscendC"})


def python_name(scope: str | None, name: str) -> str:
    """The module-level constant name the generated Python uses for ``scope::name`` (or a bare name)."""
    return f"{scope}_{name}" if scope else name


def lookup(scope: str | None, name: str) -> int | None:
    """Value of ``scope::name`` (scope None for a bare name), or None when the table has no such entry."""
    if scope is None:
        return BARE.get(name)
    return SCOPED.get(scope, {}).get(name)


class _Namespace:
    def __init__(self, values: dict[str, int]):
        self.__dict__.update(values)


# Attribute access for device code: enums.HardEvent.MTE2_MTE1, enums.Major.K, enums.PIPE.MTE2 ...
HardEvent = _Namespace(SCOPED["HardEvent"])
Major = _Namespace(SCOPED["Major"])
GemmType = _Namespace(SCOPED["GemmType"])
TPosition = _Namespace(SCOPED["TPosition"])
CMPMODE = _Namespace(SCOPED["CMPMODE"])
SELMODE = _Namespace(SCOPED["SELMODE"])
RoundMode = _Namespace(SCOPED["RoundMode"])
ReducePattern = _Namespace(SCOPED["ReducePattern"])
PIPE = _Namespace({k[len("PIPE_"):]: v for k, v in BARE.items()})
