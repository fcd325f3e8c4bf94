# SPDX-License-Identifier: Apache-2.0
"""Drive the real manager on CPU exactly as verl's trainer does, over verl's own vLLM rollout (vLLM's CPU build).

Used by the CPU integration and end-to-end tests and the benchmarks. Everything here is
verl's own code path:
- `compose_verl_config`: verl's trainer config composed with Hydra from verl's own config directory, the way
  `verl.trainer.main_ppo` composes it, so a key verl does not accept fails here too.
- `verl_llm_client`: verl's real `LLMServerClient` over verl's real `GlobalRequestLoadBalancer` Ray actor,
  registered with the CPU server's address, which is how verl 0.9.1 hands its vLLM servers to a manager.
- `trainer_batches`: the batch `generate_sequences` receives, and the trainer's side of it: verl's collate over
  dataset items, `DataProto.from_single_dict`, a `uid` per prompt, the trainer's non-tensor pop, `rollout.n` interleaved
  repeats, and the validation meta_info and padding when validating.
- `manager_stack`: config, dataset, verl's standalone vLLM rollout (`tests/support/engine/standalone.py`: verl's
  `LLMServerManager`, its `LLMServerClient`) and the manager together, as the integration tests use them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from recipe.nemo_gym.verl_overrides import plugin_overrides
from recipe.nemo_gym_demo.data import write_jsonl

REPO_ROOT = Path(__file__).resolve().parents[3]


def verl_config_dir() -> Path:
    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.origin is not None, "verl is not installed"
    return Path(spec.origin).parent / "trainer" / "config"


def compose_verl_config(overrides: Sequence[str], config_name: str = "ppo_trainer"):
    """verl's trainer config with `overrides`, composed by Hydra from verl's own config directory."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        return compose(config_name=config_name, overrides=list(overrides))


def sized_overrides(
    model_dir: str | Path,
    agent_loop_config_path: str | Path,
    *,
    prompt_length: int,
    response_length: int,
    n: int,
    batch_size: int,
) -> list[str]:
    """The plugin's overrides plus a job's size: the model, `n` samples at temperature 1 (greedy validation),
    prompt and response lengths, and `batch_size` prompts per step in one actor update. Device-independent; the
    tests' configs (`cpu_trainer_overrides`) start from it."""
    return [
        *plugin_overrides(agent_loop_config_path),
        f"actor_rollout_ref.model.path={model_dir}",
        f"actor_rollout_ref.rollout.n={n}",
        f"actor_rollout_ref.rollout.prompt_length={prompt_length}",
        f"actor_rollout_ref.rollout.response_length={response_length}",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.val_kwargs.temperature=0.0",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=false",
        f"data.train_batch_size={batch_size}",
        f"data.max_prompt_length={prompt_length}",
        f"data.max_response_length={response_length}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch_size}",
    ]


def cpu_trainer_overrides(model_dir: str | Path, agent_loop_config_path: str | Path, **sizes: int) -> list[str]:
    """`sized_overrides` (same arguments) for a trainer config composed in-process: the tests' manager over verl's
    own vLLM rollout on CPU (`manager_stack`)."""
    return [
        *sized_overrides(model_dir, agent_loop_config_path, **sizes),
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    ]


@contextlib.contextmanager
def manager_over(config, llm_client):
    """The real manager, created by verl's own `create(...)` call over verl's `llm_client`; shut down on exit."""
    from recipe.nemo_gym.agent_loop import NeMoGymAgentLoopManager

    manager = NeMoGymAgentLoopManager.create(
        config=config, llm_client=llm_client, teacher_client=None, reward_loop_worker_handles=None
    )
    try:
        yield manager
    finally:
        manager.shutdown()


@dataclass(frozen=True)
class SharedRollout:
    """The manager's view of a shared engine (`shared_engine.py`): verl's client and the servers' addresses."""

    llm_client: Any
    addresses: list[str]


@contextlib.contextmanager
def manager_stack(
    model_dir: Path,
    overrides: Sequence[str],
    data_file: Path,
    script,
    *,
    replicas: int = 1,
    server_env: dict[str, str] | None = None,
    engine=None,
):
    """The stack the manager's integration tests drive: verl's config composed from `overrides` plus the CPU
    backend's, the plugin's dataset over `data_file`, verl's own vLLM rollout on `model_dir` (standalone: vLLM's CPU
    engine in verl's server actors, splice patch armed by `VERL_USE_EXTERNAL_MODULES`) playing `script` (a
    `ScriptedPolicy`, or None for the model's own samples), and the real manager over verl's client. Starts a local
    Ray with the CPU backend's environment unless one is connected (then it must have been started by
    `standalone.init_local_ray`). `server_env`: more environment for verl's server actors. Yields `{"config", "dataset",
    "manager", "rollout"}`; all stopped on exit.

    `engine` (a `shared_engine.EngineInfo`): use that running engine instead of starting one. Each row of
    `data_file` then names the script (`script_choice.scripted_row`), and the manager gets verl's client over a
    load balancer listing that engine's address; `rollout` is then a `SharedRollout` (addresses only). With an
    engine, `script` may also be a list: one `ScriptedPolicy` per row of `data_file`, in order."""
    import tempfile

    import ray

    from recipe.nemo_gym.dataset import NeMoGymJSONLDataset
    from tests.support.engine.script_choice import scripted_row
    from tests.support.engine.standalone import init_local_ray, standalone_overrides, verl_rollout

    config = compose_verl_config([*overrides, *standalone_overrides(replicas=replicas, scripted=script is not None)])
    started_ray = not ray.is_initialized()
    if started_ray:
        init_local_ray(gpus=replicas)
    try:
        with contextlib.ExitStack() as stack:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="scripted-policy-")))
            per_row = isinstance(script, list | tuple)
            if per_row and engine is None:
                raise ValueError("one script per row needs the shared engine (engine=...); an own engine plays one")
            script_file = None if script is None or per_row else script.to_file(folder / "script.json")
            if engine is None:
                rollout = stack.enter_context(verl_rollout(config, script_file=script_file, env=server_env))
            else:
                if script is not None:
                    rows = [json.loads(line) for line in Path(data_file).read_text().splitlines() if line.strip()]
                    files = (
                        [policy.to_file(folder / f"script-{i}.json") for i, policy in enumerate(script)]
                        if per_row
                        else [script_file] * len(rows)
                    )
                    if len(files) != len(rows):
                        raise ValueError(f"{len(files)} scripts for the {len(rows)} rows of {data_file}")
                    scripted = [scripted_row(row, file) for row, file in zip(rows, files, strict=True)]
                    data_file = write_jsonl(scripted, folder / data_file.name)
                rollout = SharedRollout(verl_llm_client(config, [engine.address], until=stack), [engine.address])
            dataset = NeMoGymJSONLDataset(
                data_files=[str(data_file)], tokenizer=None, processor=None, config=config.data
            )
            manager = stack.enter_context(manager_over(config, rollout.llm_client))
            yield {"config": config, "dataset": dataset, "manager": manager, "rollout": rollout}
    finally:
        if started_ray:
            ray.shutdown()


