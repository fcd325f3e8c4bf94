# SPDX-License-Identifier: Apache-2.0
"""The sources follow the project's ruff settings (pyproject.toml: lint rules, line length 120) and carry the
SPDX licence identifier of pyproject.toml's licence."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from recipe.nemo_gym_testing.helpers import REPO_ROOT as REPO


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_python_sources_are_ruff_clean(command):
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "."], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_source_file_names_the_pyproject_licence_in_an_spdx_header():
    licence = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"]["text"]
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py", "*.sh", ".ci/run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    header = f"# SPDX-License-Identifier: {licence}"
    missing = [
        name for name in listed if (REPO / name).is_file() and header not in (REPO / name).read_text().splitlines()[:3]
    ]
    assert listed and not missing, f"files without {header!r} in their first lines: {missing}"


def test_the_plugin_imports_no_nemo_gym_module():
    # NeMo Gym runs in its own Python (3.13 for Gym 0.5+) as a process tree of its own; the plugin speaks HTTP to it.
    found = subprocess.run(
        ["grep", "-rnE", r"^\s*(import|from) nemo_gym", "recipe/nemo_gym"], cwd=REPO, capture_output=True, text=True
    )
    assert found.returncode == 1 and found.stdout == "", found.stdout
