"""Pure packing: a NeMo Gym result becomes token segments, and a batch of them becomes verl 0.9.1 tensors.

No Ray, HTTP or vLLM here; numpy, torch and verl's `DataProto` only. Two steps:

1. `episode_from_result(result, max_prompt_length=...)` reads one NeMo Gym result dict (what
   `RolloutCollectionHelper.run_examples` returns per row) and returns an `Episode`, or raises
   `EpisodeDataError` naming the cause. With `return_token_id_information: true` the training model server
   attaches `prompt_token_ids`, `generation_token_ids` and `generation_log_probs` to the last output item of
   each model call in `result["response"]["output"]`; `result["reward"]` is the environment's reward. The
   episode is the alternating segments

       prompt(call 1) | generation(call 1) | prompt delta(call 2) | generation(call 2) | ... | generation(call n)

   where each prompt delta is the tool/user/environment tokens that call k+1's `prompt_token_ids` add beyond
   call k's `prompt_token_ids + generation_token_ids` (which they must begin with: contiguity, checked token by
   token). Tool outputs appended after the last model call were never tokenised by the model and are not
   part of the episode. Data faults raise `EpisodeDataError`: broken contiguity, missing or malformed token
   data (or an episode that generated no token at all), a non-finite log-prob (checked after the cast to
   float32, the dtype verl trains with), a reward that is not a finite number (bools included), a first
   prompt longer than `max_prompt_length`.

2. `pack_batch(outcomes, ...)` packs `Episode`s and `EpisodeFailure`s, row i = outcomes[i], into the tensors
   verl's agent loop produces (`AgentLoopWorker._agent_loop_postprocess` / `_postprocess` in 0.9.1):
   `prompts` [B,P] left-padded, `responses` [B,R] right-padded, `response_mask` [B,R] (1 on generated
   tokens, 0 on tool/user/environment tokens and padding), `input_ids`, `attention_mask`, `position_ids`
   [B,P+R] (`clip(cumsum(attention_mask) - 1, 0)`, verl's `compute_position_id_with_mask`),
   `rollout_log_probs` [B,R] float32 (0 where not generated), `rm_scores` [B,R] float32; padding uses
   `pad_token_id` as verl's tokenizer padding does; all integer tensors are int64. Non-tensors:
   `__num_turns__` (int32), `multi_modal_inputs` (one empty dict per row) and `data_source` (the agent name).
   `meta_info` is left empty: timing belongs to the caller. Per-row statistics come back beside the
   `DataProto` in `PackStats`, not as non-tensors, so nothing extra travels to every worker.

Decisions (and why):

- Reward placement. The reward sits on the last *generated* token of the response. For an episode that
  fits, that is the last valid response token (an episode ends on a generation), which is verl's own
  convention. For a cut episode it is the last generated token before the cut, not a tool token: verl's GAE
  (`compute_gae_advantage_return`) skips masked positions, so a reward on a tool token would be lost to
  critic-based estimators; outcome estimators (GRPO, RLOO, ...) sum the row and are indifferent.
- Cut episodes are trained on. Episodes whose response exceeds `response_length` are cut to it, flagged
  (`PackStats.truncated`) and counted, and keep their mask and their environment reward, as verl's own
  tool agent loop does. The kept tokens are real on-policy tokens with exact log-probs; dropping long
  episodes instead would hide from the policy exactly the behaviour (running long) that failed, and bias
  the data toward short episodes. Watch the truncated count and raise `response_length` if it is large.
- Failed episodes (`EpisodeFailure`, any cause) are never replaced by something trainable: their rows have
  `response_mask` all 0, `rm_scores` all 0 and `rollout_log_probs` all 0. So that every row keeps at least
  one attended prompt token and one attended response token (finite log-probs and entropies; verl's
  "last valid token" arithmetic never sees -1), a failed row carries the caller's tokenised prompt
  (`fallback_prompt_ids[i]`, its last `prompt_length` tokens) or a single `pad_token_id`, and one attended
  `pad_token_id` as its response. verl's `agg_loss` excludes rows whose mask is all 0 from sequence-mean
  modes, and token-mean counts only masked tokens, so such a row adds nothing to the policy loss. Its reward 0
  does enter its group's mean/std in GRPO-like estimators and the validation score: that is the cost of
  keeping row order and batch size, and why failures are budgeted (`failures.FailureBudget`).
- `data_source` comes from `data_sources` (the input rows' own, so verl's `DataProto.union` sees identical
  arrays) or else from each result's `agent_ref.name`; a result whose agent differs from its input row's is
  a row mix-up and raises `ValueError`.
- `__num_turns__` is `2 * model calls`: verl counts the first prompt, each assistant turn and each
  observation between them (`user_turns + assistant_turns + 1` in its tool agent loop).
"""

