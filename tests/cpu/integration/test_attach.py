# SPDX-License-Identifier: Apache-2.0
"""Attach mode (`nemo_gym.attach`): the manager uses a NeMo Gym started outside it, hands it verl's policy address
through Gym's endpoint file, and starts, signals and stops nothing of Gym's.

Path under test (nothing replaced; vLLM is its CPU build): a Gym 0.7 started with docs/attach-mode.md's `gym env start`
command (`external_gym.py`: offline venv links are the one difference) running `example_single_tool_call` (a real
`get_weather` call between two model calls) -> the real manager, created by verl's `create(...)` over verl's
client and the suite's shared engine (verl's standalone vLLM rollout, splice patch armed; each row names its
scripted policy) -> the packed DataProto. Several policy servers are that one engine listed twice: its own address
and a second one in front of it (`helpers.PortForward`, bytes piped unchanged), so the relay has two to spread over.
The pure parts (the handover checks, the endpoint file, the relay's choice, the config's rules) are tested in
`test_attach_units.py`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from recipe.nemo_gym.failures import EpisodeFailure
from recipe.nemo_gym.token_fields import TOKEN_FIELDS
from recipe.nemo_gym_demo.data import example_rows, write_jsonl
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from tests.support.cpu_policy import harness
from tests.support.cpu_policy.episodes import tools_and_games_policy
from tests.support.engine.script_choice import scripted_row
from tests.support.engine.standalone import init_local_ray, standalone_overrides
from tests.support.external_gym import ExternalGym
from tests.support.helpers import PortForward, alive, free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

WEATHER = "example_single_tool_call_simple_agent"
WEATHER_CONFIG = "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml"
ATTACH_CONFIG = harness.REPO_ROOT / "recipe" / "nemo_gym" / "configs" / "attach.yaml"


@pytest.fixture(scope="module")
def setup(tmp_path_factory, shared_engine):
    """The shared engine under two addresses, and a Gym started outside any manager."""
    import ray

    tmp = tmp_path_factory.mktemp("attach")
    model_dir = tiny_qwen3_dir()
    script = tools_and_games_policy().to_file(tmp / "script.json")
    rows = [scripted_row(row, script) for row in example_rows([WEATHER])[:2]]
    data = write_jsonl(rows, tmp / "rows.jsonl")
    gym = ExternalGym.start(tmp / "gym", [WEATHER_CONFIG], model_name=str(model_dir), port=free_port())
    # The shipped attach config, as a user runs it (the child of the SIGKILL test inherits the variable).
    os.environ["NEMO_GYM_HEAD_SERVER_URL"] = gym.url
    config_path = ATTACH_CONFIG
    overrides = harness.cpu_trainer_overrides(
        model_dir, config_path, prompt_length=1024, response_length=256, n=2, batch_size=len(rows)
    )
    config = harness.compose_verl_config([*overrides, *standalone_overrides(replicas=2, scripted=True)])
    from recipe.nemo_gym.dataset import NeMoGymJSONLDataset

    dataset = NeMoGymJSONLDataset(data_files=[str(data)], tokenizer=None, processor=None, config=config.data)
    init_local_ray()  # verl's load balancer is a Ray actor of this process's Ray
    try:
        with PortForward(shared_engine.address) as second:
            addresses = [shared_engine.address, second.address]
            yield {"gym": gym, "config": config, "dataset": dataset, "addresses": addresses, "tmp": tmp}
    finally:
        ray.shutdown()
        gym.stop()
        os.environ.pop("NEMO_GYM_HEAD_SERVER_URL", None)


def run_batch(setup, addresses):
    """A manager over verl's client listing `addresses`: one batch, then shutdown. Returns (output, results, gym)."""
    config, dataset = setup["config"], setup["dataset"]
    client = harness.verl_llm_client(config, addresses)
    with harness.manager_over(config, client) as manager:
        gym = manager._gym  # noqa: SLF001 - the test reads what was published and relayed
        published = setup["gym"].endpoint_file.read_text().strip()
        _, batch = harness.trainer_batches(dataset, range(len(dataset)), config)
        output = manager.generate_sequences(batch)
        results = list(manager.last_results)
    return output, results, gym, published


def check_weather_episodes(output, results):
    assert not [r for r in results if isinstance(r, EpisodeFailure)]
    assert len(results) == len(output) == 4
    for result in results:
        calls = [
            tuple(item[f] for f in TOKEN_FIELDS)
            for item in result["response"]["output"]
            if all(item.get(f) is not None for f in TOKEN_FIELDS)
        ]
        assert len(calls) == 2  # the tool call, Gym's get_weather, the answer
        (prompt1, gen1, _), (prompt2, _, _) = calls
        assert prompt2[: len(prompt1) + len(gen1)] == prompt1 + gen1
        assert result["reward"] == 1.0
    assert output.batch["rm_scores"].sum().item() == 4.0


