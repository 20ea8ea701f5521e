"""The sweep's shape set (bench/shapes.py): count, distinctness, composition, the quick subset's coverage and cost,
shape files, and the FLOP/byte arithmetic."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import shapes  # noqa: E402

GRID = (256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
DEEPSEEK_NK = {(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048),
               (576, 7168), (6144, 7168), (7168, 3072), (36864, 7168), (7168, 18432)}
DEEPSEEK_M = {128, 512, 1024, 4096, 16384}


def test_full_set_count_distinct_composition():
    everything = shapes.all_shapes()
    assert len(everything) == 1055 == shapes.NUM_SHAPES
    assert len(set(everything)) == 1055
    grid = set(itertools.product(GRID, GRID, GRID))
    deepseek = {(m, n, k) for n, k in DEEPSEEK_NK for m in DEEPSEEK_M}
    assert len(deepseek) == 55
    assert set(everything) == grid | deepseek
    assert not grid & deepseek
    assert set(shapes.grid_shapes()) == grid and set(shapes.deepseek_shapes()) == deepseek
    assert everything[:3] == [(256, 256, 256), (256, 256, 512), (256, 256, 1024)]


def test_compute_bound_count_matches_reference():
    # ascend_hardware.md part B counts 743 shapes with BF16 I >= 270 FLOP/B, I = MNK / (MK + KN + MN).
    assert sum(shapes.arithmetic_intensity(*s, "bf16") >= 270 for s in shapes.all_shapes()) == 743
    grid = sum(shapes.arithmetic_intensity(*s, "bf16") >= 270 for s in shapes.grid_shapes())
    assert grid == 701


def test_quick_subset_covers_every_regime_within_budget():
    quick = shapes.quick_shapes()
    assert len(quick) == len(set(quick)) >= 10
    assert set(quick) <= set(shapes.all_shapes())
    ms = [m for m, _, _ in quick]
    assert min(ms) <= 256 and max(ms) >= 4096
    deepseek = set(shapes.deepseek_shapes())
    assert any(s in deepseek for s in quick) and any(s not in deepseek for s in quick)
    assert any(s[0] == 128 and s in deepseek for s in quick)
    # 950DT ridges (Cube peak / HBM, the arch spec's figures): BF16 ~124 and FP8 ~247 FLOP/B.
    from deep_gemm.arch import get_arch

    arch = get_arch("950DT")
    for dtype in ("bf16", "fp8"):
        ridge = arch.peak_flops(dtype) / arch.hbm_bytes_per_s
        intens = [shapes.arithmetic_intensity(*s, dtype) for s in quick]
        assert sum(i < ridge for i in intens) >= 3, dtype
        assert sum(i > ridge for i in intens) >= 5, dtype
    # The documented budget that keeps `--mode both --quick` within 10 minutes on 2 cores.
    assert sum(shapes.gemm_flops(*s) for s in quick) <= 0.25e12


def test_flops_bytes_intensity():
    assert shapes.gemm_flops(2, 3, 4) == 48
    # bf16: 2 B per A/B element, 2 B per D element; square n gives I = n / 3.
    assert shapes.gemm_bytes(256, 256, 256, "bf16") == 2 * 3 * 256 * 256
    assert shapes.arithmetic_intensity(3072, 3072, 3072, "bf16") == pytest.approx(1024)
    # fp8: 1 B per element plus one scale byte per 32 K elements per row (K=40 -> 2 blocks), D in bf16.
    assert shapes.gemm_bytes(16, 8, 40, "fp8") == (16 + 8) * 40 + (16 + 8) * 2 + 2 * 16 * 8
    with pytest.raises(ValueError, match="dtype"):
        shapes.gemm_bytes(1, 1, 1, "fp16")


def test_load_shapes_whitespace_and_csv(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("# comment\n32 32 64\n\n64\t48  96\n32,32,64\n")
    assert shapes.load_shapes(plain) == [(32, 32, 64), (64, 48, 96)]
    table = tmp_path / "table.csv"
    table.write_text("name,M,N,K\nfirst,128,2112,7168\nsecond,16,16,40\n")
    assert shapes.load_shapes(table) == [(128, 2112, 7168), (16, 16, 40)]


@pytest.mark.parametrize("text, match", [
    ("32 32\n", r":1: expected 3 integers"),
    ("32 32 64\n32 x 64\n", r":2: not integers"),
    ("0 32 64\n", r"dims must be >= 1"),
    ("a,b,c\n1,2,3\n", r"lacks m, n, k"),
    ("# only a comment\n", r"no shapes"),
])
def test_load_shapes_errors_name_file_and_line(tmp_path, text, match):
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        shapes.load_shapes(path)
