"""Expressions: each C expression node type is one short handler (EXPR) returning an Expr (Python code + CType);
calls go to builtins (BUILTIN_CALLS), template functions or device exports."""

from __future__ import annotations

import re

import numpy as np
from tree_sitter import Node

from .. import enums
from .ctype import (
    BOOL,
    F32,
    F64,
    INT64_MAX,
    INT_TYPES,
    SIZEOF_ONLY,
    UNKNOWN,
    VOID,
    CType,
    Expr,
    int_bounds,
    int_value,
    interval,
    literal_type,
    parse_number,
    promote,
    scalar_ctype,
)
from .emitter import strip_parens
from .symbols import FuncSig, Sym


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
            cores = int(self.constants["NUM_AI_CORES"])
            return Expr(name, int_value("int32", cores, cores))
        value = enums.lookup(None, name)
        if value is not None:
            return self.enum_constant(None, name, value)
        if name in self.functions or name in self.device_exports:
            raise self.error(node, f"{name!r} is a function; call it")
        raise self.error(node, f"undeclared identifier {name!r}")

    def enum_constant(self, scope: str | None, name: str, value: int) -> Expr:
        py = enums.python_name(scope, name)
        self.used_enums[py] = (value, f"{scope}::{name}" if scope else name)
        return Expr(py, int_value("int32", value, value))  # an enumerator's type: int

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
        return Expr(code, int_value(literal_type(value, text), value, value))

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
            return Expr(f"(not {self.exact(arg, node).code})", BOOL)
        if op == "~" and arg.ctype.is_float:
            raise self.error(node, "~ on a floating-point value")
        if op not in ("~", "-", "+"):
            raise self.error(node, f"unsupported unary operator {op}")
        if not arg.ctype.is_int:
            return Expr(f"({op}{arg.code})", arg.ctype if arg.ctype.kind == "float" else UNKNOWN) if op != "+" \
                else arg
        target = promote(arg.ctype.np)
        value = self.as_int(arg, target, node, lazy=True)
        if op == "+":
            return value
        lo, hi = value.ctype.bounds
        lo, hi = (-hi, -lo) if op == "-" else (-hi - 1, -lo - 1)
        return self.int_result(f"({op}{self.value_code(value)})", target, lo, hi, value.wrapped)

    def binary(self, node: Node) -> Expr:
        op = self.text(node.child_by_field_name("operator"))
        left = self.expr(node.child_by_field_name("left"))
        right = self.expr(node.child_by_field_name("right"))
        return self.binary_codes(left, op, right, node)

    def binary_codes(self, left: Expr, op: str, right: Expr, node: Node) -> Expr:
        if op in ("&&", "||"):
            a, b = self.exact(left, node), self.exact(right, node)
            return Expr(f"({a.code} {'and' if op == '&&' else 'or'} {b.code})", BOOL)
        if op in ("<", "<=", ">", ">=", "==", "!="):
            a, b, _ = self.usual_conversions(left, right, node)
            return Expr(f"({self.value_code(a)} {op} {self.value_code(b)})", BOOL)
        if left.ctype.kind == "array" or right.ctype.kind == "array":
            return self.pointer_arithmetic(left, op, right, node)
        if op not in ("+", "-", "*", "/", "%", "<<", ">>", "&", "|", "^"):
            raise self.error(node, f"unsupported binary operator {op}")
        if op in ("<<", ">>", "&", "|", "^") and (left.ctype.is_float or right.ctype.is_float):
            raise self.error(node, f"{op} on a floating-point operand")
        if left.ctype.kind == "bool" and right.ctype.kind == "bool" and op in ("&", "|", "^"):
            return Expr(f"({left.code} {op} {right.code})", BOOL)
        if left.ctype.is_int and right.ctype.is_int:
            return self.int_binary(left, op, right, node)
        a, b, ctype = self.usual_conversions(left, right, node)
        if ctype.kind == "float":
            if op == "%":
                raise self.error(node, "% on a floating-point operand (not C)")
            return Expr(f"({a.code} {op} {b.code})", ctype)
        # NOTES: an operand of unknown type (a device call's result): no C typing, C's / and % by helpers
        if op == "/":
            return Expr(f"c_div({strip_parens(a.code)}, {strip_parens(b.code)})", UNKNOWN)
        if op == "%":
            return Expr(f"c_mod({strip_parens(a.code)}, {strip_parens(b.code)})", UNKNOWN)
        return Expr(f"({a.code} {op} {b.code})", UNKNOWN)

    def int_binary(self, left: Expr, op: str, right: Expr, node: Node) -> Expr:
        """An integer operator with C's result: promotion, the usual arithmetic conversions, unsigned wrap-around
        (kept lazily, see Expr.wrapped), C's truncating / and %. Signed overflow is undefined in C: the value then
        stays the mathematical one."""
        if op in ("<<", ">>"):
            target = promote(left.ctype.np)
            a = self.as_int(left, target, node, lazy=op == "<<")
            count = self.exact(self.as_int(right, promote(right.ctype.np), node), node)
            bits = INT_TYPES[target][0]
            clo, chi = count.ctype.bounds
            if clo == chi and not 0 <= clo < bits:
                raise self.error(node, f"shift count {clo} is out of range for {target} (undefined in C)")
            clo, chi = max(clo, 0), min(chi, bits - 1)
            lo, hi = a.ctype.bounds
            if op == ">>":
                corners = [v >> c for v in (lo, hi) for c in (clo, chi)]
            else:
                corners = [v << c for v in (lo, hi) for c in (clo, chi)]
            return self.int_result(f"({self.value_code(a)} {op} {self.value_code(count)})", target, min(corners),
                                   max(corners), a.wrapped)
        lazy = op in ("+", "-", "*", "&", "|", "^")
        a, b, ctype = self.usual_conversions(left, right, node, lazy=lazy)
        target = ctype.np
        ac, bc = self.value_code(a), self.value_code(b)
        (alo, ahi), (blo, bhi) = a.ctype.bounds, b.ctype.bounds
        if lazy:
            lo, hi = interval(op, (alo, ahi), (blo, bhi))
            return self.int_result(f"({ac} {op} {bc})", target, lo, hi, a.wrapped or b.wrapped)
        nonneg = alo >= 0 and blo >= 0
        top = max(abs(blo), abs(bhi))
        if op == "/":
            if nonneg:
                return self.int_result(f"({ac} // {bc})", target, alo // max(bhi, 1), ahi // max(blo, 1), False)
            bound = max(abs(alo), abs(ahi))
            return self.int_result(f"c_div({strip_parens(ac)}, {strip_parens(bc)})", target, -bound, bound, False)
        if nonneg:
            return self.int_result(f"({ac} % {bc})", target, 0, max(0, min(ahi, bhi - 1)), False)
        return self.int_result(f"c_mod({strip_parens(ac)}, {strip_parens(bc)})", target,
                               0 if alo >= 0 else -max(top - 1, 0), max(top - 1, 0), False)

    def int_result(self, code: str, target: str, lo: int, hi: int, operands_wrapped: bool) -> Expr:
        """The Expr of an integer operation of C type target whose Python value lies in [lo, hi]."""
        tlo, thi = int_bounds(target)
        thi = min(thi, INT64_MAX)
        if tlo <= lo and hi <= thi and not operands_wrapped:
            return Expr(code, int_value(target, lo, hi))
        if INT_TYPES[target][1] and not operands_wrapped:  # signed overflow: undefined in C
            return Expr(code, int_value(target, max(lo, tlo), min(hi, thi)))
        return Expr(code, int_value(target, lo, hi), wrapped=True)

    def pointer_arithmetic(self, left: Expr, op: str, right: Expr, node: Node) -> Expr:
        if op == "+" and left.ctype.kind == "array" and right.ctype.is_int and left.ctype.ndim in (0, 1):
            return Expr(f"{left.code}[{strip_parens(right.code)}:]", left.ctype)
        if op == "+" and right.ctype.kind == "array" and left.ctype.is_int and right.ctype.ndim in (0, 1):
            return Expr(f"{right.code}[{strip_parens(left.code)}:]", right.ctype)
        raise self.error(node, f"unsupported tensor arithmetic ({op}); only 1-D `tensor + offset` is supported")

    def conditional(self, node: Node) -> Expr:
        cond = self.exact(self.expr(node.child_by_field_name("condition")), node)
        a = self.expr(node.child_by_field_name("consequence"))
        b = self.expr(node.child_by_field_name("alternative"))
        if a.ctype.kind == "bool" and b.ctype.kind == "bool":
            ac, bc, ctype, wrapped = a, b, BOOL, False
        elif a.ctype.kind == "int" and b.ctype.kind == "int" and a.ctype.np == b.ctype.np:
            ac, bc = a, b  # C++: operands of one type keep it (no promotion)
            ctype = int_value(a.ctype.np, min(a.ctype.bounds[0], b.ctype.bounds[0]),
                              max(a.ctype.bounds[1], b.ctype.bounds[1]))
            wrapped = a.wrapped or b.wrapped
        else:
            ac, bc, ctype = self.usual_conversions(a, b, node, lazy=True)
            wrapped = ac.wrapped or bc.wrapped
            if ctype.kind == "int":
                ctype = int_value(ctype.np, min(ac.ctype.bounds[0], bc.ctype.bounds[0]),
                                  max(ac.ctype.bounds[1], bc.ctype.bounds[1]))
        known = self.try_evaluate(cond.code) if ctype.kind == "int" else None
        if known is not None:  # a compile-time condition: the value is the taken arm's (the code stays as written)
            taken = ac if known else bc
            ctype = int_value(ctype.np, *taken.ctype.bounds)
            wrapped = taken.wrapped
        code = f"({strip_parens(self.value_code(ac))} if {strip_parens(cond.code)} else " \
               f"{strip_parens(self.value_code(bc))})"
        return Expr(code, ctype, wrapped=wrapped)

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
            return Expr(str(SIZEOF_ONLY[name]), int_value("uint64", SIZEOF_ONLY[name], SIZEOF_ONLY[name]))
        ctype = self.type_of(type_node.child_by_field_name("type") or type_node, node)
        if ctype.kind not in ("int", "float", "bool"):
            raise self.error(node, f"sizeof({name}) is not supported")
        size = np.dtype(ctype.np).itemsize
        return Expr(str(size), int_value("uint64", size, size))

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
            idx = self.exact(self.expr(index), index)
            if idx.ctype.is_float:
                raise self.error(index, "floating-point array index")
            codes.append(strip_parens(idx.code))
        if arr.ctype.kind == "array":
            if arr.ctype.ndim and len(codes) > arr.ctype.ndim:
                raise self.error(node, f"{len(codes)} indices into a {arr.ctype.ndim}-D array")
            if arr.ctype.ndim in (0, len(codes)) and arr.ctype.np:  # rank 0 = unknown: assume full indexing
                ctype = scalar_ctype(arr.ctype.np)
                if ctype.kind == "int" and arr.ctype.np.startswith("uint"):
                    return Expr(f"{arr.code}[{', '.join(codes)}]", ctype, raw=True)
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
            codes = leading + [self.device_argument(a, node) for a in args]
            return Expr(f"{name}({', '.join(codes)})", UNKNOWN)
        raise self.error(name_node, f"unknown function {name!r}: neither a template function nor an export of "
                                    f"{self.device_module}")

    def device_argument(self, arg: Expr, node: Node) -> str:
        """The code of one argument of a device function call: a compile-time integer as np.int64 (runtime_int_arg),
        so one numba compile of the function serves every constant and every config."""
        return self.runtime_int_arg(self.exact(arg, node).code if arg.wrapped else arg.code)

    def template_call(self, node: Node, sig: FuncSig, template_args: list[Node], args: list[Expr]) -> Expr:
        if sig.is_entry:
            raise self.error(node, "the kernel entry cannot be called from the kernel")
        if template_args:
            raise self.error(node, "template functions take no template arguments (jinja specializes them)")
        if len(args) != len(sig.params):
            raise self.error(node, f"{sig.name} takes {len(sig.params)} arguments, got {len(args)}")
        codes = self.hidden_params(sig)  # the checker's state, threaded into helpers that synchronise
        for (_pname, ptype), arg in zip(sig.params, args, strict=True):
            if ptype.kind in ("int", "float", "bool"):
                arg = self.convert(arg, ptype, node)
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
            raw = elem.kind == "int" and obj.ctype.np.startswith("uint")
            return Expr(f"{obj.code}[{strip_parens(self.exact(args[0], node).code)}]", elem, raw=raw)
        if method == "GetSize" and not args:
            return Expr(f"{obj.code}.size", int_value("uint32", 0, 2**32 - 1))
        if method == "SetValue":
            raise self.error(node, "SetValue(i, v) is a statement, not a value")
        raise self.error(fn, f"unsupported method .{method}() (supported: GetValue, SetValue, GetSize)")

    def call_block_idx(self, node: Node, template_args) -> Expr:
        if self.call_args(node) or template_args:
            raise self.error(node, "GetBlockIdx() takes no arguments")
        if self.func is None or not self.func.sig.is_entry:
            raise self.error(node, "GetBlockIdx() is available in the kernel entry only; pass it to helpers")
        cores = int(self.constants.get("NUM_AI_CORES", 2**31))
        return Expr("_block_idx", int_value("int64", 0, cores - 1))  # Ascend C: int64_t GetBlockIdx()

    def call_block_num(self, node: Node, template_args) -> Expr:
        if self.call_args(node) or template_args:
            raise self.error(node, "GetBlockNum() takes no arguments")
        cores = self.module_values.get("NUM_AI_CORES", self.constants.get("NUM_AI_CORES"))
        lo, hi = (int(cores), int(cores)) if cores is not None else (1, 2**31)
        return Expr("NUM_AI_CORES", int_value("int64", lo, hi))  # Ascend C: int64_t GetBlockNum()

    def call_minmax(self, node: Node, template_args) -> Expr:
        name = self.text(node.child_by_field_name("function")).split("::")[-1].split("<")[0]
        args = self.call_args(node)
        if len(args) < 2:
            raise self.error(node, f"{name} needs two arguments")
        if len(template_args) == 1:  # std::min<T>(a, b): both converted to T
            target = self.type_of(template_args[0].child_by_field_name("type") or template_args[0], node)
            args = [self.convert(x, target, node) for x in args]
        elif template_args:
            raise self.error(node, f"{name}<T> takes one type")
        a, b, ctype = self.usual_conversions(args[0], args[1], node)
        values = [a, b]
        for extra in args[2:]:
            _, c, ctype = self.usual_conversions(Expr("x", ctype), extra, node)
            values = [self.convert(v, ctype, node) for v in values] + [c]
        if ctype.kind == "int":
            pick = min if name == "min" else max
            ctype = int_value(ctype.np, pick(v.ctype.bounds[0] for v in values),
                              pick(v.ctype.bounds[1] for v in values))
        return Expr(f"{name}({', '.join(strip_parens(self.value_code(v)) for v in values)})", ctype)

    def call_abs(self, node: Node, template_args) -> Expr:
        args = self.call_args(node)
        if len(args) != 1:
            raise self.error(node, "abs takes one argument")
        value = args[0]
        if value.ctype.is_int:
            value = self.exact(self.as_int(value, promote(value.ctype.np), node), node)
            lo, hi = value.ctype.bounds
            top = max(abs(lo), abs(hi))
            low = 0 if lo <= 0 <= hi else min(abs(lo), abs(hi))
            return Expr(f"abs({strip_parens(value.code)})", int_value(value.ctype.np, low, top))
        return Expr(f"abs({strip_parens(value.code)})", value.ctype)

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
        args = [self.exact(arg, node) for arg in args]
        if self.in_subcore():
            local = self.local_allocation([strip_parens(a.code) for a in args], elem.np, node)
            if local is not None:
                return local
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
