"""Statements: declarations, assignments, control flow and scopes, each C statement kind one short handler
(STMT); counted `for` loops become `range`, others `while` with the update before every `continue`."""

from __future__ import annotations

import ast

import numpy as np
from tree_sitter import Node

from ..errors import TranslateError
from .ctype import INT_TYPES, CType, Expr, common_int, int_bounds, int_value
from .emitter import CANCEL, strip_parens
from .symbols import Sym


def _numba_may_type_as_literal(code: str) -> bool:
    """Whether numba would type a C variable initialised with ``code`` as a literal (a name, a number, or a
    conditional that numba's branch pruning reduces to one of them, as ``SHAPE_N != 0 ? SHAPE_N : shape_n``).

    NOTES: a declared C variable has its declared type, so such an initializer is emitted as np.int64(...) (what
    numba makes of the literal anyway, all C integers being int64 in generated code). Left a literal, every device
    function it is passed to compiled once per value: a new GEMM shape recompiled the GM -> L1 copies and FixPipe
    for its N and K. In the function itself LLVM still sees the constant (the cast folds); a callee is now
    compiled for any value, and sees it only where LLVM inlines it.
    """
    try:
        node = ast.parse(strip_parens(code), mode="eval").body
    except SyntaxError:
        return False
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return isinstance(node, (ast.Name, ast.Constant, ast.IfExp))


