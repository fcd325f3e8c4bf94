# SPDX-License-Identifier: Apache-2.0
"""Attach mode's pure parts and its HTTP relay, with exact expectations.

- the config's rules (`nemo_gym.attach` excludes the settings of a Gym the plugin starts);
- `policy_handover`: what an attached Gym's configuration must hold to be handed verl's policy, each refusal named;
- `publish_endpoint`: the file Gym's `vllm_model` re-reads, written whole;
- `RemoteServerWatch` (`over_http/health.py`): consecutive unanswered probes of a remote Gym server;
- `pick_server` and `PolicyRelay`: requests passed on whole to the least busy policy server. The upstream servers
  here are small HTTP servers in threads (stand-ins for vLLM: the relay never reads what it passes on); the relay
  in front of verl's real vLLM servers runs in `test_attach.py`;
- an attach that finds nothing to attach to ends at its deadline, naming the head server.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from recipe.nemo_gym.config import ConfigError, NeMoGymConfig, load_config
from recipe.nemo_gym.event_loop import BackgroundLoop
from recipe.nemo_gym.gym.attach import (
    AttachedGym,
    PolicyHandover,
    policy_handover,
    publish_endpoint,
)
from recipe.nemo_gym.gym.errors import GymConfigError, GymServerDied, GymStartTimeout
from recipe.nemo_gym.gym.over_http.client import ServerInstance, server_root
from recipe.nemo_gym.gym.over_http.health import RemoteServerWatch
from recipe.nemo_gym.gym.relay import Affinity, PolicyRelay, conversation_key
from recipe.nemo_gym.gym.replicas import pick_server
from recipe.nemo_gym.gym.types import PolicyServers
from tests.support.helpers import free_port

MODEL = "/models/tiny"


def gym_config(**settings) -> dict:
    """An attached Gym's `/global_config_dict_yaml` as the head server sends it (interpolations unresolved)."""
    vllm = {
        "base_url": "${policy_base_url}",
        "model": "${policy_model_name}",
        "return_token_id_information": True,
        "endpoint_file": "/shared/policy_endpoint",
        "endpoint_check_interval_s": 10.0,
    }
    vllm.update(settings)
    return {
        "policy_model": {"responses_api_models": {"vllm_model": vllm}},
        "judge_model": {"responses_api_models": {"openai_model": {"model": "judge"}}},
        "math_with_judge": {"resources_servers": {"math_with_judge": {}}},
        "policy_model_name": MODEL,
        "policy_base_url": "http://unpublished.invalid/v1",
    }


# ------------------------------------------------------------------------------------------- config


def test_attach_needs_no_config_paths_and_refuses_the_settings_of_a_started_gym(tmp_path):
    path = tmp_path / "plugin.yaml"
    path.write_text("nemo_gym:\n  attach:\n    head_server_url: http://gym-node:11000\n")
    attach = load_config(path).nemo_gym.attach
    assert (attach.head_server_url, attach.policy_model_server, attach.endpoint_file) == (
        "http://gym-node:11000",
        "policy_model",
        None,
    )
    path.write_text(
        "nemo_gym:\n  attach:\n    head_server_url: http://gym-node:11000\n  config_paths: [x.yaml]\n  log_dir: /logs\n"
    )
    with pytest.raises(ConfigError, match=r"config_paths, log_dir configure the NeMo Gym the plugin starts"):
        load_config(path)


def test_without_attach_config_paths_must_name_something():
    with pytest.raises(Exception, match=r"config_paths is empty: name the NeMo Gym configs to start"):
        NeMoGymConfig.model_validate({"nemo_gym": {"uses_reasoning_parser": False}})


def test_a_head_server_url_that_is_not_http_host_port_is_refused_naming_the_key(tmp_path):
    path = tmp_path / "plugin.yaml"
    path.write_text("nemo_gym:\n  attach:\n    head_server_url: gym-node:11000\n")
    with pytest.raises(ConfigError, match=r"nemo_gym\.attach\.head_server_url: String should match pattern"):
        load_config(path)


# ------------------------------------------------------------------------------------------- handover


