"""The lint: ``ruff check`` over the repository with the rules of ``[tool.ruff.lint]`` in pyproject.toml, the
ones that find defects (undefined names, unused and redefined names, syntax errors, bugbear's real bugs), not
style.  Import cycles are tests/test_layout.py's."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def ruff_executable() -> str | None:
    """The virtual environment's ruff (``make setup`` installs it with the ``test`` extra), else one on PATH."""
    beside = pathlib.Path(sys.executable).with_name("ruff")
    return str(beside) if beside.is_file() else shutil.which("ruff")


def ruff_check(*paths: str, cwd: pathlib.Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([ruff_executable(), "check", "--no-cache", "--output-format", "concise", *paths],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


# Outside CI a missing ruff skips (an environment set up before ruff joined the test extra); CI must run it.
needs_ruff = pytest.mark.skipif(ruff_executable() is None and not os.environ.get("CI"),
                                reason="ruff not installed (make setup installs it: pip install -e '.[test]')")


@needs_ruff
def test_ruff_finds_nothing():
    result = ruff_check(".")
    assert result.returncode == 0, f"ruff check found defects (rules: pyproject.toml [tool.ruff.lint]):\n" \
                                   f"{result.stdout}{result.stderr}"


@needs_ruff
def test_the_lint_finds_an_undefined_name_and_an_unused_import(tmp_path):
    # The check above must be able to fail: the repository's own rules on a file with two defects.
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "sample.py").write_text("import os\n\n\ndef read_state(path):\n    return json.loads(path)\n\n\n"
                                        "def read_state(path):\n    return None\n")
    result = ruff_check("sample.py", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    found = {line.split(" ")[1] for line in result.stdout.splitlines() if line.startswith("sample.py:")}
    assert found == {"F401", "F821", "F811"}, result.stdout
