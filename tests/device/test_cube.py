"""The Cube stand-in (deep_gemm.device.cube) against numpy: L1 -> L0 loads with UE8M0 scales, Mmad (init and
accumulate, every row-tile size, partial panels, strided L0C), and the micro-kernel's machine code (full-width FMAs,
no spills in the K loop); the same for the bf16 L0 paths where the host has them: AMX (uint16 L0, TDPBF16PS in the
loop) and AVX512-BF16 (int16 L0, the same layouts, VDPBF16PS register blocks; bit-exact against an emulation of the
instruction's pair order)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from deep_gemm.device import cube
from deep_gemm.jit.numba_setup import vector_width_bits

SCALE_EXPONENTS = (0, 1, 127, 200, 254)


def _ref_scaled(l1, sf, row0, k0, rows, mad_k, with_sf=True):
    """fp64 reference of the (scaled) L1 slice: value * 2^(e-127) per 32-K block."""
    block = l1[row0 : row0 + rows, k0 : k0 + mad_k].astype(np.float64)
    if not with_sf:
        return block
    e = sf[row0 : row0 + rows, (k0 + np.arange(mad_k)) // 32].astype(np.int64)
    return block * np.ldexp(1.0, e - 127)


def _cube_product(l1a, sfa, l1b, sfb, row0_a, row0_b, k0, mad_m, mad_n, mad_k, with_sf, l0c, init):
    # NaN-filled L0 buffers: a slot the loads forget to write would poison the product.
    l0a = np.full(cube.l0a_size(mad_m, mad_k), np.nan, dtype=np.float32)
    l0b = np.full(cube.l0b_size(mad_n, mad_k), np.nan, dtype=np.float32)
    cube.load_l0a(l0a, l1a, sfa, row0_a, k0, mad_m, mad_k, with_sf)
    cube.load_l0b(l0b, l1b, sfb, row0_b, k0, mad_n, mad_k, with_sf)
    cube.mmad(l0c, l0a, l0b, mad_m, mad_n, mad_k, init)


def _tol(a, b):
    """Loose fp32 accumulation bound for |A| @ |B|^T (elementwise), for assert_allclose's atol."""
    return float(np.max(np.abs(a) @ np.abs(b).T)) * 4e-6 + 1e-30


def test_ue8m0_table_is_exact():
    e = np.arange(255)
    np.testing.assert_array_equal(cube.UE8M0_SCALES[:255].astype(np.float64), np.ldexp(1.0, e - 127))
    assert cube.UE8M0_SCALES[0] == np.float32(2.0**-127) and cube.UE8M0_SCALES[0] > 0  # subnormal, not flushed
    assert np.isnan(cube.UE8M0_SCALES[255])


@pytest.mark.parametrize("exponent", SCALE_EXPONENTS)
def test_load_scale_is_exact(rng, exponent):
    # B = identity (mad_n = mad_k = 64) makes the Cube return the scaled A values themselves (adding exact zeros),
    # and A = identity returns the scaled B values (through the transposing L0B pack).
    mad_m, mad_k = 48, 64
    l1 = rng.uniform(-1.9, 1.9, size=(mad_m + 5, 128)).astype(np.float32)
    sf = np.full((mad_m + 5, 4), exponent, dtype=np.uint8)
    sf[:, :2] = 3  # blocks and rows outside the window read differ, to catch a wrong row or k // 32
    sf[:5] = 3
    eye = np.zeros((64, 128), dtype=np.float32)
    eye[:, 64:] = np.eye(64, dtype=np.float32)
    sf_one = np.full((64, 4), 127, dtype=np.uint8)
    expected = _ref_scaled(l1, sf, 5, 64, mad_m, mad_k).astype(np.float32)
    assert np.all(expected != 0)  # even 2^-127 * x stays representable (subnormal)

    l0c = np.zeros((mad_m, 64), dtype=np.float32)
    _cube_product(l1, sf, eye, sf_one, 5, 0, 64, mad_m, 64, mad_k, True, l0c, True)
    np.testing.assert_array_equal(l0c, expected)

    l0c = np.zeros((64, mad_m), dtype=np.float32)
    _cube_product(eye, sf_one, l1, sf, 0, 5, 64, 64, mad_m, mad_k, True, l0c, True)
    np.testing.assert_array_equal(l0c, expected.T)


