# SPDX-License-Identifier: Apache-2.0
"""Agent replicas (`recipe/nemo_gym/gym/replicas.py`): the Gym keys that declare the copies, the grouping of a Gym's
agents into copies, the choice of a copy per row, and the setting's validation.

That a real NeMo Gym starts the copies these keys declare and answers rows on them is shown by the real Gym under
`main_ppo` (`tests/cpu/e2e/test_main_ppo.py`, whose blend runs uppercase_share's agent as two copies).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml

from recipe.nemo_gym.config import ConfigError, load_config
from recipe.nemo_gym.gym.errors import GymConfigError
from recipe.nemo_gym.gym.over_http.client import RunTarget, make_post_run
from recipe.nemo_gym.gym.over_http.connection import GymConnection
from recipe.nemo_gym.gym.owned.global_config import merged_config, replica_keys
from recipe.nemo_gym.gym.replicas import LeastBusy, replica_groups, replica_name, replica_of, replica_overrides

AGENT = "math_simple_agent"


def _agent(resources: str = "math") -> dict:
    return {
        "responses_api_agents": {
            "simple_agent": {
                "entrypoint": "app.py",
                "resources_server": {"type": "resources_servers", "name": resources},
                "model_server": {"type": "responses_api_models", "name": "policy_model"},
            }
        }
    }


CONFIG = {
    "math": {"resources_servers": {"math_with_judge": {"entrypoint": "app.py"}}},
    AGENT: _agent(),
    "policy_model": {"responses_api_models": {"vllm_model": {"entrypoint": "app.py"}}},
}


def test_copy_names_number_from_two_and_name_their_original():
    assert replica_name(AGENT, 2) == "math_simple_agent__replica2"
    assert replica_of("math_simple_agent__replica12") == AGENT
    assert replica_of(AGENT) is None
    assert replica_of("math_simple_agent__replica1") is None  # copy 1 is the agent itself
    with pytest.raises(ValueError, match="start at 2"):
        replica_name(AGENT, 1)


def test_each_copy_of_an_agent_gets_its_own_copy_of_its_resources_server():
    assert replica_overrides({AGENT: 3}, CONFIG) == {
        "math__replica2": {"_copy": "math"},
        "math_simple_agent__replica2": {
            "_copy": AGENT,
            "responses_api_agents": {"simple_agent": {"resources_server": {"name": "math__replica2"}}},
        },
        "math__replica3": {"_copy": "math"},
        "math_simple_agent__replica3": {
            "_copy": AGENT,
            "responses_api_agents": {"simple_agent": {"resources_server": {"name": "math__replica3"}}},
        },
    }
    assert replica_overrides({AGENT: 1}, CONFIG) == {}


def test_an_environment_server_in_front_of_the_agent_is_copied_and_points_at_the_agent_copy():
    front = {"environment_servers": {"legacy_agent": {"agent_server": {"type": "responses_api_agents", "name": AGENT}}}}
    other = {"environment_servers": {"legacy_agent": {"agent_server": {"name": "tools_simple_agent"}}}}
    config = {**CONFIG, "math_environment_server": front, "tools_environment_server": other}
    keys = replica_overrides({AGENT: 2}, config)
    assert keys["math_environment_server__replica2"] == {
        "_copy": "math_environment_server",
        "environment_servers": {"legacy_agent": {"agent_server": {"name": "math_simple_agent__replica2"}}},
    }
    assert set(keys) == {"math__replica2", "math_simple_agent__replica2", "math_environment_server__replica2"}


def test_an_agent_the_files_do_not_declare_is_named_with_the_declared_ones():
    with pytest.raises(
        ValueError, match=r"nemo_gym\.replicas\.typo_agent: no agent 'typo_agent'.*\['math_simple_agent'\]"
    ):
        replica_overrides({"typo_agent": 2}, CONFIG)


def test_replica_keys_read_the_config_files_and_the_overrides_as_gym_merges_them(tmp_path: Path):
    files = [tmp_path / "model.yaml", tmp_path / "math.yaml"]
    files[0].write_text(yaml.safe_dump({"policy_model": CONFIG["policy_model"]}))
    files[1].write_text(yaml.safe_dump({"math": CONFIG["math"], AGENT: CONFIG[AGENT]}))
    # An override that points the agent at another resources server: the copies follow it.
    overrides = {"judge": {"resources_servers": {"x": {}}}, AGENT: _agent(resources="judge")}
    keys = replica_keys({AGENT: 2}, merged_config(files, overrides), files)
    assert keys["judge__replica2"] == {"_copy": "judge"}
    with pytest.raises(GymConfigError, match=r"nemo_gym\.replicas\.nope.*config files: .*model\.yaml"):
        replica_keys({"nope": 2}, merged_config(files, {}), files)


def test_copies_group_under_their_agent_in_number_order_and_a_stray_copy_stays_its_own():
    targets = {
        "a__replica10": "a10",
        "a": "a1",
        "a__replica2": "a2",
        "b": "b1",
        "ghost__replica2": "g2",  # no agent "ghost": an agent of its own
    }
    assert replica_groups(targets) == {"a": ("a1", "a2", "a10"), "b": ("b1",), "ghost__replica2": ("g2",)}


def test_rows_go_to_the_copy_with_the_fewest_in_flight_and_ties_rotate():
    router = LeastBusy({"a": ("c1", "c2", "c3"), "b": ("b1",)})
    with router.route("a") as first, router.route("a") as second:
        assert (first, second) == ("c1", "c2")
        with router.route("a") as third:
            assert third == "c3"
        with router.route("a") as fourth:  # c3 is free again, c1 and c2 still hold a row
            assert fourth == "c3"
    assert router.in_flight["a"] == [0, 0, 0]
    with router.route("a") as fifth:  # all free: the rotation goes on after c3
        assert fifth == "c1"
    with router.route("b") as only:
        assert only == "b1"
    assert router.routed == {"a": [2, 1, 2], "b": [1]}
    assert router.spread() == "a on 3 copies: 2, 1, 2 runs"
    assert LeastBusy({"b": ("b1",)}).spread() is None


def test_a_row_is_posted_to_the_copy_it_was_routed_to_and_a_failure_names_that_copy():
    """`make_post_run` against two HTTP servers standing for two copies of one agent (Gym 0.4's layout: no
    environment server in front): concurrent rows alternate, and an HTTP error names the copy that answered."""
    from aiohttp import web

    from tests.support.helpers import free_port

    seen: dict[str, list[int]] = {"one": [], "two": []}

    def app(name: str) -> web.Application:
        async def run(request: web.Request) -> web.Response:
            row = await request.json()
            seen[name].append(row["_ng_task_index"])
            await asyncio.sleep(0.2)  # every row is in flight before the first answers
            if row.get("fail"):
                return web.json_response({"detail": "boom"}, status=500)
            return web.json_response({"reward": 1.0, "response": {"output": []}})

        application = web.Application()
        application.router.add_post("/run", run)
        return application

    async def main():
        import aiohttp

        runners = []
        targets = {}
        for name, server in (("one", AGENT), ("two", replica_name(AGENT, 2))):
            runner = web.AppRunner(app(name))
            await runner.setup()
            port = free_port()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            runners.append(runner)
            targets[server] = RunTarget(server, f"http://127.0.0.1:{port}")
        try:
            router = LeastBusy(replica_groups(targets))
            async with aiohttp.ClientSession() as session:
                post_run = make_post_run(session, router)
                rows = [{"agent_ref": {"name": AGENT}, "responses_create_params": {}, "fail": i == 3} for i in range(4)]
                return await asyncio.gather(*(post_run(i, row) for i, row in enumerate(rows))), router
        finally:
            for runner in runners:
                await runner.cleanup()

    outcomes, router = asyncio.run(main())
    assert seen == {"one": [0, 2], "two": [1, 3]}
    assert [o["reward"] for o in outcomes[:3]] == [1.0, 1.0, 1.0]
    assert outcomes[3].row == 3 and "math_simple_agent__replica2" in str(outcomes[3])
    assert router.spread() == "math_simple_agent on 2 copies: 2, 2 runs"


def test_rows_may_name_the_agent_but_not_its_copies():
    from recipe.nemo_gym.gym.over_http.client import ServerInstance

    servers = [
        ServerInstance(name, "responses_api_agents", "simple_agent", "h", port)
        for port, name in enumerate((AGENT, replica_name(AGENT, 2), "tools_simple_agent"), start=1)
    ]
    connection = GymConnection.__new__(GymConnection)
    connection.servers = tuple(servers)
    assert connection.agent_names == {AGENT, "tools_simple_agent"}


def test_replica_counts_are_checked_and_refused_with_attach(tmp_path: Path):
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"nemo_gym": {"config_paths": ["a.yaml"], "replicas": {AGENT: 4}}}))
    assert load_config(path).nemo_gym.replicas == {AGENT: 4}
    path.write_text(json.dumps({"nemo_gym": {"config_paths": ["a.yaml"], "replicas": {AGENT: 0}}}))
    with pytest.raises(ConfigError, match=r"nemo_gym\.replicas: .*1 to 64 copies; got math_simple_agent: 0"):
        load_config(path)
    attach = {"attach": {"head_server_url": "http://gym:11000"}, "replicas": {AGENT: 2}}
    path.write_text(json.dumps({"nemo_gym": attach}))
    with pytest.raises(ConfigError, match="replicas configure the NeMo Gym the plugin starts"):
        load_config(path)
