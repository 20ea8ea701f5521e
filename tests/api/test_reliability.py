"""Reliability of whole calls: Ctrl-C (a long call stops within 0.5 s and leaves its outputs as they were, a short
one completes), runtime settings read once per call, overlapping outputs refused, and no leaked memory or
references over many calls of every family."""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
import tracemalloc
import weakref

import ml_dtypes
import numpy as np
import pytest

import deep_gemm
from deep_gemm import runtime
from deep_gemm.api.guard import api_call
from deep_gemm.jit import interrupt
from deep_gemm.jit.compile import wait_native_builds
from deep_gemm.testing.generators import bf16_operand, fp8_operand, grouped_layouts
from deep_gemm.utils import per_token_cast_to_fp8

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn

needs_main_thread_sigint = pytest.mark.skipif(
    signal.getsignal(signal.SIGINT) is not signal.default_int_handler,
    reason="the process's SIGINT handler is not Python's default (a test runner replaced it)")


def call_interrupted(fn, monkeypatch, delay: float = 0.05) -> float:
    """Run fn() and send SIGINT to this process ``delay`` s after its first cancellable launch began (from another
    thread, so the timing does not depend on the machine's speed); returns the seconds from the signal to the
    KeyboardInterrupt."""
    from deep_gemm.jit import launch

    started, sent = threading.Event(), {}
    original = launch.CoreLauncher._launch_cancellable

    def noting(self, *args, **kwargs):
        started.set()
        return original(self, *args, **kwargs)

    monkeypatch.setattr(launch.CoreLauncher, "_launch_cancellable", noting)

    def fire():
        if started.wait(60):
            time.sleep(delay)
            sent["at"] = time.perf_counter()
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=fire, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        fn()
        time.sleep(2)  # the call ended before the signal: let it arrive here (the test then fails on timing)
    assert started.is_set(), "the call never made a cancellable launch"
    return time.perf_counter() - sent["at"]


# ---------------------------------------------------------------------------------------------------------------
# Ctrl-C


@needs_main_thread_sigint
def test_ctrl_c_stops_a_long_dense_gemm_within_half_a_second_with_d_untouched(rng, monkeypatch):
    # ~0.55 TFLOP: seconds on a 2-core CPU whatever its Cube (AMX or FMA)
    m, n, k = 8192, 8192, 4096
    a, b = bf16_operand(rng, m, k), bf16_operand(rng, n, k)
    d = np.full((m, n), 3.0, BF16)
    with deep_gemm.dry_run():
        deep_gemm.bf16_gemm_nt(a, b, d)  # compile first: the signal lands in the launch
    wait_native_builds()
    waited = call_interrupted(lambda: deep_gemm.bf16_gemm_nt(a, b, d), monkeypatch, 0.2)
    assert waited < 0.5, f"KeyboardInterrupt came {waited:.3f} s after SIGINT"
    assert (d.view(np.uint16) == np.asarray(3.0, BF16).view(np.uint16)).all()  # exactly as it was
    # the pool is healthy: the next call is right
    small = np.empty((64, n), BF16)
    deep_gemm.bf16_gemm_nt(a[:64], b, small)
    ref = a[:64].astype(np.float32) @ b.astype(np.float32).T
    assert deep_gemm.testing.calc_diff(small.astype(np.float64), ref) < 1e-5


