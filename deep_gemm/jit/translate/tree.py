"""Tree queries: parsing with tree-sitter-cpp (after macro expansion) and read-only questions about nodes (text,
line, what a subtree calls, mentions or assigns). Nothing here emits code."""

from __future__ import annotations

import tree_sitter_cpp
from tree_sitter import Language, Node, Parser

from ..macros import expand_macros, macro_positions

_LANGUAGE = Language(tree_sitter_cpp.language())
_PURE_CALLS = frozenset({"min", "max", "abs", "GetBlockNum", "GetBlockIdx", "static_cast"})


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


class TreeQueries:
    """Mixin of Translator: questions about nodes of self.data (the parsed bytes)."""

    def text(self, node: Node) -> str:
        return self.data[node.start_byte:node.end_byte].decode()

    @staticmethod
    def line(node: Node) -> int:
        return node.start_point[0] + 1

    @staticmethod
    def contains(node: Node, node_type: str) -> bool:
        stack = [node]
        while stack:
            n = stack.pop()
            if n.type == node_type:
                return True
            stack.extend(n.children)
        return False

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

    def comma_parts(self, node: Node) -> list[Node]:
        if node.type != "comma_expression":
            return [node]
        return self.comma_parts(node.child_by_field_name("left")) + self.comma_parts(node.child_by_field_name("right"))

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

    def qualified_parts(self, node: Node) -> list[str]:
        parts = []
        while node.type == "qualified_identifier":
            scope = node.child_by_field_name("scope")
            parts.append(self.text(scope) if scope is not None else "")
            node = node.child_by_field_name("name")
        parts.append(self.text(node))
        return parts

    def condition_value(self, node: Node) -> Node:
        if node.type == "condition_clause":
            value = node.child_by_field_name("value")
            if value is None or node.child_by_field_name("initializer") is not None:
                raise self.error(node, "declarations in conditions are not supported")
            return value
        return node
