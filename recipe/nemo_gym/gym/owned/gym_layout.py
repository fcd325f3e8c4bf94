# SPDX-License-Identifier: Apache-2.0
"""NeMo Gym's file layout as the plugin must know it (its root, config paths, server venvs, log files): every place
the plugin mirrors one of NeMo Gym's rules without importing it; each names the version read.

Contract:
- `nemo_gym_install_root(environment)` is the one lookup of Gym's root (its `PARENT_DIR`) in the Gym
  environment the plugin runs (`environment.py`), asked of that environment's interpreter.
- `resolve_config_path` / `check_config_paths` are the one config-path rule: Gym's own (0.4.0 and 0.7.0).
- `log_tail` reads the log file Gym writes per server (`run_command`, same naming in 0.4.0 and 0.7.0);
  `file_tail` any log's last lines without uvicorn's access lines.
- `write_interpreter_shim` / `link_server_venvs` / `server_dirs` mirror how Gym finds a server's venv
  (`get_venv_path` / `setup_env_command`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path

from recipe.nemo_gym.config import NeMoGymSection
from recipe.nemo_gym.gym.errors import GymConfigError

_SHIM_DIR_NAME = "_interpreter_shim"
# The folders Gym runs servers from, `<type>/<implementation>` under its root or the current directory.
SERVER_TYPES = ("responses_api_models", "resources_servers", "responses_api_agents", "environment_servers")


# ------------------------------------------------------------------------------------ install root, paths


def nemo_gym_install_root(environment: str | os.PathLike | None = None) -> Path:
    """Gym's `PARENT_DIR` (the folder holding `nemo_gym/`, `resources_servers/`, ...) in the Gym environment
    `environment` names (`environment.locate_environment`'s rule: the YAML's value, `$NEMO_GYM_ENV`, default)."""
    from recipe.nemo_gym.gym.owned.environment import locate_environment

    return _install_root(locate_environment(environment))


@functools.lru_cache(maxsize=8)
def _install_root(python: Path) -> Path:
    from recipe.nemo_gym.gym.owned.environment import inspect_environment

    return inspect_environment(python).install_root


def resolve_config_path(path: str, cwd: Path, install_root: Path) -> Path | None:
    """Where NeMo Gym reads a config path from (`load_extra_config_paths`, 0.4.0 and 0.7.0), or None if nowhere."""
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


def section_root(section: NeMoGymSection) -> Path:
    """NeMo Gym's root for the environments file's `nemo_gym` section: its `root` when set, else the root of the Gym
    environment it names (`nemo_gym_install_root`)."""
    if section.root is not None:
        return section.root
    try:
        return nemo_gym_install_root(section.environment)
    except GymConfigError as e:
        raise GymConfigError(f"nemo_gym.root is not set and {e}") from e


def section_config_paths(section: NeMoGymSection) -> list[Path]:
    """Where each of the section's `config_paths` is read from, by the rule the runtime checks before it starts
    anything (`check_config_paths`: absolute as given, else the current directory, then NeMo Gym's root)."""
    try:
        return check_config_paths(section.rooted_config_paths(), Path.cwd(), nemo_gym_install_root(section.environment))
    except GymConfigError as e:
        raise GymConfigError(f"nemo_gym.config_paths: {e}") from e


# A uvicorn access-log line ("INFO:     127.0.0.1:4242 - "GET /health HTTP/1.1" 503 ..."): the head server logs
# every readiness poll of ours, which would fill a log's tail with nothing but our own requests.
_ACCESS_LINE = re.compile(r'^(\([^)]*\) )?INFO: +\S+ - "[A-Z]+ \S+ HTTP/')


def file_tail(path: Path | None, lines: int = 30) -> str:
    """The last `lines` lines of a log file, access-log lines left out, headed by its path; "" when there is none."""
    if path is None:
        return ""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    kept = [line for line in text.splitlines() if not _ACCESS_LINE.match(line)]
    tail = "\n".join(kept[-lines:])
    return f"\n--- last lines of {path} (HTTP access lines left out) ---\n{tail}" if tail else ""


def log_tail(log_dir: Path | None, server: str, lines: int = 20) -> str:
    """The last lines of a server's NeMo Gym log file (named as `run_command` names it), if any (`file_tail`)."""
    return "" if log_dir is None else file_tail(log_dir / f"{server.replace('/', '_')}.log", lines)


def default_venv_dir(cache: Path, python: str) -> Path:
    """Where the venv links for Gym's environment `python` live unless `nemo_gym.venv_dir` says: a folder per
    interpreter, so that two stacks on one machine with different Gym environments (a job on Gym 0.4 beside one on
    0.7) never run each other's interpreter through a shared shim."""
    return cache / "nemo_gym_venvs" / hashlib.sha256(python.encode()).hexdigest()[:12]


def write_interpreter_shim(venv_dir: Path, python: str) -> Path:
    """A venv-shaped folder whose `bin/python` runs `python` and whose `bin/activate` puts it first on PATH.

    NeMo Gym skips building a server's venv when `<uv_venv_dir>/<type>/<impl>/.venv/bin/{python,activate}` exist
    (`skip_venv_if_present`), then runs `source .venv/bin/activate && python app.py` (0.4.0) or
    `.venv/bin/python app.py` (0.7.0). The shim makes either run the Gym environment's interpreter, whatever
    kind of environment that is (venv, conda, system Python), and, being ours, keeps Gym from ever writing into
    the environment itself. `exec` keeps the server's pid.
    """
    shim = venv_dir / _SHIM_DIR_NAME
    bin_dir = shim / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    _write_atomically(bin_dir / "python", f'#!/bin/sh\nexec "{python}" "$@"\n', mode=0o755)
    _write_atomically(bin_dir / "activate", f'export PATH="{bin_dir}:$PATH"\n', mode=0o644)
    return shim


EXTRA_ROOTS_ENV = "NEMO_GYM_EXTRA_ROOTS"
"""Gym 0.7's list of further folders (`os.pathsep`-separated) it looks for `<server type>/<name>` server folders
under, before the current directory and its own root (`nemo_gym.extra_roots`, read at start-up by every server)."""


def extra_roots(environ: Mapping[str, str]) -> list[Path]:
    """The folders `$NEMO_GYM_EXTRA_ROOTS` names, in order (pure): their servers need venv links too."""
    return [Path(p) for p in environ.get(EXTRA_ROOTS_ENV, "").split(os.pathsep) if p]


def server_dirs(roots: Iterable[Path]) -> list[tuple[str, str]]:
    """Every `(<type>, <implementation>)` server folder under `roots` (Gym's root, the current directory).

    Every server folder gets its venv link, not only those a configuration names: which servers run is known
    only once Gym has parsed the configuration (0.7 adds an environment server per agent, `inherit_from` pulls
    in others), and a link is a few bytes.
    """
    found = set()
    for root in roots:
        for server_type in SERVER_TYPES:
            with contextlib.suppress(OSError):
                for entry in (root / server_type).iterdir():
                    if entry.is_dir() and not entry.name.startswith(("_", ".")):
                        found.add((server_type, entry.name))
    return sorted(found)


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
