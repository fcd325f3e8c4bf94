# SPDX-License-Identifier: Apache-2.0
"""`test_end_to_end.py` again, every test of it, on the oldest NeMo Gym the plugin runs: 0.4.0, which the trainer's
`.venv` holds (`nemo_gym.environment` in a copy of the shipped blend). It shares the suite's engine, so the two Gym
versions cost one vLLM start between them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.support.helpers import REPO_ROOT


def _end_to_end_module():
    # The tests' modules are not a package (pytest's importlib mode): load the module from its file.
    spec = importlib.util.spec_from_file_location(
        "end_to_end_on_gym_0_4", Path(__file__).with_name("test_end_to_end.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_e2e = _end_to_end_module()
# Its fixtures and tests, collected here as this module's own; `gym_environment` below replaces its own.
globals().update({name: value for name, value in vars(_e2e).items() if name.startswith("test_")})
stacks, stack, training = _e2e.stacks, _e2e.stack, _e2e.training
pytestmark = _e2e.pytestmark


@pytest.fixture(scope="module")
def gym_environment():
    return REPO_ROOT / ".venv"


def test_the_stack_runs_nemo_gym_0_4(stack):
    assert stack["manager"]._gym.version.startswith("0.4."), stack["manager"]._gym.version  # noqa: SLF001
