"""The Python sources follow the project's ruff settings (pyproject.toml: lint rules, line length 120)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_python_sources_are_ruff_clean(command):
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "."], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
