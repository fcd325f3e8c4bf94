# SPDX-License-Identifier: Apache-2.0
"""`recipe/nemo_gym/launch/compose.py`: a job into verl's overrides, the processes' environment and Ray's resources,
with exact expected lists. (That verl accepts the result is checked by `repo/test_submit_scripts.py`, which composes
the printed command with Hydra and validates it with verl's own config code.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from recipe.nemo_gym.launch.compose import Backend, compose, hydra_string, merge_overrides
from recipe.nemo_gym.launch.job import Job
from recipe.nemo_gym.verl_overrides import plugin_overrides
from tests.support.helpers import set_keys

REPO = Path("/repo")


def _job(**keys) -> Job:
    raw = {
        "model": "/m/Qwen3 4B",
        "checkpoint_dir": "/ck",
        "environments": "/repo/configs/math.yaml",
        "data": {"train_files": ["/d/a.jsonl", "/d/b.jsonl"], "val_files": ["/d/v.jsonl"]},
        "name": "math",
    }
    return Job.model_validate(set_keys(raw, **keys))


GPU_JOB_OVERRIDES = [
    "data.train_files=['/d/a.jsonl','/d/b.jsonl']",
    "data.val_files=['/d/v.jsonl']",
    "data.train_batch_size=64",
    "data.max_prompt_length=2048",
    "data.max_response_length=4096",
    "actor_rollout_ref.model.path='/m/Qwen3 4B'",
    "actor_rollout_ref.actor.optim.lr=1e-06",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.actor.use_kl_loss=false",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES='recipe.nemo_gym.vllm_plugin'",
    "trainer.logger=[console]",
    "trainer.project_name='nemo_gym'",
    "trainer.experiment_name='math'",
    "trainer.nnodes=1",
    "trainer.n_gpus_per_node=8",
    "trainer.default_local_dir='/ck'",
    "trainer.save_freq=50",
    "trainer.test_freq=10",
    "trainer.total_epochs=1",
    "trainer.val_before_train=true",
]


def test_a_gpu_job_is_the_plugins_overrides_then_the_jobs_then_the_command_lines():
    launch = compose(_job(), Backend(), REPO, cli_overrides=["trainer.save_freq=7"], pythonpath="/site:/repo")
    plugin = plugin_overrides("'/repo/configs/math.yaml'", "hermes")
    assert launch.overrides == [*plugin, *GPU_JOB_OVERRIDES, "trainer.save_freq=7"]
    assert launch.environment == {
        "PYTHONPATH": "/repo:/site",
        "VERL_USE_EXTERNAL_MODULES": "recipe.nemo_gym.vllm_plugin",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    assert launch.ray_start_args == ["--num-gpus=8"]
    assert launch.trainer_argv("/py")[:3] == ["/py", "-m", "verl.trainer.main_ppo"]


def test_job_keys_reach_their_overrides():
    job = _job(
        training__strategy="megatron",
        training__megatron_tp=2,
        training__total_training_steps=5,
        training__tool_call_parser=None,
        data__default_agent="math_agent",
        logging__loggers=["console", "file"],
        cluster__ray_num_cpus=12,
        gym_env="/gym",
        verl_overrides=["trainer.x=1"],
    )
    launch = compose(job, Backend(), REPO, wandb=True)
    added = [o for o in launch.overrides if o not in plugin_overrides("'/repo/configs/math.yaml'", None)]
    assert added[len(GPU_JOB_OVERRIDES) :] == [
        "trainer.total_training_steps=5",
        "+data.default_agent_name='math_agent'",
        "model_engine=megatron",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1",
        "trainer.x=1",
    ]
    assert "trainer.logger=[console,file]" in added  # the job's loggers, even with a wandb key
    assert "trainer.total_epochs=5" in added  # the steps decide, however many epochs of the data they take
    assert not [o for o in launch.overrides if "tool_call_parser" in o or "auto_tool_choice" in o]
    assert launch.environment["NEMO_GYM_ENV"] == "/gym"
    assert launch.ray_start_args == ["--num-gpus=8", "--num-cpus=12"]


def test_a_wandb_key_adds_wandb_to_the_default_loggers():
    assert "trainer.logger=[console,wandb]" in compose(_job(), Backend(), REPO, wandb=True).overrides


def test_the_cpu_backends_overrides_replace_the_jobs_keys_and_its_modules_extend_the_plugins():
    backend = Backend(
        overrides=[
            "trainer.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.name=stub_rollout",
            # a key the job adds with `+`: the backend's entry replaces it and keeps the `+`
            "actor_rollout_ref.rollout.agent.agent_loop_manager_class=b.Manager",
            "+stub.new_key=1",
        ],
        environment={"VERL_PLATFORM": "cpu", "VERL_USE_EXTERNAL_MODULES": "recipe.nemo_gym.vllm_plugin,b.act"},
        gpus_per_node=1,
    )
    launch = compose(_job(backend="cpu"), backend, REPO, cli_overrides=["trainer.total_epochs=3"])
    assert launch.overrides[-5:] == [
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.name=stub_rollout",
        "+actor_rollout_ref.rollout.agent.agent_loop_manager_class=b.Manager",
        "+stub.new_key=1",
        "trainer.total_epochs=3",
    ]
    keys = [o.split("=", 1)[0].lstrip("+") for o in launch.overrides]
    assert len(keys) == len(set(keys)) + 1  # only trainer.total_epochs twice: the job's, then the user's
    assert "trainer.n_gpus_per_node=8" not in launch.overrides
    assert (
        "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES='recipe.nemo_gym.vllm_plugin,b.act'"
        in launch.overrides
    )
    assert launch.environment == {
        "VERL_PLATFORM": "cpu",
        "PYTHONPATH": "/repo",
        "VERL_USE_EXTERNAL_MODULES": "recipe.nemo_gym.vllm_plugin,b.act",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    assert launch.ray_start_args == ["--num-gpus=1", "--num-cpus=8"]  # 8 logical CPUs unless the job says


def test_merge_keeps_one_entry_per_key_the_later_ones():
    assert merge_overrides(["a=1", "+b=2", "c=3", "~d"], ["b=5", "a=4", "~c"]) == [
        "~d",
        "+b=5",
        "a=4",
        "~c",
    ]


def test_a_value_holding_a_single_quote_is_refused():
    assert hydra_string("/a b/c") == "'/a b/c'"
    with pytest.raises(ValueError, match="holds a single quote"):
        compose(_job(model="/it's"), Backend(), REPO)


def test_a_cpu_job_run_alone_starts_a_private_ray_and_otherwise_joins_the_bootstraps_cluster():
    from recipe.nemo_gym.launch.__main__ import backend_of

    job = _job(backend="cpu", cluster__ray_num_cpus=6, cluster__gpus_per_node=1)
    local = backend_of(job, {}, own_ray=True).overrides
    assert [
        o for o in local if o.startswith(("+ray_kwargs.ray_init.", "ray_kwargs.ray_init.")) and "env_vars" not in o
    ] == [
        "+ray_kwargs.ray_init.address=local",
        "+ray_kwargs.ray_init.num_gpus=1",
        "ray_kwargs.ray_init.num_cpus=6",
        "+ray_kwargs.ray_init.include_dashboard=false",
    ]
    joined = backend_of(job, {}).overrides
    assert not [o for o in joined if "ray_init.address" in o or "ray_init.num_" in o]
    assert backend_of(_job(), {}) == Backend()  # gpu: nothing added; its Ray counts the GPUs
