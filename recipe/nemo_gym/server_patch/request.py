# SPDX-License-Identifier: Apache-2.0
"""One chat request through the patched `preprocess_chat`: render, splice, refuse.

- A request whose messages carry no token IDs is passed to vLLM's method untouched: its output is exactly
  unpatched vLLM's. (Its `ValueError`s are re-raised as vLLM's `VLLMValidationError` by the wrapper.)
- A request whose messages carry them (NeMo Gym's `vllm_model` server with `return_token_id_information`)
  costs one extra chat template render and no extra tokenization: vLLM's own method renders and tokenizes
  the request as sent (the full render); then a copy of the request with the history up to the last
  assistant message carrying IDs and no generation prompt is rendered to text only (the prefix render),
  and its EOS tokens are counted on that text (`splice.eos_splice.count_eos_in_text`, when the EOS is a
  special token and guarded by the full render's text and IDs; otherwise the prefix text is tokenized and
  IDs are counted). The prompt IDs are then replaced with `splice.eos_splice.check_and_splice(...)`, which
  also checks that the history's template text is what the model saw (rule 4: ID comparisons, decoding only
  where the IDs differ); the rules are in `recipe.nemo_gym.splice`.
- The spliced engine input's prompt text (`engine_input["prompt"]`) is the decoded text of the spliced IDs
  where vLLM reads it, i.e. when the request asks for `return_prompt_text` or requests are logged; otherwise
  it is left out (vLLM then treats the prompt as token IDs only, as for a pre-tokenized prompt), because the
  full render's text is not the text of the spliced IDs and decoding them is not free.
- Refused: `continue_final_message` on a history with token IDs (a continued message has no turn end to splice
  after).
- Not covered: harmony (gpt-oss) chat completions, which vLLM renders without `preprocess_chat`; multimodal
  prompts (refused: placeholder offsets would shift).

vLLM is imported inside the functions that need it, never at import.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from recipe.nemo_gym.server_patch.template import eos_token_id, generation_prompt
from recipe.nemo_gym.splice.carriers import SpliceError, find_true_prefix, has_token_ids
from recipe.nemo_gym.splice.eos_splice import check_and_splice, count_eos_in_text


async def splice_chat(
    self: Any, original: Callable[..., Any], signature: inspect.Signature, args: Any, kwargs: Any
) -> Any:
    """vLLM's `preprocess_chat` (`original`, bound to the render object `self`) with the splice applied to its
    prompt IDs where the messages carry token IDs; `args`/`kwargs` are the call's, bound with `signature`."""
    bound = signature.bind(self, *args, **kwargs)
    messages = bound.arguments["messages"]
    if not has_token_ids(messages):
        return await original(self, *args, **kwargs)
    bound.apply_defaults()
    arguments = bound.arguments

    _materialise_tool_calls(messages)
    true_prefix = find_true_prefix(messages)
    assert true_prefix is not None  # has_token_ids was true
    if getattr(arguments["request"], "continue_final_message", False):
        raise SpliceError(
            "continue_final_message is not supported with token IDs in the history (messages"
            f"[{true_prefix.message_index}] carries them): the token-exact splice continues a history after the "
            "last turn the model ended, and a continued message has no end. Send the request without the token "
            "IDs (rendered as unpatched vLLM renders it), or let the continuation be the model's next turn"
        )
    # Copied before the full render: vLLM's tool parser may adjust the request it is given.
    prefix_request = _prefix_request(arguments["request"])

    conversation, engine_inputs = await original(self, *args, **kwargs)
    engine_input = _token_engine_input(engine_inputs)
    eos = eos_token_id(self)
    prefix = await _render_prefix_template(
        self, arguments, prefix_request, list(messages[: true_prefix.message_index + 1])
    )
    tokenizer = self.renderer.tokenizer
    n = prefix_eos_count(tokenizer, prefix, engine_input, eos, getattr(prefix_request, "add_special_tokens", False))
    engine_input["prompt_token_ids"] = check_and_splice(
        true_prefix,
        n,
        engine_input["prompt_token_ids"],
        eos,
        decode=tokenizer.decode,
        generation_prompt=lambda: generation_prompt(self, _chat_params(self, arguments, prefix_request)),
        messages=messages,
    )
    _set_prompt_text(self, arguments["request"], engine_input)
    return conversation, engine_inputs


def _materialise_tool_calls(messages: list[Any]) -> None:
    """Tool calls may be one-shot iterators (in-process callers; HTTP requests already hold lists); both
    renders must see them, so they are turned into lists in place before the first."""
    for message in messages:
        if isinstance(message, dict):
            calls = message.get("tool_calls")
            if calls is not None and not isinstance(calls, list):
                message["tool_calls"] = list(calls)


def _prefix_request(request: Any) -> Any:
    """A shallow copy of the request that renders with no generation prompt and nothing pre-filled.

    Set as fields of the copy, not passed as default template keywords: vLLM merges request fields over
    defaults, so a default `add_generation_prompt=False` would be overridden by the request's own `True`.
    """
    fields = getattr(type(request), "model_fields", {})
    update = {k: False for k in ("add_generation_prompt", "continue_final_message") if k in fields}
    return request.model_copy(update=update)


