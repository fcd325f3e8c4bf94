# SPDX-License-Identifier: Apache-2.0
"""CPU end to end: the real manager, created as verl creates it, on NeMo Gym's real math and workplace servers.

Path under test (nothing replaced; vLLM is its CPU build):
NeMoGymJSONLDataset rows -> verl's collate and the trainer's batch preparation -> `NeMoGymAgentLoopManager.create`
with verl's real `LLMServerClient` and load balancer -> NeMo Gym's `workplace_assistant` and `math_with_judge`
servers from the installed wheel (one blend) -> NeMo Gym's training model server -> verl's vLLM rollout (standalone
`vLLMHttpServer` actor, vLLM's engine, splice patch armed through `VERL_USE_EXTERNAL_MODULES`; the suite's shared
engine, `shared_engine.py`, each row naming its script) playing a scripted tool-using policy in a
one-token-per-character split, forced inside the engine (log-probs are the model's own) ->
the packed DataProto -> verl's GRPO advantage and vanilla policy loss.

Every episode of the training batch is checked exactly except one kind the environment itself can cause: a math
episode whose math-verify check gave no verdict (math_with_judge's fixed 5 s limits cut it short on a CPU-starved
node), which the plugin retries, then masks. Such rows are checked as masked rows instead.

The same stack, with two rows more in its dataset (`EXTRA_ROWS`), checks the manager's refusals on verl's rollout:
a batch naming an agent the running Gym lacks is refused before anything is sent, and verl's own `_validate`
reports a failed episode's share (the prompt beyond the engine's context) without counting it in the score.
"""

from __future__ import annotations

import contextlib
import time
import urllib.request

import psutil
import pytest
import torch
import yaml
from verl.trainer.ppo.core_algos import agg_loss, compute_grpo_outcome_advantage, compute_policy_loss_vanilla
from verl.utils.config import omega_conf_to_dataclass

from recipe.nemo_gym.failures import EpisodeFailure, FailureCause
from recipe.nemo_gym.token_fields import TOKEN_FIELDS
from recipe.nemo_gym_demo.data import example_rows, write_jsonl
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from tests.support.cpu_policy import harness
from tests.support.cpu_policy.episodes import example_episodes_policy
from tests.support.helpers import SharedStack, math_row

pytestmark = pytest.mark.integration

MULTIENV = harness.REPO_ROOT / "recipe" / "nemo_gym" / "configs" / "multienv.yaml"
MATH = "math_with_judge_simple_agent"
WORKPLACE = "workplace_assistant_simple_agent"
N = 2
# Rows after NeMo Gym's example rows in the dataset, for the tests that name them (the training batch leaves them).
EXTRA_ROWS = {
    "unknown_agent": {
        **math_row("What is 1+3?"),
        "agent_ref": {"type": "responses_api_agents", "name": "no_such_agent"},
    },
    "over_context": math_row("What is 2+2? " + "word " * 10000),  # beyond the engine's context: vLLM refuses it
}


@pytest.fixture(scope="module")
def gym_environment():
    """The Python environment NeMo Gym runs from: None for the plugin's default (`.venv-gym`, Gym 0.7, or
    `$NEMO_GYM_ENV`); `test_end_to_end_gym_0_4.py` overrides it."""
    return None


@pytest.fixture(scope="module")
def stacks(tmp_path_factory, shared_engine, gym_environment):
    """The module's stacks, one live at a time: the shutdown test takes one no other test uses after it."""

    @contextlib.contextmanager
    def start():
        tmp = tmp_path_factory.mktemp("e2e")
        model_dir = tiny_qwen3_dir()
        rows = example_rows(environment=gym_environment)
        data = write_jsonl(rows + list(EXTRA_ROWS.values()), tmp / "rows.jsonl")
        plugin = MULTIENV
        if gym_environment is not None:  # the shipped blend, run from that environment
            blend = yaml.safe_load(MULTIENV.read_text())
            blend["nemo_gym"]["environment"] = str(gym_environment)
            plugin = tmp / MULTIENV.name
            plugin.write_text(yaml.safe_dump(blend))
        overrides = harness.cpu_trainer_overrides(
            model_dir, plugin, prompt_length=8192, response_length=1024, n=N, batch_size=len(rows)
        )
        with harness.manager_stack(
            model_dir, overrides, data, example_episodes_policy(), engine=shared_engine
        ) as stack:
            yield {**stack, "rows": rows}  # the example rows; EXTRA_ROWS follow them in the dataset

    with SharedStack(start) as holder:
        yield holder


