# SPDX-License-Identifier: Apache-2.0
"""What selects the CPU training backend: Hydra overrides for `main_ppo` and the processes' environment.

`cpu_overrides()` is appended to a user's normal `main_ppo` command line; `cpu_env()` is exported before verl
starts (the trainer's Ray workers inherit it through the runtime env the overrides also set). The launcher
(`backend: cpu` in a job) calls both; `python -m recipe.nemo_gym.cpu_backend
difference` prints them as the README lists them.

Why each override (all checked against verl 0.9.1 on a 2-core machine without a GPU):
- `trainer.device=cpu`, one "GPU" per node: verl's placement groups ask Ray for GPUs, so Ray is started with one
  logical GPU (`num_gpus=1`; `CUDA_VISIBLE_DEVICES` must not be set to an empty string, Ray refuses it) and more
  logical CPUs than cores (verl's worker bundles ask for several each; the work itself is small). The node count
  stays the job's (`trainer.nnodes`): each node's Ray announces its one logical GPU.
- `actor.strategy=fsdp2`: FSDP1's `sync_module_states` refuses CPU parameters. `VERL_ENGINE_DEVICE=cuda` is
  verl's own override of the engine registry key: FSDP engines are registered for cuda/npu only, and on CPU they
  run unchanged.
- `attn_implementation=sdpa`, `use_remove_padding=false`, no torch.compile, fp32 parameters and mixed precision:
  flash-attention and compiled kernels need a GPU; fp32 makes the actor's recomputed log-probs agree with the
  CPU engine's to float rounding.
- verl's fused log-prob kernels with their torch backend: log-probs and entropy are computed 512 positions at a
  time instead of from the full `[sequence, vocabulary]` logits (2.8 GB per 4,600-token sequence with Qwen3's
  vocabulary), which otherwise exhausts a 24 GB machine during the actor update.
- verl's own `rollout.name=vllm` on vLLM's CPU build, with what that build needs: no sleep mode (vLLM refuses it
  on CPU; the CPU worker ignores verl's sleep and wake calls), an explicit KV cache size (otherwise vLLM sizes it
  from `gpu_memory_utilization` against system memory), eager mode and fp32 (the actor's dtype, so its recomputed
  log-probs match the engine's), a small batch of sequences (vLLM's start-up warm-up runs one full batch through
  the sampler, 38 s at verl's default of 256 sequences, 9 s at 32), and small weight buckets (verl's 2 GiB default
  is one `/dev/shm` segment per sync; the CPU platform has no CUDA IPC, so verl syncs through shared memory).

`TORCH_COMPILE_DISABLE=1`: eager mode turns off vLLM's model compilation, but vLLM 0.24 still wraps a few sampler
helpers in `torch.compile` with the inductor backend (`v1/sample/ops/logprobs.py`, `topk_topp_sampler.py`), and
verl's FSDP engine compiles by default too (`fsdp_config.use_torch_compile`). On CPU inductor builds C++ for each,
into a cache under the job's own `TMPDIR` (empty at every start); eager, the same functions compute the same values.
Measured on 2 cores: vLLM's start 177 s -> 119 s, a two-step `main_ppo` run 458 s -> 250 s.

And one environment variable for Ray itself: `RAY_worker_niceness=0`. Ray starts its workers at nice 15 (where the
driver is 0), which is harmless when the work is on GPUs; here the vLLM engine and the actor are Ray workers, and
at nice 15 they got almost no CPU while any process outside Ray (NeMo Gym's servers, another job's trainer) was
busy. Ray's node manager reads it when it starts (`ray start`, or `ray.init` starting a local Ray).
"""

from __future__ import annotations

from recipe.nemo_gym.verl_overrides import VLLM_PLUGIN_MODULE

ACTIVATE_MODULE = "recipe.nemo_gym.cpu_backend.activate"
EXTERNAL_MODULES = (VLLM_PLUGIN_MODULE, ACTIVATE_MODULE)
KV_CACHE_BYTES = 512 * 2**20
"""vLLM's KV cache on CPU: 512 MiB holds 524,288 tokens of the tiny model (2 layers, 2 KV heads of 32, fp32)."""


def cpu_env() -> dict[str, str]:
    """Environment variables for every process of a CPU training run (driver and Ray workers)."""
    return {
        "VERL_PLATFORM": "cpu",
        "VERL_ENGINE_DEVICE": "cuda",
        "VERL_USE_EXTERNAL_MODULES": ",".join(EXTERNAL_MODULES),
        "TOKENIZERS_PARALLELISM": "false",
        "TORCH_COMPILE_DISABLE": "1",
        "RAY_worker_niceness": "0",
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
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.enforce_eager=true",
        "+actor_rollout_ref.rollout.enable_sleep_mode=false",
        f"+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes={KV_CACHE_BYTES}",
        "actor_rollout_ref.rollout.max_num_seqs=32",
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=64",
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


def cpu_difference() -> str:
    """Everything the CPU backend adds to a GPU job's `main_ppo` command, as the README lists it: the Hydra
    overrides (the submit scripts give its Ray resources to `ray start` instead) and the environment, which every
    process of the job gets (`VERL_USE_EXTERNAL_MODULES` extends the plugin's own module list)."""
    lines = ["# Hydra overrides, after the job's own (a key both set takes the backend's value)"]
    lines += cpu_overrides(start_ray=False)
    lines += ["# Ray: one logical GPU per node (ray start --num-gpus=1) and more logical CPUs than cores"]
    lines += ["# environment of every process"]
    lines += [f"{key}={value}" for key, value in cpu_env().items()]
    return "\n".join(lines)
