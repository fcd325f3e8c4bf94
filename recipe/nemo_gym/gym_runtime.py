"""NeMo Gym 0.4.0's servers under our control: offline start, readiness, health, shutdown, ordered rollouts.

Contract:
- `GymRuntime.start(spec)` starts every server of `spec.config_paths` (plus the training model server config)
  with NeMo Gym's own `RunHelper.start`, offline: each server's venv is a link to a shim that runs this
  process's interpreter (`sys.executable`), so no server builds a venv and nothing needs the network. It
  returns only once every server answers HTTP, within `spec.startup_timeout_s`. Before anything starts it
  checks that every config path exists (relative paths resolve as NeMo Gym 0.4.0 resolves them: the current
  directory first, then the installed package root, i.e. site-packages) and that the head server's port is
  free. If a server dies or the deadline passes, everything started is stopped and the error names the
  servers concerned. At most one runtime is live per process (NeMo Gym keeps one configuration per process).
- `health()` / `check_health()` are cheap (process liveness; HTTP only on request) and name dead servers.
- `shutdown()` stops the head server and every process started (each server's wrapper and all of its
  descendants: SIGTERM, then SIGKILL after a bounded grace), then closes NeMo Gym's HTTP session. Idempotent;
  also runs at interpreter exit (verl never calls it), without starting a thread and without printing anything.
  On SIGTERM of this process every process started is sent SIGKILL at once (`kill_now`; a Ray actor such as
  verl's TaskRunner is SIGKILLed ~0.1 s after its SIGTERM), then the SIGTERM handler already installed runs.
- `collect(examples, deadline_s)` (awaitable from any event loop) / `collect_sync(...)` post each row to its
  agent's `/run` and return results in input order. A row whose `/run` fails with an HTTP error becomes an
  `EpisodeFailure` for that row (`server_error_cause`: a splice refusal is CONTIGUITY_BROKEN, a NaN the policy
  server could not send is NON_FINITE_LOGPROB, anything else SERVER_ERROR); a row whose first model call the
  policy server refused as over the model's context becomes PROMPT_TOO_LONG (`context_overflow_failure`).
  A NeMo Gym server that dies mid-batch, a policy server that stops answering HTTP (`spec.policy_health_failures`
  consecutive `GET <root>/health` probes without an answer within `spec.policy_health_timeout_s`; any HTTP
  status counts as an answer), or a batch that outlives its deadline raises `RolloutAborted` naming the server
  or the pending count (every pending request is cancelled first).

Why rows are posted one by one instead of through `RolloutCollectionHelper.run_examples`: in 0.4.0 that method
yields awaitables in completion order, and an example that fails raises from its awaitable without its row, so
a failure cannot be tied to the row it belongs to. `collect` does what `run_examples` does per row (the public
`ServerClient.post` to `/run`, `raise_for_status`, `get_response_json`, with the server client made by the
public `RolloutCollectionHelper.setup_server_client`) and keeps each row's index with its request.

NeMo Gym 0.4.0 behaviours this module is built around (read in its source):
- Nothing times out: `ServerClient.post` retries connection errors every 0.5 s forever, so a dead agent or
  policy server makes `/run` hang. Hence the batch deadline and the health checks while a batch waits. The
  policy servers are not NeMo Gym processes (verl runs them), so they are probed over HTTP, not by process.
  After an abort, NeMo Gym's model server may go on retrying a dead policy server for requests nobody waits
  for any more; those loops end with the NeMo Gym servers (`shutdown()`).
- HTTP errors are not retried at the `/run` level; the model server retries 500/502/503/504/429/520 from the
  policy 3 times (0.5 s apart) before it fails the agent's request with a 500.
- `RunHelper.start` waits for servers with no deadline, and cleans nothing up if it raises; `shutdown()` only
  signals the wrapper shells, which with `nemo_gym_log_dir` set leaves the servers running. So `start` runs on
  a helper thread under our deadline, and teardown is ours (it reads `RunHelper`'s private process table; see
  `_RunHelperView`).
- Importing `nemo_gym` sets `HF_HOME`, `HF_DATASETS_CACHE` (to `<cwd>/cache/huggingface`) and
  `TOKENIZERS_PARALLELISM`, replaces `builtins.print`, and appends site-packages to `sys.path`; parsing a
  config sets `UV_CACHE_DIR`. All of these are undone in this process (`_nemo_gym`, `_parse_config`); the
  servers, being separate processes, keep NeMo Gym's defaults. Still global once imported: two OmegaConf
  resolvers (`inherit_from`, `copy`), `wandb.util.VALUE_BYTES_LIMIT`, and NeMo Gym's `maybe_ray_cluster_exit`
  atexit hook (a no-op here). Its other atexit hook, which closes the global aiohttp session on a new loop and
  fails at exit because the session lives on the runtime's loop, is unregistered (`_nemo_gym`).
  `nemo_gym` is imported lazily, on first start, never at this module's import.
"""

from __future__ import annotations

import asyncio
import atexit
import builtins
import contextlib
import http.client
import importlib.util
import inspect
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil

from recipe.nemo_gym.event_loop import BackgroundLoop
from recipe.nemo_gym.failures import EpisodeFailure, FailureCause, RolloutAborted

logger = logging.getLogger(__name__)

TRAINING_MODEL_SERVER_CONFIG = "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml"
AGENT_SERVER_TYPE = "responses_api_agents"
# Keys of NeMo Gym's global config that the spec's own fields own; `overrides` may not set them.
SPEC_OWNED_KEYS = frozenset(
    {
        "config_paths",
        "policy_base_url",
        "policy_api_key",
        "policy_model_name",
        "head_server",
        "ray_head_node_address",
        "skip_venv_if_present",
        "uv_venv_dir",
        "uv_cache_dir",
        "nemo_gym_log_dir",
    }
)
_SHIM_DIR_NAME = "_interpreter_shim"


# --------------------------------------------------------------------------------------------------- errors


class GymRuntimeError(RuntimeError):
    """NeMo Gym's servers could not be started, or are not healthy."""


class GymConfigError(GymRuntimeError, ValueError):
    """The spec or a NeMo Gym config it names is wrong; nothing was started."""


class HeadPortInUseError(GymRuntimeError):
    """The head server's port is taken by another process; nothing was started."""


class GymServerDied(GymRuntimeError):
    """One or more NeMo Gym server processes exited. `servers` names them."""

    def __init__(self, message: str, servers: Sequence[str]):
        super().__init__(message)
        self.servers = tuple(servers)


class PolicyServerUnreachable(GymServerDied):
    """Policy (vLLM) servers that stopped answering HTTP. `servers` holds their base URLs."""


class GymStartTimeout(GymRuntimeError, TimeoutError):
    """Servers did not all answer HTTP before the start-up deadline. `servers` names those that did not."""

    def __init__(self, message: str, servers: Sequence[str]):
        super().__init__(message)
        self.servers = tuple(servers)


# ------------------------------------------------------------------------------------------- typed records


