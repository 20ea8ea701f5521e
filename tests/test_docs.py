"""The README and docs/*.md as a user meets them: every ```python block runs, the README stays short, its docs/
links exist.

A ```python block is one of three kinds:

- a **transcript**: its first line starts with ``>>>``. It runs as a doctest (ELLIPSIS and NORMALIZE_WHITESPACE),
  in this process. One namespace per file: a file's transcripts run in order, one test per file, in a namespace
  that starts with ``deep_gemm``, ``np`` and ``ml_dtypes`` (so a later block may use what an earlier one of the same
  file defined, as a reader would type them into one session), under a ``deep_gemm.runtime_scope()`` (a block that
  changes the arch or core count leaves the other tests unchanged). Any output that differs fails the test: this is
  how the docs quote chip-model figures (the reader sees the call that prints each one, and CI checks that the code
  still prints it).
- a **script**: anything else. It runs as a plain script in a subprocess (its own directory, this checkout first on
  the path, the session's kernel cache) and must exit 0. A script importing torch needs the torch extra (installed
  in CI).
- **not run**: its first line is ``# not run: <why>``, allowed only for a block that cannot run in CI (the reason is
  required and must be stated there).
"""

from __future__ import annotations

import doctest
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOC_FILES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 250
NOT_RUN = re.compile(r"#\s*not run\b(?::\s*(?P<why>.*\S))?")
DOCTEST_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """(first line number, source) of every ```python fenced block of a markdown file."""
    blocks, current, start = [], None, 0
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if current is None:
            if line.strip() == "```python":
                current, start = [], number + 1
        elif line.strip() == "```":
            blocks.append((start, "\n".join(current) + "\n"))
            current = None
        else:
            current.append(line)
    assert current is None, f"{path.name}: the ```python block at line {start} is never closed"
    return blocks


def first_line(source: str) -> str:
    return next((line.strip() for line in source.splitlines() if line.strip()), "")


def kind(source: str) -> str:
    first = first_line(source)
    if first.startswith(">>>"):
        return "transcript"
    if NOT_RUN.fullmatch(first):
        return "not run"
    return "script"


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


BLOCKS = [(_name(path), start, source) for path in DOC_FILES for start, source in python_blocks(path)]
SCRIPTS = [b for b in BLOCKS if kind(b[2]) == "script"]
TRANSCRIPTS = [b for b in BLOCKS if kind(b[2]) == "transcript"]
NOT_RUN_BLOCKS = [b for b in BLOCKS if kind(b[2]) == "not run"]


def _ids(blocks):
    return [f"{name}:{start}" for name, start, _ in blocks]


def test_docs_have_blocks_of_both_kinds():
    assert any(name == "README.md" for name, _, _ in SCRIPTS), "README.md has no ```python block to run"
    assert TRANSCRIPTS, "no doc has a >>> transcript"


@pytest.mark.parametrize("name,start,source", SCRIPTS, ids=_ids(SCRIPTS))
def test_doc_script_runs(name, start, source, tmp_path):
    if re.search(r"^\s*import torch|^\s*from torch\b", source, flags=re.M):
        pytest.importorskip("torch", reason="the torch extra is not installed")  # installed in CI
    # NOTES: the child inherits the environment, DG_JIT_CACHE_DIR included, so compiled kernels are shared
    script = tmp_path / f"{Path(name).stem}_{start}.py"
    script.write_text(source, encoding="utf-8")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, (f"{name} block at line {start} exited with {proc.returncode}\n"
                                  f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")


def run_transcripts(name: str, blocks: list[tuple[int, str]]) -> tuple[int, str]:
    """Run one file's transcript blocks, in order, as doctests sharing one namespace; (failed examples, report)."""
    import ml_dtypes
    import numpy as np

    import deep_gemm

    globs = {"deep_gemm": deep_gemm, "np": np, "ml_dtypes": ml_dtypes, "__name__": "__doc_transcript__"}
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(optionflags=DOCTEST_FLAGS, verbose=False)
    report = io.StringIO()
    path = list(sys.path)  # a transcript may put bench/ on it (the sweep's modules); restored after
    try:
        with deep_gemm.runtime_scope():
            for start, source in blocks:
                test = parser.get_doctest(source, globs, f"{name}:{start}", str(ROOT / name), start - 1)
                runner.run(test, out=report.write, clear_globs=False)
                globs = test.globs  # DocTest copies its globs: the next block continues from this one's
    finally:
        sys.path[:] = path
        globs.clear()
    return runner.failures, report.getvalue()


TRANSCRIPT_FILES = sorted({name for name, _, _ in TRANSCRIPTS})


@pytest.mark.parametrize("name", TRANSCRIPT_FILES)
def test_doc_transcripts_match(name):
    blocks = [(start, source) for block_name, start, source in TRANSCRIPTS if block_name == name]
    failed, report = run_transcripts(name, blocks)
    assert failed == 0, f"{name}: {failed} transcript example(s) print otherwise now\n{report}"


def test_a_wrong_transcript_fails():
    """The doctest check can fail: a transcript whose output differs is reported."""
    assert run_transcripts("docs/x.md", [(1, ">>> x = 1 + 1\n"), (3, ">>> print(x)\n2\n")])[0] == 0
    failed, report = run_transcripts("docs/x.md", [(1, ">>> x = 1 + 1\n"), (3, ">>> print(x)\n3\n")])
    assert failed == 1 and "Expected:\n    3\nGot:\n    2" in report, report


def test_not_run_blocks_say_why():
    silent = [f"{name}:{start}" for name, start, source in NOT_RUN_BLOCKS
              if not NOT_RUN.fullmatch(first_line(source)).group("why")]
    assert not silent, f"'# not run' must say why the block cannot run in CI ('# not run: ...'): {silent}"


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines, at most {MAX_README_LINES} allowed"


def test_readme_docs_links_exist():
    text = README.read_text(encoding="utf-8")
    linked = sorted(set(re.findall(r"\bdocs/[\w./-]+?\.md\b", text)))
    assert linked, "README.md links no docs/*.md file"
    missing = [name for name in linked if not (ROOT / name).is_file()]
    assert not missing, f"README.md links docs files that do not exist: {missing}"
