"""The sweep's results.csv: the one schema every mode writes (documented in sweep.py), a whole-rows-only writer,
and a reader that resumes from (or summarizes) a file, keeping the last row per key.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable
from pathlib import Path

from shapes import arithmetic_intensity, gemm_bytes, gemm_flops

COLUMNS: tuple[str, ...] = (
    "mode", "dtype", "m", "n", "k", "arch", "num_ai_cores", "status", "error",
    "flops", "bytes", "intensity", "peak_gflops", "bandwidth_gbs", "ridge", "compute_bound",
    "time_us", "gflops", "frac_peak", "frac_attainable", "bound",
    "baseline_time_us", "baseline_gflops", "baseline_frac_peak", "speedup", "calc_diff", "repeats",
    "config", "spread", "over_peak", "host", "cpu_model",
)
STATUSES = ("ok", "skipped", "failed")
INT_COLUMNS = ("m", "n", "k", "num_ai_cores", "flops", "bytes", "compute_bound", "repeats", "over_peak")
FLOAT_COLUMNS = (
    "intensity", "peak_gflops", "bandwidth_gbs", "ridge", "time_us", "gflops", "frac_peak", "frac_attainable",
    "baseline_time_us", "baseline_gflops", "baseline_frac_peak", "speedup", "calc_diff", "spread",
)

Key = tuple[str, str, int, int, int]


def row_key(row: dict) -> Key:
    return (str(row["mode"]), str(row["dtype"]), int(row["m"]), int(row["n"]), int(row["k"]))


def format_value(value: object) -> str:
    """CSV text of one cell: empty for None/NaN, 6 significant digits for floats, str() otherwise."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:.6g}"
    return str(value)


def config_to_str(config: object) -> str:
    """A GemmConfig (or anything with to_dict / a dict) as "field=value ..." in field order; "" for None."""
    if config is None:
        return ""
    fields = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    return " ".join(f"{key}={value}" for key, value in fields.items())


class ResultsWriteError(RuntimeError):
    """A row (or the header) could not be written; the file is as it was before that write (no partial line)."""


def csv_line(cells: Iterable[object]) -> str:
    """One CSV record, newline included, exactly as csv.writer writes it."""
    buf = io.StringIO()
    csv.writer(buf).writerow(cells)
    return buf.getvalue()


class ResultsWriter:
    """Appends rows to results.csv, each one whole or not at all, so an interrupted or failed sweep keeps every
    finished row and never leaves a partial last line.

    ``fresh=True`` starts a new file (an existing one is renamed to results.csv.bak first); otherwise rows are
    appended to the existing file, whose header must be this schema's. Each row is one write of its complete line,
    then fsync; a failed write (a full disk, an I/O error) truncates the file back to its size before that row and
    raises ResultsWriteError. ``rows_written`` counts the rows this writer finished.
    """

    def __init__(self, path: str | Path, *, fresh: bool) -> None:
        self.path = Path(path)
        self.rows_written = 0
        self._fd: int | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if fresh and self.path.exists():
                os.replace(self.path, self.path.with_name(self.path.name + ".bak"))
            needs_header = not self.path.exists() or self.path.stat().st_size == 0
            if not needs_header:
                check_header(self.path)
                _ensure_trailing_newline(self.path)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise ResultsWriteError(f"cannot open {self.path} for writing: {e.strerror or e}") from None
        if needs_header:
            self._append(csv_line(COLUMNS), "the header")

    def _append(self, line: str, what: str) -> None:
        data = memoryview(line.encode())
        start = os.fstat(self._fd).st_size
        try:
            while data:
                data = data[os.write(self._fd, data):]
            os.fsync(self._fd)
        except OSError as e:
            # NOTES: a short write (full disk) may have landed part of the line; cut it off so the file ends with
            # the last complete row, as a resumed sweep expects.
            try:
                os.ftruncate(self._fd, start)
            except OSError:
                pass
            raise ResultsWriteError(f"could not write {what} to {self.path}: {e.strerror or e}") from None

    def write(self, row: dict) -> None:
        unknown = set(row) - set(COLUMNS)
        if unknown:
            raise ValueError(f"row has columns outside the schema: {sorted(unknown)}")
        if row.get("status") not in STATUSES:
            raise ValueError(f"row status={row.get('status')!r} must be one of {STATUSES}")
        what = f"the row of {row.get('mode')} {row.get('dtype')} {row.get('m')}x{row.get('n')}x{row.get('k')}"
        self._append(csv_line(format_value(row.get(c)) for c in COLUMNS), what)
        self.rows_written += 1

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_header(path: str | Path) -> None:
    """Raise ValueError if the file's first line is not this schema's header."""
    with open(path, newline="") as f:
        header = next(csv.reader(f), None)
    if header is None or tuple(header) != COLUMNS:
        raise ValueError(
            f"{path} has header {header!r}, not the sweep's schema {list(COLUMNS)!r}: "
            "write to another --out directory (or delete the file)"
        )


def _ensure_trailing_newline(path: Path) -> None:
    # NOTES: a sweep killed mid-write can leave a partial last line; appending must not glue a row onto it.
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) != b"\n":
            f.write(b"\n")


