# SPDX-License-Identifier: Apache-2.0
"""Test support for packing: NeMo Gym results built from token lists, and a batch packed in one call.

- `synthetic_result(calls, ...)`: a result dict in the shape `simple_agent` + `vllm_model` return.
- `pack_batch(outcomes, ...)`: `packing.batch.BatchPacker` filled with row i = outcomes[i], finished.

Used by the tests and `benchmarks/bench_packing.py`. The product (`agent_loop`) never builds results and fills
its `BatchPacker` row by row as results arrive.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from recipe.nemo_gym.failures import EpisodeFailure
from recipe.nemo_gym.packing.batch import BatchPacker, PackedBatch
from recipe.nemo_gym.packing.episode import Episode

__all__ = ["pack_batch", "synthetic_result"]


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
    An `Episode` whose first prompt exceeds `prompt_length` is refused (`BatchPacker.add`).
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
