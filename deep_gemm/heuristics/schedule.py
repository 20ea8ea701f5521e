"""The persistent tile schedule in pure Python: where a tile falls in the swizzled order (and back), for the cost
model's L2 reasoning and for tests. Same order as ``deep_gemm.device.scheduler`` (which kernels run), no numba.
"""

from __future__ import annotations


def swizzled_block(t: int, num_m_blocks: int, num_n_blocks: int, group_m: int, num_cores: int) -> tuple[int, int]:
    """(m_block, n_block) of the ``t``-th tile of one region in the scheduler's order.

    Fewer than ``group_m`` M-blocks: row-major. Otherwise super-rows of ``group_m`` M-blocks cut into chunks of
    group_m x (num_cores // group_m) tiles (one wave), M fastest with N XOR-ed by the M index inside a chunk; odd
    super-rows walk their chunks right to left and start with the leftover N-blocks (column-major), even ones
    end with them; leftover M-blocks go last, row-major.
    """
    mb, nb, g = num_m_blocks, num_n_blocks, group_m
    if mb < g:
        return t // nb, t % nb
    super_row_tiles = g * nb
    num_super_rows = mb // g
    if t >= num_super_rows * super_row_tiles:
        rest = t - num_super_rows * super_row_tiles
        return num_super_rows * g + rest // nb, rest % nb
    super_row, idx = divmod(t, super_row_tiles)
    chunk_n = max(num_cores // g, 1)
    num_chunks = nb // chunk_n
    chunk_tiles = g * chunk_n
    leftover_tiles = super_row_tiles - num_chunks * chunk_tiles
    odd = super_row % 2 == 1
    m_base = super_row * g
    if odd:
        if idx < leftover_tiles:
            return m_base + idx % g, num_chunks * chunk_n + idx // g
        idx -= leftover_tiles
    elif idx >= num_chunks * chunk_tiles:
        idx -= num_chunks * chunk_tiles
        return m_base + idx % g, num_chunks * chunk_n + idx // g
    chunk, local = divmod(idx, chunk_tiles)
    if odd:
        chunk = num_chunks - 1 - chunk
    m_local, n_local = local % g, local // g
    if chunk_n % _xor_span(g) == 0:
        n_local ^= m_local
    return m_base + m_local, chunk * chunk_n + n_local


def _xor_span(group_m: int) -> int:
    span = 1
    while span < group_m:
        span <<= 1
    return span


def swizzled_index(m: int, n: int, num_m_blocks: int, num_n_blocks: int, group_m: int, num_cores: int) -> int:
    """Inverse of ``swizzled_block``: the position of tile (m, n) in the region's order."""
    mb, nb, g = num_m_blocks, num_n_blocks, group_m
    if mb < g:
        return m * nb + n
    num_super_rows = mb // g
    if m >= num_super_rows * g:
        return num_super_rows * g * nb + (m - num_super_rows * g) * nb + n
    super_row, m_local = divmod(m, g)
    base = super_row * g * nb
    chunk_n = max(num_cores // g, 1)
    num_chunks = nb // chunk_n
    chunk_tiles = g * chunk_n
    leftover_tiles = g * nb - num_chunks * chunk_tiles
    odd = super_row % 2 == 1
    if n >= num_chunks * chunk_n:
        idx = (n - num_chunks * chunk_n) * g + m_local
        return base + (idx if odd else num_chunks * chunk_tiles + idx)
    chunk, n_local = divmod(n, chunk_n)
    if chunk_n % _xor_span(g) == 0:
        n_local ^= m_local
    local = n_local * g + m_local
    pos = num_chunks - 1 - chunk if odd else chunk
    return base + (leftover_tiles if odd else 0) + pos * chunk_tiles + local
