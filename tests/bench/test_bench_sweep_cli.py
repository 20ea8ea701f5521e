"""bench/sweep.py misuse and hostile disks: one-line errors (no traceback) for bad paths and shape data, BOM
headers, dims beyond the kernels or the machine refused up front, and a disk that fills mid-run keeping every
finished row whole (a small tmpfs when running as root, else skipped) and resuming cleanly."""

from __future__ import annotations

import csv
import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import _sweep_cpu  # noqa: E402
import _sweep_csv  # noqa: E402
import shapes  # noqa: E402
import sweep  # noqa: E402
from test_bench_sweep import _fake_estimate  # noqa: E402


def _cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(BENCH.parent))
    return subprocess.run([sys.executable, str(BENCH / "sweep.py"), "--no-progress", "--no-plots", *argv],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def _one_line_error(run: subprocess.CompletedProcess) -> str:
    assert run.returncode != 0, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, run.stderr
    return lines[0]


def test_bad_paths_are_one_line_errors(tmp_path):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "shapes.txt").write_text("32 32 64\n")
    cases = [
        (["--shapes", "missing.txt"], "--shapes missing.txt: no such file"),
        (["--shapes", str(tmp_path)], "is a directory, not a shapes file"),
        (["--shapes", "shapes.txt", "--out", "a_file"], "--out a_file: is a file, not a directory"),
        (["--shapes", "shapes.txt", "--out", "a_file/sub"], "--out a_file/sub"),
    ]
    for argv, match in cases:
        line = _one_line_error(_cli(*argv, cwd=tmp_path))
        assert match in line, (argv, line)
    assert (tmp_path / "a_file").read_text() == "x"


@pytest.mark.parametrize(
    "text, match",
    [
        ("32 32 64\n32 x 64\n", r"shapes.txt:2: not integers: '32 x 64'"),  # a data line, not a bad header
        ("32 x 64\n", r"shapes.txt:1: not integers: '32 x 64'"),
        ("m,n,k\n32,32,64\n1,2\n", r"shapes.txt:3: expected 3 cells .*got 2: '1,2'"),
        ("m,n,k\n32,32,6.5\n", r"shapes.txt:2: not integers: '32,32,6.5'"),
        ("32 32 64\n99999999999 1 1\n", r"shapes.txt:2: m=99999999999 exceeds 4294967295"),
        ("1 1 " + "9" * 5000 + "\n", r"shapes.txt:1: a dim exceeds 4294967295"),
        ("a,b,c\n1,2,3\n", r"shapes.txt:1: header \['a', 'b', 'c'\] lacks m, n, k"),
    ],
)
def test_bad_shape_data_is_quoted_with_its_line(tmp_path, text, match):
    (tmp_path / "shapes.txt").write_text(text)
    line = _one_line_error(_cli("--shapes", "shapes.txt", "--out", "out", cwd=tmp_path))
    assert line.startswith("sweep: ") and re.search(match, line), line
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_bom_and_whitespace_headers_are_accepted(tmp_path):
    bom = tmp_path / "excel.csv"
    bom.write_bytes(b"\xef\xbb\xbfM,N,K\r\n32,32,64\r\n16,16,40\r\n")
    assert shapes.load_shapes(bom) == [(32, 32, 64), (16, 16, 40)]
    spaced = tmp_path / "spaced.txt"
    spaced.write_text("k n m\n64 32 16\n")
    assert shapes.load_shapes(spaced) == [(16, 32, 64)]
    sweep.run(["--mode", "model", "--shapes", str(bom), "--out", str(tmp_path / "out"), "--no-progress",
               "--no-plots", "--dtype", "bf16"], estimator=_fake_estimate)
    assert len(_sweep_csv.read_results(tmp_path / "out" / "results.csv")) == 2


def test_not_utf8_is_an_error(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"m,n,k\n32,32,64 \xe9\n")
    with pytest.raises(ValueError, match=r"latin1.txt: not UTF-8 text \(byte 15"):
        shapes.load_shapes(path)