@needs_main_thread_sigint
def test_ctrl_c_during_a_long_k_grouped_call_leaves_the_in_place_accumulator_as_it_was(rng, monkeypatch):
    # eight K groups, one launch each: an interrupt between or inside launches must not leave D half-accumulated
    m = n = 2048
    ks = [4096] * 5
    k_total = sum(ks)
    a = bf16_operand(rng, m, k_total, major="mn")  # [K_total, M] storage
    b = bf16_operand(rng, n, k_total, major="mn")
    a_t = a.T if a.shape[0] != k_total else a
    b_t = b.T if b.shape[0] != k_total else b
    layout = np.cumsum(ks).astype(np.int32)
    d = rng.standard_normal((len(ks), m, n)).astype(np.float32)
    before = d.copy()
    warm = d.copy()
    deep_gemm.k_grouped_bf16_gemm_tn_contiguous(a_t, b_t, warm, ks, layout, c=warm)  # compiled, loaded, linked
    wait_native_builds()
    waited = call_interrupted(lambda: deep_gemm.k_grouped_bf16_gemm_tn_contiguous(a_t, b_t, d, ks, layout, c=d),
                              monkeypatch, 0.15)  # inside the second group's launch, on most machines
    assert waited < 0.5, f"KeyboardInterrupt came {waited:.3f} s after SIGINT"
    np.testing.assert_array_equal(d, before)  # C = D as the caller had it: a retry cannot double-count


@needs_main_thread_sigint
@pytest.mark.parametrize("restorable", [True, False])
def test_ctrl_c_in_a_short_call_leaves_d_untouched_or_complete(rng, monkeypatch, restorable):
    """A short call keeps a copy of small outputs and stops between launches (D untouched); with outputs too
    large to copy (RESTORE_BYTES 0 here) the interrupt is held until the call completes (D complete)."""
    if not restorable:
        monkeypatch.setattr(interrupt, "RESTORE_BYTES", 0)
    m, n, k = 128, 256, 512
    a, b = bf16_operand(rng, m, k), bf16_operand(rng, n, k)
    d = np.zeros((m, n), BF16)

    @api_call
    def three_launches(d, interrupt_it):  # stands for a call that launches several times (K groups, phases)
        interrupt.protect(d, work=2.0 * m * n * k)
        deep_gemm.bf16_gemm_nt(a, b, d)
        if interrupt_it:
            os.kill(os.getpid(), signal.SIGINT)  # arrives between the launches
            time.sleep(0.05)
        deep_gemm.bf16_gemm_nt(a, b, d, c=d)
        deep_gemm.bf16_gemm_nt(a, b, d, c=d, alpha=-1.0)

    complete = np.zeros((m, n), BF16)
    three_launches(complete, False)
    with pytest.raises(KeyboardInterrupt):
        three_launches(d, True)
    want = np.zeros((m, n), BF16) if restorable else complete
    np.testing.assert_array_equal(d.view(np.uint16), want.view(np.uint16))


@needs_main_thread_sigint
def test_ctrl_c_before_any_write_is_immediate():
    @api_call
    def compiling():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # stands for a compile before the first write: interrupted at once

    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        compiling()
    assert time.perf_counter() - t0 < 2


def test_cancel_flag_outside_a_call_is_never_set():
    assert interrupt.cancel_flag()[0] == 0 and interrupt.current() is None


# ---------------------------------------------------------------------------------------------------------------
# Runtime settings: one reading per call


def test_runtime_settings_are_read_once_per_call():
    seen = []
    changed = threading.Event()

    @api_call
    def reads_twice():
        seen.append((runtime.get_num_ai_cores(), runtime.get_npu_arch()))
        threading.Thread(target=lambda: (runtime.set_num_ai_cores(3), changed.set())).start()
        changed.wait(5)
        seen.append((runtime.get_num_ai_cores(), runtime.get_npu_arch()))

    with runtime.runtime_scope(num_ai_cores=7):
        reads_twice()
        assert seen == [(7, "950DT"), (7, "950DT")]  # the call kept its reading
        assert runtime.get_num_ai_cores() == 3  # the other thread's setting, for the next call


# ---------------------------------------------------------------------------------------------------------------
# Overlapping outputs


def _overlapping_views():
    base = np.zeros(64 * 256, np.float32)
    strided = np.lib.stride_tricks.as_strided
    return {
        "row stride 0": lambda shape: strided(base, shape, (0,) * (len(shape) - 1) + (4,)),
        "group stride 0": lambda shape: strided(base, shape, (0,) + tuple(
            int(np.prod(shape[i + 1:])) * 4 for i in range(1, len(shape)))),
        "rows overlapping by half": lambda shape: strided(base, shape, tuple(
            int(np.prod(shape[i + 1:])) * 2 if i < len(shape) - 1 else 4 for i in range(len(shape)))),
    }


