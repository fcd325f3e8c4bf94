# SPDX-License-Identifier: Apache-2.0
"""verl's real `python -m verl.trainer.main_ppo` trains through the plugin on CPU (the product, end to end).

One module-scoped run of the CPU training backend (`recipe.nemo_gym.cpu_backend`): validation before
training, two GRPO steps on a blend of NeMo Gym's workplace assistant (scripted multi-turn tool calls), math
(scripted answers) and uppercase_share (answers sampled by the model), a checkpoint after step 2, then a second
`main_ppo` that resumes from it and trains step 3. Every check reads verl's own logged metrics or its
checkpoint folder, or the advantages verl's `compute_advantage` returned (the plugin's
`$NEMO_GYM_VERL_ADVANTAGE_LOG` record):

- the actor's recomputed log-probs equal the rollout's on every generated token (`training/rollout_probs_diff_max`
  in probability space and `rollout_corr/log_ppl_abs_diff` in log space), at every step: splice, packing and
  masks are exact, and from step 2 on the rollout server generates with the weights the actor just updated;
- the update is real (non-zero gradient; with lr 1e-2 Adam moves every weight by ~1e-2 in one step, so a rollout
  server left on stale weights would be off by far more than the tolerance);
- workplace episodes really call tools (environment tokens are masked in the batch), and no episode failed;
- uppercase_share's agent runs as two copies (`nemo_gym.replicas`), and its rows are spread over both;
- the checkpoint is written and a resumed run trains one more step; nothing is left running afterwards, and no
  shared-memory segment or socket of the runs is left in /dev/shm or /tmp; the first run's output, the trainer's
  lines and the launcher's, holds no traceback;
- a failed episode changes no statistic. Step 3's batch holds two rows of `fail_on_request` (tests/cpu/gym_envs/,
  a real Gym 0.7 resources server added to the blend): one whose first verify fails once (retried, recovered), one
  whose first sample fails on every try (masked). Every other row's advantage is verl's GRPO over the valid rows
  alone, and verl's reward curve leaves the failed one out;
- a policy server killed while training ends the job naming it. Once the resumed run's console shows step 3, the
  test SIGKILLs its `vLLMHttpServer` actor (the plugin's fault as users meet it, through the launcher, with the
  demo's console after it): the job exits 1 with the launcher's last lines naming the dead server, and leaves nothing.

The rollout is verl's own `rollout.name=vllm` on vLLM's CPU build: the `vLLMHttpServer` actor, vLLM's engine, verl's
weight sync, and the splice patch armed in the actor by `VERL_USE_EXTERNAL_MODULES`. Scripted turns are forced
inside that engine by a logits processor while vLLM reports the model's raw log-probs (`scripted_logits.py`).
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from recipe.nemo_gym.advantages import ADVANTAGE_LOG_ENV
from recipe.nemo_gym.launch.leftovers import candidates, held_files, orphans
from recipe.nemo_gym_demo.console import JobResult, JobSpec, run_job
from recipe.nemo_gym_demo.data import BLEND, UPPERCASE_ROWS, example_rows, with_tools, write_jsonl
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from recipe.nemo_gym_demo.view import environments
from tests.support.cpu_policy.episodes import example_episodes_policy
from tests.support.engine import TEST_KV_CACHE, scripted_overrides
from tests.support.helpers import GYM_ENVS, kill_processes_with_env, processes_left_with_env

pytestmark = [pytest.mark.timeout(2400), pytest.mark.integration]

WORKPLACE = "workplace_assistant_simple_agent"
MATH = "math_with_judge_simple_agent"
UPPERCASE = "uppercase_share_simple_agent"
FLAKY = "fail_on_request_simple_agent"
FLAKY_CONFIG = GYM_ENVS / "resources_servers" / "fail_on_request" / "configs" / "fail_on_request.yaml"
SCRIPTED_TOOLS = ("company_directory_find_email_address", "email_reply_email")
UPPERCASE_ANSWER_TOKENS = 32  # sampled answers; every token of them is trained, so they set the step's cost
RUN_MARKER = "NG_TEST_MAIN_PPO_RUN"  # in the environment of both runs, so of every process they start
POLICY_SERVER = "vLLMHttpServer"  # verl's vLLM server actor: Ray names its process after the class


def ci_script():
    """NeMo Gym's example episodes, restricted to math and workplace prompts; every other prompt is sampled."""
    policy = example_episodes_policy()
    for rule in policy.rules:
        if rule.when.prompt_regex is None and rule.name != "math answer":
            rule.when.prompt_regex = "company_directory_find_email_address"  # a tool only workplace rows list
    policy.fallback = "model"
    return policy


