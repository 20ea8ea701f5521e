"""C types and conversions: what the translator knows of a value (CType), the scalar type tables, number
literals, and C's conversion rules (assignment, the usual arithmetic conversions, casts) written as Python."""

from __future__ import annotations

import math
import re
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


# C integer types: numpy name -> (bits, signed). bool is kind "bool" (promoted like an int of 0/1).
INT_TYPES: dict[str, tuple[int, bool]] = {
    "int8": (8, True), "uint8": (8, False), "int16": (16, True), "uint16": (16, False), "int32": (32, True),
    "uint32": (32, False), "int64": (64, True), "uint64": (64, False), "bool_": (1, False),
}
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def int_bounds(np_name: str) -> tuple[int, int]:
    """[min, max] of a C integer type (bool: [0, 1])."""
    bits, signed = INT_TYPES[np_name]
    return (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)


def promote(np_name: str) -> str:
    """C integer promotion: bool and the types narrower than int become int (int32)."""
    return "int32" if INT_TYPES[np_name][0] < 32 else np_name


def common_int(a: str, b: str) -> str:
    """C's usual arithmetic conversions of two (promoted) integer types."""
    a, b = promote(a), promote(b)
    if a == b:
        return a
    (abits, asigned), (bbits, bsigned) = INT_TYPES[a], INT_TYPES[b]
    if asigned == bsigned:
        return a if abits >= bbits else b
    u, s = (a, b) if not asigned else (b, a)
    if INT_TYPES[u][0] >= INT_TYPES[s][0]:
        return u
    return s  # the signed type is wider, so it holds every value of the unsigned one (int64 vs uint32)


def literal_type(value: int, text: str) -> str:
    """C type of an integer literal: the first of int, (unsigned int,) long, (unsigned long) that holds it;
    the unsigned candidates only with a `u` suffix or for a hex/octal/binary literal."""
    lower = text.lower()
    suffix = re.search(r"[ul]*$", lower).group()
    decimal = not (lower.startswith("0") and len(lower) - len(suffix) > 1)
    wide = "l" in suffix
    if "u" in suffix:
        candidates = ["uint64"] if wide else ["uint32", "uint64"]
    elif decimal:
        candidates = ["int64"] if wide else ["int32", "int64"]
    else:
        candidates = ["int64", "uint64"] if wide else ["int32", "uint32", "int64", "uint64"]
    for name in candidates:
        lo, hi = int_bounds(name)
        if lo <= value <= hi:
            return name
    return "uint64"


def interval(op: str, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """Bounds of a op b for op in + - * & | ^ given the operands' bounds."""
    (alo, ahi), (blo, bhi) = a, b
    if op == "+":
        return alo + blo, ahi + bhi
    if op == "-":
        return alo - bhi, ahi - blo
    if op == "*":
        corners = (alo * blo, alo * bhi, ahi * blo, ahi * bhi)
        return min(corners), max(corners)
    if alo >= 0 and blo >= 0:
        if op == "&":
            return 0, min(ahi, bhi)
        return 0, (1 << max(ahi.bit_length(), bhi.bit_length())) - 1
    if op == "&" and (alo >= 0 or blo >= 0):
        return 0, ahi if alo >= 0 else bhi  # x & y with y >= 0 keeps a subset of y's bits
    width = max(abs(v).bit_length() for v in (alo, ahi, blo, bhi))
    return -(1 << width), (1 << width) - 1


def normalize_code(code: str, np_name: str) -> str:
    """Python (int64) code of the value of type np_name congruent to code modulo 2**bits: C's modular wrap of an
    unsigned result and gcc's modular narrowing to a signed type. 64-bit types need none (numba's int64 wraps)."""
    bits, signed = INT_TYPES[np_name]
    if bits >= 64:
        return code
    mask = 2**bits - 1
    if not signed:
        return f"({code} & {mask:#x})"
    half = 2 ** (bits - 1)
    return f"((({code} + {half:#x}) & {mask:#x}) - {half:#x})"


@dataclass(frozen=True)
class CType:
    """What the translator knows of a value: kind in {int, float, bool, array, dtype, unknown, void}.

    For kind "int" np is the C type of the value and lo/hi bound the value of the generated Python expression
    (None: the type's bounds). See Expr.wrapped for when that value is not the C value itself."""

    kind: str
    np: str | None = None  # scalar numpy type name, or the element type of an array
    ndim: int = 0
    lo: int | None = None
    hi: int | None = None

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "bool")

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def bounds(self) -> tuple[int, int]:
        """[lo, hi] of an int/bool value (the type's bounds where unknown); uint64 below 2**63 (numba's int64)."""
        if self.kind == "bool":
            return 0, 1
        tlo, thi = int_bounds(self.np) if self.np in INT_TYPES else (INT64_MIN, INT64_MAX)
        return (tlo if self.lo is None else self.lo), (min(thi, INT64_MAX) if self.hi is None else self.hi)

    @property
    def nonneg(self) -> bool:
        """Provably >= 0 (so Python's // and % equal C's / and %)."""
        return self.is_int and self.bounds[0] >= 0