def test_policy_handover_reads_the_endpoint_file_and_its_check_interval():
    assert policy_handover(gym_config(), "policy_model", MODEL) == PolicyHandover(
        "policy_model",
        Path("/shared/policy_endpoint"),
        10.0,
        "++policy_model.responses_api_models.vllm_model.forward_session_id_as_conversation_id=true",
    )
    # Gym names each call's episode: the relay can keep an episode on one server, and nothing is asked for.
    assert policy_handover(gym_config(forward_session_id_as_conversation_id=True), "policy_model", MODEL) == (
        PolicyHandover("policy_model", Path("/shared/policy_endpoint"), 10.0)
    )
    # The trainer's own path for the same file, where its nodes mount the file system elsewhere.
    ours = policy_handover(gym_config(endpoint_file="rel/path"), "policy_model", MODEL, Path("/mnt/shared/ep"))
    assert ours.endpoint_file == Path("/mnt/shared/ep")
    # A model given literally, not through ${policy_model_name}.
    assert policy_handover(gym_config(model=MODEL), "policy_model", MODEL).server == "policy_model"


def test_policy_handover_names_a_missing_model_server_and_the_ones_there_are():
    with pytest.raises(GymConfigError) as e:
        policy_handover(gym_config(), "policy", MODEL)
    assert str(e.value) == (
        "the attached NeMo Gym has no model server 'policy' (its model servers: ['judge_model', 'policy_model']); "
        "set nemo_gym.attach.policy_model_server to the one that serves the policy"
    )


def test_policy_handover_refuses_a_model_server_without_endpoint_file_support():
    with pytest.raises(GymConfigError, match=r"'judge_model' \(openai_model\) has no endpoint_file setting.*0\.7"):
        policy_handover(gym_config(), "judge_model", MODEL)


def test_policy_handover_lists_every_problem_with_the_gym_setting_that_fixes_it():
    config = gym_config(endpoint_file=None, return_token_id_information=False, model="other")
    with pytest.raises(GymConfigError) as e:
        policy_handover(config, "policy_model", MODEL)
    key = "policy_model.responses_api_models.vllm_model"
    assert str(e.value) == (
        "the attached NeMo Gym cannot be handed verl's policy: "
        f"start Gym with ++{key}.endpoint_file=<a path on a file system both jobs see>; "
        f"{key}.return_token_id_information is not true: Gym would not return the token IDs verl trains on "
        "(start it with vllm_model_for_training.yaml); "
        f"{key}.model is 'other' but verl serves '{MODEL}': start Gym with +policy_model_name={MODEL}"
    )


def test_policy_handover_refuses_a_relative_endpoint_file():
    with pytest.raises(GymConfigError, match=r"endpoint_file is 'ep', relative to Gym's folder"):
        policy_handover(gym_config(endpoint_file="ep"), "policy_model", MODEL)


# ------------------------------------------------------------------------------------------- endpoint file


def test_publish_endpoint_replaces_the_file_whole_and_leaves_nothing_else(tmp_path):
    path = tmp_path / "policy_endpoint"
    publish_endpoint(path, "http://10.0.0.5:8000/v1")
    assert path.read_text() == "http://10.0.0.5:8000/v1\n"
    publish_endpoint(path, "")
    assert path.read_text() == "\n"  # Gym strips it: empty means unpublished
    assert [p.name for p in tmp_path.iterdir()] == ["policy_endpoint"]


def test_publish_endpoint_into_a_folder_this_node_lacks_says_what_to_check(tmp_path):
    with pytest.raises(GymConfigError, match=r"folder .*/nowhere does not exist on this node.*endpoint_file"):
        publish_endpoint(tmp_path / "nowhere" / "ep", "http://x:1/v1")


# ------------------------------------------------------------------------------------------- health


def test_remote_server_watch_fails_a_server_only_after_consecutive_missed_probes():
    agent = ServerInstance("agent", "responses_api_agents", "simple_agent", "10.0.0.7", 5000)
    judge = ServerInstance("judge", "resources_servers", "math", "10.0.0.7", 5001)
    watch = RemoteServerWatch([agent, judge], timeout_s=1.0, max_failures=2)
    watch.record([(agent, False, "no answer within 1s"), (judge, True, "HTTP 200")])
    watch.record([(agent, True, "HTTP 200"), (judge, False, "cannot connect (Connection refused)")])
    assert watch.failures == {"agent": 0, "judge": 1}
    with pytest.raises(GymServerDied) as e:
        watch.record([(agent, True, "HTTP 200"), (judge, False, "cannot connect (Connection refused)")])
    assert e.value.servers == ("judge",)
    assert str(e.value).startswith(
        "NeMo Gym server 'judge' at http://10.0.0.7:5001 did not answer 2 health checks in a row "
        "(last: cannot connect (Connection refused))"
    )