@dataclass(frozen=True)
class GymServersSpec:
    """Everything needed to start one NeMo Gym configuration.

    `config_paths` are the environments' configs; `model_server_config_path` (the training model server,
    `policy_model`, by default) is put first unless it is None. `overrides` is merged over the configs
    (nested dicts, NeMo Gym's own keys), e.g. `{"policy_model": {"responses_api_models": {"vllm_model":
    {"uses_reasoning_parser": False}}}}`. `ray_head_node_address=None` uses the Ray this process is connected
    to. `cache_dir` holds the venv links and uv's cache (default `$NEMO_GYM_VERL_CACHE`, else
    `~/.cache/verl-nemo-gym`). `log_dir` becomes NeMo Gym's `nemo_gym_log_dir` (one log file per server).
    While a batch waits, each policy server's `GET <root>/health` is probed with `policy_health_timeout_s`;
    `policy_health_failures` consecutive probes without any HTTP answer abort the batch (see `PolicyWatch`).
    """

    config_paths: tuple[str, ...]
    policy_base_urls: tuple[str, ...]
    policy_model_name: str
    policy_api_key: str = "EMPTY"
    ray_head_node_address: str | None = None
    head_server_host: str = "127.0.0.1"
    head_server_port: int = 11000
    model_server_config_path: str | None = TRAINING_MODEL_SERVER_CONFIG
    overrides: Mapping[str, Any] = field(default_factory=dict)
    cache_dir: Path | None = None
    venv_dir: Path | None = None
    log_dir: Path | None = None
    startup_timeout_s: float = 300.0
    shutdown_grace_s: float = 5.0
    load_env_yaml: bool = False
    policy_health_timeout_s: float = 10.0
    policy_health_failures: int = 3

    def __post_init__(self) -> None:
        for name in ("config_paths", "policy_base_urls"):
            value = getattr(self, name)
            if isinstance(value, str):
                value = (value,)
            object.__setattr__(self, name, tuple(str(v) for v in value))
        if not self.config_paths:
            raise GymConfigError("GymServersSpec.config_paths is empty: name at least one environment config")
        if not self.policy_base_urls:
            raise GymConfigError("GymServersSpec.policy_base_urls is empty: give the policy servers' base URLs")
        for url in self.policy_base_urls:
            if not url.startswith(("http://", "https://")):
                raise GymConfigError(f"GymServersSpec.policy_base_urls: {url!r} is not an http(s) URL")
        if not self.policy_model_name:
            raise GymConfigError("GymServersSpec.policy_model_name is empty")
        if not 0 < int(self.head_server_port) < 65536:
            raise GymConfigError(f"GymServersSpec.head_server_port {self.head_server_port} is not a TCP port")
        for name in ("startup_timeout_s", "shutdown_grace_s", "policy_health_timeout_s"):
            if not getattr(self, name) > 0:
                raise GymConfigError(f"GymServersSpec.{name} must be positive, got {getattr(self, name)}")
        if isinstance(self.policy_health_failures, bool) or not (
            isinstance(self.policy_health_failures, int) and self.policy_health_failures >= 1
        ):
            raise GymConfigError(
                f"GymServersSpec.policy_health_failures must be an integer >= 1, got {self.policy_health_failures!r}"
            )
        clashes = sorted(SPEC_OWNED_KEYS & set(self.overrides))
        if clashes:
            raise GymConfigError(f"GymServersSpec.overrides sets {clashes}, which the spec's own fields set")
        for name in ("cache_dir", "venv_dir", "log_dir"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Path(value))

    @classmethod
    def from_config(
        cls,
        plugin_config: Any,
        policy_base_urls: Sequence[str],
        policy_model_name: str,
        ray_head_node_address: str | None = None,
    ) -> GymServersSpec:
        """The spec for the plugin's validated YAML (`recipe.nemo_gym.config.NeMoGymConfig`).

        `nemo_gym.config_paths` are taken as the complete list (the training model server config included).
        With `nemo_gym.root` set, relative paths are made absolute under it; otherwise NeMo Gym's own
        resolution applies (current directory, then the installed package root). `uses_reasoning_parser` is
        applied to the `policy_model` server when it is NeMo Gym's `vllm_model`.
        """
        section = plugin_config.nemo_gym
        paths = [str(p) for p in section.config_paths]
        if section.root is not None:
            paths = [p if Path(p).is_absolute() else str(Path(section.root) / p) for p in paths]
        overrides: dict[str, Any] = {}
        if any("responses_api_models/vllm_model/" in p for p in paths):
            reasoning = {"uses_reasoning_parser": bool(section.uses_reasoning_parser)}
            overrides = {"policy_model": {"responses_api_models": {"vllm_model": reasoning}}}
        overrides = deep_merge(overrides, dict(section.config_overrides))
        return cls(
            config_paths=tuple(paths),
            policy_base_urls=tuple(policy_base_urls),
            policy_model_name=policy_model_name,
            policy_api_key=section.policy_api_key,
            ray_head_node_address=ray_head_node_address,
            head_server_host=section.head_server.host,
            head_server_port=section.head_server.port,
            model_server_config_path=None,
            overrides=overrides,
            venv_dir=section.venv_dir,
            log_dir=section.log_dir,
            startup_timeout_s=plugin_config.timeouts.startup_s,
            shutdown_grace_s=plugin_config.timeouts.shutdown_grace_s,
            policy_health_timeout_s=plugin_config.timeouts.policy_health_timeout_s,
            policy_health_failures=plugin_config.timeouts.policy_health_failures,
        )

    @property
    def all_config_paths(self) -> tuple[str, ...]:
        head = (self.model_server_config_path,) if self.model_server_config_path else ()
        return head + tuple(p for p in self.config_paths if p != self.model_server_config_path)

    def resolved_cache_dir(self) -> Path:
        if self.cache_dir is not None:
            return self.cache_dir
        env = os.environ.get("NEMO_GYM_VERL_CACHE")
        return Path(env) if env else Path.home() / ".cache" / "verl-nemo-gym"


@dataclass(frozen=True)
class ServerInstance:
    """One server of a parsed NeMo Gym configuration: `name` is its top-level key (e.g. `policy_model`)."""

    name: str
    server_type: str
    implementation: str
    host: str | None
    port: int | None

    @property
    def server_dir(self) -> tuple[str, str]:
        """`(<type>, <implementation>)`: the folder NeMo Gym runs it from and keys its venv by."""
        return (self.server_type, self.implementation)

    @property
    def url(self) -> str | None:
        return f"http://{self.host}:{self.port}" if self.host and self.port else None


@dataclass(frozen=True)
class ServerHealth:
    name: str
    alive: bool
    detail: str


@dataclass(frozen=True)
class HealthReport:
    servers: tuple[ServerHealth, ...]

    @property
    def dead(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.servers if not s.alive)

    @property
    def ok(self) -> bool:
        return not self.dead


# ----------------------------------------------------------------------------------------- pure functions


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `update` merged in: nested mappings merge key by key, anything else is replaced."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def resolve_config_path(path: str, cwd: Path, install_root: Path) -> Path | None:
    """Where NeMo Gym 0.4.0 reads a config path from (`load_extra_config_paths`), or None if nowhere."""
    p = Path(path)
    if p.is_absolute():
        return p if p.is_file() else None
    for candidate in (cwd / p, install_root / p):
        if candidate.is_file():
            return candidate
    return None


