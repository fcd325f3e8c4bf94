# SPDX-License-Identifier: Apache-2.0
"""Gym's rules the plugin mirrors to start it (`gym/owned/gym_layout.py`), with exact expectations: where config paths
are looked for, each interpreter's venv links and the shim they point at. NeMo Gym's real servers started through
them: `tests/cpu/integration/test_gym_runtime.py`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from recipe.nemo_gym.gym.errors import GymConfigError
from recipe.nemo_gym.gym.owned.gym_layout import (
    check_config_paths,
    default_venv_dir,
    extra_roots,
    link_server_venvs,
    nemo_gym_install_root,
    resolve_config_path,
    server_dirs,
    write_interpreter_shim,
)
from tests.support.gym_runtime import WORKPLACE_CONFIG as WORKPLACE


def test_resolve_config_path_prefers_cwd_then_install_root(tmp_path: Path) -> None:
    cwd, root = tmp_path / "cwd", tmp_path / "root"
    for base in (cwd, root):
        (base / "a").mkdir(parents=True)
    (root / "a/only_root.yaml").write_text("x: 1")
    (root / "a/both.yaml").write_text("x: 1")
    (cwd / "a/both.yaml").write_text("x: 2")
    assert resolve_config_path("a/only_root.yaml", cwd, root) == root / "a/only_root.yaml"
    assert resolve_config_path("a/both.yaml", cwd, root) == cwd / "a/both.yaml"
    assert resolve_config_path(str(root / "a/both.yaml"), cwd, root) == root / "a/both.yaml"
    assert resolve_config_path("a/missing.yaml", cwd, root) is None


def test_check_config_paths_names_every_missing_path_and_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(GymConfigError) as err:
        check_config_paths([WORKPLACE, "nope/one.yaml", "/abs/two.yaml"], tmp_path, nemo_gym_install_root())
    message = str(err.value)
    assert "'nope/one.yaml'" in message and str(tmp_path / "nope/one.yaml") in message
    assert str(nemo_gym_install_root() / "nope/one.yaml") in message and "'/abs/two.yaml'" in message
    assert "workplace_assistant.yaml" not in message
    assert check_config_paths([WORKPLACE], tmp_path, nemo_gym_install_root()) == [nemo_gym_install_root() / WORKPLACE]


def test_each_gym_interpreter_gets_its_own_venv_links_so_two_stacks_never_share_a_shim(tmp_path: Path) -> None:
    # A Gym 0.4 stack (the trainer's .venv) beside a Gym 0.7 one (.venv-gym) once ran 0.7's servers on 0.4's
    # interpreter through the one shim they shared (`No module named 'nemo_gym.base_environment_server'`).
    old, new = (
        default_venv_dir(tmp_path, "/repo/.venv/bin/python"),
        default_venv_dir(tmp_path, "/repo/.venv-gym/bin/python"),
    )
    assert old != new and old.parent == new.parent == tmp_path / "nemo_gym_venvs"
    assert default_venv_dir(tmp_path, "/repo/.venv/bin/python") == old  # stable: links are made once per interpreter
    shims = [write_interpreter_shim(folder, python) for folder, python in ((old, "/a/python"), (new, "/b/python"))]
    assert [(shim / "bin" / "python").read_text().splitlines()[1] for shim in shims] == [
        'exec "/a/python" "$@"',
        'exec "/b/python" "$@"',
    ]


def test_every_server_folder_of_the_roots_gets_a_venv_link(tmp_path: Path) -> None:
    for folder in ("resources_servers/math", "responses_api_agents/simple_agent", "environment_servers/relay",
                   "resources_servers/__pycache__", "unrelated/thing"):  # fmt: skip
        (tmp_path / "root" / folder).mkdir(parents=True)
    (tmp_path / "cwd/resources_servers/mine").mkdir(parents=True)
    assert server_dirs([tmp_path / "root", tmp_path / "cwd", tmp_path / "missing"]) == [
        ("environment_servers", "relay"),
        ("resources_servers", "math"),
        ("resources_servers", "mine"),
        ("responses_api_agents", "simple_agent"),
    ]


def test_the_folders_of_nemo_gym_extra_roots_are_roots_too() -> None:
    # Gym 0.7 looks for server folders under $NEMO_GYM_EXTRA_ROOTS first; their servers need venv links as well.
    assert extra_roots({"NEMO_GYM_EXTRA_ROOTS": f"/a/b{os.pathsep}{os.pathsep}/c"}) == [Path("/a/b"), Path("/c")]
    assert extra_roots({}) == []


def test_interpreter_shim_runs_this_interpreter_and_links_are_idempotent(tmp_path: Path) -> None:
    import subprocess

    shim = write_interpreter_shim(tmp_path, sys.executable)
    links = link_server_venvs(tmp_path, [("resources_servers", "m"), ("responses_api_agents", "a")], shim)
    assert links == [tmp_path / "resources_servers/m/.venv", tmp_path / "responses_api_agents/a/.venv"]
    assert link_server_venvs(tmp_path, [("resources_servers", "m")], shim) == links[:1]
    venv = links[0]
    assert (venv / "bin/python").exists() and (venv / "bin/activate").exists()
    out = subprocess.run(
        ["bash", "-c", f"source {venv}/bin/activate && python -c 'import sys; print(sys.prefix)'"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == sys.prefix
    (tmp_path / "resources_servers/x/.venv").mkdir(parents=True)
    with pytest.raises(GymConfigError, match="is not a link made by this plugin"):
        link_server_venvs(tmp_path, [("resources_servers", "x")], shim)
