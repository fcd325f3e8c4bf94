# SPDX-License-Identifier: Apache-2.0
"""Load: many concurrent NeMo Gym episodes through the real manager on CPU, with open file descriptors sampled.

One batch of `--episodes` episodes (NeMo Gym's example rows of `--env`, cycled; `rollout.n=1`) goes through
`NeMoGymAgentLoopManager.create` and `generate_sequences` exactly as verl's trainer calls them: verl's real
`LLMServerClient`, NeMo Gym's real servers for the environment (`weather`: a tool call and its answer;
`math`: `math_with_judge`, judge off) and training model server, and verl's own vLLM rollout on vLLM's CPU build
(standalone, one replica) playing a scripted policy inside the real engine (`tests/support/engine/scripted_logits.py`).
The whole batch is handed over at once, so every episode is in flight together up to what the connector limits
let through.

While the batch runs, a thread samples `psutil.Process.num_fds()` of this process (the manager), of every NeMo
Gym server process and of the policy server (verl's `vLLMHttpServer` actor), every `--sample-interval-s`.
Reported: episodes/s and model calls/s (batch wall time), orchestration CPU per model call (CPU time of the manager
and of every Gym server process during the batch, over the model calls), start-up time, the peak FD count of each
process next to that process's own soft RLIMIT_NOFILE, the connector limits NeMo Gym's servers were given (read from
their environment, where NeMo Gym puts its whole config) and the one this process's client (the runtime's, which
posts the rows) uses, the Gym release, failures, rewards, and any "Too many open files" in the servers' logs.

`--nofile N` sets this process's RLIMIT_NOFILE to N, soft and hard, before anything starts (the NeMo Gym
servers inherit it; with only the soft limit lowered, `ray.init` would raise it back to the hard one).
`--policy cpu-server` serves the policy with the test-support CPU policy server (`cpu_policy/server.py`, vLLM's
OpenAI server over our own CPU engine; the scripted answers cost next to nothing), so that the figures measure the
orchestration (the manager and Gym) rather than the policy. `--server-workers N` runs the model server and the
environment server (relay) as N processes each (Gym 0.7's `num_workers`; its simple_agent cannot run so).
`--env flaky` measures what retries add to a batch: after a warm-up, `--rounds` pairs of batches of uppercase_share's
rows on the tests' `fail_on_request` server (`tests/cpu/gym_envs`), the first with no failure, the second with each
verify failing at random at `--transient-failure-pct` (HTTP 500; the manager retries it `--retries` times).
`--replicas K` runs the environment's agent as K copies, each with its own resources and environment server
(`nemo_gym.replicas`); the report gives CPU per model call by role (manager, relay, agent, model server, resources
server, policy server), all of a role's processes together and its busiest one alone. Run it under `taskset -c ...`
to measure on fewer cores (the report says how many it had). The manager's CPU is also given by thread
(`manager_threads`): its event loop (`nemo-gym`, where rows are posted and results read), the benchmark's own
`fd-sampler` (taken out of the manager's figure) and the rest (Ray's, verl's).
`--batches B` measures B batches of `--episodes` one after another (the same rows; episodes, calls, failures,
retries and recoveries summed): few episodes in flight keep the machine below saturation, so that CPU per call is
compared without the contention of a full batch on two cores.
`--collect-processes N` has the manager post the rows and read the results in N child processes
(`nemo_gym.collect_processes`), reported as the role "collect process"; they start with the first batch, so it needs
`--warmup W`, a first batch of W episodes that is not measured (it may be given alone too, for comparison).
`--turns T --filler-words W` (`--env weather`) makes each episode T model calls, each tool call written after W
words, so that results grow long (each call's prompt token IDs are in the result): verl's response length is sized
to hold the episode (`response_length`), and the tiny model's 8,192-token context must hold the last call's prompt
plus that length (T=8 with W=100 fits: about 2,600 tokens an episode).
`--direct-to-agent` posts rows to the agents themselves, past Gym 0.7's environment servers (a comparison only).
`--nemo-gym-default-limits` sets NeMo Gym's own default connector limits in `nemo_gym.config_overrides` (the
user's keys win over the derived ones), for comparison. `--json PATH` writes the report as JSON (the load
test reads it). Without `--policy-address` the policy (a local Ray and verl's rollout in it) is started and
stopped here; with it, `--ray-address` names the Ray to join (the load test uses the suite's shared verl vLLM
server), and every row names the `--env`'s script for the engine (`tests/support/engine/shared_engine.py`).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_load.py [--episodes 512] [--nofile 1024]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import psutil
import yaml

from recipe.nemo_gym.gym.over_http.limits import (
    LIMIT_KEY,
    LIMIT_PER_HOST_KEY,
    NEMO_GYM_DEFAULT_LIMIT,
    NEMO_GYM_DEFAULT_LIMIT_PER_HOST,
)
from recipe.nemo_gym.ports import pick_free_port
from recipe.nemo_gym_demo.data import write_jsonl
from tests.support.gym_runtime import TRAINING_MODEL_SERVER_CONFIG as MODEL_SERVER_CONFIG

GYM_ENVS = Path(__file__).resolve().parents[1] / "tests" / "cpu" / "gym_envs"
EMFILE_TEXT = "Too many open files"
POLICY_SERVER = "policy_server"  # the name its row has in the report


class Environment(NamedTuple):
    agent: str
    config_path: str
    data_path: str
    overrides: dict[str, Any]


ENVIRONMENTS = {
    # One model call; the verify is a character count (our own environment, from the repository): what the batch
    # costs is the manager, Gym's relay, agent and model server, not the environment.
    "uppercase": Environment(
        agent="uppercase_share_simple_agent",
        config_path="resources_servers/uppercase_share/configs/uppercase_share.yaml",
        data_path="resources_servers/uppercase_share/data/example.jsonl",
        overrides={},
    ),
    # Two model calls per episode with a real tool call between them (NeMo Gym's get_weather); verify gives 1.
    "weather": Environment(
        agent="example_single_tool_call_simple_agent",
        config_path="resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml",
        data_path="resources_servers/example_single_tool_call/data/example.jsonl",
        overrides={},
    ),
    # uppercase_share's rows on the tests' `fail_on_request` server, whose verify fails a share of its calls at random
    # (`--transient-failure-pct`; an HTTP 500, retried by the manager): what retries add to a batch.
    "flaky": Environment(
        agent="fail_on_request_simple_agent",
        config_path=str(GYM_ENVS / "resources_servers/fail_on_request/configs/fail_on_request.yaml"),
        data_path="resources_servers/uppercase_share/data/example.jsonl",
        overrides={},
    ),
    # One model call; math-verify runs in a forked child per episode (about 0.15 s of CPU each here), under a
    # 10 s timeout by default that a saturated 2-core machine can miss: raised so that load cannot change rewards.
    "math": Environment(
        agent="math_with_judge_simple_agent",
        config_path="resources_servers/math_with_judge/configs/math_with_judge.yaml",
        data_path="resources_servers/math_with_judge/data/example.jsonl",
        overrides={
            "math_with_judge": {"resources_servers": {"math_with_judge": {"library_verifier_timeout_seconds": 300}}}
        },
    ),
}


POLICY_OVERRIDES = ["actor_rollout_ref.rollout.max_num_seqs=256"]
"""verl's vLLM server for a load: every one of 512 episodes' model calls in the engine's batch at once (the CPU
backend's 32 queued them: about 1.3 episodes/s)."""


