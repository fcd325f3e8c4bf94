"""The token-exact splice inside vLLM's chat preprocessing, so `/v1/chat/completions` and `/tokenize` agree.

Contract:
- `install()` wraps the `preprocess_chat` method of the class the installed vLLM renders chats with:
  `vllm.renderers.online_renderer.OnlineRenderer` (0.25 and later) if present, else
  `vllm.entrypoints.serve.render.serving.OpenAIServingRender` (0.20 to 0.24; checked against 0.24.0). Both
  chat completions and `/tokenize` go through that one method. `install()` is idempotent. On a vLLM that has
  neither, or whose method does not take the arguments this wrapper relies on, it raises
  `UnsupportedVLLMError` naming the version: at start, never at the first request.
- A request whose messages carry no token IDs is passed to vLLM's method untouched: its output is exactly
  unpatched vLLM's.
- A request whose messages carry them (NeMo Gym's `vllm_model` server with `return_token_id_information`)
  is rendered twice by vLLM's own method: as sent, and a copy with the history up to the last assistant
  message carrying IDs and no generation prompt. The prompt IDs are then replaced with
  `recipe.nemo_gym.splice.splice_prompt_ids(...)`; the rules are in `recipe.nemo_gym.splice`. A refusal
  raises `SpliceError` (a ValueError), which vLLM answers as HTTP 400 with the message.
- EOS is the tokenizer's `eos_token_id`, unless the environment variable `NEMO_GYM_SPLICE_EOS_TOKEN_ID` names
  another ID (for tokenizers whose EOS is not the chat template's turn terminator, e.g. Qwen base models).
- Not covered: harmony (gpt-oss) chat completions, which vLLM renders without `preprocess_chat`; multimodal
  prompts (refused: placeholder offsets would shift).

Importing this module has no side effects and does not import vLLM; `install()` does.
`recipe.nemo_gym.vllm_plugin` is the module that installs it inside verl's vLLM server actors.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import os
from collections.abc import Callable
from typing import Any

from recipe.nemo_gym.splice import SpliceError, find_true_prefix, has_token_ids, splice_prompt_ids

EOS_OVERRIDE_ENV = "NEMO_GYM_SPLICE_EOS_TOKEN_ID"

# (module, class) in the order they are tried; the first one found is patched, and only that one, so a
# version where one delegates to the other can never splice twice.
TARGETS: tuple[tuple[str, str], ...] = (
    ("vllm.renderers.online_renderer", "OnlineRenderer"),  # vLLM >= 0.25
    ("vllm.entrypoints.serve.render.serving", "OpenAIServingRender"),  # vLLM 0.20 - 0.24
)
# The wrapper reads these by name; a method without them is a vLLM this patch was not written for.
REQUIRED_PARAMETERS = ("request", "messages", "default_template_kwargs", "tool_dicts", "parser")
_PATCHED_FLAG = "__nemo_gym_splice_original__"


class UnsupportedVLLMError(RuntimeError):
    """The installed vLLM has no chat preprocessing method this patch knows how to wrap."""


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
        return cls
    raise UnsupportedVLLMError(
        f"vLLM {vllm_version()} is not supported by the token-exact splice patch: none of {tried} exists "
        f"(supported: 0.20 to 0.24 with OpenAIServingRender.preprocess_chat, 0.25+ with "
        f"OnlineRenderer.preprocess_chat; checked against 0.24.0)"
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


def _eos_token_id(serving: Any) -> int:
    override = os.environ.get(EOS_OVERRIDE_ENV)
    if override:
        try:
            return int(override)
        except ValueError:
            raise SpliceError(f"{EOS_OVERRIDE_ENV}={override!r} is not a token ID") from None
    eos = serving.renderer.tokenizer.eos_token_id
    if not isinstance(eos, int):
        raise SpliceError(f"the tokenizer has no single EOS token ID (got {eos!r}); set {EOS_OVERRIDE_ENV}")
    return eos


def _prefix_request(request: Any) -> Any:
    """A shallow copy of the request that renders with no generation prompt and nothing pre-filled.

    Set as fields of the copy, not passed as default template keywords: vLLM merges request fields over
    defaults, so a default `add_generation_prompt=False` would be overridden by the request's own `True`.
    `kv_transfer_params` is cleared because newer vLLM pops pre-tokenized IDs out of it while rendering.
    """
    fields = getattr(type(request), "model_fields", {})
    update = {
        k: v
        for k, v in (("add_generation_prompt", False), ("continue_final_message", False), ("kv_transfer_params", None))
        if k in fields
    }
    return request.model_copy(update=update)


def _make_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    async def preprocess_chat(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        messages = bound.arguments["messages"]
        if not has_token_ids(messages):
            return await original(self, *args, **kwargs)

        # Tool calls may be one-shot iterators (in-process callers; HTTP requests already hold lists); both
        # renders below must see them, so materialise them in place before the first.
        for message in messages:
            if isinstance(message, dict):
                calls = message.get("tool_calls")
                if calls is not None and not isinstance(calls, list):
                    message["tool_calls"] = list(calls)

        true_prefix = find_true_prefix(messages)
        assert true_prefix is not None  # has_token_ids was true
        prefix_args = dict(bound.arguments)
        prefix_args["request"] = _prefix_request(bound.arguments["request"])
        prefix_args["messages"] = list(messages[: true_prefix.message_index + 1])
        # No tool parser for the prefix render: it only adjusts the (copied) request for generation.
        prefix_args["parser"] = None

        conversation, engine_inputs = await original(self, *args, **kwargs)
        _, prefix_inputs = await original(**prefix_args)
        if len(engine_inputs) != 1 or len(prefix_inputs) != 1:
            raise SpliceError(f"expected one rendered prompt, got {len(engine_inputs)} and {len(prefix_inputs)}")
        engine_input = engine_inputs[0]
        if engine_input.get("type", "token") != "token" or "prompt_token_ids" not in engine_input:
            raise SpliceError(
                f"token-exact splice supports text prompts only, got a {engine_input.get('type')!r} prompt"
            )
        ids = splice_prompt_ids(
            true_prefix.token_ids,
            prefix_inputs[0]["prompt_token_ids"],
            engine_input["prompt_token_ids"],
            _eos_token_id(self),
        )
        engine_input["prompt_token_ids"] = ids
        if "prompt" in engine_input:
            # Keep the logged / `return_prompt_text` prompt truthful: it is the text of the spliced IDs.
            engine_input["prompt"] = self.renderer.tokenizer.decode(ids)
        return conversation, engine_inputs

    setattr(preprocess_chat, _PATCHED_FLAG, original)
    return preprocess_chat


def uninstall() -> None:
    """Restore vLLM's own `preprocess_chat` (for comparisons in tests and benchmarks)."""
    cls = resolve_target()
    original = getattr(cls.preprocess_chat, _PATCHED_FLAG, None)
    if original is not None:
        cls.preprocess_chat = original