@pytest.fixture
def stack(stacks):
    return stacks.shared()


@pytest.fixture
def training(stacks, stack):
    """One training batch: every row, each repeated rollout.n times (run once per started stack)."""
    if "training" not in stacks.cache:
        kept, batch = harness.trainer_batches(stack["dataset"], range(len(stack["rows"])), stack["config"])
        output = stack["manager"].generate_sequences(batch)
        stacks.cache["training"] = batch, kept.union(output), list(stack["manager"].last_results)
    return stacks.cache["training"]


def _failed(results) -> list[int]:
    """Batch rows the manager masked: only those `test_only_math_checks_without_a_verdict_fail` allows."""
    return [i for i, result in enumerate(results) if isinstance(result, EpisodeFailure)]


def _scored(results) -> list[int]:
    """Batch rows NeMo Gym scored: all of them but the masked ones."""
    failed = set(_failed(results))
    return [i for i in range(len(results)) if i not in failed]


def _calls(result):
    """(prompt_ids, generation_ids, log_probs) of each model call, read straight from the NeMo Gym result."""
    return [
        tuple(item[f] for f in TOKEN_FIELDS)
        for item in result["response"]["output"]
        if all(item.get(f) is not None for f in TOKEN_FIELDS)
    ]


def test_rows_come_back_in_input_order_with_their_environment(training, stack):
    batch, output, results = training
    assert len(output) == len(batch) == N * len(stack["rows"])
    expected = [row["agent_ref"]["name"] for row in stack["rows"] for _ in range(N)]
    assert list(output.non_tensor_batch["data_source"]) == expected

    def contents(messages):
        return [m["content"] for m in messages]

    inputs = [contents(row["responses_create_params"]["input"]) for row in stack["rows"] for _ in range(N)]
    for i, result in enumerate(results):
        if isinstance(result, EpisodeFailure):
            assert result.row == i
        else:
            assert contents(result["responses_create_params"]["input"]) == inputs[i], i
    assert list(output.non_tensor_batch["uid"]) == list(batch.non_tensor_batch["uid"])


def test_only_math_checks_without_a_verdict_fail_and_their_rows_are_masked(training):
    _, output, results = training
    failed = _failed(results)
    for i in failed:
        assert results[i].cause is FailureCause.ENVIRONMENT_FAILED, results[i]
        assert "math-verify check gave no verdict" in results[i].detail, results[i]
        assert output.non_tensor_batch["data_source"][i] == MATH
        for key in ("response_mask", "rm_scores", "rollout_log_probs"):
            assert not output.batch[key][i].any(), (i, key)
    assert len(failed) < 5 * N / 2  # a fault of a few checks, not of the math environment
    assert output.meta_info["timing"]["nemo_gym/all/failed"] == len(failed)


def test_every_turn_is_contiguous_with_the_models_own_ids(training):
    _, _, results = training
    multi_turn = 0
    for i in _scored(results):
        calls = _calls(results[i])
        for (prev_prompt, prev_gen, _), (prompt, _, _) in zip(calls, calls[1:], strict=False):
            assert prompt[: len(prev_prompt) + len(prev_gen)] == prev_prompt + prev_gen
        multi_turn += len(calls) > 1
    assert multi_turn == N * 5  # every workplace row: tool call, tool result, closing message


def test_masks_log_probs_and_rewards_match_the_episode_token_by_token(training, stack):
    _, output, results = training
    tokenizer = stack["manager"].tokenizer
    P = output.batch["prompts"].shape[1]
    for i in _scored(results):
        result = results[i]
        calls = _calls(result)
        expected_ids, expected_mask, expected_lp = [], [], []
        for k, (prompt, gen, lp) in enumerate(calls):
            if k:
                prev_prompt, prev_gen, _ = calls[k - 1]
                delta = prompt[len(prev_prompt) + len(prev_gen) :]
                expected_ids += delta
                expected_mask += [0] * len(delta)
                expected_lp += [0.0] * len(delta)
            expected_ids += gen
            expected_mask += [1] * len(gen)
            expected_lp += lp
        n = len(expected_ids)
        first_prompt = calls[0][0]
        assert output.batch["prompts"][i, P - len(first_prompt) :].tolist() == first_prompt
        assert output.batch["responses"][i, :n].tolist() == expected_ids
        assert output.batch["response_mask"][i].tolist() == expected_mask + [0] * (1024 - n)
        torch.testing.assert_close(output.batch["rollout_log_probs"][i, :n], torch.tensor(expected_lp))
        assert output.batch["attention_mask"][i, P:].sum().item() == n
        scores = output.batch["rm_scores"][i]
        assert scores.sum().item() == pytest.approx(float(result["reward"]))
        assert scores[n - 1].item() == pytest.approx(float(result["reward"]))
        # The policy "generated" one token per character: re-tokenising its text would give other IDs.
        text = tokenizer.decode(calls[0][1], skip_special_tokens=False)
        assert tokenizer.encode(text.removesuffix("<|im_end|>"), add_special_tokens=False) != calls[0][1][:-1]