@pytest.mark.parametrize("how", list(_overlapping_views()))
def test_overlapping_outputs_are_refused_by_every_family(rng, how):
    make = _overlapping_views()[how]
    g, m, n, k = 2, 8, 64, 64
    a_m = fp8_operand(rng, g * m, k)
    b_stack = tuple(np.stack(x) for x in zip(*[fp8_operand(rng, n, k) for _ in range(g)], strict=True))
    masked_a = (a_m[0].reshape(g, m, k), a_m[1].reshape(g, m, -1))
    masked_m = np.array([m, 3], np.int32)

    def masked(d):
        deep_gemm.m_grouped_fp8_gemm_nt_masked(masked_a, b_stack, d, masked_m, m)

    def k_grouped(d):
        kk = np.array([256, 512], np.int32)
        a, sfa = fp8_operand(rng, m, 512, major="mn")
        bb, sfb = fp8_operand(rng, n, 512, major="mn")
        deep_gemm.k_grouped_fp8_gemm_tn_contiguous((a.T, sfa), (bb.T, sfb), d, [256, 256], kk,
                                                   c=np.zeros((g, m, n), np.float32))

    def bmm(d):
        deep_gemm.bf16_bmm(bf16_operand(rng, g * m, k).reshape(g, m, k), bf16_operand(rng, g * n, k).reshape(g, n, k),
                           d)

    def einsum(d):
        x = bf16_operand(rng, g * m, k).reshape(g, m, k)  # b h r
        w = bf16_operand(rng, m * n, k).reshape(m, n, k)  # h d r
        deep_gemm.einsum("bhr,hdr->bhd", x, w, d)

    for call in (masked, k_grouped, bmm, einsum):
        d = make((g, m, n))
        before = d.copy()
        with pytest.raises(ValueError, match="overlaps itself|must not overlap"):
            call(d)
        np.testing.assert_array_equal(d, before)
    d2 = make((m, n))
    with pytest.raises(ValueError, match="overlaps itself|must not overlap"):
        deep_gemm.bf16_gemm_nt(bf16_operand(rng, m, k), bf16_operand(rng, n, k), d2)


def test_the_overlap_check_accepts_every_non_overlapping_layout():
    from deep_gemm.api.checks import check_no_self_overlap

    x = np.zeros((4, 6, 8), np.float32)
    for view in (x, x.transpose(2, 0, 1), x[::-1, :, ::2], x[:, 1:5], x[:1], x[:, :, :1], x.reshape(24, 8).T):
        check_no_self_overlap(view, "x")
    with pytest.raises(ValueError, match="x overlaps itself"):
        check_no_self_overlap(np.broadcast_to(x[0], (4, 6, 8)), "x")


# ---------------------------------------------------------------------------------------------------------------
# Memory: flat over many calls, returned arrays freed when dropped


