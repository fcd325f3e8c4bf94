# SPDX-License-Identifier: Apache-2.0
"""Every place the plugin touches NeMo Gym's internals or mirrors one of its rules; each names the version read.

Contract:
- `nemo_gym` is imported only by `load_nemo_gym()` (lazily, once per process, never at this module's import),
  and what it and config parsing do to this process is undone (`restore_process_globals`): importing it sets
  `HF_HOME`, `HF_DATASETS_CACHE` (to `<cwd>/cache/huggingface`) and `TOKENIZERS_PARALLELISM`, replaces
  `builtins.print` and appends site-packages to `sys.path`; parsing a config sets `UV_CACHE_DIR`. The servers,
  being separate processes, keep NeMo Gym's defaults. Still global once imported: two OmegaConf resolvers
  (`inherit_from`, `copy`), `wandb.util.VALUE_BYTES_LIMIT`, and the atexit hook `maybe_ray_cluster_exit` (a no-op
  here). Its other atexit hook is unregistered (see `load_nemo_gym`).
- `nemo_gym_install_root()` is the one lookup of NeMo Gym's root (its `PARENT_DIR`), without importing it.
- `resolve_config_path` / `check_config_paths` are the one config-path rule: NeMo Gym's own.
- `RunHelperView` is the only reader of `RunHelper`'s private state.
- `server_instances`, `log_tail` and the venv shim mirror what `RunHelper.start` and `run_command` do.
"""

from __future__ import annotations

import asyncio
import atexit
import builtins
import contextlib
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipe.nemo_gym.event_loop import BackgroundLoop
from recipe.nemo_gym.gym.errors import GymConfigError
from recipe.nemo_gym.gym.spec import ServerInstance

logger = logging.getLogger(__name__)

_SHIM_DIR_NAME = "_interpreter_shim"
_ENV_KEYS_SET_BY_NEMO_GYM = ("HF_HOME", "HF_DATASETS_CACHE", "TOKENIZERS_PARALLELISM", "UV_CACHE_DIR")


# ------------------------------------------------------------------------------------ install root, paths


def nemo_gym_install_root() -> Path:
    """NeMo Gym's `PARENT_DIR` (the folder holding `nemo_gym/`, `resources_servers/`, ...), found without import."""
    spec = importlib.util.find_spec("nemo_gym")
    if spec is None or spec.origin is None:
        raise GymConfigError("nemo_gym is not installed in this environment (pip install nemo-gym==0.4.0)")
    return Path(spec.origin).resolve().parent.parent


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
            missing.append(f"{path!r} (looked in: {', '.join(str(p) for p in looked)})")
        else:
            resolved.append(found)
    if missing:
        raise GymConfigError("NeMo Gym config path(s) not found: " + "; ".join(missing))
    return resolved


# ------------------------------------------------------------------------------ NeMo Gym import, contained


@contextlib.contextmanager
def restore_process_globals() -> Iterator[None]:
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


@dataclass(frozen=True)
class NeMoGymAPI:
    """The parts of nemo-gym 0.4.0 the runtime calls (public unless `RunHelperView` says otherwise)."""

    RunHelper: type
    BaseServerConfig: type
    ConfigError: type[Exception]
    reserved_top_level_keys: tuple[str, ...]
    GlobalConfigDictParserConfig: type
    get_global_config_dict: Callable[..., Any]
    set_global_config_dict: Callable[..., Any]
    RolloutCollectionHelper: type
    get_global_aiohttp_client: Callable[[], Any]
    get_response_json: Callable[[Any], Any]
    global_aiohttp_client_exit: Callable[[], None]
    is_global_aiohttp_client_setup: Callable[[], bool]
    raise_for_status: Callable[[Any], Any]


_API: NeMoGymAPI | None = None
_API_LOCK = threading.Lock()


