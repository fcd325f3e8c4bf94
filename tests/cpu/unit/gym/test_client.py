# SPDX-License-Identifier: Apache-2.0
"""A running NeMo Gym read over HTTP (`gym/over_http/client.py`, pure parts): the head server's instances as typed
records, where each agent's rows go, and the pairing of agents with the resources servers that accept them."""

from __future__ import annotations

import pytest

from recipe.nemo_gym.gym.over_http.client import (
    RunTarget,
    ServerInstance,
    instances_from_json,
    pairing_problems,
    run_targets,
)


def test_instances_from_the_head_server_become_typed_records() -> None:
    listed = [
        {"process_name": "policy_model", "server_type": "responses_api_models", "name": "vllm_model",
         "host": "127.0.0.1", "port": 14364, "pid": 4509, "url": "http://127.0.0.1:14364", "dir_path": "/x"},
        {"process_name": "math_with_judge_simple_agent", "server_type": "responses_api_agents",
         "name": "simple_agent", "host": None, "port": None, "pid": None},
    ]  # fmt: skip
    assert instances_from_json(listed) == [
        ServerInstance("policy_model", "responses_api_models", "vllm_model", "127.0.0.1", 14364, pid=4509),
        ServerInstance("math_with_judge_simple_agent", "responses_api_agents", "simple_agent", None, None),
    ]


def _instance(name: str, server_type: str, port: int) -> ServerInstance:
    return ServerInstance(name, server_type, "x", "h", port)


def test_run_targets_go_through_the_environment_server_in_front_of_an_agent_else_to_the_agent() -> None:
    config = {
        "math_simple_agent": {"responses_api_agents": {"simple_agent": {"entrypoint": "app.py"}}},
        "tools_simple_agent": {"responses_api_agents": {"simple_agent": {"entrypoint": "app.py"}}},
        "math_environment_server": {
            "environment_servers": {
                "legacy_agent": {"agent_server": {"type": "responses_api_agents", "name": "math_simple_agent"}}
            }
        },
        "head_server": {"host": "h", "port": 11000},
    }
    instances = [
        _instance("math_simple_agent", "responses_api_agents", 1),
        _instance("tools_simple_agent", "responses_api_agents", 2),
        _instance("math_environment_server", "environment_servers", 3),
        _instance("policy_model", "responses_api_models", 4),
    ]
    assert run_targets(config, instances) == {
        "math_simple_agent": RunTarget("math_simple_agent", "http://h:3", via="math_environment_server"),
        "tools_simple_agent": RunTarget("tools_simple_agent", "http://h:2"),
    }
    second = {"environment_servers": {"legacy_agent": {"agent_server": {"name": "math_simple_agent"}}}}
    with pytest.raises(ValueError, match=r"'math_simple_agent' is fronted by several environment servers"):
        run_targets(config | {"other_environment_server": second}, instances)


def test_an_agent_its_resources_server_does_not_accept_is_named_and_gyms_waiver_lifts_the_check() -> None:
    config = {
        "calc": {"resources_servers": {"calc": {"allowed_agents": ["simple_agent"]}}},
        "judge": {"resources_servers": {"judge": {"allowed_agents": "react_agent"}}},
        "free": {"resources_servers": {"free": {}}},
        "calc_simple_agent": {"responses_api_agents": {"simple_agent": {"resources_server": {"name": "calc"}}}},
        "judge_simple_agent": {"responses_api_agents": {"simple_agent": {"resources_server": {"name": "judge"}}}},
        "free_react_agent": {"responses_api_agents": {"react_agent": {"resources_server": {"name": "free"}}}},
    }
    assert pairing_problems(config) == [
        "agent 'judge_simple_agent' runs 'simple_agent', but its resources server 'judge' accepts only: react_agent"
    ]
    assert pairing_problems(config | {"allow_unsupported_pairing": True}) == []