@contextlib.contextmanager
def fault_injection_stack(model_dir: Path, overrides: Sequence[str], data_file: Path, script, env=None):
    """`manager_stack` over the hand-written CPU policy server (`server.py`) instead of verl's vLLM rollout, for the
    faults vLLM's real engine cannot be made to produce: a non-finite log-prob, an EOS inside one generation. The
    manager still gets verl's own `LLMServerClient` and load balancer, listing that server. Yields `{"config",
    "dataset", "manager", "server"}`."""
    import ray

    from recipe.nemo_gym.dataset import NeMoGymJSONLDataset
    from tests.support.cpu_policy.server import CPUPolicyServer
    from tests.support.engine.standalone import init_local_ray

    config = compose_verl_config(overrides)
    dataset = NeMoGymJSONLDataset(data_files=[str(data_file)], tokenizer=None, processor=None, config=config.data)
    started_ray = not ray.is_initialized()
    if started_ray:
        init_local_ray()
    try:
        with contextlib.ExitStack() as stack:
            server = stack.enter_context(CPUPolicyServer(model_dir, script=script, env=env))
            client = verl_llm_client(config, [f"{server.host}:{server.port}"], until=stack)
            manager = stack.enter_context(manager_over(config, client))
            yield {"config": config, "dataset": dataset, "manager": manager, "server": server}
    finally:
        if started_ray:
            ray.shutdown()


def verl_llm_client(config, addresses: Sequence[str], *, until: contextlib.ExitStack | None = None):
    """verl's `LLMServerClient` whose load balancer lists `addresses` ("host:port"). Needs a running Ray.

    The balancer is a Ray actor (a process of about 1 GB) that lives as long as that Ray; `until`: kill it when that
    stack closes (for a caller that keeps one Ray across several clients)."""
    import ray
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import GlobalRequestLoadBalancer

    # verl registers one Ray actor handle per server; the CPU server is not a Ray actor, and the manager only
    # reads the addresses (the balancer's keys), so the handle slot stays empty.
    balancer = ray.remote(GlobalRequestLoadBalancer).remote(servers={address: None for address in addresses})
    if until is not None:
        until.callback(ray.kill, balancer)
    return LLMServerClient(config, load_balancer_handle=balancer)


def trainer_batches(dataset, indices: Sequence[int], config, *, validate: bool = False, global_step: int = 1):
    """What verl 0.9.1's trainer holds around `generate_sequences` for dataset rows `indices`.

    Returns `(kept, gen_batch)`: `gen_batch` is what the manager receives; `kept` is the trainer's side (the
    tensors and reward keys it keeps, repeated like the rollout), which `fit` unions with the rollout output
    (`kept.union(output)`; `DataProto.union` fails if a shared key such as `data_source` differs).
    """
    from verl import DataProto
    from verl.protocol import pad_dataproto_to_divisor
    from verl.utils.dataset.rl_dataset import collate_fn

    rollout = config.actor_rollout_ref.rollout
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in indices]))
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
    if validate:
        batch = batch.repeat(repeat_times=rollout.val_kwargs.n, interleave=True)
    # The trainer's _get_gen_batch: every non-tensor goes to generation; the reward keys stay on both sides.
    reward_keys = {"data_source", "reward_model", "extra_info", "uid"} & batch.non_tensor_batch.keys()
    gen_batch = batch.pop(batch_keys=[], non_tensor_batch_keys=list(set(batch.non_tensor_batch) - reward_keys))
    gen_batch.non_tensor_batch.update(batch.non_tensor_batch)
    if validate:
        gen_batch.meta_info = {"validate": True, "do_sample": rollout.val_kwargs.do_sample, "global_steps": global_step}
        gen_batch, _ = pad_dataproto_to_divisor(gen_batch, rollout.agent.num_workers)
        batch, _ = pad_dataproto_to_divisor(batch, rollout.agent.num_workers)
        return batch, gen_batch
    gen_batch.meta_info["global_steps"] = global_step
    return (
        batch.repeat(repeat_times=rollout.n, interleave=True),
        gen_batch.repeat(repeat_times=rollout.n, interleave=True),
    )