def _families(rng):
    """One small call per API family (name -> a function that runs it and returns what it returned)."""
    m, n, k = 64, 128, 256
    a8, b8 = fp8_operand(rng, m, k), fp8_operand(rng, n, k)
    a16, b16 = bf16_operand(rng, m, k), bf16_operand(rng, n, k)
    d = np.empty((m, n), BF16)
    g = 2
    psum, _, rows = grouped_layouts([40, 24])
    ag = fp8_operand(rng, rows, k)
    bg = tuple(np.stack(x) for x in zip(*[fp8_operand(rng, n, k) for _ in range(g)], strict=True))
    dg = np.empty((rows, n), BF16)
    dm = np.empty((g, m, n), BF16)
    masked_a = tuple(np.stack(x) for x in zip(*[fp8_operand(rng, m, k) for _ in range(g)], strict=True))
    masked_m = np.array([m, 5], np.int32)
    ks = [256, 256]
    ak, bk = fp8_operand(rng, m, 512, major="mn"), fp8_operand(rng, n, 512, major="mn")
    ak, bk = (ak[0].T, ak[1]), (bk[0].T, bk[1])  # [K_total, MN] with their scales
    dk = np.zeros((g, m, n), np.float32)
    dbmm = np.empty((g, m, n), BF16)
    # MQA logits (ragged and paged)
    s, h, dim, keys = 32, 4, 64, 300
    q = rng.standard_normal((s, h, dim)).astype(np.float32).astype(E4M3)
    kv, kv_sf = per_token_cast_to_fp8(rng.standard_normal((keys, dim)).astype(np.float32), use_ue8m0=False,
                                      gran_k=dim)
    w = rng.standard_normal((s, h)).astype(BF16)
    kss, kee = np.zeros(s, np.int32), np.full(s, keys, np.int32)
    batch, page = 2, 64
    ctx = np.array([200, 90], np.int32)
    kvp = (kv[:batch * 150].reshape(batch, 150, dim)[:, :150], kv_sf[:batch * 150, 0].reshape(batch, 150))
    ctxp = np.array([150, 90], np.int32)
    table = np.arange(batch * 3, dtype=np.int32).reshape(batch, 3)
    cache = deep_gemm.build_paged_kv_cache(kvp, table, batch * 3, page)
    qp = q[:batch * 1].reshape(batch, 1, h, dim)
    wp = w[:batch]
    meta = deep_gemm.get_paged_mqa_logits_metadata(ctxp, h)
    del ctx
    # HC pre-norm
    ah = rng.standard_normal((16, 256)).astype(BF16)
    bh = rng.standard_normal((24, 256)).astype(np.float32)
    dh, sq = np.empty((16, 24), np.float32), np.empty(16, np.float32)
    return {
        "fp8_gemm_nt": lambda: deep_gemm.fp8_gemm_nt(a8, b8, d),
        "bf16_gemm_nt": lambda: deep_gemm.bf16_gemm_nt(a16, b16, d),
        "m_grouped_contiguous": lambda: deep_gemm.m_grouped_fp8_gemm_nt_contiguous(ag, bg, dg, psum),
        "m_grouped_masked": lambda: deep_gemm.m_grouped_fp8_gemm_nt_masked(masked_a, bg, dm, masked_m, m),
        "k_grouped": lambda: deep_gemm.k_grouped_fp8_gemm_tn_contiguous(ak, bk, dk, ks,
                                                                        np.cumsum(ks).astype(np.int32), c=dk),
        "bf16_bmm": lambda: deep_gemm.bf16_bmm(np.stack([a16] * g), np.stack([b16] * g), dbmm),
        "mqa_logits": lambda: deep_gemm.fp8_fp4_mqa_logits((q, None), (kv, kv_sf[:, 0].copy()), w, kss, kee),
        "paged_mqa_logits": lambda: deep_gemm.fp8_fp4_paged_mqa_logits(qp, cache, wp, ctxp, table, meta, 150),
        "hc_prenorm": lambda: deep_gemm.tf32_hc_prenorm_gemm(ah, bh, dh, sq),
    }


def test_memory_stays_flat_over_50_calls_of_every_family(rng):
    families = _families(rng)
    for name, run in families.items():
        for _ in range(3):
            run()  # compile, load, fill the memo caches
        # NOTES: a kernel compiled here is linked into native code in the background; the first call after the link
        # loads the library (one-off allocations): wait for it, so the measured calls all take the same path.
        wait_native_builds()
        tracemalloc.start()
        try:
            for _ in range(10):
                run()  # one-off allocations of a traced process (caches, free lists)
            gc.collect()
            start = tracemalloc.get_traced_memory()[0]
            for _ in range(50):
                out = run()
                del out
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - start
        finally:
            tracemalloc.stop()
        assert grown < 64 * 1024, f"{name}: {grown} bytes still allocated after 50 calls"


