# SPDX-License-Identifier: Apache-2.0
"""verl's own vLLM rollout on CPU without a trainer: for tests that drive the manager the way verl's trainer does.

`verl_rollout(config)` starts what verl 0.9.1's `LLMServerManager` starts when it is given no worker group
(standalone mode): per logical GPU one `vLLMReplica`, i.e. a `vLLMHttpServer` Ray actor running vLLM's `AsyncLLM`
engine (its CPU build), loading the weights from `actor_rollout_ref.model.path` (`rollout.load_format=auto`:
nothing syncs weights here), and verl's global load balancer over them. It yields a `Rollout`: verl's own
`LLMServerClient` over that balancer (what the trainer hands `NeMoGymAgentLoopManager.create`), the servers'
addresses and actor handles (a test kills one with `ray.kill`, as a dead GPU node would).

The splice patch reaches those servers exactly as on a GPU node: `VERL_USE_EXTERNAL_MODULES` names
`recipe.nemo_gym.vllm_plugin`, which verl imports in its server actors. verl's `LLMServerManager` runs in a small
launcher actor, so that it resolves verl's CPU platform in a process of its own (verl keeps the platform as a
process-wide singleton, which the test process may already hold). Ray must be running with the CPU backend's
environment (`init_local_ray`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from recipe.nemo_gym.cpu_backend.overrides import cpu_env, cpu_overrides
from recipe.nemo_gym.launch.leftovers import remove_leftovers
from tests.support.engine import SCRIPT_ENV, SCRIPTED_PROCESSOR, TEST_KV_CACHE

REPO_ROOT = Path(__file__).resolve().parents[3]


def standalone_overrides(*, replicas: int = 1, scripted: bool = False) -> list[str]:
    """The CPU backend's overrides plus what a rollout without a trainer needs: its own logical GPUs and the
    weights read from the model directory; with `scripted`, the scripted-turn processor and raw log-probs."""
    overrides = [
        *cpu_overrides(start_ray=False),
        "actor_rollout_ref.rollout.nnodes=1",
        f"actor_rollout_ref.rollout.n_gpus_per_node={replicas}",
        "actor_rollout_ref.rollout.load_format=auto",
        TEST_KV_CACHE,
    ]
    if scripted:
        overrides += [
            f"+actor_rollout_ref.rollout.engine_kwargs.vllm.logits_processors=['{SCRIPTED_PROCESSOR}']",
            "actor_rollout_ref.rollout.logprobs_mode=raw_logprobs",
        ]
    return overrides


def init_local_ray(*, gpus: int = 1, num_cpus: int = 8, env: dict[str, str] | None = None) -> str:
    """A private local Ray with the CPU backend's environment for every worker; returns its GCS address."""
    import ray

    env_vars = {
        **cpu_env(),
        "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO_ROOT), os.environ.get("PYTHONPATH")))),
    }
    # Read by Ray's node manager when it starts, from this process's environment (see `cpu_env`); the children
    # this process starts later (a trainer joining this Ray, its own local Ray) inherit it as well.
    os.environ["RAY_worker_niceness"] = env_vars["RAY_worker_niceness"]
    ray.init(
        address="local",
        num_cpus=num_cpus,
        num_gpus=gpus,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {**env_vars, **(env or {})}},
    )
    return ray.get_runtime_context().gcs_address


@dataclass
class Rollout:
    llm_client: Any
    """verl's `LLMServerClient` over the global load balancer, as the trainer builds it."""
    addresses: list[str]
    """"host:port" of each vLLM server, in replica order."""
    servers: list[Any]
    """The `vLLMHttpServer` actor handles, in replica order."""

    @property
    def base_urls(self) -> list[str]:
        return [f"http://{address}/v1" for address in self.addresses]

    def server_pid(self, replica: int = 0) -> int:
        """The process ID of replica `replica`'s `vLLMHttpServer` actor (where vLLM's OpenAI server runs)."""
        return _actor_pid(self.servers[replica], timeout_s=30)

    def server_log(self, replica: int = 0) -> Path:
        """That actor's stderr file in Ray's session logs (Ray names worker logs by process ID)."""
        pid = self.server_pid(replica)
        # Ray's own rule for its folder: RAY_TMPDIR, else the temporary folder (TMPDIR on Linux), plus "ray".
        ray_dir = os.environ.get("RAY_TMPDIR") or os.path.join(tempfile.gettempdir(), "ray")
        pattern = f"{ray_dir}/session_*/logs/worker-*-{pid}.err"
        found = {os.path.realpath(path) for path in glob.glob(pattern)}  # session_latest links to a session
        if len(found) != 1:
            raise FileNotFoundError(f"expected one Ray log of the server actor (pid {pid}), found {sorted(found)}")
        return Path(found.pop())


class _Launcher:
    """Runs verl's `LLMServerManager` (standalone) in its own Ray worker process."""

    def __init__(self, config) -> None:
        from verl.workers.rollout.llm_server import LLMServerManager

        self.manager = LLMServerManager.create(config=config)

    def parts(self) -> tuple[Any, list[str], list[Any]]:
        m = self.manager
        return m.global_load_balancer, list(m.server_addresses), list(m.server_handles)


@contextlib.contextmanager
def verl_rollout(
    config, *, script_file: str | Path | None = None, env: dict[str, str] | None = None
) -> Iterator[Rollout]:
    """verl's vLLM rollout for `config` (composed with `standalone_overrides`); stopped on exit. `script_file`: a
    `ScriptedPolicy` JSON the engine plays (needs `standalone_overrides(scripted=True)`); `env`: more environment
    for the server actors (Ray merges a parent actor's `env_vars` into the actors it creates)."""
    import ray
    from verl.workers.rollout.llm_server import LLMServerClient

    env = {**(env or {}), **({SCRIPT_ENV: str(script_file)} if script_file is not None else {})}
    launcher = ray.remote(_Launcher).options(num_cpus=0, runtime_env={"env_vars": env} if env else None).remote(config)
    servers: Sequence[Any] = ()
    started = time.time()
    try:
        balancer, addresses, servers = ray.get(launcher.parts.remote())
        yield Rollout(LLMServerClient(config, load_balancer_handle=balancer), addresses, list(servers))
    finally:
        engine_processes = _process_trees(servers)
        for handle in [*servers, launcher]:  # the launcher owns the rest (load balancer, workers): they go with it
            with contextlib.suppress(Exception):
                ray.kill(handle)
        # vLLM's engine processes die with their actor (bounded wait) and leave their shared memory behind
        psutil.wait_procs(engine_processes, timeout=30)
        remove_leftovers(started)


def _actor_pid(handle: Any, timeout_s: float) -> int:
    """The process ID of a Ray actor, asked of the actor itself."""
    import ray

    return ray.get(handle.__ray_call__.remote(lambda _actor: os.getpid()), timeout=timeout_s)


def _process_trees(servers: Sequence[Any]) -> list[psutil.Process]:
    """The server actors' processes and their descendants (vLLM's EngineCore and workers)."""
    found = []
    for handle in servers:
        with contextlib.suppress(Exception):
            process = psutil.Process(_actor_pid(handle, timeout_s=10))
            found += [process, *process.children(recursive=True)]
    return found
