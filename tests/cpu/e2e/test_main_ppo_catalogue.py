# SPDX-License-Identifier: Apache-2.0
"""verl's real `python -m verl.trainer.main_ppo` trains on three servers of NeMo Gym's catalogue, one judge-scored.

One run of the CPU training backend (`recipe.nemo_gym.cpu_backend`), two GRPO steps on a blend of `gpqa_diamond`
(its right answer), `ruler` (its wrong one) and `equivalence_llm_judge` (its right one, judged by the plugin's judge
on the trainer's own vLLM server: `judge: policy`), each from its shipped config's Gym config (`recipe/nemo_gym/
configs/knowledge.yaml`, `long_context.yaml`, `judged_qa.yaml`), and one row of the shipped blend's `uppercase_share`
that the model samples freely. A scripted answer plays the same tokens in both samples of its row, so its group's
advantages are 0; the sampled row's two samples score differently, so the step has a gradient. Every check reads
verl's own logged metrics:

- the actor's recomputed log-probs equal the rollout's on every generated token at both steps (the judge's calls,
  on the same servers, are not trained and leave the policy's tokens exact);
- each server's reward in both steps' metrics is what the server (for `equivalence_llm_judge`, the judge's verdict)
  gives the scripted answer, and no episode failed;
- the actor's gradient is not zero at either step;
- nothing of the run is left running.

The rows and the judge's requests name their scripts (`script_choice.scripted_row`, the judge's `extra_body`), which
the logits processor plays inside verl's vLLM engine (`scripted_logits.py`) while vLLM reports the model's raw
log-probs. The answers, and why each server scores them so: `tests/support/cpu_policy/catalogue/`.

A run of its own, last on the heavy worker, where nothing runs beside it: in `test_main_ppo`'s first run these servers
and their judge made that module twice as long, and slowed the other worker's modules with engines of their own
beside it (`docs/testing.md`, "Where the suite's time goes").
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from recipe.nemo_gym_demo.console import JobSpec, run_job
from recipe.nemo_gym_demo.data import BLEND, UPPERCASE_ROWS, write_jsonl
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from recipe.nemo_gym_demo.view import environments
from tests.support.catalogue_stack import kind_answers
from tests.support.cpu_policy.answers import judge_policy
from tests.support.cpu_policy.script import ScriptedPolicy
from tests.support.engine import TEST_KV_CACHE, scripted_overrides
from tests.support.engine.script_choice import script_body, scripted_row
from tests.support.helpers import processes_left_with_env

pytestmark = [pytest.mark.timeout(1800), pytest.mark.integration]

CONFIGS = Path(__file__).resolve().parents[3] / "recipe" / "nemo_gym" / "configs"
RUN_MARKER = "NG_TEST_MAIN_PPO_CATALOGUE_RUN"  # in the run's environment, so of every process it starts
# The servers and the answer each plays (kind, agent, verdict): one judge-scored, one scored 0.
CATALOGUE = (
    ("knowledge", "gpqa_diamond_simple_agent", "right"),
    ("long_context", "ruler_simple_agent", "wrong"),
    ("judged_qa", "equivalence_llm_judge_simple_agent", "right"),
)
SAMPLED = "uppercase_share_simple_agent"  # the shipped blend's environment whose row the model samples


def catalogue_answers():
    """The `Answer`s of `CATALOGUE` (`tests/support/cpu_policy/catalogue/`)."""
    answers = {(a.agent, a.verdict): a for kind, _, _ in CATALOGUE for a in kind_answers([kind])}
    return [answers[(agent, verdict)] for _, agent, verdict in CATALOGUE]


def catalogue_blend(path: Path, judge_script: Path) -> Path:
    """The shipped blend's model server, `uppercase_share`, timeouts and failure policy, with the catalogue's three
    servers (their shipped configs' Gym configs) in place of its other environments, judged by the plugin's judge on
    the trainer's own vLLM server playing `judge_script`."""
    config = yaml.safe_load(BLEND.read_text())
    section = config["nemo_gym"]
    kept = ("responses_api_models/", "resources_servers/uppercase_share/")
    section["config_paths"] = [p for p in section["config_paths"] if p.startswith(kept)]
    section.pop("config_overrides")  # the shipped blend's math server's
    for kind, agent, _ in CATALOGUE:
        server = agent.removesuffix("_simple_agent")
        shipped = yaml.safe_load((CONFIGS / f"{kind}.yaml").read_text())["nemo_gym"]["config_paths"]
        section["config_paths"] += [p for p in shipped if f"/{server}/" in p]
    section["judge"] = {"base_url": "policy", "extra_body": script_body(judge_script)}
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("main_ppo_catalogue")
    answers = catalogue_answers()
    rows = [scripted_row(a.row, a.policy.to_file(out / f"answer-{i}.json")) for i, a in enumerate(answers)]
    rows.append(json.loads(UPPERCASE_ROWS.read_text().splitlines()[0]))
    train = write_jsonl(rows * 2, out / "train.jsonl")  # one batch of the four rows a step
    # The scripted rows' requests name their scripts; the job's own script backs the one row that names none (the
    # model samples it).
    script = ScriptedPolicy(rules=[], fallback="model").to_file(out / "script.json")
    spec = JobSpec(
        out_dir=out / "job",
        model_dir=Path(tiny_qwen3_dir()),
        environments_file=catalogue_blend(out / "blend.yaml", judge_policy(answers).to_file(out / "judge.json")),
        train_files=[train],
        val_files=[train],
        steps=2,
        batch_size=len(rows),
        n=2,
        prompt_length=1024,
        response_length=256,
        lr=1e-2,
        val_before_train=False,
        extra_overrides=(*scripted_overrides(script), TEST_KV_CACHE, "data.shuffle=false"),
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(RUN_MARKER, str(out))
        result = run_job(spec, console=print)
    return spec, result, str(out)


def _training_steps(result) -> list[dict]:
    return [s["data"] for s in result.steps if "actor/grad_norm" in s["data"]]


def test_main_ppo_trains_two_steps_on_the_catalogue_servers_with_exit_code_zero(run):
    spec, result, _ = run
    assert result.exit_status == 0, f"main_ppo failed: {result.cause}; see {spec.log_file}"
    assert [s["step"] for s in result.steps if "actor/grad_norm" in s["data"]] == [1, 2]
    for data in _training_steps(result):
        assert data["actor/grad_norm"] > 0 and math.isfinite(data["actor/grad_norm"])
        assert data["training/rollout_probs_diff_valid"] == 1
        assert data["training/rollout_probs_diff_max"] < 1e-6
        assert data["rollout_corr/log_ppl_abs_diff"] < 1e-5


def test_each_server_and_the_judge_score_the_scripted_answer_in_both_steps_metrics(run):
    """gpqa_diamond's right answer, ruler's wrong one and equivalence_llm_judge's right one, judged by the plugin's
    judge (the trainer's own vLLM server), at steps 1 and 2: each environment's reward is its server's own score."""
    _, result, _ = run
    steps = _training_steps(result)
    assert len(steps) == 2
    answers = catalogue_answers()
    for data in steps:
        assert set(environments(data)) == {a.agent for a in answers} | {SAMPLED}
        assert 0 <= data[f"timing_s/nemo_gym/{SAMPLED}/reward/mean"] <= 1
        assert data["timing_s/nemo_gym/all/failed"] == 0
        for answer in answers:
            gym = f"timing_s/nemo_gym/{answer.agent}/"
            assert (data[f"{gym}episodes"], data[f"{gym}failed"]) == (2, 0), answer.agent
            assert data[f"{gym}reward/mean"] == pytest.approx(answer.reward), answer.agent
    assert {a.reward for a in answers} == {0.0, 1.0}


def test_no_process_of_the_run_is_left(run):
    _, _, marker = run
    assert processes_left_with_env(RUN_MARKER, marker) == []