from __future__ import annotations

import enum
import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from verl.protocol import DataProto

from recipe.nemo_gym.failures import EpisodeDataError, EpisodeFailure, FailureCause

__all__ = [
    "Episode",
    "PackStats",
    "PackedBatch",
    "Segment",
    "SegmentKind",
    "episode_from_result",
    "order_outcomes",
    "pack_batch",
    "synthetic_result",
]

TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


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


# ---------------------------------------------------------------------------------------------------------
# result -> Episode
# ---------------------------------------------------------------------------------------------------------


def _reward_of(result: Mapping[str, Any]) -> float:
    if "reward" not in result:
        raise EpisodeDataError(FailureCause.BAD_REWARD, "result has no 'reward'")
    reward = result["reward"]
    # bool is an int subclass; a reward of `true` is a malformed result, not 1.0.
    if isinstance(reward, bool) or not isinstance(reward, Real):
        raise EpisodeDataError(FailureCause.BAD_REWARD, f"reward {reward!r} ({type(reward).__name__}) is not a number")
    reward = float(reward)
    if not math.isfinite(reward):
        raise EpisodeDataError(FailureCause.BAD_REWARD, f"reward {reward!r} is not finite")
    return reward


def _model_calls(result: Mapping[str, Any]) -> list[tuple[list, list, list]]:
    response = result.get("response")
    output = response.get("output") if isinstance(response, Mapping) else None
    if not isinstance(output, list):
        raise EpisodeDataError(FailureCause.MISSING_GENERATION, "result has no list at response.output")
    calls = []
    for position, item in enumerate(output):
        if not isinstance(item, Mapping) or not any(key in item for key in TOKEN_FIELDS):
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


