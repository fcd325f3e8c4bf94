# SPDX-License-Identifier: Apache-2.0
"""vLLM 0.24's own chat render and `/tokenize` objects for a local model directory, with no engine.

Test support: the splice tests, the template matrix and `benchmarks/bench_splice.py` drive vLLM's real chat
preprocessing (patched with `recipe.nemo_gym.server_patch.install()` or not) through `build_render_serving`.
The serving path never calls it.

For the splice patch's tests (`tests/cpu/unit/server_patch/test_server_patch_units.py`,
`tests/cpu/integration/test_server_patch.py`): `patched_render_serving` (the render objects with the patch
installed first, as in a server) and `patched_qwen3_fixtures` (the two modules' `serving` and `tok` fixtures over
it), `chat_request` / `chat_render` / `chat_ids` (a chat request through the render, as vLLM's chat completions
path makes it), and the pieces of a history NeMo Gym's model server sends back: `enc`, `per_char` (token IDs) and
`assistant` (a message with its token IDs).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any


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


@contextlib.contextmanager
def patched_render_serving(model_dir: str) -> Iterator[tuple[Any, Any]]:
    """`build_render_serving(model_dir)` with the splice patch installed before the render object is built (its turn
    terminator is found then, as in a server); the patch is uninstalled on exit."""
    from recipe.nemo_gym import server_patch

    server_patch.install()
    try:
        yield build_render_serving(model_dir)
    finally:
        server_patch.uninstall()


def patched_qwen3_fixtures() -> tuple[Any, Any]:
    """Two module-scoped pytest fixtures, for a test module to bind as `serving, tok = patched_qwen3_fixtures()`:
    `serving`, the tiny Qwen3 model's render objects with the splice patch installed (`patched_render_serving`), and
    `tok`, their tokenizer."""
    import pytest

    from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir

    @pytest.fixture(scope="module", name="serving")
    def serving_fixture() -> Iterator[tuple[Any, Any]]:
        with patched_render_serving(str(tiny_qwen3_dir())) as serving:
            yield serving

    @pytest.fixture(scope="module", name="tok")
    def tok_fixture(serving: tuple[Any, Any]) -> Any:
        return serving[0].renderer.tokenizer

    return serving_fixture, tok_fixture


def chat_request(messages: list[dict], **fields: Any) -> Any:
    """vLLM's `ChatCompletionRequest` for `messages`, validated as vLLM's server validates a request body."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest.model_validate({"model": "policy", "messages": messages, **fields})


def chat_render(serving: tuple[Any, Any], messages: list[dict], **fields: Any) -> tuple[Any, Any]:
    """(conversation, engine_input) from the chat completions path (`render_chat`, tool parser included)."""
    from vllm.entrypoints.openai.engine.protocol import ErrorResponse

    result = asyncio.run(serving[0].render_chat(chat_request(messages, **fields)))
    assert not isinstance(result, ErrorResponse), result
    conversation, (engine_input,) = result
    return conversation, engine_input


def chat_ids(serving: tuple[Any, Any], messages: list[dict], **fields: Any) -> list[int]:
    return list(chat_render(serving, messages, **fields)[1]["prompt_token_ids"])


def enc(tok: Any, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def per_char(tok: Any, text: str) -> list[int]:
    """A split the model may sample but re-tokenization never reproduces: one token per character."""
    return [t for ch in text for t in enc(tok, ch)]


def assistant(content: str, prompt_ids: list, generation_ids: list, **extra: Any) -> dict:
    return {
        "role": "assistant",
        "content": content,
        "prompt_token_ids": prompt_ids,
        "generation_token_ids": generation_ids,
        "generation_log_probs": [-0.5] * len(generation_ids),
        **extra,
    }