def weather_policy(turns: int = 2, filler_words: int = 0) -> Any:
    """Scripted policy for the weather rows: call get_weather `turns - 1` times, each call after `filler_words` words
    of text, then answer once the last tool result is in. The default is the environment's own episode (2 calls)."""
    from tests.support.cpu_policy.script import ScriptCompletion, ScriptedPolicy, ScriptMatch, ScriptRule

    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "San Francisco"}}\n</tool_call>'
    filler = " ".join(f"step{i % 97}" for i in range(filler_words))
    return ScriptedPolicy(
        rules=[
            ScriptRule(
                name="last tool result seen: answer",
                when=ScriptMatch(last_message_regex="<tool_response>", assistant_turns=turns - 1),
                completion=ScriptCompletion(text="It is cold in San Francisco: take a coat."),
            ),
            ScriptRule(
                name="call the tool",
                completion=ScriptCompletion(text=f"{filler}\n{call}" if filler else call),
            ),
        ]
    )


def uppercase_policy() -> Any:
    """Scripted policy for the uppercase rows: an answer all in capitals (reward 1)."""
    from tests.support.cpu_policy.script import ScriptCompletion, ScriptedPolicy, ScriptRule

    return ScriptedPolicy(rules=[ScriptRule(name="shout", completion=ScriptCompletion(text="PARIS"))])


