# SPDX-License-Identifier: Apache-2.0
"""The failure cause of a row whose `/run` did not give a trainable result: decided here and nowhere else.

Contract (all pure):
- `server_error_cause(body)` maps an agent's `/run` error body to a `FailureCause`: a splice refusal is
  CONTIGUITY_BROKEN, a NaN the policy server could not send is NON_FINITE_LOGPROB, anything else SERVER_ERROR.
  `server_error_failure` builds the row's `EpisodeFailure` with a readable excerpt of the body.
- `context_overflow_failure(row, result)` is PROMPT_TOO_LONG for a result whose first model call the policy
  server refused as over the model's context, else None.
- `reported_failure(row, server, result)` is the failure NeMo Gym itself reported on a row that came back with
  HTTP 200 (`_ng_failure_class`, `mask_sample`), else None.
- `missing_verdict_failure(row, server, result)` is ENVIRONMENT_FAILED for a `math_with_judge` result that carries
  no verdict although its reward says 0 (its verifier process gave none), else None.

What reaches these bodies, in NeMo Gym 0.4.0 and 0.7.0: HTTP errors are not retried at the `/run` level; the
model server retries 500/502/503/504/429/520 from the policy 3 times (0.5 s apart) before it fails the agent's
request with a 500 whose body wraps the policy's. A 0.7 `legacy_agent` relay passes the agent's 500 on; an
environment server that runs the episode itself (`single_agent_turn_legacy`) answers 200 with the failure row.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from recipe.nemo_gym.failures import EpisodeFailure, FailureCause
from recipe.nemo_gym.splice.carriers import SpliceError
from recipe.nemo_gym.token_fields import GENERATION_IDS_KEY

# NeMo Gym 0.6+'s failure row fields (`rollout_collection.py`, `failure_kinds.py`; names checked against 0.7.0).
FAILURE_CLASS_KEY = "_ng_failure_class"
FAILURE_DETAIL_KEYS = ("_ng_failure_type", "_ng_failure_message", "_ng_failure_http_status")
MASK_SAMPLE_KEY = "mask_sample"
CANCELLED_CLASS = "cancelled"
JUDGE_FAILED_CLASS = "judge_failed"  # `nemo_gym/judge.py`'s `judge_failsafe`: the server's judge call failed
_CAUSE_OF_CLASS = {CANCELLED_CLASS: FailureCause.CANCELLED, JUDGE_FAILED_CLASS: FailureCause.JUDGE_FAILED}

# Every refusal of the token-exact splice starts with `SpliceError.PREFIX`. vLLM answers it with HTTP 400 and the
# message, and NeMo Gym's model server and agent each wrap the inner body in `repr` (quotes and backslashes escaped,
# once per hop); the prefix holds neither, so it reaches the agent's error body unchanged.
_SPLICE_REFUSAL = re.compile(re.escape(SpliceError.PREFIX))
# vLLM's OpenAI server cannot encode a response holding NaN (in 0.24: a NaN log-prob, the only float a chat
# completion returns per token; -inf is clamped to -9999.0) and answers with the JSON encoder's message (HTTP 400).
_NON_FINITE_FLOAT = re.compile(r"Out of range float values are not JSON compliant")


def server_error_cause(body: str) -> FailureCause:
    """The failure cause an agent's `/run` error body stands for (pure; see `server_error_failure`).

    - the policy server refused an edited history (a splice rule failed): CONTIGUITY_BROKEN, a data fault that
      no retry fixes;
    - the policy server could not serialise a non-finite float (a NaN log-prob): NON_FINITE_LOGPROB;
    - anything else: SERVER_ERROR.
    """
    if _SPLICE_REFUSAL.search(body):
        return FailureCause.CONTIGUITY_BROKEN
    if _NON_FINITE_FLOAT.search(body):
        return FailureCause.NON_FINITE_LOGPROB
    return FailureCause.SERVER_ERROR


def _readable_excerpt(body: str, start: int, limit: int = 300) -> str:
    """The JSON string value that starts at `start` in `body`, unescaped from NeMo Gym's nested `repr`s, cut at
    `limit`. The message of vLLM's error JSON holds no double quote of its own, so the first one ends it."""
    text = re.sub(r"\\+", "", body[start:]).split('"', 1)[0]
    return text if len(text) <= limit else text[:limit] + "..."


