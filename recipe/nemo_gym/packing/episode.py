# SPDX-License-Identifier: Apache-2.0
"""NeMo Gym result -> `Episode`: one finished episode's token segments, checked token by token.

`episode_from_result(result, max_prompt_length=...)` reads one NeMo Gym result dict (what
`RolloutCollectionHelper.run_examples` returns per row) and returns an `Episode`, or raises `EpisodeDataError`
naming the cause (`read_episode` returns that fault as the row's `EpisodeFailure`). With
`return_token_id_information: true` the training model server attaches `prompt_token_ids`, `generation_token_ids`
and `generation_log_probs` to the last output item of each model call in `result["response"]["output"]`;
`result["reward"]` is the environment's reward. The episode is the
alternating segments

    prompt(call 1) | generation(call 1) | prompt delta(call 2) | generation(call 2) | ... | generation(call n)

where each prompt delta is the tool/user/environment tokens that call k+1's `prompt_token_ids` add beyond call
k's `prompt_token_ids + generation_token_ids` (which they must begin with: contiguity, checked token by token).
Tool outputs appended after the last model call were never tokenised by the model and are not part of the
episode. Data faults raise `EpisodeDataError`: broken contiguity, missing or malformed token data (or an episode
that generated no token at all), a non-finite log-prob (checked after the cast to float32, the dtype verl trains
with), a reward that is not a finite number (bools included), a first prompt longer than `max_prompt_length`.

Several reward components: NeMo Gym 0.7's multi-objective environments (`BaseMultiRewardVerifyResponse`, e.g.
`example_tool_call_multireward`) return `reward_components`, a mapping of objective name to number, beside the
scalar `reward` (their aggregate). They are read into `Episode.reward_components`, each checked as `reward` is; a
result without them has none. `required_components` (the manager's: `algorithm.gdpo_reward_keys` under verl's
GDPO) makes a result that lacks one a BAD_REWARD failure, naming it.

`__num_turns__` is `2 * model calls` (`Episode.num_turns`): verl counts the first prompt, each assistant turn
and each observation between them (`user_turns + assistant_turns + 1` in its tool agent loop).

Pure: numpy only, no Ray, HTTP, vLLM or torch import.
"""

from __future__ import annotations

import enum
import math
import struct
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import numpy as np

from recipe.nemo_gym.failures import EpisodeDataError, EpisodeFailure, FailureCause
from recipe.nemo_gym.token_fields import GENERATION_IDS_KEY, GENERATION_LOGPROBS_KEY, PROMPT_IDS_KEY, TOKEN_FIELDS

__all__ = ["Episode", "Segment", "SegmentKind", "episode_from_result", "read_episode"]

_TOKEN_FIELD_SET = frozenset(TOKEN_FIELDS)


class SegmentKind(enum.StrEnum):
    PROMPT = "prompt"  # first prompt, or tool/user/environment tokens between two model calls
    GENERATION = "generation"  # tokens the policy sampled


@dataclass(frozen=True, slots=True)
class Segment:
    """`Episode.token_ids[start:stop]` is one prompt or generation segment."""

    kind: SegmentKind
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True, slots=True, eq=False)
class Episode:
    """One finished episode: its whole token sequence and what the policy generated in it.

    `token_ids` is the first prompt followed by the response (everything after it, up to the end of the
    last generation). `response_mask` and `response_log_probs` cover the response only.
    """

    token_ids: np.ndarray  # int64 [prompt_length + response_length]
    response_mask: np.ndarray  # bool [response_length], True on generated tokens
    response_log_probs: np.ndarray  # float32 [response_length], 0 where not generated
    segments: tuple[Segment, ...]  # alternating PROMPT, GENERATION, ..., GENERATION
    reward: float
    agent_name: str | None = None
    stopped_on_length: bool = False  # the model server reported `incomplete_details` (max_output_tokens)
    reward_components: Mapping[str, float] = field(default_factory=dict)  # the environment's, by objective name

    @property
    def prompt_length(self) -> int:
        return self.segments[0].stop

    @property
    def response_length(self) -> int:
        return len(self.token_ids) - self.prompt_length

    @property
    def num_model_calls(self) -> int:
        return len(self.segments) // 2

    @property
    def num_turns(self) -> int:
        return 2 * self.num_model_calls

    @property
    def generated_tokens(self) -> int:
        return sum(len(s) for s in self.segments[1::2])

    @property
    def env_tokens(self) -> int:
        """Tool/user/environment tokens in the response (prompt deltas after the first prompt)."""
        return self.response_length - self.generated_tokens


