# SPDX-License-Identifier: Apache-2.0
"""`connect_gym`, the one way the manager gets a NeMo Gym: from the validated YAML, a started Gym without
`nemo_gym.attach` and an attached one with it, each failing here before anything runs (a config path that does not
exist; a head server nobody answers at). A started Gym running for real: `integration/test_gym_runtime.py`; an
attached one: `integration/test_attach.py`; both through the manager in the end-to-end tests."""

from __future__ import annotations

import pytest

from recipe.nemo_gym.config import NeMoGymConfig
from recipe.nemo_gym.event_loop import BackgroundLoop
from recipe.nemo_gym.gym.connect import connect_gym
from recipe.nemo_gym.gym.errors import GymConfigError, GymStartTimeout
from recipe.nemo_gym.gym.types import PolicyServers
from tests.support.gym_runtime import gym_config, gym_processes
from tests.support.helpers import free_port

ONE = PolicyServers(("http://127.0.0.1:1/v1",), "m")
TWO = PolicyServers(("http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"), "m")


def test_without_attach_the_plugin_starts_gym_from_the_configs_the_yaml_names(tmp_path) -> None:
    port = free_port()
    config = gym_config(["resources_servers/no_such_env/configs/no_such_env.yaml"], port, venv_dir=tmp_path)
    with BackgroundLoop(name="connect-test") as loop:
        with pytest.raises(GymConfigError, match=r"'resources_servers/no_such_env/configs/no_such_env.yaml' \(looked"):
            connect_gym(config, ONE, loop=loop)
    assert gym_processes(port) == []


@pytest.mark.parametrize(
    ("policy", "relay_host", "asked"),
    [(ONE, None, 0), (TWO, None, 1), (TWO, "10.1.2.3", 0)],
    ids=["one-server", "relay-at-node-address", "relay-host-in-yaml"],
)
def test_with_attach_the_plugin_attaches_and_asks_the_node_address_only_for_a_relay_it_must_place(
    policy, relay_host, asked
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    attach = {"head_server_url": url} | ({"relay_host": relay_host} if relay_host else {})
    config = NeMoGymConfig.model_validate({"nemo_gym": {"attach": attach}, "timeouts": {"startup_s": 1}})
    calls = []

    def node_ip() -> str:
        calls.append(1)
        return "127.0.0.1"

    with BackgroundLoop(name="connect-test") as loop:
        with pytest.raises(GymStartTimeout, match=f"the NeMo Gym at {url} was not ready within 1s"):
            connect_gym(config, policy, loop=loop, node_ip=node_ip)
    assert len(calls) == asked
