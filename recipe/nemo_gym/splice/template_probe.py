# SPDX-License-Identifier: Apache-2.0
"""What a chat template writes, read from renders of a fixed probe conversation.

The server renders the probe conversation (`PROBE_USER`, `PROBE_ASSISTANT`) four ways (`ProbeRenders`) with
the served template; these pure functions read from those texts:

- `text_after_assistant` and `turn_terminator`: the template's turn terminator, the first special token it
  writes after an assistant message's content. That is the EOS the splice counts (`eos_splice`), not
  necessarily the tokenizer's `eos_token`.
- `round_trip`: what the served tokenizer makes of the probe answer, encoded then decoded; a tokenizer that does
  not give the text back produces other tokens than the model's, for every request.
- `read_generation_prompt`: the `GenerationPrompt`, what the template writes after a user message when a
  generation follows, and the part of it a history message does not share (`unshared`), which rule 4
  (`history_guard`) allows to differ.

Pure: no vLLM, Ray or HTTP import; `recipe.nemo_gym.server_patch.template` renders the probes with vLLM.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

PROBE_USER = "Probe question, please answer."
PROBE_ASSISTANT = "Probe answer, as asked."


@dataclass(frozen=True)
class GenerationPrompt:
    """What the chat template writes after a user message when a generation follows (`text`: the user turn's
    close and the generation prompt), and the start of it that it also writes when an assistant message of the
    history follows (`header`). The rest, `unshared`, is what only a generation prompt holds. Qwen3 (thinking):
    both `<|im_end|>\n<|im_start|>assistant\n`, nothing unshared; Qwen3 with thinking off: unshared
    `<think>\n\n</think>\n\n`; DeepSeek-V4 thinking: text `<｜Assistant｜><think>`, history
    `<｜Assistant｜></think>...`. Found by `read_generation_prompt`."""

    text: str
    header: str

    @property
    def unshared(self) -> str:
        return self.text[len(self.header) :]


@dataclass(frozen=True)
class ProbeRenders:
    """The probe conversation rendered four ways, all but `user_prompted` without the generation prompt:
    [user], [user] with it, [user, assistant] and [user, assistant, user] (`PROBE_USER`, `PROBE_ASSISTANT`)."""

    user: str
    user_prompted: str
    exchange: str
    exchange_continued: str


def read_generation_prompt(renders: ProbeRenders) -> GenerationPrompt:
    """The text after the probe's user message when a generation follows, and its start shared with the text
    after it when an assistant message of the history follows (empty where the probe text is not found).

    Read after the user message, not as the difference of renders with and without the generation prompt:
    some templates ignore `add_generation_prompt` (vLLM's DeepSeek-V4 encoder always ends a user turn with
    it). The history side is read where the assistant message is followed by a user message, as every carrier
    is in a request: templates write the last assistant turn differently (Qwen3 adds an empty `<think>` block).
    """
    prompted = renders.user_prompted.find(PROBE_USER)
    continued = renders.exchange_continued.find(PROBE_USER)
    if prompted < 0:
        return GenerationPrompt("", "")
    text = renders.user_prompted[prompted + len(PROBE_USER) :]
    if continued < 0:
        return GenerationPrompt(text, "")
    history = renders.exchange_continued[continued + len(PROBE_USER) :]
    return GenerationPrompt(text, os.path.commonprefix([text, history]))


def round_trip(encode: Callable[[str], list[int]], decode: Callable[[list[int]], str]) -> str | None:
    """What `decode(encode(PROBE_ASSISTANT))` gives back when it is not `PROBE_ASSISTANT`; None when it is."""
    back = decode(encode(PROBE_ASSISTANT))
    return None if back == PROBE_ASSISTANT else back


def text_after_assistant(renders: ProbeRenders) -> str | None:
    """The text the template writes after an assistant message's content (None: the content is not there)."""
    at = renders.exchange.rfind(PROBE_ASSISTANT)
    return None if at < 0 else renders.exchange[at + len(PROBE_ASSISTANT) :]


def turn_terminator(after_assistant_ids: Sequence[int], special_ids: Collection[int]) -> int | None:
    """The template's turn terminator: the first special token it writes after an assistant message's content
    (the token the model must generate to end its turn), or None when it writes none."""
    return next((t for t in after_assistant_ids if t in special_ids), None)
