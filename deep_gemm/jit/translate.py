"""Translate rendered Ascend-C-style C++ (a documented subset) into Python source for numba.

tree-sitter-cpp parses the macro-expanded source (macros.py); tables map each node type to one short handler;
any node outside the subset, any ERROR/MISSING node, any unknown name raises TranslateError with the template
name, line:col and a caret excerpt. Nothing is emitted silently. See SUBSET below and the module's tests.
Knows nothing of GEMM: device intrinsics are whatever the device module exports.
"""

from __future__ import annotations

import builtins
import keyword
import math
import re
from dataclasses import dataclass, field

import numpy as np
import tree_sitter_cpp
from tree_sitter import Language, Node, Parser

from . import enums
from .cruntime import c_div, c_mod
from .errors import TranslateError
from .macros import KNOWN_TYPE_MACROS, expand_macros, macro_positions

SUBSET = """
File scope: `constexpr`/`const` scalar constants (int*/uint*/float/double/bool, evaluated at translate time),
  functions `[__aicore__] [inline] T name(params) {...}` (-> @njit(inline="always") helpers), exactly one kernel
  entry `[extern "C"] __global__ __aicore__ void name(params) {...}` (-> `_name_core(_block_idx, params)`, inlined
  into `name(_first_core, _core_step, params)` (nogil, cache=True: runs cores first, first+step, ... < NUM_AI_CORES;
  jit/launch.py spreads it over the threads) and into `name_prange(params)` (parallel=True, cache=True: prange over
  NUM_AI_CORES)), static_assert, #include and `using namespace` (ignored), comments (kept).
Parameters: scalars, GlobalTensor<T>, LocalTensor<T>, T*, GM_ADDR, references to tensors (numpy arrays).
Statements: declarations (several declarators, const/constexpr, auto, fixed arrays `T a[N]`, `T a[N][M]`, `= {..}`
  initializers, `LocalTensor<T> x = AllocTensor<T>(n)` / `(rows, cols)`), expression statements, assignments and
  compound assignments (chained `a = b = c`), ++/-- statements, if / else if / else, `if constexpr`, for (counted
  loops -> range, others -> while with the update before every continue), while, break, continue, return, nested
  blocks, static_assert.
Expressions: + - * / % (C truncating integer division), comparisons, && || !, & | ^ << >> ~, ?:, casts
  `(T)x` / static_cast<T>(x), literals (1.0f, 0x7F, 10u, true), a[i], a[i][j] (-> a[i, j]), array + int
  (-> a view a[int:]), std::min/max, min/max, abs, sizeof(type), Scope::NAME enum constants and PIPE_*
  (enums.py), GetBlockIdx()/GetBlockNum(), t.GetValue(i) / t.SetValue(i, v) / t.GetSize(), calls of template
  functions and of device exports, with template arguments passed first: F<HardEvent::X, float>(a) -> F(HardEvent_X,
  np.float32, a).
"""

_LANGUAGE = Language(tree_sitter_cpp.language())

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
# Names the generated Python itself uses: a template identifier may not take them.
RESERVED = frozenset(keyword.kwlist) | {
    "np", "njit", "prange", "range", "min", "max", "abs", "bool", "int", "float", "c_div", "c_mod", "_block_idx",
    "apply_numba_settings", "_first_core", "_core_step", "_core",
}
_PURE_CALLS = frozenset({"min", "max", "abs", "GetBlockNum", "GetBlockIdx", "static_cast"})


# ---------------------------------------------------------------------------------------------------------------
# Types


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


@dataclass
class Sym:
    ctype: CType
    const: bool = False
    line: int = 0


@dataclass
class FuncSig:
    name: str
    params: list[tuple[str, CType]]
    ret: CType
    is_entry: bool
    node: Node


@dataclass
class FuncCtx:
    sig: FuncSig
    scopes: list[dict[str, Sym]] = field(default_factory=list)
    loops: list[list[str] | None] = field(default_factory=list)  # per loop: update lines to run before continue
    const_values: dict[str, object] = field(default_factory=dict)


@dataclass
class Translation:
    """The result of translate(): Python source plus what build() and the tools need to know about it."""

    python: str
    entry: str
    helpers: list[str]
    device_names: list[str]
    constants: dict[str, object]


# ---------------------------------------------------------------------------------------------------------------
# Parsing


def parse(source: str) -> tuple[Node, bytes, list[tuple[int, str]]]:
    """Macro-expand and parse; returns (root node, the parsed bytes, [(byte offset, macro)] of blanked macros)."""
    expanded = expand_macros(source)
    hits = [(pos, "__global__") for pos in macro_positions(source, "__global__")]
    data = expanded.encode()
    # NOTES: macro offsets were found in str positions; convert to byte offsets (non-ASCII text in comments).
    hits = [(len(source[:pos].encode()), name) for pos, name in hits]
    tree = Parser(_LANGUAGE).parse(data)
    return tree.root_node, data, hits


def find_error_node(node: Node) -> Node | None:
    """First ERROR or MISSING node in document order, or None."""
    if node.type == "ERROR" or node.is_missing:
        return node
    if not node.has_error:
        return None
    for child in node.children:
        found = find_error_node(child)
        if found is not None:
            return found
    return node  # has_error but no child owns it: report the node itself


def caret_excerpt(data: bytes, node_or_point, template: str, message: str, end_byte: int | None = None) -> str:
    """`template:line:col: message` followed by the source line and a caret under the node."""
    if isinstance(node_or_point, Node):
        row, col_b = node_or_point.start_point
        end_byte = node_or_point.end_byte
        start_byte = node_or_point.start_byte
    else:
        row, col_b = node_or_point
        start_byte = None
    lines = data.split(b"\n")
    line_bytes = lines[row] if row < len(lines) else b""
    col = len(line_bytes[:col_b].decode(errors="replace"))
    text = line_bytes.decode(errors="replace").rstrip()
    width = 1
    if start_byte is not None and end_byte is not None:
        line_end = start_byte + (len(line_bytes) - col_b)
        width = max(1, len(data[start_byte:min(end_byte, line_end)].decode(errors="replace")))
    gutter = f"{row + 1:5d} | "
    return (f"{template}:{row + 1}:{col + 1}: {message}\n{gutter}{text}\n"
            f"{' ' * (len(gutter) - 2)}| {' ' * col}^{'~' * (width - 1)}")


# ---------------------------------------------------------------------------------------------------------------
# The translator