def _number(value: Any, what: str) -> float:
    # bool is an int subclass; a reward of `true` is a malformed result, not 1.0.
    if isinstance(value, bool) or not isinstance(value, Real):
        raise EpisodeDataError(FailureCause.BAD_REWARD, f"{what} {value!r} ({type(value).__name__}) is not a number")
    number = float(value)
    if not math.isfinite(number):
        raise EpisodeDataError(FailureCause.BAD_REWARD, f"{what} {value!r} is not finite")
    return number


def _reward_of(result: Mapping[str, Any]) -> float:
    if "reward" not in result:
        raise EpisodeDataError(FailureCause.BAD_REWARD, "result has no 'reward'")
    return _number(result["reward"], "reward")


def _reward_components_of(result: Mapping[str, Any], required: Sequence[str]) -> dict[str, float]:
    components = result.get("reward_components")
    if components is None:
        components = {}
    if not isinstance(components, Mapping):
        raise EpisodeDataError(
            FailureCause.BAD_REWARD, f"reward_components is {type(components).__name__}, not a mapping of numbers"
        )
    out = {str(name): _number(value, f"reward_components[{name!r}]") for name, value in components.items()}
    missing = [name for name in required if name not in out]
    if missing:
        raise EpisodeDataError(
            FailureCause.BAD_REWARD,
            f"result has no reward_components {missing} (algorithm.gdpo_reward_keys names them); it has {sorted(out)}",
        )
    return out


def _model_calls(result: Mapping[str, Any]) -> list[tuple[list, list, list]]:
    response = result.get("response")
    output = response.get("output") if isinstance(response, Mapping) else None
    if not isinstance(output, list):
        raise EpisodeDataError(FailureCause.MISSING_GENERATION, "result has no list at response.output")
    calls = []
    for position, item in enumerate(output):
        if not isinstance(item, Mapping) or _TOKEN_FIELD_SET.isdisjoint(item):
            continue
        fields = [item.get(key) for key in TOKEN_FIELDS]
        for key, value in zip(TOKEN_FIELDS, fields, strict=True):
            if not isinstance(value, list):
                raise EpisodeDataError(
                    FailureCause.MISSING_GENERATION,
                    f"model call {len(calls) + 1} (response.output[{position}]): {key} is "
                    f"{type(value).__name__}, not a list",
                )
        calls.append(tuple(fields))
    if not calls:
        raise EpisodeDataError(
            FailureCause.MISSING_GENERATION,
            "no output item carries prompt_token_ids/generation_token_ids/generation_log_probs "
            "(is return_token_id_information enabled on the training model server?)",
        )
    return calls


# Token lists are read once into array("Q") (unsigned 64-bit), the fastest list-to-buffer conversion in the
# standard library, so that every contiguity comparison is a memcmp instead of a comparison of Python ints; an
# 8-call episode compares every earlier call's tokens again (per-token costs: benchmarks/README.md).
_INT64_MAX = 2**63 - 1


def _bad_token(call: int, key: str, tokens: list) -> EpisodeDataError | None:
    """The error naming the first token of `tokens` that is not a non-negative 64-bit integer, if any."""
    for position, token in enumerate(tokens):
        where = f"model call {call}: {key}[{position}]"
        if not isinstance(token, int):
            return EpisodeDataError(
                FailureCause.MISSING_GENERATION,
                f"{where} is {token!r} ({type(token).__name__}): token ids are not all 64-bit integers",
            )
        if token < 0:
            return EpisodeDataError(FailureCause.MISSING_GENERATION, f"{where}: negative token id {token}")
        if token > _INT64_MAX:
            return EpisodeDataError(
                FailureCause.MISSING_GENERATION, f"{where} is {token}: token ids are not all 64-bit integers"
            )
    return None


