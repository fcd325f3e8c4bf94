"""The token-exact splice inside vLLM's chat preprocessing, so `/v1/chat/completions` and `/tokenize` agree.

Contract:
- `install()` wraps the `preprocess_chat` method (and `__init__`, see below) of the class the installed vLLM
  renders chats with: `vllm.renderers.online_renderer.OnlineRenderer` (0.25 and later) if present, else
  `vllm.entrypoints.serve.render.serving.OpenAIServingRender` (0.20 to 0.24; checked against 0.24.0, the only
  version this was run on: the 0.25+ path is written but untested). Both chat completions and `/tokenize` go
  through that one method. `install()` is idempotent. On a vLLM that has neither, whose method does not take
  the arguments this wrapper relies on, or whose renderer lacks the template-only step the prefix render uses,
  it raises `UnsupportedVLLMError` naming the version: at start, never at the first request.
- A request whose messages carry no token IDs is passed to vLLM's method untouched: its output is exactly
  unpatched vLLM's. (Its `ValueError`s are re-raised as vLLM's `VLLMValidationError`, see the refusals below.)
- A request whose messages carry them (NeMo Gym's `vllm_model` server with `return_token_id_information`)
  costs one extra chat template render and no extra tokenization: vLLM's own method renders and tokenizes
  the request as sent (the full render); then a copy of the request with the history up to the last
  assistant message carrying IDs and no generation prompt is rendered to text only (the prefix render),
  and its EOS tokens are counted on that text (`recipe.nemo_gym.splice.count_eos_in_text`, when the EOS is a
  special token and guarded by the full render's text and IDs; otherwise the prefix text is tokenized and
  IDs are counted). The prompt IDs are then replaced with `recipe.nemo_gym.splice.check_and_splice(...)`,
  which also checks that the history's template text is what the model saw (rule 4: ID comparisons, decoding
  only where the IDs differ); the rules are in `recipe.nemo_gym.splice`.
- Refusals: a `SpliceError` is raised as a subclass of both `SpliceError` and vLLM's `VLLMValidationError`,
  and vLLM's own `ValueError`s from chat preprocessing (e.g. tool call arguments that are not JSON) as
  `VLLMValidationError`. vLLM answers both with the same 400 body as a plain `ValueError`, but from its own
  handler: a plain `ValueError` reaches the catch-all handler, which Starlette runs in its outermost
  middleware and then re-raises, logging a traceback and making uvicorn close the keep-alive connection
  (other requests sharing it fail). Checked against vLLM 0.24.0.
- The spliced engine input's prompt text (`engine_input["prompt"]`) is the decoded text of the spliced IDs
  where vLLM reads it, i.e. when the request asks for `return_prompt_text` or requests are logged; otherwise
  it is left out (vLLM then treats the prompt as token IDs only, as for a pre-tokenized prompt), because the
  full render's text is not the text of the spliced IDs and decoding them is not free.
- EOS is the chat template's turn terminator, found when vLLM builds the render object (`__init__`, i.e. at
  server start-up) by rendering a probe conversation once: the first special token the template writes after
  an assistant message's content (`template_turn_terminator`). It is compared with the tokenizer's
  `eos_token_id` and a difference is logged (published configs set `eos_token` to a base model's
  `<|endoftext|>` or to `<unk>`; the template's is the token each rendered turn ends with). A template that
  writes none (GLM 4.x) fails the start-up with `TemplateWithoutTerminatorError`, naming the template and the
  override. The environment variable `NEMO_GYM_SPLICE_EOS_TOKEN_ID`, if set, names the ID instead (read per
  request; the start-up probe is then skipped).
- The generation prompt's part that the history does not write (`splice.GenerationPrompt`) is read from probe
  renders with the request's template and arguments, cached per template and arguments, and only when a
  template stretch's IDs differ from the full render's (rule 4's text path).
- Not covered: harmony (gpt-oss) chat completions, which vLLM renders without `preprocess_chat`; multimodal
  prompts (refused: placeholder offsets would shift).

Importing this module has no side effects and does not import vLLM; `install()` does.
`recipe.nemo_gym.vllm_plugin` is the module that installs it inside verl's vLLM server actors.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import inspect
import json
import logging
import os
from collections.abc import Callable
from typing import Any

from recipe.nemo_gym.splice import (
    PROBE_ASSISTANT,
    PROBE_USER,
    GenerationPrompt,
    ProbeRenders,
    SpliceError,
    check_and_splice,
    count_eos_in_text,
    find_true_prefix,
    has_token_ids,
    read_generation_prompt,
    text_after_assistant,
    turn_terminator,
)

logger = logging.getLogger(__name__)

EOS_OVERRIDE_ENV = "NEMO_GYM_SPLICE_EOS_TOKEN_ID"

# (module, class) in the order they are tried; the first one found is patched, and only that one, so a
# version where one delegates to the other can never splice twice.
TARGETS: tuple[tuple[str, str], ...] = (
    ("vllm.renderers.online_renderer", "OnlineRenderer"),  # vLLM >= 0.25
    ("vllm.entrypoints.serve.render.serving", "OpenAIServingRender"),  # vLLM 0.20 - 0.24
)
# The wrapper reads these by name; a method without them is a vLLM this patch was not written for.
REQUIRED_PARAMETERS = (
    "request",
    "messages",
    "default_template",
    "default_template_content_format",
    "default_template_kwargs",
    "tool_dicts",
    "parser",
)
# The prefix render calls this step of vLLM's renderer directly (see `_render_prefix_template`).
RENDERER_MODULE, RENDERER_CLASS, RENDERER_TEMPLATE_STEP = "vllm.renderers", "BaseRenderer", "render_messages_async"
_PATCHED_FLAG = "__nemo_gym_splice_original__"


class UnsupportedVLLMError(RuntimeError):
    """The installed vLLM has no chat preprocessing method this patch knows how to wrap."""


class TemplateWithoutTerminatorError(RuntimeError):
    """The chat template writes no special token after an assistant message: nothing ends a turn, so the splice
    cannot count turns. Raised when vLLM builds its chat renderer (server start-up), not per request."""


def vllm_version() -> str:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def resolve_target(import_module: Callable[[str], Any] = importlib.import_module) -> type:
    """The class whose `preprocess_chat` to wrap, or UnsupportedVLLMError naming the installed version."""
    tried = []
    for module_name, class_name in TARGETS:
        try:
            module = import_module(module_name)
        except ImportError:
            tried.append(f"{module_name}.{class_name} (no module)")
            continue
        cls = getattr(module, class_name, None)
        method = getattr(cls, "preprocess_chat", None) if cls is not None else None
        if method is None:
            tried.append(f"{module_name}.{class_name}.preprocess_chat (missing)")
            continue
        method = getattr(method, _PATCHED_FLAG, method)
        params = inspect.signature(method).parameters
        missing = [p for p in REQUIRED_PARAMETERS if p not in params]
        if missing:
            raise UnsupportedVLLMError(
                f"vLLM {vllm_version()}: {module_name}.{class_name}.preprocess_chat takes {list(params)}, "
                f"without {missing}; the token-exact splice patch supports vLLM 0.20 to 0.24 "
                f"(OpenAIServingRender) and 0.25+ (OnlineRenderer) and was checked against 0.24.0"
            )
        _check_renderer_step(import_module)
        return cls
    raise UnsupportedVLLMError(
        f"vLLM {vllm_version()} is not supported by the token-exact splice patch: none of {tried} exists "
        f"(supported: 0.20 to 0.24 with OpenAIServingRender.preprocess_chat, 0.25+ with "
        f"OnlineRenderer.preprocess_chat; checked against 0.24.0)"
    )


def _check_renderer_step(import_module: Callable[[str], Any]) -> None:
    try:
        base = getattr(import_module(RENDERER_MODULE), RENDERER_CLASS, None)
    except ImportError:
        base = None
    if not callable(getattr(base, RENDERER_TEMPLATE_STEP, None)):
        raise UnsupportedVLLMError(
            f"vLLM {vllm_version()}: {RENDERER_MODULE}.{RENDERER_CLASS}.{RENDERER_TEMPLATE_STEP} is missing; the "
            f"token-exact splice patch renders the history prefix with it (checked against vLLM 0.24.0)"
        )


def is_installed() -> bool:
    """Whether the patch is active in this process (imports vLLM's render module if needed)."""
    try:
        cls = resolve_target()
    except UnsupportedVLLMError:
        return False
    return hasattr(cls.preprocess_chat, _PATCHED_FLAG)


def install() -> None:
    """Wrap vLLM's `preprocess_chat` with the splice. Idempotent; refuses an unsupported vLLM at once."""
    cls = resolve_target()
    original = cls.preprocess_chat
    if hasattr(original, _PATCHED_FLAG):
        return
    cls.preprocess_chat = _make_wrapper(original)
    cls.__init__ = _make_init_wrapper(cls.__init__)


def _eos_token_id(serving: Any) -> int:
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


_TERMINATOR_ATTR = "_nemo_gym_splice_terminator"
_PROMPTS_ATTR = "_nemo_gym_splice_generation_prompts"


def _probe_params(chat_params: Any, generation_prompt: bool) -> Any:
    kwargs = {
        **chat_params.chat_template_kwargs,
        "add_generation_prompt": generation_prompt,
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

    def text(messages: list[Any], generation_prompt: bool) -> str:
        # `render_messages` is the synchronous twin of the renderer step the prefix render uses (vLLM 0.24.0).
        _, prompt = renderer.render_messages(messages, _probe_params(chat_params, generation_prompt))
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
        # Seen with DeepSeek V3/R1 files under transformers 5.10: a byte-level tokenizer loaded as another class
        # decodes without spaces, so the probe's answer text never reappears in the render.
        raise TemplateWithoutTerminatorError(
            f"the probe conversation rendered with {_template_source(serving)} does not contain the assistant's "
            f"text, so its turn terminator cannot be found: the template or the tokenizer does not reproduce text "
            f"(check that the tokenizer round-trips text), or set {EOS_OVERRIDE_ENV}"
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
            f"chat template that closes each assistant turn, or set {EOS_OVERRIDE_ENV} to the ID of the token "
            f"that ends the model's turns"
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


def _generation_prompt(serving: Any, chat_params: Any) -> GenerationPrompt:
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

    The one place that reaches below `preprocess_chat`. vLLM has no public call that applies a chat template
    without tokenizing the result, and tokenizing the prefix render (most of the request) only to count its
    EOS tokens costs about a third of vLLM's own preprocessing time. So this does what `preprocess_chat` does before its
    `renderer.render_chat_async` call (merge the template defaults, build `ChatParams` from the request) and
    then calls the first step of that call, `renderer.render_messages_async` (parse the messages, apply the
    template once). Checked against vLLM 0.24.0 (`OpenAIServingRender.preprocess_chat`); vLLM 0.25+'s
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


def _prefix_eos_count(tokenizer: Any, prefix: Any, engine_input: Any, eos: int, add_special_tokens: bool) -> int:
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
    full render's text vLLM put there is not the text of the spliced IDs, and decoding them is not free (0.9 ms
    of the 6 ms vLLM spends on a 32-turn history in `benchmarks/bench_splice.py`), so the text is decoded only
    when one of those will read it.
    """
    if "prompt" not in engine_input:
        return
    if getattr(request, "return_prompt_text", False) or getattr(serving, "request_logger", None) is not None:
        engine_input["prompt"] = serving.renderer.tokenizer.decode(engine_input["prompt_token_ids"])
    else:
        del engine_input["prompt"]


@functools.cache
def _refusal_type() -> type[SpliceError]:
    """`SpliceError` that is also vLLM's `VLLMValidationError`.

    vLLM 0.24 answers a plain `ValueError` with a 400 from its catch-all `Exception` handler, which Starlette
    runs in its outermost middleware and then re-raises: the log gets a traceback per request and uvicorn closes
    the keep-alive connection, failing other requests that share it. `VLLMValidationError` has a handler of its
    own that answers the same 400 body and keeps the connection (checked against vLLM 0.24.0).
    """
    from vllm.exceptions import VLLMValidationError

    class SpliceRefusal(SpliceError, VLLMValidationError):
        def __init__(self, message: str):
            ValueError.__init__(self, message)
            self.parameter = None
            self.value = None

    return SpliceRefusal


def _as_validation_error(exc: ValueError) -> ValueError:
    """The same refusal as an exception vLLM answers with a 400 that keeps the connection (see `_refusal_type`)."""
    from vllm.exceptions import VLLMValidationError

    if isinstance(exc, VLLMValidationError):
        return exc
    if isinstance(exc, SpliceError):
        return _refusal_type()(str(exc))
    return VLLMValidationError(str(exc))


def _make_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    async def preprocess_chat(self: Any, *args: Any, **kwargs: Any) -> Any:
        # vLLM's own ValueErrors here (e.g. tool call arguments that are not JSON) are bad requests too: all are
        # answered as vLLM's validation error, the same 400 body without dropping the connection.
        try:
            return await _preprocess_chat(self, original, signature, args, kwargs)
        except ValueError as exc:
            refusal = _as_validation_error(exc)
            if refusal is exc:
                raise
            raise refusal from exc

    setattr(preprocess_chat, _PATCHED_FLAG, original)
    return preprocess_chat


async def _preprocess_chat(
    self: Any, original: Callable[..., Any], signature: inspect.Signature, args: Any, kwargs: Any
) -> Any:
    bound = signature.bind(self, *args, **kwargs)
    messages = bound.arguments["messages"]
    if not has_token_ids(messages):
        return await original(self, *args, **kwargs)
    bound.apply_defaults()
    arguments = bound.arguments

    _materialise_tool_calls(messages)
    true_prefix = find_true_prefix(messages)
    assert true_prefix is not None  # has_token_ids was true
    # Copied before the full render: vLLM's tool parser may adjust the request it is given.
    prefix_request = _prefix_request(arguments["request"])

    conversation, engine_inputs = await original(self, *args, **kwargs)
    engine_input = _token_engine_input(engine_inputs)
    eos = _eos_token_id(self)
    prefix = await _render_prefix_template(
        self, arguments, prefix_request, list(messages[: true_prefix.message_index + 1])
    )
    tokenizer = self.renderer.tokenizer
    n = _prefix_eos_count(tokenizer, prefix, engine_input, eos, getattr(prefix_request, "add_special_tokens", False))
    engine_input["prompt_token_ids"] = check_and_splice(
        true_prefix,
        n,
        engine_input["prompt_token_ids"],
        eos,
        decode=tokenizer.decode,
        generation_prompt=lambda: _generation_prompt(self, _chat_params(self, arguments, prefix_request)),
        messages=messages,
    )
    _set_prompt_text(self, arguments["request"], engine_input)
    return conversation, engine_inputs


def _make_init_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    """Find the chat template's turn terminator when vLLM builds its chat renderer, so that a template without
    one fails the server's start-up (`TemplateWithoutTerminatorError`) instead of every spliced request."""

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if os.environ.get(EOS_OVERRIDE_ENV) or self.renderer.tokenizer is None:
            return  # the override names the ID; a server without a tokenizer cannot splice, nor render a probe
        try:
            terminator = template_turn_terminator(self)
        except TemplateWithoutTerminatorError:
            raise
        except Exception as exc:  # noqa: BLE001 - e.g. no chat template: chat requests will fail anyway, not start-up
            logger.warning("token-exact splice: could not render the probe conversation at start-up: %s", exc)
            return
        setattr(self, _TERMINATOR_ATTR, terminator)

    setattr(__init__, _PATCHED_FLAG, original)
    return __init__


def uninstall() -> None:
    """Restore vLLM's own `preprocess_chat` (for comparisons in tests and benchmarks)."""
    cls = resolve_target()
    original = getattr(cls.preprocess_chat, _PATCHED_FLAG, None)
    if original is not None:
        cls.preprocess_chat = original
    original_init = getattr(cls.__init__, _PATCHED_FLAG, None)
    if original_init is not None:
        cls.__init__ = original_init


def build_render_serving(
    model_dir: str,
    *,
    served_model_name: str = "policy",
    tool_parser: str | None = "hermes",
    max_model_len: int = 8192,
    chat_template: str | None = None,
    tokenizer: str | None = None,
    tokenizer_mode: str = "auto",
) -> tuple[Any, Any]:
    """vLLM 0.24's own chat render and `/tokenize` objects for a local model directory, with no engine.

    Returns `(OpenAIServingRender, ServingTokenization)` built the way vLLM's render-only server builds them,
    on a CPU device config; `chat_template` (the template's text) replaces the tokenizer's, as vLLM's
    `--chat-template` does; `tokenizer` (a directory) and `tokenizer_mode` are vLLM's options of those names.
    For tests and benchmarks; the serving path itself never calls this.
    """
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig
    from vllm.entrypoints.openai.models.protocol import BaseModelPath
    from vllm.entrypoints.openai.models.serving import OpenAIModelRegistry
    from vllm.entrypoints.serve.render.serving import OpenAIServingRender
    from vllm.entrypoints.serve.tokenize.serving import ServingTokenization
    from vllm.renderers import renderer_from_config

    model_config = ModelConfig(
        model=model_dir, tokenizer=tokenizer or model_dir, tokenizer_mode=tokenizer_mode, max_model_len=max_model_len
    )
    vllm_config = VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu"))
    registry = OpenAIModelRegistry(
        model_config=model_config, base_model_paths=[BaseModelPath(name=served_model_name, model_path=model_dir)]
    )
    render = OpenAIServingRender(
        model_config,
        renderer_from_config(vllm_config),
        registry,
        request_logger=None,
        chat_template=chat_template,
        chat_template_content_format="auto",
        enable_auto_tools=tool_parser is not None,
        tool_parser=tool_parser,
    )
    tokenization = ServingTokenization(
        registry, render, request_logger=None, chat_template=None, chat_template_content_format="auto"
    )
    return render, tokenization