class Statements:
    """Mixin of Translator: one handler per statement node type (STMT)."""

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

    def push_scope(self) -> None:
        self.func.scopes.append({})

    def pop_scope(self) -> None:
        """Close the innermost C++ scope (see close_owners)."""
        self.close_owners()
        self.func.scopes.pop()

    def close_owners(self) -> None:
        """At the end of the innermost scope: the owners of the buffers it allocated (borrowed_allocation) are named
        once more, so they live to here."""
        for owner in self.func.owners.pop(len(self.func.scopes), []):
            self.emit(f"keep_alive({owner})", None)

    def compound(self, node: Node) -> None:
        self.push_scope()
        self.statements(node.named_children)
        self.pop_scope()

    def body(self, node: Node) -> None:
        """A statement used as the body of if/for/while, in its own scope, one indent deeper."""

        def run():
            self.push_scope()
            if node.type == "compound_statement":
                self.statements(node.named_children)
            else:
                self.statement(node)
            self.pop_scope()

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
            value = self.exact(value, value_node)
            ctype = value.ctype
            code = value.code
        elif pointer or base.kind == "array":
            if value.ctype.kind not in ("array", "unknown"):
                raise self.error(value_node, "a pointer/tensor must be initialized from a tensor or an allocation")
            ndim = value.ctype.ndim if value.ctype.kind == "array" else 0  # 0: rank unknown
            ctype = CType("array", base.np or value.ctype.np, ndim if not pointer else max(ndim, 1))
            code = value.code
        else:
            converted = self.convert(value, base, value_node)
            code, ctype = converted.code, converted.ctype
        # NOTES: a const keeps its initializer's bounds; a variable may be assigned anything of its type later.
        # Non-negative operands get Python's // and % (no C helpers).
        if ctype.kind == "int" and not is_const:
            ctype = CType("int", ctype.np)
        if ctype.kind == "int" and not is_constexpr and _numba_may_type_as_literal(code):
            code = f"np.int64({strip_parens(code)})"
        if not self.borrowed_allocation(name, code, decl):
            self.emit(f"{name} = {strip_parens(code)}", decl)
        self.define(name, ctype, is_const, decl)
        if is_constexpr:
            self.func.const_values[name] = self.evaluate(code, value_node, f"constexpr {name}")

    def borrowed_allocation(self, name: str, code: str, decl: Node) -> bool:
        """In a mixed kernel's sub-core body, ``LocalTensor<T> name = AllocTensor<T>(...)`` whose size is known only
        at run time (constant sizes take the local memory instead: mixed.py local_allocation) becomes an owner
        (``_dg_own_<name>``, the allocation) and ``name``, a borrowed view of it (crosscore.borrow: no reference
        count), which is what the body addresses; the owner is named again where the C++ scope ends
        (crosscore.keep_alive, pop_scope), so it lives as long as anything can address the view. True when emitted.

        NOTES: numba counts every view of a counted array atomically; an AIC's loops take views of its L0 slots per
        MAD (``l0a[ping]``, ``slot_view(l0c, ...)`` and the views the Cube's loads make): 13% of a small HC pre-norm
        call went to NRT_incref / NRT_decref."""
        if not (self.in_subcore() and code.startswith("np.empty(") and "AllocTensor" in self.text(decl)):
            return False
        owner = f"_dg_own_{name}"
        self.emit(f"{owner} = {strip_parens(code)}", decl)
        self.emit(f"{name} = borrow({owner})", decl)
        self.func.owners.setdefault(len(self.func.scopes), []).append(owner)
        self.used_runtime.update({"borrow", "keep_alive"})
        return True

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
        parts = [self.exact(self.expr(c), c).code for c in items] + ["0"] * (dims[0] - len(items))
        return "[" + ", ".join(parts) + "]"

    def define(self, name: str, ctype: CType, const: bool, node: Node) -> None:
        self.func.scopes[-1][name] = Sym(ctype, const, self.line(node))

    def declare_check(self, node: Node, name: str) -> None:
        self.check_name(node, name)
        for scope in self.func.scopes:
            if name in scope:
                raise self.error(node, f"{name!r} shadows a declaration at line {scope[name].line}; rename it "
                                       "(Python has one scope per function)")

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

    def simple_statement(self, expr: Node, stmt: Node) -> None:
        for line in self.simple_statement_lines(expr):
            self.emit(line, stmt)

    def simple_statement_lines(self, expr: Node) -> list[str]:
        """Python lines for an expression used as a statement: assignments, ++/--, calls, SetValue."""
        if expr.type == "assignment_expression":
            return self.assignment(expr)
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
                elem = CType("int", obj.ctype.np) if obj.ctype.kind == "array" and obj.ctype.np else None
                value = self.store_value(args[1], elem, expr)
                return [f"{obj.code}[{strip_parens(self.exact(args[0], expr).code)}] = {strip_parens(value.code)}"]
        return [strip_parens(self.expr(expr).code)]

    def assignment(self, node: Node) -> list[str]:
        left, op, right = node.child_by_field_name("left"), node.child_by_field_name("operator"), \
            node.child_by_field_name("right")
        op = self.text(op)
        if op == "=" and right.type == "assignment_expression" and self.text(right.child_by_field_name(
                "operator")) == "=":
            # chained a = b = c: b = c, then a = b converted to a's type (one line when that is a no-op)
            inner = self.assignment(right)
            target = self.lvalue(left)
            middle = self.lvalue(right.child_by_field_name("left"))
            value = self.assigned_value(target, left, middle, node)
            if value.code == middle.code and len(inner) == 1:
                return [f"{target.code} = {inner[0]}"]
            return inner + [f"{target.code} = {strip_parens(value.code)}"]
        target = self.lvalue(left)
        value = self.expr(right)
        if op == "=":
            return [f"{target.code} = {strip_parens(self.assigned_value(target, left, value, node).code)}"]
        binop = op[:-1]
        if binop in ("<<", ">>", "&", "|", "^") and target.ctype.kind == "float":
            raise self.error(node, f"{op} on a floating-point value")
        return [self.compound_assignment(target, left, binop, value, node)]

    def assigned_value(self, target: Expr, left: Node, value: Expr, node: Node) -> Expr:
        """value converted for `target = value`: a scalar variable converts as C does; an array element store
        narrows modulo 2**bits by itself (numpy), so only its value must be exact where wider than C's."""
        if left.type == "identifier" and target.ctype.kind in ("int", "float", "bool"):
            return self.convert(value, target.ctype, node)
        return self.store_value(value, target.ctype if target.ctype.kind == "int" else None, node)

    def store_value(self, value: Expr, elem: CType | None, node: Node) -> Expr:
        """A value stored into an array element of type elem (None: not an integer element)."""
        if value.wrapped and (elem is None or elem.np not in INT_TYPES or
                              INT_TYPES[elem.np][0] > INT_TYPES[value.ctype.np][0]):
            return self.exact(value, node)
        return value

    def compound_assignment(self, target: Expr, left: Node, binop: str, value: Expr, node: Node) -> str:
        """`target op= value` as C's `target = (T)(target op value)`: the in-place Python operator where numba's
        result equals C's, else the explicit conversion."""
        op = binop + "="
        if left.type != "identifier":
            if binop in ("/", "%"):
                combined = self.binary_codes(target, binop, value, node)
                return f"{target.code} = {strip_parens(self.store_value(combined, None, node).code)}"
            value = self.store_value(value, None if value.ctype.kind != "int" else target.ctype, node)
            return f"{target.code} {op} {strip_parens(self.value_code(value))}"
        combined = self.binary_codes(target, binop, value, node)
        converted = self.convert(combined, target.ctype, node)
        if target.ctype.is_int and value.ctype.is_int and binop not in ("/", "%"):
            plain = f"({target.code} {binop} {self.value_code(value)})"
            if converted.code == plain:
                return f"{target.code} {op} {strip_parens(self.value_code(value))}"
        elif binop not in ("/", "%") and self.keeps_type(target.ctype, value.ctype):
            return f"{target.code} {op} {strip_parens(value.code)}"
        return f"{target.code} = {strip_parens(converted.code)}"

    def update(self, node: Node) -> str:
        op = self.text(node.child_by_field_name("operator"))
        argument = node.child_by_field_name("argument")
        target = self.lvalue(argument)
        if target.ctype.kind == "float":
            one = "np.float32(1)" if target.ctype.np == "float32" else "1"
            return f"{target.code} {'+=' if op == '++' else '-='} {one}"
        while argument.type == "parenthesized_expression":
            argument = argument.named_children[0]
        one = Expr("1", int_value("int32", 1, 1))
        return self.compound_assignment(target, argument, "+" if op == "++" else "-", one, node)

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
                self.push_scope()
                self.statements(taken.named_children if taken.type == "compound_statement" else [taken])
                self.pop_scope()
            return
        cond = self.exact(self.expr(self.condition_value(cond_node)), cond_node)
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

    def while_statement(self, node: Node) -> None:
        cond_node = self.condition_value(node.child_by_field_name("condition"))
        cond = self.exact(self.expr(cond_node), cond_node)
        self.emit(f"while {strip_parens(cond.code)}:", node)
        self.func.loops.append(None)
        self.body(node.child_by_field_name("body"))
        self.func.loops.pop()

    def for_statement(self, node: Node) -> None:
        self.push_scope()
        counted = self.counted_loop(node)
        body = node.child_by_field_name("body")
        if counted is not None:
            var, range_args, ctype = counted
            self.declare_check(node.child_by_field_name("initializer"), var)
            self.emit(f"for {var} in range({range_args}):", node)
            self.define(var, ctype, True, node)  # the body may not assign it (checked by counted_loop)
            self.func.loops.append(None)
            self.cancel_point(node)
            self.body(body)
            self.func.loops.pop()
        else:
            self.while_loop(node, body)
        self.pop_scope()

    def cancel_point(self, node: Node, indent: int = 1) -> None:
        """At the top of a persistent tile loop (its update steps by GetBlockNum()), leave the loop once the launch's
        cancel flag is set (jit/cruntime.py cancel_requested): a cancelled launch stops between tiles."""
        update = node.child_by_field_name("update")
        if not self.func.cancel or update is None or not self.calls_named(update, "GetBlockNum"):
            return
        self.indent += indent
        self.emit(f"if cancel_requested({CANCEL}):", node)
        self.emit("    break", node)
        self.indent -= indent

    def calls_named(self, node: Node, name: str) -> bool:
        if node.type == "call_expression":
            fn = node.child_by_field_name("function")
            if fn is not None and fn.type == "identifier" and self.text(fn) == name:
                return True
        return any(self.calls_named(child, name) for child in node.named_children)

    def while_loop(self, node: Node, body: Node) -> None:
        init = node.child_by_field_name("initializer")
        if init is not None:
            if init.type == "declaration":
                self.declaration(init)
            else:
                for part in self.comma_parts(init):
                    self.simple_statement(part, init)
        cond_node = node.child_by_field_name("condition")
        cond = self.exact(self.expr(cond_node), cond_node).code if cond_node is not None else "True"
        update = node.child_by_field_name("update")
        update_lines = []
        if update is not None:
            for part in self.comma_parts(update):
                update_lines += self.simple_statement_lines(part)
        self.emit(f"while {strip_parens(cond)}:", node)
        self.func.loops.append(update_lines)

        def run():
            self.push_scope()
            self.cancel_point(node, indent=0)
            self.statements(body.named_children if body.type == "compound_statement" else [body])
            self.pop_scope()
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
        # C types: the variable has type T; the comparison converts it and the bound to their common type
        var_type = base.np if base.kind == "int" else start.ctype.np
        tlo, thi = int_bounds(var_type)
        slo, shi = start.ctype.bounds
        if start.wrapped or start.raw or not tlo <= slo <= shi <= thi:
            return None  # the start narrows: the while form converts it
        cmp_type = common_int(var_type, bound.ctype.np)
        bound = self.exact(self.as_int(bound, cmp_type, bound_node), bound_node)
        blo, bhi = bound.ctype.bounds
        step_value = int(self.try_evaluate(step_code))
        # NOTES: range() is exact when the variable's values convert unchanged in the comparison and stepping past
        # the bound cannot wrap the variable (unsigned, or narrower than int: modular in C, an endless loop).
        modular = not INT_TYPES[var_type][1] or INT_TYPES[var_type][0] < 32
        if step_sign > 0 and op in ("<", "<="):
            if not INT_TYPES[cmp_type][1] and slo < 0:
                return None
            last = bhi - 1 if op == "<" else bhi
            if modular and last + step_value > thi:
                return None
            stop = bound.code if op == "<" else f"{bound.code} + 1"
            step = "" if step_code == "1" else f", {step_code}"
            lo, hi = slo, max(slo, min(last, thi))
        elif step_sign < 0 and op in (">", ">="):
            first = blo + 1 if op == ">" else blo
            if modular and first - step_value < tlo:
                if op == ">=" and not INT_TYPES[var_type][1] and bhi <= 0:
                    raise self.error(cond, f"{var} >= {self.text(bound_node)} is always true for an unsigned "
                                           f"{var_type}: the loop never ends in C")
                return None
            if not INT_TYPES[cmp_type][1] and first < 0:
                return None
            stop = bound.code if op == ">" else f"{bound.code} - 1"
            step = f", -{step_code}" if step_code.isidentifier() or step_code.isdigit() else f", -({step_code})"
            lo, hi = min(shi, max(first, tlo)), shi
        else:
            return None
        start_code = strip_parens(start.code)
        args = strip_parens(stop) if start_code == "0" and not step else f"{start_code}, {strip_parens(stop)}{step}"
        return var, args, int_value(var_type, lo, hi)

    def try_evaluate(self, code: str):
        try:
            return self.evaluate(code, self.root, "")
        except TranslateError:
            return None

    def runtime_int_arg(self, code: str) -> str:
        """A call argument's code, as np.int64(...) when it is a compile-time integer that numba would pass as a
        literal (a number, a module constant, an enum value).

        NOTES: numba compiles a callee once per literal argument, so every distinct constant (a flag id, a UB
        offset, a template line number) made another overload of the bookkeeping function it reaches: one FlashMLA
        kernel compiled cross_core_try_wait 6 times and ub_tensor 12. np.int64 is what numba makes of the literal
        inside the callee, so the value and its type are unchanged; the caller's LLVM still sees the constant (the
        cast folds) and passes it on where it inlines the callee. First used for the sync, cross-core and UB calls
        (a cold FlashMLA prefill compile 83.3 -> 67.7 s on a 2-core AVX2 machine), now for every device call: the
        tile sizes a config passes to the Cube, copy and view functions (Literal[int](32) in one config, (256) in
        the next) made each new GEMM config recompile 5-7 of them (FP8 GEMM specializations after the first:
        1.9-2.1 s -> 1.3-1.6 s, one numba compile each instead of 6-8, on the 2-vCPU AVX-512 VM)."""
        code = strip_parens(code)
        value = self.try_evaluate(code) if _numba_may_type_as_literal(code) else None
        if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) \
                and -2**63 <= int(value) < 2**63:
            return f"np.int64({code})"
        return code

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
            value = self.convert(value, ret, node)
        self.emit(f"return {strip_parens(value.code)}", node)

    def static_assert(self, node: Node) -> None:
        cond = node.child_by_field_name("condition")
        message = node.child_by_field_name("message")
        value = self.evaluate(self.expr(cond).code, cond, "static_assert condition")
        if not value:
            text = self.text(message) if message is not None else ""
            raise self.error(node, f"static_assert failed: {text or self.text(cond)}")
        self.emit(f"# static_assert({self.text(cond)}) holds", node)

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
