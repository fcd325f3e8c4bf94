# SPDX-License-Identifier: Apache-2.0
"""The messages that carry token IDs, checked, and the true prefix they give; `SpliceError`, every refusal.

A carrier is a message with `prompt_token_ids` / `generation_token_ids` (NeMo Gym's training model server puts
them, with `generation_log_probs`, on the assistant message of each model call). `find_true_prefix(messages)`
checks every carrier, each refusal naming the message: assistant role, both ID lists present and lists, a
non-empty prompt, as many log-probs as generated tokens, no assistant message directly after the last carrier
(one message per generation), and every earlier carrier's generation found in the last carrier's prompt at its
own prompt's length (which also gives rule 4, `history_guard`, the place of each generation). It returns the
`TruePrefix`: the last carrier's `prompt_token_ids + generation_token_ids`, the model's own tokens for the
history through that message. `has_token_ids(messages)` is the fast test for ordinary requests.

Pure: no vLLM, Ray or HTTP import.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from recipe.nemo_gym.errors import RefusedError
from recipe.nemo_gym.token_fields import GENERATION_IDS_KEY, GENERATION_LOGPROBS_KEY, PROMPT_IDS_KEY


class SpliceError(RefusedError):
    """The request cannot be spliced token-exactly; the message names the rule that failed.

    A ValueError so vLLM answers it as a 400 Bad Request with this message. The wording deliberately avoids
    "context length" and "max_tokens": NeMo Gym's model server reads a 400 containing either as a
    length-limited turn and would silently end the episode instead of failing it. Every message starts with
    `PREFIX`, which the manager's runtime recognises in an agent's error body (a CONTIGUITY_BROKEN failure).
    """

    PREFIX = "token-exact splice refused: "

    def __init__(self, message: str):
        super().__init__(self.PREFIX + message)


@dataclass(frozen=True)
class Generation:
    """Where one model call's generated tokens sit in the true prefix: `token_ids[start:stop]`."""

    message_index: int
    start: int  # len(prompt_token_ids) of that call
    stop: int  # start + len(generation_token_ids)


@dataclass(frozen=True)
class TruePrefix:
    """The model's own tokens for the history up to and including one assistant message.

    `generations` lists, in order, every message of the history that carries token IDs, with where its
    generation sits in `token_ids` (the last one is this message's own); every other token of the true prefix
    was written by the chat template.
    """

    message_index: int
    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generations: tuple[Generation, ...] = ()

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.generation_token_ids


def _as_token_ids(value: Any, message_index: int, key: str) -> list[int]:
    """Token IDs as ints. NeMo Gym sends ints; its raw chat path can carry decimal strings ("151667")."""
    if not isinstance(value, list | tuple):
        raise SpliceError(f"messages[{message_index}].{key} must be a list of token IDs, got {type(value).__name__}")
    if all(type(tok) is int and tok >= 0 for tok in value):
        return list(value)
    out: list[int] = []
    for pos, tok in enumerate(value):
        if type(tok) is int:
            out.append(tok)
        elif isinstance(tok, str) and tok.isdigit():
            out.append(int(tok))
        else:
            raise SpliceError(f"messages[{message_index}].{key}[{pos}] is not a token ID: {tok!r}")
        if out[-1] < 0:
            raise SpliceError(f"messages[{message_index}].{key}[{pos}] is negative: {tok!r}")
    return out


def _carries_ids(message: Any) -> bool:
    return isinstance(message, Mapping) and (
        message.get(PROMPT_IDS_KEY) is not None or message.get(GENERATION_IDS_KEY) is not None
    )


def has_token_ids(messages: Sequence[Any]) -> bool:
    """Whether any message carries token IDs (the fast path for ordinary requests is `False`)."""
    return any(_carries_ids(m) for m in messages)