async def _render_prefix_template(serving: Any, arguments: dict[str, Any], request: Any, messages: list[Any]) -> Any:
    """The prefix render as vLLM's renderer produces it before tokenizing: `{"prompt": text}` for HF templates,
    `{"prompt_token_ids": ids}` for renderers that tokenize while rendering (Mistral, prompt embeds).

    The one place that reaches below `preprocess_chat`. vLLM has no public call that applies a chat template without
    tokenizing the result, and tokenizing the prefix render (most of the request) only to count its EOS tokens would
    tokenize most of the request a second time (its cost: benchmarks/README.md). So this does what `preprocess_chat`
    does before its `renderer.render_chat_async` call (merge the template defaults, build `ChatParams` from the
    request) and then calls the first step of that call, `renderer.render_messages_async` (parse the messages, apply
    the template once). Checked against vLLM 0.24.0 (`OpenAIServingRender.preprocess_chat`); vLLM 0.25+'s
    `OnlineRenderer.preprocess_chat` builds its `ChatParams` the same way and holds the same `renderer` and
    `model_config` attributes, and `install()` refuses a vLLM whose renderer lacks `render_messages_async`.
    """
    chat_params = _chat_params(serving, arguments, request)
    _, prompt = await serving.renderer.render_messages_async(messages, chat_params)
    return prompt


def _chat_params(serving: Any, arguments: dict[str, Any], request: Any) -> Any:
    """The `ChatParams` vLLM's `preprocess_chat` builds for this request (see `_render_prefix_template`)."""
    from vllm.renderers import merge_kwargs
    from vllm.utils.mistral import is_mistral_tokenizer

    renderer, model_config = serving.renderer, serving.model_config
    mm_config = model_config.multimodal_config
    template_kwargs = merge_kwargs(
        arguments["default_template_kwargs"],
        dict(
            tools=arguments["tool_dicts"],
            tokenize=is_mistral_tokenizer(renderer.tokenizer) or model_config.enable_prompt_embeds,
        ),
    )
    return request.build_chat_params(
        arguments["default_template"], arguments["default_template_content_format"]
    ).with_defaults(
        template_kwargs,
        default_media_io_kwargs=mm_config.media_io_kwargs if mm_config else None,
        default_mm_processor_kwargs=getattr(request, "mm_processor_kwargs", None),
    )


def prefix_eos_count(tokenizer: Any, prefix: Any, engine_input: Any, eos: int, add_special_tokens: bool) -> int:
    """N, the number of EOS tokens in the prefix render, counted without tokenizing it where that is safe."""
    if "prompt_token_ids" in prefix:  # the renderer tokenized while rendering
        return list(prefix["prompt_token_ids"]).count(eos)
    text = prefix["prompt"]
    full_text = engine_input.get("prompt")
    # Only a special (added) token is matched as a whole wherever its text appears; an ordinary vocabulary
    # token's text can also sit inside other tokens ("." in ".py"), so its count is always taken on IDs.
    if isinstance(full_text, str) and eos in getattr(tokenizer, "all_special_ids", ()):
        n = count_eos_in_text(text, full_text, engine_input["prompt_token_ids"], tokenizer.decode([eos]), eos)
        if n is not None:
            return n
    # The text cannot be trusted to give the count (or the full render came without text): tokenize the prefix
    # render as vLLM tokenizes a chat prompt, without truncation, and count IDs. Correct, only slower.
    return tokenizer.encode(text, add_special_tokens=add_special_tokens).count(eos)


def _token_engine_input(engine_inputs: list[Any]) -> Any:
    if len(engine_inputs) != 1:
        raise SpliceError(f"expected one rendered prompt, got {len(engine_inputs)}")
    engine_input = engine_inputs[0]
    if engine_input.get("type", "token") != "token" or "prompt_token_ids" not in engine_input:
        raise SpliceError(f"token-exact splice supports text prompts only, got a {engine_input.get('type')!r} prompt")
    return engine_input


def _set_prompt_text(serving: Any, request: Any, engine_input: Any) -> None:
    """Make `engine_input["prompt"]` the text of the spliced IDs where vLLM reads it, else leave it out.

    vLLM 0.24 reads the prompt text of a chat request only to log it (`--enable-log-requests`) and to return
    it (`return_prompt_text`, and `RequestOutput.prompt`, which chat completions use for nothing else). The
    full render's text vLLM put there is not the text of the spliced IDs, and decoding them is not free (its
    cost: benchmarks/README.md), so the text is decoded only when one of those will read it.
    """
    if "prompt" not in engine_input:
        return
    if getattr(request, "return_prompt_text", False) or getattr(serving, "request_logger", None) is not None:
        engine_input["prompt"] = serving.renderer.tokenizer.decode(engine_input["prompt_token_ids"])
    else:
        del engine_input["prompt"]
