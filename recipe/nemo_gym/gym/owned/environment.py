# SPDX-License-Identifier: Apache-2.0
"""The Python environment NeMo Gym runs from, outside the trainer: where it is, which Gym it holds, how to start it.

Contract:
- NeMo Gym never runs in the trainer's interpreter. Since 0.5 it needs Python >= 3.13.14 and verl 0.9.1 needs
  < 3.13, so Gym lives in an environment of its own (`./setup.sh` builds `.venv-gym` with Gym 0.7) and is
  started as a separate process tree; the plugin speaks to it over HTTP only (`client.py`).
- `locate_environment(configured)` picks the environment: the environments file's `nemo_gym.environment`, else
  `$NEMO_GYM_ENV`, else `<repository>/.venv-gym`. A venv folder or its Python executable are both accepted.
- `inspect_environment(python)` asks that interpreter, in one short subprocess that imports no Gym code (only
  `importlib.metadata` and `find_spec`), which nemo-gym it holds and where Gym's files are. What it reports
  is what the launcher runs: the version of the running Gym, never a configured one.
- `check_supported(version)` refuses, naming the version and the supported range, any Gym outside it.
- `launcher_argv(env, config_paths)` is the command that starts Gym's head server and every server of a
  configuration, for the version found (`gym env start` from 0.7, `ng_run` before); pure.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from recipe.nemo_gym.gym.errors import GymConfigError

ENV_VAR = "NEMO_GYM_ENV"
DEFAULT_ENV_DIR_NAME = ".venv-gym"
# The Gym releases this plugin runs, as (major, minor) pairs; each was tested here (0.4.0 and 0.7.0).
SUPPORTED_MINORS: tuple[tuple[int, int], ...] = ((0, 4), (0, 7))
SUPPORTED_DESCRIPTION = "nemo-gym 0.4.x or 0.7.x (tested: 0.4.0, 0.7.0)"

# Run by the Gym environment's own interpreter. find_spec of a top-level package reads no module of it.
_INSPECT = """
import importlib.metadata, importlib.util, json, platform, sys
spec = importlib.util.find_spec("nemo_gym")
try:
    version = importlib.metadata.version("nemo-gym")
except importlib.metadata.PackageNotFoundError:
    version = None
origin = spec.origin if spec is not None else None
print(json.dumps({"version": version, "origin": origin, "python_version": platform.python_version(),
                  "prefix": sys.prefix}))
"""


class GymVersionError(GymConfigError):
    """The Gym environment holds a nemo-gym release this plugin does not run."""


@dataclass(frozen=True)
class GymEnvironment:
    """One Python environment holding NeMo Gym, as its interpreter reported it."""

    python: Path
    version: str
    install_root: Path
    """Gym's `PARENT_DIR`: the folder holding `nemo_gym/`, `resources_servers/`, `responses_api_agents/`, ..."""
    python_version: str

    @property
    def bin_dir(self) -> Path:
        return self.python.parent

    @property
    def minor(self) -> tuple[int, int]:
        return parse_minor(self.version)


def parse_minor(version: str) -> tuple[int, int]:
    """`(major, minor)` of a version string such as `0.7.0` or `0.7.0rc1`; a `GymVersionError` if unreadable."""
    parts = version.split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or "x")
    except (IndexError, ValueError):
        raise GymVersionError(f"cannot read the nemo-gym version {version!r}") from None


def check_supported(version: str, where: str = "the NeMo Gym environment") -> None:
    """Raise `GymVersionError`, naming the version and the supported range, unless the plugin runs this Gym."""
    if parse_minor(version) not in SUPPORTED_MINORS:
        raise GymVersionError(
            f"{where} holds nemo-gym {version}, which this plugin does not run; supported: {SUPPORTED_DESCRIPTION}. "
            "Rebuild it with ./setup.sh, or point nemo_gym.environment at an environment holding a supported release."
        )


def default_environment_dir() -> Path:
    """`<repository>/.venv-gym`, where `./setup.sh` builds Gym's environment (this file: recipe/nemo_gym/gym/owned/)."""
    return Path(__file__).resolve().parents[4] / DEFAULT_ENV_DIR_NAME


