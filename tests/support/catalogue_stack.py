# SPDX-License-Identifier: Apache-2.0
"""NeMo Gym's catalogue played through the real manager: the shipped configs of some kinds in one Gym, every answer of
their answer modules one episode (`tests/support/cpu_policy/catalogue/`), and the checks every stack passes.

- `stack_config(kinds, path, judge_script, judge=None)`: the shipped environments files of `kinds`
  (`recipe/nemo_gym/configs/<kind>.yaml`) as one environments file: their Gym configs and overrides together, each
  answer module's `TEST_OVERRIDES` (what its answers need to fit the tests' budget, never shipped) over them, and their
  judge (or `judge`) with `judge_script` named in its `extra_body` (`script_choice.script_body`): the judge plays the
  answers' verdicts on the shared engine, as the policy plays their turns.
- `play(tmp, engine, kinds, ...)`: that stack over verl's rollout on `engine` (`harness.manager_stack`), the answers'
  rows run as one batch; yields a `Played`. `extra` answers join the rows and the judge's script but not the batch
  (a caller's later batch runs them).
- `check_scores(played)`: every server scored its right and wrong answer as the answer module says, right above
  wrong, with the model calls it says; the step's metrics per environment agree. `check_tokens(played)`: no episode
  failed, and each trained on exactly the policy's tokens (`episode_checks`).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from recipe.nemo_gym.failures import EpisodeFailure
from recipe.nemo_gym.gym.owned.global_config import deep_merged
from recipe.nemo_gym.gym.owned.gym_layout import nemo_gym_install_root
from recipe.nemo_gym_demo.data import write_jsonl
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from tests.support.cpu_policy import harness
from tests.support.cpu_policy.answers import Answer, judge_policy
from tests.support.engine.script_choice import script_body
from tests.support.episode_checks import assert_trained_on_policy_tokens, model_calls

CONFIGS = harness.REPO_ROOT / "recipe" / "nemo_gym" / "configs"
PROMPT_LENGTH, RESPONSE_LENGTH = 4096, 1024


def _module(kind: str) -> Any:
    return importlib.import_module(f"tests.support.cpu_policy.catalogue.{kind}")


def kind_answers(kinds: Sequence[str]) -> list[Answer]:
    """Every answer of the answer modules of `kinds`, in order."""
    return [answer for kind in kinds for answer in _module(kind).answers(nemo_gym_install_root())]


def stack_config(kinds: Sequence[str], path: Path, judge_script: Path, judge: dict | None = None) -> Path:
    """The shipped configs of `kinds` as one environments file at `path` (see the module docstring)."""
    configs = [yaml.safe_load((CONFIGS / f"{kind}.yaml").read_text()) for kind in kinds]
    merged = configs[0]["nemo_gym"]
    for other in (config["nemo_gym"] for config in configs[1:]):
        merged["config_paths"] += [p for p in other["config_paths"] if p not in merged["config_paths"]]
        merged["config_overrides"] = deep_merged(merged.get("config_overrides", {}), other.get("config_overrides", {}))
        merged.setdefault("judge", other.get("judge"))
    for kind in kinds:
        merged["config_overrides"] = deep_merged(
            merged.get("config_overrides", {}), getattr(_module(kind), "TEST_OVERRIDES", {})
        )
    shipped = merged.get("judge")
    if judge is not None or shipped is not None:
        judge = dict(judge or ({"base_url": shipped} if isinstance(shipped, str) else shipped))
        judge["extra_body"] = {**judge.get("extra_body", {}), **script_body(judge_script)}
        merged["judge"] = judge
    else:
        merged.pop("judge", None)
    path.write_text(yaml.safe_dump(configs[0]))
    return path


@dataclass
class Played:
    answers: list[Answer]
    output: Any
    results: list[Any]
    manager: Any
    stack: dict


@contextlib.contextmanager
def play(tmp: Path, engine: Any, kinds: Sequence[str], *, judge: dict | None = None, extra: Sequence[Answer] = ()):
    """The answers of `kinds` as one batch through the real manager, one episode each (see the module docstring)."""
    answers = kind_answers(kinds)
    everything = [*answers, *extra]
    judge_script = judge_policy(everything).to_file(tmp / "judge.json")
    plugin = stack_config(kinds, tmp / "plugin.yaml", judge_script, judge)
    data = write_jsonl([a.row for a in everything], tmp / "rows.jsonl")
    overrides = harness.cpu_trainer_overrides(
        tiny_qwen3_dir(), plugin, prompt_length=PROMPT_LENGTH, response_length=RESPONSE_LENGTH, n=1,
        batch_size=len(everything),
    )  # fmt: skip
    scripts = [a.policy for a in everything]
    with harness.manager_stack(tiny_qwen3_dir(), overrides, data, scripts, engine=engine) as stack:
        _, batch = harness.trainer_batches(stack["dataset"], range(len(answers)), stack["config"])
        output = stack["manager"].generate_sequences(batch)
        yield Played(answers, output, list(stack["manager"].last_results), stack["manager"], stack)


def check_scores(played: Played) -> None:
    pairs = zip(played.answers, played.results, strict=True)
    verdicts = [
        (a.agent, a.verdict, *((r["reward"], len(model_calls(r))) if isinstance(r, dict) else (str(r), 0)))
        for a, r in pairs
    ]  # a failed episode shows its failure as its reward
    print("\n" + "\n".join(f"{a} {v}: reward {r}, model calls {c}" for a, v, r, c in verdicts))
    expected = [(a.agent, a.verdict, a.reward, a.model_calls) for a in played.answers]
    assert [(a, v, pytest.approx(r), c) for a, v, r, c in verdicts] == expected
    for answer, result in zip(played.answers, played.results, strict=True):
        if answer.components:
            assert result["reward_components"] == answer.components, answer.agent
    rewards = {(a.agent, a.verdict): a.reward for a in played.answers}
    agents = sorted({a.agent for a in played.answers})
    assert all(rewards[(agent, "right")] > rewards[(agent, "wrong")] for agent in agents)
    timing = played.output.meta_info["timing"]
    for agent in agents:
        assert timing[f"nemo_gym/{agent}/episodes"] == 2 and timing[f"nemo_gym/{agent}/failed"] == 0, agent
        mean = (rewards[(agent, "right")] + rewards[(agent, "wrong")]) / 2
        assert timing[f"nemo_gym/{agent}/reward/mean"] == pytest.approx(mean), agent


def check_tokens(played: Played) -> None:
    failures = [r for r in played.results if isinstance(r, EpisodeFailure)]
    assert not failures and played.output.meta_info["timing"]["nemo_gym/all/failed"] == 0, failures
    assert len(played.results) == len(played.output) == len(played.answers)
    assert_trained_on_policy_tokens(played.output, played.results)
