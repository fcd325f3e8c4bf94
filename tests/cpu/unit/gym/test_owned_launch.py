# SPDX-License-Identifier: Apache-2.0
"""`OwnedGym`'s start (`gym/owned/launch.py`) where it fails before or as it starts, without a server: a busy head
server port, a missing config path, the head server's bind error in the launcher's log, and a launcher ended by
Ray's start-up deadline started again within the same deadline. NeMo Gym's real servers under `OwnedGym`:
`tests/cpu/integration/test_gym_runtime.py`."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest

from recipe.nemo_gym.config import NeMoGymConfig
from recipe.nemo_gym.gym.errors import GymConfigError, GymServerDied, GymStartTimeout, HeadPortInUseError
from recipe.nemo_gym.gym.owned import launch
from recipe.nemo_gym.gym.owned.launch import (
    RAY_START_ATTEMPTS,
    OwnedGym,
    check_port_free,
    head_server_bind_error,
    launcher_missed_ray_start,
)
from recipe.nemo_gym.gym.owned.liveness import LAUNCHER
from tests.support.gym_runtime import MATH_CONFIG as MATH
from tests.support.gym_runtime import gym_config, gym_processes, policy_servers, start_gym
from tests.support.helpers import free_port


def test_check_port_free_names_the_busy_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(HeadPortInUseError, match=f"127.0.0.1:{port} is already in use"):
            check_port_free("127.0.0.1", port)
    check_port_free("127.0.0.1", port)


# ---------------------------------------------------------------------------------------- starts and pairs


def test_start_with_missing_config_path_fails_before_starting_anything(tmp_path: Path) -> None:
    port = free_port()
    config = gym_config((MATH, "resources_servers/no_such_env/configs/no_such_env.yaml"), port, venv_dir=tmp_path)
    with pytest.raises(GymConfigError, match=r"'resources_servers/no_such_env/configs/no_such_env.yaml' \(looked in"):
        start_gym(config, policy_servers("http://127.0.0.1:9/v1"))
    assert gym_processes(port) == []
    check_port_free("127.0.0.1", port)


# The launcher's log tail as the plugin quotes it when Gym's own Ray missed Ray's start-up deadline (seen in a
# suite run on 2 busy cores: NeMo Gym 0.7.0, Ray 2.60).
RAY_MISSED = (
    "NeMo Gym's launcher ended during start-up: it exited with code 1.\n--- last lines of gym_launcher.log ---\n"
    "    ray.init(**ray_init_kwargs)\nException: The current node timed out during startup. This could happen "
    "because some of the raylet failed to startup or the GCS has become overloaded."
)


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (GymServerDied(RAY_MISSED, [LAUNCHER]), True),
        (GymServerDied("NeMo Gym's launcher ended during start-up: it exited with code 1.", [LAUNCHER]), False),
        (GymServerDied(RAY_MISSED, ["math_with_judge"]), False),  # a server of its own, not Gym's Ray
        (GymStartTimeout(RAY_MISSED, ["head_server"]), False),
    ],
)
def test_only_a_launcher_ended_by_rays_start_up_deadline_counts_as_a_missed_ray_start(error, retried) -> None:
    assert launcher_missed_ray_start(error) is retried


# Gym 0.7.0's launcher log when its head server could not listen (uvicorn logs asyncio's bind error; Python 3.13).
HEAD_BIND_FAILED = (
    "INFO:     Waiting for application startup.\n"
    "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 26109): address already in use\n"
    "(policy_model) INFO:     Uvicorn running on http://127.0.0.1:19553 (Press CTRL+C to quit)\n"
)


@pytest.mark.parametrize(
    ("log", "port", "error"),
    [
        (
            HEAD_BIND_FAILED,
            26109,
            "[Errno 98] error while attempting to bind on address ('127.0.0.1', 26109): address already in use",
        ),  # fmt: skip
        (HEAD_BIND_FAILED, 11000, None),  # another listener's port: a server of Gym's, not the head
        ("INFO:     Uvicorn running on http://127.0.0.1:26109 (Press CTRL+C to quit)\n", 26109, None),
        ("", 26109, None),
    ],
)
def test_the_head_servers_bind_error_is_found_in_the_launchers_log_by_its_port(log, port, error) -> None:
    assert head_server_bind_error(log, port) == error


def _retry_config() -> NeMoGymConfig:
    return gym_config([MATH], 11000, timeouts={"startup_s": 60})


def _start_attempts(monkeypatch, outcomes: list) -> list[float]:
    """Replace one start attempt (`OwnedGym._start_once`) by `outcomes` in turn, with no pause between attempts; the
    deadlines it was given."""
    deadlines = []

    def start_once(cls, config, policy, loop, overrides, deadline):
        deadlines.append(deadline)
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(OwnedGym, "_start_once", classmethod(start_once))
    monkeypatch.setattr(launch, "_RAY_RETRY_PAUSE_S", 0.0)
    return deadlines


def test_a_launcher_ended_by_rays_start_up_deadline_is_started_again_within_the_same_deadline(
    monkeypatch, plugin_caplog
) -> None:
    started = object()
    missed = [GymServerDied(RAY_MISSED, [LAUNCHER]) for _ in range(RAY_START_ATTEMPTS - 1)]
    deadlines = _start_attempts(monkeypatch, [*missed, started])
    t0 = time.monotonic()
    assert OwnedGym.start(_retry_config(), policy_servers("http://127.0.0.1:1/v1"), loop=None) is started
    assert len(deadlines) == RAY_START_ATTEMPTS == 3 and len(set(deadlines)) == 1
    assert t0 + 59 < deadlines[0] <= time.monotonic() + 60
    assert f"starting NeMo Gym again (start 3 of at most {RAY_START_ATTEMPTS})" in plugin_caplog.text


@pytest.mark.parametrize(
    ("outcomes", "attempts"),
    [
        ([GymServerDied(RAY_MISSED, [LAUNCHER])] * 3, 3),  # the last start's failure is the caller's
        ([GymServerDied("NeMo Gym server(s) ['math_with_judge'] died during start-up.", ["math_with_judge"])], 1),
        ([GymServerDied(RAY_MISSED, [LAUNCHER]), GymServerDied("server(s) ['math_with_judge'] died", ["x"])], 2),
    ],
)
def test_any_other_start_up_failure_or_the_last_missed_ray_start_is_raised(monkeypatch, outcomes, attempts) -> None:
    deadlines = _start_attempts(monkeypatch, list(outcomes))
    with pytest.raises(GymServerDied) as raised:
        OwnedGym.start(_retry_config(), policy_servers("http://127.0.0.1:1/v1"), loop=None)
    assert len(deadlines) == attempts and raised.value is outcomes[-1]


def test_no_start_is_made_again_without_the_time_for_one_left(monkeypatch) -> None:
    deadlines = _start_attempts(monkeypatch, [GymServerDied(RAY_MISSED, [LAUNCHER]), object()])
    monkeypatch.setattr(launch, "_RAY_RETRY_PAUSE_S", 40.0)  # more than half of the 60 s start-up deadline
    with pytest.raises(GymServerDied):
        OwnedGym.start(_retry_config(), policy_servers("http://127.0.0.1:1/v1"), loop=None)
    assert len(deadlines) == 1


def test_the_test_supports_gym_keeps_its_loop_open_through_a_start_made_once_more(monkeypatch, tmp_path) -> None:
    """`start_gym` (tests/support/gym_runtime.py) makes the loop its Gym closes at shutdown. A first attempt that
    fails on Ray's start-up deadline is shut down before `OwnedGym.start` tries again on the same loop: that
    shutdown must leave the loop open: a closed one would fail every batch of the Gym that did start."""
    attempts = []

    def start(self, deadline):  # one launcher run: the first ends as Ray's missed deadline does
        attempts.append(self)
        if len(attempts) == 1:
            raise GymServerDied(RAY_MISSED, [LAUNCHER])

    monkeypatch.setattr(OwnedGym, "_start", start)
    config = gym_config([MATH], free_port(), timeouts={"startup_s": 60}, venv_dir=tmp_path / "venvs")
    gym = start_gym(config, policy_servers("http://127.0.0.1:1/v1"))
    assert len(attempts) == 2 and attempts[1] is gym
    assert gym.loop.run(asyncio.sleep(0, result="open"), timeout=5, what="a no-op") == "open"
    gym.shutdown()
    with pytest.raises(RuntimeError, match="is closed"):
        gym.loop.run(asyncio.sleep(0), timeout=5, what="a no-op")
