"""Diagnostics: a translate error names the template and line:col and shows the source line with a caret."""

from __future__ import annotations

from tree_sitter import Node

from ..errors import TranslateError


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


class Diagnostics:
    """Mixin of Translator: errors at a node of the parsed source (reads self.data, self.template, self.line_map)."""

    def error(self, node: Node, message: str) -> TranslateError:
        line_map = getattr(self, "line_map", None)
        if line_map is not None and node is not None:  # the position in the template too
            file, line = line_map.lines[node.start_point[0]] if node.start_point[0] < len(line_map.lines) else \
                (line_map.template, node.start_point[0] + 1)
            message = f"{message} [template {file}:{line}]"
        return TranslateError(caret_excerpt(self.data, node, self.template, message))

    def error_raise(self, node: Node, message: str):
        raise self.error(node, message)
