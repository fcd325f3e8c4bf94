# SPDX-License-Identifier: Apache-2.0
"""Rules 1 to 3: splice the true prefix into the full render by counting EOS tokens; `check_and_splice` adds rule 4.

The prompt fed to the engine is

    the true prefix (prompt_token_ids + generation_token_ids of the last message carrying them),
    without its trailing EOS, followed by the full render from its N-th EOS onward,

where N is the number of EOS tokens in the *prefix render*: the history up to and including that assistant
message, rendered with no generation prompt. Counting EOS tokens, not comparing positions, is what survives
templates that render earlier turns differently from the turn itself (Qwen3 strips reasoning from history).
Only N is read from the prefix render, so it need not be tokenized: `count_eos_in_text` counts the EOS
token's text in it, guarded by the full render's own text and IDs, and `splice_with_eos_count` takes N.
`check_and_splice` applies rules 1 to 4 and is what the server calls. "EOS" is the chat template's turn
terminator, which the server reads from the template (`template_probe.turn_terminator` on probe renders), not
necessarily the tokenizer's `eos_token`.

Rules (each refusal is a `SpliceError` naming the rule and showing the counts):

1. The prefix render must contain at least one EOS (N >= 1); otherwise the EOS token is not the template's
   turn terminator and counting is meaningless.
2. Guard: the true prefix without its trailing EOS must contain exactly N - 1 EOS tokens. When the generation
   ended on EOS, the true prefix's EOS count is then N. A history that was edited after
   the model saw it (truncated, summarised, a turn inserted, one generated message split into several) changes N
   and is refused, never silently spliced; so is a history that quotes the EOS token's text (the template renders
   it as the token). The refusal says which (`explain_turn_count`) and names the first message that renders
   differently where rule 4's comparison finds one.
3. The full render must contain at least N EOS tokens.
4. Unedited history: every template token of the true prefix reappears in the full render (`history_guard`).

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

Pure: no vLLM, Ray or HTTP import.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from recipe.nemo_gym.splice.carriers import SpliceError, TruePrefix
from recipe.nemo_gym.splice.history_guard import EditedHistory, check_unedited_history, message_text
from recipe.nemo_gym.splice.template_probe import GenerationPrompt


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
        raise TurnCountMismatch(m, ended_on_eos, n)
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


class TurnCountMismatch(SpliceError):
    """Rule 2: the model's own tokens hold `m` EOS before the generation's end (and the generation ended on EOS or
    not), the history rendered up to that turn `n`. The message states the counts; `check_and_splice` adds why."""

    def __init__(self, m: int, ended_on_eos: bool, n: int, why: str = ""):
        self.m, self.ended_on_eos, self.n = m, ended_on_eos, n
        total = m + int(ended_on_eos)
        super().__init__(
            f"rule 2 (unedited history) failed: the model's own tokens hold {total} EOS token(s) "
            f"({m} before the generation's end, generation {'ended' if ended_on_eos else 'did not end'} on EOS) "
            f"but the history rendered up to that turn holds {n}" + (f"; {why}" if why else "")
        )


def explain_turn_count(
    mismatch: TurnCountMismatch,
    true_prefix: TruePrefix,
    full_render: Sequence[int],
    eos_token_id: int,
    decode: Callable[[Sequence[int]], str],
    generation_prompt: Callable[[], GenerationPrompt],
    messages: Sequence[Any],
) -> TurnCountMismatch:
    """Rule 2's refusal with its cause where the history tells it (pure; decodes only now, on a refused request):

    - a message up to the carrier holds the end-of-turn token's text, which the template renders as the token
      (the model wrote it as ordinary tokens, or a user or tool message quotes it): nothing was edited, but the
      history renders more turn ends than the model produced;
    - otherwise turns were removed or merged (fewer turn ends than the model produced) or inserted or split
      (more), and rule 4's comparison names the first message that renders differently, where it finds one.
    """
    more = mismatch.n > mismatch.m + 1  # the history renders more turn ends than the model's tokens hold
    eos_text = decode([eos_token_id])
    upto = messages[: true_prefix.message_index + 1]
    quoting = next((i for i, message in enumerate(upto) if eos_text and eos_text in message_text(message)), None)
    if more and quoting is not None:
        role = messages[quoting].get("role")
        why = (
            f"messages[{quoting}] (role {role!r}) holds the text of the end-of-turn token {eos_text!r}, which the "
            "chat template renders as that token, so the history renders more turn ends than the model's tokens "
            "hold. Nothing was edited, but this history cannot be rendered as the model saw it. If the model wrote "
            f"it, stop generation on {eos_text!r} (a stop string)"
        )
        return TurnCountMismatch(mismatch.m, mismatch.ended_on_eos, mismatch.n, why)
    why = (
        "the history holds more turns than the model saw: a turn was inserted, or one generation split across messages"
        if more
        else "the history holds fewer turns than the model saw: turns were removed or merged after it produced "
        "them (truncated, summarised)"
    )
    try:
        check_unedited_history(true_prefix, full_render, eos_token_id, decode, generation_prompt, messages)
    except EditedHistory as e:
        if e.edited is not None:
            index, role = e.edited
            why += f"; first message that renders differently: messages[{index}] (role {role!r})"
    return TurnCountMismatch(mismatch.m, mismatch.ended_on_eos, mismatch.n, why)


def check_and_splice(
    true_prefix: TruePrefix,
    prefix_eos_count: int,
    full_render: Sequence[int],
    eos_token_id: int,
    decode: Callable[[Sequence[int]], str],
    generation_prompt: Callable[[], GenerationPrompt],
    messages: Sequence[Any] = (),
) -> list[int]:
    """Rules 1 to 3 (`splice_with_eos_count`), then rule 4 (`check_unedited_history`); the spliced prompt IDs.
    A rule 2 refusal says why the counts differ (`explain_turn_count`)."""
    try:
        spliced = splice_with_eos_count(true_prefix.token_ids, prefix_eos_count, full_render, eos_token_id)
    except TurnCountMismatch as mismatch:
        raise explain_turn_count(
            mismatch, true_prefix, full_render, eos_token_id, decode, generation_prompt, messages
        ) from None
    check_unedited_history(true_prefix, full_render, eos_token_id, decode, generation_prompt, messages)
    return spliced