def parse_row(raw: dict) -> dict:
    """Typed copy of one CSV row: ints and floats parsed, empty numeric cells as None."""
    row: dict = {}
    for col in COLUMNS:
        text = raw.get(col)
        text = "" if text is None else text
        if col in INT_COLUMNS:
            row[col] = int(text) if text != "" else None
        elif col in FLOAT_COLUMNS:
            row[col] = float(text) if text != "" else None
        else:
            row[col] = text
    return row


def read_results(path: str | Path) -> list[dict]:
    """Every complete row of a results.csv (typed), last row per key kept, in file order of those last rows.

    Rows cut short by an interruption (missing cells or an unknown status) are ignored."""
    path = Path(path)
    if not path.exists():
        return []
    check_header(path)
    latest: dict[Key, dict] = {}
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            if raw.get("status") not in STATUSES or None in raw.values() or None in raw:
                continue
            try:
                row = parse_row(raw)
                key = row_key(row)
            except (TypeError, ValueError):
                continue
            latest.pop(key, None)
            latest[key] = row
    return list(latest.values())


def compact_results(path: str | Path) -> int:
    """Rewrite ``path`` with one row per key, the newest (a retried shape's row replaces its failed one), in the
    order read_results gives; returns how many lines were dropped (0: the file is left untouched).

    The new file is written beside the old one, fsynced and renamed over it, so an interruption or a failed write
    leaves either file whole; OSError leaves the old one (whose readers keep the newest row anyway)."""
    path = Path(path)
    if not path.exists():
        return 0
    check_header(path)
    latest: dict[Key, list[str]] = {}
    records = 0
    with open(path, newline="") as f:
        reader = csv.reader(f)
        next(reader, None)
        for cells in reader:
            records += 1
            if len(cells) != len(COLUMNS):
                continue
            raw = dict(zip(COLUMNS, cells, strict=True))
            if raw["status"] not in STATUSES:
                continue
            try:
                key = row_key(parse_row(raw))
            except (TypeError, ValueError):
                continue
            latest.pop(key, None)
            latest[key] = cells  # NOTES: the cells as written: nothing is re-formatted
    dropped = records - len(latest)
    if dropped <= 0:
        return 0
    tmp = path.with_name(f".{path.name}.compact-{os.getpid()}")
    try:
        with open(tmp, "w", newline="") as f:
            f.write(csv_line(COLUMNS))
            for cells in latest.values():
                f.write(csv_line(cells))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return dropped


def done_keys(rows: Iterable[dict]) -> set[Key]:
    """Keys a resumed sweep skips: rows that finished ("ok") or were skipped for a reason that still holds.

    NOTES: failed rows are retried; their new row supersedes the old one (read_results keeps the last, and
    compact_results drops the old one from the file when the run ends)."""
    return {row_key(r) for r in rows if r["status"] in ("ok", "skipped")}


def new_row(mode: str, dtype: str, m: int, n: int, k: int, *, arch: str, num_ai_cores: int, peak_flops: float,
            bandwidth_bytes_s: float) -> dict:
    """A row with the shape's roofline columns filled: flops, bytes, intensity, the machine's peak (GFLOP/s),
    bandwidth (GB/s), ridge (FLOP/B) and whether the shape is compute-bound there. Status starts as "ok"."""
    intensity = arithmetic_intensity(m, n, k, dtype)
    ridge = peak_flops / bandwidth_bytes_s
    return {
        "mode": mode, "dtype": dtype, "m": m, "n": n, "k": k, "arch": arch, "num_ai_cores": num_ai_cores,
        "status": "ok", "error": "",
        "flops": gemm_flops(m, n, k), "bytes": gemm_bytes(m, n, k, dtype), "intensity": intensity,
        "peak_gflops": peak_flops / 1e9, "bandwidth_gbs": bandwidth_bytes_s / 1e9, "ridge": ridge,
        "compute_bound": int(intensity > ridge),
    }


def set_performance(row: dict, time_s: float, baseline_time_s: float | None = None) -> dict:
    """Fill time_us, gflops, frac_peak, frac_attainable, over_peak (and the baseline's columns and speedup)."""
    peak = row["peak_gflops"] * 1e9
    attainable = min(peak, row["intensity"] * row["bandwidth_gbs"] * 1e9)
    flops_s = row["flops"] / time_s
    row.update(time_us=time_s * 1e6, gflops=flops_s / 1e9, frac_peak=flops_s / peak,
               frac_attainable=flops_s / attainable, over_peak=int(flops_s > peak))
    if baseline_time_s is not None:
        base_flops_s = row["flops"] / baseline_time_s
        row.update(baseline_time_us=baseline_time_s * 1e6, baseline_gflops=base_flops_s / 1e9,
                   baseline_frac_peak=base_flops_s / peak, speedup=baseline_time_s / time_s)
    return row


def describe_error(e: BaseException) -> str:
    """One line: exception type and message, newlines collapsed, capped at 300 characters."""
    text = f"{type(e).__name__}: {e}".replace("\r", " ").replace("\n", " | ")
    return text if len(text) <= 300 else text[:297] + "..."