def policy_for(env: str, turns: int = 2, filler_words: int = 0) -> Any:
    from tests.support.cpu_policy.episodes import example_episodes_policy

    if env in ("uppercase", "flaky"):
        return uppercase_policy()
    return weather_policy(turns, filler_words) if env == "weather" else example_episodes_policy()


def expected_reward(env: str, row: dict[str, Any]) -> float:
    if env in ("weather", "uppercase", "flaky"):
        return 1.0
    return 1.0 if row.get("expected_answer") == "32" else 0.0  # the scripted math answer is always 32


class FDSampler:
    """Samples `num_fds()` of a fixed set of processes on a thread; keeps each one's peak and the peak sum. The
    thread's own CPU (`sampler_cpu_s`) is taken out of this process's: the sampler is the benchmark, not the
    manager."""

    def __init__(self, processes: dict[int, str], interval_s: float):
        self.processes = {pid: (name, psutil.Process(pid)) for pid, name in processes.items()}
        self.interval_s = interval_s
        self.peak: dict[int, int] = dict.fromkeys(self.processes, 0)
        self.peak_rss: dict[int, int] = dict.fromkeys(self.processes, 0)
        self.peak_total = 0
        self.samples = 0
        self.cpu_start = {pid: _cpu_s(proc) for pid, (_, proc) in self.processes.items()}
        self.cpu_used: dict[int, float] = {}
        self.sampler_cpu_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fd-sampler", daemon=True)

    def _sample(self) -> None:
        total = 0
        for pid, (_, proc) in self.processes.items():
            try:
                n = proc.num_fds()
                rss = proc.memory_info().rss
            except psutil.Error:
                continue
            self.peak[pid] = max(self.peak[pid], n)
            self.peak_rss[pid] = max(self.peak_rss[pid], rss)
            total += n
        self.peak_total = max(self.peak_total, total)
        self.samples += 1

    def _run(self) -> None:
        started = time.thread_time()
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)
        self.sampler_cpu_s = time.thread_time() - started

    def __enter__(self) -> FDSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self._sample()
        self.cpu_used = {pid: _cpu_s(proc) - self.cpu_start[pid] for pid, (_, proc) in self.processes.items()}
        own = os.getpid()
        if own in self.cpu_used:
            self.cpu_used[own] -= self.sampler_cpu_s

    def report(self) -> list[dict[str, Any]]:
        rows = []
        for pid, (name, proc) in self.processes.items():
            try:
                soft = proc.rlimit(psutil.RLIMIT_NOFILE)[0]
            except psutil.Error:
                soft = None
            row = {"pid": pid, "name": name, "peak_fds": self.peak[pid], "soft_nofile": soft}
            row["peak_rss_mb"] = round(self.peak_rss[pid] / 2**20, 1)
            rows.append(row | {"cpu_s": round(self.cpu_used.get(pid, 0.0), 2)})
        return rows


ROLES = {
    "responses_api_agents": "agent",
    "environment_servers": "relay",
    "responses_api_models": "model server",
    "resources_servers": "resources server",
}


COLLECT_PROCESS = "collect process"  # the manager's children (`nemo_gym.collect_processes`)


def reward_of(result: Any) -> float:
    """A result's reward: Gym's dict, or the `Episode` a collect process read it into."""
    return float(result["reward"]) if isinstance(result, dict) else float(result.reward)


def model_calls(result: Any) -> int:
    """A result's model calls: the output items carrying generated tokens, or an `Episode`'s generation segments."""
    if isinstance(result, dict):
        return sum(1 for item in result["response"]["output"] if item.get("generation_token_ids") is not None)
    return len(result.segments[1::2])