def build_render_serving(
    model_dir: str, *, served_model_name: str = "policy", tool_parser: str | None = "hermes", max_model_len: int = 8192
) -> tuple[Any, Any]:
    """vLLM 0.24's own chat render and `/tokenize` objects for a local model directory, with no engine.

    Returns `(OpenAIServingRender, ServingTokenization)` built the way vLLM's render-only server builds them,
    on a CPU device config. For tests and benchmarks; the serving path itself never calls this.
    """
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig
    from vllm.entrypoints.openai.models.protocol import BaseModelPath
    from vllm.entrypoints.openai.models.serving import OpenAIModelRegistry
    from vllm.entrypoints.serve.render.serving import OpenAIServingRender
    from vllm.entrypoints.serve.tokenize.serving import ServingTokenization
    from vllm.renderers import renderer_from_config

    model_config = ModelConfig(model=model_dir, tokenizer=model_dir, max_model_len=max_model_len)
    vllm_config = VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu"))
    registry = OpenAIModelRegistry(
        model_config=model_config, base_model_paths=[BaseModelPath(name=served_model_name, model_path=model_dir)]
    )
    render = OpenAIServingRender(
        model_config,
        renderer_from_config(vllm_config),
        registry,
        request_logger=None,
        chat_template=None,
        chat_template_content_format="auto",
        enable_auto_tools=tool_parser is not None,
        tool_parser=tool_parser,
    )
    tokenization = ServingTokenization(
        registry, render, request_logger=None, chat_template=None, chat_template_content_format="auto"
    )
    return render, tokenization