def server_error_failure(
    row: int, agent: str, status: int | None, body: bytes | str | None, via: str | None = None
) -> EpisodeFailure:
    """The `EpisodeFailure` for a row whose `/run` failed; the cause is read from the whole body first.

    `agent` is the row's agent; `via` the environment server the row was posted to in front of it, if any."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    body = (body or "").strip()
    cause = server_error_cause(body)
    status_text = f"HTTP {status}" if status is not None else "an error"
    through = f" (through {via!r})" if via else ""
    where = f"agent {agent!r} /run{through} returned {status_text}"
    if cause is FailureCause.CONTIGUITY_BROKEN:
        found = _SPLICE_REFUSAL.search(body)
        assert found is not None
        detail = f"{where}: the policy server refused the chat history (token-exact splice): "
        return EpisodeFailure(cause, detail + _readable_excerpt(body, found.end()), row=row)
    if cause is FailureCause.NON_FINITE_LOGPROB:
        found = _NON_FINITE_FLOAT.search(body)
        assert found is not None
        detail = f"{where}: the policy server could not send a non-finite log-prob: "
        return EpisodeFailure(cause, detail + _readable_excerpt(body, found.start()), row=row)
    if len(body) > 500:
        body = body[:500] + "..."
    return EpisodeFailure(cause, f"{where}: {body}", row=row)


def context_overflow_failure(row: int, result: Mapping[str, Any]) -> EpisodeFailure | None:
    """PROMPT_TOO_LONG for a result whose first model call was refused as longer than the model's context.

    NeMo Gym 0.4.0's `vllm_model` server turns vLLM's HTTP 400 for a prompt over the context ("maximum context
    length", or "max_tokens" too large for what is left of it) into an empty chat completion that finished on
    "length", so the episode comes back looking like a generation cut at zero tokens: `incomplete_details`
    `{"reason": "max_output_tokens"}` and no output item carrying generation token IDs. Any model call that did
    generate makes it an ordinary (cut) episode, and None is returned.
    """
    response = result.get("response")
    if not isinstance(response, Mapping):
        return None
    details = response.get("incomplete_details")
    if not isinstance(details, Mapping) or details.get("reason") != "max_output_tokens":
        return None
    output = response.get("output")
    if not isinstance(output, list):
        return None
    if any(isinstance(item, Mapping) and item.get(GENERATION_IDS_KEY) is not None for item in output):
        return None
    return EpisodeFailure(
        FailureCause.PROMPT_TOO_LONG,
        "the policy server refused the first model call as longer than the model's context (NeMo Gym's model "
        "server answered it as an empty turn cut on length); shorten the prompt or raise the context length",
        row=row,
    )


def reported_failure(row: int, server: str, result: Mapping[str, Any]) -> EpisodeFailure | None:
    """The failure NeMo Gym reported on a row that came back with HTTP 200, or None for an ordinary result.

    - `_ng_failure_class: cancelled` (a row drained by Gym's dispatch budget): CANCELLED;
    - `_ng_failure_class: judge_failed` (the resources server's judge call failed; Gym 0.7 sets `mask_sample` too):
      JUDGE_FAILED;
    - any other `_ng_failure_class` (e.g. `environment_server_failed`, `agent_run_error`): ENVIRONMENT_FAILED,
      the class and `_ng_failure_type` / `_ng_failure_message` / `_ng_failure_http_status` in the detail;
    - `mask_sample: true` without a failure class (the environment asks not to train on it):
      MASKED_BY_ENVIRONMENT.
    """
    failure_class = result.get(FAILURE_CLASS_KEY)
    if failure_class:
        details = ", ".join(
            f"{key.removeprefix('_ng_failure_')}={_excerpt(result[key])}"
            for key in FAILURE_DETAIL_KEYS
            if result.get(key) not in (None, "")
        )
        cause = _CAUSE_OF_CLASS.get(failure_class, FailureCause.ENVIRONMENT_FAILED)
        suffix = f" ({details})" if details else ""
        return EpisodeFailure(cause, f"{server!r} /run reported failure class {failure_class!r}{suffix}", row=row)
    if result.get(MASK_SAMPLE_KEY) is True:
        return EpisodeFailure(
            FailureCause.MASKED_BY_ENVIRONMENT,
            f"{server!r} /run marked the episode mask_sample (the environment asks not to train on it)",
            row=row,
        )
    return None


# `math_with_judge`'s verify fields (NeMo Gym 0.4.0 to 0.7.0), which the row's result carries.
LIBRARY_REWARD_KEY, EXTRACTED_ANSWER_KEY, JUDGE_EVALUATIONS_KEY = (
    "library_reward",
    "extracted_answer",
    "judge_evaluations",
)
_BOXED_ANSWER = re.compile(r"\\boxed\{\s*[^\s}]")


def missing_verdict_failure(row: int, server: str, result: Mapping[str, Any]) -> EpisodeFailure | None:
    """ENVIRONMENT_FAILED for a `math_with_judge` result whose reward 0 is no verdict, else None.

    `math_with_judge` (NeMo Gym 0.4.0 to 0.7.0) checks each answer with math-verify in a forked process and scores 0,
    with no failure flag and no extracted answer, whenever that check gives no result: the process timed out, died,
    or math-verify's own signal-based time limits (5 s to parse, 5 s to compare, 2 s to print; not configurable)
    cut it short, which happens on a CPU-starved node (up to `library_verifier_max_concurrency`, 32 by default,
    checks at once). A check that completes always extracts something from a `\\boxed{...}` answer (math-verify
    keeps the raw text when it cannot parse it), so reward 0, no extracted answer, no judge consulted and a
    non-empty boxed answer in the text the verifier read (the output text of its message items) mean the check
    failed. Such a row is retried, then masked: its 0 is not the environment's verdict.
    """
    if LIBRARY_REWARD_KEY not in result or EXTRACTED_ANSWER_KEY not in result:
        return None
    if result.get(EXTRACTED_ANSWER_KEY) is not None or result.get(JUDGE_EVALUATIONS_KEY):
        return None
    if result.get(LIBRARY_REWARD_KEY) != 0 or result.get("reward") != 0:
        return None
    response = result.get("response")
    output = response.get("output") if isinstance(response, Mapping) else None
    texts = [
        part.get("text") or ""
        for item in (output if isinstance(output, list) else [])
        if isinstance(item, Mapping) and item.get("type") == "message"
        for part in (item.get("content") if isinstance(item.get("content"), list) else [])
        if isinstance(part, Mapping) and part.get("type") == "output_text"
    ]
    if not _BOXED_ANSWER.search("".join(texts)):
        return None
    return EpisodeFailure(
        FailureCause.ENVIRONMENT_FAILED,
        f"{server!r} scored a \\boxed{{}} answer 0 without extracting it: its math-verify check gave no verdict (timed "
        "out or failed; see docs/troubleshooting.md, 'A correct math answer scored 0')",
        row=row,
    )


def _excerpt(value: Any, limit: int = 300) -> str:
    text = str(value).strip()
    return text if len(text) <= limit else text[:limit] + "..."