def cpu_by_role(processes: list[dict[str, Any]], kinds: dict[str, str], calls: int) -> dict[str, dict[str, Any]]:
    """CPU during the batch per role (manager, relay, agent, model server, resources server, policy server): the
    servers of a role (copies and uvicorn workers included), their process count, CPU-s, and CPU-ms per model call
    (all of the role's processes together, and the busiest one alone: the one a single process caps), and the sum
    of the processes' peak RSS."""
    roles: dict[str, dict[str, Any]] = {}
    for row in processes:
        role = ROLES.get(kinds.get(row["name"], ""), row["name"])
        entry = roles.setdefault(
            role, {"servers": set(), "processes": 0, "cpu_s": 0.0, "busiest_cpu_s": 0.0, "peak_rss_mb": 0.0}
        )
        entry["servers"].add(row["name"])
        entry["peak_rss_mb"] = round(entry["peak_rss_mb"] + row["peak_rss_mb"], 1)
        entry["processes"] += 1
        entry["cpu_s"] += row["cpu_s"]
        entry["busiest_cpu_s"] = max(entry["busiest_cpu_s"], row["cpu_s"])
    for entry in roles.values():
        entry["servers"] = len(entry["servers"])
        entry["cpu_ms_per_call"] = round(1000 * entry["cpu_s"] / max(calls, 1), 2)
        entry["busiest_cpu_ms_per_call"] = round(1000 * entry["busiest_cpu_s"] / max(calls, 1), 2)
        entry["cpu_s"] = round(entry["cpu_s"], 2)
    return roles


def thread_cpu_s() -> dict[int, tuple[str, float]]:
    """This process's threads: native id -> (name, CPU-s so far). Python threads by their `threading` name, the
    others (Ray's, gRPC's, the tokenizer's) by their OS name."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    threads = {}
    for thread in psutil.Process().threads():
        name = names.get(thread.id)
        if name is None:
            try:
                name = Path(f"/proc/self/task/{thread.id}/comm").read_text().strip()
            except OSError:
                name = "?"
        threads[thread.id] = (name, thread.user_time + thread.system_time)
    return threads


def cpu_by_thread(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], calls: int) -> list:
    """The manager's CPU during the batch by thread name (threads of one name summed; one started during the batch
    counts from zero, one that ended is lost), busiest first: `[name, threads, CPU-ms per call]`."""
    named: dict[str, list[float]] = {}
    for tid, (name, cpu) in after.items():
        entry = named.setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] += cpu - before.get(tid, (name, 0.0))[1]
    rows = [[name, count, round(1000 * cpu / max(calls, 1), 3)] for name, (count, cpu) in named.items()]
    return sorted((row for row in rows if row[2] > 0), key=lambda row: -row[2])


def _cpu_s(proc: psutil.Process) -> float:
    try:
        times = proc.cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system


def server_connector_limits(pids: dict[int, str]) -> dict[str, dict[str, Any]]:
    """The connector keys of NeMo Gym's global config as each server process received it (its environment)."""
    found = {}
    for pid, name in pids.items():
        try:
            raw = psutil.Process(pid).environ().get("NEMO_GYM_CONFIG_DICT")
        except psutil.Error:
            continue
        if raw:
            config = yaml.safe_load(raw)
            found[name] = {LIMIT_KEY: config.get(LIMIT_KEY), LIMIT_PER_HOST_KEY: config.get(LIMIT_PER_HOST_KEY)}
    return found


def is_emfile_error(line: str) -> bool:
    """A log line reporting EMFILE; not the start-up warning vLLM and NeMo Gym print when they cannot raise
    the soft limit ("Found ulimit of ... failed to automatically increase ..."), which quotes the error text."""
    return (EMFILE_TEXT in line or "Errno 24" in line) and "failed to automatically increase" not in line


def emfile_lines(paths: list[Path]) -> list[str]:
    hits = []
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        hits += [f"{path.name}: {line.strip()[:300]}" for line in text.splitlines() if is_emfile_error(line)]
    return hits


