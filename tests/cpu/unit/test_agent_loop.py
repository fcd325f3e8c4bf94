# SPDX-License-Identifier: Apache-2.0
"""The manager's batch logic on the batches verl 0.9.1's trainer builds, with NeMo Gym's servers replaced in-process.

Real: verl's trainer config (Hydra), `NeMoGymJSONLDataset`, verl's collate, its validation padding
(`harness.trainer_batches`), verl's REMAX batch construction (copied line for line from `RayPPOTrainer.fit`), verl's
own `RayPPOTrainer._validate` and its metric aggregation, and the manager's `generate_sequences` on its own event
loop, packing and failure budget. Replaced: the connected Gym (`GymConnection.collect`), by `FakeRuntime`, which
records every example it is sent and answers each with a synthetic NeMo Gym result whose reward is the row's
number / 10, or with an HTTP failure for a row whose prompt says FAIL. No server starts.
"""

from __future__ import annotations

import logging
import uuid

import numpy as np
import pytest
import torch
from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils.dataset.rl_dataset import collate_fn

from recipe.nemo_gym.agent_loop import NeMoGymAgentLoopManager
from recipe.nemo_gym.dataset import NeMoGymJSONLDataset
from recipe.nemo_gym.event_loop import BackgroundLoop
from recipe.nemo_gym.failures import EpisodeFailure, FailureBudget, FailureCause
from recipe.nemo_gym_demo.data import write_jsonl
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from tests.support.cpu_policy import harness
from tests.support.results import synthetic_result

MATH = "math_with_judge_simple_agent"
ROWS = 10
FAILING_ROW = 3


def question(i: int) -> str:
    return f"q{i} FAIL" if i == FAILING_ROW else f"q{i}"


class FakeRuntime:
    """A connected Gym as the manager uses it (`GymConnection.collect`, the Gym's `shutdown`): records each batch's
    examples, answers each row at once."""

    agent_names = frozenset({MATH})

    def __init__(self) -> None:
        self.batches: list[list[dict]] = []
        self.connection = self  # one object plays the Gym and its connection

    async def collect(self, examples, deadline_s, health_check_interval_s, **retry):
        self.batches.append(list(examples))
        results = []
        for i, example in enumerate(examples):
            text = example["responses_create_params"]["input"][0]["content"]
            if "FAIL" in text:
                results.append(EpisodeFailure(FailureCause.SERVER_ERROR, "agent /run returned HTTP 500", row=i))
                continue
            number = int(text.split()[0][1:])
            calls = [([1, 2, 3, 100 + number], [7, 8], [-0.1, -0.2])]
            results.append(synthetic_result(calls, reward=number / 10, agent_name=example["agent_ref"]["name"]))
        return results

    def shutdown(self) -> None:
        pass


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("agent_loop")
    rows = [
        {"responses_create_params": {"input": [{"role": "user", "content": question(i)}]}, "agent_ref": {"name": MATH}}
        for i in range(ROWS)
    ]
    data = write_jsonl(rows, tmp / "rows.jsonl")
    overrides = harness.cpu_trainer_overrides(
        tiny_qwen3_dir(),
        harness.REPO_ROOT / "recipe" / "nemo_gym" / "configs" / "math.yaml",
        prompt_length=64,
        response_length=32,
        n=2,
        batch_size=4,
    )
    config = harness.compose_verl_config(
        [*overrides, "actor_rollout_ref.rollout.top_p=0.9", "actor_rollout_ref.rollout.top_k=20"]
    )
    dataset = NeMoGymJSONLDataset(data_files=[str(data)], tokenizer=None, processor=None, config=config.data)
    manager = NeMoGymAgentLoopManager(config, llm_client=None)
    manager._loop = BackgroundLoop(name="test-agent-loop")  # noqa: SLF001 - the runtime is what the test replaces
    manager._gym = runtime = FakeRuntime()  # noqa: SLF001
    manager.agent_names = runtime.agent_names
    try:
        yield {"config": config, "dataset": dataset, "manager": manager, "runtime": runtime}
    finally:
        manager.shutdown()


def sent_questions(runtime: FakeRuntime) -> list[str]:
    return [e["responses_create_params"]["input"][0]["content"] for e in runtime.batches[-1]]


# --------------------------------------------------------------------------------------------------- REMAX


def remax_batch(setup, indices):
    """The batch verl 0.9.1's `fit` sends for REMAX: n sampled rows per prompt, then one greedy baseline each."""
    config = setup["config"]
    batch = DataProto.from_single_dict(collate_fn([setup["dataset"][i] for i in indices]))
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch.batch))], dtype=object)
    gen_batch = RayPPOTrainer._get_gen_batch(None, batch)  # uses nothing of the trainer
    gen_batch.meta_info["global_steps"] = 1
    gen_batch_output = gen_batch.repeat(repeat_times=config.actor_rollout_ref.rollout.n, interleave=True)
    gen_batch_output.non_tensor_batch["__do_sample__"] = np.ones(len(gen_batch_output), dtype=bool)
    gen_baseline_batch = gen_batch.slice(0, None)
    gen_baseline_batch.non_tensor_batch["__do_sample__"] = np.zeros(len(gen_baseline_batch), dtype=bool)
    return DataProto.concat([gen_batch_output, gen_baseline_batch])


