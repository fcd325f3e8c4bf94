# SPDX-License-Identifier: Apache-2.0
"""vLLM 0.24's own chat render and `/tokenize` objects for a local model directory, with no engine.

Test support: the splice tests, the template matrix and `benchmarks/bench_splice.py` drive vLLM's real chat
preprocessing (patched with `recipe.nemo_gym.server_patch.install()` or not) through `build_render_serving`.
The serving path never calls it.
"""

from __future__ import annotations

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
