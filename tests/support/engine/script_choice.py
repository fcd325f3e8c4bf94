# SPDX-License-Identifier: Apache-2.0
"""Which scripted policy a request plays on an engine that serves many (`shared_engine.py`): the request names it.

A NeMo Gym row names it for every model call of its episode (`scripted_row`), a direct OpenAI request in its body
(`script_body`); both put the script's path under `vllm_xargs[SCRIPT_XARG]`, which vLLM 0.24 hands to
`scripted_logits.ScriptedLogitsProcessor` as `SamplingParams.extra_args`. Pure: no vLLM import here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCRIPT_XARG = "scripted_policy"
"""The `vllm_xargs` key that names a request's `ScriptedPolicy` JSON file."""


def script_body(script_file: str | Path) -> dict[str, Any]:
    """The part of an OpenAI request body that makes the engine play `script_file` for that request."""
    return {"vllm_xargs": {SCRIPT_XARG: str(script_file)}}


def scripted_row(row: dict[str, Any], script_file: str | Path) -> dict[str, Any]:
    """A copy of NeMo Gym row `row` whose every model call plays `script_file` (the row's own `extra_body` kept)."""
    params = dict(row["responses_create_params"])
    metadata = dict(params.get("metadata") or {})
    extra_body = json.loads(metadata.get("extra_body", "{}"))
    extra_body["vllm_xargs"] = {**extra_body.get("vllm_xargs", {}), SCRIPT_XARG: str(script_file)}
    metadata["extra_body"] = json.dumps(extra_body)
    return {**row, "responses_create_params": {**params, "metadata": metadata}}
