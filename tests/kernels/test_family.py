"""The kernel layer (deep_gemm/kernels/family.py): every kernel family in the repo goes desc -> config -> template
constants -> build -> launch through a KernelFamily, and its launch binds arguments by name to the parameters its
template declares. Binding errors need no numba compile (they are raised before the kernel runs)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from deep_gemm import runtime
from deep_gemm.heuristics.config import GemmConfig
from deep_gemm.jit import ArgumentError
from deep_gemm.jit.render import default_template_dir
from deep_gemm.kernels.bf16_gemm import BF16_GEMM
from deep_gemm.kernels.common import prepare_gemm
from deep_gemm.kernels.family import FAMILIES, KernelFamily
from deep_gemm.kernels.flash_mla import FLASH_MLA_DECODE, FLASH_MLA_PREFILL  # noqa: F401 (registers the families)
from deep_gemm.kernels.fp8_gemm import FP8_GEMM
from deep_gemm.kernels.hc_prenorm import TF32_HC_PRENORM_GEMM
from deep_gemm.kernels.mega_moe import MEGA_MOE  # noqa: F401 (registers the family)
from deep_gemm.kernels.mqa_logits import MQA_LOGITS, PAGED_MQA_LOGITS
from deep_gemm.kernels.topk import TOPK  # noqa: F401 (registers the family)

CONFIG = GemmConfig(block_m=64, block_n=64, block_k=128, mad_m=32, mad_n=32, mad_k=64, num_l1_stages=2,
                    num_ai_cores=7)
FP8_PARAMS = ("gm_a", "stride_a", "gm_sfa", "stride_sfa", "gm_b", "stride_b", "gm_sfb", "stride_sfb", "gm_d",
              "stride_d", "shape_m", "shape_n", "shape_k", "alpha")


def test_every_kernel_template_has_a_family():
    templates = {p.name.removesuffix(".asc.j2") for p in default_template_dir().glob("*.asc.j2")}
    assert templates <= set(FAMILIES), f"templates without a KernelFamily: {templates - set(FAMILIES)}"
    assert FAMILIES["fp8_gemm"] is FP8_GEMM and FAMILIES["bf16_gemm"] is BF16_GEMM
    assert FAMILIES["mqa_logits"] is MQA_LOGITS and FAMILIES["paged_mqa_logits"] is PAGED_MQA_LOGITS
    assert FAMILIES["tf32_hc_prenorm_gemm"] is TF32_HC_PRENORM_GEMM


def _fp8_prepared():
    with runtime.runtime_scope(num_ai_cores=7):
        return prepare_gemm(FP8_GEMM, 40, 96, 320, "fp8", "fp8", "bf16", "k", "k", False, "nk", CONFIG)


def _fp8_args(**override) -> dict:
    u8, i16 = np.zeros(40 * 320, np.uint8), np.zeros(5 * 96, np.int16)
    args = dict(gm_a=u8, stride_a=320, gm_sfa=i16, stride_sfa=40, gm_b=u8, stride_b=320, gm_sfb=i16, stride_sfb=96,
                gm_d=np.full(40 * 96, 0x1234, np.uint16), stride_d=96, shape_m=40, shape_n=96, shape_k=320, alpha=1.0)
    args.update(override)
    return args


def test_gemm_entry_parameters_come_from_the_template():
    prepared = _fp8_prepared()
    assert prepared.kernel.params == FP8_PARAMS
    assert prepared.kernel.meta["params"][0] == {"name": "gm_a", "c_type": "uint8_t*", "kind": "pointer",
                                                 "dtype": "uint8", "ndim": 1}
    # D's pointer type follows the output dtype (the template's `{{ "uint16_t" if ... }}`)
    assert prepared.kernel.signature.params[8].dtype == "uint16"
    with runtime.runtime_scope(num_ai_cores=7):
        fp32_out = prepare_gemm(FP8_GEMM, 40, 96, 320, "fp8", "fp8", "fp32", "k", "k", False, "nk", CONFIG)
    assert fp32_out.kernel.signature.params[8].dtype == "float32"


@pytest.mark.parametrize("override, match", [
    ({"gm_d": np.zeros(40 * 96, np.float32)}, r"fp8_gemm_impl\(\) argument 'gm_d' \(`uint16_t\* gm_d`\) must be a "
                                              r"1-D uint16 numpy array, got a float32 array"),
    ({"gm_sfa": np.zeros((5, 40), np.int16)}, r"argument 'gm_sfa' .* 2 dimensions, not 1"),
    ({"stride_a": 320.0}, r"argument 'stride_a' \(`int64_t stride_a`\) must be an integer"),
    ({"shape_m": -1}, r"argument 'shape_m' .* outside uint32's range"),
    ({"alpha": None}, r"argument 'alpha' \(`float alpha`\) must be a real number"),
    ({"gm_c": np.zeros(1, np.uint16)}, r"fp8_gemm_impl\(\) has no parameter 'gm_c'"),
])
def test_gemm_launch_refuses_bad_arguments_and_writes_nothing(override, match):
    prepared = _fp8_prepared()
    args = _fp8_args(**override)
    d = args["gm_d"].copy()
    with pytest.raises(ArgumentError, match=match) as info:
        prepared.launch(**args)
    assert info.value.kernel == "fp8_gemm" and info.value.phase == "launch"
    np.testing.assert_array_equal(args["gm_d"], d)
    with runtime.dry_run(), pytest.raises(ArgumentError, match=match):  # the dry-run compile binds alike
        prepared.launch(**args)


def test_gemm_launch_names_a_missing_argument():
    args = _fp8_args()
    del args["stride_sfb"]
    with pytest.raises(ArgumentError, match=r"missing argument 'stride_sfb'"):
        _fp8_prepared().launch(**args)


def test_prepare_is_memoized_per_problem():
    first, again = _fp8_prepared(), _fp8_prepared()
    assert first is again and first.family is FP8_GEMM and first.config == CONFIG
    assert first.constants["BLOCK_M"] == 64 and first.constants["NUM_AI_CORES"] == 7


# A family that is not a GEMM: the JIT's example vector add, with its own desc, config choice and constants.
@dataclasses.dataclass(frozen=True)
class VaddDesc:
    n: int


def _vadd_constants(desc: VaddDesc, tile: int, arch, *, scale: float) -> dict:
    return {"NUM_AI_CORES": 3, "TILE": tile, "SCALE": scale}


VADD = KernelFamily("vadd_example", template="examples/vadd", device_module="deep_gemm.jit.example_device",
                    select_config=lambda desc, arch: 8 if desc.n <= 64 else 16, template_constants=_vadd_constants)


def test_a_non_gemm_family_goes_through_the_same_path(rng):
    arch = runtime.get_arch_spec()
    prepared = VADD.prepare(VaddDesc(40), arch=arch, options={"scale": 2.0})
    assert prepared.config == 8 and prepared.kernel.params == ("unused", "x", "y", "z", "n")
    x, y = rng.standard_normal(40).astype(np.float32), rng.standard_normal(40).astype(np.float32)
    z = np.zeros(40, np.float32)
    prepared.launch(unused=np.zeros(1, np.uint8), x=x, y=y, z=z, n=40)
    np.testing.assert_array_equal(z, (x + y) * np.float32(2.0))
    with pytest.raises(ArgumentError, match=r"vadd\(\) argument 'n'"):
        prepared.launch(unused=np.zeros(1, np.uint8), x=x, y=y, z=z, n="40")