def _token_array(call: int, key: str, tokens: list) -> array:
    try:
        return array("Q", tokens)
    except (TypeError, OverflowError) as exc:
        raise _bad_token(call, key, tokens) or EpisodeDataError(
            FailureCause.MISSING_GENERATION, f"model call {call}: {key} are not token ids ({exc})"
        ) from None


def _first_difference(a: Sequence, b: Sequence) -> int:
    """Index of the first position where a and b differ (slow path, only used for error messages)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _contiguity_error(call: int, prompt: list, expected: list) -> EpisodeDataError:
    """The error for call `call`'s prompt, which does not begin with `expected` (the previous prompt + generation)."""
    at = _first_difference(prompt, expected)
    if at >= len(prompt):
        what = f"is {len(prompt)} tokens, shorter than the {len(expected)}-token prefix it must extend"
    else:
        what = (
            f"differs at token {at}: {prompt[at]!r} where the previous call's prompt + generation has {expected[at]!r}"
        )
    return EpisodeDataError(
        FailureCause.CONTIGUITY_BROKEN,
        f"model call {call}'s prompt_token_ids do not extend call {call - 1}'s prompt + generation: {what}",
    )


def _episode_token_ids(calls: Sequence[tuple[list, list, list]]) -> np.ndarray:
    """The episode's token IDs (last prompt + last generation) as int64, after checking every call's tokens.

    Each call's prompt must begin with the previous call's prompt + generation, token for token (contiguity).
    Then every earlier prompt and generation is a prefix of the last call's prompt + generation, so the whole
    episode is exactly that sequence.
    """
    prev_prompt = prev_generation = None  # only two calls' arrays are alive at a time
    for index, (prompt, generation, _) in enumerate(calls):
        prompt_ids = _token_array(index + 1, PROMPT_IDS_KEY, prompt)
        generation_ids = _token_array(index + 1, GENERATION_IDS_KEY, generation)
        if index:
            n_prompt, n_generation = len(prev_prompt), len(prev_generation)
            if not (
                len(prompt_ids) >= n_prompt + n_generation
                and prompt_ids[:n_prompt] == prev_prompt
                and prompt_ids[n_prompt : n_prompt + n_generation] == prev_generation
            ):
                raise _contiguity_error(index + 1, prompt, calls[index - 1][0] + calls[index - 1][1])
        prev_prompt, prev_generation = prompt_ids, generation_ids
    prompt_ids.extend(generation_ids)  # the last call's prompt + generation: the whole episode
    token_ids = np.frombuffer(prompt_ids, dtype=np.uint64)
    if len(token_ids) and token_ids.max() > _INT64_MAX:  # array("Q") takes up to 2**64 - 1
        last_prompt, last_generation, _ = calls[-1]
        raise _bad_token(len(calls), PROMPT_IDS_KEY, last_prompt) or _bad_token(
            len(calls), GENERATION_IDS_KEY, last_generation
        )
    return token_ids.view(np.int64)


def _log_probs(call: int, values: list) -> np.ndarray:
    """One call's generation log-probs as float64 (struct reads a list of floats fastest here)."""
    try:
        return np.frombuffer(struct.pack(f"<{len(values)}d", *values), dtype="<f8")
    except (struct.error, OverflowError) as exc:
        raise EpisodeDataError(
            FailureCause.MISSING_GENERATION, f"model call {call}: generation_log_probs not numeric ({exc})"
        ) from None


