"""The README as a user meets it: every ```python block runs, the README stays short, and its docs/ links exist.

Blocks that begin with ``>>>`` (doctest-style transcripts) or with a line ``# not run`` are skipped; a block that
imports torch is skipped when the torch extra is not installed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 250


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


def is_skipped(source: str) -> bool:
    first = next((line.strip() for line in source.splitlines() if line.strip()), "")
    return first.startswith(">>>") or first == "# not run"


README_BLOCKS = [(start, src) for start, src in python_blocks(README) if not is_skipped(src)]


def test_readme_has_a_runnable_block():
    assert README_BLOCKS, "README.md has no ```python block to run"


@pytest.mark.parametrize("start,source", README_BLOCKS, ids=[f"README.md:{s}" for s, _ in README_BLOCKS])
def test_readme_block_runs(start, source, tmp_path):
    if re.search(r"^import torch", source, flags=re.M):
        pytest.importorskip("torch", reason="the torch extra is not installed")  # the torch script needs it
    # NOTES: the child inherits the environment, DG_JIT_CACHE_DIR included, so compiled kernels are shared
    script = tmp_path / f"readme_{start}.py"
    script.write_text(source, encoding="utf-8")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, (f"README.md block at line {start} exited with {proc.returncode}\n"
                                  f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines, at most {MAX_README_LINES} allowed"


def test_readme_docs_links_exist():
    text = README.read_text(encoding="utf-8")
    linked = sorted(set(re.findall(r"\bdocs/[\w./-]+?\.md\b", text)))
    assert linked, "README.md links no docs/*.md file"
    missing = [name for name in linked if not (ROOT / name).is_file()]
    assert not missing, f"README.md links docs files that do not exist: {missing}"
