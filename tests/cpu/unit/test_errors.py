# SPDX-License-Identifier: Apache-2.0
"""One error root (`recipe/nemo_gym/errors.py`): every exception class of the plugin derives from
`NeMoGymPluginError`, in the family that says what it is, and no class name in `recipe/` is used twice.

The classes are read from the source (`helpers.defined_classes`, with `ast`), so that a new module's exception is
checked without importing vLLM or verl."""

from __future__ import annotations

from collections import Counter

import pytest

from recipe.nemo_gym.errors import ConfigError, NeMoGymPluginError, RefusedError, RolloutError, ServerError
from recipe.nemo_gym.failures import EpisodeDataError, FailureBudgetExceeded, FailureCause, RolloutAborted
from recipe.nemo_gym.gym.errors import (
    GymConfigError,
    GymServerDied,
    GymStartTimeout,
    HeadPortInUseError,
    PolicyServerUnreachable,
)
from recipe.nemo_gym.splice.carriers import SpliceError
from tests.support.helpers import REPO_ROOT, defined_classes, exception_classes

PACKAGE = REPO_ROOT / "recipe" / "nemo_gym"


def test_every_exception_class_of_the_plugin_derives_from_the_one_root():
    classes = exception_classes([PACKAGE])
    assert len(classes) >= 24  # the reading found them: the root, its 4 families and 19 more in 11 modules
    outside = {name: where for name, (where, up) in classes.items() if "NeMoGymPluginError" not in up}
    assert sorted(outside) == ["NeMoGymPluginError"], outside  # the root itself, and nothing else


def test_no_class_name_is_used_twice_in_the_recipe():
    every = defined_classes([REPO_ROOT / "recipe"])
    counts = Counter(c.name for c in every)
    assert {name: [c.where for c in every if c.name == name] for name, n in counts.items() if n > 1} == {}


@pytest.mark.parametrize(
    ("error", "family"),
    [
        (GymConfigError, ConfigError),
        (HeadPortInUseError, ServerError),
        (GymServerDied, ServerError),
        (PolicyServerUnreachable, ServerError),
        (GymStartTimeout, ServerError),
        (RolloutAborted, RolloutError),
        (FailureBudgetExceeded, RolloutError),
        (EpisodeDataError, RefusedError),
        (SpliceError, RefusedError),
    ],
)
def test_each_error_is_in_the_family_that_says_what_it_is(error, family):
    assert issubclass(error, family) and issubclass(error, NeMoGymPluginError)
    others = {ConfigError, ServerError, RolloutError, RefusedError} - {family}
    assert not any(issubclass(error, other) for other in others)


def test_an_unreachable_policy_server_is_not_reported_as_a_dead_nemo_gym_server():
    # verl's vLLM servers are not NeMo Gym's: the manager tells the two apart (`collect._health_or_abort`).
    assert not issubclass(PolicyServerUnreachable, GymServerDied)
    error = PolicyServerUnreachable("stopped answering", ["http://10.0.0.1:8000/v1"])
    assert error.servers == ("http://10.0.0.1:8000/v1",) and str(error) == "stopped answering"


def test_families_keep_the_python_types_callers_already_catch():
    assert issubclass(ConfigError, ValueError) and issubclass(RefusedError, ValueError)
    assert issubclass(ServerError, RuntimeError) and issubclass(RolloutError, RuntimeError)
    assert issubclass(GymStartTimeout, TimeoutError)
    refused = EpisodeDataError(FailureCause.CONTIGUITY_BROKEN, "turn 2 edited")
    assert str(refused) == "contiguity_broken: turn 2 edited" and isinstance(refused, ValueError)
