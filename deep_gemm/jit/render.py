"""Render kernel templates (``*.asc.j2``, jinja2) with a dict of UPPER_CASE constants into Ascend-C-style C++.

Knows nothing of GEMM. Undefined variables fail at render time, naming the variable, template and line.
"""

from __future__ import annotations

import functools
import math
import os
import re
import sys
from dataclasses import dataclass

import jinja2
import jinja2.ext
from jinja2.lexer import Token

from .constants import TEMPLATE_SUFFIX, default_template_dir, normalize_constants, resolve_template  # noqa: F401
from .errors import RenderError

# Line marks: every line of template text carries an invisible mark naming its template file and line, removed
# after rendering (see _LineMarks). A mark is \x1f, decimal digits spelled U+2000..U+2009, U+200A, the digits of
# the file's index, \x1f: characters that str.isspace() (so jinja's trim) takes for whitespace and that break no
# line, so filters and whitespace handling see the text as before.
_MARK = re.compile("\x1f([\u2000-\u2009]+)\u200a([\u2000-\u2009]+)\x1f")
_TO_MARK_DIGITS = str.maketrans("0123456789", "".join(chr(0x2000 + i) for i in range(10)))
_FROM_MARK_DIGITS = str.maketrans("".join(chr(0x2000 + i) for i in range(10)), "0123456789")


def _finalize(value: object) -> object:
    # NOTES: Python spells booleans True/False, C++ true/false; None would render as "None" and parse as an
    # identifier, so it is refused here rather than surfacing as a confusing translate error.
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        raise RenderError("a template expression rendered None (pass a value or guard it with {% if %})")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise RenderError(f"a template expression rendered the non-finite float {value!r}")
        return repr(value)
    return value


@dataclass(frozen=True)
class LineMap:
    """Where each rendered line came from: ``lines[i]`` = (template file, line) of rendered line i + 1;
    ``template`` is the rendered template's own file name (others are imported libraries)."""

    template: str
    lines: tuple[tuple[str, int], ...]

    def tag(self, rendered_line: int) -> str:
        """`L<n>` for line n of the template itself, `<file>:L<n>` for line n of an imported template."""
        if not 1 <= rendered_line <= len(self.lines):
            return f"L{rendered_line}"
        file, line = self.lines[rendered_line - 1]
        return f"L{line}" if file == self.template else f"{file}:L{line}"


class _LineMarks(jinja2.ext.Extension):
    """Marks the template text of every template (and imported library) with its file and line: after each
    newline, and at the start of a text run that begins a template line. Runs on the token stream, after jinja has
    applied the `{%-` / `-%}` / `{#-` whitespace control, so the marks name the lines that survive it.

    NOTES: a one-line macro or `{% set %}` block (`{% macro t() -%}\nfloat\n{%- endmacro %}`) may be compared as
    a value, so a macro or set block whose text holds no newline gets no mark (its text takes the caller's line)."""

    files: list[str]  # set per environment: file index -> template name

    def filter_stream(self, stream):
        name = stream.name or stream.filename or "?"
        if name not in self.files:
            self.files.append(name)
        file_digits = str(self.files.index(name)).translate(_TO_MARK_DIGITS)

        def mark(line: int) -> str:
            return f"\x1f{str(line).translate(_TO_MARK_DIGITS)}\u200a{file_digits}\x1f"

        tokens = list(stream)
        # Value blocks (macro, call, set) and whether their text spans lines
        frame_of, stack, multiline = [None] * len(tokens), [], {}
        for i, token in enumerate(tokens):
            if token.type == "block_begin" and i + 1 < len(tokens) and tokens[i + 1].type == "name":
                word = tokens[i + 1].value
                if word in ("macro", "call") or (word == "set" and self._block_set(tokens, i + 1)):
                    stack.append(i)
                    multiline[i] = False
                elif word in ("endmacro", "endcall", "endset") and stack:
                    stack.pop()
            frame_of[i] = stack[-1] if stack else None
            if token.type == "data" and "\n" in token.value and stack:
                multiline[stack[-1]] = True
        previous_line = 0
        for i, token in enumerate(tokens):
            starts_line = token.lineno > previous_line
            previous_line = token.lineno
            frame = frame_of[i]
            if token.type != "data" or (frame is not None and not multiline[frame]) or \
                    ("\n" not in token.value and not starts_line):
                yield token
                continue
            parts = token.value.split("\n")
            text = (mark(token.lineno) if starts_line or "\n" in token.value else "") + parts[0]
            for k, part in enumerate(parts[1:], start=1):
                text += "\n" + mark(token.lineno + k) + part
            yield Token(token.lineno, "data", text)

    @staticmethod
    def _block_set(tokens, i: int) -> bool:
        """Whether the `set` at tokens[i] opens a block (`{% set x %}...{% endset %}`), not `{% set x = v %}`."""
        for token in tokens[i:]:
            if token.type == "assign":
                return False
            if token.type == "block_end":
                return True
        return False