def test_returned_logits_are_freed_when_dropped(rng):
    families = _families(rng)
    for name in ("mqa_logits", "paged_mqa_logits"):
        logits = families[name]()
        base = logits.base if logits.base is not None else logits
        # NOTES: a core-pool worker may still be returning from its finished part of the launch, holding the
        # arguments until it gets the GIL back (jit/launch.py): give it the GIL for up to a second
        for _ in range(1000):
            if sys.getrefcount(base) == 3:
                break
            time.sleep(0.001)
        assert sys.getrefcount(base) == 3  # logits' own reference, this frame's and getrefcount's argument
        ref = weakref.ref(base)
        del logits, base
        gc.collect()
        assert ref() is None, f"{name}: the returned logits are still referenced"


# ---------------------------------------------------------------------------------------------------------------
# Scale dtypes: float8_e8m0fnu (torch's and OCP's MX scale type) wherever fp32 UE8M0 scales are taken


def test_e8m0_scales_give_the_bits_of_fp32_scales(rng):
    m, n, k = 64, 128, 256
    a, b = fp8_operand(rng, m, k), fp8_operand(rng, n, k)

    def e8m0(sf):
        return (sf.view(np.uint32) >> 23).astype(np.uint8).view(ml_dtypes.float8_e8m0fnu)

    d_fp32, d_e8m0 = np.empty((m, n), BF16), np.empty((m, n), BF16)
    deep_gemm.fp8_gemm_nt(a, b, d_fp32)
    deep_gemm.fp8_gemm_nt((a[0], e8m0(a[1])), (b[0], e8m0(b[1])), d_e8m0)
    np.testing.assert_array_equal(d_fp32.view(np.uint16), d_e8m0.view(np.uint16))
    # CUDA DeepGEMM's int32-packed form, in its MN-major TMA-aligned layout, at gran_k 32 and 128
    for gran_k in (32, 128):
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((n, k)).astype(np.float32)
        qa = per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=gran_k)
        qb = per_token_cast_to_fp8(w, use_ue8m0=True, gran_k=gran_k)
        pa = deep_gemm.get_mn_major_tma_aligned_packed_ue8m0_tensor(qa[1])
        pb = deep_gemm.get_mn_major_tma_aligned_packed_ue8m0_tensor(qb[1])
        assert pa.dtype == np.int32 and pa.shape == (m, -(-k // (4 * gran_k))) and pa.strides[0] == 4
        d_packed = np.empty((m, n), BF16)
        deep_gemm.fp8_gemm_nt(qa, qb, d_fp32, recipe=(1, 1, gran_k))
        deep_gemm.fp8_gemm_nt((qa[0], pa), (qb[0], pb), d_packed, recipe=(1, 1, gran_k))
        np.testing.assert_array_equal(d_fp32.view(np.uint16), d_packed.view(np.uint16))


def test_tma_layout_helpers():
    assert deep_gemm.get_tma_aligned_size(33, 4) == 36 and deep_gemm.get_tma_aligned_size(33, 2) == 40
    sf = np.arange(33 * 3, dtype=np.float32).reshape(33, 3)
    t = deep_gemm.get_mn_major_tma_aligned_tensor(sf)
    assert t.strides == (4, 4 * 36) and np.array_equal(t, sf)
    assert deep_gemm.get_mn_major_tma_aligned_tensor(t) is t
    grouped = np.full((6, 8), 2.0, np.float32)  # K groups of 128 and 64 at gran_k 32: 4 + 2 scale rows
    packed = deep_gemm.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(grouped, None, [128, 64], 32)
    assert packed.shape == (2, 8) and (packed[0].view(np.uint8) == 128).all()
    assert (packed[1].view(np.uint8).reshape(8, 4) == [128, 128, 0, 0]).all()  # a group packs on its own
    assert deep_gemm.get_num_locality_domains() == 1 and deep_gemm.localize(sf) is sf
