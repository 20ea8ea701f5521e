"""The compile notice (jit/notice.py): one line on stderr when it is a terminal, a logging record either way, nothing
on a cache hit. Each case builds vadd with a constant of its own in a fresh cache root, so it misses every cache."""

from __future__ import annotations

import io
import logging
import os
import pty
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest
from jit_helpers import EXAMPLE_DEVICE, vadd_args, vadd_reference

from deep_gemm.jit import build
from deep_gemm.jit import compile as jit_compile
from deep_gemm.jit.notice import CompileNotice, describe

NOTICE = "deep_gemm: compiling vadd ("


def unique_consts() -> dict:
    # NOTES: a SCALE no other test uses (exact in fp32), so neither the memo, the key index nor numba's cache has it
    return {"NUM_AI_CORES": 3, "TILE": 16, "SCALE": 1.0 + (uuid.uuid4().int % 4096) / 4096}


def build_and_run(consts: dict) -> None:
    kernel = build("vadd", consts, template="examples/vadd", device_module=EXAMPLE_DEVICE)
    args = vadd_args(40, np.random.default_rng(0))
    kernel(*args)
    assert np.array_equal(args[3], vadd_reference(args[1], args[2], consts["SCALE"]))


# A child that logs deep_gemm.jit's records to stdout and builds + runs vadd with the given constants.
CHILD = """
import logging, sys
import numpy as np
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="LOG %(name)s %(levelname)s %(message)s")
from deep_gemm.jit import build
k = build("vadd", {consts!r}, template="examples/vadd", device_module={device!r})
x = np.arange(40, dtype=np.float32); y = np.ones(40, np.float32); z = np.zeros(40, np.float32)
k(np.zeros(1, np.uint8), x, y, z, 40)
print("ok", bool(np.array_equal(z, (x + y) * np.float32({scale!r}))))
"""


def run_child(consts: dict, root, tty: bool, extra_env=None) -> tuple[str, str]:
    """(stdout, stderr) of a fresh process building vadd; its stderr is a pseudo-terminal when ``tty``."""
    code = textwrap.dedent(CHILD.format(consts=consts, device=EXAMPLE_DEVICE, scale=consts["SCALE"]))
    env = dict(os.environ, DG_JIT_CACHE_DIR=str(root), **(extra_env or {}))
    env.pop("DG_JIT_DEBUG", None)
    if not tty:
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout, proc.stderr
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=slave)
        os.close(slave)
        slave = None
        chunks = []
        while True:  # until the child's end closes the terminal (EIO on Linux)
            try:
                data = os.read(master, 4096)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        stdout = proc.communicate(timeout=300)[0].decode()
    finally:
        os.close(master)
        if slave is not None:
            os.close(slave)
    err = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    assert proc.returncode == 0, err
    return stdout, err


def test_notice_on_a_terminal_and_logged(tmp_path):
    consts = unique_consts()
    out, err = run_child(consts, tmp_path / "root", tty=True)
    assert "ok True" in out
    lines = [line for line in err.splitlines() if line.startswith("deep_gemm:")]
    assert len(lines) == 2, err
    assert lines[0].startswith(NOTICE) and f"SCALE={consts['SCALE']}" in lines[0] and lines[0].endswith("...")
    assert lines[1].startswith("deep_gemm: compiled vadd (") and lines[1].endswith(" s")
    logged = [line for line in out.splitlines() if line.startswith("LOG deep_gemm.jit INFO")]
    assert len(logged) == 2 and "compiling vadd (" in logged[0] and "compiled vadd (" in logged[1], out

    # A cache hit in the next process: no notice, no record
    out, err = run_child(consts, tmp_path / "root", tty=True)
    assert "ok True" in out and "deep_gemm:" not in err and "LOG deep_gemm.jit" not in out, (out, err)


def test_silent_when_stderr_is_not_a_terminal_but_logged(tmp_path):
    out, err = run_child(unique_consts(), tmp_path / "root", tty=False)
    assert "ok True" in out
    assert "deep_gemm:" not in err, err
    logged = [line for line in out.splitlines() if line.startswith("LOG deep_gemm.jit INFO")]
    assert len(logged) == 2 and "compiling vadd (" in logged[0] and "compiled vadd (" in logged[1], out


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("opt_out", [False, True])
def test_in_process_terminal_and_opt_out(fresh_root, monkeypatch, caplog, opt_out):
    if opt_out:
        monkeypatch.setenv("DG_JIT_NOTICE", "0")
    monkeypatch.delenv("DG_JIT_DEBUG", raising=False)
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    consts = unique_consts()
    with caplog.at_level(logging.INFO, logger="deep_gemm.jit"):
        build_and_run(consts)
    records = [r for r in caplog.records if r.name == "deep_gemm.jit"]
    assert [r.levelno for r in records] == [logging.INFO, logging.INFO]
    assert records[0].getMessage().startswith("compiling vadd (")
    assert records[1].getMessage().startswith("compiled vadd (")
    shown = [line for line in terminal.getvalue().splitlines() if line.startswith("deep_gemm:")]
    assert len(shown) == (0 if opt_out else 2), terminal.getvalue()

    # The same kernel again in this process (memory hit) and after the memory cache is cleared (disk hit): silent
    caplog.clear()
    before = terminal.getvalue()
    with caplog.at_level(logging.INFO, logger="deep_gemm.jit"):
        build_and_run(consts)
        jit_compile.clear_memory_cache()
        build_and_run(consts)
    assert terminal.getvalue() == before
    assert not [r for r in caplog.records if r.name == "deep_gemm.jit"]


def test_describe_names_shape_and_block():
    consts = {"SHAPE_M": 0, "SHAPE_N": 7168, "SHAPE_K": 2048, "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128,
              "NUM_AI_CORES": 32, "PATH": "cube"}
    assert describe("bf16_gemm", consts) == "bf16_gemm (N=7168 K=2048, block 128x256)"
    assert describe("vadd", {"NUM_AI_CORES": 3, "TILE": 16, "SCALE": 2.0}) == "vadd (SCALE=2.0 TILE=16)"
    assert describe("k", {"NUM_AI_CORES": 3}) == "k"


def test_failed_compile_is_reported_once(monkeypatch, caplog):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with caplog.at_level(logging.INFO, logger="deep_gemm.jit"):
        notice = CompileNotice("vadd", {"TILE": 16})
        notice.finish(failed=True)
        notice.finish()
    levels = [r.levelno for r in caplog.records if r.name == "deep_gemm.jit"]
    assert levels == [logging.INFO, logging.INFO]  # INFO: nothing reaches an unconfigured process's stderr
    assert "failed after" in caplog.records[-1].getMessage()