def load_nemo_gym() -> NeMoGymAPI:
    """Import nemo_gym once per process, its side effects on this process undone."""
    global _API
    with _API_LOCK:
        if _API is None:
            with restore_process_globals():
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
            # ignored in atexit). The runtime closes the session on its own loop instead (`close_global_session`,
            # run at exit by the runtime's shutdown). NeMo Gym's other atexit hook, `maybe_ray_cluster_exit`, does
            # nothing here: it stops only a Ray NeMo Gym started itself, and the runtime always hands it the running
            # Ray's address.
            atexit.unregister(global_aiohttp_client_exit)
            _API = NeMoGymAPI(
                RunHelper=RunHelper,
                BaseServerConfig=BaseServerConfig,
                ConfigError=ConfigError,
                reserved_top_level_keys=tuple(NEMO_GYM_RESERVED_TOP_LEVEL_KEYS),
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
        return _API


def parser_config(api: NeMoGymAPI, config: dict[str, Any], load_env_yaml: bool) -> Any:
    """NeMo Gym's parser settings: `config` over the config files; no CLI, and `env.yaml` only on request."""
    from omegaconf import DictConfig

    return api.GlobalConfigDictParserConfig(
        dotenv_path=None,
        skip_load_from_cli=True,
        skip_load_from_dotenv=not load_env_yaml,
        initial_global_config_dict=DictConfig(config),
    )


def parse_config(api: NeMoGymAPI, parser_settings: Any) -> dict[str, Any]:
    """Parse once, replacing NeMo Gym's process-wide config cache (public `set_global_config_dict`), which
    `RunHelper.start` then reads back instead of parsing again."""
    from omegaconf import OmegaConf

    try:
        with restore_process_globals():
            api.set_global_config_dict(global_config_dict_parser_config=parser_settings)
    except api.ConfigError as e:
        raise GymConfigError(f"NeMo Gym rejected the configuration: {e}") from e
    return OmegaConf.to_container(api.get_global_config_dict(), resolve=True)


def server_client(api: NeMoGymAPI, host: str, port: int) -> Any:
    """NeMo Gym's client for its servers, made by the public `RolloutCollectionHelper.setup_server_client`.

    One blocking GET of the head server's config; 0.4.0's `run_examples` does it on every call, so the runtime
    keeps the client for its lifetime.
    """
    return api.RolloutCollectionHelper().setup_server_client(api.BaseServerConfig(host=host, port=port))


def close_global_session(api: NeMoGymAPI, loop: BackgroundLoop) -> None:
    """Close NeMo Gym's global HTTP session on the loop it belongs to, and clear NeMo Gym's global. Never raises."""
    if not api.is_global_aiohttp_client_setup():
        return

    async def _close() -> None:
        await api.get_global_aiohttp_client().close()

    if not loop.closed:
        with contextlib.suppress(Exception):
            loop.run(_close(), timeout=5.0, what="closing NeMo Gym's aiohttp session")
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
                target=api.global_aiohttp_client_exit, name="nemo-gym-session-reset", daemon=True
            )
            resetter.start()
            resetter.join(5.0)
        else:
            api.global_aiohttp_client_exit()
    except Exception as e:  # noqa: BLE001 - the servers are already stopped; a stale global is all that is left
        logger.debug("could not reset NeMo Gym's aiohttp session: %r", e)


# ------------------------------------------------------------------------- RunHelper's private state, isolated


class RunHelperView:
    """Reads `RunHelper`'s private attributes, the only handle on what `start` launched.

    Needed because 0.4.0 exposes no public way to get the server processes or stop the in-process head server
    after `start` raised or when `shutdown()` is not enough (it signals only the wrapper shells, which with
    `nemo_gym_log_dir` set leaves the servers running). Checked against nemo-gym 0.4.0 `nemo_gym/cli/env.py`:
    `_processes: Dict[str, Popen]`, `_head_server: uvicorn.Server`, `_head_server_thread: Thread`, all set
    inside `start()`.
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


# ---------------------------------------------------------------------------- what RunHelper.start launches


def server_instances(config: Mapping[str, Any], reserved_keys: Collection[str]) -> list[ServerInstance]:
    """The servers `RunHelper.start` launches: top-level `{type: {implementation: {entrypoint, ...}}}` entries.

    Mirrors nemo-gym 0.4.0's loop in `RunHelper.start`, not `GlobalConfigDictParser.filter_for_server_instance_configs`:
    that filter validates each server's full pydantic config and `start` does not use it, so it can miss a
    server `start` launches.
    """
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


def write_interpreter_shim(venv_dir: Path, python: str) -> Path:
    """A venv-shaped folder whose `bin/python` runs `python` and whose `bin/activate` puts it first on PATH.

    NeMo Gym 0.4.0 skips building a server's venv when `<uv_venv_dir>/<type>/<impl>/.venv/bin/{python,activate}`
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