# ------------------------------------------------------------------------------------------- relay


def test_pick_server_takes_the_least_busy_and_rotates_ties():
    assert pick_server([0, 0, 0], 0) == 0
    assert pick_server([0, 0, 0], 1) == 1
    assert pick_server([0, 0, 0], 2) == 2
    assert pick_server([2, 1, 1], 0) == 1
    assert pick_server([2, 1, 1], 2) == 2
    assert pick_server([0, 3, 0], 1) == 2
    assert pick_server([5], 3) == 0
    assert server_root("http://10.0.0.5:8000/v1") == server_root("http://10.0.0.5:8000/v1/") == "http://10.0.0.5:8000"


class Upstream:
    """An HTTP server in a thread that records each request and answers with its own name; `hold` keeps requests
    open until released (to make one server busy)."""

    def __init__(self, name: str):
        self.name = name
        self.requests: list[tuple[str, str, bytes, str | None]] = []
        self.hold = threading.Event()
        self.hold.set()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                upstream.requests.append(("POST", self.path, body, self.headers.get("Authorization")))
                upstream.hold.wait(10)
                status = 400 if b"bad" in body else 200
                data = json.dumps({"server": upstream.name, "echo": body.decode()}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.hold.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def upstreams():
    servers = [Upstream("a"), Upstream("b")]
    yield servers
    for server in servers:
        server.close()


async def _post(session, url: str, body: bytes, headers=None):
    async with session.post(url, data=body, headers=headers or {}) as response:
        return response.status, await response.read(), response.headers.get("Content-Type")


def test_relay_passes_requests_and_answers_on_whole_and_spreads_them(upstreams):
    import aiohttp

    async def scenario():
        relay = PolicyRelay([u.url for u in upstreams])
        port = await relay.start("127.0.0.1", 0)
        base = f"http://127.0.0.1:{port}"
        body = json.dumps({"messages": [{"role": "user", "content": "héllo"}], "prompt_token_ids": [1, 2]}).encode()
        try:
            async with aiohttp.ClientSession() as session:
                first = await _post(session, f"{base}/v1/chat/completions?x=1", body, {"Authorization": "Bearer k"})
                second = await _post(session, f"{base}/tokenize", b'{"bad": 1}')
        finally:
            await relay.close()
        return relay, first, second

    relay, first, second = asyncio.run(scenario())
    a, b = upstreams
    assert a.requests == [("POST", "/v1/chat/completions?x=1", first_body := a.requests[0][2], "Bearer k")]
    assert json.loads(first_body)["messages"][0]["content"] == "héllo"
    assert first == (200, json.dumps({"server": "a", "echo": first_body.decode()}).encode(), "application/json")
    # Idle servers take turns; an upstream's error status and body come back as they were.
    assert b.requests == [("POST", "/tokenize", b'{"bad": 1}', None)]
    assert second[0] == 400 and json.loads(second[1])["server"] == "b"
    assert relay.served == [1, 1] and relay.in_flight == [0, 0]
    assert dict(relay.paths) == {"/v1/chat/completions": 1, "/tokenize": 1}


def test_relay_sends_new_requests_past_a_busy_server(upstreams):
    import aiohttp

    a, b = upstreams
    a.hold.clear()  # a holds whatever it gets

    async def scenario():
        relay = PolicyRelay([a.url, b.url])
        port = await relay.start("127.0.0.1", 0)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        try:
            async with aiohttp.ClientSession() as session:
                held = asyncio.ensure_future(_post(session, url, b"{}"))
                while relay.in_flight != [1, 0]:
                    await asyncio.sleep(0.01)
                answers = [await _post(session, url, b"{}") for _ in range(3)]
                a.hold.set()
                await held
        finally:
            await relay.close()
        return relay, answers

    relay, answers = asyncio.run(scenario())
    assert [json.loads(body)["server"] for _, body, _ in answers] == ["b", "b", "b"]
    assert relay.served == [1, 3]


def test_the_conversation_id_is_read_from_the_key_gym_adds_and_never_from_text_in_a_message():
    body = {"messages": [{"role": "user", "content": 'say "conversation_params": {"conversation_id": "fake"}'}]}
    assert conversation_key(json.dumps(body).encode()) is None
    body["conversation_params"] = {"conversation_id": "b3f1-7"}
    assert conversation_key(json.dumps(body).encode()) == b"b3f1-7"
    assert conversation_key(json.dumps(body, separators=(",", ":")).encode()) == b"b3f1-7"


def test_affinity_keeps_a_conversation_on_its_first_server_and_forgets_the_least_recent():
    affinity = Affinity(capacity=2)
    assert affinity.server_for(b"e1", [0, 0], start=0) == (0, False)
    assert affinity.server_for(b"e2", [1, 0], start=1) == (1, False)
    assert affinity.server_for(b"e1", [5, 0], start=1) == (0, True)  # busy or not, its server
    assert affinity.server_for(b"e3", [1, 1], start=0) == (0, False)  # a third: e2, least recent, is forgotten
    assert list(affinity.servers) == [b"e1", b"e3"]


def test_relay_keeps_every_call_of_an_episode_on_one_server_and_spreads_episodes(upstreams):
    """Two episodes of three calls each, one after the other, as Gym 0.7's vllm_model sends them with
    `forward_session_id_as_conversation_id`: each episode's calls all reach its first call's server, and the second
    episode starts on the other. Without affinity (a benchmark's comparison) the same calls alternate."""
    import aiohttp

    def call(episode: str, turn: int) -> bytes:
        return json.dumps(
            {"messages": [{"content": f"turn {turn}"}], "conversation_params": {"conversation_id": episode}}
        ).encode()

    async def scenario(affinity: bool):
        relay = PolicyRelay([u.url for u in upstreams], affinity=affinity)
        port = await relay.start("127.0.0.1", 0)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        try:
            async with aiohttp.ClientSession() as session:
                served = []
                for episode in ("e1", "e2"):
                    for turn in range(3):
                        _, body, _ = await _post(session, url, call(episode, turn))
                        served.append(json.loads(body)["server"])
        finally:
            await relay.close()
        return relay, served

    relay, served = asyncio.run(scenario(affinity=True))
    assert served == ["a", "a", "a", "b", "b", "b"]
    assert relay.pinned == 4  # every call after an episode's first
    _, spread = asyncio.run(scenario(affinity=False))
    assert spread == ["a", "b", "a", "b", "a", "b"]


def test_relay_answers_502_naming_a_policy_server_it_cannot_reach(upstreams):
    import aiohttp

    dead = f"http://127.0.0.1:{free_port()}/v1"

    async def scenario():
        relay = PolicyRelay([dead])
        port = await relay.start("127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as session:
                return await _post(session, f"http://127.0.0.1:{port}/v1/chat/completions", b"{}")
        finally:
            await relay.close()

    status, body, _ = asyncio.run(scenario())
    assert status == 502
    assert body.decode().startswith(f"policy relay: policy server {dead[: -len('/v1')]} failed: ")


# ------------------------------------------------------------------------------------------- attach


def test_attaching_to_nothing_ends_at_the_deadline_naming_the_head_server():
    url = f"http://127.0.0.1:{free_port()}"
    config = NeMoGymConfig.model_validate(
        {"nemo_gym": {"attach": {"head_server_url": url}}, "timeouts": {"startup_s": 3}}
    )
    with BackgroundLoop(name="attach-test") as loop:
        t0 = time.monotonic()
        with pytest.raises(GymStartTimeout) as e:
            AttachedGym.attach(config, PolicyServers(("http://127.0.0.1:1/v1",), MODEL), loop=loop)
        assert time.monotonic() - t0 < 10
    assert str(e.value).startswith(f"the NeMo Gym at {url} was not ready within 3s (its head server did not answer)")
    assert e.value.servers == ("head_server",)


def test_the_yaml_refuses_a_head_server_url_that_is_not_http_host_port(tmp_path):
    path = tmp_path / "plugin.yaml"
    for url in ("ftp://x", "https://gym:11000", "http://gym:11000/prefix"):  # the head server speaks plain HTTP
        path.write_text(f"nemo_gym:\n  attach:\n    head_server_url: {url}\n")
        with pytest.raises(ConfigError, match=r"nemo_gym\.attach\.head_server_url: String should match pattern"):
            load_config(path)
