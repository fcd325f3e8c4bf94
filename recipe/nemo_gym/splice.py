"""Token-exact multi-turn prompts: splice the model's own token IDs into a re-rendered chat history.

Contract. Each turn an agent sends the whole chat history as messages, and the server re-renders it with the
chat template and re-tokenizes it. That does not reproduce the tokens the model generated (BPE merges differ,
templates drop `<think>` blocks from earlier turns, tool calls are re-serialised). NeMo Gym's training model
server sends back, on the assistant message of each model call, that call's `prompt_token_ids`,
`generation_token_ids` and `generation_log_probs`. This module turns those into the prompt to feed the engine:

    the true prefix (prompt_token_ids + generation_token_ids of the last message carrying them),
    without its trailing EOS, followed by the full render from its N-th EOS onward,

where N is the number of EOS tokens in the *prefix render*: the history up to and including that assistant
message, rendered with no generation prompt. Counting EOS tokens, not comparing positions, is what survives
templates that render earlier turns differently from the turn itself (Qwen3 strips reasoning from history).
Only N is read from the prefix render, so it need not be tokenized: `count_eos_in_text` counts the EOS
token's text in it, guarded by the full render's own text and IDs, and `splice_with_eos_count` takes N.

Rules (each refusal is a `SpliceError` naming the rule and showing the counts):

1. The prefix render must contain at least one EOS (N >= 1); otherwise the EOS token is not the template's
   turn terminator and counting is meaningless.
2. Guard: the true prefix without its trailing EOS must contain exactly N - 1 EOS tokens. When the generation
   ended on EOS this is the brief's "EOS count of the true prefix equals N". A history that was edited after
   the model saw it (truncated, summarised, one generated message split into several) changes N and is
   refused, never silently spliced.
3. The full render must contain at least N EOS tokens.

Generations that did not end on EOS are defined, not refused:
- cut at the length limit, or ended on another stop token (e.g. `<|endoftext|>`), or empty: all the model's
  tokens are kept as they are, and the template's EOS (the first token of the tail) closes the turn. The next
  prompt therefore still begins with exactly `prompt_token_ids + generation_token_ids`.

Worked example (Qwen3, EOS `<|im_end|>`; token lists written as text for readability).
Turn 1 prompt P1 = `<|im_start|>user\\nq<|im_end|>\\n<|im_start|>assistant\\n`, generated
G1 = `<think>\\nr\\n</think>\\n\\na<|im_end|>`. The true prefix T = P1 + G1 holds 2 EOS. Turn 2 sends
[user q, assistant "<think>r</think>a" (carrying P1, G1), user "ok"]:

- full render F = `<|im_start|>user\\nq<|im_end|>\\n<|im_start|>assistant\\na<|im_end|>\\n`
  `<|im_start|>user\\nok<|im_end|>\\n<|im_start|>assistant\\n`  (reasoning stripped from history)
- prefix render = `<|im_start|>user\\nq<|im_end|>\\n<|im_start|>assistant\\n<think>\\nr\\n</think>\\n\\na<|im_end|>\\n`
  (reasoning kept: it is the last turn there), so N = 2. The text is enough: F's text holds 3 `<|im_end|>`
  and F's IDs 3 EOS, so each `<|im_end|>` in the text is one EOS ID and the prefix render's text gives N.
- Guard: T without its trailing EOS holds 1 EOS = N - 1. The 2nd EOS of F is the one after `a`.
- Output = P1 + `<think>\\nr\\n</think>\\n\\na` (the model's tokens minus their EOS), then F from that EOS:
  `<|im_end|>\\n<|im_start|>user\\nok<|im_end|>\\n<|im_start|>assistant\\n`.

Cutting F at the prefix render's *length* instead would land inside "ok" or past it (the prefix render is
longer than F's first two turns), dropping the short user turn; counting lands on the right EOS.

Everything here is pure: no vLLM, Ray or HTTP import. `recipe.nemo_gym.server_patch` is the glue in vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PROMPT_IDS_KEY = "prompt_token_ids"
GENERATION_IDS_KEY = "generation_token_ids"
GENERATION_LOGPROBS_KEY = "generation_log_probs"
TOKEN_ID_KEYS = (PROMPT_IDS_KEY, GENERATION_IDS_KEY, GENERATION_LOGPROBS_KEY)


class SpliceError(ValueError):
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
class TruePrefix:
    """The model's own tokens for the history up to and including one assistant message."""

    message_index: int
    prompt_token_ids: list[int]
    generation_token_ids: list[int]

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


