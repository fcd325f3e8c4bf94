# SPDX-License-Identifier: Apache-2.0
"""Scripted completions for the CPU policy server: typed rules, pure functions, no vLLM, torch or HTTP.

A `ScriptedPolicy` is a list of `ScriptRule`s. For each request the engine decodes the prompt (special tokens
kept) and the first rule whose `ScriptMatch` holds decides the completion. A match looks at:

- `prompt_regex`: `re.search` over the whole decoded prompt;
- `last_message_regex`: `re.search` over the last complete message of the rendered prompt, i.e. the text
  between the last `turn_start` marker whose segment is closed by `turn_end` and that `turn_end` (for ChatML
  templates such as Qwen3: the role line and content of the last user/tool/assistant message);
- `assistant_turns`: the exact number of complete assistant messages already in the prompt.

A `ScriptCompletion` is text (or explicit token IDs) plus how it is split into tokens:

- `"tokenizer"`: the tokenizer's own encoding of the text;
- `"char"`: one token per character (added tokens such as `<tool_call>` or `<think>` stay one token each, as
  a model would emit them), so re-tokenizing the decoded text yields different, merged IDs. A character the
  vocabulary has no single token for is encoded on its own (it may then take more than one token).

and how it ends: `"eos"` appends the end-of-sequence ID, `"stop_token"` appends `stop_token_id` (a different
stop token, reported as vLLM reports one: finish reason "stop", stop reason the ID), `"length"` appends
nothing and reports finish reason "length" (a generation cut at the length limit). Independently, the request's
`max_tokens` always cuts the sequence, terminator included, and then the finish reason is "length".

Log-probs: `logprobs` in the completion gives them explicitly (one per token, terminator included; non-finite
values are allowed so failure handling can be tested); otherwise token `t` at position `i` gets
`-(1 + (t + 7 * i) % 50) / 100`, which is finite, deterministic and in [-0.50, -0.01].

`ScriptedPolicy.fallback` says what happens when no rule matches: `"error"` (the request fails with a message
naming the request and quoting the prompt tail) or `"model"` (the engine's model generates).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

TokenSplit = Literal["tokenizer", "char"]
CompletionEnd = Literal["eos", "stop_token", "length"]


class ScriptMatch(BaseModel):
    """Conditions of one rule; all given conditions must hold. No condition matches every request."""

    model_config = ConfigDict(extra="forbid")

    prompt_regex: str | None = None
    last_message_regex: str | None = None
    assistant_turns: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _regexes_compile(self) -> ScriptMatch:
        for name in ("prompt_regex", "last_message_regex"):
            pattern = getattr(self, name)
            if pattern is not None:
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise ValueError(f"{name} {pattern!r} is not a valid regular expression: {exc}") from exc
        return self


class ScriptCompletion(BaseModel):
    """What the policy 'generates' when its rule matches."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    text: str | None = None
    token_ids: list[int] | None = None
    split: TokenSplit = "tokenizer"
    end: CompletionEnd = "eos"
    stop_token_id: int | None = None
    logprobs: list[float] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ScriptCompletion:
        if (self.text is None) == (self.token_ids is None):
            raise ValueError("a completion needs exactly one of `text` and `token_ids`")
        if self.end == "stop_token" and self.stop_token_id is None:
            raise ValueError('end="stop_token" needs `stop_token_id`')
        if self.end != "stop_token" and self.stop_token_id is not None:
            raise ValueError(f'`stop_token_id` is only used with end="stop_token", not end={self.end!r}')
        return self


