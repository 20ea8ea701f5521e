"""The persistent static block scheduler: which output tile (m_block, n_block) is the t-th in the swizzled order.

Core c of a launch takes tiles t = c, c + num_cores, c + 2 * num_cores, ... (no work queue, no atomics), so the
order decides which tiles run in the same wave and how well A and B panels stay in L2. Pure integer math.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..jit.numba_setup import apply_numba_settings

# NOTES: must run before the first @njit below can compile (numba reads it when building its CPU target).
apply_numba_settings()


@njit(cache=True)
def get_swizzled_block(t, num_m_blocks, num_n_blocks, group_m, num_cores, blk):
    """Scheduler::get_swizzled_block: blk[0], blk[1] = (m_block, n_block) of the t-th tile, 0 <= t < m_blks * n_blks.

    Fewer than ``group_m`` M-blocks: row-major (N fastest). Otherwise M-blocks form super-rows of ``group_m``; a
    super-row is cut into chunks of group_m x chunk_n tiles (chunk_n = num_cores // group_m, so a chunk is one wave
    of the cores), walked M-fastest with the N index XOR-ed by the M index inside the chunk (spreads the cores of a
    wave over distinct B panels). Odd super-rows walk their chunks right to left (snake: the B panels used last stay
    hot in L2) and start with the leftover N-blocks (num_n_blocks % chunk_n, column-major); even super-rows end with
    them. Leftover M-blocks (num_m_blocks % group_m) are walked row-major at the end. A bijection over all tiles.
    """
    if num_m_blocks < group_m:
        blk[0] = t // num_n_blocks
        blk[1] = t % num_n_blocks
        return
    super_row_tiles = group_m * num_n_blocks
    num_super_rows = num_m_blocks // group_m
    if t >= num_super_rows * super_row_tiles:
        rest = t - num_super_rows * super_row_tiles
        blk[0] = num_super_rows * group_m + rest // num_n_blocks
        blk[1] = rest % num_n_blocks
        return
    super_row = t // super_row_tiles
    idx = t % super_row_tiles
    chunk_n = max(num_cores // group_m, 1)
    num_chunks = num_n_blocks // chunk_n
    chunk_tiles = group_m * chunk_n
    leftover_tiles = super_row_tiles - num_chunks * chunk_tiles
    is_odd = (super_row & 1) == 1
    m_base = super_row * group_m
    # Leftover N-blocks: at the end of even super-rows, at the start of odd ones (next to where the snake turns).
    if is_odd:
        if idx < leftover_tiles:
            blk[0] = m_base + idx % group_m
            blk[1] = num_chunks * chunk_n + idx // group_m
            return
        idx -= leftover_tiles
    elif idx >= num_chunks * chunk_tiles:
        idx -= num_chunks * chunk_tiles
        blk[0] = m_base + idx % group_m
        blk[1] = num_chunks * chunk_n + idx // group_m
        return
    chunk = idx // chunk_tiles
    if is_odd:
        chunk = num_chunks - 1 - chunk
    local = idx % chunk_tiles
    m_local = local % group_m
    n_local = local // group_m
    # NOTES: XOR-ing by m_local only flips bits below the next power of two >= group_m; the result stays inside the
    # chunk (a bijection on [0, chunk_n)) only when chunk_n is a multiple of that power of two.
    span = 1
    while span < group_m:
        span <<= 1
    if chunk_n % span == 0:
        n_local ^= m_local
    blk[0] = m_base + m_local
    blk[1] = chunk * chunk_n + n_local


@njit(cache=True)
def _tile_order(num_m_blocks, num_n_blocks, group_m, num_cores, out):
    blk = np.empty(2, np.int64)
    for t in range(num_m_blocks * num_n_blocks):
        get_swizzled_block(t, num_m_blocks, num_n_blocks, group_m, num_cores, blk)
        out[t, 0] = blk[0]
        out[t, 1] = blk[1]


def tile_order(num_m_blocks: int, num_n_blocks: int, group_m: int = 4, num_cores: int = 32) -> np.ndarray:
    """The whole swizzled order as an int64 [num_tiles, 2] array of (m_block, n_block); row t is tile t.

    For tests, the cost model and plots; kernels call get_swizzled_block per tile.
    """
    for name, value in (("num_m_blocks", num_m_blocks), ("num_n_blocks", num_n_blocks), ("group_m", group_m),
                        ("num_cores", num_cores)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive int")
    out = np.empty((num_m_blocks * num_n_blocks, 2), np.int64)
    _tile_order(num_m_blocks, num_n_blocks, group_m, num_cores, out)
    return out


# ------------------------------------------------------------------------------------------------------------------
# M-grouped schedule (contiguous, masked and batched kinds)


@njit(cache=True)
def grouped_rows(group_rows, g, max_rows):
    """Rows group ``g`` really owns: group_rows[g] clamped to [0, max_rows] (a masked_m above max_m or below 0, even
    one changed on the device after the host checked it, can never make the kernel touch another group's rows)."""
    rows = group_rows[g]
    if rows < 0:
        return 0
    return min(rows, max_rows)


@njit(cache=True)
def get_grouped_num_tiles(group_rows, num_groups, max_rows, num_n_blocks, block_m):
    """Real output tiles of an M-grouped launch: sum over groups of ceil(rows_g / BLOCK_M) x N-blocks.

    Read by every core from device memory at kernel start (``group_rows`` is masked_m for the masked kind), so an
    empty group, the padding between groups and the rows past masked_m give no tile at all.
    """
    total = 0
    for g in range(num_groups):
        rows = grouped_rows(group_rows, g, max_rows)
        total += (rows // block_m + (rows % block_m != 0)) * num_n_blocks
    return total


@njit(cache=True)
def get_grouped_block(t, group_start, group_rows, num_groups, max_rows, num_n_blocks, block_m, group_m, num_cores,
                      blk):
    """The t-th real tile of an M-grouped launch, 0 <= t < get_grouped_num_tiles(...). Writes
    blk[0] = first row (global row of A and D), blk[1] = N-block, blk[2] = group, blk[3] = the group's end row.

    Groups are walked in order; inside a group its ceil(rows / BLOCK_M) x N-blocks tiles follow the dense swizzle
    (``get_swizzled_block``; a huge ``group_m`` gives row-major, the stream path). M-blocks start at the group's
    first row, so none straddles two groups, and the last one of a group is cut at the group's end row.
    """
    for g in range(num_groups):
        rows = grouped_rows(group_rows, g, max_rows)
        mb = rows // block_m + (rows % block_m != 0)
        tiles = mb * num_n_blocks
        if t < tiles:
            get_swizzled_block(t, mb, num_n_blocks, group_m, num_cores, blk)
            start = group_start[g]
            blk[0] = start + blk[0] * block_m
            blk[2] = g
            blk[3] = start + rows
            return
        t -= tiles
    blk[0] = -1
    blk[1] = -1
    blk[2] = -1
    blk[3] = -1


@njit(cache=True)
def get_padding_run(row, end, group_start, group_rows, num_groups, max_rows, run):
    """The first run of padding rows in [row, end) of an M-grouped launch: writes run[0] = its first row, run[1] =
    its end (the next group's first row, or ``end``); run[0] = run[1] = end when every row there belongs to a group.

    A row is padding when no group's [group_start[g], group_start[g] + rows_g) holds it (rows_g clamped as
    ``grouped_rows``). Groups may come in any order (CUDA DeepGEMM's per-row layout) but never overlap. Read from
    GM by the cores that own a chunk of rows when the kernel zeroes the padding (ensure_zero_padding).
    """
    r = row
    while r < end:
        owner_end = -1
        for g in range(num_groups):
            rows = grouped_rows(group_rows, g, max_rows)
            start = group_start[g]
            if rows > 0 and start <= r < start + rows:
                owner_end = start + rows
                break
        if owner_end < 0:
            break
        r = owner_end
    if r >= end:
        run[0] = end
        run[1] = end
        return
    stop = end
    for g in range(num_groups):
        start = group_start[g]
        if grouped_rows(group_rows, g, max_rows) > 0 and r < start < stop:
            stop = start
    run[0] = r
    run[1] = stop

@njit(cache=True)
def _grouped_tile_order(group_start, group_rows, num_groups, max_rows, num_n_blocks, block_m, group_m, num_cores,
                        out):
    blk = np.empty(4, np.int64)
    for t in range(out.shape[0]):
        get_grouped_block(t, group_start, group_rows, num_groups, max_rows, num_n_blocks, block_m, group_m,
                          num_cores, blk)
        for j in range(4):
            out[t, j] = blk[j]


def grouped_tile_order(group_start: np.ndarray, group_rows: np.ndarray, max_rows: int, num_n_blocks: int,
                       block_m: int, group_m: int = 4, num_cores: int = 32) -> np.ndarray:
    """Every real tile of an M-grouped launch in schedule order, int64 [num_tiles, 4]: (first row, N-block, group,
    group end row). For tests and plots; kernels call get_grouped_num_tiles / get_grouped_block."""
    starts = np.ascontiguousarray(group_start, dtype=np.int32)
    rows = np.ascontiguousarray(group_rows, dtype=np.int32)
    if starts.shape != rows.shape or starts.ndim != 1:
        raise ValueError(f"group_start and group_rows must be 1-D of one length: {starts.shape=} {rows.shape=}")
    for name, value in (("max_rows", max_rows), ("num_n_blocks", num_n_blocks), ("block_m", block_m),
                        ("group_m", group_m), ("num_cores", num_cores)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < (0 if name == "max_rows"
                                                                                            else 1):
            raise ValueError(f"{name}={value!r} must be a positive int")
    num = get_grouped_num_tiles(rows, len(rows), max_rows, num_n_blocks, block_m)
    out = np.empty((num, 4), np.int64)
    _grouped_tile_order(starts, rows, len(rows), max_rows, num_n_blocks, block_m, group_m, num_cores, out)
    return out
