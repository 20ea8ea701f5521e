"""bench/attention_bench.py without timing anything: its numpy peers compute the indexer's logits and the HC pre-norm
(checked against direct float64 loops on tiny shapes, -inf masks included), its torch peers compute the same, a row
prints torch at its default and best thread count, the best peer and issue 28's target, and its command line
refuses bad arguments before anything runs. The bench itself (minutes of CPU) is not run here."""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import attention_bench as ab  # noqa: E402

from deep_gemm.utils import E4M3_DECODE_TABLE  # noqa: E402


def _score(qf, kvf, w):
    return sum(max(0.0, float(qf[h] @ kvf)) * w[h] for h in range(len(w)))


def test_numpy_ragged_logits_matches_a_loop(rng):
    s, s_kv, h, d = 11, 70, 4, 16  # Q_CHUNK = 8: a full chunk and a short one
    q, kv = ab._fp8(rng, (s, h, d)), ab._fp8(rng, (s_kv, d))
    kv_scale = np.ldexp(np.float32(1), rng.integers(-6, -2, size=s_kv)).astype(np.float32)
    w = rng.standard_normal((s, h)).astype(ml_dtypes.bfloat16)
    ks = rng.integers(0, 30, size=s).astype(np.int32)
    ke = (ks + rng.integers(0, 40, size=s)).astype(np.int32)  # some rows empty
    ke[0] = ks[0]
    got = ab.numpy_ragged_logits(q, kv, kv_scale, w, ks, ke)
    qf = E4M3_DECODE_TABLE[q.view(np.uint8)].astype(np.float64)
    kvf = E4M3_DECODE_TABLE[kv.view(np.uint8)].astype(np.float64) * kv_scale[:, None]
    for i in range(s):
        for j in range(s_kv):
            if ks[i] <= j < ke[i]:
                assert got[i, j] == pytest.approx(_score(qf[i], kvf[j], w[i].astype(np.float64)), rel=1e-5, abs=1e-4)
            else:
                assert got[i, j] == -np.inf


def test_numpy_paged_logits_reads_the_cuda_page_layout(rng, monkeypatch):
    monkeypatch.setattr(ab, "NUM_HEADS", 4)
    monkeypatch.setattr(ab, "HEAD_DIM", 16)
    q, cache, w, ctx, table, max_ctx = ab.paged_inputs(rng, 3, 100)
    got = ab.numpy_paged_logits(q, cache, w, ctx, table, max_ctx)
    assert got.shape == (3, max_ctx)
    page = ab.PAGE_SIZE
    for b in range(3):
        qf = E4M3_DECODE_TABLE[q[b, 0].view(np.uint8)].astype(np.float64)
        for j in range(max_ctx):
            if j >= ctx[b, 0]:
                assert got[b, j] == -np.inf
                continue
            flat = cache[table[b, j // page]].reshape(-1)
            codes = flat[(j % page) * 16:(j % page + 1) * 16]
            scale = flat[page * 16 + 4 * (j % page):page * 16 + 4 * (j % page) + 4].view(np.float32)[0]
            kvf = E4M3_DECODE_TABLE[codes].astype(np.float64) * scale
            assert got[b, j] == pytest.approx(_score(qf, kvf, w[b].astype(np.float64)), rel=1e-5, abs=1e-4)


def test_numpy_hc_prenorm(rng):
    a, b = ab.hc_inputs(rng, 5, 8, 64)
    d, s = ab.numpy_hc_prenorm(a, b)
    af = a.astype(np.float64)
    np.testing.assert_allclose(d, af @ b.astype(np.float64).T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s, (af ** 2).sum(1), rtol=1e-6)


@pytest.mark.parametrize(("argv", "match"), [(["--blocks", "0"], "--blocks must be >= 1"),
                                             (["--calls", "-2"], "--calls must be >= 1"),
                                             (["--rows", "nope"], "unknown row kind")])
def test_bad_arguments_are_refused(argv, match, capsys):
    with pytest.raises(SystemExit) as exc:
        ab.main(argv)
    assert exc.value.code == 2 and match in capsys.readouterr().err


def test_help_describes_the_protocol(capsys):
    with pytest.raises(SystemExit):
        ab.main(["--help"])
    out = capsys.readouterr().out
    for words in ("own steady state", "back-to-back", "discarded", "median of its block figures", "--quick"):
        assert words in out


# ---------------------------------------------------------------------------------------------------------------
# The torch peers and columns
# ---------------------------------------------------------------------------------------------------------------
def test_torch_peers_compute_the_numpy_peers_problem(rng, monkeypatch):
    pytest.importorskip("torch", reason="the torch peer is the optional `torch` extra")
    monkeypatch.setattr(ab, "NUM_HEADS", 4)
    monkeypatch.setattr(ab, "HEAD_DIM", 16)
    ragged = ab.ragged_inputs(rng, 11, 70)  # Q_CHUNK = 8: a full chunk and a short one
    assert ab._finite_diff(ab.torch_ragged_logits(*ragged)().numpy(), ab.numpy_ragged_logits(*ragged)) < 1e-10
    paged = ab.paged_inputs(rng, 3, 100)
    got = ab.torch_paged_logits(*paged)().numpy()
    assert got.shape == (3, paged[5]) and ab._finite_diff(got, ab.numpy_paged_logits(*paged)) < 1e-10
    a, b = ab.hc_inputs(rng, 5, 8, 64)
    (d, s), (d_ref, s_ref) = ab.torch_hc_prenorm(a, b)(), ab.numpy_hc_prenorm(a, b)
    np.testing.assert_allclose(d.numpy(), d_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s.numpy(), s_ref, rtol=1e-6)


def test_rows_print_torch_the_best_peer_and_the_target(capsys):
    from deep_gemm.testing import SteadyTiming

    assert ab.target_for("ragged", (32, 16384)) == 3.0 and ab.target_for("ragged", (64, 16384)) is None
    assert ab.target_for("paged", (16, 4096)) == 3.0 and ab.target_for("paged", (4, 8192)) is None
    assert ab.target_for("hc", (16, 24, 28672)) == 1.5 and ab.target_for("hc", (256, 24, 28672)) == 1.5
    assert ab.target_for("hc", (1024, 24, 28672)) is None
    blocks = {"stand-in": (1.0, 1.0), "numpy": (6.0, 6.0), "torch": (4.0, 4.0), "torch-1t": (2.0, 3.0)}
    f = ab.row_figures(SteadyTiming(blocks), blocks)
    assert f["x_numpy"] == 6.0 and f["x_torch"] == 4.0 and f["x_best"] == 2.5 and f["jax_ms"] is None
    assert f["torch_best_threads"] == 1 and f["torch_best_ms"] == 2.5e3
    ab._print_row("row", SteadyTiming(blocks), blocks, None, "1.0", target=3.0)
    line = capsys.readouterr().out
    assert "2500.00@1t" in line and ">=3.0x MISS" in line
    ab._print_row("row", SteadyTiming(blocks), blocks, None, "1.0", target=2.0)
    assert ">=2.0x ok" in capsys.readouterr().out
