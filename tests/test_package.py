"""The package as a user meets it: a cheap import, every exported name resolves, the README documents every
environment variable the code declares."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import deep_gemm
from deep_gemm import envs

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_import_compiles_nothing_and_skips_numba():
    code = (
        "import sys, deep_gemm; deep_gemm.get_num_ai_cores(); deep_gemm.estimate_gemm(64, 64, 64); "
        "print('numba' in sys.modules, 'llvmlite' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_every_export_resolves():
    for name in deep_gemm.__all__:
        assert getattr(deep_gemm, name) is not None, name
    assert set(deep_gemm.__all__) <= set(dir(deep_gemm))


def test_unknown_attribute_raises():
    try:
        deep_gemm.no_such_function  # noqa: B018
    except AttributeError as e:
        assert "no_such_function" in str(e)
    else:
        raise AssertionError("expected AttributeError")


def test_readme_lists_every_env_var():
    readme = (ROOT / "README.md").read_text()
    documented = set(re.findall(r"^\| `(DG_[A-Z0-9_]+)` \|", readme, flags=re.M))
    assert documented == set(envs.ENV_VARS), f"README table vs envs.py: {documented ^ set(envs.ENV_VARS)}"


def test_readme_has_exactly_two_setup_commands():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^python -m pip install .*$", readme, flags=re.M)
    assert len(commands) == 2, commands
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in ci, "CI must run the README's test command"


def test_every_subpackage_ships_in_the_wheel():
    """pyproject.toml lists its packages explicitly: a new sub-package missing there imports from a checkout but not
    from an installed wheel."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "deep_gemm").rglob("__init__.py")}
    assert on_disk <= listed, sorted(on_disk - listed)
