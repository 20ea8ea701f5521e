"""The swizzled persistent schedule (deep_gemm.device.scheduler): a bijection over all tiles for any grid and core
count, row-major for small M, super-rows of group_m M-blocks, chunks of one wave, snake order on odd super-rows."""

from __future__ import annotations

import numpy as np
import pytest

from deep_gemm.device import scheduler


@pytest.mark.parametrize("num_cores", [1, 7, 24, 28, 32])
@pytest.mark.parametrize("group_m", [1, 2, 4])
def test_bijection(num_cores, group_m):
    for num_m in (1, 2, 3, 4, 5, 8, 9, 13):
        for num_n in (1, 3, 7, 8, 9, 16, 17, 33):
            order = scheduler.tile_order(num_m, num_n, group_m, num_cores)
            assert order[:, 0].min() >= 0 and order[:, 0].max() < num_m
            assert order[:, 1].min() >= 0 and order[:, 1].max() < num_n
            linear = order[:, 0] * num_n + order[:, 1]
            assert np.array_equal(np.sort(linear), np.arange(num_m * num_n)), (num_m, num_n)


def test_small_m_is_row_major():
    order = scheduler.tile_order(3, 5, 4, 32)
    np.testing.assert_array_equal(order, np.stack(np.divmod(np.arange(15), 5), axis=1))


def test_chunk_xor_and_snake():
    # 8 M-blocks x 16 N-blocks on 32 cores: 2 super-rows of 2 chunks (4 M x 8 N) each.
    order = scheduler.tile_order(8, 16, 4, 32)
    first_wave = order[:32]
    assert set(map(tuple, first_wave)) == {(m, n) for m in range(4) for n in range(8)}
    # M fastest inside a chunk, N XOR-ed by the M index
    for idx, (m, n) in enumerate(first_wave):
        assert m == idx % 4 and n == (idx // 4) ^ (idx % 4)
    # super-row 1 starts with the chunk where super-row 0 ended (N-blocks 8..15), then goes back to 0..7
    assert set(order[64:96, 1]) == set(range(8, 16)) and set(order[64:96, 0]) == {4, 5, 6, 7}
    assert set(order[96:128, 1]) == set(range(8)) and set(order[32:64, 1]) == set(range(8, 16))


def test_leftovers():
    # 6 M-blocks x 10 N-blocks on 32 cores: chunk_n 8, leftover N 2 (column-major), leftover M 2 (row-major)
    order = scheduler.tile_order(6, 10, 4, 32)
    tail_n = order[32:40]
    np.testing.assert_array_equal(tail_n, [[m, 8 + j] for j in range(2) for m in range(4)])
    tail_m = order[40:]
    np.testing.assert_array_equal(tail_m, [[4 + i, j] for i in range(2) for j in range(10)])


def test_tile_order_rejects_bad_sizes():
    with pytest.raises(ValueError, match="num_n_blocks=0"):
        scheduler.tile_order(2, 0)


# M-grouped schedule: only real tiles, none straddling two groups


def _covered_rows(order, block_m, n_blocks):
    """{(row, n_block)} covered by a grouped tile order (each tile: first row, N block, group, end row)."""
    covered = []
    for row0, nb, g, end in order.tolist():
        covered.extend((r, nb, g) for r in range(row0, min(row0 + block_m, end)))
    return covered


@pytest.mark.parametrize("block_m", [16, 64, 256])
@pytest.mark.parametrize("num_cores", [1, 7, 32])
def test_grouped_order_walks_exactly_the_real_rows(block_m, num_cores):
    starts = np.array([0, 256, 256, 512, 1024, 1280], np.int32)
    rows = np.array([5, 0, 1, 300, 0, 256], np.int32)  # empty groups, a 1-row group, one of 300 rows
    n_blocks = 3
    order = scheduler.grouped_tile_order(starts, rows, 1 << 20, n_blocks, block_m, 4, num_cores)
    expected_tiles = sum(-(-int(r) // block_m) for r in rows) * n_blocks
    assert len(order) == expected_tiles  # empty groups and padding cost nothing
    covered = _covered_rows(order, block_m, n_blocks)
    want = [(r, nb, g) for g, (s, n) in enumerate(zip(starts, rows, strict=True)) for r in range(s, s + n)
            for nb in range(n_blocks)]
    assert sorted(covered) == sorted(want)  # every real (row, N block) exactly once
    for row0, _, g, end in order.tolist():
        assert starts[g] <= row0 < end == starts[g] + rows[g]  # no M block straddles two groups


def test_grouped_rows_are_clamped_like_masked_m():
    # masked kind: group g at g * max_m, rows = masked_m[g] clamped to [0, max_m] (garbage cannot escape a group)
    max_m, block_m = 40, 16
    starts = np.arange(4, dtype=np.int32) * max_m
    masked_m = np.array([-3, 0, 99, 17], np.int32)
    order = scheduler.grouped_tile_order(starts, masked_m, max_m, 2, block_m, 4, 32)
    rows = {g: set() for g in range(4)}
    for row0, _, g, end in order.tolist():
        rows[g].update(range(row0, end if row0 + block_m > end else row0 + block_m))
    assert rows[0] == set() and rows[1] == set()
    assert rows[2] == set(range(80, 120)) and rows[3] == set(range(120, 137))


def test_grouped_order_inside_a_group_is_the_dense_order():
    order = scheduler.grouped_tile_order(np.array([0, 512], np.int32), np.array([512, 1024], np.int32), 1 << 20,
                                         16, 64, 4, 32)
    first = order[order[:, 2] == 0]
    dense = scheduler.tile_order(8, 16, 4, 32)
    np.testing.assert_array_equal(first[:, 0] // 64, dense[:, 0])
    np.testing.assert_array_equal(first[:, 1], dense[:, 1])


def test_padding_runs_are_exactly_the_rows_of_no_group():
    # groups in any order (CUDA DeepGEMM's per-row layout), empty ones, padding before, between and after them;
    # rows past max_rows are clamped away like masked_m
    starts = np.array([40, 0, 3, 100, 290, 7], np.int32)
    rows = np.array([1, 0, 37, 128, 99, -5], np.int32)
    max_rows, num_rows = 9, 300
    owned = np.zeros(num_rows, bool)
    for s, r in zip(starts, np.clip(rows, 0, max_rows), strict=True):
        owned[s:s + r] = True
    for chunk in (1, 16, 64, 300):
        padding = np.zeros(num_rows, bool)
        run = np.zeros(2, np.int32)
        for lo in range(0, num_rows, chunk):
            end, row = min(num_rows, lo + chunk), lo
            while row < end:
                scheduler.get_padding_run(row, end, starts, rows, len(starts), max_rows, run)
                assert row <= run[0] <= run[1] <= end and (run[0] < run[1] or run[0] == end)
                padding[run[0]:run[1]] = True
                row = run[1]
        np.testing.assert_array_equal(padding, ~owned)