def check_config_paths(paths: Sequence[str], cwd: Path, install_root: Path) -> list[Path]:
    """Resolve every path or raise one `GymConfigError` listing each missing path and where it was looked for."""
    resolved, missing = [], []
    for path in paths:
        found = resolve_config_path(path, cwd, install_root)
        if found is None:
            looked = [Path(path)] if Path(path).is_absolute() else [cwd / path, install_root / path]
            missing.append(f"  {path!r} (looked in: {', '.join(str(p) for p in looked)})")
        else:
            resolved.append(found)
    if missing:
        raise GymConfigError("NeMo Gym config path(s) not found:\n" + "\n".join(missing))
    return resolved


def build_global_config_dict(
    spec: GymServersSpec, ray_head_node_address: str, venv_dir: Path, uv_cache_dir: Path
) -> dict[str, Any]:
    """The `initial_global_config_dict` handed to NeMo Gym (it overrides every key of the config files)."""
    config: dict[str, Any] = {key: value for key, value in spec.overrides.items()}
    config.update(
        {
            "config_paths": list(spec.all_config_paths),
            "policy_base_url": list(spec.policy_base_urls),
            "policy_api_key": spec.policy_api_key,
            "policy_model_name": spec.policy_model_name,
            "head_server": {"host": spec.head_server_host, "port": int(spec.head_server_port)},
            "ray_head_node_address": ray_head_node_address,
            "skip_venv_if_present": True,
            "uv_venv_dir": str(venv_dir),
            "uv_cache_dir": str(uv_cache_dir),
        }
    )
    if spec.log_dir is not None:
        config["nemo_gym_log_dir"] = str(spec.log_dir)
    return config


def server_instances(config: Mapping[str, Any], reserved_keys: Collection[str]) -> list[ServerInstance]:
    """The servers `RunHelper.start` launches: top-level `{type: {implementation: {entrypoint, ...}}}` entries."""
    servers = []
    for name, value in config.items():
        if name in reserved_keys or not isinstance(value, Mapping) or not value:
            continue
        server_type, inner = next(iter(value.items()))
        if not isinstance(inner, Mapping) or not inner:
            continue
        implementation, server_config = next(iter(inner.items()))
        if not isinstance(server_config, Mapping) or "entrypoint" not in server_config:
            continue
        port = server_config.get("port")
        servers.append(
            ServerInstance(
                name=str(name),
                server_type=str(server_type),
                implementation=str(implementation),
                host=server_config.get("host"),
                port=int(port) if port else None,
            )
        )
    return servers


def validate_examples(examples: Sequence[Mapping[str, Any]], agent_names: Collection[str]) -> list[str]:
    """Each row's agent server name; raises `ValueError` naming the first bad row."""
    agents = []
    for i, row in enumerate(examples):
        if not isinstance(row, Mapping):
            raise ValueError(f"row {i}: expected a mapping, got {type(row).__name__}")
        agent_ref = row.get("agent_ref")
        name = agent_ref.get("name") if isinstance(agent_ref, Mapping) else None
        if not isinstance(name, str) or not name:
            raise ValueError(f"row {i}: missing agent_ref.name (the agent server that runs the episode)")
        if name not in agent_names:
            raise ValueError(
                f"row {i}: agent_ref.name {name!r} is not an agent of this NeMo Gym configuration "
                f"(agents: {sorted(agent_names)})"
            )
        if "responses_create_params" not in row:
            raise ValueError(f"row {i}: missing responses_create_params")
        agents.append(name)
    return agents


# Refusals of the token-exact splice (`recipe.nemo_gym.splice.SpliceError`), as they appear in an agent's error
# body: vLLM answers them with HTTP 400 and the message, NeMo Gym's model server and agent each wrap the inner
# body in `repr` (quotes escaped, once per hop), so only text without quotes or backslashes is matched. Tied to
# the wording of splice.py's rules ("rule 2 (unedited history) failed: ...", "rule 'one message per generation'
# failed: ...").
_SPLICE_REFUSAL = re.compile(
    r"rule \d+ \([^()'\"\\]{1,80}\) failed|one message per generation[\\'\"]* failed|token-exact splice refused"
)
# vLLM's OpenAI server cannot encode a response holding NaN (in 0.24: a NaN log-prob, the only float a chat
# completion returns per token; -inf is clamped to -9999.0) and answers with the JSON encoder's message (HTTP 400).
_NON_FINITE_FLOAT = re.compile(r"Out of range float values are not JSON compliant")


def server_error_cause(body: str) -> FailureCause:
    """The failure cause an agent's `/run` error body stands for (pure; see `server_error_failure`).

    - the policy server refused an edited history (a splice rule failed): CONTIGUITY_BROKEN, a data fault that
      no retry fixes;
    - the policy server could not serialise a non-finite float (a NaN log-prob): NON_FINITE_LOGPROB;
    - anything else: SERVER_ERROR.
    """
    if _SPLICE_REFUSAL.search(body):
        return FailureCause.CONTIGUITY_BROKEN
    if _NON_FINITE_FLOAT.search(body):
        return FailureCause.NON_FINITE_LOGPROB
    return FailureCause.SERVER_ERROR


def _readable_excerpt(body: str, start: int, limit: int = 300) -> str:
    """The JSON string value that starts at `start` in `body`, unescaped from NeMo Gym's nested `repr`s, cut at
    `limit`. The message of vLLM's error JSON holds no double quote of its own, so the first one ends it."""
    text = re.sub(r"\\+", "", body[start:]).split('"', 1)[0]
    return text if len(text) <= limit else text[:limit] + "..."