class Translator:
    """One translation of one rendered source. Use translate() rather than this class."""

    def __init__(self, source: str, template: str, constants: dict[str, object], device_exports: set[str],
                 device_module: str):
        self.template = template
        self.constants = constants
        self.device_exports = device_exports
        self.device_module = device_module
        self.root, self.data, self.global_hits = parse(source)
        self.lines: list[tuple[int, str, int | None]] = []  # (indent, text, template line)
        self.indent = 0
        self.module_consts: dict[str, Sym] = {}
        self.module_values: dict[str, object] = {}
        self.functions: dict[str, FuncSig] = {}
        self.entry: FuncSig | None = None
        self.used_device: set[str] = set()
        self.used_enums: dict[str, tuple[int, str]] = {}  # python name -> (value, C spelling)
        self.func: FuncCtx | None = None
        if "NUM_AI_CORES" in constants:
            self.module_values["NUM_AI_CORES"] = constants["NUM_AI_CORES"]

    # -- errors and output ------------------------------------------------------------------------------------

    def error(self, node: Node, message: str) -> TranslateError:
        return TranslateError(caret_excerpt(self.data, node, self.template, message))

    def text(self, node: Node) -> str:
        return self.data[node.start_byte:node.end_byte].decode()

    @staticmethod
    def line(node: Node) -> int:
        return node.start_point[0] + 1

    def emit(self, text: str, node: Node | None = None) -> None:
        self.lines.append((self.indent, text, self.line(node) if node is not None else None))

    def block(self, emit_body, node: Node) -> None:
        """Run emit_body one indent deeper; emit `pass` when it produced no statement."""
        self.indent += 1
        before = len(self.lines)
        emit_body()
        if not any(ind == self.indent and not t.startswith("#") for ind, t, _ in self.lines[before:]):
            self.emit("pass", node)
        self.indent -= 1

    # -- top level --------------------------------------------------------------------------------------------

    def run(self) -> Translation:
        bad = find_error_node(self.root)
        if bad is not None:
            what = f"expected {bad.type!r}" if bad.is_missing else "syntax error (not in the supported C++ subset)"
            raise self.error(bad, what)
        self.collect_functions(self.root)
        self.inline = self.functions_to_inline()
        if self.entry is None:
            raise TranslateError(f"{self.template}: no kernel entry (a `__global__ __aicore__ void name(...)` "
                                 "function) in the rendered source")
        for child in self.root.children:
            self.top_level(child)
        if "NUM_AI_CORES" not in self.module_consts:
            if "NUM_AI_CORES" not in self.constants:
                raise self.error(self.entry.node, "the kernel entry needs the template constant NUM_AI_CORES")
            lines = self.lines
            self.lines = []
            self.define_module_const("NUM_AI_CORES", self.constants["NUM_AI_CORES"], None, "int32")
            self.lines = [(0, "# NUM_AI_CORES: from the build constants", None)] + self.lines + lines
        return self.finish()

    def collect_functions(self, node: Node) -> None:
        # NOTES: `__global__` was blanked before parsing; a function is the entry when the macro stood between
        # the previous top-level item and the function's declarator.
        prev_end = node.start_byte
        for child in node.children:
            if child.type == "linkage_specification":
                body = child.child_by_field_name("body")
                if body is not None and body.type == "function_definition":
                    self.collect_function(body, prev_end)
                elif body is not None:
                    self.collect_functions(body)
            elif child.type == "function_definition":
                self.collect_function(child, prev_end)
            if child.type != "comment":
                prev_end = child.end_byte

    def collect_function(self, node: Node, prev_end: int) -> None:
        declarator = node.child_by_field_name("declarator")
        if declarator is None or declarator.type != "function_declarator":
            raise self.error(node, "unsupported function declarator")
        name_node = declarator.child_by_field_name("declarator")
        if name_node.type != "identifier":
            raise self.error(name_node, "only plain function names are supported (no methods, operators)")
        name = self.text(name_node)
        self.check_name(name_node, name)
        if name in self.functions:
            raise self.error(name_node, f"function {name!r} defined twice (overloads are not supported)")
        is_entry = any(prev_end <= pos < declarator.start_byte for pos, _ in self.global_hits)
        ret = self.type_of(node.child_by_field_name("type"), node)
        params = []
        for param in declarator.child_by_field_name("parameters").named_children:
            if param.type == "comment":
                continue
            if param.type != "parameter_declaration":
                raise self.error(param, f"unsupported parameter ({param.type})")
            pname, ptype = self.param(param)
            params.append((pname, ptype))
        sig = FuncSig(name, params, ret, is_entry, node)
        if is_entry:
            if self.entry is not None:
                raise self.error(name_node, f"a second kernel entry {name!r} (the first is {self.entry.name!r})")
            if ret.kind != "void":
                raise self.error(node.child_by_field_name("type"), "the kernel entry must return void")
            self.entry = sig
        self.functions[name] = sig

    def callees(self, node: Node) -> set[str]:
        """Names called anywhere inside node (last component of qualified names)."""
        out, stack = set(), [node]
        while stack:
            n = stack.pop()
            if n.type == "call_expression":
                fn = n.child_by_field_name("function")
                while fn is not None and fn.type in ("qualified_identifier", "template_function"):
                    fn = fn.child_by_field_name("name")
                if fn is not None and fn.type == "identifier":
                    out.add(self.text(fn))
            stack.extend(n.children)
        return out

    def functions_to_inline(self) -> set[str]:
        """Helpers that reach device code, directly or through other helpers, plus the entry.

        NOTES: numba copies (and re-optimizes) every callee's code into each library that links it, so a helper
        that calls device functions is inlined into the kernel (device code then links once); pure helpers stay
        separate @njit functions (IR inlining at every call site costs more than compiling them once).
        """
        calls = {name: self.callees(sig.node) for name, sig in self.functions.items()}
        reach = {name for name, called in calls.items() if called & self.device_exports}
        changed = True
        while changed:
            new = {name for name, called in calls.items() if called & reach} - reach
            reach |= new
            changed = bool(new)
        return reach | {self.entry.name} if self.entry else reach

    def param(self, param: Node) -> tuple[str, CType]:
        type_node = param.child_by_field_name("type")
        decl = param.child_by_field_name("declarator")
        if decl is None:
            raise self.error(param, "parameters need a name")
        ctype = self.type_of(type_node, param)
        pointer = False
        while decl.type in ("pointer_declarator", "reference_declarator"):
            if decl.type == "pointer_declarator":
                pointer = True
            elif ctype.kind != "array":
                raise self.error(decl, "references to scalars are not supported (return the value instead)")
            decl = decl.child_by_field_name("declarator") or decl.named_children[-1]
        if decl.type != "identifier":
            raise self.error(decl, f"unsupported parameter declarator ({decl.type})")
        if pointer:
            if ctype.kind not in ("int", "float", "bool", "unknown"):
                raise self.error(param, "pointers are supported to scalar element types only")
            ctype = CType("array", ctype.np, 1)
        name = self.text(decl)
        self.check_name(decl, name)
        return name, ctype

    def top_level(self, node: Node) -> None:
        handler = self.TOP.get(node.type)
        if handler is None:
            raise self.error(node, f"unsupported at file scope: {node.type}")
        handler(self, node)

    def top_linkage(self, node: Node) -> None:
        body = node.child_by_field_name("body")
        if body.type == "function_definition":
            self.function(body)
        else:
            for child in body.named_children:
                self.top_level(child)

    def top_ignore(self, node: Node) -> None:
        self.emit(f"# (ignored) {self.text(node).strip()}", node)

    def top_comment(self, node: Node) -> None:
        self.comment(node)

    def top_declaration(self, node: Node) -> None:
        quals = {self.text(c) for c in node.children if c.type in ("type_qualifier", "storage_class_specifier")}
        if not quals & {"const", "constexpr"}:
            raise self.error(node, "file-scope variables must be const/constexpr (kernel globals are read-only)")
        ctype = self.type_of(node.child_by_field_name("type"), node)
        if ctype.kind not in ("int", "float", "bool"):
            raise self.error(node, "file-scope constants must have a scalar type")
        for decl in node.children_by_field_name("declarator"):
            if decl.type != "init_declarator":
                raise self.error(decl, "a file-scope constant needs an initializer")
            name_node = decl.child_by_field_name("declarator")
            if name_node.type != "identifier":
                raise self.error(name_node, "file-scope arrays are not supported")
            name = self.text(name_node)
            self.check_name(name_node, name)
            value_node = decl.child_by_field_name("value")
            expr = self.expr(value_node)
            value = self.evaluate(expr.code, value_node, "file-scope constant initializer")
            value = self.coerce_value(value, ctype.np, value_node)
            self.define_module_const(name, value, decl, ctype.np)

    def define_module_const(self, name: str, value, node: Node | None, np_name: str) -> None:
        if name == "NUM_AI_CORES" and "NUM_AI_CORES" in self.constants and value != self.constants["NUM_AI_CORES"]:
            raise self.error(node, f"NUM_AI_CORES={value} disagrees with the constant given to build "
                                   f"({self.constants['NUM_AI_CORES']})")
        if name == "NUM_AI_CORES" and (not isinstance(value, (int, np.integer)) or value < 1):
            raise self.error(node, f"NUM_AI_CORES must be a positive integer, got {value!r}")
        self.module_values[name] = value
        nonneg = isinstance(value, (int, np.integer)) and value >= 0
        self.module_consts[name] = Sym(scalar_ctype(np_name, nonneg), const=True)
        self.emit(f"{name} = {self.literal(value, np_name)}", node)

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

    def evaluate(self, code: str, node: Node, what: str):
        namespace = {"np": np, "c_div": c_div, "c_mod": c_mod, "min": min, "max": max, "abs": abs,
                     "float": float, "int": int, "bool": bool, "__builtins__": {}}
        namespace.update(self.module_values)
        namespace.update({k: v for k, (v, _) in self.used_enums.items()})
        if self.func is not None:
            namespace.update(self.func.const_values)
        try:
            return eval(code, namespace)  # our own translation of a template expression
        except NameError as e:
            raise self.error(node, f"{what} is not a compile-time constant ({e})") from None
        except Exception as e:  # noqa: BLE001 - reported with the position
            raise self.error(node, f"{what} failed to evaluate: {type(e).__name__}: {e}") from None

    def static_assert(self, node: Node) -> None:
        cond = node.child_by_field_name("condition")
        message = node.child_by_field_name("message")
        value = self.evaluate(self.expr(cond).code, cond, "static_assert condition")
        if not value:
            text = self.text(message) if message is not None else ""
            raise self.error(node, f"static_assert failed: {text or self.text(cond)}")
        self.emit(f"# static_assert({self.text(cond)}) holds", node)

    # -- functions --------------------------------------------------------------------------------------------

    def function(self, node: Node) -> None:
        declarator = node.child_by_field_name("declarator")
        sig = self.functions[self.text(declarator.child_by_field_name("declarator"))]
        self.func = FuncCtx(sig)
        self.func.scopes.append({name: Sym(ctype, line=self.line(node)) for name, ctype in sig.params})
        names = [name for name, _ in sig.params]
        body = node.child_by_field_name("body")
        if sig.is_entry and not self.contains(body, "return_statement"):
            self.emit_entry_direct(sig, node, body)
            self.func = None
            return
        self.emit("", None)
        # NOTES: the per-core body and helpers that reach device code are inlined at numba IR level (see
        # functions_to_inline); other helpers are ordinary cached functions.
        self.emit('@njit(inline="always")' if sig.name in self.inline else "@njit(cache=True)", node)
        if sig.is_entry:
            self.emit(f"def _{sig.name}_core({', '.join(['_block_idx', *names])}):", node)
        else:
            self.emit(f"def {sig.name}({', '.join(names)}):", node)
        self.block(lambda: self.statements(body.named_children), body)
        if sig.is_entry:
            self.emit_entry_wrapper(sig, node)
        self.func = None

    @staticmethod
    def contains(node: Node, node_type: str) -> bool:
        stack = [node]
        while stack:
            n = stack.pop()
            if n.type == node_type:
                return True
            stack.extend(n.children)
        return False

    def emit_entry_direct(self, sig: FuncSig, node: Node, body: Node) -> None:
        """The entry without a `return`: its body goes straight into both launch loops (no inlining pass)."""
        params = [name for name, _ in sig.params]
        floats = [name for name, ctype in sig.params if ctype.kind == "float"]
        threads_params = ", ".join(["_first_core", "_core_step", *params])
        heads = [("@njit(nogil=True, cache=True)", f"def {sig.name}({threads_params}):",
                  "for _block_idx in range(_first_core, NUM_AI_CORES, _core_step):", None),
                 ("@njit(parallel=True, cache=True)", f"def {sig.name}_prange({', '.join(params)}):",
                  "for _core in prange(NUM_AI_CORES):", "_block_idx = np.int64(_core)")]
        body_lines = None
        for decorator, define, loop, first in heads:
            self.emit("", None)
            self.emit(decorator, node)
            self.emit(define, node)
            self.indent += 1
            for name in floats:  # rounded to float32 once, as the chip receives them
                self.emit(f"{name} = np.{sig.params[params.index(name)][1].np}({name})", node)
            self.emit(loop, node)
            if body_lines is None:
                start = len(self.lines)
                self.block(lambda: self.statements(body.named_children), body)
                body_lines = self.lines[start:]
            else:
                self.indent += 1
                # NOTES: the parfor gufunc types its index uint64; index arithmetic wants int64.
                self.emit(first, node)
                self.indent -= 1
                self.lines.extend(body_lines)
            self.indent -= 1

    def emit_entry_wrapper(self, sig: FuncSig, node: Node) -> None:
        # NOTES: the kernel body is the inlined function _<entry>_core, run once per logical core: early `return`s
        # work and per-core buffers are allocated per core. Two launchers call it (jit/launch.py): <entry> runs
        # cores first, first + step, ... on one thread (nogil; CoreLauncher spreads it over the threads) and
        # <entry>_prange runs all cores in a numba prange. Scalar float parameters are rounded to float32 here.
        args = [f"np.{ctype.np}({name})" if ctype.kind == "float" else name for name, ctype in sig.params]
        params = [name for name, _ in sig.params]
        self.emit("", None)
        self.emit("@njit(nogil=True, cache=True)", node)
        self.emit(f"def {sig.name}({', '.join(['_first_core', '_core_step', *params])}):", node)
        self.indent += 1
        self.emit("for _block_idx in range(_first_core, NUM_AI_CORES, _core_step):", node)
        self.indent += 1
        self.emit(f"_{sig.name}_core({', '.join(['_block_idx', *args])})", node)
        self.indent -= 2
        self.emit("", None)
        self.emit("@njit(parallel=True, cache=True)", node)
        self.emit(f"def {sig.name}_prange({', '.join(params)}):", node)
        self.indent += 1
        self.emit("for _block_idx in prange(NUM_AI_CORES):", node)
        self.indent += 1
        # NOTES: np.int64(): the parfor pass types the index int64, its gufunc uint64.
        self.emit(f"_{sig.name}_core({', '.join(['np.int64(_block_idx)', *args])})", node)
        self.indent -= 2

    # -- statements -------------------------------------------------------------------------------------------

    def statements(self, nodes) -> None:
        for node in nodes:
            self.statement(node)

    def statement(self, node: Node) -> None:
        handler = self.STMT.get(node.type)
        if handler is None:
            raise self.error(node, f"unsupported statement: {node.type}")
        handler(self, node)

    def comment(self, node: Node) -> None:
        for i, line in enumerate(self.text(node).splitlines()):
            line = line.strip()
            for prefix in ("//", "/*", "*/", "*"):
                if line.startswith(prefix):
                    line = line[len(prefix):].strip()
            line = line.removesuffix("*/").strip()
            if line or i == 0:
                self.emit(f"# {line}".rstrip(), node)

    def compound(self, node: Node) -> None:
        self.func.scopes.append({})
        self.statements(node.named_children)
        self.func.scopes.pop()

    def body(self, node: Node) -> None:
        """A statement used as the body of if/for/while, in its own scope, one indent deeper."""

        def run():
            self.func.scopes.append({})
            if node.type == "compound_statement":
                self.statements(node.named_children)
            else:
                self.statement(node)
            self.func.scopes.pop()

        self.block(run, node)

    def declaration(self, node: Node) -> None:
        quals = {self.text(c) for c in node.children if c.type in ("type_qualifier", "storage_class_specifier")}
        if quals - {"const", "constexpr"}:
            raise self.error(node, f"unsupported qualifier(s) {sorted(quals - {'const', 'constexpr'})}")
        is_const = bool(quals)
        base = self.type_of(node.child_by_field_name("type"), node)
        for decl in node.children_by_field_name("declarator"):
            self.declarator(decl, base, is_const, "constexpr" in quals)

    def declarator(self, decl: Node, base: CType, is_const: bool, is_constexpr: bool) -> None:
        value_node = decl.child_by_field_name("value") if decl.type == "init_declarator" else None
        target = decl.child_by_field_name("declarator") if decl.type == "init_declarator" else decl
        if value_node is not None and value_node.type in ("argument_list", "initializer_list") and \
                target.type != "array_declarator":
            raise self.error(value_node, "use `T x = value;` (direct and brace initialization are not supported)")
        pointer = False
        while target.type in ("pointer_declarator", "reference_declarator"):
            pointer = pointer or target.type == "pointer_declarator"
            target = target.child_by_field_name("declarator") or target.named_children[-1]
        if target.type == "array_declarator":
            return self.array_declaration(decl, target, base, value_node)
        if target.type != "identifier":
            raise self.error(target, f"unsupported declarator ({target.type})")
        name = self.text(target)
        self.declare_check(target, name)
        if value_node is None:
            if base.kind in ("int", "float", "bool"):
                self.emit(f"{name} = {self.literal(0, base.np)}", decl)
                self.define(name, base, is_const, decl)
                return
            raise self.error(decl, f"{name!r} needs an initializer")
        value = self.expr(value_node)
        if base.kind == "auto":
            ctype = value.ctype
            code = value.code
        elif pointer or base.kind == "array":
            if value.ctype.kind not in ("array", "unknown"):
                raise self.error(value_node, "a pointer/tensor must be initialized from a tensor or an allocation")
            ndim = value.ctype.ndim if value.ctype.kind == "array" else 0  # 0: rank unknown
            ctype = CType("array", base.np or value.ctype.np, ndim if not pointer else max(ndim, 1))
            code = value.code
        else:
            code = self.convert(value, base).code
            ctype = base
        # NOTES: unsigned variables are non-negative by type (templates must not wrap them); signed ones only when
        # const with a non-negative initializer. Non-negative operands get Python's // and % (no C helpers).
        unsigned = ctype.kind == "int" and (ctype.np or "").startswith("uint")
        ctype = ctype.with_nonneg(unsigned or (is_const and value.ctype.nonneg))
        self.emit(f"{name} = {strip_parens(code)}", decl)
        self.define(name, ctype, is_const, decl)
        if is_constexpr:
            self.func.const_values[name] = self.evaluate(code, value_node, f"constexpr {name}")

    def array_declaration(self, decl: Node, target: Node, base: CType, value_node: Node | None) -> None:
        dims = []
        while target.type == "array_declarator":
            size = target.child_by_field_name("size")
            if size is None:
                raise self.error(target, "local arrays need an explicit size")
            dims.append(int(self.evaluate(self.expr(size).code, size, "array size")))
            target = target.child_by_field_name("declarator")
        dims.reverse()
        if target.type != "identifier":
            raise self.error(target, "unsupported array declarator")
        if base.kind not in ("int", "float", "bool"):
            raise self.error(decl, "local arrays need a scalar element type")
        name = self.text(target)
        self.declare_check(target, name)
        shape = str(dims[0]) if len(dims) == 1 else "(" + ", ".join(map(str, dims)) + ")"
        if value_node is None:
            self.emit(f"{name} = np.zeros({shape}, np.{base.np})", decl)
        else:
            if value_node.type != "initializer_list":
                raise self.error(value_node, "arrays are initialized with `= {...}`")
            values = self.initializer(value_node, dims, base)
            self.emit(f"{name} = np.array({values}, np.{base.np})", decl)
        self.define(name, CType("array", base.np, len(dims)), False, decl)

    def initializer(self, node: Node, dims: list[int], base: CType) -> str:
        items = [c for c in node.named_children if c.type != "comment"]
        if len(items) > dims[0]:
            raise self.error(node, f"{len(items)} initializers for an array of {dims[0]}")
        if len(dims) > 1:
            parts = [self.initializer(c, dims[1:], base) if c.type == "initializer_list"
                     else self.error_raise(c, "nested arrays need nested `{...}`") for c in items]
            zero = "[" + ", ".join(["0"] * dims[1]) + "]" if len(dims) == 2 else None
            while len(parts) < dims[0]:
                if zero is None:
                    raise self.error(node, "partially initialized 3-D arrays are not supported")
                parts.append(zero)
            return "[" + ", ".join(parts) + "]"
        parts = [self.expr(c).code for c in items] + ["0"] * (dims[0] - len(items))
        return "[" + ", ".join(parts) + "]"

    def error_raise(self, node: Node, message: str):
        raise self.error(node, message)

    def define(self, name: str, ctype: CType, const: bool, node: Node) -> None:
        self.func.scopes[-1][name] = Sym(ctype, const, self.line(node))

    def declare_check(self, node: Node, name: str) -> None:
        self.check_name(node, name)
        for scope in self.func.scopes:
            if name in scope:
                raise self.error(node, f"{name!r} shadows a declaration at line {scope[name].line}; rename it "
                                       "(Python has one scope per function)")

    def check_name(self, node: Node, name: str) -> None:
        generated = {f"_{self.entry.name}_core", f"{self.entry.name}_prange"} if self.entry else set()
        if name in RESERVED or name.startswith("_dg") or name in generated:
            raise self.error(node, f"identifier {name!r} is reserved in the generated Python; rename it")
        clash = ("a template constant" if name in self.module_consts else
                 "a function" if name in self.functions and self.func is not None else
                 "a device function" if name in self.device_exports else
                 "an enum constant" if enums.lookup(None, name) is not None else None)
        if clash:
            raise self.error(node, f"{name!r} is already {clash}; rename it")

    def expression_statement(self, node: Node) -> None:
        children = [c for c in node.named_children if c.type != "comment"]
        if not children:
            return
        expr = children[0]
        if expr.type == "comma_expression":
            for part in self.comma_parts(expr):
                self.simple_statement(part, node)
        else:
            self.simple_statement(expr, node)

    def comma_parts(self, node: Node) -> list[Node]:
        if node.type != "comma_expression":
            return [node]
        return self.comma_parts(node.child_by_field_name("left")) + self.comma_parts(node.child_by_field_name("right"))

    def simple_statement(self, expr: Node, stmt: Node) -> None:
        for line in self.simple_statement_lines(expr):
            self.emit(line, stmt)

    def simple_statement_lines(self, expr: Node) -> list[str]:
        """Python lines for an expression used as a statement: assignments, ++/--, calls, SetValue."""
        if expr.type == "assignment_expression":
            return [self.assignment(expr)]
        if expr.type == "update_expression":
            return [self.update(expr)]
        if expr.type == "parenthesized_expression":
            return self.simple_statement_lines(expr.named_children[0])
        if expr.type == "call_expression":
            fn = expr.child_by_field_name("function")
            if fn.type == "field_expression" and self.text(fn.child_by_field_name("field")) == "SetValue":
                obj = self.expr(fn.child_by_field_name("argument"))
                args = self.call_args(expr)
                if len(args) != 2:
                    raise self.error(expr, "SetValue(index, value) takes two arguments")
                return [f"{obj.code}[{strip_parens(args[0].code)}] = {strip_parens(args[1].code)}"]
        return [strip_parens(self.expr(expr).code)]

    def assignment(self, node: Node) -> str:
        left, op, right = node.child_by_field_name("left"), node.child_by_field_name("operator"), \
            node.child_by_field_name("right")
        op = self.text(op)
        if op == "=" and right.type == "assignment_expression" and self.text(right.child_by_field_name(
                "operator")) == "=":
            # chained a = b = c: assign right to left, innermost first
            inner = self.assignment(right)
            target = self.lvalue(left)
            return f"{target.code} = {inner}"
        target = self.lvalue(left)
        value = self.expr(right)
        if op == "=":
            if target.ctype.kind in ("int", "float", "bool") and left.type == "identifier":
                value = self.convert(value, target.ctype)
            return f"{target.code} = {strip_parens(value.code)}"
        binop = op[:-1]
        if binop in ("/", "%") or (left.type == "identifier" and not self.keeps_type(target.ctype, value.ctype)):
            combined = self.binary_codes(target, binop, value, node)
            if left.type == "identifier":
                combined = self.convert(combined, target.ctype)
            return f"{target.code} = {strip_parens(combined.code)}"
        if binop in ("<<", ">>", "&", "|", "^") and target.ctype.kind == "float":
            raise self.error(node, f"{op} on a floating-point value")
        return f"{target.code} {op} {strip_parens(value.code)}"

    @staticmethod
    def keeps_type(target: CType, value: CType) -> bool:
        """Whether numba's `target op= value` keeps target's type as C would (else convert explicitly)."""
        if target.kind in ("int", "bool"):
            return value.is_int
        if target.kind == "float":
            return value.kind == "float" and (value.np == target.np or target.np == "float64") or \
                (target.np == "float64" and value.is_int)
        return True

    def update(self, node: Node) -> str:
        op = self.text(node.child_by_field_name("operator"))
        target = self.lvalue(node.child_by_field_name("argument"))
        one = "np.float32(1)" if target.ctype.np == "float32" else "1"
        return f"{target.code} {'+=' if op == '++' else '-='} {one}"

    def lvalue(self, node: Node) -> Expr:
        if node.type == "identifier":
            name = self.text(node)
            sym = self.lookup_local(name)
            if sym is None:
                if name in self.module_consts:
                    raise self.error(node, f"cannot assign to the constant {name!r}")
                raise self.error(node, f"undeclared identifier {name!r}")
            if sym.const:
                raise self.error(node, f"cannot assign to const {name!r}")
            if sym.ctype.kind == "array":
                raise self.error(node, f"cannot re-point the tensor {name!r} (declare a new name)")
            return Expr(name, sym.ctype)
        if node.type == "subscript_expression":
            return self.expr(node)
        if node.type == "parenthesized_expression":
            return self.lvalue(node.named_children[0])
        raise self.error(node, f"unsupported assignment target ({node.type})")

    def if_statement(self, node: Node, keyword_: str = "if") -> None:
        cond_node = node.child_by_field_name("condition")
        consequence = node.child_by_field_name("consequence")
        alternative = node.child_by_field_name("alternative")
        if any(c.type == "constexpr" for c in node.children):
            value = self.evaluate(self.expr(self.condition_value(cond_node)).code, cond_node, "if constexpr condition")
            self.emit(f"# if constexpr ({self.text(self.condition_value(cond_node))}) -> {bool(value)}", node)
            taken = consequence if value else (alternative.named_children[-1] if alternative is not None else None)
            if taken is not None:
                self.func.scopes.append({})
                self.statements(taken.named_children if taken.type == "compound_statement" else [taken])
                self.func.scopes.pop()
            return
        cond = self.expr(self.condition_value(cond_node))
        self.emit(f"{keyword_} {strip_parens(cond.code)}:", node)
        self.body(consequence)
        if alternative is None:
            return
        alt = [c for c in alternative.named_children if c.type != "comment"][-1]
        if alt.type == "if_statement" and not any(c.type == "constexpr" for c in alt.children):
            self.if_statement(alt, "elif")
        else:
            self.emit("else:", alternative)
            self.body(alt)

    def condition_value(self, node: Node) -> Node:
        if node.type == "condition_clause":
            value = node.child_by_field_name("value")
            if value is None or node.child_by_field_name("initializer") is not None:
                raise self.error(node, "declarations in conditions are not supported")
            return value
        return node

    def while_statement(self, node: Node) -> None:
        cond = self.expr(self.condition_value(node.child_by_field_name("condition")))
        self.emit(f"while {strip_parens(cond.code)}:", node)
        self.func.loops.append(None)
        self.body(node.child_by_field_name("body"))
        self.func.loops.pop()

    def for_statement(self, node: Node) -> None:
        self.func.scopes.append({})
        counted = self.counted_loop(node)
        body = node.child_by_field_name("body")
        if counted is not None:
            var, range_args, ctype = counted
            self.declare_check(node.child_by_field_name("initializer"), var)
            self.emit(f"for {var} in range({range_args}):", node)
            self.define(var, ctype, True, node)  # the body may not assign it (checked by counted_loop)
            self.func.loops.append(None)
            self.body(body)
            self.func.loops.pop()
        else:
            self.while_loop(node, body)
        self.func.scopes.pop()

    def while_loop(self, node: Node, body: Node) -> None:
        init = node.child_by_field_name("initializer")
        if init is not None:
            if init.type == "declaration":
                self.declaration(init)
            else:
                for part in self.comma_parts(init):
                    self.simple_statement(part, init)
        cond_node = node.child_by_field_name("condition")
        cond = self.expr(cond_node).code if cond_node is not None else "True"
        update = node.child_by_field_name("update")
        update_lines = []
        if update is not None:
            for part in self.comma_parts(update):
                update_lines += self.simple_statement_lines(part)
        self.emit(f"while {strip_parens(cond)}:", node)
        self.func.loops.append(update_lines)

        def run():
            self.func.scopes.append({})
            self.statements(body.named_children if body.type == "compound_statement" else [body])
            self.func.scopes.pop()
            for line in update_lines:
                self.emit(line, update)

        self.block(run, body)
        self.func.loops.pop()

    def counted_loop(self, node: Node) -> tuple[str, str, CType] | None:
        """(var, range arguments, var type) when the for loop is a counted loop that `range` expresses exactly."""
        init, cond, update = (node.child_by_field_name(f) for f in ("initializer", "condition", "update"))
        if init is None or cond is None or update is None or init.type != "declaration":
            return None
        decls = init.children_by_field_name("declarator")
        if len(decls) != 1 or decls[0].type != "init_declarator":
            return None
        var_node = decls[0].child_by_field_name("declarator")
        if var_node.type != "identifier":
            return None
        var = self.text(var_node)
        base = self.type_of(init.child_by_field_name("type"), init)
        start = self.expr(decls[0].child_by_field_name("value"))
        if not (base.kind == "int" or (base.kind == "auto" and start.ctype.kind == "int")) or \
                not start.ctype.is_int:
            return None
        # step
        step_code, step_sign = None, 0
        if update.type == "update_expression" and self.is_ident(update.child_by_field_name("argument"), var):
            step_sign = 1 if self.text(update.child_by_field_name("operator")) == "++" else -1
            step_code = "1"
        elif update.type == "assignment_expression" and self.is_ident(update.child_by_field_name("left"), var):
            op = self.text(update.child_by_field_name("operator"))
            step_node = update.child_by_field_name("right")
            if op not in ("+=", "-=") or not self.invariant(step_node, node) or self.mentions(step_node, var):
                return None
            step = self.expr(step_node)
            value = self.try_evaluate(step.code)
            if not step.ctype.is_int or not isinstance(value, (int, np.integer)) or value <= 0:
                return None  # NOTES: only a compile-time positive step keeps C semantics under range()
            step_code, step_sign = strip_parens(step.code), (1 if op == "+=" else -1)
        else:
            return None
        # condition
        if cond.type != "binary_expression" or not self.is_ident(cond.child_by_field_name("left"), var):
            return None
        op = self.text(cond.child_by_field_name("operator"))
        bound_node = cond.child_by_field_name("right")
        if not self.invariant(bound_node, node) or self.mentions(bound_node, var):
            return None
        bound = self.expr(bound_node)
        if not bound.ctype.is_int:
            return None
        if self.assigns(node.child_by_field_name("body"), var):
            return None
        if step_sign > 0 and op in ("<", "<="):
            stop = bound.code if op == "<" else f"{bound.code} + 1"
            step = "" if step_code == "1" else f", {step_code}"
        elif step_sign < 0 and op in (">", ">="):
            stop = bound.code if op == ">" else f"{bound.code} - 1"
            step = f", -{step_code}" if step_code.isidentifier() or step_code.isdigit() else f", -({step_code})"
        else:
            return None
        nonneg = start.ctype.nonneg and step_sign > 0
        start_code = strip_parens(start.code)
        args = strip_parens(stop) if start_code == "0" and not step else f"{start_code}, {strip_parens(stop)}{step}"
        return var, args, int_ctype(nonneg)

    def mentions(self, node: Node, name: str) -> bool:
        stack = [node]
        while stack:
            n = stack.pop()
            if n.type == "identifier" and self.text(n) == name:
                return True
            stack.extend(n.children)
        return False

    def is_ident(self, node: Node | None, name: str) -> bool:
        return node is not None and node.type == "identifier" and self.text(node) == name

    def try_evaluate(self, code: str):
        try:
            return self.evaluate(code, self.root, "")
        except TranslateError:
            return None

    def invariant(self, expr: Node, loop: Node) -> bool:
        """True when expr is side-effect free and nothing it reads is assigned in the loop."""
        body = loop.child_by_field_name("body")
        stack = [expr]
        while stack:
            n = stack.pop()
            if n.type in ("subscript_expression", "assignment_expression", "update_expression", "field_expression"):
                return False
            if n.type == "call_expression":
                fn = n.child_by_field_name("function")
                name = self.text(fn.child_by_field_name("name") if fn.type == "template_function" else fn)
                if name.split("::")[-1] not in _PURE_CALLS:
                    return False
                stack.extend(n.child_by_field_name("arguments").named_children)
                continue
            if n.type == "identifier" and self.assigns(body, self.text(n)):
                return False
            stack.extend(n.named_children)
        return True

    def assigns(self, node: Node | None, name: str) -> bool:
        """Whether any assignment/++/-- in node targets the identifier `name`."""
        if node is None:
            return False
        stack = [node]
        while stack:
            n = stack.pop()
            target = None
            if n.type == "assignment_expression":
                target = n.child_by_field_name("left")
            elif n.type == "update_expression":
                target = n.child_by_field_name("argument")
            while target is not None and target.type == "parenthesized_expression":
                target = target.named_children[0]
            if target is not None and self.is_ident(target, name):
                return True
            stack.extend(n.children)
        return False

    def break_statement(self, node: Node) -> None:
        if not self.func.loops:
            raise self.error(node, "break outside a loop (switch is not supported)")
        self.emit("break", node)

    def continue_statement(self, node: Node) -> None:
        if not self.func.loops:
            raise self.error(node, "continue outside a loop")
        for line in self.func.loops[-1] or []:
            self.emit(line, node)
        self.emit("continue", node)

    def return_statement(self, node: Node) -> None:
        values = [c for c in node.named_children if c.type != "comment"]
        ret = self.func.sig.ret
        if not values:
            if ret.kind != "void":
                raise self.error(node, f"{self.func.sig.name} must return a value")
            self.emit("return", node)
            return
        if ret.kind == "void":
            raise self.error(node, "a void function returns no value")
        value = self.expr(values[0])
        if ret.kind in ("int", "float", "bool"):
            value = self.convert(value, ret)
        self.emit(f"return {strip_parens(value.code)}", node)

    # -- expressions ------------------------------------------------------------------------------------------

    def expr(self, node: Node) -> Expr:
        handler = self.EXPR.get(node.type)
        if handler is None:
            raise self.error(node, f"unsupported expression: {node.type}")
        return handler(self, node)

    def lookup_local(self, name: str) -> Sym | None:
        if self.func is None:
            return None
        for scope in reversed(self.func.scopes):
            if name in scope:
                return scope[name]
        return None

    def identifier(self, node: Node) -> Expr:
        name = self.text(node)
        sym = self.lookup_local(name)
        if sym is not None:
            return Expr(name, sym.ctype)
        if name in self.module_consts:
            return Expr(name, self.module_consts[name].ctype)
        if name == "NUM_AI_CORES" and "NUM_AI_CORES" in self.constants:
            return Expr(name, int_ctype(True))
        value = enums.lookup(None, name)
        if value is not None:
            return self.enum_constant(None, name, value)
        if name in self.functions or name in self.device_exports:
            raise self.error(node, f"{name!r} is a function; call it")
        raise self.error(node, f"undeclared identifier {name!r}")

    def enum_constant(self, scope: str | None, name: str, value: int) -> Expr:
        py = enums.python_name(scope, name)
        self.used_enums[py] = (value, f"{scope}::{name}" if scope else name)
        return Expr(py, int_ctype(value >= 0))

    def qualified_identifier(self, node: Node) -> Expr:
        parts = self.qualified_parts(node)
        if len(parts) == 2 or (len(parts) == 3 and parts[0] in enums.IGNORED_NAMESPACES):
            scope, name = parts[-2], parts[-1]
            value = enums.lookup(scope, name)
            if value is not None:
                return self.enum_constant(scope, name, value)
        if len(parts) == 2 and parts[0] in enums.IGNORED_NAMESPACES:
            return self.identifier_by_name(node, parts[1])
        raise self.error(node, f"unknown qualified name {'::'.join(parts)!r} (known scopes: {sorted(enums.SCOPED)})")

    def identifier_by_name(self, node: Node, name: str) -> Expr:
        value = enums.lookup(None, name)
        if value is not None:
            return self.enum_constant(None, name, value)
        raise self.error(node, f"unknown name {name!r}")

    def qualified_parts(self, node: Node) -> list[str]:
        parts = []
        while node.type == "qualified_identifier":
            scope = node.child_by_field_name("scope")
            parts.append(self.text(scope) if scope is not None else "")
            node = node.child_by_field_name("name")
        parts.append(self.text(node))
        return parts

    def number_literal(self, node: Node) -> Expr:
        text = self.text(node).replace("'", "")
        value, is_float32, is_float = parse_number(text)
        if value is None:
            raise self.error(node, f"unsupported number literal {text!r}")
        if is_float32:
            return Expr(f"np.float32({float(value)!r})", F32)
        if is_float:
            return Expr(repr(float(value)), F64)
        code = text.rstrip("uUlL")
        if re.fullmatch(r"0[0-7]+", code):
            code = str(value)
        return Expr(code, int_ctype(True))

    def bool_literal(self, node: Node) -> Expr:
        return Expr("True" if node.type == "true" else "False", BOOL)

    def parenthesized(self, node: Node) -> Expr:
        inner = [c for c in node.named_children if c.type != "comment"]
        if len(inner) != 1:
            raise self.error(node, "unsupported parenthesized expression")
        return self.expr(inner[0])

    def unary(self, node: Node) -> Expr:
        op = self.text(node.child_by_field_name("operator"))
        arg = self.expr(node.child_by_field_name("argument"))
        if op == "!":
            return Expr(f"(not {arg.code})", BOOL)
        if op == "~":
            if arg.ctype.is_float:
                raise self.error(node, "~ on a floating-point value")
            return Expr(f"(~{arg.code})", int_ctype(False) if arg.ctype.kind != "unknown" else UNKNOWN)
        if op == "-":
            ctype = arg.ctype.with_nonneg(False) if arg.ctype.kind != "bool" else int_ctype(False)
            return Expr(f"(-{arg.code})", ctype)
        if op == "+":
            return arg
        raise self.error(node, f"unsupported unary operator {op}")

    def binary(self, node: Node) -> Expr:
        op = self.text(node.child_by_field_name("operator"))
        left = self.expr(node.child_by_field_name("left"))
        right = self.expr(node.child_by_field_name("right"))
        return self.binary_codes(left, op, right, node)

    def binary_codes(self, left: Expr, op: str, right: Expr, node: Node) -> Expr:
        if op in ("&&", "||"):
            return Expr(f"({left.code} {'and' if op == '&&' else 'or'} {right.code})", BOOL)
        if op in ("<", "<=", ">", ">=", "==", "!="):
            a, b, _ = self.usual_conversions(left, right)
            return Expr(f"({a} {op} {b})", BOOL)
        if left.ctype.kind == "array" or right.ctype.kind == "array":
            return self.pointer_arithmetic(left, op, right, node)
        if op in ("<<", ">>", "&", "|", "^"):
            if left.ctype.is_float or right.ctype.is_float:
                raise self.error(node, f"{op} on a floating-point operand")
            known = left.ctype.kind != "unknown" and right.ctype.kind != "unknown"
            nonneg = {"<<": left.ctype.nonneg and right.ctype.nonneg, ">>": left.ctype.nonneg,
                      "&": left.ctype.nonneg or right.ctype.nonneg,
                      "|": left.ctype.nonneg and right.ctype.nonneg, "^": left.ctype.nonneg and right.ctype.nonneg}[op]
            if left.ctype.kind == "bool" and right.ctype.kind == "bool" and op in "&|^":
                return Expr(f"({left.code} {op} {right.code})", BOOL)
            return Expr(f"({left.code} {op} {right.code})", int_ctype(nonneg) if known else UNKNOWN)
        if op not in ("+", "-", "*", "/", "%"):
            raise self.error(node, f"unsupported binary operator {op}")
        a, b, ctype = self.usual_conversions(left, right)
        both_int = left.ctype.is_int and right.ctype.is_int
        nonneg = left.ctype.nonneg and right.ctype.nonneg
        if op == "/":
            if both_int and nonneg:
                return Expr(f"({a} // {b})", int_ctype(True))
            if ctype.kind == "float":
                return Expr(f"({a} / {b})", ctype)
            return Expr(f"c_div({strip_parens(a)}, {strip_parens(b)})", int_ctype(False) if both_int else UNKNOWN)
        if op == "%":
            if ctype.kind == "float":
                raise self.error(node, "% on a floating-point operand (not C)")
            if both_int and nonneg:
                return Expr(f"({a} % {b})", int_ctype(True))
            return Expr(f"c_mod({strip_parens(a)}, {strip_parens(b)})", int_ctype(False) if both_int else UNKNOWN)
        if ctype.kind == "int":
            ctype = int_ctype(nonneg and op in ("+", "*"))
        return Expr(f"({a} {op} {b})", ctype)

    def pointer_arithmetic(self, left: Expr, op: str, right: Expr, node: Node) -> Expr:
        if op == "+" and left.ctype.kind == "array" and right.ctype.is_int and left.ctype.ndim in (0, 1):
            return Expr(f"{left.code}[{strip_parens(right.code)}:]", left.ctype)
        if op == "+" and right.ctype.kind == "array" and left.ctype.is_int and right.ctype.ndim in (0, 1):
            return Expr(f"{right.code}[{strip_parens(left.code)}:]", right.ctype)
        raise self.error(node, f"unsupported tensor arithmetic ({op}); only 1-D `tensor + offset` is supported")

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

    def conditional(self, node: Node) -> Expr:
        cond = self.expr(node.child_by_field_name("condition"))
        a = self.expr(node.child_by_field_name("consequence"))
        b = self.expr(node.child_by_field_name("alternative"))
        ac, bc, ctype = self.usual_conversions(a, b)
        if a.ctype.kind == "bool" and b.ctype.kind == "bool":
            ctype = BOOL
        if ctype.kind == "int":
            ctype = int_ctype(a.ctype.nonneg and b.ctype.nonneg)
        return Expr(f"({strip_parens(ac)} if {strip_parens(cond.code)} else {strip_parens(bc)})", ctype)

    def cast(self, node: Node) -> Expr:
        target = self.type_of(node.child_by_field_name("type"), node)
        return self.cast_to(target, self.expr(node.child_by_field_name("value")), node)

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

    def sizeof(self, node: Node) -> Expr:
        type_node = node.child_by_field_name("type")
        value = node.child_by_field_name("value")
        if type_node is None and value is not None and value.type == "parenthesized_expression" and \
                len(value.named_children) == 1 and value.named_children[0].type == "identifier":
            type_node = value.named_children[0]  # sizeof(half): tree-sitter cannot know `half` is a type
        if type_node is None:
            raise self.error(node, "sizeof is supported on types only: sizeof(T)")
        name = self.text(type_node).strip()
        if name in SIZEOF_ONLY:
            return Expr(str(SIZEOF_ONLY[name]), int_ctype(True))
        ctype = self.type_of(type_node.child_by_field_name("type") or type_node, node)
        if ctype.kind not in ("int", "float", "bool"):
            raise self.error(node, f"sizeof({name}) is not supported")
        return Expr(str(np.dtype(ctype.np).itemsize), int_ctype(True))

    def subscript(self, node: Node) -> Expr:
        indices = []
        base = node
        while base.type == "subscript_expression":
            index_nodes = [c for c in base.child_by_field_name("indices").named_children if c.type != "comment"]
            if len(index_nodes) != 1:
                raise self.error(base, "one index per [] (write a[i][j])")
            indices.append(index_nodes[0])
            base = base.child_by_field_name("argument")
        indices.reverse()
        arr = self.expr(base)
        if arr.ctype.kind not in ("array", "unknown"):
            raise self.error(base, "subscript of a non-array value")
        codes = []
        for index in indices:
            idx = self.expr(index)
            if idx.ctype.is_float:
                raise self.error(index, "floating-point array index")
            codes.append(strip_parens(idx.code))
        if arr.ctype.kind == "array":
            if arr.ctype.ndim and len(codes) > arr.ctype.ndim:
                raise self.error(node, f"{len(codes)} indices into a {arr.ctype.ndim}-D array")
            if arr.ctype.ndim in (0, len(codes)) and arr.ctype.np:  # rank 0 = unknown: assume full indexing
                ctype = scalar_ctype(arr.ctype.np, arr.ctype.np.startswith("uint"))
            elif arr.ctype.ndim in (0, len(codes)):
                ctype = UNKNOWN
            else:
                ctype = CType("array", arr.ctype.np, arr.ctype.ndim - len(codes))
        else:
            ctype = UNKNOWN
        return Expr(f"{arr.code}[{', '.join(codes)}]", ctype)

    def call_args(self, node: Node) -> list[Expr]:
        return [self.expr(c) for c in node.child_by_field_name("arguments").named_children if c.type != "comment"]

    def call(self, node: Node) -> Expr:
        fn = node.child_by_field_name("function")
        template_args: list[Node] = []
        if fn.type == "field_expression":
            return self.method_call(node, fn)
        name_node = fn
        if fn.type == "template_function":
            name_node = fn.child_by_field_name("name")
            template_args = [c for c in fn.child_by_field_name("arguments").named_children if c.type != "comment"]
        elif fn.type == "qualified_identifier":
            parts = self.qualified_parts(fn)
            inner = fn
            while inner.type == "qualified_identifier":
                inner = inner.child_by_field_name("name")
            if parts[0] not in enums.IGNORED_NAMESPACES | {"std"} or len(parts) != 2:
                raise self.error(fn, f"unknown function {'::'.join(parts)!r}")
            if inner.type == "template_function":
                template_args = [c for c in inner.child_by_field_name("arguments").named_children
                                 if c.type != "comment"]
                name_node = inner.child_by_field_name("name")
            else:
                name_node = inner
            if parts[0] == "std" and self.text(name_node) not in ("min", "max", "abs"):
                raise self.error(fn, f"unsupported std function {'::'.join(parts)!r}")
        if name_node.type != "identifier":
            raise self.error(fn, f"unsupported callee ({fn.type})")
        name = self.text(name_node)
        handler = self.BUILTIN_CALLS.get(name)
        if handler is not None:
            return handler(self, node, template_args)
        args = self.call_args(node)
        if name in self.functions:
            return self.template_call(node, self.functions[name], template_args, args)
        if name in self.device_exports:
            self.used_device.add(name)
            leading = [self.template_argument(t) for t in template_args]
            codes = leading + [strip_parens(a.code) for a in args]
            return Expr(f"{name}({', '.join(codes)})", UNKNOWN)
        raise self.error(name_node, f"unknown function {name!r}: neither a template function nor an export of "
                                    f"{self.device_module}")

    def template_call(self, node: Node, sig: FuncSig, template_args: list[Node], args: list[Expr]) -> Expr:
        if sig.is_entry:
            raise self.error(node, "the kernel entry cannot be called from the kernel")
        if template_args:
            raise self.error(node, "template functions take no template arguments (jinja specializes them)")
        if len(args) != len(sig.params):
            raise self.error(node, f"{sig.name} takes {len(sig.params)} arguments, got {len(args)}")
        codes = []
        for (_pname, ptype), arg in zip(sig.params, args, strict=True):
            if ptype.kind in ("int", "float", "bool"):
                arg = self.convert(arg, ptype)
            codes.append(strip_parens(arg.code))
        ret = sig.ret if sig.ret.kind != "void" else VOID
        return Expr(f"{sig.name}({', '.join(codes)})", ret)

    def template_argument(self, node: Node) -> str:
        if node.type == "type_descriptor":
            inner = node.child_by_field_name("type")
            if inner.type == "qualified_identifier":  # tree-sitter reads Scope::NAME as a type here
                return self.qualified_identifier(inner).code
            if inner.type == "type_identifier":
                name = self.text(inner)
                if name in self.module_consts or enums.lookup(None, name) is not None:
                    return self.identifier(inner).code
            ctype = self.type_of(inner, node)
            if ctype.kind not in ("int", "float", "bool"):
                raise self.error(node, "template type arguments must be scalar types")
            return f"np.{ctype.np}"
        return strip_parens(self.expr(node).code)

    def method_call(self, node: Node, fn: Node) -> Expr:
        obj = self.expr(fn.child_by_field_name("argument"))
        method = self.text(fn.child_by_field_name("field"))
        args = self.call_args(node)
        if obj.ctype.kind not in ("array", "unknown"):
            raise self.error(fn, f".{method}() on a non-tensor value")
        if method == "GetValue" and len(args) == 1:
            elem = scalar_ctype(obj.ctype.np) if obj.ctype.np else UNKNOWN
            return Expr(f"{obj.code}[{strip_parens(args[0].code)}]", elem)
        if method == "GetSize" and not args:
            return Expr(f"{obj.code}.size", int_ctype(True))
        if method == "SetValue":
            raise self.error(node, "SetValue(i, v) is a statement, not a value")
        raise self.error(fn, f"unsupported method .{method}() (supported: GetValue, SetValue, GetSize)")

    # builtin calls

    def call_block_idx(self, node: Node, template_args) -> Expr:
        if self.call_args(node) or template_args:
            raise self.error(node, "GetBlockIdx() takes no arguments")
        if self.func is None or not self.func.sig.is_entry:
            raise self.error(node, "GetBlockIdx() is available in the kernel entry only; pass it to helpers")
        return Expr("_block_idx", int_ctype(True))

    def call_block_num(self, node: Node, template_args) -> Expr:
        if self.call_args(node) or template_args:
            raise self.error(node, "GetBlockNum() takes no arguments")
        return Expr("NUM_AI_CORES", int_ctype(True))

    def call_minmax(self, node: Node, template_args) -> Expr:
        name = self.text(node.child_by_field_name("function")).split("::")[-1].split("<")[0]
        args = self.call_args(node)
        if len(args) < 2:
            raise self.error(node, f"{name} needs two arguments")
        a, b, ctype = self.usual_conversions(args[0], args[1])
        codes = [a, b]
        for extra in args[2:]:
            _, c, ctype2 = self.usual_conversions(Expr("x", ctype), extra)
            codes.append(c)
            ctype = ctype2
        if ctype.kind == "int":
            nonneg = all(x.ctype.nonneg for x in args) if name == "min" else any(x.ctype.nonneg for x in args)
            ctype = int_ctype(nonneg)
        return Expr(f"{name}({', '.join(strip_parens(c) for c in codes)})", ctype)

    def call_abs(self, node: Node, template_args) -> Expr:
        args = self.call_args(node)
        if len(args) != 1:
            raise self.error(node, "abs takes one argument")
        ctype = args[0].ctype.with_nonneg(True) if args[0].ctype.is_int else args[0].ctype
        return Expr(f"abs({strip_parens(args[0].code)})", ctype)

    def call_static_cast(self, node: Node, template_args) -> Expr:
        args = self.call_args(node)
        if len(template_args) != 1 or len(args) != 1:
            raise self.error(node, "static_cast<T>(x) takes one type and one value")
        inner = template_args[0].child_by_field_name("type") if template_args[0].type == "type_descriptor" \
            else template_args[0]
        return self.cast_to(self.type_of(inner, node), args[0], node)

    def call_alloc(self, node: Node, template_args) -> Expr:
        args = self.call_args(node)
        if len(template_args) != 1 or len(args) not in (1, 2):
            raise self.error(node, "AllocTensor<T>(n) or AllocTensor<T>(rows, cols)")
        inner = template_args[0].child_by_field_name("type") if template_args[0].type == "type_descriptor" \
            else template_args[0]
        elem = self.type_of(inner, node)
        if elem.kind not in ("int", "float", "bool"):
            raise self.error(node, "AllocTensor needs a scalar element type")
        for arg in args:
            if arg.ctype.is_float:
                raise self.error(node, "AllocTensor sizes must be integers")
        shape = strip_parens(args[0].code) if len(args) == 1 else \
            f"({strip_parens(args[0].code)}, {strip_parens(args[1].code)})"
        return Expr(f"np.empty({shape}, np.{elem.np})", CType("array", elem.np, len(args)))

    BUILTIN_CALLS = {
        "GetBlockIdx": call_block_idx, "GetBlockNum": call_block_num, "min": call_minmax, "max": call_minmax,
        "abs": call_abs, "static_cast": call_static_cast, "AllocTensor": call_alloc,
    }

    # -- types ------------------------------------------------------------------------------------------------

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

    # -- output -----------------------------------------------------------------------------------------------

    def finish(self) -> Translation:
        header = [
            f"# Generated by deep_gemm.jit from {self.template}; kernel entry {self.entry.name}.",
            "# `# L<n>` = line n of kernel.asc (the rendered template). Do not edit: the cache key covers it.",
            "import numpy as np",
            "from numba import njit, prange",
            "",
            "from deep_gemm.jit.numba_setup import apply_numba_settings",
            "",
            "apply_numba_settings()",
            "",
            "from deep_gemm.jit.cruntime import c_div, c_mod  # noqa: E402,F401",
        ]
        if self.used_device:
            header.append(f"from {self.device_module} import {', '.join(sorted(self.used_device))}  # noqa: E402")
        if self.used_enums:
            header.append("")
            for py, (value, spelling) in sorted(self.used_enums.items()):
                header.append(f"{py} = {value}  # {spelling}")
        header.append("")
        body = []
        for indent, text, line in self.lines:
            pad = "    " * indent
            if line is not None and text and not text.startswith("#") and not text.startswith("@"):
                body.append(f"{pad}{text}  # L{line}")
            else:
                body.append(f"{pad}{text}")
        python = "\n".join(header + body).rstrip() + "\n"
        helpers = [name for name, sig in self.functions.items() if not sig.is_entry]
        return Translation(python, self.entry.name, helpers, sorted(self.used_device), dict(self.module_values))

    TOP = {
        "function_definition": function,
        "linkage_specification": top_linkage,
        "declaration": top_declaration,
        "comment": top_comment,
        "preproc_include": top_ignore,
        "using_declaration": top_ignore,
        "static_assert_declaration": static_assert,
        ";": lambda self, node: None,
    }
    STMT = {
        "compound_statement": compound,
        "declaration": declaration,
        "expression_statement": expression_statement,
        "if_statement": if_statement,
        "for_statement": for_statement,
        "while_statement": while_statement,
        "break_statement": break_statement,
        "continue_statement": continue_statement,
        "return_statement": return_statement,
        "comment": comment,
        "static_assert_declaration": static_assert,
    }
    EXPR = {
        "identifier": identifier,
        "qualified_identifier": qualified_identifier,
        "number_literal": number_literal,
        "true": bool_literal,
        "false": bool_literal,
        "parenthesized_expression": parenthesized,
        "unary_expression": unary,
        "binary_expression": binary,
        "conditional_expression": conditional,
        "cast_expression": cast,
        "sizeof_expression": sizeof,
        "subscript_expression": subscript,
        "call_expression": call,
        "assignment_expression": lambda self, node: self.error_raise(
            node, "an assignment inside an expression is not supported; make it a statement"),
        "update_expression": lambda self, node: self.error_raise(
            node, "++/-- inside an expression is not supported; make it a separate statement"),
    }


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


def strip_parens(code: str) -> str:
    """Drop one pair of parentheses that encloses the whole expression."""
    if not (code.startswith("(") and code.endswith(")")):
        return code
    depth = 0
    for i, ch in enumerate(code):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and i < len(code) - 1:
            return code
    return code[1:-1]


def device_exports(module_name: str) -> set[str]:
    """Names a template may call: the device module's __all__, else its public callables."""
    import importlib

    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))
                 and not isinstance(getattr(module, n), type)]
    return {n for n in names if n.isidentifier() and not hasattr(builtins, n)}


def translate(source: str, *, template: str = "<source>", constants: dict | None = None,
              device_module: str = "deep_gemm.device", exports: set[str] | None = None) -> Translation:
    """Translate rendered C++ into Python (see SUBSET). Raises TranslateError at the first unsupported construct.

    ``template`` names the source in messages; ``constants`` are the build constants (NUM_AI_CORES is read from
    them when the source does not declare it); ``exports`` overrides the device names (default: the module's).
    """
    if exports is None:
        exports = device_exports(device_module)
    return Translator(source, template, dict(constants or {}), set(exports), device_module).run()
