# SPDX-License-Identifier: Apache-2.0
"""The LLM judge of the NeMo Gym the plugin starts: which resources servers call one, and the keys that give them the
plugin's (`nemo_gym.judge`).

A resources server that scores with an LLM judge names a Gym model server in its config, `judge_model_server: {type:
responses_api_models, name: X}`, and calls it over `/v1/chat/completions` or `/v1/responses` (`nemo_gym/judge.py`,
Gym 0.7). Gym's configs name many such X: `policy_model`, `judge_model` (some defined beside the server as an
`openai_model` on a hosted endpoint), names no config defines (`genrm_model`), or `???`.

Contract (pure: parsed config dicts in, config dicts out):
- `judge_references(merged)` lists every resources server instance of the merged Gym config with a
  `judge_model_server`, the model server it names and whether the merged config defines that one.
- `undefined_judges(references)`: those whose judge no config defines, which Gym would refuse to start
  (`ServerRefNotFoundError`), so the plugin names them before anything starts.
- `judge_keys(settings, references, merged)` are the global-config keys that make the plugin's judge theirs: one
  `vllm_model` server, `JUDGE_SERVER`, pointed at the judge's URLs (verl's own servers for `policy`), asking for no
  token IDs (the judge's calls are not trained) and failing a request over the judge's context rather than answering
  it empty, and every listed server's `judge_model_server` pointed at it, but for `exclude_servers`. A model server
  that only the redirected servers named is removed (set to null): it would otherwise still start, on an endpoint
  (often a hosted API with an unset key) nothing calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

JUDGE_SERVER = "verl_judge_model"
"""The Gym model server the plugin adds for its judge."""
JUDGE_FIELD = "judge_model_server"
MODEL_SERVER_TYPE = "responses_api_models"
RESOURCES_SERVER_TYPE = "resources_servers"


@dataclass(frozen=True)
class JudgeSettings:
    """`config.Judge` resolved against verl's policy servers (`policy`) or taken as given (a URL)."""

    base_urls: tuple[str, ...]
    model: str
    api_key: str
    uses_reasoning_parser: bool
    extra_body: Mapping[str, Any]
    exclude_servers: frozenset[str] = frozenset()


@dataclass(frozen=True)
class JudgeReference:
    server: str
    """The resources server instance (the top-level key of its config)."""
    judge: str
    """The model server its `judge_model_server` names (`???` when the config leaves it to be filled in)."""
    defined: bool
    """Whether the merged config defines that model server."""


def _inner(block: Any, server_type: str) -> Mapping[str, Any] | None:
    """The settings of a server instance's one implementation (`{<type>: {<impl>: {...}}}`), else None."""
    if not isinstance(block, Mapping) or not isinstance(block.get(server_type), Mapping):
        return None
    implementations = list(block[server_type].values())
    return implementations[0] if len(implementations) == 1 and isinstance(implementations[0], Mapping) else None


def _model_servers(merged: Mapping[str, Any]) -> set[str]:
    return {name for name, block in merged.items() if _inner(block, MODEL_SERVER_TYPE) is not None}


def _refs(value: Any) -> list[str]:
    """Every model server name referenced anywhere under `value`."""
    if isinstance(value, Mapping):
        found = [value["name"]] if value.get("type") == MODEL_SERVER_TYPE and isinstance(value.get("name"), str) else []
        return found + [name for child in value.values() for name in _refs(child)]
    if isinstance(value, list):
        return [name for child in value for name in _refs(child)]
    return []


def judge_references(merged: Mapping[str, Any]) -> list[JudgeReference]:
    """Every resources server of `merged` (Gym's merged global config) that names a judge, in config order."""
    defined = _model_servers(merged)
    references = []
    for name, block in merged.items():
        settings = _inner(block, RESOURCES_SERVER_TYPE)
        ref = settings.get(JUDGE_FIELD) if settings is not None else None
        if isinstance(ref, Mapping) and ref.get("type", MODEL_SERVER_TYPE) == MODEL_SERVER_TYPE:
            judge = str(ref.get("name"))
            references.append(JudgeReference(str(name), judge, judge in defined))
    return references


def undefined_judges(references: Sequence[JudgeReference]) -> list[JudgeReference]:
    return [ref for ref in references if not ref.defined]


def judge_keys(
    settings: JudgeSettings, references: Sequence[JudgeReference], merged: Mapping[str, Any]
) -> dict[str, Any]:
    """Gym global-config keys that make `settings` the judge of `references` (see the module docstring)."""
    redirected = [ref for ref in references if ref.server not in settings.exclude_servers]
    keys: dict[str, Any] = {
        JUDGE_SERVER: {
            MODEL_SERVER_TYPE: {
                "vllm_model": {
                    "entrypoint": "app.py",
                    "base_url": list(settings.base_urls),
                    "api_key": settings.api_key,
                    "model": settings.model,
                    "return_token_id_information": False,
                    # A judge request over the judge's context is a failed judge call (`judge_failed`, masked and
                    # counted), not the empty reply Gym's vllm_model makes of it by default, which several servers
                    # score 0 with no failure flag (false_statement_judge, multichallenge; Gym 0.7.0).
                    "propagate_context_overflow_errors": True,
                    "uses_reasoning_parser": settings.uses_reasoning_parser,
                    **({"extra_body": dict(settings.extra_body)} if settings.extra_body else {}),
                }
            }
        }
    }
    for ref in redirected:
        implementation = next(iter(merged[ref.server][RESOURCES_SERVER_TYPE]))
        keys[ref.server] = {
            RESOURCES_SERVER_TYPE: {implementation: {JUDGE_FIELD: {"type": MODEL_SERVER_TYPE, "name": JUDGE_SERVER}}}
        }
    # Model servers still referenced once the redirected servers' judge fields are set aside.
    still_used = {
        name
        for server, block in merged.items()
        for name in _refs(_without_judge(block) if server in {ref.server for ref in redirected} else block)
    }
    for name in sorted({ref.judge for ref in redirected if ref.defined} - still_used):
        keys[name] = None
    return keys


def _without_judge(block: Mapping[str, Any]) -> dict[str, Any]:
    """A resources server instance's config without its `judge_model_server`."""
    (implementation, settings), *_ = block[RESOURCES_SERVER_TYPE].items()
    rest = {k: v for k, v in settings.items() if k != JUDGE_FIELD}
    return {**block, RESOURCES_SERVER_TYPE: {implementation: rest}}
