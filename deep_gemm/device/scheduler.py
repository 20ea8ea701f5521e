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
