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
EXAMPLE_CONSTANTS = {"NUM_AI_CORES": 4, "TILE": 16, "SCALE": 1.5, "ROWS": 5, "COLS": 7, "USE_BIAS": False,
                     "WIDTH": 3}


def _mixed_constants() -> dict:
    """The mixed examples are BF16 GEMMs: the GEMM library's constants plus the UB hand-off's."""
    from deep_gemm.heuristics.config import GemmConfig, GemmDesc
    from deep_gemm.kernels.common import gemm_constants

    desc = GemmDesc(m=64, n=64, k=64, a_dtype="bf16", b_dtype="bf16", out_dtype="fp32", num_ai_cores=4)
    config = GemmConfig(64, 64, 64, 32, 32, 32, num_l1_stages=2, num_ai_cores=4)
    return {**gemm_constants(desc, config, "nk", resident_a=False), "NUM_UB_STAGES": 2, "UB_BYTES": 253952}


def test_examples_exist():
    assert {"vadd", "loops", "helpers"} <= set(EXAMPLES)


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_renders_and_parses_cleanly(name):
    constants = _mixed_constants() if name.startswith("mixed_") else EXAMPLE_CONSTANTS
    source = render(f"examples/{name}", constants)
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


LINE_TEMPLATE = """\
{#- a comment block
    over two lines -#}
{%- set X = 3 %}
{%- import "lib.asc.j2" as lib %}
// kernel
constexpr int32_t A = {{ X }};
{#- a one-line comment #}
__aicore__ inline int32_t f(int32_t a) {
    {%- if X > 1 %}
    int32_t b = a * A;
    {%- endif %}
    return b;
}
{{ lib.helper() }}
extern "C" __global__ __aicore__ void k() {}
"""
LINE_LIBRARY = """\
{% macro helper() -%}
__aicore__ inline int32_t g(int32_t a) {
    {%- for i in range(2) %}
    a = a + {{ i }};
    {%- endfor %}
    return a;
}
{%- endmacro %}
"""


def test_rendered_lines_map_to_template_lines_after_whitespace_control(tmp_path):
    from deep_gemm.jit.render import render_lines

    (tmp_path / "lines.asc.j2").write_text(LINE_TEMPLATE)
    (tmp_path / "lib.asc.j2").write_text(LINE_LIBRARY)
    text, line_map = render_lines("lines", {}, tmp_path)
    assert text == render("lines", {}, tmp_path)  # the marks leave the text as jinja renders it
    assert "\x1f" not in text and len(line_map.lines) == len(text.split("\n"))
    template_lines, library_lines = LINE_TEMPLATE.split("\n"), LINE_LIBRARY.split("\n")
    checked = 0
    for rendered, (file, line) in zip(text.split("\n"), line_map.lines, strict=True):
        if not rendered.strip():
            continue
        source = (template_lines if file == "lines.asc.j2" else library_lines)[line - 1]
        # every rendered line is the template line it names, with jinja expressions filled in
        assert rendered.strip().split(" ")[0] in source, (rendered, file, line, source)
        checked += 1
    assert checked == 12
    # the whitespace control shifted the rendered lines: without the map `# L<n>` would drift
    kernel_line = text.split("\n").index("// kernel") + 1
    assert kernel_line != 5 and line_map.tag(kernel_line) == "L5"


def test_kernel_py_line_tags_are_template_lines(tmp_path):
    from deep_gemm.jit.render import render_lines
    from deep_gemm.jit.translate import translate

    (tmp_path / "lines.asc.j2").write_text(LINE_TEMPLATE)
    (tmp_path / "lib.asc.j2").write_text(LINE_LIBRARY)
    text, line_map = render_lines("lines", {}, tmp_path)
    py = translate(text, template="lines", constants={"NUM_AI_CORES": 2}, device_module="deep_gemm.jit.example_device",
                   line_map=line_map).python
    tagged = {line.split("  # ")[0].strip(): line.split("  # ")[1] for line in py.splitlines() if "  # " in line}
    assert tagged["A = 3"] == "L6" and tagged["def f(a):"] == "L8" and tagged["b = a * A"] == "L10"
    assert tagged["return b"] == "L12"
    assert tagged["def g(a):"] == "lib.asc.j2:L2" and tagged["a = a + 0"] == "lib.asc.j2:L4"
    assert tagged["a = a + 1"] == "lib.asc.j2:L4" and tagged["return a"] == "lib.asc.j2:L6"
    # without a line map the tags are lines of the rendered source (which here differ)
    plain = translate(text, template="lines", constants={"NUM_AI_CORES": 2},
                      device_module="deep_gemm.jit.example_device").python
    assert "b = a * A  # L10" not in plain
    # a translate error names the template line as well as the rendered one
    bad = text.replace("return b;", "return q;")
    with pytest.raises(JITError, match=r"undeclared identifier 'q' \[template lines.asc.j2:12\]"):
        translate(bad, template="lines", constants={"NUM_AI_CORES": 2},
                  device_module="deep_gemm.jit.example_device", line_map=line_map)
