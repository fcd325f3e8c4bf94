"""verl rows to NeMo Gym examples: the request side of a rollout, as pure functions.

Contract:
- Sampling comes from verl's rollout config (`rollout.temperature`, `top_p`, `top_k`; `rollout.val_kwargs` when
  validating), never from the row: the actor recomputes log-probs at the rollout temperature, so a row that
  sampled at its own temperature would be trained off-policy.
- `max_output_tokens` of every model call is `rollout.response_length`: one call can never produce more than
  the packed response can hold (longer multi-turn episodes are cut later, and counted).
- Knobs the Responses API schema lacks (`top_k`) travel in `metadata.extra_body` as a JSON string, which NeMo
  Gym's vllm_model server merges into the chat completion request; keys the row already has there are kept.
- Everything else in the row (tools, instructions, environment fields such as `expected_answer`) is kept as is.
  `metadata: null` is dropped (NeMo Gym's model server answers it with a 500).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float
    top_k: int
    max_output_tokens: int


def sampling_from_rollout_config(rollout: Mapping[str, Any], *, validate: bool) -> Sampling:
    """Read the sampling knobs from verl's `actor_rollout_ref.rollout` section."""
    source = rollout["val_kwargs"] if validate else rollout
    temperature = float(source.get("temperature", 1.0))
    if validate and not source.get("do_sample", True):
        temperature = 0.0
    return Sampling(
        temperature=temperature,
        top_p=float(source.get("top_p", 1.0)),
        top_k=int(source.get("top_k", -1)),
        max_output_tokens=int(rollout["response_length"]),
    )


def build_example(row: Mapping[str, Any], sampling: Sampling) -> dict[str, Any]:
    """Return a deep copy of a NeMo Gym JSONL row with verl's sampling applied to its request."""
    example = copy.deepcopy(dict(row))
    params = example["responses_create_params"]
    params["temperature"] = sampling.temperature
    params["top_p"] = sampling.top_p
    params["max_output_tokens"] = sampling.max_output_tokens
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
