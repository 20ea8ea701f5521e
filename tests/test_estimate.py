"""deep_gemm.estimate: the public chip-time estimate (fields, defaults from the runtime, errors, the CLI) and the
promise that it never imports numba."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import numpy as np
import pytest

import deep_gemm
from deep_gemm import runtime
from deep_gemm.estimate import GemmEstimate, estimate_gemm, main


def test_fields_and_units():
    est = estimate_gemm(4096, 7168, 16384, "fp8", "fp8", arch="950DT")
    assert isinstance(est, GemmEstimate) and deep_gemm.GemmEstimate is GemmEstimate
    assert est.flops == 2.0 * 4096 * 7168 * 16384
    assert est.tflops == pytest.approx(est.flops / est.time_us / 1e6)
    assert est.utilization == pytest.approx(est.tflops / est.peak_tflops)
    assert est.peak_tflops == pytest.approx(865.0752)
    assert est.bound == "cube" and est.config.block_m > 0
    assert est.time_us >= max(est.cube_us, est.l2_us, est.hbm_us)
    with pytest.raises(dataclasses.FrozenInstanceError):
        est.time_us = 1.0
    text = str(est)
    assert "modelled" in text and "950DT" in text and "bound: cube" in text and "TFLOPS" in text


def test_utilization_uses_the_pairs_cube_rate():
    fp8_fp4 = estimate_gemm(4096, 7168, 16384, "fp8", "fp4", arch="950DT")
    assert fp8_fp4.peak_tflops == pytest.approx(865.0752)  # fp8 x fp4 runs at the FP8 rate
    assert estimate_gemm(4096, 7168, 16384, "fp4", "fp4", arch="950DT").peak_tflops == pytest.approx(1730.1504)
    assert estimate_gemm(4096, 7168, 16384, "bf16", "bf16", arch="910B2").peak_tflops == pytest.approx(353.8944)


def test_defaults_come_from_the_runtime():
    with runtime.runtime_scope(arch="950PR", num_ai_cores=14):
        est = estimate_gemm(2048, 2048, 2048)
        assert (est.arch, est.num_ai_cores, est.config.num_ai_cores) == ("950PR", 14, 14)
        # Another arch than the runtime's: all of its cores.
        assert estimate_gemm(2048, 2048, 2048, arch="950DT").num_ai_cores == 32
    with runtime.runtime_scope(arch="950DT"):
        assert estimate_gemm(2048, 2048, 2048).num_ai_cores == runtime.get_num_ai_cores()
    assert estimate_gemm(2048, 2048, 2048, arch="ascend950dt", num_ai_cores=8).num_ai_cores == 8


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(m=0), ValueError, "m=0"),
        (dict(n=-3), ValueError, "n=-3"),
        (dict(k=1.5), TypeError, "k must be a positive integer, got float: k=1.5"),
        (dict(m=True), TypeError, "m must be a positive integer, got bool"),
        (dict(n="256"), TypeError, "n must be a positive integer, got str"),
        (dict(k=np.float64(256.0)), TypeError, "k must be a positive integer"),
        (dict(m=10**300), ValueError, r"m=1000.*\(301 characters\) exceeds 4294967295"),
        (dict(k=10**4000), ValueError, r"k=1000.*\(4001 characters\) exceeds 4294967295"),
        (dict(n=2**32), ValueError, "n=4294967296 exceeds 4294967295"),
        (dict(m=np.int64(-2)), ValueError, "m=-2 must be >= 1"),
        (dict(m=2**32 - 1, k=2**32 - 1), ValueError, "A of m=4294967295 .* more than a 64-bit address space"),
        (dict(num_groups=2**20, m=2**20, gemm_type="batched", k=2**24, n=16), ValueError, "A of .*64-bit"),
        (dict(a_dtype="fp16"), ValueError, "a_dtype='fp16'.*allowed"),
        (dict(b_dtype="int8"), ValueError, "b_dtype='int8'.*allowed"),
        (dict(a_dtype="fp4", b_dtype="fp8"), ValueError, "not a supported pair"),
        (dict(a_dtype="bf16", b_dtype="fp8"), ValueError, "not a supported pair"),
        (dict(gemm_type="grouped"), ValueError, "gemm_type='grouped'.*allowed"),
        (dict(num_groups=0, gemm_type="batched"), ValueError, "num_groups=0"),
        (dict(num_groups=2), ValueError, "num_groups=2 must be 1"),
        (dict(out_dtype="fp16"), ValueError, "out_dtype='fp16'"),
        (dict(arch="H100"), ValueError, "arch='H100'.*allowed"),
        (dict(arch="950PR", num_ai_cores=29), ValueError, r"num_ai_cores=29 must be in \[1, 28\]"),
        (dict(num_ai_cores=0), ValueError, "num_ai_cores=0"),
        (dict(arch="910B2"), ValueError, "a_dtype='fp8' is not supported on arch 910B2"),
        (dict(m=4, num_groups=8, gemm_type="m_grouped_masked"), ValueError, "m=4 must be >= num_groups=8"),
    ],
)
def test_bad_input(kwargs, error, match):
    args = dict(m=256, n=256, k=256)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        estimate_gemm(args.pop("m"), args.pop("n"), args.pop("k"), **args)


def test_cli_prints_the_estimate(capsys):
    assert main(["4096", "7168", "16384", "--dtype", "fp8", "--arch", "950DT"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == str(estimate_gemm(4096, 7168, 16384, "fp8", "fp8", arch="950DT"))
    assert main(["1024", "4096", "7168", "--dtype", "fp8", "--b-dtype", "fp4", "--arch", "950PR", "--cores", "8",
                 "--gemm-type", "m_grouped_masked", "--groups", "4"]) == 0
    out = capsys.readouterr().out
    assert "950PR (8 AI cores), m_grouped_masked x 4 groups" in out and "fp8xfp4" in out
    with pytest.raises(SystemExit):
        main(["16", "16", "16", "--dtype", "fp4", "--b-dtype", "fp8"])
    assert "not a supported pair" in capsys.readouterr().err


def test_module_runs_and_never_imports_numba():
    code = ("import sys, deep_gemm; e = deep_gemm.estimate_gemm(512, 512, 512); "
            "import deep_gemm.heuristics; assert 'numba' not in sys.modules, 'numba imported'; print(e.bound)")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    run = subprocess.run([sys.executable, "-m", "deep_gemm.estimate", "4096", "2112", "7168", "--dtype", "fp8",
                          "--arch", "950DT"], check=True, capture_output=True, text=True)
    assert "modelled" in run.stdout and "4096" in run.stdout


def test_numpy_integers_are_sizes():
    ref = estimate_gemm(256, 512, 1024, arch="950DT")
    est = estimate_gemm(np.int64(256), np.int32(512), np.uint16(1024), arch="950DT", num_ai_cores=np.int64(32))
    assert est == ref and type(est.m) is int
    assert estimate_gemm(128, 256, 512, gemm_type="batched", num_groups=np.int8(3)).num_groups == 3


@pytest.mark.parametrize(
    "argv,match",
    [
        (["256", "256", str(10**4000)], r"K='1000.*exceeds 4294967295"),
        (["256", "256", "1" + "0" * 5000], r"K='1000.*exceeds 4294967295"),  # beyond Python's int() digit limit
        (["256", "256", "1e3"], "K must be a decimal integer, got '1e3'"),
        (["-5", "256", "256"], "m=-5 must be >= 1"),
        (["256", "256", "4294967296"], "k=4294967296 exceeds"),
        (["256", "256", "256", "--cores", "x"], "--cores must be a decimal integer"),
        (["256", "256", "256", "--dtype", "fp16"], "invalid choice"),
        (["256", "256"], "required: k"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(argv, match):
    run = subprocess.run([sys.executable, "-m", "deep_gemm.estimate", *argv], capture_output=True, text=True)
    assert run.returncode == 2, run.stderr
    assert run.stdout == "" and "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m deep_gemm.estimate: error: "), run.stderr
    assert re.search(match, lines[0]), lines[0]


def test_grouped_layouts_per_call():
    # the actual layout: empty groups cost nothing, the rest are modelled at their mean size
    with_empty = estimate_gemm(4096, 4096, 7168, gemm_type="m_grouped_contiguous", group_sizes=[2048, 0, 0, 2048],
                               arch="950DT")
    two = estimate_gemm(4096, 4096, 7168, gemm_type="m_grouped_contiguous", num_groups=2, arch="950DT")
    assert with_empty.num_groups == 4 and with_empty.time_us == pytest.approx(two.time_us)
    assert with_empty.flops == 2.0 * 4096 * 4096 * 7168
    masked = estimate_gemm(24, 4096, 7168, gemm_type="m_grouped_masked", group_sizes=[8, 16, 0, 0], arch="950DT")
    assert masked.time_us == pytest.approx(estimate_gemm(24, 4096, 7168, gemm_type="m_grouped_masked",
                                                         num_groups=2, arch="950DT").time_us)
    k_grouped = estimate_gemm(256, 512, 1024, gemm_type="k_grouped_contiguous", ks=[512, 0, 512], arch="950DT")
    assert k_grouped.num_groups == 3 and k_grouped.flops == 2.0 * 256 * 512 * 1024
    with pytest.raises(ValueError, match=r"m=100 must be the sum of group_sizes=\[2048, 0\]"):
        estimate_gemm(100, 4096, 7168, gemm_type="m_grouped_contiguous", group_sizes=[2048, 0])
    with pytest.raises(ValueError, match=r"group_sizes\[1\]=-1 is negative"):
        estimate_gemm(1, 4096, 7168, gemm_type="m_grouped_masked", group_sizes=[2, -1])
    with pytest.raises(ValueError, match="ks is a layout of gemm_type"):
        estimate_gemm(1, 4096, 7168, ks=[7168])
    with pytest.raises(ValueError, match="num_groups=3 disagrees with len"):
        estimate_gemm(4, 4096, 7168, gemm_type="m_grouped_masked", group_sizes=[2, 2], num_groups=3)


def test_cli_grouped_kinds(capsys):
    assert main(["8192", "4096", "7168", "--gemm-type", "m_grouped_contiguous", "--group-sizes",
                 "4096,0,2048,2048"]) == 0
    out = capsys.readouterr().out
    assert "m_grouped_contiguous x 4 groups" in out and "modelled" in out
    assert main(["256", "512", "1024", "--gemm-type", "k_grouped_contiguous", "--ks", "512,512"]) == 0
    assert "k_grouped_contiguous x 2 groups" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["8", "4096", "7168", "--gemm-type", "m_grouped_masked", "--group-sizes", "4,x"])


def test_fp8_output_epilogue_is_priced():
    """FP8Quantization: the AIVs' vector work appears, D's HBM traffic shrinks to 1 byte (+ 1/32 scale byte) per
    element, and N must be a multiple of 64."""
    bf16 = deep_gemm.estimate_gemm(4096, 7168, 2048, "fp8", "fp8", out_dtype="bf16")
    fp8 = deep_gemm.estimate_gemm(4096, 7168, 2048, "fp8", "fp8", out_dtype="fp8")
    assert bf16.vector_us == 0 < fp8.vector_us
    assert fp8.hbm_us < bf16.hbm_us and fp8.fixpipe_us > 0
    assert fp8.config.mad_n % 64 == 0
    with pytest.raises(ValueError, match="N % 64"):
        deep_gemm.estimate_gemm(128, 96, 256, "fp8", "fp8", out_dtype="fp8")


def test_flash_mla_o_leaves_l0c_once_per_unit():
    """FlashMLA's Ascend kernel keeps O in L0C across the tiles that skip the rescale: per tile FixPipe moves only
    the fp32 scores P, and O once per unit (its end); the prefill is then bound by the Cube, not FixPipe."""
    from deep_gemm.heuristics.flash_mla import D_V, FIXPIPE_F32_PER_CYCLE, H_Q

    clock = deep_gemm.arch.get_arch("950DT").clock_hz
    est = deep_gemm.estimate_flash_mla_sparse_fwd(4096, 32768, 640, arch="950DT", num_ai_cores=32)
    per_unit = est.tiles_per_unit * H_Q * est.config.b_topk + H_Q * D_V
    assert est.fixpipe_us == pytest.approx(est.busiest_units * per_unit / FIXPIPE_F32_PER_CYCLE / clock * 1e6)
    assert est.bound == "cube"
    # one more tile per unit costs FixPipe only its scores
    short = deep_gemm.estimate_flash_mla_with_kvcache(64, 4, 128, 448, arch="950DT", num_ai_cores=32)
    long = deep_gemm.estimate_flash_mla_with_kvcache(64, 4, 128, 512, arch="950DT", num_ai_cores=32)
    assert long.tiles_per_unit == short.tiles_per_unit + 1
    tile_us = long.busiest_units * H_Q * long.config.b_topk / FIXPIPE_F32_PER_CYCLE / clock * 1e6
    assert long.fixpipe_us - short.fixpipe_us == pytest.approx(tile_us)