def find_true_prefix(messages: Sequence[Any]) -> TruePrefix | None:
    """The true prefix from the last message carrying token IDs, or None when no message carries them.

    Refuses (SpliceError) a carrier that is not an assistant message, lacks one of the two ID lists, holds
    something other than token IDs, or is directly followed by another assistant message: the model produced
    one message per call, so a following assistant message means one generation was split into several
    (e.g. parallel tool calls spread over messages), which no splice can make exact.
    """
    index = next((i for i in range(len(messages) - 1, -1, -1) if _carries_ids(messages[i])), None)
    if index is None:
        return None
    message = messages[index]
    role = message.get("role")
    if role != "assistant":
        raise SpliceError(f"messages[{index}] carries token IDs but has role {role!r}; only assistant turns may")
    for key in (PROMPT_IDS_KEY, GENERATION_IDS_KEY):
        if message.get(key) is None:
            raise SpliceError(f"messages[{index}] carries token IDs but has no {key!r}")
    nxt = messages[index + 1] if index + 1 < len(messages) else None
    if isinstance(nxt, Mapping) and nxt.get("role") == "assistant":
        raise SpliceError(
            f"rule 'one message per generation' failed: messages[{index + 1}] is an assistant message directly "
            f"after messages[{index}], which carries the token IDs of one generation; the history was edited "
            f"(a generation split into several messages)"
        )
    return TruePrefix(
        message_index=index,
        prompt_token_ids=_as_token_ids(message[PROMPT_IDS_KEY], index, PROMPT_IDS_KEY),
        generation_token_ids=_as_token_ids(message[GENERATION_IDS_KEY], index, GENERATION_IDS_KEY),
    )


def _nth_index(ids: Sequence[int], token: int, n: int) -> int:
    """Index of the n-th (1-based) occurrence of `token` in `ids`; -1 if there are fewer."""
    pos = -1
    for _ in range(n):
        try:
            pos = ids.index(token, pos + 1)
        except ValueError:
            return -1
    return pos


def splice_prompt_ids(
    true_prefix: Sequence[int],
    prefix_render: Sequence[int],
    full_render: Sequence[int],
    eos_token_id: int,
) -> list[int]:
    """The prompt IDs to feed the engine: the true prefix, then the full render from its N-th EOS onward.

    `true_prefix` is `prompt_token_ids + generation_token_ids` of the last turn that carries them,
    `prefix_render` the history through that turn rendered with no generation prompt, `full_render` the
    request rendered as usual. See the module docstring for the rules and a worked example.
    """
    return splice_with_eos_count(true_prefix, prefix_render.count(eos_token_id), full_render, eos_token_id)


def splice_with_eos_count(
    true_prefix: Sequence[int],
    prefix_eos_count: int,
    full_render: Sequence[int],
    eos_token_id: int,
) -> list[int]:
    """`splice_prompt_ids` given N, the prefix render's EOS count, instead of the prefix render's IDs.

    N is all the splice reads from the prefix render, so a caller that can count it without tokenizing the
    prefix render (`count_eos_in_text`) need not tokenize it.
    """
    n = prefix_eos_count
    if n <= 0:
        raise SpliceError(
            f"rule 1 (EOS ends each turn) failed: the prefix render contains no EOS token {eos_token_id}, so it "
            f"is not this chat template's turn terminator"
        )
    kept = list(true_prefix)
    ended_on_eos = bool(kept) and kept[-1] == eos_token_id
    if ended_on_eos:
        kept.pop()
    m = kept.count(eos_token_id)
    if m != n - 1:
        total = m + int(ended_on_eos)
        raise SpliceError(
            f"rule 2 (unedited history) failed: the model's own tokens hold {total} EOS token(s) "
            f"({m} before the generation's end, generation {'ended' if ended_on_eos else 'did not end'} on EOS) "
            f"but the history rendered up to that turn holds {n}; the history was edited after the model "
            f"produced it (truncated, summarised, or a turn split or merged)"
        )
    cut = _nth_index(full_render, eos_token_id, n)
    if cut < 0:
        raise SpliceError(
            f"rule 3 (full render extends the prefix) failed: the full render holds "
            f"{full_render.count(eos_token_id)} EOS token(s), fewer than the {n} of the prefix render"
        )
    kept.extend(full_render[cut:])
    return kept


def count_eos_in_text(
    prefix_text: str,
    full_text: str,
    full_render: Sequence[int],
    eos_text: str,
    eos_token_id: int,
) -> int | None:
    """N counted on the prefix render's text, or None where the text cannot be trusted to give it.

    Tokenizing the prefix render only to count its EOS tokens costs as much as tokenizing the request, so the
    count is taken on the text: when the EOS is a special (added) token, every occurrence of its text
    tokenizes to exactly one EOS ID, whatever surrounds it. That is checked on this very request, whose full
    render is at hand as both text and IDs: its text must hold as many `eos_text` as its IDs hold
    `eos_token_id`. Otherwise (the EOS is an ordinary vocabulary token, the tokenizer splits special tokens,
    ...) the answer is None and the caller must tokenize the prefix render and count IDs.
    """
    if not eos_text or full_text.count(eos_text) != full_render.count(eos_token_id):
        return None
    return prefix_text.count(eos_text)
