"""Expressions: each C expression node type is one short handler (EXPR) returning an Expr (Python code + CType);
calls go to builtins (BUILTIN_CALLS), template functions or device exports."""

from __future__ import annotations

import re

import numpy as np
from tree_sitter import Node

from .. import enums
from .ctype import BOOL, F32, F64, SIZEOF_ONLY, UNKNOWN, VOID, CType, Expr, int_ctype, parse_number, scalar_ctype
from .emitter import strip_parens
from .entry import FuncSig
from .statements import Sym


class Expressions:
    """Mixin of Translator: one handler per expression node type (EXPR) and per builtin call (BUILTIN_CALLS)."""

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
