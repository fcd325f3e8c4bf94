# SPDX-License-Identifier: Apache-2.0
"""What selects the CPU training backend: Hydra overrides for `main_ppo` and the processes' environment.

`cpu_overrides()` is appended to a user's normal `main_ppo` command line; `cpu_env()` is exported before verl
starts (the trainer's Ray workers inherit it through the runtime env the overrides also set). Both are printed
for shell scripts by `python -m recipe.nemo_gym_testing.cpu_training overrides|env`.

Why each override (all checked against verl 0.9.1 on a 2-core machine without a GPU):
- `trainer.device=cpu`, one "GPU" per node: verl's placement groups ask Ray for GPUs, so Ray is started with one
  logical GPU (`num_gpus=1`; `CUDA_VISIBLE_DEVICES` must not be set to an empty string, Ray refuses it) and more
  logical CPUs than cores (verl's worker bundles ask for several each; the work itself is small).
- `actor.strategy=fsdp2`: FSDP1's `sync_module_states` refuses CPU parameters. `VERL_ENGINE_DEVICE=cuda` is
  verl's own override of the engine registry key: FSDP engines are registered for cuda/npu only, and on CPU they
  run unchanged.
- `attn_implementation=sdpa`, `use_remove_padding=false`, no torch.compile, fp32 parameters and mixed precision:
  flash-attention and compiled kernels need a GPU; fp32 makes the actor's recomputed log-probs agree with the
  CPU engine's to float rounding.
- verl's fused log-prob kernels with their torch backend: log-probs and entropy are computed 512 positions at a
  time instead of from the full `[sequence, vocabulary]` logits (2.8 GB per 4,600-token sequence with Qwen3's
  vocabulary), which otherwise exhausts a 24 GB machine during the actor update.
- `rollout.name=cpu_vllm`: the rollout registered by `activate` (see `rollout.py`).
"""

from __future__ import annotations

from recipe.nemo_gym_testing.cpu_training import ROLLOUT_NAME

EXTERNAL_MODULES = ("recipe.nemo_gym.vllm_plugin", "recipe.nemo_gym_testing.cpu_training.activate")


def cpu_env() -> dict[str, str]:
    """Environment variables for every process of a CPU training run (driver and Ray workers)."""
    return {
        "VERL_PLATFORM": "cpu",
        "VERL_ENGINE_DEVICE": "cuda",
        "VERL_USE_EXTERNAL_MODULES": ",".join(EXTERNAL_MODULES),
        "TOKENIZERS_PARALLELISM": "false",
    }


def cpu_overrides(*, start_ray: bool = True, num_cpus: int = 8) -> list[str]:
    """Hydra overrides that make a GPU `main_ppo` command run on this machine's CPU (FSDP2 actor, CPU rollout).

    With `start_ray` the trainer starts a private local Ray sized for the backend (never joining a cluster
    another job left on this machine); without it the caller has started Ray itself (`ray start --num-gpus=1
    --num-cpus=<n>`, as the submit scripts do) and `RAY_ADDRESS` points at it.
    """
    fp32 = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
    overrides = [
        "trainer.device=cpu",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1",
        f"actor_rollout_ref.rollout.name={ROLLOUT_NAME}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.ref.strategy=fsdp2",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "actor_rollout_ref.model.use_fused_kernels=true",
        "actor_rollout_ref.model.fused_kernel_options.impl_backend=torch",
        "actor_rollout_ref.actor.use_torch_compile=false",
        "actor_rollout_ref.ref.use_torch_compile=false",
        f"+actor_rollout_ref.actor.fsdp_config.mixed_precision={fp32}",
        f"+actor_rollout_ref.ref.fsdp_config.mixed_precision={fp32}",
    ]
    if start_ray:
        overrides += [
            "+ray_kwargs.ray_init.address=local",
            "+ray_kwargs.ray_init.num_gpus=1",
            f"ray_kwargs.ray_init.num_cpus={num_cpus}",
            "+ray_kwargs.ray_init.include_dashboard=false",
        ]
    overrides += [f"+ray_kwargs.ray_init.runtime_env.env_vars.{key}='{value}'" for key, value in cpu_env().items()]
    return overrides