UNKNOWN = CType("unknown")
VOID = CType("void")
BOOL = CType("bool", "bool_")
F32 = CType("float", "float32")
F64 = CType("float", "float64")


def scalar_ctype(np_name: str) -> CType:
    if np_name == "bool_":
        return BOOL
    if np_name.startswith("float"):
        return CType("float", np_name)
    return CType("int", np_name)


def int_value(np_name: str, lo: int, hi: int) -> CType:
    """An int CType with value bounds (clipped to int64, the generated code's integer)."""
    return CType("int", np_name, lo=max(lo, INT64_MIN), hi=min(hi, INT64_MAX))


@dataclass(frozen=True)
class Expr:
    """Generated Python code and what it holds. For an int: when ``wrapped`` is False the code's value is the C
    value (within ctype.lo/hi); when True it is only congruent to it modulo 2**bits of ctype.np (an unsigned result
    that may have wrapped, kept lazily: + - * & | ^ << ~ preserve congruence) and Conversions.exact() masks it.
    ``raw``: an element read from an unsigned array, typed unsigned by numba (np.int64() before arithmetic)."""

    code: str
    ctype: CType
    wrapped: bool = False
    raw: bool = False


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
        """A compile-time value converted to a declared type as C initialisation does (integers narrow modulo
        2**bits; a float truncates toward zero and must fit)."""
        if np_name == "bool_":
            return bool(value)
        if np_name.startswith("float"):
            return np.float32(value) if np_name == "float32" else float(value)
        if isinstance(value, (float, np.floating)):
            value = math.trunc(value)
            lo, hi = int_bounds(np_name)
            if not lo <= value <= hi:
                raise self.error(node, f"{value} does not fit {np_name} (float -> integer overflow is undefined in C)")
        value = int(value)
        bits, signed = INT_TYPES[np_name]
        value &= 2**bits - 1
        return value - 2**bits if signed and value >= 2 ** (bits - 1) else value

    # -- integers: C's value of a generated expression ------------------------------------------------------

    def value_code(self, value: Expr) -> str:
        """Code of value for use in arithmetic: numba types an unsigned array element unsigned (uint op uint ->
        uint64, uint64 op int64 -> float64), so it becomes an int64 first."""
        return f"np.int64({strip_parens(value.code)})" if value.raw else value.code

    def exact(self, value: Expr, node: Node) -> Expr:
        """value with code whose Python value is the C value (masks a wrapped unsigned result)."""
        if value.ctype.kind != "int" or (not value.wrapped and not value.raw):
            return value
        code = self.value_code(value)
        if not value.wrapped:
            return Expr(code, value.ctype)
        lo, hi = int_bounds(value.ctype.np)
        if value.ctype.np == "uint64":
            raise self.error(node, "a uint64_t value that may have wrapped or exceed 2**63 is used where its exact "
                                   "value matters (comparison, /, %, >>, conversion); the generated code computes "
                                   "in int64: keep 64-bit unsigned values below 2**63 or use int64_t")
        return Expr(normalize_code(code, value.ctype.np), int_value(value.ctype.np, lo, hi))

    def as_int(self, value: Expr, np_name: str, node: Node, lazy: bool = False) -> Expr:
        """C's conversion of an int/bool value to the integer type np_name (modular, as gcc does for signed
        targets). Emits nothing when the value provably fits; otherwise the result is marked wrapped (lazy) or
        masked now."""
        src = value.ctype
        if src.kind == "bool":
            value = Expr(value.code, int_value("int32", 0, 1), raw=value.raw)
            src = value.ctype
        if value.wrapped and INT_TYPES[np_name][0] > INT_TYPES[src.np][0]:
            value = self.exact(value, node)  # congruence modulo a narrower width says nothing of the wider value
            src = value.ctype
        lo, hi = src.bounds
        tlo, thi = int_bounds(np_name)
        if np_name == "uint64":
            thi = INT64_MAX  # the generated code's int64 holds uint64 values below 2**63 exactly
        if not value.wrapped and tlo <= lo and hi <= thi:
            return Expr(value.code, int_value(np_name, lo, hi), raw=value.raw)
        if lazy:
            return Expr(self.value_code(value), int_value(np_name, lo, hi), wrapped=True)
        return self.exact(Expr(self.value_code(value), int_value(np_name, lo, hi), wrapped=True), node)

    def usual_conversions(self, left: Expr, right: Expr, node: Node | None = None,
                          lazy: bool = False) -> tuple[Expr, Expr, CType]:
        """C's usual arithmetic conversions: (left, right, common type). Integers are promoted and converted
        (exactly unless lazy); float32 op int stays float32 (numba would widen to float64)."""
        lk, rk = left.ctype.kind, right.ctype.kind
        numeric = ("int", "bool", "float")
        if lk not in numeric or rk not in numeric:
            same = left.ctype == right.ctype and lk == "array"
            return left, right, left.ctype if same else UNKNOWN
        if lk == "float" or rk == "float":
            left, right = self.exact(left, node), self.exact(right, node)
            if "float64" in (left.ctype.np, right.ctype.np):
                return left, right, F64
            a = left if lk == "float" else Expr(f"np.float32({strip_parens(left.code)})", F32)
            b = right if rk == "float" else Expr(f"np.float32({strip_parens(right.code)})", F32)
            return a, b, F32
        target = common_int(left.ctype.np, right.ctype.np)
        a, b = self.as_int(left, target, node, lazy), self.as_int(right, target, node, lazy)
        return a, b, CType("int", target)

    def convert(self, value: Expr, target: CType, node: Node | None = None) -> Expr:
        """Convert value to a declared scalar type as a C assignment or initialisation would: integers narrow
        (modulo 2**bits) only where the value may not fit; nothing is emitted when it already is that type."""
        src = value.ctype
        if target.kind == "float":
            value = self.exact(value, node)
            if src.kind == "float" and src.np == target.np:
                return value
            if target.np == "float64" and src.kind in ("int", "bool", "float"):
                return Expr(f"float({strip_parens(value.code)})", F64)
            return Expr(f"np.{target.np}({strip_parens(value.code)})", target)
        if target.kind == "int":
            if src.is_int:
                return self.as_int(value, target.np, node)
            if src.kind == "float":
                # NOTES: an unsigned target is computed as int64: an unsigned numba value would turn later
                # arithmetic unsigned (uint op uint -> uint64); out-of-range float -> int is undefined in C.
                lo, hi = int_bounds(target.np)
                spelling = _np_spelling(target.np) if INT_TYPES[target.np][1] else "int64"
                return Expr(f"np.{spelling}({strip_parens(value.code)})", int_value(target.np, lo, hi))
            return Expr(f"np.{_np_spelling(target.np)}({strip_parens(value.code)})", target)
        if target.kind == "bool":
            if src.kind == "bool":
                return value
            return Expr(f"({self.exact(value, node).code} != 0)", BOOL)
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
        """(T)x and static_cast<T>(x): the conversion of an assignment to T (integers lazily, see Expr.wrapped)."""
        if target.kind not in ("int", "float", "bool"):
            raise self.error(node, "casts are supported to scalar types only")
        if target.kind == "int" and value.ctype.is_int:
            return self.as_int(value, target.np, node, lazy=True)  # masked where a consumer needs the value
        return self.convert(value, target, node)
