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

2. `BatchPacker(batch_size, ...)` preallocates the batch's tensors and `add(row, outcome)` writes one `Episode`
   or `EpisodeFailure` into its row (any order; reading and writing each episode at once keeps no episode's
   arrays alive past its row); `finish()` returns the batch. `pack_batch(outcomes, ...)` does the same for a
   list, row i = outcomes[i]. The batch holds the tensors verl's agent loop produces
   (`AgentLoopWorker._agent_loop_postprocess` / `_postprocess` in 0.9.1): `prompts` [B,P] left-padded,
   `responses` [B,R] right-padded, `response_mask` [B,R] (1 on generated tokens, 0 on tool/user/environment
   tokens and padding), `input_ids`, `attention_mask`, `position_ids` [B,P+R]
   (`clip(cumsum(attention_mask) - 1, 0)`, verl's `compute_position_id_with_mask`),
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
import mmap
import struct
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
    "BatchPacker",
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


# Token lists are read once into array("Q") (unsigned 64-bit): ~7.5 ns per token on one core here, the fastest
# list-to-buffer conversion in the standard library (array("q") and struct take 11-20 ns, numpy ~30 ns). Every
# contiguity comparison is then a memcmp. Comparing the Python lists directly costs ~14 ns per token, and an
# 8-call, 15k-token episode has ~55k earlier-call tokens to compare: more than the whole packing budget.
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
        prompt_ids = _token_array(index + 1, "prompt_token_ids", prompt)
        generation_ids = _token_array(index + 1, "generation_token_ids", generation)
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
        raise _bad_token(len(calls), "prompt_token_ids", last_prompt) or _bad_token(
            len(calls), "generation_token_ids", last_generation
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
    for index, (_, generation, log_probs) in enumerate(calls):
        if len(generation) != len(log_probs):
            raise EpisodeDataError(
                FailureCause.MISSING_GENERATION,
                f"model call {index + 1} has {len(generation)} generation_token_ids but {len(log_probs)} "
                "generation_log_probs",
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


class BatchPacker:
    """verl 0.9.1's rollout tensors for one batch, preallocated and filled one row at a time.

    `add(row, outcome)` writes an `Episode` or `EpisodeFailure` straight into row `row` of every tensor, in any
    row order; `finish()` returns the `PackedBatch` once every row is filled. Filling rows as episodes are read
    means no episode's arrays outlive its row: per-episode memory is reused from one episode to the next
    instead of being newly mapped for every episode of the batch. `prefault()` (optional) maps the batch
    tensors' memory ahead of time. `pack_batch` is the one-call form.
    """

    def __init__(self, batch_size: int, *, prompt_length: int, response_length: int, pad_token_id: int):
        if prompt_length < 1 or response_length < 1:
            raise ValueError(f"prompt_length and response_length must be >= 1, got {prompt_length}, {response_length}")
        if batch_size < 1:
            raise ValueError("cannot pack an empty batch")
        B, P, R = batch_size, prompt_length, response_length
        self.batch_size, self.prompt_length, self.response_length = B, P, R
        self.pad_token_id = pad_token_id
        # Every row of the [B, P+R] tensors is written exactly once, left to right (pad, tokens, pad); `prompts`
        # and `responses` are copied from the row just written while it is in cache. Tensors that stay mostly
        # zero come from np.zeros (pages the kernel zeroes on first touch).
        self.input_ids = np.empty((B, P + R), dtype=np.int64)
        self.prompts = np.empty((B, P), dtype=np.int64)
        self.responses = np.empty((B, R), dtype=np.int64)
        self.attention_mask = np.empty((B, P + R), dtype=np.int64)
        self.position_ids = np.empty((B, P + R), dtype=np.int64)
        self.response_mask = np.zeros((B, R), dtype=np.int64)
        self.log_probs = np.zeros((B, R), dtype=np.float32)
        self.rm_scores = np.zeros((B, R), dtype=np.float32)
        self._positions = np.arange(P + R, dtype=np.int64)

        self.num_turns = np.zeros(B, dtype=np.int32)
        self.model_calls = np.zeros(B, dtype=np.int32)
        self.generated = np.zeros(B, dtype=np.int64)
        self.trained = np.zeros(B, dtype=np.int64)
        self.env = np.zeros(B, dtype=np.int64)
        self.total = np.zeros(B, dtype=np.int64)
        self.truncated = np.zeros(B, dtype=bool)
        self.stopped = np.zeros(B, dtype=bool)
        self.rewards = np.zeros(B, dtype=np.float32)
        self.causes = np.full(B, "", dtype=object)
        self.sources = np.empty(B, dtype=object)
        self._filled = np.zeros(B, dtype=bool)

    def prefault(self) -> None:
        """Map every page of the batch tensors now, so that `add` writes into memory that is already mapped.

        A batch of 1,024 rows of 16k tokens is about 800 MB of new memory, and the first write to each page
        costs a page fault in which the kernel zeroes the page. The manager runs this in a worker thread while
        NeMo Gym runs the episodes, so that cost is paid during the rollout wait, not after it (numpy writes
        without holding the GIL). One element per page is written, not the whole tensor: the fault is the
        cost, and a full fill would write all of the memory a second time, right after the kernel zeroed it.
        The zero written is each tensor's default or is overwritten by `add`.
        """
        for tensor in (
            self.input_ids,
            self.prompts,
            self.responses,
            self.attention_mask,
            self.position_ids,
            self.response_mask,
            self.log_probs,
            self.rm_scores,
        ):
            # Writes PAGESIZE bytes apart land once in every page, whatever the buffer's alignment.
            tensor.reshape(-1)[:: mmap.PAGESIZE // tensor.itemsize] = 0

    def add(
        self,
        row: int,
        outcome: Episode | EpisodeFailure,
        *,
        fallback_prompt_ids: Sequence[int] | None = None,
        data_source: str | None = None,
    ) -> None:
        """Write `outcome` into row `row`.

        `fallback_prompt_ids` is the tokenised prompt the row carries if it failed. `data_source` is the input
        row's own `data_source`; without it the episode's `agent_ref.name` is used. An `Episode` whose first
        prompt exceeds `prompt_length` is packed as a PROMPT_TOO_LONG failure.
        """
        if not 0 <= row < self.batch_size:
            raise ValueError(f"row {row} is outside the batch of {self.batch_size}")
        if self._filled[row]:
            raise ValueError(f"row {row} was already packed")
        P, R = self.prompt_length, self.response_length
        if isinstance(outcome, Episode):
            if data_source is not None and outcome.agent_name is not None and outcome.agent_name != data_source:
                raise ValueError(
                    f"row {row}: the result comes from agent {outcome.agent_name!r} but the input row's "
                    f"data_source is {data_source!r}; results and rows are mismatched"
                )
            self.sources[row] = data_source if data_source is not None else outcome.agent_name
            if outcome.prompt_length > P:
                outcome = EpisodeFailure(
                    FailureCause.PROMPT_TOO_LONG,
                    f"first prompt is {outcome.prompt_length} tokens, over the prompt length {P}",
                    row=row,
                )
        elif isinstance(outcome, EpisodeFailure):
            self.sources[row] = data_source
        else:
            raise TypeError(f"row {row}: expected Episode or EpisodeFailure, got {type(outcome).__name__}")

        if isinstance(outcome, Episode):
            kept = min(outcome.response_length, R)
            start, stop = P - outcome.prompt_length, P + kept  # the attended columns
            tokens = outcome.token_ids[: stop - start]
            self.response_mask[row, :kept] = outcome.response_mask[:kept]
            self.log_probs[row, :kept] = outcome.response_log_probs[:kept]
            self.rm_scores[row, _reward_position(outcome, kept)] = outcome.reward

            generated = outcome.generated_tokens
            self.num_turns[row] = outcome.num_turns
            self.model_calls[row] = outcome.num_model_calls
            self.generated[row] = generated
            self.trained[row] = generated if kept == outcome.response_length else self.response_mask[row].sum()
            self.env[row] = outcome.response_length - generated
            self.total[row] = len(outcome.token_ids)
            self.truncated[row] = outcome.response_length > R
            self.stopped[row] = outcome.stopped_on_length
            self.rewards[row] = outcome.reward
        else:
            prompt = list(fallback_prompt_ids[-P:]) if fallback_prompt_ids else [self.pad_token_id]
            # One attended response token (a pad token, never trained on): see the module docstring.
            start, stop = P - len(prompt), P + 1
            tokens = [*prompt, self.pad_token_id]
            self.causes[row] = outcome.cause.value

        pad = self.pad_token_id
        ids, mask, positions = self.input_ids[row], self.attention_mask[row], self.position_ids[row]
        ids[:start] = pad
        ids[start:stop] = tokens
        ids[stop:] = pad
        mask[:start] = 0
        mask[start:stop] = 1
        mask[stop:] = 0
        # verl's compute_position_id_with_mask, clip(cumsum(mask) - 1, 0), for one contiguous attended span.
        positions[:start] = 0
        positions[start:stop] = self._positions[: stop - start]
        positions[stop:] = stop - start - 1
        self.prompts[row] = ids[:P]
        self.responses[row] = ids[P:]
        self._filled[row] = True

    def finish(self) -> PackedBatch:
        """The packed batch; every row must have been added."""
        missing = np.flatnonzero(~self._filled)
        if len(missing):
            raise ValueError(
                f"{len(missing)} of {self.batch_size} rows were never packed (first: {missing[:10].tolist()})"
            )
        B = self.batch_size
        batch = TensorDict(
            {
                "prompts": torch.from_numpy(self.prompts),
                "responses": torch.from_numpy(self.responses),
                "response_mask": torch.from_numpy(self.response_mask),
                "input_ids": torch.from_numpy(self.input_ids),
                "attention_mask": torch.from_numpy(self.attention_mask),
                "position_ids": torch.from_numpy(self.position_ids),
                "rollout_log_probs": torch.from_numpy(self.log_probs),
                "rm_scores": torch.from_numpy(self.rm_scores),
            },
            batch_size=B,
        )
        multi_modal_inputs = np.empty(B, dtype=object)
        for row in range(B):
            multi_modal_inputs[row] = {}
        non_tensor_batch = {"__num_turns__": self.num_turns.copy(), "multi_modal_inputs": multi_modal_inputs}
        known_sources = all(source is not None for source in self.sources)
        if known_sources:
            non_tensor_batch["data_source"] = self.sources
        stats = PackStats(
            num_turns=self.num_turns,
            model_calls=self.model_calls,
            generated_tokens=self.generated,
            trained_tokens=self.trained,
            env_tokens=self.env,
            total_tokens=self.total,
            truncated=self.truncated,
            stopped_on_length=self.stopped,
            reward=self.rewards,
            failure_cause=self.causes,
            data_source=self.sources if known_sources else None,
        )
        return PackedBatch(data=DataProto(batch=batch, non_tensor_batch=non_tensor_batch, meta_info={}), stats=stats)


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
    batch_size = len(outcomes)
    for name, values in (("fallback_prompt_ids", fallback_prompt_ids), ("data_sources", data_sources)):
        if values is not None and len(values) != batch_size:
            raise ValueError(f"{name} has {len(values)} entries for {batch_size} outcomes")
    packer = BatchPacker(
        batch_size, prompt_length=prompt_length, response_length=response_length, pad_token_id=pad_token_id
    )
    for row, outcome in enumerate(outcomes):
        packer.add(
            row,
            outcome,
            fallback_prompt_ids=fallback_prompt_ids[row] if fallback_prompt_ids is not None else None,
            data_source=data_sources[row] if data_sources is not None else None,
        )
    return packer.finish()


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
