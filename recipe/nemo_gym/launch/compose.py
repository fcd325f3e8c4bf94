# SPDX-License-Identifier: Apache-2.0
"""The one place that turns a job into verl's argument list, the processes' environment and Ray's resources.

`compose(job, backend, ...)` is pure: it reads nothing and starts nothing. Its `Launch` holds
- `overrides`: the Hydra overrides of `python -m verl.trainer.main_ppo`, in this order: the plugin's own
  (`verl_overrides.plugin_overrides`, the single statement of how the recipe plugs into verl), the job's sizes and
  paths, the backend's (the CPU backend's replace any the job set for the same key), then the job's
  `verl_overrides` and the command line's, which win;
- `environment`: what every process of the job gets, exported before Ray starts so that raylets hand it to the
  workers they spawn: the repository on `PYTHONPATH`, the plugin's vLLM module (and the backend's) in
  `VERL_USE_EXTERNAL_MODULES`, which verl's `__init__` imports in every process, and the backend's variables;
- `ray_start_args`: the resources each node's `ray start` announces.

`VERL_USE_EXTERNAL_MODULES` also goes into the job's Ray runtime env (verl 0.9.1's `run_ppo` merges
`ray_kwargs.ray_init.runtime_env` over its defaults), so that a Ray cluster started without it still gets it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from recipe.nemo_gym.launch.job import Job
from recipe.nemo_gym.verl_overrides import VLLM_PLUGIN_MODULE, plugin_overrides

TRAINER_MODULE = "verl.trainer.main_ppo"
CPU_DEFAULT_RAY_CPUS = 8
"""Logical CPUs per node on the CPU backend: more than a small machine's cores, since verl's workers ask for
several each while the work itself is small."""


@dataclass(frozen=True)
class Backend:
    """What a training backend adds to a GPU job (nothing, for `gpu`)."""

    overrides: Sequence[str] = ()
    environment: Mapping[str, str] = field(default_factory=dict)
    gpus_per_node: int | None = None
    """Logical GPUs each node announces to Ray; None: the job's `cluster.gpus_per_node`."""


@dataclass(frozen=True)
class Launch:
    overrides: list[str]
    environment: dict[str, str]
    ray_start_args: list[str]

    def trainer_argv(self, python: str, module: str = TRAINER_MODULE) -> list[str]:
        return [python, "-m", module, *self.overrides]


def hydra_string(value: str | Path) -> str:
    """A value as a quoted Hydra string, so that paths with spaces or Hydra's special characters stay one value."""
    text = str(value)
    if "'" in text:
        raise ValueError(f"{text!r} holds a single quote, which a Hydra override cannot carry")
    return f"'{text}'"


def hydra_list(values: Sequence[str | Path]) -> str:
    return "[" + ",".join(hydra_string(v) for v in values) + "]"


def override_key(override: str) -> str:
    """The key an override sets, without Hydra's `+`, `++` or `~` prefix."""
    return override.split("=", 1)[0].lstrip("~+")


def merge_overrides(base: Sequence[str], later: Sequence[str]) -> list[str]:
    """`base` then `later`, where a key both set keeps only `later`'s entry (Hydra refuses to `+`-add a key twice);
    if `base` had added that key with `+` (it is not in verl's config), `later`'s entry gets the `+` too."""
    later_keys = {override_key(item) for item in later}
    added = {override_key(item) for item in base if item.startswith("+") and override_key(item) in later_keys}
    kept = [item for item in base if override_key(item) not in later_keys]
    for item in later:
        needs_plus = override_key(item) in added and not item.startswith(("+", "~"))
        kept.append(f"+{item}" if needs_plus else item)
    return kept


