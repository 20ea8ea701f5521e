"""The Translator: one translation of one rendered source, assembled from the mixins of this package; file scope
(constants, static_assert, includes), compile-time evaluation, names, and translate()."""

from __future__ import annotations

import builtins
import keyword

import numpy as np
from tree_sitter import Node

from .. import enums
from ..cruntime import c_div, c_mod
from ..errors import TranslateError
from ..render import LineMap
from .ctype import Conversions, int_value, scalar_ctype
from .diagnostics import Diagnostics
from .emitter import Emitter, Translation
from .entry import EntryABI
from .expressions import Expressions
from .mixed import MixedKernels
from .statements import Statements
from .symbols import EntryParam, FuncCtx, FuncSig, Sym
from .tree import TreeQueries, find_error_node, parse

# Names the generated Python itself uses: a template identifier may not take them.
RESERVED = frozenset(keyword.kwlist) | {
    "np", "njit", "prange", "range", "min", "max", "abs", "bool", "int", "float", "c_div", "c_mod", "_block_idx",
    "apply_numba_settings", "claim_core", "claim_slot", "finish_part", "_core",
}


class Translator(Diagnostics, TreeQueries, Emitter, Conversions, MixedKernels, EntryABI, Statements, Expressions):
    """One translation of one rendered source. Use translate() rather than this class."""

    def __init__(self, source: str, template: str, constants: dict[str, object], device_exports: set[str],
                 device_module: str, line_map: LineMap | None = None, sync_check: bool = False):
        self.template = template
        self.line_map = line_map
        self.sync_check = sync_check
        self.used_runtime: set[str] = set()  # deep_gemm.device.crosscore names the mixed entry uses
        self.used_check: set[str] = set()  # deep_gemm.device.synccheck names
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

    def run(self) -> Translation:
        self.check_syntax()
        self.collect_functions(self.root)
        self.inline = self.functions_to_inline()
        if self.entry is None:
            self.no_entry()
        self.analyse_mixed()
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

    def check_syntax(self) -> None:
        bad = find_error_node(self.root)
        if bad is not None:
            what = f"expected {bad.type!r}" if bad.is_missing else "syntax error (not in the supported C++ subset)"
            raise self.error(bad, what)

    def no_entry(self):
        raise TranslateError(f"{self.template}: no kernel entry (a `__global__ __aicore__ void name(...)` "
                             "function) in the rendered source")

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
        ctype = scalar_ctype(np_name)
        if ctype.kind == "int":
            ctype = int_value(np_name, int(value), int(value))
        self.module_consts[name] = Sym(ctype, const=True)
        self.emit(f"{name} = {self.literal(value, np_name)}", node)

    def evaluate(self, code: str, node: Node, what: str, extra: dict[str, object] | None = None):
        namespace = {"np": np, "c_div": c_div, "c_mod": c_mod, "min": min, "max": max, "abs": abs,
                     "float": float, "int": int, "bool": bool, "__builtins__": {}}
        namespace.update(extra or {})
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

    # NOTES: mixed kernels add builtins (GetSubBlockIdx, CrossCore*, UBTensor, SyncAll), the ASCEND_IS_AIC/AIV
    # identifiers and a generator-aware return; SetFlag/WaitFlag/PipeBarrier become the checker's calls in check mode.
    BUILTIN_CALLS = {
        **Expressions.BUILTIN_CALLS,
        "GetSubBlockIdx": MixedKernels.call_sub_block_idx, "CrossCoreSetFlag": MixedKernels.call_cross_set,
        "CrossCoreWaitFlag": MixedKernels.call_cross_wait, "UBTensor": MixedKernels.call_ub_tensor,
        "SyncAll": MixedKernels.call_sync_all, "SetFlag": MixedKernels.call_sync, "WaitFlag": MixedKernels.call_sync,
        "PipeBarrier": MixedKernels.call_sync,
    }
    EXPR = {**Expressions.EXPR, "identifier": MixedKernels.mixed_identifier}
    STMT = {**Statements.STMT, "return_statement": MixedKernels.mixed_return}
    TOP = {
        "function_definition": lambda self, node: self.function(node),
        "linkage_specification": top_linkage,
        "declaration": top_declaration,
        "comment": top_comment,
        "preproc_include": top_ignore,
        "using_declaration": top_ignore,
        "static_assert_declaration": Statements.static_assert,
        ";": lambda self, node: None,
    }


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
              device_module: str = "deep_gemm.device", exports: set[str] | None = None,
              line_map: LineMap | None = None, sync_check: bool = False) -> Translation:
    """Translate rendered C++ into Python (see SUBSET). Raises TranslateError at the first unsupported construct.

    ``template`` names the source in messages; ``constants`` are the build constants (NUM_AI_CORES is read from
    them when the source does not declare it); ``exports`` overrides the device names (default: the module's);
    ``line_map`` (render.render_lines) turns the `# L<n>` tags and error positions into template lines (without
    it they are lines of the source); ``sync_check`` emits the synchronisation checker's recording calls
    (DG_SYNC_CHECK).
    """
    if exports is None:
        exports = device_exports(device_module)
    return Translator(source, template, dict(constants or {}), set(exports), device_module, line_map,
                      sync_check).run()


def entry_params(source: str, *, template: str = "<source>", line_map=None) -> list[EntryParam]:
    """The kernel entry's parameters (name, C type, pointer/scalar, dtype) of a rendered source, in order, without
    translating the bodies. Raises TranslateError (with a caret; with the template line given render_lines()'
    ``line_map``) on a parse error or a bad signature."""
    translator = Translator(source, template, {}, set(), "<no device module>", line_map)
    translator.check_syntax()
    translator.collect_functions(translator.root)
    if translator.entry is None:
        translator.no_entry()
    return list(translator.entry.abi)