def _check_carrier(message: Mapping[str, Any], index: int) -> None:
    """Refuse a malformed carrier: wrong role, one ID list missing, not lists, no prompt, log-probs that do not
    match the generation one for one."""
    role = message.get("role")
    if role != "assistant":
        raise SpliceError(f"messages[{index}] carries token IDs but has role {role!r}; only assistant turns may")
    for key in (PROMPT_IDS_KEY, GENERATION_IDS_KEY):
        if message.get(key) is None:
            raise SpliceError(f"messages[{index}] carries token IDs but has no {key!r}")
        if not isinstance(message[key], list | tuple):
            raise SpliceError(f"messages[{index}].{key} must be a list of token IDs, got {type(message[key]).__name__}")
    if not message[PROMPT_IDS_KEY]:
        raise SpliceError(
            f"messages[{index}].{PROMPT_IDS_KEY} is empty: every model call has a prompt, so these IDs were not "
            f"returned by the model server"
        )
    log_probs = message.get(GENERATION_LOGPROBS_KEY)
    if log_probs is not None and (
        not isinstance(log_probs, list | tuple) or len(log_probs) != len(message[GENERATION_IDS_KEY])
    ):
        count = len(log_probs) if isinstance(log_probs, list | tuple) else type(log_probs).__name__
        raise SpliceError(
            f"messages[{index}] carries {len(message[GENERATION_IDS_KEY])} {GENERATION_IDS_KEY} but {count} "
            f"{GENERATION_LOGPROBS_KEY}; each generated token has one log-prob"
        )


def find_true_prefix(messages: Sequence[Any]) -> TruePrefix | None:
    """The true prefix from the last message carrying token IDs, or None when no message carries them.

    Refuses (SpliceError, naming the message) a carrier that is not an assistant message, lacks one of the two
    ID lists, holds something other than token IDs, has an empty prompt or a log-prob count unlike its
    generation's, or is directly followed by another assistant message: the model produced one message per
    call, so a following assistant message means one generation was split into several (e.g. parallel tool
    calls spread over messages), which no splice can make exact. Every earlier carrier's generation must sit
    in the last carrier's prompt at its own prompt's length (each call's prompt begins with the previous
    call's prompt and generation); otherwise the carriers are mismatched and the request is refused.
    """
    carriers = [i for i, m in enumerate(messages) if _carries_ids(m)]
    if not carriers:
        return None
    for i in carriers:
        _check_carrier(messages[i], i)
    index = carriers[-1]
    message = messages[index]
    nxt = messages[index + 1] if index + 1 < len(messages) else None
    if isinstance(nxt, Mapping) and nxt.get("role") == "assistant":
        raise SpliceError(
            f"rule 'one message per generation' failed: messages[{index + 1}] is an assistant message directly "
            f"after messages[{index}], which carries the token IDs of one generation; the history was edited "
            f"(a generation split into several messages)"
        )
    prompt = _as_token_ids(message[PROMPT_IDS_KEY], index, PROMPT_IDS_KEY)
    generation = _as_token_ids(message[GENERATION_IDS_KEY], index, GENERATION_IDS_KEY)
    generations = []
    floor = 0
    for j in carriers[:-1]:
        # Only the generation is compared (it is short); the earlier prompt is a prefix of this one by
        # construction, and any difference in it shows up in the template text the guard compares.
        earlier = messages[j][GENERATION_IDS_KEY]
        start = len(messages[j][PROMPT_IDS_KEY])
        stop = start + len(earlier)
        placed = prompt[start:stop]
        if (
            start < floor
            or stop > len(prompt)
            or (placed != list(earlier) and placed != _as_token_ids(earlier, j, GENERATION_IDS_KEY))
        ):
            raise SpliceError(
                f"messages[{j}] and messages[{index}] carry mismatched token IDs: the generation of "
                f"messages[{j}] is not at position {start} (its prompt's length) of the prompt of "
                f"messages[{index}], so they are not turns of one conversation"
            )
        generations.append(Generation(j, start, stop))
        floor = stop
    generations.append(Generation(index, len(prompt), len(prompt) + len(generation)))
    return TruePrefix(index, prompt, generation, tuple(generations))
