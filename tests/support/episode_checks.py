# SPDX-License-Identifier: Apache-2.0
"""Checks of a batch the real manager packed, against the NeMo Gym results it packed it from.

- `model_calls(result)`: each model call of a result, `(prompt_token_ids, generation_token_ids,
  generation_log_probs)`, from the output items that carry them.
- `assert_trained_on_policy_tokens(output, results)`: every row's turns are contiguous (each prompt begins with the
  previous prompt plus its generation), what `response_mask` trains is exactly the generations, in order, with
  their rollout log-probs, and each row's `rm_scores` sum to its result's reward.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from recipe.nemo_gym.token_fields import TOKEN_FIELDS


def model_calls(result: Mapping[str, Any]) -> list[tuple[list[int], list[int], list[float]]]:
    return [
        tuple(item[f] for f in TOKEN_FIELDS)
        for item in result["response"]["output"]
        if all(item.get(f) is not None for f in TOKEN_FIELDS)
    ]


def assert_trained_on_policy_tokens(output: Any, results: Sequence[Mapping[str, Any]]) -> None:
    responses, mask = output.batch["responses"], output.batch["response_mask"]
    for row, result in enumerate(results):
        calls = model_calls(result)
        for (prev_prompt, prev_gen, _), (prompt, _, _) in zip(calls, calls[1:], strict=False):
            assert prompt[: len(prev_prompt) + len(prev_gen)] == prev_prompt + prev_gen, (
                f"row {row}: turns not contiguous"
            )
        trained = responses[row][mask[row].bool()].tolist()
        assert trained == [token for _, generation, _ in calls for token in generation], f"row {row}"
        log_probs = output.batch["rollout_log_probs"][row][mask[row].bool()].tolist()
        assert log_probs == pytest.approx([lp for _, _, lps in calls for lp in lps], abs=1e-6), f"row {row}"
    assert output.batch["rm_scores"].sum(-1).tolist() == pytest.approx([float(r["reward"]) for r in results])
