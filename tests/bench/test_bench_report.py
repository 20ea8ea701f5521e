"""bench/report.py: docs/performance.md rewritten from perf_check's JSON, quoting every row as perf_check prints it
(its value formatted by perf_check's own Result.line, its detail text verbatim) and no figure the JSON does not hold;
the run's command and commit only when --run recorded them for this very JSON."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import perf_check  # noqa: E402
import report  # noqa: E402

ROWS = [
    {"name": "bf16-2048 vs numpy", "target": ">= 0.90x", "value": 2.0412, "unit": "x", "passed": True,
     "detail": "stand-in 39.7 ms | numpy 83.1 ms", "times": {"stand-in": 0.0397, "numpy": 0.0831}},
    {"name": "bf16-2048 FMA peak fraction", "target": ">= 0.65", "value": 0.41, "unit": "", "passed": False,
     "detail": "0.41 of 330.0 GFLOP/s", "times": {}},
    {"name": "startup", "target": "<= 0.3 s", "value": 0.1174, "unit": "s", "passed": True,
     "detail": "wall 0.150 s", "times": {}},
    {"name": "dispatch", "target": "<= 20 us", "value": 90.84, "unit": "us", "passed": False,
     "detail": "fp8_gemm m = 0 | vadd 21.7 us", "times": {}},
    {"name": "bf16-2048 vs JAX", "target": ">= 1.2x", "value": float("nan"), "unit": "x", "passed": None,
     "detail": "JAX not installed", "times": {}},
]
RECORD = {"machine": "2 vCPUs (test machine)", "load_average": 1.234, "torch": "2.13.0+cpu", "jax": None,
          "blocks": 3, "calls": 2, "rows": ROWS}


def _write(tmp_path, record=RECORD):
    path = tmp_path / "perf_check.json"
    path.write_text(json.dumps(record, allow_nan=True))
    return path


def test_values_are_formatted_as_perf_check_prints_them():
    for row in ROWS:
        fields = {k: row[k] for k in ("name", "target", "value", "unit", "passed", "detail")}
        line = perf_check.Result(**fields).line()
        shown = report.format_value(row["value"], row["unit"])
        assert shown in line.replace(" ", ""), (shown, line)


def test_page_quotes_every_row_and_no_other_figure(tmp_path):
    out = tmp_path / "performance.md"
    assert report.main(["--json", str(_write(tmp_path)), "--out", str(out)]) == 0
    page = out.read_text()
    table = [line for line in page.splitlines() if line.startswith("| ") and "verdict" not in line]
    assert len(table) == len(ROWS)
    for row, line in zip(ROWS, table, strict=True):
        assert row["name"] in line and row["target"] in line and row["detail"].replace("|", "\\|") in line
        assert report.VERDICTS[row["passed"]] in line
    # every number on the page is one of the JSON's (as printed) or of the fixed protocol text
    allowed = set(re.findall(r"\d+(?:\.\d+)?", json.dumps(RECORD)))
    allowed |= {report.format_value(r["value"], r["unit"]).rstrip("xus ") for r in ROWS} | {"1", "1.23", "4"}
    prose = re.sub(r"`[^`]*`", "", page)  # commands and paths are code, not figures
    for number in re.findall(r"(?<![\w.])\d+(?:\.\d+)?", prose):
        assert number in allowed, (number, page)
    assert "2/4 measured rows met their target; missed: bf16-2048 FMA peak fraction, dispatch; not measured: " \
           "bf16-2048 vs JAX" in page
    assert "command and commit not recorded" in page and "Load average at the end of the run: 1.23" in page


def test_run_record_is_used_only_for_the_json_it_describes(tmp_path):
    path = _write(tmp_path)
    run = {"command": "python bench/perf_check.py --json x", "commit": "abc1234", "dirty": False,
           "started": "2026-12-02 01:00", "finished": "2026-12-02 01:10",
           "json_sha256": __import__("hashlib").sha256(path.read_bytes()).hexdigest()}
    report.run_record_path(path).write_text(json.dumps(run))
    out = tmp_path / "performance.md"
    report.main(["--json", str(path), "--out", str(out)])
    assert "commit `abc1234`" in out.read_text()
    _write(tmp_path, {**RECORD, "load_average": 2.5})  # a later run written without --run
    report.main(["--json", str(path), "--out", str(out)])
    page = out.read_text()
    assert "abc1234" not in page and "command and commit not recorded" in page


def test_bad_input_is_refused_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "performance.md"
    for argv, message in (([], "no such file"), (["--bench-args", "--rows x"], "--bench-args needs --run")):
        with pytest.raises(SystemExit) as exc:
            report.main(["--json", str(tmp_path / "missing.json"), "--out", str(out), *argv])
        assert exc.value.code == 2 and message in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"machine": "x"}))
    with pytest.raises(SystemExit):
        report.main(["--json", str(bad), "--out", str(out)])
    assert "no 'rows' list" in capsys.readouterr().err
    assert not out.exists()


def test_protocol_line_says_how_each_block_warmed_up(tmp_path):
    # A record from before warm_ms existed discarded one call per block; a newer one says how long it discarded.
    out = tmp_path / "performance.md"
    report.main(["--json", str(_write(tmp_path)), "--out", str(out)])
    assert "- Protocol: 3 rounds of blocks of 1 discarded + 2 timed calls" in out.read_text()
    report.main(["--json", str(_write(tmp_path, {**RECORD, "warm_ms": 50})), "--out", str(out)])
    assert "- Protocol: 3 rounds of blocks of 50 ms of discarded calls + 2 timed calls" in out.read_text()