def test_several_policy_servers_are_published_as_one_relay_that_spreads_episodes_and_keeps_each_on_one(setup):
    addresses = setup["addresses"]
    output, results, attached, published = run_batch(setup, addresses)
    check_weather_episodes(output, results)
    relay = attached.relay
    assert published == f"http://{attached.relay_host}:{relay.port}/v1"
    # 4 episodes x 2 model calls, all through the relay, on both servers; Gym names each call's episode
    # (`forward_session_id_as_conversation_id`), so each episode's second call went where its first did.
    print(f"\nrelay: {dict(relay.paths)}, per server {relay.served}, {relay.pinned} calls kept on their episode's")
    assert relay.paths["/v1/chat/completions"] == 8
    assert sum(relay.served) == sum(relay.paths.values())
    assert min(relay.served) > 0, relay.served
    assert relay.pinned == 4 and len(relay.affinity.servers) == 4


CHILD = r"""
import os, signal, sys
from pathlib import Path

import ray

from recipe.nemo_gym.agent_loop import NeMoGymAgentLoopManager
from recipe.nemo_gym.dataset import NeMoGymJSONLDataset
from tests.support.cpu_policy import harness

plugin, data, address, model_dir, marker = sys.argv[1:6]
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
overrides = harness.cpu_trainer_overrides(model_dir, plugin, prompt_length=1024, response_length=256, n=2, batch_size=2)
config = harness.compose_verl_config(overrides)
dataset = NeMoGymJSONLDataset(data_files=[data], tokenizer=None, processor=None, config=config.data)
manager = NeMoGymAgentLoopManager.create(
    config=config, llm_client=harness.verl_llm_client(config, [address]), teacher_client=None,
    reward_loop_worker_handles=None,
)
_, batch = harness.trainer_batches(dataset, [0, 1], config)
output = manager.generate_sequences(batch)
Path(marker).write_text(str(output.batch["rm_scores"].sum().item()))
os.kill(os.getpid(), signal.SIGKILL)  # the trainer dies without a word: no hook of any kind runs
"""


def test_a_sigkilled_trainer_leaves_the_attached_gym_running_and_the_next_gets_the_policy_address_and_trains(setup):
    gym, tmp = setup["gym"], setup["tmp"]
    before = gym.pids()
    marker = tmp / "child_reward"
    address = setup["addresses"][0]
    env = {**os.environ, "PYTHONPATH": str(harness.REPO_ROOT)}
    argv = [sys.executable, "-c", CHILD, str(ATTACH_CONFIG), str(tmp / "rows.jsonl"), address,
            str(tiny_qwen3_dir()), str(marker)]  # fmt: skip
    with open(tmp / "child.log", "wb") as log:
        child = subprocess.run(argv, cwd=harness.REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=600)
    assert child.returncode == -9, (tmp / "child.log").read_text()[-3000:]
    assert marker.read_text() == "4.0"  # it ran its batch before it died
    time.sleep(5)  # anything a watchdog might have done, it would have done by now
    assert alive(before) == before
    assert gym.pids() == before
    # No hook ran in the child, yet its address is withdrawn: its watchdog emptied the endpoint file.
    assert gym.endpoint_file.read_text().strip() == ""
    # The Gym still serves: the next trainer attaches, hands Gym its one policy server's own address (no relay), runs
    # its batch, and at its shutdown stops nothing of Gym's and unpublishes the address (it would be a dead one).
    output, results, attached, published = run_batch(setup, [address])
    check_weather_episodes(output, results)
    assert published == f"http://{address}/v1"
    assert attached.relay is None
    assert gym.pids() == before
    assert gym.endpoint_file.read_text().strip() == ""


def test_a_gym_without_the_named_policy_model_server_is_refused_at_start_naming_it(setup, tmp_path):
    from recipe.nemo_gym.gym.errors import GymConfigError

    yaml_path = tmp_path / "plugin.yaml"
    yaml_path.write_text(
        f"nemo_gym:\n  attach:\n    head_server_url: {setup['gym'].url}\n    policy_model_server: no_such_server\n"
    )
    overrides = harness.cpu_trainer_overrides(
        tiny_qwen3_dir(), yaml_path, prompt_length=1024, response_length=256, n=2, batch_size=2
    )
    config = harness.compose_verl_config([*overrides, *standalone_overrides(replicas=2, scripted=True)])
    client = harness.verl_llm_client(config, setup["addresses"][:1])
    before = setup["gym"].endpoint_file.read_text() if setup["gym"].endpoint_file.exists() else None
    expected = r"no model server 'no_such_server' \(its model servers: \['policy_model'\]"
    with pytest.raises(GymConfigError, match=expected), harness.manager_over(config, client):
        pass
    after = setup["gym"].endpoint_file.read_text() if setup["gym"].endpoint_file.exists() else None
    assert after == before  # nothing was published