def locate_environment(configured: str | os.PathLike | None) -> Path:
    """The Python executable of the Gym environment: `configured`, else `$NEMO_GYM_ENV`, else the default folder.

    A folder is taken as a venv (`<folder>/bin/python`); a relative path resolves against the current directory.
    """
    if configured:
        source, raw = "nemo_gym.environment", Path(configured)
    elif os.environ.get(ENV_VAR):
        source, raw = f"${ENV_VAR}", Path(os.environ[ENV_VAR])
    else:
        source, raw = "the default NeMo Gym environment", default_environment_dir()
    path = raw.expanduser().absolute()
    python = path / "bin" / "python" if path.is_dir() else path
    if not (python.is_file() and os.access(python, os.X_OK)):
        raise GymConfigError(
            f"{source}: no Python interpreter at {python} (from {raw}). Build the NeMo Gym environment with "
            f"./setup.sh, or set nemo_gym.environment (or ${ENV_VAR}) to a venv holding nemo-gym"
        )
    return python


def inspect_environment(python: Path, timeout_s: float = 60.0) -> GymEnvironment:
    """Ask `python` which nemo-gym it holds and where; `GymConfigError` naming the interpreter on any failure."""
    try:
        done = subprocess.run(
            [str(python), "-I", "-c", _INSPECT],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            env=clean_environment(os.environ),
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise GymConfigError(f"could not run the NeMo Gym environment's Python {python}: {e}") from e
    if done.returncode != 0:
        raise GymConfigError(
            f"the NeMo Gym environment's Python {python} failed (exit {done.returncode}): {done.stderr.strip()[-500:]}"
        )
    info = json.loads(done.stdout.strip().splitlines()[-1])
    if info["version"] is None or info["origin"] is None:
        raise GymConfigError(f"nemo-gym is not installed in the environment of {python} ({info['prefix']})")
    check_supported(info["version"], where=f"the NeMo Gym environment {info['prefix']}")
    return GymEnvironment(
        python=python,
        version=info["version"],
        install_root=Path(info["origin"]).resolve().parent.parent,
        python_version=info["python_version"],
    )


def clean_environment(environ: dict[str, str] | os._Environ) -> dict[str, str]:
    """The trainer's environment variables as Gym's processes get them (pure).

    Dropped: every `RAY_*` (Ray joins the cluster such a variable names, verl's, instead of starting Gym's own);
    `PYTHONPATH`, `PYTHONHOME` and `VIRTUAL_ENV` (they point at the trainer's Python 3.12 packages, which an
    interpreter of another version must not import).
    """
    dropped = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}
    return {k: v for k, v in environ.items() if not k.startswith("RAY_") and k not in dropped}


# Gym's launcher runs under this script (Gym's own Python runs it): a lean private Ray for it (see its docstring).
LEAN_RAY = Path(__file__).with_name("lean_ray.py")


def launcher_argv(env: GymEnvironment, config_paths: Sequence[str]) -> list[str]:
    """The command that starts Gym's head server and every server of `config_paths` (pure).

    Each path is quoted for Hydra's override grammar, which Gym's command line parses.
    """
    quoted = ",".join("'" + str(p).replace("\\", "\\\\").replace("'", "\\'") + "'" for p in config_paths)
    if env.minor >= (0, 7):
        command = [str(env.bin_dir / "gym"), "env", "start"]
    else:
        command = [str(env.bin_dir / "ng_run")]
    return [str(env.python), str(LEAN_RAY), *command, f"+config_paths=[{quoted}]"]


def main(argv: Sequence[str]) -> int:
    """`python -m recipe.nemo_gym.gym.owned.environment [PATH]`: which Gym the environment holds, or why it cannot run.

    The submit scripts run it before a job starts (PATH: `$NEMO_GYM_ENV`, else the default environment)."""
    if argv:
        os.environ[ENV_VAR] = argv[0]
    try:
        env = inspect_environment(locate_environment(None))
    except GymConfigError as e:
        print(e)
        return 1
    print(f"nemo-gym {env.version} (Python {env.python_version}) at {env.python}")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