def test_cpu_shapes_beyond_memory_are_refused_up_front(tmp_path, monkeypatch):
    (tmp_path / "shapes.txt").write_text("32 32 64\n100000 100000 100000\n")
    monkeypatch.setattr(_sweep_cpu, "mem_total_bytes", lambda: 8 * 2**30)
    runner = _sweep_cpu.NumpyRunner()
    with pytest.raises(ValueError, match=r"shape 100000 100000 100000 \(bf16\) needs .* GiB, more than this "
                                         r"machine's 8.0 GiB"):
        sweep.run(["--mode", "cpu", "--dtype", "bf16", "--shapes", str(tmp_path / "shapes.txt"), "--out",
                   str(tmp_path / "out"), "--no-progress", "--no-plots"], runner=runner,
                  cpu_machine={"peak_gflops": 1.0, "bandwidth_gbs": 1.0})
    assert not runner.calls and not (tmp_path / "out").exists()


def test_a_failed_row_write_leaves_the_file_as_before(tmp_path, monkeypatch):
    writer = _sweep_csv.ResultsWriter(tmp_path / "results.csv", fresh=True)
    row = _sweep_csv.new_row("model", "bf16", 32, 32, 64, arch="950DT", num_ai_cores=32, peak_flops=1e12,
                             bandwidth_bytes_s=1e9)
    writer.write(row)
    before = (tmp_path / "results.csv").read_bytes()
    real_write = os.write

    def half_then_full(fd, data):  # the disk fills halfway through the line
        if len(data) > 20:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_sweep_csv.os, "write", half_then_full)
    with pytest.raises(_sweep_csv.ResultsWriteError, match="row of model bf16 32x32x64 .*No space left"):
        writer.write(row)
    monkeypatch.undo()
    assert (tmp_path / "results.csv").read_bytes() == before and writer.rows_written == 1
    writer.write(row)  # the writer still works once there is room
    writer.close()
    assert len((tmp_path / "results.csv").read_bytes().splitlines()) == 3


# Real disks: a read-only and a full filesystem (tmpfs mounts need root)
def _mount_tmpfs(path: Path, options: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (run as root to test read-only and full disks)")
    path.mkdir()
    run = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if run.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {run.stderr.strip()}")


@pytest.fixture
def tmpfs(tmp_path):
    mounted = []

    def mount(name: str, options: str) -> Path:
        path = tmp_path / name
        _mount_tmpfs(path, options)
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_read_only_out_is_a_one_line_error(tmp_path, tmpfs):
    ro = tmpfs("ro", "ro,size=64k")
    (tmp_path / "shapes.txt").write_text("32 32 64\n")
    for out in (ro, ro / "sub"):
        line = _one_line_error(_cli("--shapes", "shapes.txt", "--out", str(out), cwd=tmp_path))
        assert line.startswith(f"sweep: --out {out}") and "Read-only file system" in line, line


def test_full_disk_keeps_finished_rows_whole_and_resumes(tmp_path, tmpfs):
    full = tmpfs("full", "size=8k")
    all_shapes = [(16 * i, 32, 64) for i in range(1, 201)]
    (tmp_path / "shapes.txt").write_text("".join(f"{m} {n} {k}\n" for m, n, k in all_shapes))
    argv = ["--mode", "model", "--dtype", "bf16", "--shapes", str(tmp_path / "shapes.txt"), "--out", str(full),
            "--no-progress", "--no-plots"]
    with pytest.raises(SystemExit) as exc:
        sweep.run(argv, estimator=_fake_estimate)
    message = str(exc.value.code)
    assert message.startswith("sweep: stopped after ") and "No space left on device" in message
    assert f"could not write {full / 'summary.json'}" in message  # reported, not a traceback
    written = int(message.split("stopped after ")[1].split()[0])
    raw = (full / "results.csv").read_bytes()
    assert raw.endswith(b"\n")
    lines = raw.decode().splitlines()
    assert 0 < written < len(all_shapes) and len(lines) == written + 1
    assert all(len(next(csv.reader([line]))) == len(_sweep_csv.COLUMNS) for line in lines)
    assert not (full / "summary.json.tmp").exists()
    if (full / "summary.json").exists():
        json.loads((full / "summary.json").read_text())

    # More room: --resume finishes the rest, every shape exactly once.
    subprocess.run(["mount", "-o", "remount,size=1m", str(full)], check=True)
    sweep.run([*argv, "--resume"], estimator=_fake_estimate)
    lines = (full / "results.csv").read_text().splitlines()
    assert len(lines) == len(all_shapes) + 1
    assert len(_sweep_csv.read_results(full / "results.csv")) == len(all_shapes)
