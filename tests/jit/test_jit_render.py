"""render.py and macros.py: templates render strictly; qualifier macros are blanked without moving anything."""

from __future__ import annotations

import pytest
import tree_sitter_cpp
from tree_sitter import Language, Parser

from deep_gemm.jit.errors import JITError, RenderError
from deep_gemm.jit.macros import MACROS, expand_macros
from deep_gemm.jit.render import default_template_dir, render
from deep_gemm.jit.translate import find_error_node, parse

EXAMPLES = sorted(p.name.removesuffix(".asc.j2") for p in (default_template_dir() / "examples").glob("*.asc.j2"))
EXAMPLE_CONSTANTS = {"NUM_AI_CORES": 4, "TILE": 16, "SCALE": 1.5, "ROWS": 5, "COLS": 7, "USE_BIAS": False}


def test_examples_exist():
    assert {"vadd", "loops", "helpers"} <= set(EXAMPLES)


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_renders_and_parses_cleanly(name):
    source = render(f"examples/{name}", EXAMPLE_CONSTANTS)
    root, _, _ = parse(source)
    assert find_error_node(root) is None
    assert not root.has_error


def test_undefined_variable_is_named_with_template_and_line(tmp_path):
    (tmp_path / "t.asc.j2").write_text("constexpr int32_t A = {{ A }};\nconstexpr int32_t B = {{ BLOCK_Q }};\n")
    with pytest.raises(RenderError) as info:
        render("t", {"A": 1}, tmp_path)
    message = str(info.value)
    assert "BLOCK_Q" in message and "t.asc.j2:2" in message
    assert isinstance(info.value, JITError) and info.value.phase == "render"


def test_missing_template_lists_available(tmp_path):
    (tmp_path / "there.asc.j2").write_text("x")
    with pytest.raises(RenderError, match="there.asc.j2"):
        render("not_there", {}, tmp_path)


def test_values_render_as_cpp(tmp_path):
    (tmp_path / "v.asc.j2").write_text("{{ T }} {{ F }} {{ X }} {{ I }}")
    assert render("v", {"T": True, "F": False, "X": 0.1, "I": 7}, tmp_path) == "true false 0.1 7"


def test_none_and_bad_constants_are_refused(tmp_path):
    (tmp_path / "v.asc.j2").write_text("a\n{{ X }}\n")
    with pytest.raises(RenderError, match="v.asc.j2:2.*None"):
        render("v", {"X": None}, tmp_path)
    with pytest.raises(TypeError, match="X"):
        render("v", {"X": object()}, tmp_path)
    with pytest.raises(TypeError, match="not an identifier|identifiers"):
        render("v", {"bad-name": 1}, tmp_path)


def test_jinja_blocks_keep_line_numbers_when_taken(tmp_path):
    (tmp_path / "b.asc.j2").write_text("a\n{% if X %}\nb\n{% endif %}\nc\n")
    assert render("b", {"X": True}, tmp_path).splitlines() == ["a", "", "b", "", "c"]


def test_macro_table_keeps_every_position():
    source = ('extern "C" __global__ __aicore__ void k(__gm__ half* p, GM_ADDR q) {\n'
              "    auto r = (__gm__ float*)p; // __gm__ stays in comments\n}\n")
    expanded = expand_macros(source)
    assert len(expanded) == len(source)
    assert [len(line) for line in expanded.splitlines()] == [len(line) for line in source.splitlines()]
    assert "__global__" not in expanded and "__aicore__" not in expanded
    assert "// __gm__ stays in comments" in expanded
    assert expanded.index("void k(") == source.index("void k(")
    assert "GM_ADDR q" in expanded  # a type the translator knows
    assert "__mix__(...)" in MACROS


def test_raw_qualifiers_are_errors_for_tree_sitter_but_not_after_expansion():
    source = 'extern "C" __global__ __aicore__ void k(__gm__ half* p) { }\n'
    parser = Parser(Language(tree_sitter_cpp.language()))
    assert parser.parse(source.encode()).root_node.has_error
    root, _, hits = parse(source)
    assert not root.has_error
    assert hits == [(source.index("__global__"), "__global__")]
