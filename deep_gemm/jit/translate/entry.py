"""Functions and the entry ABI: which functions the source defines, their signatures, the kernel entry's parameter
list (what a launcher binds by name), and how the entry is emitted: `_<entry>_core(_block_idx, ...)` plus the
two launch loops `<entry>(..., _dg_cancel, _dg_cores)` (the cores it claims, jit/launch.py) and
`<entry>_prange(..., _dg_cancel)`."""

from __future__ import annotations

from tree_sitter import Node

from .ctype import CType
from .emitter import CANCEL, CLAIM_CORE, CORES, FINISH_PART
from .symbols import EntryParam, FuncCtx, FuncSig, Sym


class EntryABI:
    """Mixin of Translator: function signatures, the entry's parameter list, and how functions are emitted."""

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
        params, abi = [], []
        for param in declarator.child_by_field_name("parameters").named_children:
            if param.type == "comment":
                continue
            if param.type != "parameter_declaration":
                raise self.error(param, f"unsupported parameter ({param.type})")
            pname, ptype = self.param(param)
            params.append((pname, ptype))
            abi.append(self.entry_param(param, pname, ptype))
        sig = FuncSig(name, params, ret, is_entry, node, tuple(abi))
        if is_entry:
            if self.entry is not None:
                raise self.error(name_node, f"a second kernel entry {name!r} (the first is {self.entry.name!r})")
            if ret.kind != "void":
                raise self.error(node.child_by_field_name("type"), "the kernel entry must return void")
            self.entry = sig
        self.functions[name] = sig

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

    def entry_param(self, param: Node, name: str, ctype: CType) -> EntryParam:
        """The ABI record of one parameter (see EntryParam): its C spelling is the declaration without the name."""
        decl = param.child_by_field_name("declarator")
        while decl.type in ("pointer_declarator", "reference_declarator"):
            decl = decl.child_by_field_name("declarator") or decl.named_children[-1]
        before = self.data[param.start_byte:decl.start_byte].decode()
        after = self.data[decl.end_byte:param.end_byte].decode()
        c_type = " ".join(f"{before} {after}".split()).replace(" *", "*").replace(" &", "&")
        kind = "pointer" if ctype.kind == "array" else "scalar"
        return EntryParam(name, c_type, kind, ctype.np, ctype.ndim if kind == "pointer" else 0)

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

    def function(self, node: Node) -> None:
        declarator = node.child_by_field_name("declarator")
        sig = self.functions[self.text(declarator.child_by_field_name("declarator"))]
        self.func = FuncCtx(sig)
        self.func.scopes.append({name: Sym(ctype, line=self.line(node)) for name, ctype in sig.params})
        names = [name for name, _ in sig.params]
        body = node.child_by_field_name("body")
        if sig.is_entry and self.needs_mixed_entry():
            self.emit_mixed_entry(sig, node)
            self.func = None
            return
        if sig.is_entry and not self.contains(body, "return_statement"):
            self.func.cancel = True
            self.emit_entry_direct(sig, node, body)
            self.func = None
            return
        self.emit("", None)
        # NOTES: the per-core body and helpers that reach device code are inlined at numba IR level (see
        # functions_to_inline); other helpers are ordinary cached functions.
        self.emit('@njit(inline="always")' if sig.name in self.inline else "@njit(cache=True)", node)
        if sig.is_entry:
            self.func.cancel = True
            self.emit(f"def _{sig.name}_core({', '.join(['_block_idx', CANCEL, *names])}):", node)
        else:
            self.emit(f"def {sig.name}({', '.join(self.hidden_params(sig) + names)}):", node)
        self.block(lambda: self.statements(body.named_children), body)
        if sig.is_entry:
            self.emit_entry_wrapper(sig, node)
        self.func = None

    def emit_entry_direct(self, sig: FuncSig, node: Node, body: Node) -> None:
        """The entry without a `return`: its body goes straight into both launch loops (no inlining pass)."""
        params = [name for name, _ in sig.params]
        floats = [name for name, ctype in sig.params if ctype.kind == "float"]
        threads_params = ", ".join([*params, CANCEL, CORES])
        heads = [("@njit(nogil=True, cache=True)", f"def {sig.name}({threads_params}):", "while True:",
                  CLAIM_CORE),
                 ("@njit(parallel=True, cache=True)", f"def {sig.name}_prange({', '.join([*params, CANCEL])}):",
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
                self.indent += 1
                for text in first.splitlines():  # the per-core cancel check
                    self.emit(text, node)
                self.indent -= 1
                start = len(self.lines)
                self.block(lambda: self.statements(body.named_children), body)
                body_lines = self.lines[start:]
                self.emit(FINISH_PART, node)
            else:
                self.indent += 1
                # NOTES: the parfor gufunc types its index uint64; index arithmetic wants int64.
                self.emit(first, node)
                self.indent -= 1
                self.lines.extend(body_lines)
            self.indent -= 1

    def emit_entry_wrapper(self, sig: FuncSig, node: Node) -> None:
        # NOTES: the kernel body is the inlined function _<entry>_core, run once per logical core: early `return`s
        # work and per-core buffers are allocated per core. Two launchers call it (jit/launch.py): <entry> runs the
        # cores it claims from the launch's counter on one thread (nogil; CoreLauncher runs it on every thread) and
        # <entry>_prange runs all cores in a numba prange. Scalar float parameters are rounded to float32 here.
        args = [f"np.{ctype.np}({name})" if ctype.kind == "float" else name for name, ctype in sig.params]
        params = [name for name, _ in sig.params]
        self.emit("", None)
        self.emit("@njit(nogil=True, cache=True)", node)
        self.emit(f"def {sig.name}({', '.join([*params, CANCEL, CORES])}):", node)
        self.indent += 1
        self.emit_claim_loop(f"_{sig.name}_core({', '.join(['_block_idx', CANCEL, *args])})", node)
        self.indent -= 1
        self.emit("", None)
        self.emit("@njit(parallel=True, cache=True)", node)
        self.emit(f"def {sig.name}_prange({', '.join([*params, CANCEL])}):", node)
        self.indent += 1
        self.emit("for _block_idx in prange(NUM_AI_CORES):", node)
        self.indent += 1
        # NOTES: np.int64(): the parfor pass types the index int64, its gufunc uint64.
        self.emit(f"_{sig.name}_core({', '.join(['np.int64(_block_idx)', CANCEL, *args])})", node)
        self.indent -= 2
