"""Template constants and template lookup, without jinja2: what build() needs before it knows whether a kernel
must be rendered (a cached kernel is found from its constants alone, keyindex.py).
"""

from __future__ import annotations

import numbers
import os
import re
from pathlib import Path

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