def _first_difference(a: Sequence, b: Sequence) -> int:
    """Index of the first position where a and b differ (slow path, only used for error messages)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _check_contiguity(call: int, prompt: list, prev_prompt: list, prev_generation: list) -> None:
    """Call `call`'s prompt must begin with the previous call's prompt + generation, token for token."""
    n_prev, n_gen = len(prev_prompt), len(prev_generation)
    # List equality compares element by element in C; this is the dominant cost of packing and is linear in
    # the tokens compared (no conversion of earlier prompts to arrays).
    if (
        len(prompt) >= n_prev + n_gen
        and prompt[:n_prev] == prev_prompt
        and prompt[n_prev : n_prev + n_gen] == (prev_generation)
    ):
        return
    expected = prev_prompt + prev_generation
    at = _first_difference(prompt, expected)
    if at >= len(prompt):
        what = f"is {len(prompt)} tokens, shorter than the {len(expected)}-token prefix it must extend"
    else:
        got = prompt[at]
        want = expected[at] if at < len(expected) else None
        what = f"differs at token {at}: {got!r} where the previous call's prompt + generation has {want!r}"
    raise EpisodeDataError(
        FailureCause.CONTIGUITY_BROKEN,
        f"model call {call}'s prompt_token_ids do not extend call {call - 1}'s prompt + generation: {what}",
    )


def episode_from_result(result: Mapping[str, Any], *, max_prompt_length: int | None = None) -> Episode:
    """Read one NeMo Gym result into an `Episode`; raise `EpisodeDataError` on any data fault.

    `max_prompt_length` (the trainer's prompt length) turns an over-long first prompt into PROMPT_TOO_LONG.
    """
    if not isinstance(result, Mapping):
        raise EpisodeDataError(FailureCause.MISSING_GENERATION, f"result is {type(result).__name__}, not a dict")
    calls = _model_calls(result)
    reward = _reward_of(result)

    first_prompt = calls[0][0]
    if not first_prompt:
        raise EpisodeDataError(FailureCause.MISSING_GENERATION, "model call 1 has empty prompt_token_ids")
    if max_prompt_length is not None and len(first_prompt) > max_prompt_length:
        raise EpisodeDataError(
            FailureCause.PROMPT_TOO_LONG,
            f"first prompt is {len(first_prompt)} tokens, over the prompt length {max_prompt_length}",
        )

    segments: list[Segment] = []
    for index, (prompt, generation, log_probs) in enumerate(calls):
        call = index + 1
        if len(generation) != len(log_probs):
            raise EpisodeDataError(
                FailureCause.MISSING_GENERATION,
                f"model call {call} has {len(generation)} generation_token_ids but {len(log_probs)} "
                "generation_log_probs",
            )
        if index == 0:
            segments.append(Segment(SegmentKind.PROMPT, 0, len(prompt)))
        else:
            prev_prompt, prev_generation, _ = calls[index - 1]
            _check_contiguity(call, prompt, prev_prompt, prev_generation)
            segments.append(Segment(SegmentKind.PROMPT, segments[-1].stop, len(prompt)))
        segments.append(Segment(SegmentKind.GENERATION, len(prompt), len(prompt) + len(generation)))

    # Every earlier prompt and generation is a prefix of the last call's prompt + generation (checked above),
    # so the whole episode is exactly that sequence; only it is converted.
    last_prompt, last_generation, _ = calls[-1]
    try:
        flat = array("q", last_prompt)
        flat.extend(last_generation)
    except (TypeError, OverflowError) as exc:
        raise EpisodeDataError(
            FailureCause.MISSING_GENERATION, f"token ids are not all 64-bit integers ({exc})"
        ) from None
    token_ids = np.frombuffer(flat, dtype=np.int64)
    if token_ids.min() < 0:
        raise EpisodeDataError(FailureCause.MISSING_GENERATION, f"negative token id {int(token_ids.min())}")

    prompt_length = segments[0].stop
    response_length = len(token_ids) - prompt_length
    if sum(len(s) for s in segments[1::2]) == 0:
        raise EpisodeDataError(FailureCause.MISSING_GENERATION, "the episode generated no tokens")

    response_mask = np.zeros(response_length, dtype=bool)
    response_log_probs = np.zeros(response_length, dtype=np.float32)
    for index, segment in enumerate(segments[1::2]):
        start, stop = segment.start - prompt_length, segment.stop - prompt_length
        response_mask[start:stop] = True
        try:
            # Through array('d'): about twice as fast as numpy's conversion of a list of floats.
            # A log-prob beyond float32's range becomes inf here and is reported just below.
            with np.errstate(over="ignore"):
                response_log_probs[start:stop] = np.frombuffer(array("d", calls[index][2]), dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise EpisodeDataError(
                FailureCause.MISSING_GENERATION, f"model call {index + 1}: generation_log_probs not numeric ({exc})"
            ) from None
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
    )


# ---------------------------------------------------------------------------------------------------------
# row order
# ---------------------------------------------------------------------------------------------------------


def order_outcomes[T](indexed: Iterable[tuple[int, T]], batch_size: int) -> list[T]:
    """Put `(row, outcome)` pairs that arrived in completion order back into row order.

    Raises `ValueError` on a row out of range, a row seen twice, or rows missing: a batch that does not come
    back whole must not be packed silently shifted.
    """
    slots: list[Any] = [None] * batch_size
    filled = [False] * batch_size
    for row, outcome in indexed:
        if not 0 <= row < batch_size:
            raise ValueError(f"outcome for row {row} is outside the batch of {batch_size}")
        if filled[row]:
            raise ValueError(f"two outcomes for row {row}")
        slots[row], filled[row] = outcome, True
    missing = [row for row, ok in enumerate(filled) if not ok]
    if missing:
        raise ValueError(f"{len(missing)} of {batch_size} rows have no outcome (first: {missing[:10]})")
    return slots


# ---------------------------------------------------------------------------------------------------------
# Episodes -> verl tensors
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PackStats:
    """Per-row statistics of one packed batch (numpy arrays of length B, row i = outcomes[i]).

    Token counts describe the whole episode before any cut, except `trained_tokens` (generated tokens kept
    in the response window, i.e. `response_mask.sum(-1)`). Failed rows have 0 everywhere and their cause in
    `failure_cause` ("" for packed episodes).
    """

    num_turns: np.ndarray  # int32
    model_calls: np.ndarray  # int32
    generated_tokens: np.ndarray  # int64
    trained_tokens: np.ndarray  # int64
    env_tokens: np.ndarray  # int64
    total_tokens: np.ndarray  # int64, first prompt + response
    truncated: np.ndarray  # bool, response cut at response_length
    stopped_on_length: np.ndarray  # bool, the model server reported max_output_tokens
    reward: np.ndarray  # float32, the reward packed into rm_scores (0 for failed rows)
    failure_cause: np.ndarray  # object, FailureCause value or ""
    data_source: np.ndarray | None  # object, agent name per row, when known

    @property
    def failed(self) -> np.ndarray:
        return self.failure_cause != ""

    def metrics(self, prefix: str = "nemo_gym/") -> dict[str, float]:
        """Batch-level scalars: counts, and means over episodes that were packed (not failed)."""
        ok = ~self.failed
        n_ok = int(ok.sum())
        out = {
            f"{prefix}episodes": float(len(self.failure_cause)),
            f"{prefix}failed": float(len(self.failure_cause) - n_ok),
            f"{prefix}truncated": float(self.truncated.sum()),
            f"{prefix}stopped_on_length": float(self.stopped_on_length.sum()),
        }
        for cause in FailureCause:
            out[f"{prefix}failed/{cause.value}"] = float((self.failure_cause == cause.value).sum())
        for name in ("num_turns", "generated_tokens", "trained_tokens", "env_tokens", "total_tokens", "reward"):
            values = getattr(self, name)[ok]
            out[f"{prefix}{name}/mean"] = float(values.mean()) if n_ok else 0.0
            out[f"{prefix}{name}/max"] = float(values.max()) if n_ok else 0.0
        return out


@dataclass(frozen=True)
class PackedBatch:
    data: DataProto
    stats: PackStats


def _reward_position(episode: Episode, kept: int) -> int:
    """Index in the response of the last generated token within the first `kept` tokens."""
    last_generation = episode.segments[-1]
    if len(last_generation) and last_generation.stop - episode.prompt_length <= kept:
        return last_generation.stop - episode.prompt_length - 1
    generated = np.flatnonzero(episode.response_mask[:kept])
    # No generated token in the window: the row trains on nothing; keep verl's last-valid-token convention.
    return int(generated[-1]) if len(generated) else kept - 1


def pack_batch(
    outcomes: Sequence[Episode | EpisodeFailure],
    *,
    prompt_length: int,
    response_length: int,
    pad_token_id: int,
    fallback_prompt_ids: Sequence[Sequence[int] | None] | None = None,
    data_sources: Sequence[str] | None = None,
) -> PackedBatch:
    """Pack outcomes (row i = outcomes[i]) into verl 0.9.1's rollout output `DataProto` plus `PackStats`.

    `fallback_prompt_ids[i]` (optional) is the tokenised prompt carried by row i if it failed.
    `data_sources[i]` (optional) is row i's input `data_source`; without it, each row's `agent_ref.name`
    is used, and `data_source` is left out when some row has neither.
    An `Episode` whose first prompt exceeds `prompt_length` is packed as a PROMPT_TOO_LONG failure.
    """
    if prompt_length < 1 or response_length < 1:
        raise ValueError(f"prompt_length and response_length must be >= 1, got {prompt_length}, {response_length}")
    batch_size = len(outcomes)
    if batch_size == 0:
        raise ValueError("cannot pack an empty batch")
    for name, values in (("fallback_prompt_ids", fallback_prompt_ids), ("data_sources", data_sources)):
        if values is not None and len(values) != batch_size:
            raise ValueError(f"{name} has {len(values)} entries for {batch_size} outcomes")

    P, R = prompt_length, response_length
    input_ids = np.full((batch_size, P + R), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((batch_size, P + R), dtype=np.int64)
    response_mask = np.zeros((batch_size, R), dtype=np.int64)
    log_probs = np.zeros((batch_size, R), dtype=np.float32)
    rm_scores = np.zeros((batch_size, R), dtype=np.float32)

    num_turns = np.zeros(batch_size, dtype=np.int32)
    model_calls = np.zeros(batch_size, dtype=np.int32)
    generated = np.zeros(batch_size, dtype=np.int64)
    trained = np.zeros(batch_size, dtype=np.int64)
    env = np.zeros(batch_size, dtype=np.int64)
    total = np.zeros(batch_size, dtype=np.int64)
    truncated = np.zeros(batch_size, dtype=bool)
    stopped = np.zeros(batch_size, dtype=bool)
    rewards = np.zeros(batch_size, dtype=np.float32)
    causes = np.full(batch_size, "", dtype=object)
    sources = np.empty(batch_size, dtype=object)

    for row, outcome in enumerate(outcomes):
        if isinstance(outcome, Episode):
            if data_sources is not None:
                sources[row] = data_sources[row]
                if outcome.agent_name is not None and outcome.agent_name != data_sources[row]:
                    raise ValueError(
                        f"row {row}: the result comes from agent {outcome.agent_name!r} but the input row's "
                        f"data_source is {data_sources[row]!r}; results and rows are mismatched"
                    )
            else:
                sources[row] = outcome.agent_name
        elif isinstance(outcome, EpisodeFailure):
            sources[row] = data_sources[row] if data_sources is not None else None
        else:
            raise TypeError(f"row {row}: expected Episode or EpisodeFailure, got {type(outcome).__name__}")

        if isinstance(outcome, Episode) and outcome.prompt_length > P:
            outcome = EpisodeFailure(
                FailureCause.PROMPT_TOO_LONG,
                f"first prompt is {outcome.prompt_length} tokens, over the prompt length {P}",
                row=row,
            )

        if isinstance(outcome, Episode):
            p = outcome.prompt_length
            kept = min(outcome.response_length, R)
            # Prompt and response are contiguous in token_ids, so one copy fills both sides of column P.
            input_ids[row, P - p : P + kept] = outcome.token_ids[: p + kept]
            attention_mask[row, P - p : P + kept] = 1
            response_mask[row, :kept] = outcome.response_mask[:kept]
            log_probs[row, :kept] = outcome.response_log_probs[:kept]
            rm_scores[row, _reward_position(outcome, kept)] = outcome.reward

            num_turns[row] = outcome.num_turns
            model_calls[row] = outcome.num_model_calls
            generated[row] = outcome.generated_tokens
            trained[row] = response_mask[row, :kept].sum()
            env[row] = outcome.env_tokens
            total[row] = len(outcome.token_ids)
            truncated[row] = outcome.response_length > R
            stopped[row] = outcome.stopped_on_length
            rewards[row] = outcome.reward
        else:
            fallback = fallback_prompt_ids[row] if fallback_prompt_ids is not None else None
            prompt = list(fallback[-P:]) if fallback else [pad_token_id]
            input_ids[row, P - len(prompt) : P] = prompt
            # One attended response token (a pad token, never trained on): see the module docstring.
            attention_mask[row, P - len(prompt) : P + 1] = 1
            causes[row] = outcome.cause.value

    # verl.utils.model.compute_position_id_with_mask, on the whole batch at once.
    position_ids = np.cumsum(attention_mask, axis=1)
    position_ids -= 1
    np.maximum(position_ids, 0, out=position_ids)

    batch = TensorDict(
        {
            "prompts": torch.from_numpy(np.ascontiguousarray(input_ids[:, :P])),
            "responses": torch.from_numpy(np.ascontiguousarray(input_ids[:, P:])),
            "response_mask": torch.from_numpy(response_mask),
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.from_numpy(attention_mask),
            "position_ids": torch.from_numpy(position_ids),
            "rollout_log_probs": torch.from_numpy(log_probs),
            "rm_scores": torch.from_numpy(rm_scores),
        },
        batch_size=batch_size,
    )
    multi_modal_inputs = np.empty(batch_size, dtype=object)
    for row in range(batch_size):
        multi_modal_inputs[row] = {}
    non_tensor_batch = {"__num_turns__": num_turns.copy(), "multi_modal_inputs": multi_modal_inputs}
    known_sources = all(source is not None for source in sources)
    if known_sources:
        non_tensor_batch["data_source"] = sources

    stats = PackStats(
        num_turns=num_turns,
        model_calls=model_calls,
        generated_tokens=generated,
        trained_tokens=trained,
        env_tokens=env,
        total_tokens=total,
        truncated=truncated,
        stopped_on_length=stopped,
        reward=rewards,
        failure_cause=causes,
        data_source=sources if known_sources else None,
    )
    return PackedBatch(data=DataProto(batch=batch, non_tensor_batch=non_tensor_batch, meta_info={}), stats=stats)


# ---------------------------------------------------------------------------------------------------------
# synthetic results (tests, benchmarks, CPU stand-ins)
# ---------------------------------------------------------------------------------------------------------


def synthetic_result(
    calls: Sequence[tuple[Sequence[int], Sequence[int], Sequence[float]]],
    *,
    reward: Any = 1.0,
    agent_name: str | None = None,
) -> dict[str, Any]:
    """A NeMo Gym result dict in the shape `simple_agent` + `vllm_model` return, for the given model calls.

    Each call is `(prompt_token_ids, generation_token_ids, generation_log_probs)`. Every call but the last
    ends in a `function_call` item carrying the token fields, followed by its `function_call_output` (which
    carries none, as in NeMo Gym); the last call ends in an assistant `message` item carrying them. The
    `response` validates as `nemo_gym.openai_utils.NeMoGymResponse`.
    """
    output: list[dict[str, Any]] = []
    for index, (prompt, generation, log_probs) in enumerate(calls):
        tokens = {
            "prompt_token_ids": list(prompt),
            "generation_token_ids": list(generation),
            "generation_log_probs": list(log_probs),
        }
        if index < len(calls) - 1:
            call_id = f"call_{index}"
            output.append(
                {
                    "type": "function_call",
                    "id": call_id,
                    "call_id": call_id,
                    "name": "tool",
                    "arguments": "{}",
                    "status": "completed",
                    **tokens,
                }
            )
            output.append({"type": "function_call_output", "call_id": call_id, "output": '{"ok": true}'})
        else:
            output.append(
                {
                    "type": "message",
                    "id": f"msg_{index}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "done", "annotations": []}],
                    **tokens,
                }
            )
    result: dict[str, Any] = {
        "responses_create_params": {"input": [{"role": "user", "content": "task"}]},
        "response": {
            "id": "resp_synthetic",
            "object": "response",
            "created_at": 0,
            "model": "policy",
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "incomplete_details": None,
        },
        "reward": reward,
    }
    if agent_name is not None:
        result["agent_ref"] = {"name": agent_name}
    return result
