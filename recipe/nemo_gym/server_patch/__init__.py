# SPDX-License-Identifier: Apache-2.0
"""The token-exact splice inside vLLM's chat preprocessing, so `/v1/chat/completions` and `/tokenize` agree.

Contract:
- `install()` wraps the `preprocess_chat` method (and `__init__`, see `template`) of the class the installed
  vLLM renders chats with: `vllm.renderers.online_renderer.OnlineRenderer` (0.25 and later) if present, else
  `vllm.entrypoints.serve.render.serving.OpenAIServingRender` (0.20 to 0.24; checked against 0.24.0, the only
  version this was run on: the 0.25+ path is written but untested). Both chat completions and `/tokenize` go
  through that one method. `install()` is idempotent and `uninstall()` restores vLLM's own methods. On a vLLM
  that has neither class, whose method does not take the arguments this wrapper relies on, or whose renderer
  lacks the template-only step the prefix render uses, it raises `UnsupportedVLLMError` naming the version: at
  start, never at the first request.
- What the wrapped method does with a request is `request.splice_chat`: a request whose messages carry no
  token IDs is passed to vLLM's method untouched; one whose messages carry them gets the spliced prompt IDs.
- Refusals: a `SpliceError` is raised as a subclass of both `SpliceError` and vLLM's `VLLMValidationError`,
  and vLLM's own `ValueError`s from chat preprocessing (e.g. tool call arguments that are not JSON) as
  `VLLMValidationError`. vLLM answers both with the same 400 body as a plain `ValueError`, but from its own
  handler: a plain `ValueError` reaches the catch-all handler, which Starlette runs in its outermost
  middleware and then re-raises, logging a traceback and making uvicorn close the keep-alive connection
  (other requests sharing it fail). Checked against vLLM 0.24.0.

Modules: this one installs the hook; `request` handles one chat request; `template` reads the served chat
template's turn terminator and generation prompt from probe renders. The splice rules themselves are pure and
live in `recipe.nemo_gym.splice`.

Importing this package has no side effects and does not import vLLM; `install()` does.
`recipe.nemo_gym.vllm_plugin` is the module that installs it inside verl's vLLM server actors.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
from collections.abc import Callable
from typing import Any

from recipe.nemo_gym.errors import ConfigError
from recipe.nemo_gym.server_patch.request import splice_chat
from recipe.nemo_gym.server_patch.template import remember_turn_terminator
from recipe.nemo_gym.splice.carriers import SpliceError

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
# The prefix render calls this step of vLLM's renderer directly (see `request._render_prefix_template`).
RENDERER_MODULE, RENDERER_CLASS, RENDERER_TEMPLATE_STEP = "vllm.renderers", "BaseRenderer", "render_messages_async"
_PATCHED_FLAG = "__nemo_gym_splice_original__"


class UnsupportedVLLMError(ConfigError):
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


def uninstall() -> None:
    """Restore vLLM's own `preprocess_chat` (for comparisons in tests and benchmarks)."""
    cls = resolve_target()
    original = getattr(cls.preprocess_chat, _PATCHED_FLAG, None)
    if original is not None:
        cls.preprocess_chat = original
    original_init = getattr(cls.__init__, _PATCHED_FLAG, None)
    if original_init is not None:
        cls.__init__ = original_init


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
            return await splice_chat(self, original, signature, args, kwargs)
        except ValueError as exc:
            refusal = _as_validation_error(exc)
            if refusal is exc:
                raise
            raise refusal from exc

    setattr(preprocess_chat, _PATCHED_FLAG, original)
    return preprocess_chat


def _make_init_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    """Find the chat template's turn terminator when vLLM builds its chat renderer (`template`), so that a
    template without one fails the server's start-up instead of every spliced request."""

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        remember_turn_terminator(self)

    setattr(__init__, _PATCHED_FLAG, original)
    return __init__
