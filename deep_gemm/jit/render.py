"""Render kernel templates (``*.asc.j2``, jinja2) with a dict of UPPER_CASE constants into Ascend-C-style C++.

Knows nothing of GEMM. Undefined variables fail at render time, naming the variable, template and line.
"""

from __future__ import annotations

import functools
import math
import numbers
import os
import re
import sys
from pathlib import Path

import jinja2

from .errors import RenderError

TEMPLATE_SUFFIX = ".asc.j2"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def default_template_dir() -> Path:
    """``templates/`` of a source checkout if there is one, else the packaged ``deep_gemm/templates``."""
    package_dir = Path(__file__).resolve().parent.parent
    checkout = package_dir.parent / "templates"
    if checkout.is_dir() and (package_dir.parent / "pyproject.toml").is_file():
        return checkout
    return package_dir / "templates"


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


@functools.cache
def _environment(directory: str) -> jinja2.Environment:
    # NOTES: trim_blocks/lstrip_blocks stay off so a line holding only a {% ... %} tag renders as an empty line:
    # the rendered source then keeps the template's line numbers except inside skipped or repeated blocks.
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(directory),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        finalize=_finalize,
    )


def resolve_template(name: str, template_dir: str | os.PathLike | None = None) -> tuple[Path, str]:
    """Find a template: an existing file path, or a name (``"fp8_gemm"``, ``"examples/vadd"``) under the
    templates directory. Returns (directory, file name relative to it)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"template name must be a non-empty str, got {name!r}")
    as_path = Path(name)
    if as_path.suffix == ".j2" and as_path.is_file():
        return as_path.resolve().parent, as_path.name
    directory = Path(template_dir) if template_dir is not None else default_template_dir()
    file_name = name if name.endswith(TEMPLATE_SUFFIX) else name + TEMPLATE_SUFFIX
    if not (directory / file_name).is_file():
        available = sorted(str(p.relative_to(directory)) for p in directory.rglob("*" + TEMPLATE_SUFFIX))
        raise RenderError(f"template {file_name!r} not found in {directory} (available: {available})")
    return directory.resolve(), file_name


def normalize_constants(constants: dict) -> dict[str, object]:
    """Check and normalise template constants: str keys that are identifiers; values None, bool, int, float, str,
    or lists/tuples of those (numpy scalars become Python scalars). Raises TypeError naming the bad entry."""
    if not isinstance(constants, dict):
        raise TypeError(f"constants must be a dict, got {type(constants).__name__}")
    out: dict[str, object] = {}
    for key, value in constants.items():
        if not isinstance(key, str) or not _IDENT.fullmatch(key):
            raise TypeError(f"template constant names must be identifiers, got {key!r}")
        out[key] = _normalize_value(key, value)
    return out


def _normalize_value(key: str, value: object) -> object:
    if value is None or isinstance(value, (bool, str)):
        return value  # NOTES: None is accepted here and refused only if the template renders it
    if hasattr(value, "dtype") and getattr(value, "shape", None) == ():  # numpy scalar
        value = value.item()
        if isinstance(value, bool):
            return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (list, tuple)):
        return tuple(_normalize_value(key, v) for v in value)
    raise TypeError(f"template constant {key}={value!r} has unsupported type {type(value).__name__}")


def render(name: str, constants: dict, template_dir: str | os.PathLike | None = None) -> str:
    """Render template ``name`` (see resolve_template) with ``constants``; returns the C++ text.

    Raises RenderError for a missing template, an undefined variable (named, with template and line) or a
    template syntax error.
    """
    constants = normalize_constants(constants)
    directory, file_name = resolve_template(name, template_dir)
    env = _environment(str(directory))
    try:
        template = env.get_template(file_name)
    except jinja2.TemplateSyntaxError as e:
        raise RenderError(f"{file_name}:{e.lineno}: template syntax error: {e.message}") from None
    try:
        return template.render(**constants)
    except jinja2.UndefinedError as e:
        line = _template_line(sys.exc_info()[2], template.filename)
        where = f"{file_name}:{line}" if line else file_name
        raise RenderError(f"{where}: undefined template variable: {e.message} "
                          f"(constants given: {sorted(constants)})") from None
    except RenderError as e:
        line = _template_line(sys.exc_info()[2], template.filename)
        e.detail = f"{file_name}:{line}: {e.detail}" if line else f"{file_name}: {e.detail}"
        raise


def _template_line(tb, filename: str | None) -> int | None:
    """Line of the template that raised: jinja rewrites traceback frames to point at the template file."""
    line = None
    while tb is not None:
        if filename and tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line
