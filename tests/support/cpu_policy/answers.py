# SPDX-License-Identifier: Apache-2.0
"""A right and a wrong answer per NeMo Gym environment: what the scripted policy says, and what the environment
itself must score it.

An `Answer` is one NeMo Gym example row (from Gym's wheel, `example_row`), the `ScriptedPolicy` that plays it (one
per row: the shared engine takes each row's script by name, `script_choice.scripted_row`), and the reward the
environment's own verifier must give. For an environment scored by an LLM judge, `judge` holds the verdicts the
judge's script gives this answer's judge requests (the judge runs on the same engine: `judge_policy` joins every
answer's verdicts into the judge's one script, which the plugin's judge server names in its `extra_body`).

Every completion is generated one token per character (`say`), so no turn re-tokenises to the model's IDs.

Pure: builds rows and `ScriptedPolicy`s; no vLLM, HTTP or Gym import.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.cpu_policy.script import ScriptCompletion, ScriptedPolicy, ScriptMatch, ScriptRule

TOOL_RESULT = ScriptMatch(last_message_regex="<tool_response>")
"""The request right after a tool's result (Qwen3's template wraps tool output in `<tool_response>`)."""
FIRST_TURN = ScriptMatch(assistant_turns=0)
ANY = ScriptMatch()


def say(text: str) -> ScriptCompletion:
    """`text` as one token per character: re-tokenizing the decoded text gives other IDs, as with a real model."""
    return ScriptCompletion(text=text, split="char")


def tool_call(name: str, arguments: dict) -> str:
    """A hermes tool call, as Qwen3 writes one (vLLM's `hermes` parser turns it into `tool_calls`)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def policy(*rules: tuple[ScriptMatch, str]) -> ScriptedPolicy:
    """A script of `(when, text)` rules, first match wins, each said one token per character."""
    return ScriptedPolicy(
        rules=[ScriptRule(name=f"rule {i}", when=when, completion=say(text)) for i, (when, text) in enumerate(rules)]
    )


def verdict(name: str, prompt_regex: str, text: str) -> ScriptRule:
    """A judge's verdict: `text` for every judge request whose decoded prompt matches `prompt_regex`."""
    return ScriptRule(name=name, when=ScriptMatch(prompt_regex=prompt_regex), completion=say(text))


def example_row(gym_root: Path, path: str, index: int, agent: str) -> dict:
    """Row `index` of Gym's example file `path` (relative to Gym's package root), naming `agent`."""
    row = json.loads((gym_root / path).read_text().splitlines()[index])
    return {**row, "agent_ref": {"type": "responses_api_agents", "name": agent}}


@dataclass(frozen=True)
class Answer:
    """One episode to run: `row` played by `policy`, which the environment must score `reward`."""

    agent: str
    verdict: str  # "right" or "wrong"
    row: dict
    policy: ScriptedPolicy
    reward: float
    model_calls: int
    components: dict[str, float] = field(default_factory=dict)  # the environment's reward_components, if any
    judge: tuple[ScriptRule, ...] = ()  # the judge's verdicts on this answer (judge-scored environments)


def judge_policy(answers: Iterable[Answer]) -> ScriptedPolicy:
    """The judge's one script: every answer's verdicts, in order. A judge request no verdict matches is left to the
    model (random text, which no judge parser reads as a verdict), so the test's reward check shows it."""
    return ScriptedPolicy(rules=[rule for answer in answers for rule in answer.judge])
