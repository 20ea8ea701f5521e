"""Every variant of the GEMM templates renders, parses with tree-sitter-cpp without an ERROR/MISSING node, and
translates (no numba compile here): dtype pairs x majors x output dtypes x accumulation x paths x compiled dims."""

from __future__ import annotations

import itertools

import pytest

from deep_gemm.heuristics.config import GemmConfig, GemmDesc
from deep_gemm.jit.render import render
from deep_gemm.jit.translate import find_error_node, parse, translate
from deep_gemm.kernels.common import gemm_constants

CONFIGS = {
    "cube": GemmConfig(block_m=64, block_n=64, block_k=128, mad_m=32, mad_n=32, mad_k=64, num_l1_stages=3,
                       sf_k_blocks=2, num_ai_cores=7),
    "stream": GemmConfig(block_m=16, block_n=32, block_k=256, mad_m=16, mad_n=32, mad_k=64, num_l1_stages=2,
                         num_ai_cores=7, path="stream"),
}
PAIRS = {"fp8_gemm": [("fp8", "fp8"), ("fp4", "fp4"), ("fp8", "fp4")], "bf16_gemm": [("bf16", "bf16")]}


def _variants():
    for template, pairs in PAIRS.items():
        for (a, b), ma, mb, out, acc, path, dims in itertools.product(
            pairs, ("k", "mn"), ("k", "mn"), ("bf16", "fp32"), (False, True), ("cube", "stream"), ("nk", "mn", "")
        ):
            yield template, a, b, ma, mb, out, acc, path, dims


def _constants(template, a, b, ma, mb, out, acc, path, dims, resident):
    desc = GemmDesc(m=40, n=96, k=320, a_dtype=a, b_dtype=b, out_dtype=out, major_a=ma, major_b=mb,
                    with_accumulation=acc, num_ai_cores=7)
    return gemm_constants(desc, CONFIGS[path], dims, resident)


def test_every_variant_parses():
    count = 0
    for variant in _variants():
        template, path, dims = variant[0], variant[7], variant[8]
        for resident in (False, True) if path == "stream" and "k" in dims else (False,):
            source = render(template, _constants(*variant, resident))
            root, _, _ = parse(source)
            bad = find_error_node(root)
            assert bad is None, f"{variant} resident={resident}: parse error at {bad.start_point} ({bad.type})"
            count += 1
    # (3 + 1 dtype pairs) x 4 majors x 2 outputs x 2 accumulations x 2 paths x 3 compiled dims, plus the
    # resident-A variant of each stream kernel with K compiled in
    assert count == 4 * 4 * 2 * 2 * 2 * 3 + 4 * 4 * 2 * 2


# One translation per template, dtype pair, path and resident-A choice (the other axes only change constants).
TRANSLATED = [(t, a, b, ma, mb, out, acc, path, dims, res)
              for t, pairs in PAIRS.items() for (a, b) in pairs
              for (ma, mb, out, acc, path, dims, res) in (("k", "mn", "bf16", False, "cube", "nk", False),
                                                          ("mn", "k", "fp32", True, "stream", "mn", False),
                                                          ("k", "k", "bf16", True, "stream", "nk", True))]


@pytest.mark.parametrize("template,a,b,ma,mb,out,acc,path,dims,resident", TRANSLATED)
def test_variant_translates(template, a, b, ma, mb, out, acc, path, dims, resident):
    constants = _constants(template, a, b, ma, mb, out, acc, path, dims, resident)
    translation = translate(render(template, constants), template=template, constants=constants)
    assert translation.entry == f"{template}_impl"
    # the copies decode each operand's own format (the B copy of the fp8 x fp4 kernel decodes FP4)
    for dtype in {a, b}:
        assert f"copy_gm_to_l1_{dtype}" in translation.device_names
    assert ("get_swizzled_block" in translation.device_names) == (path == "cube")


def test_static_asserts_refuse_bad_tiles():
    from deep_gemm.jit.errors import TranslateError

    desc = GemmDesc(m=40, n=96, k=320)
    bad = GemmConfig(block_m=48, block_n=64, block_k=96, mad_m=32, mad_n=32, mad_k=32, num_l1_stages=2,
                     num_ai_cores=7)
    constants = gemm_constants(desc, bad, "nk", False)
    with pytest.raises(TranslateError, match="static_assert failed"):
        translate(render("fp8_gemm", constants), template="fp8_gemm", constants=constants)


def _code_lines(path) -> list[str]:
    """The template's lines with comments, jinja comments and blank lines dropped, white space folded."""
    import re

    text = re.sub(r"\{#.*?#\}", "", path.read_text(), flags=re.S)
    lines = (" ".join(re.sub(r"//.*", "", line).split()) for line in text.splitlines())
    return [line for line in lines if line]


def test_gemm_templates_share_the_library_not_copies():
    from deep_gemm.jit.render import default_template_dir

    root = default_template_dir()
    fp8, bf16 = _code_lines(root / "fp8_gemm.asc.j2"), _code_lines(root / "bf16_gemm.asc.j2")
    for lines in (fp8, bf16):
        assert '{%- import "lib/gemm.asc.j2" as gemm with context %}' in lines
    windows = {tuple(fp8[i:i + 6]) for i in range(len(fp8) - 5)}
    shared = [bf16[i:i + 6] for i in range(len(bf16) - 5) if tuple(bf16[i:i + 6]) in windows]
    assert not shared, f"fp8_gemm and bf16_gemm repeat six code lines: {shared[0]}"


def test_library_hooks_replace_scheduler_and_epilogue(tmp_path):
    """A family template can pass its own scheduler step and epilogue to the library's tile loop (grouped GEMMs and
    vector epilogues do); the rest of the loop stays the library's."""
    import shutil

    from deep_gemm.jit.render import default_template_dir

    shutil.copytree(default_template_dir() / "lib", tmp_path / "lib")
    (tmp_path / "hooked.asc.j2").write_text(
        '{%- import "lib/gemm.asc.j2" as gemm with context %}\n'
        "{% macro my_schedule() %}blk[0] = my_m_block(t);{% endmacro %}\n"
        "{% macro my_epilogue() %}my_epilogue(l0c, slot_base);{% endmacro %}\n"
        "{{ gemm.tile_loop(scaled=false, scheduler=my_schedule, epilogue=my_epilogue) }}\n"
    )
    desc = GemmDesc(m=40, n=96, k=320, a_dtype="bf16", b_dtype="bf16")
    source = render("hooked", gemm_constants(desc, CONFIGS["cube"], "nk", False), tmp_path)
    assert "blk[0] = my_m_block(t);" in source and "my_epilogue(l0c, slot_base);" in source
    assert "get_swizzled_block" not in source and "Fixpipe(" not in source
    assert "mad_k_block(a_l1, no_sf, a_k0, b_l1, no_sf" in source  # the library's K loop
