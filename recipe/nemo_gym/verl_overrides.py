# SPDX-License-Identifier: Apache-2.0
"""The verl overrides that plug this recipe into `python -m verl.trainer.main_ppo`: stated once, used everywhere.

`plugin_overrides(agent_loop_config_path)` is what every job of this recipe passes to verl 0.9.1, whatever its
model, sizes or cluster: the legacy trainer (the one whose agent loop manager can be replaced), GRPO over the
episodes that did not fail (`nemo_gym_grpo`, registered by the manager: `advantages.py`), the
multi-turn async rollout with rollout log-probs, the NeMo Gym manager and its YAML, the lazy JSONL dataset (told
the same YAML, so that it checks every row before verl starts its workers: `data_check.py`), no reward workers, and
vLLM's tool-call parsing. The environment's reward is the reward (`rm_scores`, packed by the
manager), so verl 0.9.1's `RewardLoopWorker` actors (8 by default, each a Python process importing verl and torch,
about 1 GB) would never be called: `reward.num_workers=0` starts none (verl's V0 trainer calls them only to score
a batch that has no `rm_scores`, and hands their list to the manager, which ignores it).
The dataset reads one line per row through its offset index, so verl's DataLoader worker processes (8 for each of
the train and validation loaders by default, forked from the TaskRunner) have nothing to do:
`data.dataloader_num_workers=0` starts none. Started, they are SIGKILLed by Ray 2.60's core worker as the TaskRunner
exits (`kill_child_processes_on_worker_exit`), which torch's DataLoader reports from its SIGCHLD handler as a
traceback (`DataLoader worker (pid N) is killed by signal: Killed.`) after a run that succeeded.
NeMo Gym's model server asks verl's vLLM for `tool_choice="auto"` whenever a row offers tools, which vLLM refuses
(HTTP 400) unless its server runs with `--enable-auto-tool-choice` and a parser for the model's tool-call format
(`hermes` for Qwen; `tool_call_parser=None` leaves both out).
The launcher (`launch/compose.py`, which every job goes through, the demo's too) and the test harness call the
function, and a test checks
that the README's command shows each of them.

Hydra keys that verl 0.9.1's config lacks carry `+`: the manager class exists only on the `AgentLoopConfig`
dataclass, not in `rollout.yaml`. The dataset is named by module (`pkg://`), not by file path: verl's file
loader names the module `custom_module_<hash>`, which a DataLoader worker started with spawn cannot import to
unpickle the dataset.
"""

from __future__ import annotations

from pathlib import Path

from recipe.nemo_gym.data_check import PLUGIN_CONFIG_KEY

MANAGER_CLASS = "recipe.nemo_gym.agent_loop.NeMoGymAgentLoopManager"
VLLM_PLUGIN_MODULE = "recipe.nemo_gym.vllm_plugin"
"""Named in `VERL_USE_EXTERNAL_MODULES` for every process of a job: arms the splice patch in verl's vLLM servers."""
DATASET_MODULE = "recipe.nemo_gym.dataset"
DATASET_CLASS = "NeMoGymJSONLDataset"


DEFAULT_TOOL_CALL_PARSER = "hermes"


def plugin_overrides(
    agent_loop_config_path: str | Path, tool_call_parser: str | None = DEFAULT_TOOL_CALL_PARSER
) -> list[str]:
    """The overrides every job of this recipe passes to verl 0.9.1's `main_ppo`, in Hydra's `key=value` form."""
    tools = []
    if tool_call_parser:
        tools = [
            "+actor_rollout_ref.rollout.engine_kwargs.vllm.enable_auto_tool_choice=true",
            f"+actor_rollout_ref.rollout.engine_kwargs.vllm.tool_call_parser={tool_call_parser}",
        ]
    return [
        "trainer.use_v1=false",
        "algorithm.adv_estimator=nemo_gym_grpo",
        "reward.num_workers=0",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={MANAGER_CLASS}",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_loop_config_path}",
        f"data.custom_cls.path=pkg://{DATASET_MODULE}",
        f"data.custom_cls.name={DATASET_CLASS}",
        f"+data.{PLUGIN_CONFIG_KEY}={agent_loop_config_path}",
        "data.dataloader_num_workers=0",
        *tools,
    ]
