"""C types and conversions: what the translator knows of a value (CType), the scalar type tables, number
literals, and C's conversion rules (assignment, the usual arithmetic conversions, casts) written as Python."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from tree_sitter import Node

from .. import enums
from ..macros import KNOWN_TYPE_MACROS
from .emitter import strip_parens

# C scalar type spelling -> numpy scalar type name
SCALAR_TYPES: dict[str, str] = {
    "int8_t": "int8", "uint8_t": "uint8", "int16_t": "int16", "uint16_t": "uint16", "int32_t": "int32",
    "uint32_t": "uint32", "int64_t": "int64", "uint64_t": "uint64", "int": "int32", "unsigned": "uint32",
    "unsigned int": "uint32", "long": "int64", "long long": "int64", "unsigned long": "uint64",
    "unsigned long long": "uint64", "size_t": "uint64", "float": "float32", "double": "float64", "bool": "bool_",
}
# sizeof() of types that have no numba scalar type but whose size a template may need
SIZEOF_ONLY: dict[str, int] = {"half": 2, "bfloat16_t": 2, "float8_e4m3_t": 1, "float8_e5m2_t": 1, "hifloat8_t": 1,
                               "float4_e2m1x2_t": 1}
TENSOR_TYPES = ("GlobalTensor", "LocalTensor")


@dataclass(frozen=True)
class CType:
    """What the translator knows of a value: kind in {int, float, bool, array, dtype, unknown, void}."""

    kind: str
    np: str | None = None  # scalar numpy type name, or the element type of an array
    ndim: int = 0
    nonneg: bool = False  # integer provably >= 0

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "bool")

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    def with_nonneg(self, nonneg: bool) -> CType:
        return CType(self.kind, self.np, self.ndim, nonneg and self.kind in ("int", "bool"))


UNKNOWN = CType("unknown")
VOID = CType("void")
BOOL = CType("bool", "bool_", nonneg=True)
F32 = CType("float", "float32")
F64 = CType("float", "float64")


def scalar_ctype(np_name: str, nonneg: bool = False) -> CType:
    if np_name == "bool_":
        return BOOL
    if np_name.startswith("float"):
        return CType("float", np_name)
    return CType("int", np_name, nonneg=nonneg or np_name.startswith("uint"))


def int_ctype(nonneg: bool) -> CType:
    return CType("int", "int64", nonneg=nonneg)



@dataclass(frozen=True)
class Expr:
    code: str
    ctype: CType


def parse_number(text: str) -> tuple[object, bool, bool]:
    """(value, is_float32, is_float) of a C number literal, or (None, ...) when it is not one we support."""
    lower = text.lower()
    try:
        if lower.startswith("0x"):
            if "p" in lower:  # hex float
                body = lower.rstrip("fl")
                return float.fromhex(body), lower.endswith("f"), True
            return int(lower.rstrip("ul"), 16), False, False
        if lower.startswith("0b"):
            return int(lower.rstrip("ul"), 2), False, False
        if any(c in lower for c in ".e"):
            if lower.endswith("f"):
                return float(lower[:-1]), True, True
            return float(lower.rstrip("l")), False, True
        digits = lower.rstrip("ul")
        if lower.endswith("f"):
            return None, False, False
        if len(digits) > 1 and digits.startswith("0"):
            return int(digits, 8), False, False
        return int(digits), False, False
    except ValueError:
        return None, False, False


def _np_spelling(np_name: str) -> str:
    """numpy type used in generated code. NOTES: uint64 becomes int64: numba turns uint64 op int64 into float64,
    and templates keep 64-bit values below 2**63."""
    return "int64" if np_name == "uint64" else np_name


class Conversions:
    """Mixin of Translator: C type nodes -> CType, and C's conversions written as Python expressions."""

    def type_of(self, node: Node | None, context: Node) -> CType:
        """CType of a type node: scalars, auto, void, tensors, GM_ADDR."""
        if node is None:
            raise self.error(context, "missing type")
        kind = node.type
        if kind == "type_descriptor":
            if node.child_by_field_name("declarator") is not None:
                raise self.error(node, "pointer/abstract types are not supported here")
            return self.type_of(node.child_by_field_name("type"), context)
        if kind in ("primitive_type", "sized_type_specifier", "type_identifier"):
            name = " ".join(self.text(node).split())
            if name == "void":
                return VOID
            if name in SCALAR_TYPES:
                return scalar_ctype(SCALAR_TYPES[name])
            if name in KNOWN_TYPE_MACROS:
                return CType("array", KNOWN_TYPE_MACROS[name], 1)
            if name in SIZEOF_ONLY:
                raise self.error(node, f"{name} has no numba scalar type (pass its bits as uint8/uint16 arrays)")
            raise self.error(node, f"unknown type {name!r}")
        if kind == "placeholder_type_specifier":
            return CType("auto")
        if kind == "template_type":
            name = self.text(node.child_by_field_name("name"))
            if name.split("::")[-1] not in TENSOR_TYPES:
                raise self.error(node, f"unknown template type {name!r} (supported: {TENSOR_TYPES})")
            args = node.child_by_field_name("arguments").named_children
            if len(args) != 1 or args[0].type != "type_descriptor":
                raise self.error(node, f"{name}<T> takes one element type")
            elem = self.type_of(args[0].child_by_field_name("type"), node)
            if elem.kind not in ("int", "float", "bool"):
                raise self.error(node, f"{name}<T> needs a scalar element type")
            return CType("array", elem.np, 0)  # ndim 0 = unknown rank
        if kind == "qualified_identifier":
            parts = self.qualified_parts(node)
            if parts[0] in enums.IGNORED_NAMESPACES | {"std"} and len(parts) == 2:
                inner = node.child_by_field_name("name")
                return self.type_of(inner, context)
            raise self.error(node, f"unknown type {'::'.join(parts)!r}")
        raise self.error(node, f"unsupported type ({kind})")

    @staticmethod
    def literal(value, np_name: str) -> str:
        if np_name == "bool_":
            return repr(bool(value))
        if np_name == "float32":
            return f"np.float32({float(value)!r})"
        if np_name.startswith("float"):
            return repr(float(value))
        return repr(int(value))

    def coerce_value(self, value, np_name: str, node: Node):
        if np_name == "bool_":
            return bool(value)
        if np_name.startswith("float"):
            return np.float32(value) if np_name == "float32" else float(value)
        if isinstance(value, (float, np.floating)):
            value = math.trunc(value)
        info = np.iinfo(np.dtype(np_name))
        value = int(value)
        if not info.min <= value <= info.max:
            raise self.error(node, f"constant value {value} does not fit {np_name}")
        return value

    def usual_conversions(self, left: Expr, right: Expr) -> tuple[str, str, CType]:
        """C's usual arithmetic conversions where numba's promotion differs: float32 op int stays float32."""
        lk, rk = left.ctype.kind, right.ctype.kind
        numeric = ("int", "bool", "float")
        if lk not in numeric or rk not in numeric:
            same = left.ctype == right.ctype and lk == "array"
            return left.code, right.code, left.ctype if same else UNKNOWN
        if lk == "float" or rk == "float":
            if "float64" in (left.ctype.np, right.ctype.np):
                return left.code, right.code, F64
            a = left.code if lk == "float" else f"np.float32({strip_parens(left.code)})"
            b = right.code if rk == "float" else f"np.float32({strip_parens(right.code)})"
            return a, b, F32
        return left.code, right.code, int_ctype(False)

    def convert(self, value: Expr, target: CType) -> Expr:
        """Convert value to a declared scalar type as a C assignment would (no-op when already that type)."""
        src = value.ctype
        if target.kind == "float":
            if src.kind == "float" and src.np == target.np:
                return value
            if target.np == "float64" and src.kind in ("int", "bool", "float"):
                return Expr(f"float({strip_parens(value.code)})", F64)
            return Expr(f"np.{target.np}({strip_parens(value.code)})", target)
        if target.kind == "int":
            if src.is_int:
                return Expr(value.code, CType("int", target.np, nonneg=src.nonneg))
            return Expr(f"np.{_np_spelling(target.np)}({strip_parens(value.code)})", target)
        if target.kind == "bool":
            if src.kind == "bool":
                return value
            return Expr(f"({value.code} != 0)", BOOL)
        return value

    @staticmethod
    def keeps_type(target: CType, value: CType) -> bool:
        """Whether numba's `target op= value` keeps target's type as C would (else convert explicitly)."""
        if target.kind in ("int", "bool"):
            return value.is_int
        if target.kind == "float":
            return value.kind == "float" and (value.np == target.np or target.np == "float64") or \
                (target.np == "float64" and value.is_int)
        return True

    def cast_to(self, target: CType, value: Expr, node: Node) -> Expr:
        if target.kind not in ("int", "float", "bool"):
            raise self.error(node, "casts are supported to scalar types only")
        if target.kind == "bool":
            return self.convert(value, BOOL)
        if value.ctype.kind == target.kind and value.ctype.np == target.np:
            return value
        nonneg = target.np.startswith("uint") or (value.ctype.nonneg and value.ctype.is_int)
        return Expr(f"np.{_np_spelling(target.np)}({strip_parens(value.code)})",
                    CType(target.kind, target.np, nonneg=nonneg))