class ScriptRule(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    name: str = ""
    when: ScriptMatch = Field(default_factory=ScriptMatch)
    completion: ScriptCompletion


class ScriptedPolicy(BaseModel):
    """An ordered list of rules; the first that matches decides. JSON-serialisable (`to_file`/`from_file`)."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    rules: list[ScriptRule]
    fallback: Literal["error", "model"] = "error"
    turn_start: str = "<|im_start|>"
    turn_end: str = "<|im_end|>"
    assistant_role: str = "assistant"

    def to_file(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.model_dump_json(indent=2))
        return path

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedPolicy:
        path = Path(path)
        try:
            return cls.model_validate_json(path.read_text())
        except ValueError as exc:
            raise ValueError(f"invalid scripted policy in {path}: {exc}") from exc


@dataclass(frozen=True)
class PromptView:
    """What the rules can see of a rendered prompt."""

    text: str
    last_message: str | None
    assistant_turns: int


@dataclass(frozen=True)
class ScriptedOutput:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    stop_reason: int | None


def view_prompt(text: str, turn_start: str, turn_end: str, assistant_role: str) -> PromptView:
    """Split a decoded ChatML-like prompt into complete messages (segments closed by `turn_end`)."""
    complete = [seg for seg in text.split(turn_start)[1:] if turn_end in seg]
    last = complete[-1].split(turn_end, 1)[0] if complete else None
    turns = sum(1 for seg in complete if seg.startswith(assistant_role))
    return PromptView(text=text, last_message=last, assistant_turns=turns)


def rule_matches(when: ScriptMatch, view: PromptView) -> bool:
    if when.prompt_regex is not None and re.search(when.prompt_regex, view.text) is None:
        return False
    if when.last_message_regex is not None and (
        view.last_message is None or re.search(when.last_message_regex, view.last_message) is None
    ):
        return False
    return when.assistant_turns is None or when.assistant_turns == view.assistant_turns


def choose_rule(policy: ScriptedPolicy, prompt_text: str) -> ScriptRule | None:
    """The first rule matching the decoded prompt, or None."""
    view = view_prompt(prompt_text, policy.turn_start, policy.turn_end, policy.assistant_role)
    return next((rule for rule in policy.rules if rule_matches(rule.when, view)), None)


def char_split(text: str, encode: Callable[[str], list[int]], added_vocab: Mapping[str, int]) -> list[int]:
    """One token per character, except added tokens (e.g. `<tool_call>`), which stay whole."""
    ids: list[int] = []
    # Longest first, so an added token that contains another (e.g. `</tool_call>` vs `<tool_call>`) wins.
    specials = sorted((s for s in added_vocab if s), key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(s) for s in specials)) if specials else None
    pos = 0
    while pos < len(text):
        found = pattern.match(text, pos) if pattern is not None else None
        if found is not None:
            ids.append(added_vocab[found.group(0)])
            pos = found.end()
        else:
            ids.extend(encode(text[pos]))
            pos += 1
    return ids


def default_logprob(token_id: int, position: int) -> float:
    return -(1 + (token_id + 7 * position) % 50) / 100


def scripted_output(
    completion: ScriptCompletion,
    *,
    encode: Callable[[str], list[int]],
    added_vocab: Mapping[str, int],
    eos_token_id: int,
    max_tokens: int,
) -> ScriptedOutput:
    """Token IDs, log-probs and finish/stop reasons of one scripted completion under a `max_tokens` limit."""
    if completion.token_ids is not None:
        body = list(completion.token_ids)
    elif completion.split == "char":
        body = char_split(completion.text or "", encode, added_vocab)
    else:
        body = list(encode(completion.text or ""))

    stop_reason: int | None = None
    finish: Literal["stop", "length"] = "stop"
    if completion.end == "eos":
        ids = [*body, eos_token_id]
    elif completion.end == "stop_token":
        assert completion.stop_token_id is not None
        ids = [*body, completion.stop_token_id]
        stop_reason = completion.stop_token_id
    else:
        ids = body
        finish = "length"

    if completion.logprobs is not None:
        if len(completion.logprobs) != len(ids):
            raise ValueError(
                f"scripted completion has {len(ids)} tokens (terminator included) but {len(completion.logprobs)} "
                f"log-probs"
            )
        logprobs = list(completion.logprobs)
    else:
        logprobs = [default_logprob(t, i) for i, t in enumerate(ids)]

    if len(ids) > max_tokens:
        ids, logprobs, finish, stop_reason = ids[:max_tokens], logprobs[:max_tokens], "length", None
    return ScriptedOutput(token_ids=ids, logprobs=logprobs, finish_reason=finish, stop_reason=stop_reason)


def cut_at_stop_string(
    token_ids: Sequence[int], stops: Sequence[str], include: bool, decode: Callable[[Sequence[int]], str]
) -> tuple[int, str, str] | None:
    """Where vLLM's detokenizer would stop on a stop string: (tokens kept, text, the stop string), or None.

    The kept tokens end with the token that completes the earliest stop string; the text ends before the stop
    string, or after it when `include` (vLLM's `include_stop_str_in_output`).
    """
    for kept in range(1, len(token_ids) + 1):
        text = decode(token_ids[:kept])
        hits = [(text.find(s), s) for s in stops if s and s in text]
        if hits:
            pos, stop = min(hits)
            return kept, (text[: pos + len(stop)] if include else text[:pos]), stop
    return None


def prompt_tail(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


def describe_no_match(policy: ScriptedPolicy, request_id: str, prompt_text: str) -> str:
    names: Sequence[str] = [rule.name or f"#{i}" for i, rule in enumerate(policy.rules)]
    return (
        f"scripted policy: no rule matched request {request_id} (rules: {', '.join(names) or 'none'}); "
        f"prompt tail: {prompt_tail(prompt_text)!r}"
    )
