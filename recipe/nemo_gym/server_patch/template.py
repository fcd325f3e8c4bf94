# SPDX-License-Identifier: Apache-2.0
"""The served chat template's turn terminator and generation prompt, read by rendering a probe conversation.

- EOS, for the splice, is the chat template's turn terminator, found when vLLM builds the render object
  (`remember_turn_terminator`, called from the wrapped `__init__`, i.e. at server start-up) by rendering a
  probe conversation once: the first special token the template writes after an assistant message's content
  (`template_turn_terminator`). It is compared with the tokenizer's `eos_token_id` and a difference is logged
  (published configs set `eos_token` to a base model's `<|endoftext|>` or to `<unk>`; the template's is the
  token each rendered turn ends with). A template that writes none (GLM 4.x) fails the start-up with
  `TemplateWithoutTerminatorError`, naming the template and the override. The environment variable
  `NEMO_GYM_SPLICE_EOS_TOKEN_ID` (`EOS_OVERRIDE_ENV`), if set, names the ID instead (read per request by
  `eos_token_id`; the start-up probe is then skipped).
- The generation prompt's part that the history does not write (`GenerationPrompt.unshared`) is read from probe
  renders with the request's template and arguments (`generation_prompt`), cached per template and arguments on
  the render object, and only when rule 4 takes its text path.

The probe texts are read by the pure `recipe.nemo_gym.splice.template_probe`; this module renders them with
vLLM's renderer (vLLM is imported inside the functions, never at import).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any

from recipe.nemo_gym.errors import ConfigError
from recipe.nemo_gym.splice.carriers import SpliceError
from recipe.nemo_gym.splice.template_probe import (
    PROBE_ASSISTANT,
    PROBE_USER,
    GenerationPrompt,
    ProbeRenders,
    read_generation_prompt,
    round_trip,
    text_after_assistant,
    turn_terminator,
)

logger = logging.getLogger(__name__)

EOS_OVERRIDE_ENV = "NEMO_GYM_SPLICE_EOS_TOKEN_ID"
_TERMINATOR_ATTR = "_nemo_gym_splice_terminator"
_PROMPTS_ATTR = "_nemo_gym_splice_generation_prompts"


class TokenizerRoundTripError(ConfigError):
    """The served tokenizer does not give text back: decoding its own encoding of a plain sentence changes it, so
    the tokens vLLM (and verl, which loads the same files) produce for the model are not the model's own. Raised at
    server start-up, whatever `EOS_OVERRIDE_ENV` says: no setting of the splice makes such a tokenizer exact."""


# The tokenizers known to fail the round trip on the locked stack, and their fix (README, "Token fidelity").
BYTE_LEVEL_LLAMA_FIX = (
    "DeepSeek V2.5, V3, V3.1, R1 and the R1 distills publish a byte-level tokenizer.json under tokenizer_class "
    "LlamaTokenizerFast, which transformers 5 builds as its SentencePiece-style Llama tokenizer (transformers issue "
    '#45488): set "tokenizer_class": "PreTrainedTokenizerFast" in the model directory\'s tokenizer_config.json '
    "(transformers then reads tokenizer.json as published), for vLLM and verl alike"
)


class TemplateWithoutTerminatorError(ConfigError):
    """The chat template writes no special token after an assistant message: nothing ends a turn, so the splice
    cannot count turns. Raised when vLLM builds its chat renderer (server start-up), not per request."""


def eos_token_id(serving: Any) -> int:
    """The splice's EOS: `NEMO_GYM_SPLICE_EOS_TOKEN_ID` if set, else the chat template's turn terminator."""
    override = os.environ.get(EOS_OVERRIDE_ENV)
    if override:
        try:
            return int(override)
        except ValueError:
            raise SpliceError(f"{EOS_OVERRIDE_ENV}={override!r} is not a token ID") from None
    found = serving.__dict__.get(_TERMINATOR_ATTR)
    if found is None:  # a render object built before `install()`, or whose start-up probe could not render
        try:
            found = template_turn_terminator(serving)
        except TemplateWithoutTerminatorError as exc:
            raise SpliceError(str(exc)) from None
        setattr(serving, _TERMINATOR_ATTR, found)
    return found


def _probe_params(chat_params: Any, prompted: bool) -> Any:
    kwargs = {
        **chat_params.chat_template_kwargs,
        "add_generation_prompt": prompted,
        "continue_final_message": False,
        "tools": None,
    }
    return dataclasses.replace(chat_params, chat_template_kwargs=kwargs)


def _probe_renders(serving: Any, chat_params: Any) -> ProbeRenders:
    """The probe conversation rendered four ways with these chat params (template and its arguments)."""
    renderer, tokenizer = serving.renderer, serving.renderer.tokenizer
    user = {"role": "user", "content": PROBE_USER}
    exchange = [user, {"role": "assistant", "content": PROBE_ASSISTANT}]
    continued = [*exchange, {"role": "user", "content": PROBE_USER}]

    def text(messages: list[Any], prompted: bool) -> str:
        # `render_messages` is the synchronous twin of the renderer step the prefix render uses (vLLM 0.24.0).
        _, prompt = renderer.render_messages(messages, _probe_params(chat_params, prompted))
        return prompt["prompt"] if "prompt" in prompt else tokenizer.decode(prompt["prompt_token_ids"])

    return ProbeRenders(text([user], False), text([user], True), text(exchange, False), text(continued, False))


def _default_chat_params(serving: Any) -> Any:
    from vllm.renderers import ChatParams

    return ChatParams(
        chat_template=getattr(serving, "chat_template", None),
        chat_template_content_format=getattr(serving, "chat_template_content_format", "auto"),
        chat_template_kwargs=dict(getattr(serving, "default_chat_template_kwargs", None) or {}),
    )


def _template_source(serving: Any) -> str:
    if getattr(serving, "chat_template", None):
        return "the chat template given to vLLM (--chat-template)"
    return f"the chat template of the tokenizer in {serving.model_config.tokenizer}"


def template_turn_terminator(serving: Any) -> int:
    """The token that ends an assistant turn in this server's chat template, found by rendering a probe
    conversation once (at server start-up): the first special token the template writes after an assistant
    message's content. Compared with the tokenizer's EOS, which published configs sometimes set to another
    token (a base model's `<|endoftext|>`, `<unk>`); the template's is the one each turn of a rendered history
    ends with, so the splice counts it. Raises `TemplateWithoutTerminatorError` for a template that writes none
    (GLM 4.x: the next turn's role tag follows the content directly)."""
    tokenizer = serving.renderer.tokenizer
    if tokenizer is None:
        raise TemplateWithoutTerminatorError(
            f"the token-exact splice needs the tokenizer (vLLM was started without one); or set {EOS_OVERRIDE_ENV}"
        )
    after = text_after_assistant(_probe_renders(serving, _default_chat_params(serving)))
    if after is None:
        raise TemplateWithoutTerminatorError(
            f"the probe conversation rendered with {_template_source(serving)} does not contain the assistant's "
            f"text, so its turn terminator cannot be found (the template rewrites an assistant message's content); "
            f"set {EOS_OVERRIDE_ENV} to the ID of the token that ends the model's turns"
        )
    ids = tokenizer.encode(after, add_special_tokens=False) if after else []
    special = set(tokenizer.all_special_ids)
    added = getattr(tokenizer, "get_added_vocab", None)
    if callable(added):
        special |= set(added().values())
    found = turn_terminator(ids, special)
    if found is None:
        raise TemplateWithoutTerminatorError(
            f"{_template_source(serving)} writes no special token after an assistant message (it writes "
            f"{after!r} there), so no token ends a turn and the token-exact splice cannot count turns. Serve with a "
            f"chat template that closes each assistant turn (a token it writes right after every assistant "
            f"message); {EOS_OVERRIDE_ENV} can name that token when the template writes it but the probe missed it"
        )
    eos = tokenizer.eos_token_id
    if found != eos:
        logger.warning(
            "token-exact splice: %s ends assistant turns with token %d (%r), not with the tokenizer's EOS %r (%r); "
            "the splice counts the template's",
            _template_source(serving),
            found,
            tokenizer.decode([found]),
            eos,
            tokenizer.decode([eos]) if isinstance(eos, int) else None,
        )
    return found


def generation_prompt(serving: Any, chat_params: Any) -> GenerationPrompt:
    """The generation prompt of these chat params, from probe renders cached per template and arguments."""
    kwargs = {
        k: v
        for k, v in chat_params.chat_template_kwargs.items()
        if k not in ("add_generation_prompt", "continue_final_message", "tools", "documents")
    }
    key = (chat_params.chat_template, json.dumps(kwargs, sort_keys=True, default=str))
    cache = serving.__dict__.setdefault(_PROMPTS_ATTR, {})
    found = cache.get(key)
    if found is None:
        if len(cache) >= 64:
            cache.clear()
        found = cache[key] = read_generation_prompt(_probe_renders(serving, chat_params))
    return found


def check_round_trip(tokenizer: Any, source: str) -> None:
    """Raise `TokenizerRoundTripError` naming the tokenizer, what it did to the probe text and the fix."""
    back = round_trip(lambda text: tokenizer.encode(text, add_special_tokens=False), tokenizer.decode)
    if back is not None:
        raise TokenizerRoundTripError(
            f"the tokenizer in {source} ({type(tokenizer).__name__}) does not give text back: {PROBE_ASSISTANT!r} "
            f"encoded and decoded is {back!r}, so the tokens vLLM and verl produce for this model are not the "
            f"model's own, and no splice setting can make them exact. {BYTE_LEVEL_LLAMA_FIX}"
        )


def check_override_ends_turns(serving: Any, override: int) -> None:
    """Refuse (`TemplateWithoutTerminatorError`) an `EOS_OVERRIDE_ENV` token that the template does not write after
    an assistant message's content: the splice counts the turns the template closes, and such a token closes none
    of the history's model turns (GLM's `<|user|>` opens the next turn instead), so every request would be refused
    as if its history had been edited. A probe that cannot be rendered is left to the requests, as at start-up."""
    tokenizer = serving.renderer.tokenizer
    try:
        after = text_after_assistant(_probe_renders(serving, _default_chat_params(serving)))
    except Exception as exc:  # noqa: BLE001 - e.g. no chat template: chat requests will fail anyway
        logger.warning("token-exact splice: could not render the probe conversation at start-up: %s", exc)
        return
    if after is not None and override in tokenizer.encode(after, add_special_tokens=False):
        return
    raise TemplateWithoutTerminatorError(
        f"{EOS_OVERRIDE_ENV}={override} ({tokenizer.decode([override])!r}) is not written by "
        f"{_template_source(serving)} after an assistant message (it writes {after!r} there), so it ends none of "
        f"the history's model turns and every request would be refused. The splice needs a token that closes "
        f"each assistant turn in the rendered history; a template that writes none (GLM 4.x: the next role tag "
        f"follows the answer) cannot be served token-exactly"
    )


def remember_turn_terminator(serving: Any) -> None:
    """At start-up: find this render object's turn terminator and keep it on the object for `eos_token_id`.

    Raises `TokenizerRoundTripError` for a tokenizer that does not give text back (checked first, override or not),
    and `TemplateWithoutTerminatorError` (failing the server's start-up) for a template that writes none.
    Skipped where `EOS_OVERRIDE_ENV` names the ID or the server has no tokenizer (which can neither splice nor
    render a probe); any other failure to render the probe is logged and left to the chat requests, which
    would fail anyway (e.g. no chat template), rather than failing the start-up.
    """
    tokenizer = serving.renderer.tokenizer
    if tokenizer is None:
        return
    check_round_trip(tokenizer, serving.model_config.tokenizer)
    if os.environ.get(EOS_OVERRIDE_ENV):
        check_override_ends_turns(serving, eos_token_id(serving))
        return
    try:
        terminator = template_turn_terminator(serving)
    except TemplateWithoutTerminatorError:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. no chat template: chat requests will fail anyway, not start-up
        logger.warning("token-exact splice: could not render the probe conversation at start-up: %s", exc)
        return
    setattr(serving, _TERMINATOR_ATTR, terminator)