def job_overrides(job: Job, external_modules: str, wandb: bool) -> list[str]:
    """The overrides that carry the job's own settings (after the plugin's, before the backend's)."""
    t, c = job.training, job.cluster
    loggers = job.logging.loggers or (["console", "wandb"] if wandb else ["console"])
    overrides = [
        f"data.train_files={hydra_list(job.data.train_files)}",
        f"data.val_files={hydra_list(job.data.val_files)}",
        f"data.train_batch_size={t.train_batch_size}",
        f"data.max_prompt_length={t.max_prompt_length}",
        f"data.max_response_length={t.max_response_length}",
        f"actor_rollout_ref.model.path={hydra_string(job.model)}",
        f"actor_rollout_ref.actor.optim.lr={t.lr}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={t.ppo_mini_batch_size}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={t.micro_batch_size_per_gpu}",
        f"actor_rollout_ref.actor.use_kl_loss={str(t.use_kl_loss).lower()}",
        f"actor_rollout_ref.actor.kl_loss_coef={t.kl_loss_coef}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={t.micro_batch_size_per_gpu}",
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.n={t.rollout_n}",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={t.rollout_tp}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={t.gpu_memory_utilization}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={t.micro_batch_size_per_gpu}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES={hydra_string(external_modules)}",
        f"trainer.logger=[{','.join(loggers)}]",
        f"trainer.project_name={hydra_string(job.logging.project)}",
        f"trainer.experiment_name={hydra_string(job.experiment)}",
        f"trainer.nnodes={c.nnodes}",
        f"trainer.n_gpus_per_node={c.gpus_per_node}",
        f"trainer.default_local_dir={hydra_string(job.checkpoint_dir)}",
        f"trainer.save_freq={t.save_freq}",
        f"trainer.test_freq={t.test_freq}",
        # verl 0.9.1 ends with its epoch loop even before `total_training_steps`: with a fixed number of steps, allow
        # as many epochs as steps (an epoch has at least one step), so that the steps decide.
        f"trainer.total_epochs={t.total_training_steps or t.total_epochs}",
        f"trainer.val_before_train={str(t.val_before_train).lower()}",
    ]
    if t.total_training_steps is not None:
        overrides.append(f"trainer.total_training_steps={t.total_training_steps}")
    if job.data.default_agent:
        overrides.append(f"+data.default_agent_name={hydra_string(job.data.default_agent)}")
    if t.strategy == "megatron":
        # verl 0.9.1 selects Megatron through the model_engine defaults group (ppo_megatron_trainer.yaml is a
        # deprecated alias for exactly this); the reference model follows the actor's parallel sizes.
        overrides += [
            "model_engine=megatron",
            f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={t.megatron_tp}",
            f"actor_rollout_ref.actor.megatron.pipeline_model_parallel_size={t.megatron_pp}",
        ]
    return overrides


def compose(
    job: Job,
    backend: Backend,
    repo_root: Path,
    cli_overrides: Sequence[str] = (),
    wandb: bool = False,
    pythonpath: str = "",
) -> Launch:
    """The trainer's overrides, the job's environment and Ray's resources (see the module docstring).
    `pythonpath` is the caller's `PYTHONPATH`, kept after the repository (containers put packages there)."""
    backend_env = dict(backend.environment)
    modules = [VLLM_PLUGIN_MODULE]
    modules += [m for m in backend_env.pop("VERL_USE_EXTERNAL_MODULES", "").split(",") if m and m not in modules]
    external_modules = ",".join(modules)
    plugin = plugin_overrides(hydra_string(job.environments), job.training.tool_call_parser)
    overrides = merge_overrides(plugin + job_overrides(job, external_modules, wandb), backend.overrides)
    overrides += [*job.verl_overrides, *cli_overrides]
    environment = {
        **backend_env,
        "PYTHONPATH": ":".join([str(repo_root), *(p for p in pythonpath.split(":") if p and p != str(repo_root))]),
        "VERL_USE_EXTERNAL_MODULES": external_modules,
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    if job.gym_env is not None:
        environment["NEMO_GYM_ENV"] = str(job.gym_env)
    gpus = backend.gpus_per_node or job.cluster.gpus_per_node
    ray_start_args = [f"--num-gpus={gpus}"]
    cpus = job.cluster.ray_num_cpus or (CPU_DEFAULT_RAY_CPUS if job.backend == "cpu" else None)
    if cpus is not None:
        ray_start_args.append(f"--num-cpus={cpus}")
    return Launch(overrides=overrides, environment=environment, ray_start_args=ray_start_args)
