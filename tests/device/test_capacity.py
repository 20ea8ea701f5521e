"""The static capacity check (deep_gemm.device.capacity): configs that overflow a buffer or break a tiling rule are
refused with the buffer, the bytes asked and the capacity in the message."""

from __future__ import annotations

import pytest

from deep_gemm.arch import get_arch
from deep_gemm.device.capacity import BufferCapacityError, check_buffer_capacity, keeps_a_resident
from deep_gemm.heuristics.config import GemmConfig, GemmDesc

ARCH = get_arch("950DT")


def _cfg(**kw) -> GemmConfig:
    base = dict(block_m=128, block_n=256, block_k=256, mad_m=128, mad_n=256, mad_k=64, num_l1_stages=2,
                num_ai_cores=32)
    base.update(kw)
    return GemmConfig(**base)


def test_legal_config_passes():
    need = check_buffer_capacity(GemmDesc(1024, 1024, 1024), _cfg(), ARCH)
    assert need["L1"] <= ARCH.l1_bytes and need["L0C"] == 2 * 128 * 256 * 4


@pytest.mark.parametrize(
    "kw,buffer",
    [
        (dict(num_l1_stages=8, block_k=512, mad_k=64), "L1"),
        (dict(mad_m=32, mad_k=128), "L0B"),
        (dict(block_m=256, mad_m=256, block_n=256, mad_n=256, mad_k=32), "L0C"),
    ],
)
def test_overflow_names_buffer_and_bytes(kw, buffer):
    desc = GemmDesc(1024, 1024, 1024, a_dtype="bf16", b_dtype="bf16")
    cfg = _cfg(**kw)
    with pytest.raises(BufferCapacityError, match=rf"{buffer} overflow: .* needs \d+ bytes of {buffer}, the 950DT has"):
        check_buffer_capacity(desc, cfg, ARCH)


def test_l0c_must_hold_every_mad_tile_of_a_block():
    # 4 MAD tiles of 128 x 128 fp32 = 256 KiB: fits 950DT's L0C (2 stages would say 128 KiB), not 910B2's 128 KiB.
    cfg = _cfg(block_m=256, block_n=256, mad_m=128, mad_n=128, num_ai_cores=24)
    desc = GemmDesc(1024, 1024, 1024, a_dtype="bf16", b_dtype="bf16", num_ai_cores=24)
    assert check_buffer_capacity(desc, cfg, ARCH)["L0C"] == 256 * 1024
    with pytest.raises(BufferCapacityError, match="L0C overflow"):
        check_buffer_capacity(desc, cfg, get_arch("910B2"))


def test_stream_resident_a_must_fit_l1():
    desc = GemmDesc(64, 4096, 16384)  # fp8: 64 x 16384 B = 1 MiB of resident A
    cfg = _cfg(block_m=64, mad_m=64, block_n=64, mad_n=64, path="stream")
    with pytest.raises(BufferCapacityError, match="L1 overflow: the stream kernel"):
        check_buffer_capacity(desc, cfg, ARCH, resident_a=True)
    check_buffer_capacity(desc, cfg, ARCH)  # streamed A fits
    assert not keeps_a_resident(desc, cfg, ARCH, k_is_compiled=True)
    small = GemmDesc(64, 4096, 4096)
    assert keeps_a_resident(small, cfg, ARCH, k_is_compiled=True)
    assert not keeps_a_resident(small, cfg, ARCH, k_is_compiled=False)  # L1 is sized statically on the chip
    check_buffer_capacity(small, cfg, ARCH, resident_a=True)


def test_tiling_rules():
    with pytest.raises(BufferCapacityError, match="block_n=200 must be a positive multiple of mad_n=64"):
        check_buffer_capacity(GemmDesc(128, 128, 128), _cfg(block_n=200, mad_n=64), ARCH)
    with pytest.raises(BufferCapacityError, match="num_ai_cores"):
        check_buffer_capacity(GemmDesc(128, 128, 128, num_ai_cores=7), _cfg(), ARCH)
