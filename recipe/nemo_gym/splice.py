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
`check_and_splice` applies rules 1 to 4 and is what the server calls. "EOS" is the chat template's turn
terminator, which the server reads from the template (`turn_terminator` on probe renders), not necessarily
the tokenizer's `eos_token`.

Rules (each refusal is a `SpliceError` naming the rule and showing the counts or texts):

1. The prefix render must contain at least one EOS (N >= 1); otherwise the EOS token is not the template's
   turn terminator and counting is meaningless.
2. Guard: the true prefix without its trailing EOS must contain exactly N - 1 EOS tokens. When the generation
   ended on EOS this is the brief's "EOS count of the true prefix equals N". A history that was edited after
   the model saw it (truncated, summarised, one generated message split into several) changes N and is
   refused, never silently spliced.
3. The full render must contain at least N EOS tokens.
4. Unedited history (`check_unedited_history`): every token of the true prefix that the model did not generate
   was written by the chat template, and must reappear in the full render at the same place, counted in EOS
   tokens from the start. Rule 2 only sees edits that change the EOS count; rule 4 sees any edit of what the
   model saw before a model turn: a system prompt changed, an earlier user message redacted, tools added or
   removed, a system message that the template hoists to the head (DeepSeek R1/V3, MiniMax-M1) added after a
   model turn. The refusal names the first edited message where its text tells (else the stretch of messages)
   and shows both texts at the first difference.
   Cost: no tokenization. Each stretch of template text (one per carrier) is compared as IDs with the full
   render's IDs after the same number of EOS tokens: list slices, about a microsecond per 1,000 tokens. Only a
   stretch whose IDs differ is decoded, with the matching piece of the full render, and compared as text,
   where one difference is allowed: the end of a generation prompt the history does not write before an
   assistant message (`GenerationPrompt.unshared`: Qwen3 with thinking off, `<think>\n\n</think>\n\n`;
   DeepSeek-V4 thinking, `<think>`), read from probe renders once per template and arguments. So a model turn
   generated under other template arguments than the request's (thinking switched on or off mid-episode) is
   refused when its generation prompt is one the history does not write.

Carriers are checked first (`find_true_prefix`, each refusal naming the message): assistant role, both ID
lists present and lists, a non-empty prompt, as many log-probs as generated tokens, and every earlier
carrier's generation found in the last carrier's prompt at its own prompt's length (which also gives rule 4
the place of each generation).

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

Rule 4 on the same example, with the first user message changed from "q" to "q2" before turn 2 (the EOS
count is unchanged, so rules 1 to 3 pass). The template text of T is P1 (T's only generation starts at
len(P1)), anchored at the start (no EOS before it). F begins `<|im_start|>user\nq2<|im_end|>`, P1
`<|im_start|>user\nq<|im_end|>`: the IDs differ, so both are decoded; the texts first differ after "q", before
the generation prompt, so the request is refused: "rule 4 (unedited history) failed: the history before
messages[1] renders differently from what the model saw ...; first edited message: messages[0] (role 'user')".
Unedited, the IDs of `P1` equal F's first len(P1) IDs and nothing is decoded.

Everything here is pure: no vLLM, Ray or HTTP import. `recipe.nemo_gym.server_patch` is the glue in vLLM.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping, Sequence
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


# -- rule 4: the template text of the history is what the model saw -------------------------------------------


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


def _message_text(message: Any) -> str:
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
            raise SpliceError(
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
                raise SpliceError(
                    _edit_message(messages, previous_index, gen.message_index, start == 0, model_text, now_text, same)
                )
        stop = gen.stop if gen.stop > gen.start and tokens[gen.stop - 1] == eos else gen.stop + 1
        seen += span.count(eos) + tokens[gen.start : stop].count(eos)
        start, previous_index = stop, gen.message_index


def _edit_message(
    messages: Sequence[Any], previous: int, carrier: int, at_head: bool, model_text: str, now_text: str, same: int
) -> str:
    """The refusal of rule 4: the first edited message and both texts around the first difference."""
    candidates = list(range(previous + 1, carrier))
    if at_head:  # a template that hoists system messages renders later ones at the head
        candidates += [i for i in range(carrier + 1, len(messages)) if _role(messages[i]) == "system"]
    edited = next((i for i in candidates if _message_text(messages[i]) not in model_text), None)
    if edited is None:
        offset = 0
        for i in candidates:
            text = _message_text(messages[i])
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
    return (
        f"rule 4 (unedited history) failed: the history before messages[{carrier}] renders differently from what "
        f"the model saw when it generated messages[{carrier}]; {where}. The model saw {model_text[lo : same + 40]!r}, "
        f"the history now renders {now_text[lo : same + 40]!r}"
    )


def check_and_splice(
    true_prefix: TruePrefix,
    prefix_eos_count: int,
    full_render: Sequence[int],
    eos_token_id: int,
    decode: Callable[[Sequence[int]], str],
    generation_prompt: Callable[[], GenerationPrompt],
    messages: Sequence[Any] = (),
) -> list[int]:
    """Rules 1 to 3 (`splice_with_eos_count`), then rule 4 (`check_unedited_history`); the spliced prompt IDs."""
    spliced = splice_with_eos_count(true_prefix.token_ids, prefix_eos_count, full_render, eos_token_id)
    check_unedited_history(true_prefix, full_render, eos_token_id, decode, generation_prompt, messages)
    return spliced


# -- the turn terminator and generation prompt, read from the chat template ------------------------------------

PROBE_USER = "Probe question, please answer."
PROBE_ASSISTANT = "Probe answer, as asked."


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


def text_after_assistant(renders: ProbeRenders) -> str | None:
    """The text the template writes after an assistant message's content (None: the content is not there)."""
    at = renders.exchange.rfind(PROBE_ASSISTANT)
    return None if at < 0 else renders.exchange[at + len(PROBE_ASSISTANT) :]


def turn_terminator(after_assistant_ids: Sequence[int], special_ids: Collection[int]) -> int | None:
    """The template's turn terminator: the first special token it writes after an assistant message's content
    (the token the model must generate to end its turn), or None when it writes none."""
    return next((t for t in after_assistant_ids if t in special_ids), None)
