# SPDX-License-Identifier: Apache-2.0
"""verl rows to NeMo Gym examples: the request side of a rollout, as pure functions.

Contract:
- Sampling comes from verl's rollout config (`rollout.temperature`, `top_p`, `top_k`; `rollout.val_kwargs` when
  validating), never from the row: the actor recomputes log-probs at the rollout temperature, so a row that
  sampled at its own temperature would be trained off-policy.
- Rows verl marks not to sample go out greedy (temperature 0, top_p 1, top_k -1: verl's own greedy settings),
  decided per row as verl 0.9.1's agent loop decides it (`verl/experimental/agent_loop/agent_loop.py`,
  `generate_sequences`): in training, a row whose `__do_sample__` is false. verl's REMAX step sends its greedy
  baseline rows that way, appended to the sampled rows of the same batch (`ray_trainer.py`, `fit`). A batch
  whose `meta_info["do_sample"]` is false is greedy as a whole; the trainer sets that flag for validation from
  `val_kwargs.do_sample` (read from the config when the flag is absent). In validation `val_kwargs` rule and
  row flags are ignored, as verl ignores them.
- `max_output_tokens` of every model call is at most `rollout.response_length`: one call can never produce more
  than the packed response can hold (longer multi-turn episodes are cut later, and counted). A row's own smaller
  limit is the environment's (a short-answer task) and is kept: a length limit changes no token's log-prob.
- Knobs the Responses API schema lacks (`top_k`) travel in `metadata.extra_body` as a JSON string, which NeMo
  Gym's vllm_model server merges into the chat completion request; keys the row already has there are kept.
- A validation batch is run without verl's padding (`real_rows`): each real episode runs once, and the caller
  fills the padded rows with copies of the rows they duplicate (the trainer drops them unread).
- Everything else in the row (tools, instructions, environment fields such as `expected_answer`) is kept as is.
  `metadata: null` is dropped (NeMo Gym's model server answers it with a 500).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DO_SAMPLE_KEY = "__do_sample__"
"""verl's per-row sampling flag (a boolean non-tensor column): false means greedy."""


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float
    top_k: int
    max_output_tokens: int

    def greedy(self) -> Sampling:
        """These settings made greedy exactly as verl's agent loop does (`apply_greedy_sampling_params`)."""
        return dataclasses.replace(self, temperature=0.0, top_p=1.0, top_k=-1)


def sampling_from_rollout_config(
    rollout: Mapping[str, Any], *, validate: bool, do_sample: bool | None = None
) -> Sampling:
    """Read the sampling knobs from verl's `actor_rollout_ref.rollout` section.

    `do_sample` is the batch's own flag (`meta_info["do_sample"]`) when it has one; false makes the batch
    greedy. Without it, validation is greedy when `val_kwargs.do_sample` is false and training samples.
    """
    source = rollout["val_kwargs"] if validate else rollout
    sampling = Sampling(
        temperature=float(source.get("temperature", 1.0)),
        top_p=float(source.get("top_p", 1.0)),
        top_k=int(source.get("top_k", -1)),
        max_output_tokens=int(rollout["response_length"]),
    )
    if do_sample is None:
        do_sample = bool(source.get("do_sample", True)) if validate else True
    return sampling if do_sample else sampling.greedy()


def row_samplings(
    rollout: Mapping[str, Any],
    meta_info: Mapping[str, Any],
    row_do_sample: Sequence[Any] | None,
    num_rows: int,
) -> list[Sampling]:
    """The sampling of each of a batch's first `num_rows` rows (see the module docstring for the rule).

    `meta_info` is the batch's (`validate`, `do_sample`); `row_do_sample` its `__do_sample__` column, if any.
    """
    validate = bool(meta_info.get("validate", False))
    flag = meta_info.get("do_sample")
    batch = sampling_from_rollout_config(rollout, validate=validate, do_sample=None if flag is None else bool(flag))
    if validate or row_do_sample is None:
        return [batch] * num_rows
    if len(row_do_sample) < num_rows:
        raise ValueError(f"{DO_SAMPLE_KEY} has {len(row_do_sample)} entries for a batch of {num_rows} rows")
    greedy = batch.greedy()
    return [batch if bool(row_do_sample[i]) else greedy for i in range(num_rows)]


def build_example(row: Mapping[str, Any], sampling: Sampling) -> dict[str, Any]:
    """Return a deep copy of a NeMo Gym JSONL row with verl's sampling applied to its request. A row without a
    request is copied as it is: `GymConnection.collect`'s check of the batch refuses it, naming it."""
    if not isinstance(row, Mapping) or not isinstance(row.get("responses_create_params"), Mapping):
        return copy.deepcopy(row)
    example = copy.deepcopy(dict(row))
    params = example["responses_create_params"]
    params["temperature"] = sampling.temperature
    params["top_p"] = sampling.top_p
    own_limit = params.get("max_output_tokens")
    if not (isinstance(own_limit, int) and 0 < own_limit <= sampling.max_output_tokens):
        params["max_output_tokens"] = sampling.max_output_tokens  # absent, larger, or not a token count
    metadata = params.get("metadata")
    if metadata is None:
        params.pop("metadata", None)
    if sampling.top_k > 0:
        metadata = dict(metadata or {})
        extra_body = json.loads(metadata.get("extra_body", "{}"))
        extra_body["top_k"] = sampling.top_k
        metadata["extra_body"] = json.dumps(extra_body)
        params["metadata"] = metadata
    return example


def real_rows(uids: Sequence[Any] | None, rows: Sequence[Any], *, n: int, divisor: int) -> int:
    """How many leading rows of a validation batch are real; the rest are verl's padding.

    verl 0.9.1's `_validate` repeats each prompt `val_kwargs.n` times (interleaved; one `uid` per prompt), then
    pads the batch to a multiple of `rollout.agent.num_workers` with copies of its leading rows
    (`verl.protocol.pad_dataproto_to_divisor`: row L + j is a copy of row j mod L). The padding is recognised
    only when all of this holds, L being the number of distinct uids times `n`: the batch size is L rounded up
    to a multiple of `divisor`; each uid occurs exactly `n` times in the first L rows; every later row i has
    the uid and the row of row i mod L. Otherwise (no uids, a dataset with its own repeated uids, another
    padding) every row is taken as real: running a row twice is safe, dropping a real one is not.
    """
    total = len(rows)
    if uids is None or n < 1 or divisor < 1 or total == 0:
        return total
    counts = Counter(uids[:total])
    real = len(counts) * n
    if real >= total or -(-real // divisor) * divisor != total:
        return total
    if Counter(uids[:real]) != {uid: n for uid in counts}:
        return total
    if any(uids[i] != uids[i % real] or rows[i] != rows[i % real] for i in range(real, total)):
        return total
    return real
