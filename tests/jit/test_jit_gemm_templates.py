"""The GEMM templates (templates/*.asc.j2, written by the kernels engineer) stay inside the translator's subset:
each renders, parses without ERROR nodes and translates for a spread of problems. No numba compile here (the
kernels' own tests run them); this catches a template/translator mismatch in milliseconds."""

from __future__ import annotations

import pytest

from deep_gemm.jit.render import default_template_dir, render
from deep_gemm.jit.translate import translate

common = pytest.importorskip("deep_gemm.kernels.common")
heuristics = pytest.importorskip("deep_gemm.heuristics")

PROBLEMS = [  # (template, desc overrides, compiled_dims)
    ("fp8_gemm", dict(m=256, n=1024, k=512), "nk"),
    ("fp8_gemm", dict(m=16, n=4096, k=1024), "nk"),  # small M: the stream path
    ("fp8_gemm", dict(m=300, n=700, k=320, a_dtype="fp4", b_dtype="fp4", major_a="mn", major_b="mn"), "mn"),
    ("fp8_gemm", dict(m=128, n=256, k=256, b_dtype="fp4", out_dtype="fp32", with_accumulation=True), ""),
    ("bf16_gemm", dict(m=512, n=512, k=256, a_dtype="bf16", b_dtype="bf16"), "nk"),
    ("bf16_gemm", dict(m=8, n=2048, k=512, a_dtype="bf16", b_dtype="bf16", major_b="mn"), "mnk"),
]


@pytest.mark.parametrize("template, overrides, compiled_dims", PROBLEMS)
def test_gemm_template_translates(template, overrides, compiled_dims):
    if not (default_template_dir() / f"{template}.asc.j2").is_file():
        pytest.skip(f"{template}.asc.j2 not written yet")
    from deep_gemm.arch import get_arch
    from deep_gemm.device.capacity import keeps_a_resident
    from deep_gemm.heuristics.config import GemmDesc

    arch = get_arch("950DT")
    desc = GemmDesc(**{"num_ai_cores": arch.num_ai_cores, **overrides}) if hasattr(arch, "num_ai_cores") \
        else GemmDesc(**overrides)
    config = heuristics.get_best_config(desc, arch)
    resident_a = keeps_a_resident(desc, config, arch, k_is_compiled="k" in compiled_dims)
    constants = common.gemm_constants(desc, config, compiled_dims, resident_a)
    source = render(template, constants)
    translation = translate(source, template=template, constants=constants)
    assert translation.entry and f"def {translation.entry}(" in translation.python
    assert "_dg_cancel, _dg_cores):" in translation.python  # the threads launcher's entry ABI
    compile(translation.python, f"{template}.py", "exec")  # valid Python
