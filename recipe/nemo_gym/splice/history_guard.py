# SPDX-License-Identifier: Apache-2.0
"""Rule 4 (unedited history): the template text of the true prefix must reappear in the full render.

`check_unedited_history` checks that every token of the true prefix that the model did not generate was
written by the chat template, and reappears in the full render at the same place, counted in EOS tokens from
the start. Rule 2 (`eos_splice`) only sees edits that change the EOS count; rule 4 sees any edit of what the
model saw before a model turn: a system prompt changed, an earlier user message redacted, tools added or
removed, a system message that the template hoists to the head (DeepSeek R1/V3, MiniMax-M1) added after a
model turn. The refusal (`EditedHistory`, a `SpliceError`) names the first edited message where its text tells
(else the stretch of messages), carries it as `edited`, and shows both texts at the first difference.

Cost: no tokenization. Each stretch of template text (one per carrier) is compared as IDs with the full render's IDs
after the same number of EOS tokens (list slices; their cost: benchmarks/README.md). Only a stretch whose IDs differ
is decoded, with the matching piece of the full render, and compared as text, where one difference is allowed: the
end of a generation prompt the history does not write before an assistant message (`GenerationPrompt.unshared`:
Qwen3 with thinking off, `<think>\n\n</think>\n\n`; DeepSeek-V4 thinking, `<think>`), read from probe renders once
per template and arguments. So a model turn generated under other template arguments than the request's (thinking
switched on or off mid-episode) is refused when its generation prompt is one the history does not write.

Example (the worked example of `eos_splice`), with the first user message changed from "q" to "q2" before turn
2 (the EOS count is unchanged, so rules 1 to 3 pass). The template text of T is P1 (T's only generation starts
at len(P1)), anchored at the start (no EOS before it). F begins `<|im_start|>user\nq2<|im_end|>`, P1
`<|im_start|>user\nq<|im_end|>`: the IDs differ, so both are decoded; the texts first differ after "q", before
the generation prompt, so the request is refused: "rule 4 (unedited history) failed: the history before
messages[1] renders differently from what the model saw ...; first edited message: messages[0] (role 'user')".
Unedited, the IDs of `P1` equal F's first len(P1) IDs and nothing is decoded.

Pure: no vLLM, Ray or HTTP import.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from recipe.nemo_gym.splice.carriers import SpliceError, TruePrefix
from recipe.nemo_gym.splice.template_probe import GenerationPrompt


class EditedHistory(SpliceError):
    """Rule 4's refusal. `edited` is the first edited message as (index, role), None where no message text tells."""

    def __init__(self, message: str, edited: tuple[int, Any] | None = None):
        super().__init__(message)
        self.edited = edited


def _positions(ids: Sequence[int], token: int) -> list[int]:
    out: list[int] = []
    pos = -1
    while True:
        try:
            pos = ids.index(token, pos + 1)
        except ValueError:
            return out
        out.append(pos)


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, Mapping) else None


def message_text(message: Any) -> str:
    """A message's text content (its text parts joined); "" when it has none."""
    content = message.get("content") if isinstance(message, Mapping) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, Mapping))
    return ""


def check_unedited_history(
    true_prefix: TruePrefix,
    full_render: Sequence[int],
    eos_token_id: int,
    decode: Callable[[Sequence[int]], str],
    generation_prompt: Callable[[], GenerationPrompt],
    messages: Sequence[Any] = (),
) -> None:
    """Rule 4: every token of the true prefix that the model did not generate reappears in the full render.

    The true prefix alternates template text (system, user and tool messages, tool definitions, role headers)
    and the model's generations, whose places `true_prefix.generations` gives. Each stretch of template text
    starts at the beginning or right after a turn's EOS, so it is anchored in the full render after as many EOS
    tokens as precede it, and must reappear there: first compared as IDs (list equality, no decoding), and only
    where the IDs differ as text, decoding both sides. The text may differ only in the stretch's last
    characters, where it ends with what only a generation prompt writes (`GenerationPrompt.unshared`, e.g.
    `<think>` opened for the model but not written before a history message). Anything else is an edit
    the model never saw: a changed system prompt, a redacted user message, tools added or removed, a system
    message that a template hoists to the head. Refused, naming the first edited message where one can be found.
    No tokenization: list comparisons, and decoding only on the text path. `generation_prompt` is called only
    on the text path.
    """
    eos = eos_token_id
    tokens = true_prefix.token_ids
    full_eos = _positions(full_render, eos)
    start = seen = 0  # the stretch's start in `tokens`, and the EOS tokens before it
    previous_index = -1
    for gen in true_prefix.generations:
        span = tokens[start : gen.start]
        if seen > len(full_eos):
            raise EditedHistory(
                f"rule 4 (unedited history) failed: the full render holds {len(full_eos)} EOS token(s), fewer than "
                f"the {seen} before messages[{gen.message_index}] in the model's own tokens"
            )
        anchor = full_eos[seen - 1] + 1 if seen else 0
        if full_render[anchor : anchor + len(span)] != span:
            closing = seen + span.count(eos) + 1  # the full render's EOS that closes this assistant turn
            end = full_eos[closing - 1] + 1 if closing <= len(full_eos) else len(full_render)
            model_text, now_text = decode(span), decode(full_render[anchor:end])
            needed = len(model_text)
            unshared = generation_prompt().unshared
            if unshared and model_text.endswith(unshared):
                needed -= len(unshared)
            same = len(os.path.commonprefix([model_text, now_text]))
            if same < needed:
                raise _refusal(messages, previous_index, gen.message_index, start == 0, model_text, now_text, same)
        stop = gen.stop if gen.stop > gen.start and tokens[gen.stop - 1] == eos else gen.stop + 1
        seen += span.count(eos) + tokens[gen.start : stop].count(eos)
        start, previous_index = stop, gen.message_index


def _refusal(
    messages: Sequence[Any], previous: int, carrier: int, at_head: bool, model_text: str, now_text: str, same: int
) -> EditedHistory:
    """The refusal of rule 4: the first edited message and both texts around the first difference."""
    candidates = list(range(previous + 1, carrier))
    if at_head:  # a template that hoists system messages renders later ones at the head
        candidates += [i for i in range(carrier + 1, len(messages)) if _role(messages[i]) == "system"]
    edited = next((i for i in candidates if message_text(messages[i]) not in model_text), None)
    if edited is None:
        offset = 0
        for i in candidates:
            text = message_text(messages[i])
            found = now_text.find(text, offset) if text else -1
            if found >= 0 and found <= same < found + len(text):  # the first difference is inside this text
                edited = i
                break
            offset = max(offset, found + len(text)) if found >= 0 else offset
    where = (
        f"first edited message: messages[{edited}] (role {_role(messages[edited])!r})"
        if edited is not None
        else f"no message text between messages[{previous + 1}] and messages[{carrier}] differs where the texts do, "
        f"so the tools, the chat template arguments or text at a message's edge changed"
    )
    lo = max(0, same - 40)
    return EditedHistory(
        f"rule 4 (unedited history) failed: the history before messages[{carrier}] renders differently from what "
        f"the model saw when it generated messages[{carrier}]; {where}. The model saw {model_text[lo : same + 40]!r}, "
        f"the history now renders {now_text[lo : same + 40]!r}",
        (edited, _role(messages[edited])) if edited is not None else None,
    )