@pytest.mark.parametrize(
    "mad_m, mad_n, mad_k, with_sf",
    [(16, 16, 64, True), (48, 80, 128, True), (112, 144, 192, True), (128, 256, 64, True), (16, 32, 512, True),
     (16, 32, 16, False), (32, 48, 32, False), (80, 16, 48, False), (128, 256, 64, False), (64, 64, 320, False)],
)
def test_mmad_init_then_accumulate(rng, mad_m, mad_n, mad_k, with_sf):
    block_k = mad_k * 2
    extra = 3  # row0 offsets inside the L1 block
    l1a = rng.standard_normal((mad_m + extra, block_k)).astype(np.float32)
    l1b = rng.standard_normal((mad_n + extra, block_k)).astype(np.float32)
    sfa = rng.choice(np.array([120, 126, 127, 128, 131], dtype=np.uint8), size=(mad_m + extra, block_k // 32))
    sfb = rng.choice(np.array([122, 127, 129, 133], dtype=np.uint8), size=(mad_n + extra, block_k // 32))
    # L0C wider than the tile and full of NaN: init must overwrite without reading, and only [:mad_m, :mad_n] may be
    # touched.
    l0c = np.full((mad_m + 2, mad_n + 8), np.nan, dtype=np.float32)
    l0c[mad_m:] = 7.0
    l0c[:, mad_n:] = 7.0
    sentinel = l0c.copy()

    expected = np.zeros((mad_m, mad_n))
    for step, k0 in enumerate((0, mad_k)):
        _cube_product(l1a, sfa, l1b, sfb, extra, 1, k0, mad_m, mad_n, mad_k, with_sf, l0c, step == 0)
        a = _ref_scaled(l1a, sfa, extra, k0, mad_m, mad_k, with_sf)
        b = _ref_scaled(l1b, sfb, 1, k0, mad_n, mad_k, with_sf)
        expected += a @ b.T
        np.testing.assert_allclose(l0c[:mad_m, :mad_n], expected, rtol=0, atol=_tol(a, b) * (step + 1))

    np.testing.assert_array_equal(l0c[mad_m:], sentinel[mad_m:])
    np.testing.assert_array_equal(l0c[:, mad_n:], sentinel[:, mad_n:])


@pytest.mark.parametrize("mad_m", list(range(1, 2 * cube.MR + 2)) + [64, 128])
def test_mmad_every_row_tiling(rng, mad_m):
    # Every mad_m from 1 up exercises each micro-kernel height (1..MR) and the balanced remainder split.
    mad_n, mad_k = 32, 40
    a = rng.standard_normal((mad_m, mad_k)).astype(np.float32)
    b = rng.standard_normal((mad_n, mad_k)).astype(np.float32)
    start = rng.standard_normal((mad_m, mad_n)).astype(np.float32)
    l0c = start.copy()
    sf = np.zeros((1, 1), dtype=np.uint8)
    _cube_product(a, sf, b, sf, 0, 0, 0, mad_m, mad_n, mad_k, False, l0c, False)
    expected = start.astype(np.float64) + a.astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(l0c, expected, rtol=0, atol=_tol(a, b) + 1e-5)


@pytest.mark.parametrize("mad_n, mad_k", [(24, 20), (8, 13), (40, 7), (cube.NR + 8, 64)])
def test_mmad_odd_sizes_outside_the_contract(rng, mad_n, mad_k):
    # Outside the contract's multiples (partial B panels, K not a multiple of 8): the scalar fallbacks and the
    # masked last panel must still be exact to fp32 accumulation, and must not touch L0C past mad_n.
    mad_m = 13
    a = rng.standard_normal((mad_m, mad_k)).astype(np.float32)
    b = rng.standard_normal((mad_n, mad_k)).astype(np.float32)
    l0c = np.full((mad_m, mad_n + 3), np.nan, dtype=np.float32)
    sf = np.zeros((1, 1), dtype=np.uint8)
    _cube_product(a, sf, b, sf, 0, 0, 0, mad_m, mad_n, mad_k, False, l0c, True)
    expected = a.astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(l0c[:, :mad_n], expected, rtol=0, atol=_tol(a, b))
    assert np.all(np.isnan(l0c[:, mad_n:]))


# NOTES: LANES + 1 .. LANES * 3 / 2 columns take the paired-row tail kernel on AVX-512 (LANES + 8: the HC GEMM's N = 24)
@pytest.mark.parametrize("cols", sorted({1, cube.LANES - 1, cube.LANES, cube.LANES + 1, cube.LANES + 4,
                                         cube.LANES + cube.LANES // 2, cube.LANES + cube.LANES // 2 + 1, cube.NR - 1}))
def test_mmad_partial_panel_is_the_full_panel_masked(rng, cols):
    # The last, partial panel runs a lane-masked micro-kernel (one vector when its columns fit one): every row-tile
    # size, init then accumulate, bit for bit the columns of the same product on a full panel (B's extra rows zero:
    # the same FMA chain per element), and L0C past mad_n neither read nor written.
    mad_k = 72
    for mad_m in range(1, cube.MR + 4):
        mad_n = cube.NR + cols
        full_n = 2 * cube.NR
        a = rng.standard_normal((mad_m, mad_k)).astype(np.float32)
        b = np.zeros((full_n, mad_k), dtype=np.float32)
        b[:mad_n] = rng.standard_normal((mad_n, mad_k))
        sf = np.zeros((1, 1), dtype=np.uint8)
        l0c = np.full((mad_m, mad_n + 5), np.nan, dtype=np.float32)
        ref = np.empty((mad_m, full_n), dtype=np.float32)
        for init in (True, False):
            _cube_product(a, sf, b, sf, 0, 0, 0, mad_m, mad_n, mad_k, False, l0c, init)
            _cube_product(a, sf, b, sf, 0, 0, 0, mad_m, full_n, mad_k, False, ref, init)
            np.testing.assert_array_equal(l0c[:, :mad_n], ref[:, :mad_n])
            assert np.all(np.isnan(l0c[:, mad_n:])), (mad_m, cols)


def test_mmad_strided_l0c_views(rng):
    # L0C as a sub-tile view (row stride > mad_n) takes the fast path; a column-strided view the reference path.
    mad_m, mad_n, mad_k = 20, 48, 64
    a = rng.standard_normal((mad_m, mad_k)).astype(np.float32)
    b = rng.standard_normal((mad_n, mad_k)).astype(np.float32)
    sf = np.zeros((1, 1), dtype=np.uint8)
    expected = a.astype(np.float64) @ b.astype(np.float64).T
    big = np.zeros((64, 128), dtype=np.float32)
    _cube_product(a, sf, b, sf, 0, 0, 0, mad_m, mad_n, mad_k, False, big[8 : 8 + mad_m, 16 : 16 + mad_n], True)
    np.testing.assert_allclose(big[8 : 8 + mad_m, 16 : 16 + mad_n], expected, rtol=0, atol=_tol(a, b))
    assert not big[:8].any() and not big[8 + mad_m :].any() and not big[:, : 16].any()
    wide = np.zeros((mad_m, 2 * mad_n), dtype=np.float32)
    _cube_product(a, sf, b, sf, 0, 0, 0, mad_m, mad_n, mad_k, False, wide[:, ::2], True)
    np.testing.assert_allclose(wide[:, ::2], expected, rtol=0, atol=_tol(a, b))
    assert not wide[:, 1::2].any()


def test_loads_from_strided_l1_and_sf_views(rng):
    # L1 and scale buffers as views (a ring-buffer slot, a column-strided view, a transposed sf view) give the same
    # bits as contiguous copies, and the right product.
    mad_m, mad_n, mad_k = 24, 32, 64
    big_a = rng.standard_normal((2 * mad_m, mad_k)).astype(np.float32)
    big_b = rng.standard_normal((mad_n, 2 * mad_k)).astype(np.float32)
    l1a, l1b = big_a[mad_m:], big_b[:, ::2]  # a ring slot (row offset), a column-strided view
    sfa = rng.integers(118, 136, size=(2, mad_m), dtype=np.uint8).T  # [rows, blocks] with strides (1, rows)
    sfb = rng.integers(118, 136, size=(mad_n, 2), dtype=np.uint8)
    out = []
    for a, b, sa, sb in ((l1a, l1b, sfa, sfb), tuple(np.ascontiguousarray(x) for x in (l1a, l1b, sfa, sfb))):
        l0c = np.empty((mad_m, mad_n), dtype=np.float32)
        _cube_product(a, sa, b, sb, 0, 0, 0, mad_m, mad_n, mad_k, True, l0c, True)
        out.append(l0c)
    np.testing.assert_array_equal(out[0], out[1])
    a_ref = _ref_scaled(np.ascontiguousarray(l1a), np.ascontiguousarray(sfa), 0, 0, mad_m, mad_k)
    b_ref = _ref_scaled(np.ascontiguousarray(l1b), sfb, 0, 0, mad_n, mad_k)
    np.testing.assert_allclose(out[0], a_ref @ b_ref.T, rtol=0, atol=_tol(a_ref, b_ref))


def test_mmad_is_deterministic_and_matches_a_sequential_fma_chain(rng):
    # Each C element is one fp32 FMA chain along K (the same for every tiling and thread count). Emulated in float64:
    # a * b is exact there; a * b + c rounds twice (to float64, then float32), which equals one FMA rounding except
    # in vanishingly rare ties, so a seeded case is stable.
    mad_m, mad_n, mad_k = 7, 16, 300
    a = rng.standard_normal((mad_m, mad_k)).astype(np.float32)
    b = rng.standard_normal((mad_n, mad_k)).astype(np.float32)
    sf = np.zeros((1, 1), dtype=np.uint8)
    out = [np.empty((mad_m, mad_n), dtype=np.float32) for _ in range(2)]
    for l0c in out:
        _cube_product(a, sf, b, sf, 0, 0, 0, mad_m, mad_n, mad_k, False, l0c, True)
    np.testing.assert_array_equal(out[0], out[1])
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    c = np.zeros((mad_m, mad_n), dtype=np.float32)
    for kk in range(mad_k):
        c = (np.outer(a64[:, kk], b64[:, kk]) + c).astype(np.float32)
    np.testing.assert_array_equal(out[0], c)


def test_bad_arguments_raise():
    l1 = np.zeros((16, 64), dtype=np.float32)
    sf = np.zeros((16, 2), dtype=np.uint8)
    l0 = np.zeros(cube.l0b_size(16, 64), dtype=np.float32)
    with pytest.raises(ValueError, match="exceeds the L1 buffer"):
        cube.load_l0a(l0, l1, sf, 8, 0, 16, 64, False)
    with pytest.raises(ValueError, match="smaller than"):
        cube.load_l0b(l0[:100], l1, sf, 0, 0, 16, 64, False)
    with pytest.raises(ValueError, match="scale-factor"):
        cube.load_l0b(l0, l1, sf[:, :1], 0, 0, 16, 64, True)
    with pytest.raises(ValueError, match="L0C is smaller"):
        cube.mmad(np.zeros((8, 16), np.float32), l0, l0, 16, 16, 64, True)


# ---------------------------------------------------------------------------------------------------------------
# Machine code of the micro-kernel
# ---------------------------------------------------------------------------------------------------------------
def _loop_blocks(asm: str) -> list[list[str]]:
    """Basic blocks (label + instructions) of an x86 asm listing."""
    blocks, current = [], []
    for line in asm.splitlines():
        if re.match(r"^\.?L\w+:", line):
            blocks.append(current)
            current = [line]
        elif line.startswith("\t") and not line.strip().startswith("."):
            current.append(line.strip())
    blocks.append(current)
    return blocks


def test_microkernel_compiles_to_full_width_fma_without_spills():
    from numba import njit, types

    bits = vector_width_bits()
    if bits < 256:
        pytest.skip(f"host has {bits}-bit vectors only")
    reg = {256: "ymm", 512: "zmm"}[bits]
    ptr = types.CPointer(types.float32)
    signature = (types.intp, types.intp, ptr, types.intp, ptr, ptr, types.intp, types.boolean)
    # NOTES: a fresh (uncached) compile of the same function: numba cannot show asm of code loaded from its cache.
    fresh = njit(cube._microkernel.py_func)
    fresh.compile(signature)
    asm = fresh.inspect_asm(signature)

    fma = re.compile(rf"^vfmadd\d+ps\s.*%{reg}\d+,\s*%{reg}\d+$|^vfmadd\d+ps\s.*%{reg}\d+$")
    hot = [b for b in _loop_blocks(asm) if sum(bool(fma.match(i)) for i in b) >= cube.MR * cube.NR // cube.LANES]
    assert hot, f"no basic block with {cube.MR * cube.NR // cube.LANES} packed {reg} FMAs: micro-kernel lost its FMAs"
    for block in hot:
        narrow = [i for i in block if i.startswith("vfmadd") and f"%{reg}" not in i]
        assert not narrow, f"narrower FMAs in the hot loop: {narrow[:3]}"
        spills = [i for i in block if "(%rsp)" in i and "%" + reg in i]
        assert not spills, f"vector register spills in the hot loop: {spills[:3]}"


# ---------------------------------------------------------------------------------------------------------------
# The bf16 L0 paths: AMX (uint16 L0 buffers, TDPBF16PS) and AVX512-BF16 (int16 L0 buffers, VDPBF16PS)
# ---------------------------------------------------------------------------------------------------------------
amx_only = pytest.mark.skipif(not cube.AMX_SUPPORTED, reason="this CPU or kernel offers no AMX-BF16")
dpbf16_only = pytest.mark.skipif(not cube.DPBF16_SUPPORTED, reason="this CPU or LLVM offers no AVX512-BF16")
# The L0 element type names the unit; both share the bf16 layouts.
BF16_UNITS = [pytest.param(np.uint16, marks=amx_only, id="amx"), pytest.param(np.int16, marks=dpbf16_only, id="dpbf16")]


def _bf16_exact(x):
    """float32 values exact in bf16 (the high halves of x's bits)."""
    return (x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)


def _l1_operand(rng, rows, cols, kind):
    """(L1 buffer, its fp64 values): bf16 bits (uint16), FP8 e4m3fn codes (uint8) or bf16-exact fp32."""
    import ml_dtypes

    x = rng.standard_normal((rows, cols)).astype(np.float32)
    if kind == "bf16":
        v = _bf16_exact(x)
        return (v.view(np.uint32) >> np.uint32(16)).astype(np.uint16), v.astype(np.float64)
    if kind == "fp8":
        codes = x.astype(ml_dtypes.float8_e4m3fn)
        return codes.view(np.uint8), codes.astype(np.float64)
    v = _bf16_exact(x)
    return v, v.astype(np.float64)


def _bf16_product(l1a, sfa, l1b, sfb, row0_a, row0_b, k0, mad_m, mad_n, mad_k, with_sf, l0c, init, l0_dtype=np.uint16):
    # All-ones (NaN) bf16 L0 buffers: a slot the loads forget to write would poison the product.
    l0a = np.full(cube.l0a_size(mad_m, mad_k), 0xFFFF, dtype=np.uint16).view(l0_dtype)
    l0b = np.full(cube.l0b_size(mad_n, mad_k), 0xFFFF, dtype=np.uint16).view(l0_dtype)
    cube.load_l0a(l0a, l1a, sfa, row0_a, k0, mad_m, mad_k, with_sf)
    cube.load_l0b(l0b, l1b, sfb, row0_b, k0, mad_n, mad_k, with_sf)
    cube.mmad(l0c, l0a, l0b, mad_m, mad_n, mad_k, init)
    return l0a, l0b


@pytest.mark.parametrize("l0_dtype", BF16_UNITS)
@pytest.mark.parametrize("kind", ["bf16", "fp8", "fp32"])
@pytest.mark.parametrize("with_sf", [False, True])
@pytest.mark.parametrize("mad_m, mad_n, mad_k, k0",
                         [(1, 16, 32, 0), (16, 32, 64, 32), (33, 47, 96, 0), (64, 64, 40, 32), (20, 5, 8, 0)])
def test_bf16_l0_init_then_accumulate(rng, l0_dtype, kind, with_sf, mad_m, mad_n, mad_k, k0):
    # Full and partial 32 x 32 C blocks, K not a multiple of 32 (zero padding), a K offset into L1, scaled and not,
    # every L1 kind; L0C wider than the tile and full of NaN outside it (never read by init, never written).
    extra, block_k = 3, k0 + mad_k + 8
    l1a, va = _l1_operand(rng, mad_m + extra, block_k, kind)
    l1b, vb = _l1_operand(rng, mad_n + extra, block_k, kind)
    sfa = rng.integers(120, 134, size=(mad_m + extra, (block_k + 31) // 32), dtype=np.uint8)
    sfb = rng.integers(120, 134, size=(mad_n + extra, (block_k + 31) // 32), dtype=np.uint8)
    l0c = np.full((mad_m + 2, mad_n + 8), np.nan, dtype=np.float32)
    l0c[mad_m:] = 7.0
    l0c[:, mad_n:] = 7.0
    sentinel = l0c.copy()
    a = _ref_scaled(va, sfa, extra, k0, mad_m, mad_k, with_sf)
    b = _ref_scaled(vb, sfb, 1, k0, mad_n, mad_k, with_sf)
    for step in range(2):
        _bf16_product(l1a, sfa, l1b, sfb, extra, 1, k0, mad_m, mad_n, mad_k, with_sf, l0c, step == 0, l0_dtype)
        np.testing.assert_allclose(l0c[:mad_m, :mad_n], (step + 1) * (a @ b.T), rtol=0,
                                   atol=_tol(a, b) * (step + 1))
    np.testing.assert_array_equal(l0c[mad_m:], sentinel[mad_m:])
    np.testing.assert_array_equal(l0c[:, mad_n:], sentinel[:, mad_n:])


@pytest.mark.parametrize("l0_dtype", BF16_UNITS)
def test_bf16_l0_layouts(rng, l0_dtype):
    # The private layouts, element by element: L0A rows x round_up(K, 32) with zero K padding; L0B 16-row panels of
    # K pairs, [panel][k // 2][lane][k % 2], zero past mad_n and past mad_k.
    mad_m, mad_n, mad_k = 5, 20, 40
    l1a, _ = _l1_operand(rng, mad_m, mad_k, "bf16")
    l1b, _ = _l1_operand(rng, mad_n, mad_k, "bf16")
    sf = np.zeros((1, 1), dtype=np.uint8)
    l0a = np.full(cube.l0a_size(mad_m, mad_k), 0xFFFF, dtype=np.uint16).view(l0_dtype)
    l0b = np.full(cube.l0b_size(mad_n, mad_k), 0xFFFF, dtype=np.uint16).view(l0_dtype)
    cube.load_l0a(l0a, l1a, sf, 0, 0, mad_m, mad_k, False)
    cube.load_l0b(l0b, l1b, sf, 0, 0, mad_n, mad_k, False)
    kp = 64
    a = l0a.view(np.uint16)[: mad_m * kp].reshape(mad_m, kp)
    np.testing.assert_array_equal(a[:, :mad_k], l1a)
    assert not a[:, mad_k:].any()
    b = l0b.view(np.uint16)[: 2 * kp * 16].reshape(2, kp // 2, 16, 2)
    padded = np.zeros((32, kp), dtype=np.uint16)
    padded[:mad_n, :mad_k] = l1b
    np.testing.assert_array_equal(b, padded.reshape(2, 16, kp // 2, 2).transpose(0, 2, 1, 3))


@pytest.mark.parametrize("l0_dtype", BF16_UNITS)
@pytest.mark.parametrize("operand", ["a", "b"])
@pytest.mark.parametrize("exponents", [(0, 1, 9, 10), (11, 120, 127, 134), (245, 246, 247, 254), (255, 127, 10, 246)])
def test_fp8_bf16_l0_bits_for_every_code_and_scale(l0_dtype, operand, exponents):
    # Every e4m3 code in every row under UE8M0 scales at and past the edges of the 16-bit decode (a 16-row B step or
    # a 32-K A step with a scale outside its range takes the fp32 path): the L0 bits are the high halves
    # of fp32(value) * fp32(scale), what the fp32 path computes, either way. One exponent for every row (each of the
    # four), then rows mixing them (each 32-K block shifts which row has which).
    import ml_dtypes

    rows, k = 16, 512
    codes = ((np.arange(k)[None, :] + 37 * np.arange(rows)[:, None]) % 256).astype(np.uint8)
    sf = np.array([[exponents[(r + blk) % 4] for blk in range(k // 32)] for r in range(rows)], dtype=np.uint8)
    for scales in [np.full_like(sf, e) for e in exponents] + [sf]:
        if operand == "a":
            l0 = np.full(cube.l0a_size(rows, k), 0xFFFF, dtype=np.uint16).view(l0_dtype)
            cube.load_l0a(l0, codes, scales, 0, 0, rows, k, True)
            got = l0.view(np.uint16)[: rows * k].reshape(rows, k)
        else:
            l0 = np.full(cube.l0b_size(rows, k), 0xFFFF, dtype=np.uint16).view(l0_dtype)
            cube.load_l0b(l0, codes, scales, 0, 0, rows, k, True)
            got = l0.view(np.uint16)[: k * rows].reshape(k // 2, rows, 2).transpose(1, 0, 2).reshape(rows, k)
        values = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        factor = cube.UE8M0_SCALES[np.repeat(scales, 32, axis=1)]
        with np.errstate(over="ignore", invalid="ignore"):
            want = ((values * factor).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
        # a NaN scale (exponent 255) gives NaN; which NaN operand's sign survives is the machine's choice
        nan_scale = np.repeat(scales, 32, axis=1) == 255
        np.testing.assert_array_equal(np.where(nan_scale, 0, got), np.where(nan_scale, 0, want))
        assert np.all((got[nan_scale] & 0x7FFF) > 0x7F80)
    # and without scales (the codes' own values; NaN codes keep their sign)
    l0 = np.full(cube.l0b_size(rows, k), 0xFFFF, dtype=np.uint16).view(l0_dtype)
    if operand == "a":
        cube.load_l0a(l0, codes, sf, 0, 0, rows, k, False)
        got = l0.view(np.uint16)[: rows * k].reshape(rows, k)
    else:
        cube.load_l0b(l0, codes, sf, 0, 0, rows, k, False)
        got = l0.view(np.uint16)[: k * rows].reshape(k // 2, rows, 2).transpose(1, 0, 2).reshape(rows, k)
    np.testing.assert_array_equal(got, (values.view(np.uint32) >> np.uint32(16)).astype(np.uint16))


@pytest.mark.parametrize("l0_dtype", BF16_UNITS)
@pytest.mark.parametrize("k0, mad_k", [(0, 48), (16, 64), (8, 40), (32, 16), (16, 56), (0, 8)])
def test_fp8_bf16_l0_bits_off_the_32k_grid(rng, l0_dtype, k0, mad_k):
    # K offsets and lengths that are not whole 32-K steps: the loads split each row into 32-K steps, 16-K chunks and
    # single elements, every piece with its own block's scale (exponents on both sides of the 16-bit decode's range).
    import ml_dtypes

    rows, block_k = 16, 128
    codes = rng.integers(0, 256, size=(rows, block_k), dtype=np.uint8)
    sf = rng.choice(np.array([5, 100, 127, 133, 250], dtype=np.uint8), size=(rows, block_k // 32))
    values = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    factor = cube.UE8M0_SCALES[np.repeat(sf, 32, axis=1)]
    with np.errstate(over="ignore", invalid="ignore"):
        want = ((values * factor).view(np.uint32) >> np.uint32(16)).astype(np.uint16)[:, k0:k0 + mad_k]
    kp = (mad_k + 31) // 32 * 32
    l0 = np.full(cube.l0a_size(rows, mad_k), 0xFFFF, dtype=np.uint16).view(l0_dtype)
    cube.load_l0a(l0, codes, sf, 0, k0, rows, mad_k, True)
    got = l0.view(np.uint16)[: rows * kp].reshape(rows, kp)
    np.testing.assert_array_equal(got[:, :mad_k], want)
    assert not got[:, mad_k:].any()
    l0 = np.full(cube.l0b_size(rows, mad_k), 0xFFFF, dtype=np.uint16).view(l0_dtype)
    cube.load_l0b(l0, codes, sf, 0, k0, rows, mad_k, True)
    got = l0.view(np.uint16)[: kp * rows].reshape(kp // 2, rows, 2).transpose(1, 0, 2).reshape(rows, kp)
    np.testing.assert_array_equal(got[:, :mad_k], want)
    assert not got[:, mad_k:].any()


@pytest.mark.parametrize("l0_dtype", BF16_UNITS)
def test_bf16_l0_depends_only_on_the_32k_steps(rng, l0_dtype):
    # One Mmad over K = 256 equals four accumulating Mmads of 64 (and two of 128), bit for bit: results depend on
    # the order of the 32-K steps only, not on how a kernel splits K into MADs, tiles or cores. A column-strided
    # L0C (the scratch path) gives the same bits too.
    mad_m, mad_n, k = 40, 48, 256
    l1a, _ = _l1_operand(rng, mad_m, k, "fp8")
    l1b, _ = _l1_operand(rng, mad_n, k, "fp8")
    sfa = rng.integers(120, 134, size=(mad_m, k // 32), dtype=np.uint8)
    sfb = rng.integers(120, 134, size=(mad_n, k // 32), dtype=np.uint8)
    outs = []
    for mad_k in (256, 128, 64):
        l0c = np.empty((mad_m, mad_n), dtype=np.float32)
        for k0 in range(0, k, mad_k):
            _bf16_product(l1a, sfa, l1b, sfb, 0, 0, k0, mad_m, mad_n, mad_k, True, l0c, k0 == 0, l0_dtype)
        outs.append(l0c)
    wide = np.zeros((mad_m, 2 * mad_n), dtype=np.float32)
    _bf16_product(l1a, sfa, l1b, sfb, 0, 0, 0, mad_m, mad_n, k, True, wide[:, ::2], True, l0_dtype)
    outs.append(wide[:, ::2])
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])
    assert not wide[:, 1::2].any()


@pytest.mark.parametrize("l0_dtype", BF16_UNITS)
def test_bf16_l0_bad_arguments_raise(l0_dtype):
    l1 = np.zeros((16, 64), dtype=np.uint16)
    sf = np.zeros((16, 2), dtype=np.uint8)
    l0_16 = np.zeros(cube.l0b_size(16, 64), dtype=l0_dtype)
    l0_32 = np.zeros(cube.l0b_size(16, 64), dtype=np.float32)
    other = np.zeros(cube.l0b_size(16, 64), dtype=np.int16 if l0_dtype == np.uint16 else np.uint16)
    with pytest.raises(ValueError, match="must both be fp32, both uint16 or both int16"):
        cube.mmad(np.zeros((16, 16), np.float32), l0_32, l0_16, 16, 16, 64, True)
    with pytest.raises(ValueError, match="must both be fp32, both uint16 or both int16"):
        cube.mmad(np.zeros((16, 16), np.float32), other, l0_16, 16, 16, 64, True)
    with pytest.raises(ValueError, match="contiguous"):
        cube.load_l0a(np.zeros(2 * l0_16.size, l0_dtype)[::2], l1, sf, 0, 0, 16, 64, False)
    with pytest.raises(ValueError, match="fp32 or uint16 / int16"):
        cube.load_l0a(np.zeros(l0_16.size, np.int8), l1, sf, 0, 0, 16, 64, False)


def _dpbf16_emulation(a, b, init_c=None):
    """VDPBF16PS's sums in numpy: C[i, j] over K pairs q in order, += a[i, 2q + 1] b[j, 2q + 1] then += a[i, 2q]
    b[j, 2q], each addition an fp32 rounding (the products of bf16 values are exact in fp32). a, b: bf16-exact
    float32 with an even K (zero-padded); no subnormals occur at these magnitudes."""
    acc = np.zeros((a.shape[0], b.shape[0]), np.float32) if init_c is None else init_c.astype(np.float32)
    for q in range(a.shape[1] // 2):
        acc = acc + np.outer(a[:, 2 * q + 1], b[:, 2 * q + 1])
        acc = acc + np.outer(a[:, 2 * q], b[:, 2 * q])
    return acc


@dpbf16_only
@pytest.mark.parametrize("mad_m, mad_n, mad_k",
                         [(m, 40, 70) for m in range(1, 2 * cube.MR + 2)] + [(24, 5, 32), (9, 17, 8), (16, 64, 600)])
def test_dpbf16_mmad_is_the_instruction_pair_order(rng, mad_m, mad_n, mad_k):
    # Bit for bit the emulated VDPBF16PS order, init and accumulate: every row tile (1..MR and the balanced
    # remainders), partial 32-column blocks (masked C and B lanes), K not a multiple of 32, K past one K chunk.
    l1a, _ = _l1_operand(rng, mad_m, mad_k, "bf16")
    l1b, _ = _l1_operand(rng, mad_n, mad_k, "bf16")
    sf = np.zeros((1, 1), dtype=np.uint8)
    kp = (mad_k + 31) // 32 * 32
    a = np.zeros((mad_m, kp), np.float32)
    b = np.zeros((mad_n, kp), np.float32)
    a[:, :mad_k] = (l1a.astype(np.uint32) << np.uint32(16)).view(np.float32)
    b[:, :mad_k] = (l1b.astype(np.uint32) << np.uint32(16)).view(np.float32)
    l0c = np.full((mad_m + 1, mad_n + 5), np.nan, dtype=np.float32)
    _bf16_product(l1a, sf, l1b, sf, 0, 0, 0, mad_m, mad_n, mad_k, False, l0c, True, np.int16)
    first = _dpbf16_emulation(a, b)
    np.testing.assert_array_equal(l0c[:mad_m, :mad_n], first)
    _bf16_product(l1a, sf, l1b, sf, 0, 0, 0, mad_m, mad_n, mad_k, False, l0c, False, np.int16)
    np.testing.assert_array_equal(l0c[:mad_m, :mad_n], _dpbf16_emulation(a, b, first))
    assert np.isnan(l0c[mad_m:]).all() and np.isnan(l0c[:, mad_n:]).all()


@dpbf16_only
def test_dpbf16_reads_subnormal_operands_as_zero():
    # Like the AMX unit, VDPBF16PS reads a subnormal bf16 (here 2^-127 from the scale byte 0) as zero, where the fp32
    # FMA Cube keeps it: why api.checks.rebalance_scales needs every scaled operand normal on either bf16 path.
    mad_m = mad_n = 16
    mad_k = 32
    ones = np.full((16, mad_k), 0x3F80, dtype=np.uint16)  # bf16 1.0
    sfa = np.zeros((16, 1), dtype=np.uint8)  # 2^-127: subnormal
    sfb = np.full((16, 1), 127, dtype=np.uint8)
    fma = np.empty((mad_m, mad_n), np.float32)
    _cube_product(ones, sfa, ones, sfb, 0, 0, 0, mad_m, mad_n, mad_k, True, fma, True)
    assert np.all(fma == np.float32(32 * 2.0**-127))
    dp = np.full((mad_m, mad_n), np.nan, np.float32)
    _bf16_product(ones, sfa, ones, sfb, 0, 0, 0, mad_m, mad_n, mad_k, True, dp, True, np.int16)
    assert not dp.any()
    sfa[:] = 1  # 2^-126, the smallest normal: counted
    _bf16_product(ones, sfa, ones, sfb, 0, 0, 0, mad_m, mad_n, mad_k, True, dp, True, np.int16)
    assert np.all(dp == np.float32(32 * 2.0**-126))


@dpbf16_only
def test_dpbf16_mmad_compiles_to_register_blocked_vdpbf16ps():
    from numba import njit, types

    from deep_gemm.device.cube_dpbf16 import _dp_kernel

    # NOTES: a fresh (uncached) compile: numba cannot show asm of code loaded from its cache.
    fresh = njit(_dp_kernel.py_func)
    u16, f32 = types.CPointer(types.uint16), types.CPointer(types.float32)
    signature = (types.intp, types.intp, u16, types.intp, u16, types.intp, f32, types.intp, types.intp,
                 types.boolean)
    fresh.compile(signature)
    asm = fresh.inspect_asm(signature)
    dp = re.compile(r"^vdpbf16ps\s.*%zmm\d+$")
    # the MR-row kernel's K loop: 2 MR VDPBF16PS per K pair (LLVM may unroll it), accumulators never spilled
    hot = [b for b in _loop_blocks(asm) if sum(bool(dp.match(i)) for i in b) >= 2 * cube.MR]
    assert hot, f"no loop body with {2 * cube.MR} zmm VDPBF16PS: the micro-kernel lost its register block"
    for block in hot:
        body = block[: next((n for n, i in enumerate(block) if i.startswith("j")), len(block))]
        spills = [i for i in body if "(%rsp)" in i and "%zmm" in i]
        assert not spills, f"vector register spills in the hot loop: {spills[:3]}"


@amx_only
def test_amx_mmad_compiles_to_tile_instructions():
    from numba import njit, types

    from deep_gemm.device.cube import _amx_block

    # NOTES: a fresh (uncached) compile: numba cannot show asm of code loaded from its cache.
    fresh = njit(_amx_block.py_func)
    u16, f32 = types.CPointer(types.uint16), types.CPointer(types.float32)
    signature = (types.intp, types.intp, types.intp, u16, types.intp, u16, types.intp, f32, types.intp,
                 types.boolean)
    fresh.compile(signature)
    asm = fresh.inspect_asm(signature)
    assert "tdpbf16ps" in asm and "tileloadd" in asm and "tilestored" in asm
    hot = [b for b in _loop_blocks(asm) if sum(i.startswith("tdpbf16ps") for i in b) == 4]
    assert hot, "no loop body with the 2 x 2 block's four TDPBF16PS"
