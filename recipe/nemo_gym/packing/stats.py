# SPDX-License-Identifier: Apache-2.0
"""`PackStats`: per-row statistics of one packed batch.

Filled by `batch.BatchPacker` beside the `DataProto` (not as non-tensors, so nothing extra travels to every
worker); `recipe/nemo_gym/metrics.py` names and computes every scalar logged from them. Pure: numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


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
    attempts: np.ndarray | None = None  # int, times the row was run (1 + its retries); set by the manager
    uid: np.ndarray | None = None  # object, verl's prompt-group id per row (training batches); set by the manager
    # float32 per reward component an environment returned (`Episode.reward_components`), by name; NaN on the rows
    # that did not return it and on failed rows.
    reward_components: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def failed(self) -> np.ndarray:
        return self.failure_cause != ""