def server_error_failure(row: int, agent: str, status: int | None, body: bytes | str | None) -> EpisodeFailure:
    """The `EpisodeFailure` for a row whose `/run` failed; the cause is read from the whole body first."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    body = (body or "").strip()
    cause = server_error_cause(body)
    status_text = f"HTTP {status}" if status is not None else "an error"
    where = f"agent {agent!r} /run returned {status_text}"
    if cause is FailureCause.CONTIGUITY_BROKEN:
        found = _SPLICE_REFUSAL.search(body)
        assert found is not None
        if found.group(0).startswith("token-exact"):  # SpliceError's prefix: the refusal's own words follow it
            start = found.end()
        elif found.group(0).startswith("rule"):
            start = found.start()
        else:
            start = max(0, body.rfind("rule", 0, found.start()))
        detail = f"{where}: the policy server refused the chat history (token-exact splice): "
        return EpisodeFailure(cause, detail + _readable_excerpt(body, start).lstrip(": "), row=row)
    if cause is FailureCause.NON_FINITE_LOGPROB:
        found = _NON_FINITE_FLOAT.search(body)
        assert found is not None
        detail = f"{where}: the policy server could not send a non-finite log-prob: "
        return EpisodeFailure(cause, detail + _readable_excerpt(body, found.start()), row=row)
    if len(body) > 500:
        body = body[:500] + "..."
    return EpisodeFailure(cause, f"{where}: {body}", row=row)


def context_overflow_failure(row: int, result: Mapping[str, Any]) -> EpisodeFailure | None:
    """PROMPT_TOO_LONG for a result whose first model call was refused as longer than the model's context.

    NeMo Gym 0.4.0's `vllm_model` server turns vLLM's HTTP 400 for a prompt over the context ("maximum context
    length", or "max_tokens" too large for what is left of it) into an empty chat completion that finished on
    "length", so the episode comes back looking like a generation cut at zero tokens: `incomplete_details`
    `{"reason": "max_output_tokens"}` and no output item carrying generation token IDs. Any model call that did
    generate makes it an ordinary (cut) episode, and None is returned.
    """
    response = result.get("response")
    if not isinstance(response, Mapping):
        return None
    details = response.get("incomplete_details")
    if not isinstance(details, Mapping) or details.get("reason") != "max_output_tokens":
        return None
    output = response.get("output")
    if not isinstance(output, list):
        return None
    if any(isinstance(item, Mapping) and item.get("generation_token_ids") is not None for item in output):
        return None
    return EpisodeFailure(
        FailureCause.PROMPT_TOO_LONG,
        "the policy server refused the first model call as longer than the model's context (NeMo Gym's model "
        "server answered it as an empty turn cut on length); shorten the prompt or raise the context length",
        row=row,
    )


def write_interpreter_shim(venv_dir: Path, python: str) -> Path:
    """A venv-shaped folder whose `bin/python` runs `python` and whose `bin/activate` puts it first on PATH.

    NeMo Gym skips building a server's venv when `<uv_venv_dir>/<type>/<impl>/.venv/bin/{python,activate}`
    exist, then runs `source .venv/bin/activate && python app.py`. The shim makes that run this process's
    interpreter whatever kind of environment it lives in (venv, conda, system Python), and, being ours,
    keeps NeMo Gym from ever writing into the environment itself. `exec` keeps the server's pid.
    """
    shim = venv_dir / _SHIM_DIR_NAME
    bin_dir = shim / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    _write_atomically(bin_dir / "python", f'#!/bin/sh\nexec "{python}" "$@"\n', mode=0o755)
    _write_atomically(bin_dir / "activate", f'export PATH="{bin_dir}:$PATH"\n', mode=0o644)
    return shim


def link_server_venvs(venv_dir: Path, server_dirs: Collection[tuple[str, str]], shim: Path) -> list[Path]:
    """Point `<venv_dir>/<type>/<impl>/.venv` at the shim for every server folder (atomic, idempotent)."""
    links = []
    for server_type, implementation in sorted(set(server_dirs)):
        link = venv_dir / server_type / implementation / ".venv"
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() and os.readlink(link) == str(shim):
            links.append(link)
            continue
        if link.exists() and not link.is_symlink():
            raise GymConfigError(f"{link} exists and is not a link made by this plugin: remove it")
        tmp = link.with_name(f".venv.tmp.{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        tmp.symlink_to(shim, target_is_directory=True)
        os.replace(tmp, link)
        links.append(link)
    return links


def _write_atomically(path: Path, text: str, mode: int) -> None:
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)


def port_holder(host: str, port: int) -> str | None:
    """`pid N (name)` of a process listening on `port`, when the OS lets us see it."""
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                with contextlib.suppress(psutil.Error):
                    return f"pid {conn.pid} ({psutil.Process(conn.pid).name()})"
                return f"pid {conn.pid}"
    except (psutil.Error, OSError):
        pass
    return None


def check_port_free(host: str, port: int) -> None:
    """Raise `HeadPortInUseError` unless `host:port` can be bound the way uvicorn binds it (SO_REUSEADDR)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            holder = port_holder(host, port)
            by = f" by {holder}" if holder else ""
            raise HeadPortInUseError(
                f"NeMo Gym head server port {host}:{port} is already in use{by} ({e.strerror}). "
                "Choose another head_server_port, or stop whatever holds it (another run's NeMo Gym?)."
            ) from None


def http_alive(host: str, port: int, timeout_s: float) -> bool:
    """NeMo Gym's readiness criterion: the server answers a GET / with any HTTP response."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", "/")
        conn.getresponse().read()
        return True
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def log_tail(log_dir: Path | None, server: str, lines: int = 20) -> str:
    """The last lines of a server's NeMo Gym log file (named as 0.4.0's `run_command` names it), if any."""
    if log_dir is None:
        return ""
    path = log_dir / f"{server.replace('/', '_')}.log"
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    tail = "\n".join(text.splitlines()[-lines:])
    return f"\n--- last lines of {path} ---\n{tail}" if tail else ""


# ------------------------------------------------------------------------------------------ policy health


def policy_health_url(base_url: str) -> str:
    """vLLM's health endpoint for a policy server's OpenAI base URL: `<root>/health`, `<root>` without `/v1`."""
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    return f"{root}/health"


@dataclass(frozen=True)
class ProbeResult:
    """One health probe of one policy server. `alive` means it answered HTTP at all (any status)."""

    base_url: str
    alive: bool
    detail: str


async def probe_policy_server(base_url: str, timeout_s: float) -> ProbeResult:
    """`GET <root>/health` once, bounded by `timeout_s`. Never raises for a network fault; reports it.

    Any HTTP answer counts as alive: what makes NeMo Gym hang is a server that does not answer at all (its model
    server retries connection errors forever), while an answering server's errors reach the rows as HTTP errors.
    """
    import aiohttp

    url = policy_health_url(base_url)
    # A session of its own (not NeMo Gym's global one, whose connection pool the rollouts may be filling).
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s))
    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(url) as response:
                return ProbeResult(base_url, True, f"HTTP {response.status}")
    except TimeoutError:
        return ProbeResult(base_url, False, f"no answer within {timeout_s:g}s")
    except aiohttp.ClientConnectorError as e:
        errno = getattr(e.os_error, "errno", None)
        reason = os.strerror(errno) if errno else str(e)
        return ProbeResult(base_url, False, f"cannot connect ({reason})")
    except aiohttp.ServerDisconnectedError:
        return ProbeResult(base_url, False, "connection closed without an answer")
    except (aiohttp.ClientError, OSError) as e:
        return ProbeResult(base_url, False, f"{type(e).__name__}: {e}")
    finally:
        await session.close()


class PolicyWatch:
    """Counts consecutive failed health probes per policy server, for one batch.

    `record(results, now)` (pure bookkeeping) resets a server's count on any answer and raises
    `PolicyServerUnreachable` once some server has failed `max_failures` probes in a row, naming each such server,
    its health URL, how long it has been failing and the last reason. `check()` probes every server concurrently
    (each bounded by `timeout_s`) and records the results. A slow server that still answers within `timeout_s`
    never counts; one probe lost to a hiccup is forgiven by the next answer.
    """

    def __init__(
        self,
        base_urls: Sequence[str],
        timeout_s: float,
        max_failures: int,
        probe: Callable[[str, float], Any] = probe_policy_server,
        clock: Callable[[], float] = time.monotonic,
    ):
        if max_failures < 1:
            raise ValueError(f"max_failures must be >= 1, got {max_failures}")
        self.base_urls = tuple(base_urls)
        self.timeout_s = timeout_s
        self.max_failures = max_failures
        self._probe = probe
        self._clock = clock
        self.failures: dict[str, int] = dict.fromkeys(self.base_urls, 0)
        self._failing_since: dict[str, float] = {}
        self.probes = 0

    def record(self, results: Sequence[ProbeResult], now: float) -> None:
        self.probes += 1
        dead = []
        for result in results:
            if result.alive:
                self.failures[result.base_url] = 0
                self._failing_since.pop(result.base_url, None)
                continue
            self.failures[result.base_url] = self.failures.get(result.base_url, 0) + 1
            since = self._failing_since.setdefault(result.base_url, now)
            if self.failures[result.base_url] >= self.max_failures:
                dead.append((result, now - since))
        if dead:
            lines = [
                f"policy server {r.base_url} did not answer GET {policy_health_url(r.base_url)} "
                f"{self.failures[r.base_url]} times in a row over {elapsed:.1f}s (last: {r.detail})"
                for r, elapsed in dead
            ]
            raise PolicyServerUnreachable("\n".join(lines), [r.base_url for r, _ in dead])

    async def check(self) -> None:
        results = await asyncio.gather(*(self._probe(url, self.timeout_s) for url in self.base_urls))
        self.record(results, self._clock())


# ------------------------------------------------------------------------------ NeMo Gym import, contained

_NG: SimpleNamespace | None = None
_NG_LOCK = threading.Lock()
_ENV_KEYS_SET_BY_NEMO_GYM = ("HF_HOME", "HF_DATASETS_CACHE", "TOKENIZERS_PARALLELISM", "UV_CACHE_DIR")


@contextlib.contextmanager
def _restore_process_globals() -> Iterator[None]:
    """Undo NeMo Gym's import/parse side effects on this process: env vars, `builtins.print`, `sys.path`."""
    env_before = {key: os.environ.get(key) for key in _ENV_KEYS_SET_BY_NEMO_GYM}
    print_before = builtins.print
    path_before = list(sys.path)
    try:
        yield
    finally:
        for key, value in env_before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        builtins.print = print_before
        # nemo_gym appends site-packages, which is on sys.path already: drop only such duplicates.
        if sys.path[: len(path_before)] == path_before:
            appended = sys.path[len(path_before) :]
            sys.path[len(path_before) :] = [p for p in appended if p not in path_before]


