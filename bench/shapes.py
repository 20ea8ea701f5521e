"""The 1,055 GEMM shapes of the sweep (a 10x10x10 grid plus 55 DeepSeek layer shapes), a stratified quick subset,
a reader for user shape files, and the per-shape arithmetic (FLOPs, compulsory bytes, arithmetic intensity).

Pure Python: no numpy, no deep_gemm. Shapes are (M, N, K) for D[M, N] = A[M, K] @ B[N, K]^T.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

Shape = tuple[int, int, int]

# NOTES: every grid value is a multiple of 256, so no shape of set G has a fractal or base-tile tail; the set
# spans memory-bound (thin) to strongly compute-bound (16384^3) problems.
GRID_VALUES: tuple[int, ...] = (256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384)

# (N, K) of DeepSeek V3/V4 projections: MLA q_a+kv_a, q_b, kv_b, o_proj, MoE gate+up/down (V3 and V4-class),
# kv_a alone, and the V3 dense layers' gate+up/down.
DEEPSEEK_NK: tuple[tuple[int, int], ...] = (
    (2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048),
    (576, 7168), (6144, 7168), (7168, 3072), (36864, 7168), (7168, 18432),
)
# Decode-ish to long prefill.
DEEPSEEK_M: tuple[int, ...] = (128, 512, 1024, 4096, 16384)

NUM_SHAPES = len(GRID_VALUES) ** 3 + len(DEEPSEEK_NK) * len(DEEPSEEK_M)  # 1,055

# Bytes per element on the chip (and in the stand-in's GM): operands, UE8M0 scale per 32 K elements, output.
OPERAND_BYTES = {"bf16": 2, "fp8": 1}
OUT_BYTES = 2  # bf16 D
SF_GRAN_K = 32


def grid_shapes() -> list[Shape]:
    """Set G: every (M, N, K) with each dim in GRID_VALUES, M-major then N then K, ascending (1,000 shapes)."""
    return [(m, n, k) for m in GRID_VALUES for n in GRID_VALUES for k in GRID_VALUES]


def deepseek_shapes() -> list[Shape]:
    """Set D: the 11 DeepSeek (N, K) pairs, each with M in DEEPSEEK_M (55 shapes), pair by pair."""
    return [(m, n, k) for n, k in DEEPSEEK_NK for m in DEEPSEEK_M]


def all_shapes() -> list[Shape]:
    """The full sweep: set G then set D, 1,055 distinct shapes."""
    return grid_shapes() + deepseek_shapes()


# NOTES: the quick subset is hand-picked per stratum rather than sampled, so that its cost is known. Compiling
# dominates a cold run: each distinct (N, K, config) is one kernel (~7-11 s of numba per kernel on this machine kind,
# after ~30 s of shared device code), so the subset keeps to ~10 kernels per dtype (two shapes share N=K=2048) and
# about 0.2 TFLOP per dtype: one warm-up plus three timed calls of the stand-in (~50-100 GFLOP/s) and of the numpy
# baseline (~130) for both dtypes is 1-2 minutes of GEMM work. Strata, by the 950DT roofline (BF16 ridge ~124
# FLOP/B, FP8 ~247) and by M: tiny, tall-thin (output-bound), deep K, small M against a large weight, squares
# (power of two and not), a large compute-bound shape, and DeepSeek decode (M=128), mid and prefill shapes.
QUICK_SHAPES: tuple[Shape, ...] = (
    # grid: tiny, tall and thin, deep K, small M x large weight
    (256, 256, 256),
    (16384, 256, 256),
    (512, 512, 16384),
    (256, 4096, 4096),
    # grid: squares and a taller shape sharing their kernel, compute-bound
    (2048, 2048, 2048),
    (4096, 2048, 2048),
    (3072, 3072, 3072),
    # DeepSeek: decode-like M=128 (memory-bound on the chip), mid M, prefill
    (128, 2112, 7168),
    (128, 7168, 2048),
    (512, 24576, 1536),
    (1024, 7168, 2048),
)


def quick_shapes() -> list[Shape]:
    """The stratified quick subset (11 shapes, all from the full set): see the NOTES above for how it was sized."""
    return list(QUICK_SHAPES)


# NOTES: the kernels index every dim as a uint32 (templates/*.asc.j2; deep_gemm.api refuses larger dims too).
MAX_DIM = 2**32 - 1


def load_shapes(path: str | Path) -> list[Shape]:
    """Read shapes from a file: CSV (or whitespace-separated) with an m,n,k header (any case; other columns
    ignored), or lines of three
    integers "M N K" separated by spaces, tabs or commas. Blank lines and lines starting with # are skipped; a UTF-8
    byte-order mark is ignored. Duplicates are dropped (first occurrence kept). Raises ValueError (one line, naming
    the file, and the line number and text for bad data) for a missing, unreadable or non-text file, a header
    without m, n, k, or a data line that is not three integers in [1, 2^32 - 1]."""
    path = Path(path)
    text = _read_text(path)
    lines = [(i + 1, line.strip()) for i, line in enumerate(text.splitlines())]
    lines = [(no, line) for no, line in lines if line and not line.startswith("#")]
    shapes: list[Shape] = []
    columns = _header_columns(lines[0][1], path, lines[0][0]) if lines else None
    if columns is not None:
        width = max(columns) + 1
        for no, line in lines[1:]:
            cells = next(csv.reader([line])) if "," in line else line.split()
            if len(cells) < width:
                raise ValueError(f"{path}:{no}: expected {width} cells (m, n, k at columns "
                                 f"{[c + 1 for c in columns]}), got {len(cells)}: {line!r}")
            shapes.append(_parse_shape([cells[c] for c in columns], path, no, line))
    else:
        for no, line in lines:
            shapes.append(_parse_shape(line.replace(",", " ").split(), path, no, line))
    if not shapes:
        raise ValueError(f"{path}: no shapes found")
    return list(dict.fromkeys(shapes))


def _read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such shapes file") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a directory, not a shapes file") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot read the shapes file: {e.strerror or e}") from None
    try:
        return raw.decode("utf-8-sig")  # NOTES: "-sig" drops the byte-order mark spreadsheet exports put first
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start}: {raw[e.start:e.start + 1]!r})") from None


def _is_int(cell: str) -> bool:
    return cell.strip().lstrip("+-").isdigit()


def _header_columns(line: str, path: Path, line_no: int) -> tuple[int, int, int] | None:
    """The (m, n, k) column indices if ``line`` is a CSV header, None if it is a data line. A header has no
    integer cell; a line mixing integers and other text is bad data (reported by the data parser, with its line)."""
    cells = next(csv.reader([line])) if "," in line else line.split()
    if any(_is_int(c) for c in cells):
        return None
    names = [c.strip().lower() for c in cells]
    if not {"m", "n", "k"} <= set(names):
        raise ValueError(f"{path}:{line_no}: header {cells!r} lacks m, n, k columns")
    return names.index("m"), names.index("n"), names.index("k")


def _parse_shape(parts: list[str], path: Path, line_no: int, line: str) -> Shape:
    if len(parts) != 3:
        raise ValueError(f"{path}:{line_no}: expected 3 integers M N K, got {len(parts)} fields: {line!r}")
    if not all(_is_int(p) for p in parts):
        raise ValueError(f"{path}:{line_no}: not integers: {line!r}")
    if any(len(p.strip().lstrip("+-")) > 20 for p in parts):
        raise ValueError(f"{path}:{line_no}: a dim exceeds {MAX_DIM} (2^32 - 1), the largest dim the kernels index: "
                         f"{line[:60]!r}{'...' if len(line) > 60 else ''}")
    m, n, k = (int(str(p).strip()) for p in parts)
    if min(m, n, k) < 1:
        raise ValueError(f"{path}:{line_no}: dims must be >= 1, got {m=} {n=} {k=}: {line!r}")
    for name, value in (("m", m), ("n", n), ("k", k)):
        if value > MAX_DIM:
            raise ValueError(f"{path}:{line_no}: {name}={value} exceeds {MAX_DIM} (2^32 - 1), the largest dim the "
                             f"kernels index: {line!r}")
    return (m, n, k)


def gemm_flops(m: int, n: int, k: int) -> int:
    """2MNK: one multiply and one add per (m, n, k)."""
    return 2 * m * n * k


def gemm_bytes(m: int, n: int, k: int, dtype: str) -> int:
    """Compulsory traffic of one GEMM: A and B read once at their dtype, D written once in bf16; for FP8 also the
    UE8M0 scales (one byte per 32 K elements per row of A and of B)."""
    if dtype not in OPERAND_BYTES:
        raise ValueError(f"{dtype=} must be one of {sorted(OPERAND_BYTES)}")
    size = OPERAND_BYTES[dtype] * (m + n) * k + OUT_BYTES * m * n
    if dtype == "fp8":
        size += (m + n) * math.ceil(k / SF_GRAN_K)
    return size


def arithmetic_intensity(m: int, n: int, k: int, dtype: str) -> float:
    """I = 2MNK / gemm_bytes (FLOP per byte)."""
    return gemm_flops(m, n, k) / gemm_bytes(m, n, k, dtype)