def episode_from_result(
    result: Mapping[str, Any], *, max_prompt_length: int | None = None, required_components: Sequence[str] = ()
) -> Episode:
    """Read one NeMo Gym result into an `Episode`; raise `EpisodeDataError` on any data fault.

    `max_prompt_length` (the trainer's prompt length) turns an over-long first prompt into PROMPT_TOO_LONG;
    `required_components` names the `reward_components` the result must carry.
    """
    if not isinstance(result, Mapping):
        raise EpisodeDataError(FailureCause.MISSING_GENERATION, f"result is {type(result).__name__}, not a dict")
    calls = _model_calls(result)
    reward = _reward_of(result)
    reward_components = _reward_components_of(result, required_components)

    first_prompt = calls[0][0]
    if not first_prompt:
        raise EpisodeDataError(FailureCause.MISSING_GENERATION, f"model call 1 has empty {PROMPT_IDS_KEY}")
    if max_prompt_length is not None and len(first_prompt) > max_prompt_length:
        raise EpisodeDataError(
            FailureCause.PROMPT_TOO_LONG,
            f"first prompt is {len(first_prompt)} tokens, over the prompt length {max_prompt_length}",
        )
    for index, (_, generation, log_probs) in enumerate(calls):
        if len(generation) != len(log_probs):
            raise EpisodeDataError(
                FailureCause.MISSING_GENERATION,
                f"model call {index + 1} has {len(generation)} {GENERATION_IDS_KEY} but {len(log_probs)} "
                f"{GENERATION_LOGPROBS_KEY}",
            )
    token_ids = _episode_token_ids(calls)

    # Contiguity holds, so each call's segments start where its own prompt and generation start.
    segments: list[Segment] = [Segment(SegmentKind.PROMPT, 0, len(first_prompt))]
    for index, (prompt, generation, _) in enumerate(calls):
        if index:
            segments.append(Segment(SegmentKind.PROMPT, segments[-1].stop, len(prompt)))
        segments.append(Segment(SegmentKind.GENERATION, len(prompt), len(prompt) + len(generation)))
    if sum(len(s) for s in segments[1::2]) == 0:
        raise EpisodeDataError(FailureCause.MISSING_GENERATION, "the episode generated no tokens")

    prompt_length = segments[0].stop
    response_length = len(token_ids) - prompt_length
    response_mask = np.zeros(response_length, dtype=bool)
    response_log_probs = np.zeros(response_length, dtype=np.float32)
    # A float64 log-prob outside float32's range becomes inf here and is reported just below.
    with np.errstate(over="ignore"):
        for index, segment in enumerate(segments[1::2]):
            start, stop = segment.start - prompt_length, segment.stop - prompt_length
            response_mask[start:stop] = True
            response_log_probs[start:stop] = _log_probs(index + 1, calls[index][2])
    if not np.isfinite(response_log_probs).all():
        bad = int(np.flatnonzero(~np.isfinite(response_log_probs))[0])
        bad_at = bad + prompt_length  # position in token_ids
        call = next(i + 1 for i, s in enumerate(segments[1::2]) if s.start <= bad_at < s.stop)
        original = calls[call - 1][2][bad_at - segments[2 * call - 1].start]
        raise EpisodeDataError(
            FailureCause.NON_FINITE_LOGPROB,
            f"model call {call}: generation log-prob {original!r} at response token {bad} is not finite in float32",
        )

    agent_ref = result.get("agent_ref")
    agent_name = agent_ref.get("name") if isinstance(agent_ref, Mapping) else None
    response = result["response"]
    return Episode(
        token_ids=token_ids,
        response_mask=response_mask,
        response_log_probs=response_log_probs,
        segments=tuple(segments),
        reward=reward,
        agent_name=agent_name if isinstance(agent_name, str) else None,
        stopped_on_length=bool(response.get("incomplete_details")),
        reward_components=reward_components,
    )


def read_episode(
    result: Mapping[str, Any],
    row: int,
    *,
    max_prompt_length: int | None = None,
    required_components: Sequence[str] = (),
) -> Episode | EpisodeFailure:
    """`episode_from_result`, with a data fault returned as batch row `row`'s `EpisodeFailure` instead of raised:
    what the manager trains on, or masks, for each result (read in its own process or in a collect process)."""
    try:
        return episode_from_result(result, max_prompt_length=max_prompt_length, required_components=required_components)
    except EpisodeDataError as e:
        return EpisodeFailure(e.cause, e.detail, row=row)
