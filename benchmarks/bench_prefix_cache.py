# SPDX-License-Identifier: Apache-2.0
"""Prefix-cache hit rate of multi-turn episodes on verl's vLLM rollout, from vLLM's own metrics.

A NeMo Gym episode sends its whole history at every model call; vLLM's prefix cache keeps the KV of the earlier
calls' tokens only on the server that computed them. With several rollout replicas, a call routed to another
replica than its episode's previous call recomputes the whole history. This measures what NeMo Gym's routing over
verl's servers does to the cache.

One batch through the real manager (`NeMoGymAgentLoopManager.create` / `generate_sequences`, as verl's trainer
calls them) over verl's own vLLM rollout on CPU (`tests/support/engine/standalone.py`: `--replicas` `vLLMHttpServer`
actors, vLLM's CPU engine, prefix caching on, as verl's default): NeMo Gym's workplace example rows, each episode
two model calls around a real tool call (the scripted example policy, forced inside the engine), `--n` samples per
row. Before and after the batch every server's Prometheus counters `vllm:prefix_cache_queries_total` and
`vllm:prefix_cache_hits_total` (prompt tokens looked up, and found, in the cache) are read from its `/metrics`;
the report gives per server and overall: tokens queried, tokens hit, hit rate, and model calls served.

`--relay affinity|spread` puts attach mode's relay (`recipe/nemo_gym/gym/relay.py`) between NeMo Gym and the
`--replicas` servers, as attach mode does with several verl servers: Gym's model server is handed the relay's one
address and sends each call's episode as a conversation id (`forward_session_id_as_conversation_id`, set here in
the environments file's `config_overrides`). `affinity` keeps every call of an episode on its first call's server;
`spread` sends each call to the least busy server (the relay with `affinity=False`), for comparison. Gym is
started by the manager here, not attached: what differs from attach mode is how Gym learns the relay's address (its
config, not the endpoint file), not the path a call takes.

For reference the report also gives the best possible rate for this batch: every call after an episode's first
could reuse its episode's previous prompt and generation, and a first call only what another episode of the same
row left (the shared system prompt and tools).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_prefix_cache.py [--replicas 1|2] [--n 4] [--json PATH]
    PYTHONPATH=. .venv/bin/python benchmarks/bench_prefix_cache.py --replicas 2 --relay affinity|spread
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from recipe.nemo_gym_demo.data import example_rows, with_tools, write_jsonl
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from tests.support.cpu_policy import harness
from tests.support.cpu_policy.episodes import example_episodes_policy

MULTIENV = harness.REPO_ROOT / "recipe" / "nemo_gym" / "configs" / "multienv.yaml"
WORKPLACE = "workplace_assistant_simple_agent"
TOOLS = ("company_directory_find_email_address", "email_reply_email")
COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:request_success_total")


def read_counters(address: str) -> dict[str, float]:
    """The summed value of each counter in `COUNTERS` on one vLLM server's /metrics."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=30) as response:
        text = response.read().decode()
    totals = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        match = re.match(r"^([a-z_:]+)(\{[^}]*\})? ([0-9.e+-]+)$", line)
        if match and match.group(1) in totals:
            totals[match.group(1)] += float(match.group(3))
    return totals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=1, help="verl rollout replicas (logical GPUs)")
    parser.add_argument("--n", type=int, default=4, help="samples per row (rollout.n)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--relay", choices=["affinity", "spread"], default=None, help="attach mode's relay in front of the servers"
    )
    args = parser.parse_args(argv)

    rows = [with_tools(r, TOOLS) for r in example_rows([WORKPLACE])]
    with tempfile.TemporaryDirectory(prefix="bench-prefix-") as tmp:
        data = write_jsonl(rows, Path(tmp) / "rows.jsonl")
        plugin = MULTIENV if args.relay is None else with_session_ids(MULTIENV, Path(tmp) / "plugin.yaml")
        overrides = [
            *harness.cpu_trainer_overrides(
                tiny_qwen3_dir(), plugin, prompt_length=2048, response_length=512, n=args.n, batch_size=len(rows)
            ),
            "actor_rollout_ref.rollout.disable_log_stats=false",  # vLLM's Prometheus counters
            "actor_rollout_ref.rollout.enable_prefix_caching=true",
        ]
        started = time.monotonic()
        policy = example_episodes_policy()
        relay = None
        if args.relay is None:
            stack_of = harness.manager_stack(tiny_qwen3_dir(), overrides, data, policy, replicas=args.replicas)
        else:
            stack_of = relayed_stack(overrides, data, policy, args.replicas, affinity=args.relay == "affinity")
        with stack_of as stack:
            startup_s = time.monotonic() - started
            addresses = stack["rollout"].addresses
            relay = stack.get("relay")
            before = {a: read_counters(a) for a in addresses}
            _, batch = harness.trainer_batches(stack["dataset"], range(len(rows)), stack["config"])
            t0 = time.monotonic()
            stack["manager"].generate_sequences(batch)
            batch_s = time.monotonic() - t0
            results = list(stack["manager"].last_results)
            after = {a: read_counters(a) for a in addresses}

    queries_key, hits_key, calls_key = COUNTERS
    servers = []
    for address in addresses:
        queried = after[address][queries_key] - before[address][queries_key]
        hit = after[address][hits_key] - before[address][hits_key]
        calls = after[address][calls_key] - before[address][calls_key]
        servers.append({"server": address, "queried": queried, "hit": hit, "calls": calls})
    queried = sum(s["queried"] for s in servers)
    hit = sum(s["hit"] for s in servers)

    # The best case: each call reuses its episode's previous prompt + generation; a first call, the longest prompt
    # prefix it shares with an earlier first call of the batch (vLLM caches whole blocks, so this is an upper bound).
    best = 0
    firsts: list[list[int]] = []
    for result in results:
        previous: list[int] | None = None
        for item in result["response"]["output"]:
            prompt = item.get("prompt_token_ids")
            if prompt is None:
                continue
            if previous is None:
                shared = max((_common_prefix(prompt, f) for f in firsts), default=0)
                firsts.append(prompt)
                best += shared
            else:
                best += _common_prefix(prompt, previous)
            previous = prompt + item["generation_token_ids"]
    report = {
        "replicas": args.replicas,
        "relay": args.relay,
        "relay_calls_kept_on_their_episodes_server": relay.pinned if relay is not None else None,
        "episodes": len(results),
        "startup_s": round(startup_s, 1),
        "batch_s": round(batch_s, 1),
        "servers": [{**s, "hit_rate": round(s["hit"] / s["queried"], 4) if s["queried"] else None} for s in servers],
        "queried": queried,
        "hit": hit,
        "hit_rate": round(hit / queried, 4) if queried else None,
        "best_possible_hit_rate": round(best / queried, 4) if queried else None,
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


def with_session_ids(environments_file: Path, path: Path) -> Path:
    """`environments_file` with Gym's model server sending each call's episode as a conversation id."""
    import yaml

    from recipe.nemo_gym.gym.attach import SESSION_ID_SETTING

    config = yaml.safe_load(environments_file.read_text())
    overrides = config["nemo_gym"].setdefault("config_overrides", {})
    model = overrides.setdefault("policy_model", {}).setdefault("responses_api_models", {})
    model.setdefault("vllm_model", {})[SESSION_ID_SETTING] = True
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.contextmanager
def relayed_stack(overrides: list[str], data: Path, policy, replicas: int, *, affinity: bool):
    """verl's rollout with `replicas` servers, a `PolicyRelay` in front of them on a loop of its own, and the real
    manager over verl's client listing the relay alone (so Gym's model server gets its one address)."""
    import ray

    from recipe.nemo_gym.dataset import NeMoGymJSONLDataset
    from recipe.nemo_gym.event_loop import BackgroundLoop
    from recipe.nemo_gym.gym.relay import PolicyRelay
    from tests.support.engine.standalone import init_local_ray, standalone_overrides, verl_rollout

    config = harness.compose_verl_config([*overrides, *standalone_overrides(replicas=replicas, scripted=True)])
    init_local_ray(gpus=replicas)
    loop = BackgroundLoop(name="bench-relay")
    try:
        with tempfile.TemporaryDirectory(prefix="scripted-policy-") as folder:
            script = policy.to_file(Path(folder) / "script.json")
            with verl_rollout(config, script_file=script) as rollout:
                relay = PolicyRelay([f"http://{a}/v1" for a in rollout.addresses], affinity=affinity)
                port = loop.run(relay.start("127.0.0.1", 0), timeout=30.0, what="relay")
                try:
                    dataset = NeMoGymJSONLDataset(
                        data_files=[str(data)], tokenizer=None, processor=None, config=config.data
                    )
                    client = harness.verl_llm_client(config, [f"127.0.0.1:{port}"])
                    with harness.manager_over(config, client) as manager:
                        yield {"config": config, "dataset": dataset, "manager": manager, "rollout": rollout,
                               "relay": relay}  # fmt: skip
                finally:
                    loop.run(relay.close(), timeout=30.0, what="relay close")
    finally:
        loop.close()
        ray.shutdown()


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


if __name__ == "__main__":
    sys.exit(main())
