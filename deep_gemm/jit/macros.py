"""Ascend C qualifier macros, expanded the way the real toolchain's preprocessor would, before tree-sitter parses.

``__global__``, ``__aicore__``, ``__gm__`` ... are macros (compiler attributes) in Ascend C, not C++ syntax:
tree-sitter-cpp makes ERROR nodes of ``__global__ __aicore__ void f()`` or ``(__gm__ half*)p``. Each entry of
``MACROS`` below is replaced by spaces of the same length, so every line and column of the rendered source (and
so every error position) is unchanged. Nothing else is preprocessed (no #define, no #if): the templates use jinja.
"""

from __future__ import annotations

import re

# name -> why it can be blanked (all are attributes that do not change the meaning on the CPU stand-in)
MACROS: dict[str, str] = {
    "__global__": "kernel entry attribute; the translator finds the entry through `extern \"C\"`/the table",
    "__aicore__": "runs-on-AI-core attribute of every device function",
    "__gm__": "address-space qualifier: global memory (GM); GM pointers become numpy arrays",
    "__ubuf__": "address-space qualifier: Unified Buffer",
    "__cbuf__": "address-space qualifier: L1",
    "__ca__": "address-space qualifier: L0A",
    "__cb__": "address-space qualifier: L0B",
    "__cc__": "address-space qualifier: L0C",
    "__fbuf__": "address-space qualifier: FixPipe buffer",
    "__inline__": "inline hint",
    "__restrict__": "no-alias hint",
    "__mix__(...)": "mix-kernel attribute with its (aic, aiv) arguments on one line",
}

# Mixed-kernel branch macros: `if ASCEND_IS_AIC { ... }` is C++ only after expansion (to a parenthesized test), so
# each becomes a parenthesized identifier of the same length that the translator reads (translate/mixed.py).
REWRITES: dict[str, str] = {"ASCEND_IS_AIC": "(ASCENDISAIC)", "ASCEND_IS_AIV": "(ASCENDISAIV)"}

# Identifier types the translator understands directly (kept as they are, see translate/ctype.py):
#   GM_ADDR  -> a GM byte pointer (`__gm__ uint8_t*`): the parameter is a numpy array.
KNOWN_TYPE_MACROS: dict[str, str] = {"GM_ADDR": "uint8"}

_WORDS = [m for m in MACROS if not m.endswith("(...)")] + list(REWRITES)
_FUNCS = [m[: -len("(...)")] for m in MACROS if m.endswith("(...)")]
# Comments and string literals come first in the alternation so that, as in the real preprocessor, macros
# inside them are left alone.
_PATTERN = re.compile(
    r"(?P<keep>//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\")"
    r"|\b(?:" + "|".join(map(re.escape, _WORDS)) + r")\b"
    + "".join(r"|\b" + re.escape(f) + r"\s*\([^()\n]*\)" for f in _FUNCS),
    re.DOTALL,
)


def _blank(match: re.Match) -> str:
    if match.group("keep") is not None:
        return match.group(0)
    return REWRITES.get(match.group(0), " " * len(match.group(0)))


def expand_macros(source: str) -> str:
    """Blank every qualifier macro of ``MACROS`` (outside comments and strings) with spaces of equal length, so
    every line and column is preserved."""
    return _PATTERN.sub(_blank, source)


def macro_positions(source: str, name: str) -> list[int]:
    """str offsets of macro ``name`` outside comments and strings (the translator asks where `__global__` was)."""
    return [m.start() for m in _PATTERN.finditer(source) if m.group("keep") is None and m.group(0) == name]