def ordered_rows() -> list[dict]:
    """12 rows, in order (data.shuffle=false): the batches of 4 of steps 1 and 2 hold one workplace, one math, two
    uppercase rows each; step 3's (the resumed run's) a workplace row, an uppercase row and `fail_on_request`'s
    FAIL_ONCE and FAIL_FIRST_OF_2 rows."""
    examples = example_rows()
    workplace = [r for r in examples if r["agent_ref"]["name"] == WORKPLACE]
    math_rows = [r for r in examples if r["agent_ref"]["name"] == MATH]
    uppercase = [json.loads(line) for line in UPPERCASE_ROWS.read_text().splitlines() if line.strip()]
    for row in uppercase:
        row["responses_create_params"]["max_output_tokens"] = UPPERCASE_ANSWER_TOKENS
    # Only the tools the scripted episodes call (the prompt shrinks from ~4,100 to ~500 tokens).
    workplace = [with_tools(r, SCRIPTED_TOOLS) for r in workplace]
    carlos = next(r for r in workplace if "carlos" in json.dumps(r).lower())
    other = next(r for r in workplace if r is not carlos)
    flaky = [
        {
            "responses_create_params": {
                "input": [{"role": "user", "content": f"Say hello in one word. {marker}"}],
                "max_output_tokens": UPPERCASE_ANSWER_TOKENS,
            },
            "agent_ref": {"name": FLAKY},
        }
        for marker in ("FAIL_ONCE", "FAIL_FIRST_OF_2")
    ]
    return [
        *(carlos, uppercase[0], uppercase[1], math_rows[0]),
        *(other, uppercase[2], uppercase[3], math_rows[1]),
        *(carlos, flaky[0], uppercase[4], flaky[1]),
    ]


def blend_with_flaky_server(path: Path) -> Path:
    """The shipped blend plus `fail_on_request`, uppercase_share's agent run as two copies (`nemo_gym.replicas`);
    failures retried once, 0.5 s apart. A group that keeps one valid
    episode still trains (`min_valid_per_group: 1`), so the failed episode's sibling shows verl's GRPO over it
    alone. The shipped failure budget (`max_fraction`) admits step 3's one failed episode of 8. The servers are
    checked every 2 s while a batch waits, so the policy server killed after step 3 is named within seconds."""
    config = yaml.safe_load(BLEND.read_text())
    config["nemo_gym"]["config_paths"].append(str(FLAKY_CONFIG))
    config["failures"].update(retries=1, retry_delay_s=0.5, min_valid_per_group=1)
    config["timeouts"]["health_check_interval_s"] = 2
    config["nemo_gym"]["replicas"] = {UPPERCASE: 2}
    path.write_text(yaml.safe_dump(config))
    return path


class KillPolicyAfterStep:
    """The demo's console (`recipe/nemo_gym_demo/console.py`): printed and kept; once it shows `step`, the run's
    policy server is SIGKILLed (the next step needs it)."""

    def __init__(self, marker: str, step: int):
        self.marker, self.step = marker, step
        self.lines: list[str] = []
        self.killed: list[int] = []

    def __call__(self, line: str) -> None:
        print(line)
        self.lines.append(line)
        if line.startswith(f"step {self.step} ") and not self.killed:
            self.killed += kill_processes_with_env(RUN_MARKER, self.marker, POLICY_SERVER)