def environments_file(
    path: Path,
    env: Environment,
    *,
    head_port: int,
    log_dir: Path,
    batch_s: float,
    default_limits: bool,
    server_workers: int = 1,
    retries: int = 1,
    replicas: int = 1,
    collect_processes: int = 0,
) -> Path:
    overrides: dict[str, Any] = json.loads(json.dumps(env.overrides))
    if server_workers > 1:
        # Gym 0.7 runs a server as several uvicorn processes with `num_workers`, where its app.py exports `app` for
        # them: vllm_model and the legacy_agent relay do, simple_agent does not (uvicorn: 'Attribute "app" not found
        # in module "responses_api_agents.simple_agent.app"', Gym 0.7.0).
        model = overrides.setdefault("policy_model", {}).setdefault("responses_api_models", {})
        model.setdefault("vllm_model", {})["num_workers"] = server_workers
        relay = f"{env.agent.removesuffix('_simple_agent')}_environment_server"
        relay_config = {"entrypoint": "app.py", "agent_server": {"type": "responses_api_agents", "name": env.agent}}
        overrides[relay] = {"environment_servers": {"legacy_agent": relay_config | {"num_workers": server_workers}}}
    if default_limits:
        overrides |= {LIMIT_KEY: NEMO_GYM_DEFAULT_LIMIT, LIMIT_PER_HOST_KEY: NEMO_GYM_DEFAULT_LIMIT_PER_HOST}
    config = {
        "nemo_gym": {
            "config_paths": [MODEL_SERVER_CONFIG, env.config_path],
            "uses_reasoning_parser": False,
            "head_server": {"port": head_port},
            "log_dir": str(log_dir),
            "config_overrides": overrides,
            **({"replicas": {env.agent: replicas}} if replicas > 1 else {}),
            **({"collect_processes": collect_processes} if collect_processes else {}),
        },
        # The manager's default health-check interval (10 s): at 2 s, three /health probes that a policy server busy
        # with 512 episodes on a loaded 2-core machine answered late (10 s each) aborted the batch (CI, on 2 cores
        # shared with a vLLM engine of another test module).
        "timeouts": {"startup_s": 600, "batch_s": batch_s, "health_check_interval_s": 10},
        # Every episode must succeed (a single failure fails the batch), except where failures are injected.
        "failures": {"max_fraction": 1.0 if env.agent.startswith("fail_on") else 0.0, "retries": retries},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def retry_cost(manager: Any, dataset: Any, config: Any, episodes: int, rounds: int) -> list[dict[str, float]]:
    """`--env flaky`: a warm-up batch, then `rounds` pairs of batches on the same engine and Gym, one whose verifies
    never fail and one whose verifies fail at `--transient-failure-pct` (the manager retries them): wall times and
    the retry counts of each pair."""
    from tests.support.cpu_policy import harness

    def batch(indices: range) -> tuple[float, dict[str, float]]:
        _, rows = harness.trainer_batches(dataset, indices, config)
        t0 = time.perf_counter()
        output = manager.generate_sequences(rows)
        return time.perf_counter() - t0, output.meta_info["timing"]

    clean, failing = range(episodes), range(episodes, 2 * episodes)
    batch(clean)  # warm-up: the engine's first batch of this size
    pairs = []
    for _ in range(rounds):
        clean_s, _ = batch(clean)
        failing_s, timing = batch(failing)
        pairs.append(
            {
                "clean_s": clean_s,
                "failing_s": failing_s,
                "retried": timing["nemo_gym/all/retried"],
                "recovered": timing["nemo_gym/all/recovered"],
                "failed": timing["nemo_gym/all/failed"],
            }
        )
        print(f"retry cost: {pairs[-1]}", flush=True)
    return pairs


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from recipe.nemo_gym.agent_loop import NeMoGymAgentLoopManager
    from recipe.nemo_gym.dataset import NeMoGymJSONLDataset
    from recipe.nemo_gym.failures import EpisodeFailure
    from recipe.nemo_gym.gym.owned.gym_layout import nemo_gym_install_root
    from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
    from tests.support.cpu_policy import harness
    from tests.support.engine.script_choice import scripted_row
    from tests.support.engine.standalone import init_local_ray, standalone_overrides, verl_rollout

    report: dict[str, Any] = {
        "env": args.env,
        "policy": args.policy if args.policy_address is None else args.policy_address,
        "server_workers": args.server_workers,
        "replicas": args.replicas,
        "collect_processes": args.collect_processes,
        "warmup_episodes": args.warmup,
        "cpus": len(os.sched_getaffinity(0)),
        "direct_to_agent": args.direct_to_agent,
        "episodes": args.episodes * args.batches,
        "batches": args.batches,
    }
    tmp = Path(tempfile.mkdtemp(prefix="bench-load-"))
    model_dir = tiny_qwen3_dir()
    env = ENVIRONMENTS[args.env]
    # Our own environment's rows are in the repository (the current directory), Gym's in its installed root.
    data_root = Path.cwd() if (Path.cwd() / env.data_path).is_file() else nemo_gym_install_root()
    examples = [json.loads(line) for line in (data_root / env.data_path).read_text().splitlines() if line]
    for row in examples:
        row["agent_ref"] = {"type": "responses_api_agents", "name": env.agent}
    rows = [json.loads(json.dumps(examples[i % len(examples)])) for i in range(args.episodes)]
    if args.env == "flaky":
        os.environ["NEMO_GYM_EXTRA_ROOTS"] = str(GYM_ENVS)  # where Gym 0.7 finds the test server
        # The first half of the file asks for no failure, the second for --transient-failure-pct: the paired batches.
        failing = json.loads(json.dumps(rows))
        for row in rows:
            row["responses_create_params"]["input"][-1]["content"] += " FAIL_RATE_0"
        for row in failing:
            row["responses_create_params"]["input"][-1]["content"] += f" FAIL_RATE_{args.transient_failure_pct}"
        rows += failing
    policy = policy_for(args.env, args.turns, args.filler_words)
    if args.policy_address is not None:
        # A running verl vLLM server (the suite's shared engine) plays the script each request names.
        script = policy.to_file(tmp / "script.json")
        rows = [scripted_row(row, script) for row in rows]
    data = write_jsonl(rows, tmp / "rows.jsonl")
    config_path = environments_file(
        tmp / "plugin.yaml",
        env,
        head_port=args.head_port or pick_free_port(),
        log_dir=tmp / "logs",
        batch_s=args.batch_s,
        default_limits=args.nemo_gym_default_limits,
        server_workers=args.server_workers,
        retries=args.retries,
        replicas=args.replicas,
        collect_processes=args.collect_processes,
    )
    overrides = harness.cpu_trainer_overrides(
        model_dir, config_path, prompt_length=1024, response_length=response_length(args), n=1, batch_size=args.episodes
    )
    # The rollout keys are only read when the policy is started here (verl's standalone rollout).
    config = harness.compose_verl_config([*overrides, *standalone_overrides(scripted=True), *POLICY_OVERRIDES])
    dataset = NeMoGymJSONLDataset(data_files=[str(data)], tokenizer=None, processor=None, config=config.data)

    manager = None
    logs: list[Path] = []
    with contextlib.ExitStack() as stack:
        stack.callback(ray.shutdown)
        if args.policy_address is None and args.policy == "cpu-server":
            from tests.support.cpu_policy.server import CPUPolicyServer

            init_local_ray()  # for verl's load balancer actor, which lists the server
            server = stack.enter_context(CPUPolicyServer(model_dir, script=policy))
            policy_address, policy_pid = f"{server.host}:{server.port}", server.proc.pid
            logs.append(server.log_path)
        elif args.policy_address is None:
            init_local_ray()
            script = policy.to_file(tmp / "script.json")
            rollout = stack.enter_context(verl_rollout(config, script_file=script))
            policy_address, policy_pid = rollout.addresses[0], rollout.server_pid()
            logs.append(rollout.server_log())
        else:
            policy_address, policy_pid = args.policy_address, args.policy_pid
            ray.init(address=args.ray_address, log_to_driver=False)
        try:
            llm_client = harness.verl_llm_client(config, [policy_address])
            t0 = time.perf_counter()
            manager = NeMoGymAgentLoopManager.create(
                config=config, llm_client=llm_client, teacher_client=None, reward_loop_worker_handles=None
            )
            report["startup_s"] = time.perf_counter() - t0
            # Read after the start, as the manager read it (ray.init may have raised the soft limit to the hard one).
            report["nofile"] = list(resource.getrlimit(resource.RLIMIT_NOFILE))
            runtime = manager._gym  # noqa: SLF001 - the benchmark measures the servers' own processes
            if args.direct_to_agent:  # Gym 0.7: skip the environment server in front of each agent (bench only)
                from recipe.nemo_gym.gym.over_http.client import RunTarget

                connection = runtime.connection
                agents = connection.targets
                connection.targets = {s.name: RunTarget(s.name, s.url) for s in runtime.servers if s.name in agents}
            servers = {s.name for s in runtime.servers}
            server_pids = {pid: name for pid, name in runtime.pids().items() if name in servers}  # not Gym's Ray
            report["gym_version"] = runtime.version
            if args.env == "flaky":
                report["retry_cost"] = retry_cost(manager, dataset, config, args.episodes, args.rounds)
            if args.warmup:  # a first, small batch: it starts the collect processes, whose CPU is then watched too
                _, warmup = harness.trainer_batches(dataset, range(args.warmup), config)
                manager.generate_sequences(warmup)
            _, batch = harness.trainer_batches(dataset, range(args.episodes), config)
            collectors = runtime.connection.processes
            watched = {
                psutil.Process().pid: "manager",
                **server_pids,
                **{pid: COLLECT_PROCESS for pid in (collectors.pids if collectors else [])},
            }
            if policy_pid:
                watched[policy_pid] = POLICY_SERVER
            results = []
            counted = dict.fromkeys(("failed", "retried", "recovered"), 0.0)  # the manager's metrics, every batch's
            threads_before = thread_cpu_s()
            with FDSampler(watched, args.sample_interval_s) as sampler:
                t0 = time.perf_counter()
                for _ in range(args.batches):
                    output = manager.generate_sequences(batch)
                    results += manager.last_results
                    for key in counted:
                        counted[key] += output.meta_info["timing"][f"nemo_gym/all/{key}"]
                wall = time.perf_counter() - t0
                threads_after = thread_cpu_s()
            rewards = [reward_of(r) for r in results if not isinstance(r, EpisodeFailure)]
            calls = sum(model_calls(r) for r in results if not isinstance(r, EpisodeFailure))
            processes = sampler.report()
            orchestration_cpu_s = sum(row["cpu_s"] for row in processes if row["name"] != POLICY_SERVER)
            kinds = {s.name: s.server_type for s in runtime.servers}
            expected = [expected_reward(args.env, row) for row in rows[: args.episodes]] * args.batches
            if collectors is None:
                connector = runtime.connection._session.connector  # noqa: SLF001 - the client the rows were posted on
                limits = {"limit": connector.limit, "limit_per_host": connector.limit_per_host}
            else:
                limits = {"collect processes": collectors.count, "each": collectors.limits}
            report.update(
                {
                    "batch_wall_s": wall,
                    "episodes_per_s": args.episodes * args.batches / wall,
                    "model_calls": calls,
                    "tokens_per_episode": float(output.batch["attention_mask"].sum(-1).float().mean()),
                    "calls_per_s": calls / wall,
                    # CPU of the manager and every Gym server process (the policy server's aside) per model call.
                    "orchestration_cpu_ms_per_call": 1000 * orchestration_cpu_s / max(calls, 1),
                    "output_rows": len(output),
                    "failures": [str(r) for r in results if isinstance(r, EpisodeFailure)],
                    "failed_metric": counted["failed"],
                    "retried": counted["retried"],
                    "recovered": counted["recovered"],
                    "rewards_match": rewards == expected,
                    "reward_sum": sum(rewards),
                    "fd_samples": sampler.samples,
                    "sampler_cpu_s": round(sampler.sampler_cpu_s, 2),
                    "fd_peak_total": sampler.peak_total,
                    "processes": processes,
                    "roles": cpu_by_role(processes, kinds, calls),
                    "manager_threads": cpu_by_thread(threads_before, threads_after, calls),
                    "routed": dict(runtime.connection.router.routed),
                    "server_connector_limits": server_connector_limits(server_pids),
                    "manager_connector": limits,
                }
            )
        finally:
            if manager is not None:
                manager.shutdown()
            report["emfile_lines"] = emfile_lines([*sorted((tmp / "logs").glob("*.log")), *logs])
            shutil.rmtree(tmp, ignore_errors=True)  # rows, environments file and Gym's logs, read above
    return report


def response_length(args: argparse.Namespace) -> int:
    """verl's response length for the batch: 256, or room for `--turns` calls of `--filler-words` words each (a word
    and its space about 3 tokens, a call and its tool result about 100), rounded up to a multiple of 256."""
    needed = args.turns * (3 * args.filler_words + 100)
    return max(256, -(-needed // 256) * 256)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=512)
    parser.add_argument("--env", choices=sorted(ENVIRONMENTS), default="weather")
    parser.add_argument("--nofile", type=int, default=None, help="set RLIMIT_NOFILE (soft and hard) to this first")
    parser.add_argument("--nemo-gym-default-limits", action="store_true")
    parser.add_argument(
        "--policy",
        choices=["verl-vllm", "cpu-server"],
        default="verl-vllm",
        help="the policy started here: verl's vLLM rollout on vLLM's CPU build (default), or the test-support CPU "
        "policy server, whose scripted answers cost next to nothing (an orchestration ceiling)",
    )
    parser.add_argument(
        "--server-workers", type=int, default=1, help="Gym 0.7: run the model server and the relay as N processes"
    )
    parser.add_argument(
        "--replicas", type=int, default=1, help="run the environment's agent as K copies (nemo_gym.replicas)"
    )
    parser.add_argument(
        "--collect-processes",
        type=int,
        default=0,
        help="the manager's collect processes (nemo_gym.collect_processes); needs --warmup to watch their CPU",
    )
    parser.add_argument("--turns", type=int, default=2, help="--env weather: model calls per episode")
    parser.add_argument(
        "--filler-words", type=int, default=0, help="--env weather: words the policy writes before each tool call"
    )
    parser.add_argument(
        "--batches", type=int, default=1, help="measure this many batches of --episodes, one after another"
    )
    parser.add_argument("--warmup", type=int, default=0, help="run a batch of this many episodes first (not measured)")
    parser.add_argument("--policy-address", default=None, help="host:port of a running policy server (verl's vLLM)")
    parser.add_argument("--policy-pid", type=int, default=None, help="its pid, to sample its FDs too")
    parser.add_argument("--ray-address", default=None, help="the Ray to join with --policy-address (default: local)")
    parser.add_argument("--head-port", type=int, default=None)
    parser.add_argument("--batch-s", type=float, default=600.0)
    parser.add_argument("--sample-interval-s", type=float, default=0.1)
    parser.add_argument("--json", default=None)
    parser.add_argument("--transient-failure-pct", type=int, default=10, help="--env flaky: verifies failed, in %%")
    parser.add_argument("--retries", type=int, default=1, help="the plugin's failures.retries")
    parser.add_argument("--rounds", type=int, default=3, help="--env flaky: pairs of batches, clean and failing")
    parser.add_argument(
        "--direct-to-agent", action="store_true", help="post rows to the agents, not to Gym 0.7's environment servers"
    )
    args = parser.parse_args()
    if (args.turns != 2 or args.filler_words) and args.env != "weather":
        parser.error("--turns and --filler-words are for --env weather")
    if args.batches < 1:
        parser.error("--batches must be at least 1")
    if args.turns < 1:
        parser.error("--turns must be at least 1")
    if args.collect_processes and not args.warmup:
        parser.error("--collect-processes needs --warmup: the collect processes start with the first batch")
    if args.nofile is not None:
        # Soft and hard: `ray.init` raises a soft limit to the hard one in the calling process, as on a cluster
        # whose `ulimit -n` is N for both, nothing here can raise it again.
        resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, args.nofile))
    report = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    print(
        f"{report['episodes']} episodes in {report['batch_wall_s']:.1f} s: {report['episodes_per_s']:.1f} episodes/s "
        f"(start-up {report['startup_s']:.1f} s); RLIMIT_NOFILE {report['nofile']}; "
        f"failures {len(report['failures'])}; retried {report['retried']:.0f}, recovered {report['recovered']:.0f}; "
        f"'{EMFILE_TEXT}' lines {len(report['emfile_lines'])}"
    )
    print(
        f"NeMo Gym {report['gym_version']}: {report['model_calls']} model calls, {report['calls_per_s']:.1f} calls/s, "
        f"{report['orchestration_cpu_ms_per_call']:.1f} CPU-ms per call in the manager and Gym's servers; "
        f"{report['tokens_per_episode']:.0f} tokens per episode"
    )
    print(f"manager connector: {report['manager_connector']}; servers: {report['server_connector_limits']}")
    print(f"peak open FDs, all watched processes together: {report['fd_peak_total']} ({report['fd_samples']} samples)")
    for pair in report.get("retry_cost", []):
        print(
            f"retries: {pair['clean_s']:.1f} s without failures, {pair['failing_s']:.1f} s with "
            f"{args.transient_failure_pct}% ({pair['retried']:.0f} retried, {pair['recovered']:.0f} recovered, "
            f"{pair['failed']:.0f} failed)"
        )
    for role, entry in report["roles"].items():
        print(
            f"  {role:<18} {entry['servers']} server(s): "
            f"{entry['cpu_ms_per_call']:.2f} CPU-ms per call (busiest process {entry['busiest_cpu_ms_per_call']:.2f}), "
            f"peak RSS {entry['peak_rss_mb']:.0f} MB"
        )
    shown = ", ".join(f"{name} ×{count} {ms:.3f}" for name, count, ms in report["manager_threads"][:8])
    print(f"  the manager's CPU-ms per call by thread (the sampler's included): {shown}")
    print(f"episodes per agent copy: {report['routed']}")
    for row in report["processes"]:
        print(
            f"  {row['name']:<30} pid {row['pid']:<8} peak {row['peak_fds']:>6} fds (soft limit {row['soft_nofile']}), "
            f"{row['cpu_s']:.1f} s CPU during the batch"
        )


if __name__ == "__main__":
    main()
