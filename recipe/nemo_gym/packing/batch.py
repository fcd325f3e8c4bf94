# SPDX-License-Identifier: Apache-2.0
"""`Episode`s and failures -> verl 0.9.1's rollout tensors: `BatchPacker` fills a batch one row at a time.

`BatchPacker(batch_size, ...)` preallocates the batch's tensors and `add(row, outcome)` writes one `Episode` or
`EpisodeFailure` into its row (any order; reading and writing each episode at once keeps no episode's arrays
alive past its row); `finish()` returns a `PackedBatch`: the `DataProto` and its `PackStats`. The batch holds the
tensors verl's agent loop produces (`AgentLoopWorker._agent_loop_postprocess` / `_postprocess` in 0.9.1):
`prompts` [B,P] left-padded, `responses` [B,R] right-padded, `response_mask` [B,R] (1 on generated tokens, 0 on
tool/user/environment tokens and padding), `input_ids`, `attention_mask`, `position_ids` [B,P+R]
(`clip(cumsum(attention_mask) - 1, 0)`, verl's `compute_position_id_with_mask`), `rollout_log_probs` [B,R]
float32 (0 where not generated), `rm_scores` [B,R] float32; padding uses `pad_token_id` as verl's tokenizer
padding does; all integer tensors are int64. Non-tensors: `__num_turns__` (int32), `multi_modal_inputs` (one
empty dict per row), `data_source` (the agent name) and, for each of `component_keys` (verl's GDPO reads them),
that reward component per row (float32; 0 on a failed row). `meta_info` is left empty: timing belongs to the
caller. Per-row statistics come back beside the `DataProto` in `PackStats`, not as non-tensors, so nothing
extra travels to every worker.

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
  (`fallback_prompt_ids`, its last `prompt_length` tokens) or a single `pad_token_id`, and one attended
  `pad_token_id` as its response. verl's `agg_loss` excludes rows whose mask is all 0 from sequence-mean
  modes, and token-mean counts only masked tokens, so such a row adds nothing to the policy loss. Row order and
  batch size are kept, so the row's reward 0 must be kept out of every statistic: the failure-aware estimators
  (`advantages.py`, `algorithm.adv_estimator=nemo_gym_grpo` and the others) leave it out of its group's
  baseline and give it advantage 0; its `response_length` of 0 (below) puts it among verl's aborted samples,
  outside `critic/score/*` and `critic/rewards/*`; the plugin's `reward/mean` metrics and the validation score
  (`metrics.validation_extra_info`) count valid episodes only.
- `prompt_length` and `response_length` [B] float32 are the attended lengths verl's step metrics would otherwise
  derive from `attention_mask`, except that a failed row's response length is 0 (its one attended pad token is no
  response). verl 0.9.1 reads them only there (`metric_utils._compute_response_info`): throughput counts no
  failed row's token, and `response/aborted_ratio` is the share of failed episodes.
- `data_source` comes from the input row's own (so verl's `DataProto.union` sees identical arrays) or else
  from each result's `agent_ref.name`; a result whose agent differs from its input row's is a row mix-up and
  raises `ValueError`.

No Ray, HTTP or vLLM here; numpy, torch and verl's `DataProto` only.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tensordict import TensorDict
from verl.protocol import DataProto

from recipe.nemo_gym.failures import EpisodeFailure
from recipe.nemo_gym.packing.episode import Episode
from recipe.nemo_gym.packing.stats import PackStats

__all__ = ["BatchPacker", "PackedBatch"]


@dataclass(frozen=True)
class PackedBatch:
    """One packed batch: verl's `DataProto` and, beside it, its per-row `PackStats`."""

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
    tensors' memory ahead of time.
    """

    def __init__(
        self,
        batch_size: int,
        *,
        prompt_length: int,
        response_length: int,
        pad_token_id: int,
        component_keys: Sequence[str] = (),
    ):
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
        self.components: dict[str, np.ndarray] = {}  # reward components by name, NaN where absent
        self.component_keys = tuple(component_keys)
        self._filled = np.zeros(B, dtype=bool)
        # Attended lengths per row, for verl's step metrics (`finish`); a failed row's response counts as 0.
        self._prompt_lengths = np.zeros(B, dtype=np.float32)
        self._response_lengths = np.zeros(B, dtype=np.float32)

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
        prompt exceeds `prompt_length` is refused (`ValueError`): that failure is decided when the result is read.
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
            if outcome.prompt_length > P:
                # PROMPT_TOO_LONG is decided where the result is read (`episode_from_result(max_prompt_length=)`),
                # so the failure reaches the manager's failure list and budget; reaching here is a caller's bug.
                raise ValueError(
                    f"row {row}: first prompt is {outcome.prompt_length} tokens, over the prompt length {P}; read "
                    "results with episode_from_result(max_prompt_length=prompt_length)"
                )
            self.sources[row] = data_source if data_source is not None else outcome.agent_name
        elif isinstance(outcome, EpisodeFailure):
            self.sources[row] = data_source
        else:
            raise TypeError(f"row {row}: expected Episode or EpisodeFailure, got {type(outcome).__name__}")

        if isinstance(outcome, Episode):
            kept = min(outcome.response_length, R)
            start, stop = P - outcome.prompt_length, P + kept  # the attended columns
            self._response_lengths[row] = kept
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
            for name, value in outcome.reward_components.items():
                if name not in self.components:
                    self.components[name] = np.full(self.batch_size, np.nan, dtype=np.float32)
                self.components[name][row] = value
        else:
            prompt = list(fallback_prompt_ids[-P:]) if fallback_prompt_ids else [self.pad_token_id]
            # One attended response token (a pad token, never trained on): see the module docstring.
            start, stop = P - len(prompt), P + 1
            tokens = [*prompt, self.pad_token_id]
            self.causes[row] = outcome.cause.value

        self._prompt_lengths[row] = P - start
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
                # Read by verl's step metrics in place of lengths from `attention_mask` (`_compute_response_info`,
                # verl 0.9.1): a failed row's response length 0 makes verl count it as aborted, outside
                # `critic/score/*` and `critic/rewards/*` (module docstring). Float: verl takes their mean.
                "prompt_length": torch.from_numpy(self._prompt_lengths),
                "response_length": torch.from_numpy(self._response_lengths),
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
        for key in self.component_keys:
            # What verl's GDPO reads per row (`algorithm.gdpo_reward_keys`); a failed row's component is 0, as its
            # reward is. (A packed episode without the component failed as BAD_REWARD when it was read.)
            values = self.components.get(key, np.full(B, np.nan, dtype=np.float32))
            non_tensor_batch[key] = np.nan_to_num(values, nan=0.0)
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
            reward_components=self.components,
        )
        return PackedBatch(data=DataProto(batch=batch, non_tensor_batch=non_tensor_batch, meta_info={}), stats=stats)