def test_rewards_are_the_environments_verdicts(training, stack):
    _, output, results = training
    scored = _scored(results)
    rewards = [0.0 if isinstance(r, EpisodeFailure) else float(r["reward"]) for r in results]  # a masked row's 0
    sources = list(output.non_tensor_batch["data_source"])
    math_expected = [row.get("expected_answer") for row in stack["rows"] for _ in range(N)]
    math = [i for i in scored if sources[i] == MATH]
    for i in math:
        assert rewards[i] == (1.0 if math_expected[i] == "32" else 0.0), i
    assert {rewards[i] for i in math} == {0.0, 1.0}
    carlos = [i for i in scored if "Reply to carlos" in str(results[i]["responses_create_params"]["input"])]
    assert len(carlos) == N and all(rewards[i] == 1.0 for i in carlos)
    others = [i for i, s in enumerate(sources) if s == WORKPLACE and i not in carlos]
    assert others and all(rewards[i] == 0.0 for i in others)
    assert output.batch["rm_scores"].sum(-1).tolist() == pytest.approx(rewards)


def test_verl_grpo_advantage_and_policy_loss_are_finite_and_only_on_generated_tokens(training, stack):
    _, output, results = training
    # verl's own estimator knows no masked row: it sees the groups whose episodes were all scored.
    uids = output.non_tensor_batch["uid"]
    masked = {uids[i] for i in _failed(results)}
    output = output.select_idxs([uid not in masked for uid in uids])
    mask = output.batch["response_mask"]
    scores = output.batch["rm_scores"]
    # Grouped as the trainer groups (uid): the scripted policy answers both samples of a prompt alike, so every
    # group's advantage is exactly 0.
    advantages, returns = compute_grpo_outcome_advantage(
        token_level_rewards=scores, response_mask=mask, index=output.non_tensor_batch["uid"]
    )
    assert torch.isfinite(advantages).all() and torch.isfinite(returns).all()
    assert (advantages == 0).all()
    # Grouped by environment, rewards differ within a group: non-zero, and only where the policy generated.
    advantages, _ = compute_grpo_outcome_advantage(
        token_level_rewards=scores, response_mask=mask, index=output.non_tensor_batch["data_source"]
    )
    assert torch.isfinite(advantages).all()
    assert (advantages[mask == 0] == 0).all()
    assert (advantages[mask == 1] != 0).any()
    actor_config = omega_conf_to_dataclass(stack["config"].actor_rollout_ref.actor)
    old = output.batch["rollout_log_probs"]
    new = (old + 0.05 * mask).requires_grad_(True)
    loss_mat, _ = compute_policy_loss_vanilla(
        old_log_prob=old, log_prob=new, advantages=advantages, response_mask=mask, config=actor_config
    )
    loss = agg_loss(loss_mat, mask, "token-mean") if loss_mat.dim() else loss_mat
    assert torch.isfinite(loss)
    loss.backward()
    assert (new.grad[mask == 0] == 0).all()


def test_metrics_reach_timing_per_environment(training):
    _, output, _ = training  # failed episodes: test_only_math_checks_without_a_verdict_fail
    timing = output.meta_info["timing"]
    assert timing[f"nemo_gym/{MATH}/episodes"] == 5 * N
    assert timing[f"nemo_gym/{WORKPLACE}/episodes"] == 5 * N
    assert timing[f"nemo_gym/{WORKPLACE}/num_turns/mean"] > timing[f"nemo_gym/{MATH}/num_turns/mean"]
    assert timing["nemo_gym/rollout_wait"] > 0 and 0 <= timing["nemo_gym/packing_share"] < 1


def test_validation_uses_val_kwargs_and_a_later_batch_works(training, stack):
    manager = stack["manager"]
    _, batch = harness.trainer_batches(stack["dataset"], [0, 5], stack["config"], validate=True)
    output = manager.generate_sequences(batch)
    assert len(output) == len(batch) == 8  # padded by verl to rollout.agent.num_workers
    assert len(manager.last_results) == 2  # only the real rows ran; the padding copies them
    temperatures = {r["response"]["temperature"] for r in manager.last_results}
    assert temperatures == {0.0}  # rollout.val_kwargs: greedy
    _, _, training_results = training
    assert {training_results[i]["response"]["temperature"] for i in _scored(training_results)} == {1.0}