@dataclass
class Runs:
    spec: JobSpec
    first: JobResult
    second: JobResult
    second_console: KillPolicyAfterStep
    first_log: str
    """The first run's whole output (the trainer's and the launcher's lines), as `launch run` prints it."""
    marker: str
    """The runs' folder: `RUN_MARKER`'s value."""
    window: tuple[float, float]
    """When the first run started and the second ended (`time.time()`)."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("main_ppo")
    rows = ordered_rows()
    train = write_jsonl(rows, out / "train.jsonl")
    val = write_jsonl([rows[0], rows[1]], out / "val.jsonl")
    script = ci_script().to_file(out / "script.json")
    spec = JobSpec(
        out_dir=out / "job",
        model_dir=Path(tiny_qwen3_dir()),
        environments_file=blend_with_flaky_server(out / "blend.yaml"),
        train_files=[train],
        val_files=[val],
        steps=2,
        batch_size=4,
        n=2,
        prompt_length=1024,
        response_length=256,
        lr=1e-2,
        save_freq=2,
        val_before_train=True,
        extra_overrides=(*scripted_overrides(script), TEST_KV_CACHE, "data.shuffle=false"),
    )
    started = time.time()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(RUN_MARKER, str(out))
        patch.setenv("NEMO_GYM_EXTRA_ROOTS", str(GYM_ENVS))  # where Gym finds fail_on_request
        patch.setenv(ADVANTAGE_LOG_ENV, str(out / "advantages.jsonl"))
        first = run_job(spec, console=print)
        first_log = Path(spec.log_file).read_text()  # the resumed run appends to the same file
        # Step 4 (the next epoch's first batch) never comes: its policy server is killed once step 3 is shown, which the
        # console does within a second of verl logging it, while step 4's rollout (about 5 s) still waits on the server.
        console = KillPolicyAfterStep(str(out), step=3)
        second = run_job(
            JobSpec(**{**spec.__dict__, "steps": 4, "resume": True, "val_before_train": False}), console=console
        )
    return Runs(spec, first, second, console, first_log, str(out), (started, time.time()))


def _training_steps(result) -> list[dict]:
    return [s["data"] for s in result.steps if "actor/grad_norm" in s["data"]]


def test_main_ppo_trains_two_steps_with_exit_code_zero_and_a_resumed_run_trains_step_3(runs):
    spec, first, second = runs.spec, runs.first, runs.second
    assert first.exit_status == 0, f"main_ppo failed: {first.cause}; see {spec.log_file}"
    assert first.outcome[-1] == "launch: training finished", first.outcome
    assert runs.second_console.killed, f"the resumed run did not reach step 3: {second.cause}; see {spec.log_file}"
    assert [s["step"] for s in first.steps if "actor/grad_norm" in s["data"]] == [1, 2]
    assert [s["step"] for s in second.steps if "actor/grad_norm" in s["data"]] == [3]


def test_a_successful_run_prints_no_traceback_however_its_processes_end(runs):
    # verl's DataLoader workers, which Ray SIGKILLs as the TaskRunner exits, are what printed one (`verl_overrides`)
    assert runs.first.exit_status == 0
    assert runs.first_log.count("launch: training finished") == 1
    assert "Traceback" not in runs.first_log, runs.spec.log_file


def test_actor_log_probs_equal_rollout_log_probs_at_every_step(runs):
    first, second = runs.first, runs.second
    steps = _training_steps(first) + _training_steps(second)
    assert len(steps) == 3
    for data in steps:
        assert data["training/rollout_probs_diff_valid"] == 1
        assert data["training/rollout_probs_diff_max"] < 1e-6
        assert data["rollout_corr/log_ppl_abs_diff"] < 1e-5
        assert abs(data["rollout_corr/log_ppl_diff_max"]) < 1e-4


def test_every_step_updates_the_weights_the_next_rollout_uses(runs):
    spec, first, second = runs.spec, runs.first, runs.second
    for data in _training_steps(first) + _training_steps(second):
        assert data["actor/grad_norm"] > 0 and math.isfinite(data["actor/grad_norm"])
        assert data["actor/lr"] == pytest.approx(spec.lr)
    # verl times the weight sync into vLLM's engine at every step (its checkpoint engine's shared-memory path on
    # CPU); that the engine then generates with the new weights is what the log-prob checks above show.
    for data in _training_steps(first) + _training_steps(second):
        assert data["timing_s/update_weights"] > 0


def test_blend_runs_multi_turn_tool_calls_with_environment_tokens_masked_and_no_failures(runs):
    first, second = runs.first, runs.second
    for data in _training_steps(first) + _training_steps(second):
        assert data[f"timing_s/nemo_gym/{WORKPLACE}/num_turns/max"] >= 4  # a tool call, its result, a reply
        assert data[f"timing_s/nemo_gym/{WORKPLACE}/env_tokens/max"] > 0
        # A row's own generation limit (max_output_tokens) reaches the engine.
        assert data[f"timing_s/nemo_gym/{UPPERCASE}/generated_tokens/max"] <= UPPERCASE_ANSWER_TOKENS
    for data in _training_steps(first):
        assert set(environments(data)) == {WORKPLACE, MATH, UPPERCASE}
        assert data["timing_s/nemo_gym/all/failed"] == 0
    (step_3,) = _training_steps(second)
    assert set(environments(step_3)) == {WORKPLACE, UPPERCASE, FLAKY}
    rewards = [d[f"timing_s/nemo_gym/{WORKPLACE}/reward/max"] for d in _training_steps(first)]
    assert rewards[0] == 1.0  # the scripted reply to Carlos is what the environment's ground truth expects


def test_an_agent_run_as_two_copies_trains_on_both_under_its_one_name(runs):
    """uppercase_share's agent runs as two copies, each with its own resources and environment server: the rows that
    name it were spread over both at every step (the batch's last progress line says how), and its metrics keep the
    agent's name (the checks above read them)."""
    spec, first, second = runs.spec, runs.first, runs.second
    spread = re.findall(rf"{UPPERCASE} on 2 copies: (\d+), (\d+) runs", spec.log_file.read_text(errors="replace"))
    runs_per_copy = [(int(a), int(b)) for a, b in spread]
    assert runs_per_copy.count((2, 2)) >= 2, runs_per_copy  # steps 1 and 2: 2 rows x 2 samples each
    assert all(abs(a - b) <= 1 for a, b in runs_per_copy), runs_per_copy
    for data in _training_steps(first) + _training_steps(second):
        assert data[f"timing_s/nemo_gym/{UPPERCASE}/episodes"] > 0


def test_a_failed_episode_changes_no_statistic_of_its_step(runs):
    """Step 3: FAIL_ONCE's first verify failed, was retried and trained; FAIL_FIRST_OF_2's first sample failed on
    every try and was masked. Its sibling and every other row trained on verl's GRPO over the valid rows alone."""
    second, out = runs.second, runs.marker
    (step,) = _training_steps(second)
    gym = f"timing_s/nemo_gym/{FLAKY}/"
    counts = (step[f"{gym}episodes"], step[f"{gym}failed"], step[f"{gym}retried"], step[f"{gym}recovered"])
    assert counts == (4.0, 1.0, 2.0, 1.0), {k: v for k, v in step.items() if k.startswith(gym)}
    assert step["timing_s/nemo_gym/all/failed"] == 1
    records = [json.loads(line) for line in (Path(out) / "advantages.jsonl").read_text().splitlines()]
    # One per training step, in order: steps 1 to 3, and step 4's when its rollout ended before the policy server was
    # killed. The kill comes once the console shows step 3, which verl logs after step 3's weight sync, right before
    # step 4's rollout (7 s here); on a loaded machine the console's kill can come after that rollout, and step 4's
    # own weight sync meet the dead server instead.
    assert len(records) in (3, 4)
    record = records[2]
    assert record["estimator"] == "nemo_gym_grpo"
    uids, scores, valid = np.array(record["uid"], dtype=object), torch.tensor(record["score"]), record["valid"]
    advantages = torch.tensor(record["advantage"])
    assert valid.count(False) == 1
    failed = valid.index(False)
    assert advantages[failed] == 0.0 and scores[failed] == 0.0
    keep = np.array(valid)
    expected, _ = compute_grpo_outcome_advantage(
        scores[keep].unsqueeze(-1), torch.ones(int(keep.sum()), 1), uids[keep], norm_adv_by_std_in_grpo=True
    )
    assert torch.allclose(advantages[keep], expected.squeeze(-1), atol=1e-6), (advantages, expected)
    assert sorted(np.unique(uids[keep], return_counts=True)[1].tolist()) == [1, 2, 2, 2]  # every group trains
    # verl's reward curve averages the seven valid episodes only; the failed one is among its aborted samples.
    assert step["critic/score/mean"] == pytest.approx(scores[keep].mean().item(), abs=1e-6)
    assert step["response/aborted_ratio"] == pytest.approx(1 / 8)
    # The reward the user reads per environment leaves it out too: fail_on_request's mean is over its 3 valid
    # episodes (the valid scores' sum, less the two other environments' 2 episodes each).
    others = sum(2 * step[f"timing_s/nemo_gym/{env}/reward/mean"] for env in (WORKPLACE, UPPERCASE))
    assert step[f"{gym}reward/mean"] == pytest.approx((scores[keep].sum().item() - others) / 3, abs=1e-5)


def test_a_policy_server_killed_while_training_ends_the_job_naming_it(runs):
    spec, second = runs.spec, runs.second
    lines = runs.second_console.lines
    assert second.exit_status == 1 and [s["step"] for s in second.steps] == [3], lines
    # The launcher's last lines, then the log: its error is the launcher's report, shown on the console as it came.
    failed = lines.index("launch: the trainer failed (exit status 1); its error, from the end of its output:")
    assert lines[-1] == f"full log: {spec.log_file}", lines
    cause = second.cause
    assert cause == "\n".join(line.removeprefix("launch: ") for line in lines[failed + 1 : -1])
    # Whoever notices first names it: the manager's health probes (RolloutAborted naming the URL), or verl, whose
    # call to the server actor fails (Ray's ActorDiedError naming the actor's class); both were seen.
    named_by_manager = cause.startswith("  RolloutAborted: policy server(s) ['http://") and "unreachable" in cause
    named_by_ray = cause.startswith("  ActorDiedError: The actor died") and f"class_name: {POLICY_SERVER}" in cause
    assert named_by_manager or named_by_ray, lines


def test_validation_runs_before_training_per_environment(runs):
    first = runs.first
    val = first.steps[0]
    assert val["step"] == 0
    assert any(key.startswith(f"val-core/{UPPERCASE}/") for key in val["data"])


def test_checkpoint_written_and_resume_loads_it(runs):
    spec = runs.spec
    assert (spec.checkpoint_dir / "global_step_2" / "actor").is_dir()
    # Step 4, the last, is saved before its weight sync when its rollout ended before the kill (see above).
    assert (spec.checkpoint_dir / "latest_checkpointed_iteration.txt").read_text().strip() in {"2", "3", "4"}
    assert "global_step_2" in spec.log_file.read_text().split("Training from scratch")[-1]


def test_no_process_of_the_runs_is_left(runs):
    marker = runs.marker
    assert processes_left_with_env(RUN_MARKER, marker) == []


def test_no_shared_memory_segment_or_socket_of_the_runs_is_left(runs):
    started, ended = runs.window
    # vLLM's ring buffers and verl's weight buckets (/dev/shm) and verl's colocated sockets (/tmp), created while the
    # runs ran and held by no process now (another test's live server may hold its own).
    assert orphans(candidates(), held_files(), since=started, until=ended) == []