def nemo_gym_install_root() -> Path:
    """NeMo Gym's `PARENT_DIR` (the folder holding `nemo_gym/`, `resources_servers/`, ...), found without import."""
    spec = importlib.util.find_spec("nemo_gym")
    if spec is None or spec.origin is None:
        raise GymConfigError("nemo_gym is not installed in this environment (pip install nemo-gym==0.4.0)")
    return Path(spec.origin).resolve().parent.parent


def _nemo_gym() -> SimpleNamespace:
    global _NG
    with _NG_LOCK:
        if _NG is None:
            with _restore_process_globals():
                from nemo_gym.cli.env import RunHelper
                from nemo_gym.config_types import BaseServerConfig, ConfigError
                from nemo_gym.global_config import (
                    NEMO_GYM_RESERVED_TOP_LEVEL_KEYS,
                    GlobalConfigDictParserConfig,
                    get_global_config_dict,
                    set_global_config_dict,
                )
                from nemo_gym.rollout_collection import RolloutCollectionHelper
                from nemo_gym.server_utils import (
                    get_global_aiohttp_client,
                    get_response_json,
                    global_aiohttp_client_exit,
                    is_global_aiohttp_client_setup,
                    raise_for_status,
                )
            # nemo-gym 0.4.0 registers `global_aiohttp_client_exit` with atexit when `nemo_gym.server_utils` is
            # imported. It closes the global aiohttp session with `asyncio.run`, on a new loop, but our session lives
            # on the runtime's loop, so at exit it fails ("attached to a different loop", printed as an exception
            # ignored in atexit). The runtime closes the session on its own loop instead (`shutdown`, run at exit by
            # `_shutdown_all_live`). NeMo Gym's other atexit hook, `maybe_ray_cluster_exit`, does nothing here: it
            # stops only a Ray NeMo Gym started itself, and the runtime always hands it the running Ray's address.
            atexit.unregister(global_aiohttp_client_exit)
            _NG = SimpleNamespace(
                RunHelper=RunHelper,
                BaseServerConfig=BaseServerConfig,
                ConfigError=ConfigError,
                NEMO_GYM_RESERVED_TOP_LEVEL_KEYS=tuple(NEMO_GYM_RESERVED_TOP_LEVEL_KEYS),
                GlobalConfigDictParserConfig=GlobalConfigDictParserConfig,
                get_global_config_dict=get_global_config_dict,
                set_global_config_dict=set_global_config_dict,
                RolloutCollectionHelper=RolloutCollectionHelper,
                get_global_aiohttp_client=get_global_aiohttp_client,
                get_response_json=get_response_json,
                global_aiohttp_client_exit=global_aiohttp_client_exit,
                is_global_aiohttp_client_setup=is_global_aiohttp_client_setup,
                raise_for_status=raise_for_status,
            )
        return _NG


# ------------------------------------------------------------------------- RunHelper's private state, isolated


class _RunHelperView:
    """Reads `RunHelper`'s private attributes, the only handle on what `start` launched.

    Needed because 0.4.0 exposes no public way to get the server processes or stop the in-process head server
    after `start` raised or when `shutdown()` is not enough (it signals only the wrapper shells). Checked
    against nemo-gym 0.4.0 `nemo_gym/cli/env.py`: `_processes: Dict[str, Popen]`, `_head_server:
    uvicorn.Server`, `_head_server_thread: Thread`, all set inside `start()`.
    """

    def __init__(self, run_helper: Any):
        self._rh = run_helper

    def processes(self) -> dict[str, Any]:
        return dict(getattr(self._rh, "_processes", None) or {})

    def head_thread_alive(self) -> bool | None:
        thread = getattr(self._rh, "_head_server_thread", None)
        return None if thread is None else thread.is_alive()

    def stop_head_server(self, timeout_s: float) -> None:
        server = getattr(self._rh, "_head_server", None)
        thread = getattr(self._rh, "_head_server_thread", None)
        if server is not None:
            server.should_exit = True
        if thread is not None:
            thread.join(timeout_s)


# ------------------------------------------------------------------------------------ process-wide hooks

_LIVE: set[GymRuntime] = set()
_LIVE_LOCK = threading.RLock()
_HOOKS_INSTALLED = False


def _shutdown_all_live() -> None:
    """atexit: stop every live runtime (a trainer that never called `shutdown()`, as verl's never does)."""
    with _LIVE_LOCK:
        runtimes = list(_LIVE)
    for runtime in runtimes:
        try:
            runtime.shutdown()
        except Exception:  # at exit: stop the others regardless
            logger.exception("NeMo Gym runtime shutdown failed")


def _kill_all_live() -> None:
    """On SIGTERM: SIGKILL every live runtime's processes at once (see `GymRuntime.kill_now`)."""
    with _LIVE_LOCK:
        runtimes = list(_LIVE)
    for runtime in runtimes:
        with contextlib.suppress(Exception):  # in a signal handler: nothing may keep the others alive
            runtime.kill_now()