def _extra_index(stack, name: str) -> int:
    return len(stack["rows"]) + list(EXTRA_ROWS).index(name)


def _math_index(stack, *, right: bool) -> int:
    """A math example row the scripted policy answers right (its expected answer is 32) or wrong."""
    return next(
        i
        for i, row in enumerate(stack["rows"])
        if row["agent_ref"]["name"] == MATH and (row.get("expected_answer") == "32") == right
    )


def _chat_requests(stack) -> int:
    """Chat requests verl's vLLM server has answered, whatever the status: vLLM's own `http_requests_total` counter
    (its Prometheus instrumentation of every route) at `/metrics`. Only this module sends to the engine now."""
    with urllib.request.urlopen(f"http://{stack['rollout'].addresses[0]}/metrics", timeout=30) as response:
        text = response.read().decode()
    return round(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("http_requests_total{") and 'handler="/v1/chat/completions"' in line
        )
    )


def test_unknown_agent_is_rejected_before_anything_is_sent_and_the_next_batch_runs(training, stack):
    manager, right = stack["manager"], _math_index(stack, right=True)
    sent_before = _chat_requests(stack)
    assert sent_before > 0  # the counter counts this stack's requests (the training batch's)
    unknown = _extra_index(stack, "unknown_agent")
    _, batch = harness.trainer_batches(stack["dataset"], [right, unknown, right], stack["config"])
    with pytest.raises(ValueError) as err:
        manager.generate_sequences(batch)
    message = str(err.value)
    # verl repeats each row rollout.n times: the unknown agent's copies are batch rows N to 2N - 1, each listed.
    for row in range(N, 2 * N):
        listed = f"batch row {row} (dataset index {unknown}): agent_ref.name 'no_such_agent' is not configured"
        assert listed in message, message
    assert message.startswith(f"{N} of {3 * N} rows cannot run on the agents of ")
    assert f"'{MATH}', '{WORKPLACE}'" in message and "nothing was sent" in message
    time.sleep(0.5)
    assert _chat_requests(stack) == sent_before
    _, batch = harness.trainer_batches(stack["dataset"], [right], stack["config"])
    output = manager.generate_sequences(batch)
    assert output.batch["rm_scores"].sum(-1).tolist() == [1.0] * N
    assert _chat_requests(stack) == sent_before + N


def test_verls_validate_runs_each_real_episode_once_and_reports_the_failed_share(training, stack):
    """verl's own `_validate` over three rows, one of which fails (its prompt is beyond the engine's context): one
    failure of three is within the blend's 5% budget (rounded up to one episode), the five padded rows send nothing,
    and the failure reaches val-aux; the score leaves the failed episode out, the reward counts it as 0."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.utils.dataset.rl_dataset import collate_fn

    manager = stack["manager"]
    indices = [_math_index(stack, right=True), _extra_index(stack, "over_context"), _math_index(stack, right=False)]
    trainer = RayPPOTrainer.__new__(RayPPOTrainer)  # only what _validate reads
    trainer.config = stack["config"]
    trainer.tokenizer = manager.tokenizer
    trainer.val_dataloader = [collate_fn([stack["dataset"][i] for i in indices])]
    trainer.async_rollout_manager = manager
    trainer.use_rm = False
    trainer.global_steps = 1
    sent_before = _chat_requests(stack)
    metrics = trainer._validate()
    time.sleep(0.5)
    assert _chat_requests(stack) - sent_before == 3  # 3 real rows, one model call each; verl padded the batch to 8
    assert len(manager.last_results) == 3
    assert metrics[f"val-aux/{MATH}/nemo_gym/failed/mean@1"] == pytest.approx(1 / 3)
    assert metrics[f"val-core/{MATH}/acc/mean@1"] == pytest.approx(1 / 2)  # the failed episode is left out
    assert metrics[f"val-aux/{MATH}/reward/mean@1"] == pytest.approx(1 / 3)


def test_shutdown_leaves_no_nemo_gym_process(stacks):
    manager = stacks.own()["manager"]
    pids = list(manager._gym.pids())  # noqa: SLF001 - the test checks the process list, not the manager's word
    assert pids
    manager.shutdown()
    survivors = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert survivors == []