def test_remax_baseline_rows_go_out_greedy_and_sampled_rows_keep_the_rollout_settings(setup):
    manager, runtime = setup["manager"], setup["runtime"]
    combined = remax_batch(setup, [0, 1, 2])
    output = manager.generate_sequences(combined)
    assert len(output) == 9
    assert sent_questions(runtime) == ["q0", "q0", "q1", "q1", "q2", "q2", "q0", "q1", "q2"]
    params = [e["responses_create_params"] for e in runtime.batches[-1]]
    assert [(p["temperature"], p["top_p"]) for p in params] == [(1.0, 0.9)] * 6 + [(0.0, 1.0)] * 3
    assert all(p["metadata"]["extra_body"] == '{"top_k": 20}' for p in params[:6])
    assert all("metadata" not in p for p in params[6:])


def test_training_batch_without_flags_samples_every_row(setup):
    manager, runtime = setup["manager"], setup["runtime"]
    _, batch = harness.trainer_batches(setup["dataset"], [0, 1], setup["config"])
    manager.generate_sequences(batch)
    assert [e["responses_create_params"]["temperature"] for e in runtime.batches[-1]] == [1.0] * 4


# ---------------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize("indices", [list(range(ROWS)), [0, 1, 2], [5]], ids=["10 rows", "3 rows", "1 row"])
def test_validation_runs_each_real_episode_once_and_fills_the_padding_with_copies(setup, indices):
    manager, runtime = setup["manager"], setup["runtime"]
    kept, batch = harness.trainer_batches(setup["dataset"], indices, setup["config"], validate=True)
    assert len(batch) == 8 * -(-len(indices) // 8)  # verl padded to a multiple of rollout.agent.num_workers (8)
    output = manager.generate_sequences(batch)
    assert sent_questions(runtime) == [question(i) for i in indices]  # the padding was not run
    assert len(output) == len(batch)
    real = len(indices)
    for i in range(real, len(batch)):
        for key, tensor in output.batch.items():
            assert torch.equal(tensor[i], tensor[i % real]), (i, key)
    assert list(output.non_tensor_batch["data_source"]) == list(batch.non_tensor_batch["data_source"])
    merged = kept.union(output)  # the trainer's union: shared keys must agree row by row
    scores = merged.batch["rm_scores"].sum(-1).tolist()
    expected = [0.0 if i == FAILING_ROW else i / 10 for i in indices]
    assert scores == pytest.approx([expected[i % real] for i in range(len(batch))])
    assert manager.last_stats is not None and len(manager.last_stats.failure_cause) == real


def stub_trainer(setup, indices) -> RayPPOTrainer:
    """A `RayPPOTrainer` holding only what `_validate` reads, with one validation batch of dataset rows `indices`."""
    trainer = RayPPOTrainer.__new__(RayPPOTrainer)
    trainer.config = setup["config"]
    trainer.tokenizer = setup["manager"].tokenizer
    trainer.val_dataloader = [collate_fn([setup["dataset"][i] for i in indices])]
    trainer.async_rollout_manager = setup["manager"]
    trainer.use_rm = False
    trainer.global_steps = 1
    return trainer


def test_verls_validate_reports_failed_episodes_per_data_source_and_runs_each_once(setup, plugin_caplog):
    runtime = setup["runtime"]
    before = len(runtime.batches)
    with plugin_caplog.at_level(logging.WARNING, logger="recipe.nemo_gym.agent_loop"):
        metrics = stub_trainer(setup, range(ROWS))._validate()
    assert len(runtime.batches) == before + 1 and len(runtime.batches[-1]) == ROWS  # not the 16 padded rows
    assert metrics[f"val-aux/{MATH}/nemo_gym/failed/mean@1"] == pytest.approx(1 / ROWS)
    rewards = [i / 10 for i in range(ROWS) if i != FAILING_ROW]
    # The environment's score leaves the failed episode out; verl's own reward variable still counts it as 0.
    assert metrics[f"val-core/{MATH}/acc/mean@1"] == pytest.approx(sum(rewards) / (ROWS - 1))
    assert metrics[f"val-aux/{MATH}/reward/mean@1"] == pytest.approx(sum(rewards) / ROWS)
    assert not any(key.startswith(f"val-core/{MATH}/reward/") for key in metrics)
    assert not any("failure_cause" in key for key in metrics)  # strings go to dumps, not to metrics
    warnings = [r.getMessage() for r in plugin_caplog.records if "validation" in r.getMessage()]
    assert warnings == [
        f"NeMo Gym validation: 1 of {ROWS} episodes failed (server_error=1; {MATH}: 1); they are masked, left out "
        "of val-core/<data_source>/acc and counted in val-aux/<data_source>/nemo_gym/failed"
    ]


def test_verls_validate_without_failures_still_reports_the_failed_share(setup, plugin_caplog):
    with plugin_caplog.at_level(logging.WARNING, logger="recipe.nemo_gym.agent_loop"):
        metrics = stub_trainer(setup, [0, 1, 2])._validate()
    assert metrics[f"val-aux/{MATH}/nemo_gym/failed/mean@1"] == 0.0
    assert not [r for r in plugin_caplog.records if "validation" in r.getMessage()]


# ------------------------------------------------------------------------------------ failures and advantages


def test_a_failed_training_episode_moves_no_advantage_and_no_score_in_verls_own_functions(setup, monkeypatch):
    """The manager's training batch through verl's `compute_advantage` (with the recipe's `nemo_gym_grpo`) and its
    step metrics: rows q3 (both samples fail) and q4, q5 (both valid)."""
    from verl.trainer.ppo.metric_utils import compute_data_metrics
    from verl.trainer.ppo.ray_trainer import compute_advantage

    manager, config = setup["manager"], setup["config"]
    assert config.algorithm.adv_estimator == "nemo_gym_grpo"  # what the recipe's overrides select
    monkeypatch.setattr(manager, "budget", FailureBudget(0.5))  # 2 of 6 fail: over the YAML's 5%
    kept, batch = harness.trainer_batches(setup["dataset"], [FAILING_ROW, 4, 5], config)
    output = manager.generate_sequences(batch)
    merged = kept.union(output)
    merged.batch["token_level_scores"] = merged.batch["token_level_rewards"] = merged.batch["rm_scores"]
    merged = compute_advantage(merged, adv_estimator=config.algorithm.adv_estimator, config=config.algorithm)
    advantages = merged.batch["advantages"]
    assert torch.count_nonzero(advantages[:2]) == 0  # the failed group
    # q4 and q5 score the same twice each (the fake environment's reward is the row's number / 10): GRPO gives 0.
    # (Siblings of a failed row are checked in tests/cpu/unit/test_advantages.py and in test_job_failures' trainer run.)
    assert torch.count_nonzero(advantages[2:]) == 0
    metrics = compute_data_metrics(merged, use_critic=False)
    assert metrics["critic/score/mean"] == pytest.approx((0.4 + 0.4 + 0.5 + 0.5) / 4)
    assert metrics["response/aborted_ratio"] == pytest.approx(2 / 6)
    timing = output.meta_info["timing"]
    assert timing["nemo_gym/all/groups_short_of_valid"] == 1.0
    assert (timing["nemo_gym/all/failed"], timing["nemo_gym/all/retried"]) == (2.0, 0.0)


def test_a_plain_verl_group_estimator_gets_one_warning_at_start_up(setup, plugin_caplog):
    config = setup["config"].copy()
    config.algorithm.adv_estimator = "rloo"
    with plugin_caplog.at_level(logging.WARNING, logger="recipe.nemo_gym.agent_loop"):
        NeMoGymAgentLoopManager(config, llm_client=None)
    assert [r.getMessage() for r in plugin_caplog.records if "adv_estimator" in r.getMessage()] == [
        "NeMo Gym: algorithm.adv_estimator=rloo: a failed NeMo Gym episode's reward 0 enters its group's baseline and "
        "shifts its siblings' advantages; set algorithm.adv_estimator=nemo_gym_rloo to compute it over valid episodes "
        "only (recipe/nemo_gym/advantages.py)"
    ]


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean"])
def test_a_sequence_mean_loss_mode_gets_one_warning_at_start_up_and_token_mean_none(setup, plugin_caplog, mode):
    config = setup["config"].copy()
    config.actor_rollout_ref.actor.loss_agg_mode = mode
    with plugin_caplog.at_level(logging.WARNING, logger="recipe.nemo_gym.agent_loop"):
        NeMoGymAgentLoopManager(config, llm_client=None)
    warnings = [r.getMessage() for r in plugin_caplog.records if "loss_agg_mode" in r.getMessage()]
    expected = [
        "NeMo Gym: actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean: verl divides the loss by every row of a "
        "mini-batch, failed NeMo Gym episodes included, so each failed episode scales the step's loss by the share "
        "of valid rows; token-mean (verl's default) and token-sum are exact (recipe/nemo_gym/advantages.py)"
    ]
    assert warnings == (expected if mode.startswith("seq-mean") else [])


def test_under_gdpo_the_manager_asks_each_result_for_the_reward_keys_gdpo_reads_and_refuses_none():
    from omegaconf import OmegaConf

    from recipe.nemo_gym.advantages import plain_estimator_warning
    from recipe.nemo_gym.agent_loop import _gdpo_reward_keys
    from recipe.nemo_gym.errors import ConfigError

    config = OmegaConf.create({"algorithm": {"adv_estimator": "gdpo", "gdpo_reward_keys": ["correctness", "format"]}})
    assert _gdpo_reward_keys(config, "gdpo") == ("correctness", "format")
    assert _gdpo_reward_keys(config, "nemo_gym_grpo") == ()  # the keys travel only where GDPO reads them
    with pytest.raises(ConfigError, match=r"adv_estimator=gdpo needs algorithm.gdpo_reward_keys"):
        _gdpo_reward_keys(OmegaConf.create({"algorithm": {"adv_estimator": "gdpo"}}), "gdpo")
    assert "no failure-aware GDPO" in plain_estimator_warning("gdpo")