@functools.cache
def _environment(directory: str) -> jinja2.Environment:
    # NOTES: trim_blocks/lstrip_blocks stay off so a line holding only a {% ... %} tag renders as an empty line;
    # the line marks (_LineMarks) give every rendered line its template line even where `{%-` joins lines or a
    # macro of another template expands.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(directory),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        finalize=_finalize,
        extensions=[_LineMarks],
    )
    env.extensions[_LineMarks.identifier].files = []
    return env


def _strip_marks(marked: str, files: list[str]) -> tuple[str, list[tuple[str, int]]]:
    """(text without marks, [(template file, line)] per text line). A line belongs to the last mark before its
    first non-blank character (a line without one: the line after the previous line's)."""
    lines, where = [], []
    previous = (files[0] if files else "?", 0)
    for raw in marked.split("\n"):
        owner = None
        text_start = len(raw)
        for i, ch in enumerate(raw):
            if not ch.isspace():
                text_start = i
                break
        for m in _MARK.finditer(raw):
            if m.start() > text_start and owner is not None:
                break
            owner = (files[int(m.group(2).translate(_FROM_MARK_DIGITS))], int(m.group(1).translate(_FROM_MARK_DIGITS)))
        previous = owner if owner is not None else (previous[0], previous[1] + 1)
        lines.append(_MARK.sub("", raw))
        where.append(previous)
    return "\n".join(lines), where[:len(lines)]


def render(name: str, constants: dict, template_dir: str | os.PathLike | None = None) -> str:
    """Render template ``name`` (see resolve_template) with ``constants``; returns the C++ text.

    Raises RenderError for a missing template, an undefined variable (named, with template and line) or a
    template syntax error.
    """
    return render_lines(name, constants, template_dir)[0]


def render_lines(name: str, constants: dict, template_dir: str | os.PathLike | None = None) -> tuple[str, LineMap]:
    """render() plus where each rendered line came from (LineMap: the template's own file, e.g.
    "fp8_gemm.asc.j2", or an imported one, e.g. "lib/gemm.asc.j2", and its line, after jinja's whitespace
    control). translate() writes it as the `# L<n>` tags of kernel.py."""
    constants = normalize_constants(constants)
    directory, file_name = resolve_template(name, template_dir)
    env = _environment(str(directory))
    try:
        template = env.get_template(file_name)
    except jinja2.TemplateSyntaxError as e:
        raise RenderError(f"{file_name}:{e.lineno}: template syntax error: {e.message}") from None
    try:
        marked = template.render(**constants)
    except jinja2.UndefinedError as e:
        line = _template_line(sys.exc_info()[2], template.filename)
        where = f"{file_name}:{line}" if line else file_name
        raise RenderError(f"{where}: undefined template variable: {e.message} "
                          f"(constants given: {sorted(constants)})") from None
    except RenderError as e:
        line = _template_line(sys.exc_info()[2], template.filename)
        e.detail = f"{file_name}:{line}: {e.detail}" if line else f"{file_name}: {e.detail}"
        raise
    text, lines = _strip_marks(marked, env.extensions[_LineMarks.identifier].files)
    return text, LineMap(file_name, tuple(lines))


def _template_line(tb, filename: str | None) -> int | None:
    """Line of the template that raised: jinja rewrites traceback frames to point at the template file."""
    line = None
    while tb is not None:
        if filename and tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line