def _install_exit_hooks() -> None:
    """Once per process: stop live runtimes at interpreter exit and on SIGTERM, chaining the existing handler.

    Where each runs (checked with verl 0.9.1 and Ray 2.60): a trainer script that returns runs atexit. verl's
    TaskRunner is a Ray actor that nothing terminates: when `main_ppo`'s driver returns and exits, Ray sends the
    actor SIGTERM, runs its Python handler, and SIGKILLs it about 0.1 s later, so atexit never runs there and the
    SIGTERM hook must finish in that time: it only sends SIGKILL.
    """
    global _HOOKS_INSTALLED
    with _LIVE_LOCK:
        if _HOOKS_INSTALLED:
            return
        _HOOKS_INSTALLED = True
    atexit.register(_shutdown_all_live)
    if threading.current_thread() is not threading.main_thread():
        logger.warning("NeMo Gym runtime started off the main thread: no SIGTERM hook (atexit still stops it)")
        return
    previous = signal.getsignal(signal.SIGTERM)

    def _on_sigterm(signum: int, frame: Any) -> None:
        _kill_all_live()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_IGN:
            return
        else:  # SIG_DFL, or a handler installed outside Python: terminate the way SIGTERM would have
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, _on_sigterm)


# ----------------------------------------------------------------------------------------------- runtime


