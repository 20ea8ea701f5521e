"""Which of our Python sources a kernel's generated code depends on, for its cache key: the JIT modules that shape
generated code, and the device modules the kernel's template uses (with the in-package modules they import).

Everything here reads files as text; nothing is imported, so a key costs no numba import. Results are cached
per process: a process keeps the sources it imported.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import re
from pathlib import Path

_JIT_DIR = Path(__file__).resolve().parent

# NOTES: the JIT modules whose code decides what a template becomes (the generated kernel.py) or how numba compiles
# it; a change in any other JIT module (the cache, the launcher, the dump tool, errors) leaves kernels valid.
CODEGEN_SOURCES = ("translate", "macros.py", "render.py", "enums.py", "cruntime.py", "numba_setup.py")

_IDENTIFIER = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")


@functools.cache
def _file_sha256(path: Path) -> str:
    return hashlib.sha256(_text(path).encode()).hexdigest()


def _digest_files(files: list[tuple[str, Path]]) -> str:
    h = hashlib.sha256()
    for label, path in sorted(files):
        h.update(f"{label}\0{_file_sha256(path)}\0".encode())
    return h.hexdigest()


@functools.cache
def codegen_sources_digest() -> str:
    """sha256 over the JIT modules listed in CODEGEN_SOURCES (packages walked), named relative to jit/."""
    files = []
    for entry in CODEGEN_SOURCES:
        path = _JIT_DIR / entry
        paths = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        files += [(str(p.relative_to(_JIT_DIR)), p) for p in paths if "__pycache__" not in p.parts]
    return _digest_files(files)


# ---------------------------------------------------------------------------------------------------------------
# Device modules


@functools.cache
def module_file(name: str) -> Path | None:
    """The source file of module ``name`` found on the import path without importing anything (a package's
    __init__.py), or None when it is not a plain source module."""
    parts = name.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])  # a top-level name: found, not imported
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin)
    for part in parts[1:]:
        base = path.parent if path.name == "__init__.py" else None
        if base is None:
            return None
        if (base / part / "__init__.py").is_file():
            path = base / part / "__init__.py"
        elif (base / f"{part}.py").is_file():
            path = base / f"{part}.py"
        else:
            return None
    return path if path.suffix == ".py" else None


@functools.cache
def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


# NOTES: imports and exports are found with regular expressions over the text, not ast: parsing and walking every
# device module cost ~0.4 s per process on a loaded machine, more than a warm kernel load may take. Both can only
# over-approximate (an import in a docstring adds a module to the key), never miss one.
_FROM_IMPORT = re.compile(r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([^\n]*)", re.M)
_ALL = re.compile(r"^__all__[ \t]*\+?=[ \t]*(\[[^\]]*\]|\([^)]*\))", re.M)
_TOP_LEVEL_NAME = re.compile(r"^(?:def|class)[ \t]+(\w+)|^(\w+)[ \t]*(?::[^=\n]*)?=", re.M)


def _names(clause: str) -> list[tuple[str, str]]:
    """(name, bound as) of an import clause `a, b as c` / `(a,\n b)`; comments dropped."""
    clause = re.sub(r"#[^\n]*", "", clause).strip().strip("()")
    out = []
    for item in clause.replace("\n", " ").split(","):
        words = item.split()
        if words and words[0] != "*":
            out.append((words[0], words[2] if len(words) == 3 and words[1] == "as" else words[0]))
    return out


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """Absolute name of `from <level dots><target> import ...` written in ``module``."""
    if level == 0:
        return target or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


@functools.cache
def module_imports(module: str) -> dict[str, str]:
    """What the names bound by ``module``'s imports (anywhere in it, also inside functions) come from:
    {name: absolute module}. ``from .x import f`` gives f -> <pkg>.x; ``from . import x`` gives x -> <pkg>.x."""
    path = module_file(module)
    if path is None:
        return {}
    is_package = path.name == "__init__.py"
    top = module.split(".")[0]
    text = _text(path)
    out: dict[str, str] = {}
    for dots, target, clause in _FROM_IMPORT.findall(text):
        source = _resolve(module, is_package, len(dots), target or None)
        for name, bound in _names(clause):
            sub = f"{source}.{name}"
            # a name may be a submodule; only our own package's files are looked at
            is_module = source.split(".")[0] == top and module_file(sub) is not None
            out[bound] = sub if is_module else source
    for clause in _IMPORT.findall(text):
        for name, bound in _names(clause):
            out[bound if bound != name else name.split(".")[0]] = name
    return out


@functools.cache
def _bound_names(module: str) -> frozenset[str]:
    """Every name ``module`` binds (imports, top-level defs and assignments) or spells in a literal ``__all__``: a
    superset of what a template may call from it (jit.translate's device_exports, which imports the module)."""
    path = module_file(module)
    if path is None:
        return frozenset()
    text = _text(path)
    names = set(module_imports(module))
    names.update(a or b for a, b in _TOP_LEVEL_NAME.findall(text))
    for spelled in _ALL.findall(text):
        try:
            names.update(ast.literal_eval(spelled))
        except (ValueError, SyntaxError):
            pass
    return frozenset(names)


_JIT_PACKAGE = __name__.rsplit(".", 1)[0]  # deep_gemm.jit


def import_closure(modules: set[str], scope: str, with_jit: bool = False) -> set[str]:
    """``modules`` plus every module of package ``scope`` they import, transitively (source modules only). Without
    ``with_jit`` the JIT's own modules are left out: for a kernel's key they count through CODEGEN_SOURCES
    (numba_setup, enums, ...) or not at all (the cache, the launcher: a kernel's code does not depend on them)."""
    todo, seen = list(modules), set()
    while todo:
        module = todo.pop()
        if module in seen or module_file(module) is None:
            continue
        seen.add(module)
        for source in set(module_imports(module).values()):
            in_scope = source == scope or source.startswith(scope + ".")
            if in_scope and (with_jit or not (source == _JIT_PACKAGE or source.startswith(_JIT_PACKAGE + "."))):
                todo.append(source)
    return seen


def device_dependencies(device_module: str, rendered: str) -> dict[str, object]:
    """What a kernel rendered as ``rendered`` depends on in ``device_module``: the intrinsics its source names
    (identifiers of the source that the module binds; comments included, which can only add), where each comes
    from, and the source modules those live in plus every module of the same top-level package they import (the
    JIT's modules excepted: CODEGEN_SOURCES covers the ones that shape code).

    Returns {"intrinsics": {name: module}, "modules": [module, ...], "sha256": digest of those modules' bytes}. The
    device package's own __init__ is hashed only when an intrinsic is defined there (or a used module imports
    it): exporting one more intrinsic from it leaves every other kernel's key alone.
    """
    used = _bound_names(device_module).intersection(_IDENTIFIER.findall(rendered))
    imported = module_imports(device_module)
    intrinsics = {name: imported.get(name, device_module) for name in sorted(used)}
    scope = device_module.split(".")[0]
    modules = import_closure(set(intrinsics.values()), scope)
    files = [(m, module_file(m)) for m in modules]
    return {"intrinsics": intrinsics, "modules": sorted(modules),
            "sha256": _digest_files([(m, p) for m, p in files if p is not None])}


def clear_caches() -> None:
    """Forget every parsed file and digest (tests that edit sources in place)."""
    for fn in (codegen_sources_digest, module_file, _file_sha256, _text, module_imports, _bound_names):
        if hasattr(fn, "cache_clear"):  # (a test may have replaced one)
            fn.cache_clear()