class GymRuntime:
    """A started NeMo Gym configuration. Build with `GymRuntime.start(spec)`; stop with `shutdown()`."""

    def __init__(self, spec: GymServersSpec, loop: BackgroundLoop | None = None):
        self.spec = spec
        self._owns_loop = loop is None
        self.loop = loop or BackgroundLoop(name="nemo-gym-loop")
        self.servers: tuple[ServerInstance, ...] = ()
        self.startup_s: float | None = None
        self._ng: SimpleNamespace | None = None
        self._view: _RunHelperView | None = None
        self._tracked: dict[int, tuple[str, psutil.Process]] = {}
        self._server_client: Any = None
        self._lock = threading.RLock()
        self._stopped = False
        self.survivors: tuple[int, ...] = ()

    # ---------------------------------------------------------------- start

    @classmethod
    def start(cls, spec: GymServersSpec, loop: BackgroundLoop | None = None) -> GymRuntime:
        """Start every server and wait until all answer HTTP; on any failure nothing started is left running."""
        check_config_paths(spec.all_config_paths, Path.cwd(), nemo_gym_install_root())
        with _LIVE_LOCK:
            live = [r for r in _LIVE if not r._stopped]
            if live:
                raise GymRuntimeError(
                    "a NeMo Gym runtime is already live in this process (head server "
                    f"{live[0].spec.head_server_host}:{live[0].spec.head_server_port}); NeMo Gym keeps one "
                    "configuration per process, so shut that one down first"
                )
            check_port_free(spec.head_server_host, spec.head_server_port)
            runtime = cls(spec, loop)
            _LIVE.add(runtime)
        _install_exit_hooks()
        try:
            runtime._start()
        except BaseException:
            runtime.shutdown()
            raise
        return runtime

    def _start(self) -> None:
        t0 = time.monotonic()
        spec = self.spec
        ng = self._ng = _nemo_gym()
        ray_address = spec.ray_head_node_address or _running_ray_address()
        cache = spec.resolved_cache_dir()
        venv_dir = spec.venv_dir or cache / "nemo_gym_venvs"
        parser_config = ng.GlobalConfigDictParserConfig(
            dotenv_path=None,
            skip_load_from_cli=True,
            skip_load_from_dotenv=not spec.load_env_yaml,
            initial_global_config_dict=_omegaconf_dict(
                build_global_config_dict(spec, ray_address, venv_dir, cache / "uv")
            ),
        )
        config = self._parse_config(parser_config)
        self.servers = tuple(server_instances(config, ng.NEMO_GYM_RESERVED_TOP_LEVEL_KEYS))
        if not self.servers:
            raise GymConfigError(f"no NeMo Gym servers in config paths {list(spec.all_config_paths)}")
        shim = write_interpreter_shim(venv_dir, sys.executable)
        link_server_venvs(venv_dir, [s.server_dir for s in self.servers], shim)

        run_helper = ng.RunHelper()
        self._view = _RunHelperView(run_helper)
        start_error: list[BaseException] = []

        def _run_start() -> None:
            try:
                run_helper.start(parser_config)  # returns the config cached by _parse_config
            except BaseException as e:  # reported by the waiting thread
                start_error.append(e)

        starter = threading.Thread(target=_run_start, name="nemo-gym-start", daemon=True)
        starter.start()
        deadline = t0 + spec.startup_timeout_s
        while True:
            starter.join(0.25)
            self._refresh_tree()
            dead = self._dead_servers()
            if dead:
                raise GymServerDied(self._died_message(dead, "during start-up"), [name for name, _ in dead])
            if self._view.head_thread_alive() is False:
                raise GymServerDied(
                    f"NeMo Gym head server {spec.head_server_host}:{spec.head_server_port} stopped during start-up",
                    ["head_server"],
                )
            if not starter.is_alive():
                if start_error:
                    raise GymRuntimeError(f"NeMo Gym RunHelper.start failed: {start_error[0]!r}") from start_error[0]
                break
            if time.monotonic() > deadline:
                not_ready = [s.name for s in self.servers if not (s.host and http_alive(s.host, s.port, 1.0))]
                raise GymStartTimeout(
                    f"NeMo Gym servers not ready within {spec.startup_timeout_s:g}s; not answering HTTP: "
                    f"{not_ready or 'none (start-up was still finishing)'}",
                    not_ready,
                )
        self._refresh_tree()
        self.startup_s = time.monotonic() - t0
        logger.info("NeMo Gym: %d servers ready in %.1fs", len(self.servers), self.startup_s)

    def _parse_config(self, parser_config: Any) -> dict[str, Any]:
        """Parse once, replacing NeMo Gym's process-wide config cache (public `set_global_config_dict`)."""
        from omegaconf import OmegaConf

        ng = self._ng
        try:
            with _restore_process_globals():
                ng.set_global_config_dict(global_config_dict_parser_config=parser_config)
        except ng.ConfigError as e:
            raise GymConfigError(f"NeMo Gym rejected the configuration: {e}") from e
        return OmegaConf.to_container(ng.get_global_config_dict(), resolve=True)

    # ---------------------------------------------------------------- processes and health

    def _refresh_tree(self) -> None:
        """Remember every process under each server's wrapper, so none is lost if its parent dies first."""
        if self._view is None:
            return
        for name, popen in self._view.processes().items():
            if popen.poll() is not None:
                continue
            try:
                root = psutil.Process(popen.pid)
                family = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            for proc in family:
                known = self._tracked.get(proc.pid)
                if known is None or not known[1].is_running():
                    self._tracked[proc.pid] = (name, proc)

    def _dead_servers(self) -> list[tuple[str, int]]:
        if self._view is None:
            return []
        return [(name, popen.returncode) for name, popen in self._view.processes().items() if popen.poll() is not None]

    def _died_message(self, dead: Sequence[tuple[str, int]], when: str) -> str:
        parts = []
        for name, code in dead:
            how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            parts.append(f"NeMo Gym server {name!r} {how} {when}.{log_tail(self.spec.log_dir, name)}")
        return "\n".join(parts)

    @property
    def agent_names(self) -> frozenset[str]:
        """The agent servers rows can name in `agent_ref.name`."""
        return frozenset(s.name for s in self.servers if s.server_type == AGENT_SERVER_TYPE)

    def pids(self) -> dict[int, str]:
        """Every live process this runtime started (server wrappers and their descendants), by pid."""
        self._refresh_tree()
        return {pid: name for pid, (name, proc) in self._tracked.items() if _alive(proc)}

    def health(self, http_timeout_s: float | None = None) -> HealthReport:
        """Process liveness of every server (and, with `http_timeout_s`, whether each answers HTTP)."""
        if self._stopped:
            return HealthReport(tuple(ServerHealth(s.name, False, "runtime shut down") for s in self.servers))
        self._refresh_tree()
        exits = dict(self._dead_servers())
        started = set(self._view.processes()) if self._view else set()
        report = []
        for server in self.servers:
            if server.name in exits:
                code = exits[server.name]
                how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
                report.append(ServerHealth(server.name, False, f"process {how}"))
            elif server.name not in started:
                report.append(ServerHealth(server.name, False, "process never started"))
            elif http_timeout_s is not None and not http_alive(server.host, server.port, http_timeout_s):
                report.append(ServerHealth(server.name, False, f"no HTTP answer at {server.url}"))
            else:
                report.append(ServerHealth(server.name, True, "running"))
        if self._view is not None and self._view.head_thread_alive() is False:
            report.append(ServerHealth("head_server", False, "head server thread stopped"))
        return HealthReport(tuple(report))

    def check_health(self, http_timeout_s: float | None = None) -> None:
        """Raise `GymServerDied` naming every dead server; cheap enough to call every few seconds."""
        if self._stopped:
            raise GymServerDied("NeMo Gym runtime is shut down", [s.name for s in self.servers])
        report = self.health(http_timeout_s)
        if not report.ok:
            exits = dict(self._dead_servers())
            lines = []
            for s in report.servers:
                if not s.alive:
                    tail = log_tail(self.spec.log_dir, s.name) if s.name in exits else ""
                    lines.append(f"NeMo Gym server {s.name!r}: {s.detail}.{tail}")
            raise GymServerDied("\n".join(lines), report.dead)

    # ---------------------------------------------------------------- rollouts

    async def collect(
        self,
        examples: Sequence[Mapping[str, Any]],
        deadline_s: float,
        max_concurrency: int | None = None,
        health_check_interval_s: float = 2.0,
    ) -> list[dict[str, Any] | EpisodeFailure]:
        """Run every row on its agent; results in input order. Awaitable from any event loop."""
        self._check_not_stopped()
        return await self.loop.arun(self._collect(examples, deadline_s, max_concurrency, health_check_interval_s))

    def collect_sync(
        self,
        examples: Sequence[Mapping[str, Any]],
        deadline_s: float,
        max_concurrency: int | None = None,
        health_check_interval_s: float = 2.0,
    ) -> list[dict[str, Any] | EpisodeFailure]:
        """`collect` for callers without an event loop (the batch deadline bounds it; the loop timeout backs it)."""
        self._check_not_stopped()
        coro = self._collect(examples, deadline_s, max_concurrency, health_check_interval_s)
        return self.loop.run(coro, timeout=deadline_s + 30.0, what="NeMo Gym batch")

    async def _collect(
        self,
        examples: Sequence[Mapping[str, Any]],
        deadline_s: float,
        max_concurrency: int | None,
        health_check_interval_s: float,
    ) -> list[dict[str, Any] | EpisodeFailure]:
        self._check_not_stopped()
        ng = self._ng
        validate_examples(examples, self.agent_names)
        if self._server_client is None:
            head = ng.BaseServerConfig(host=self.spec.head_server_host, port=self.spec.head_server_port)
            # One blocking GET of the head server's config, once per runtime (0.4.0's `run_examples` does it per call).
            self._server_client = ng.RolloutCollectionHelper().setup_server_client(head)

        watch = PolicyWatch(
            self.spec.policy_base_urls, self.spec.policy_health_timeout_s, self.spec.policy_health_failures
        )

        async def health() -> None:
            self.check_health()
            # NeMo Gym's model server retries a policy server that does not answer forever: watch those too.
            await watch.check()

        return await run_examples_in_order(
            examples,
            post_run=_make_post_run(self._server_client, ng),
            deadline_s=deadline_s,
            health_check=health,
            health_check_interval_s=health_check_interval_s,
            max_concurrency=max_concurrency,
            progress=ProgressLine(),
        )

    def _check_not_stopped(self) -> None:
        if self._stopped:
            raise RolloutAborted("NeMo Gym runtime is shut down: no batch can run")

    # ---------------------------------------------------------------- shutdown

    def shutdown(self) -> None:
        """Stop the head server and every process started; leave none behind. Idempotent.

        The processes go first: nothing after them (closing the HTTP session, which touches the event loop) can
        keep a server alive. Creates a thread only when called from a thread that runs an event loop (see
        `_close_client_session`), never at interpreter exit.
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        try:
            try:
                if self._view is not None:
                    self._view.stop_head_server(timeout_s=5.0)
            finally:
                self._kill_everything()
            self._close_client_session()
            if self._owns_loop and not self.loop.in_loop_thread():
                self.loop.close()
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(self)

    def kill_now(self) -> None:
        """SIGKILL every process started, without waiting or touching the event loop; for a SIGTERM of this process.

        A trainer being terminated has little time left: Ray SIGKILLs an actor ~0.1 s after its SIGTERM (measured
        with Ray 2.60 for verl's TaskRunner, whose owner, the `main_ppo` driver, exited), so a grace period would be
        cut short, and the servers hold nothing worth a graceful exit (environment state lives per episode). The
        head server is a thread of this process and ends with it. Idempotent; later `shutdown()` calls do nothing.
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        try:
            self._refresh_tree()
            # list() copies in one step: a health check on the loop thread may be refreshing the table meanwhile.
            for _, proc in list(self._tracked.values()):
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(self)

    def _close_client_session(self) -> None:
        """Close NeMo Gym's global HTTP session on the loop it belongs to, and clear NeMo Gym's global. Never raises."""
        ng = self._ng
        if ng is None or not ng.is_global_aiohttp_client_setup():
            return

        async def _close() -> None:
            await ng.get_global_aiohttp_client().close()

        if not self.loop.closed:
            with contextlib.suppress(Exception):
                self.loop.run(_close(), timeout=5.0, what="closing NeMo Gym's aiohttp session")
        # NeMo Gym's public reset, `global_aiohttp_client_exit`, clears its global so the next runtime creates a
        # session on its own loop. It calls asyncio.run on the (now closed, so no-op) session, which refuses to run
        # on a thread whose event loop is running: only there is a short-lived thread needed. Elsewhere, notably at
        # interpreter exit, where no new thread can start, it runs here.
        try:
            asyncio.get_running_loop()
            in_a_loop = True
        except RuntimeError:
            in_a_loop = False
        try:
            if in_a_loop:
                resetter = threading.Thread(
                    target=ng.global_aiohttp_client_exit, name="nemo-gym-session-reset", daemon=True
                )
                resetter.start()
                resetter.join(5.0)
            else:
                ng.global_aiohttp_client_exit()
        except Exception as e:  # noqa: BLE001 - the servers are already stopped; a stale global is all that is left
            logger.debug("could not reset NeMo Gym's aiohttp session: %r", e)
        self._server_client = None

    def _kill_everything(self) -> None:
        self._refresh_tree()
        procs = [proc for _, proc in self._tracked.values() if _alive(proc)]
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        _, alive = psutil.wait_procs(procs, timeout=self.spec.shutdown_grace_s)
        alive = [p for p in alive if _alive(p)]
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        _, alive = psutil.wait_procs(alive, timeout=5.0)
        if self._view is not None:
            for popen in self._view.processes().values():
                with contextlib.suppress(Exception):
                    popen.wait(timeout=1.0)  # reap the wrappers (our children) so no zombie stays
        self.survivors = tuple(p.pid for p in alive if _alive(p))
        if self.survivors:
            logger.error("NeMo Gym processes survived SIGKILL: %s", self.survivors)

    def __enter__(self) -> GymRuntime:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


# ------------------------------------------------------------------------------------------- rollouts core


async def run_examples_in_order(
    examples: Sequence[Mapping[str, Any]],
    post_run: Callable[[int, Mapping[str, Any]], Any],
    deadline_s: float,
    health_check: Callable[[], Any] | None = None,
    health_check_interval_s: float = 2.0,
    max_concurrency: int | None = None,
    progress: Callable[[int, int, int], None] | None = None,
) -> list[dict[str, Any] | EpisodeFailure]:
    """Run `post_run(index, row)` for every row concurrently; return outcomes in input order.

    `progress(done, failed, total)`, when given, is called after every wake-up of the wait loop (at least every
    `health_check_interval_s` while rows are pending, and once when all are done).

    Each row's outcome is tied to its index by the task that ran it, not by a field of the result: in 0.4.0
    no field a caller adds to a row survives into `simple_agent`'s result (its verify response drops them).

    `post_run` returns the row's result dict or an `EpisodeFailure`. `health_check` (a function, or a coroutine
    function) runs before the first request and every `health_check_interval_s` while rows are pending; if it
    raises `GymServerDied`, or `deadline_s` passes, every pending request is cancelled and `RolloutAborted` is
    raised.
    """
    if deadline_s <= 0:
        raise ValueError(f"deadline_s must be positive, got {deadline_s}")
    n = len(examples)
    outcomes: list[dict[str, Any] | EpisodeFailure | None] = [None] * n
    if n == 0:
        return []
    semaphore = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async def one(i: int) -> dict[str, Any] | EpisodeFailure:
        if semaphore is None:
            return await post_run(i, examples[i])
        async with semaphore:
            return await post_run(i, examples[i])

    loop = asyncio.get_running_loop()
    if health_check is not None:
        await _health_or_abort(health_check, pending=n, total=n)
    deadline = loop.time() + deadline_s
    tasks = {asyncio.create_task(one(i), name=f"nemo-gym-row-{i}"): i for i in range(n)}
    pending = set(tasks)
    failed = 0
    try:
        while pending:
            remaining = deadline - loop.time()
            if remaining <= 0:
                rows = sorted(tasks[t] for t in pending)
                shown = ", ".join(map(str, rows[:10])) + (", ..." if len(rows) > 10 else "")
                raise RolloutAborted(
                    f"NeMo Gym batch passed its deadline of {deadline_s:g}s with {len(pending)} of {n} episodes "
                    f"pending (rows {shown}); they were cancelled"
                )
            done, pending = await asyncio.wait(
                pending, timeout=min(health_check_interval_s, remaining), return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                outcome = outcomes[tasks[task]] = task.result()
                failed += isinstance(outcome, EpisodeFailure)
            if progress is not None:
                progress(n - len(pending), failed, n)
            if pending and health_check is not None:
                await _health_or_abort(health_check, pending=len(pending), total=n)
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5.0)
    return outcomes  # type: ignore[return-value]  # every slot is filled once no task is pending


class ProgressLine:
    """Logs "NeMo Gym rollout: <done>/<total> episodes done (<failed> failed), <t> s" while a batch runs.

    At most one line every `interval_s`, plus the line for the last episode, so a long batch shows it is moving
    without flooding the console. Logged at WARNING level: verl 0.9.1 sets the root logger to WARNING in every
    process, and this line is meant to be seen.
    """

    def __init__(self, interval_s: float = 15.0, clock: Callable[[], float] = time.monotonic):
        self.interval_s = interval_s
        self.clock = clock
        self.started = clock()
        self.last_logged = self.started

    def __call__(self, done: int, failed: int, total: int) -> None:
        now = self.clock()
        if done < total and now - self.last_logged < self.interval_s:
            return
        self.last_logged = now
        logger.warning(
            "NeMo Gym rollout: %d/%d episodes done (%d failed), %.0f s", done, total, failed, now - self.started
        )


async def _health_or_abort(health_check: Callable[[], Any], pending: int, total: int) -> None:
    try:
        outcome = health_check()
        if inspect.isawaitable(outcome):
            await outcome
    except PolicyServerUnreachable as e:
        raise RolloutAborted(
            f"policy server(s) {list(e.servers)} unreachable with {pending} of {total} episodes pending (NeMo Gym "
            f"retries an unreachable policy server forever, so the batch was aborted):\n{e}"
        ) from e
    except GymServerDied as e:
        raise RolloutAborted(
            f"NeMo Gym server(s) {list(e.servers)} died with {pending} of {total} episodes pending:\n{e}"
        ) from e


def _make_post_run(server_client: Any, ng: SimpleNamespace) -> Callable[[int, Mapping[str, Any]], Any]:
    from aiohttp import ClientError, ClientResponseError

    async def post_run(index: int, row: Mapping[str, Any]) -> dict[str, Any] | EpisodeFailure:
        agent = row["agent_ref"]["name"]
        try:
            response = await server_client.post(server_name=agent, url_path="/run", json=row)
            await ng.raise_for_status(response)
            result = await ng.get_response_json(response)
        except ClientResponseError as e:
            return server_error_failure(index, agent, e.status, getattr(e, "response_content", None) or e.message)
        except (ClientError, ValueError) as e:  # a broken connection mid-body, or a body that is not JSON
            return server_error_failure(index, agent, None, repr(e))
        if not isinstance(result, dict):
            return server_error_failure(index, agent, response.status, f"result is not a JSON object: {result!r}")
        return context_overflow_failure(index, result) or result

    return post_run


# ----------------------------------------------------------------------------------------------- helpers


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _running_ray_address() -> str:
    import ray

    if not ray.is_initialized():
        raise GymConfigError(
            "GymServersSpec.ray_head_node_address is not set and this process is not connected to Ray: "
            "give the address of the running Ray head (e.g. ray.get_runtime_context().gcs_address)"
        )
    return ray.get_runtime_context().gcs_address


def _omegaconf_dict(config: dict[str, Any]) -> Any:
    from omegaconf import DictConfig

    return DictConfig(config)
