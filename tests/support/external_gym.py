# SPDX-License-Identifier: Apache-2.0
"""A NeMo Gym started the way docs/attach-mode.md tells a user to start one (`gym env start` from Gym's own
environment, the policy left to an endpoint file), outside any manager: what `nemo_gym.attach` tests attach to.

`ExternalGym.start(...)` runs `attach_command` as a process tree of its own (its own session, `RAY_*` removed, a
private `RAY_TMPDIR`) and waits until the head server lists its servers and each answers. `pids()` lists every live
process of that session; `stop()` sends the session SIGINT (Gym's own orderly stop), then SIGKILL.

The one difference from a user's command: this machine has no network, so each server's venv is a link to Gym's
environment (`+skip_venv_if_present` with the plugin's own venv links), where a user's Gym builds its venvs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from recipe.nemo_gym.gym.attach import SESSION_ID_SETTING
from recipe.nemo_gym.gym.over_http.client import HeadClient
from recipe.nemo_gym.gym.over_http.health import http_alive
from recipe.nemo_gym.gym.owned import gym_layout
from recipe.nemo_gym.gym.owned.environment import clean_environment, inspect_environment, locate_environment
from recipe.nemo_gym.process_group import stop_group
from tests.support.gym_runtime import TRAINING_MODEL_SERVER_CONFIG as MODEL_SERVER_CONFIG

REPO_ROOT = Path(__file__).resolve().parents[2]


def attach_command(
    gym_bin: Path, config_paths: Sequence[str], *, endpoint_file: Path, model_name: str, port: int
) -> list[str]:
    """The command of docs/attach-mode.md ("The Gym job"), for `config_paths` after the model server's."""
    paths = ",".join([MODEL_SERVER_CONFIG, *config_paths])
    server = "policy_model.responses_api_models.vllm_model"
    return [
        str(gym_bin / "gym"), "env", "start",
        f"+config_paths=[{paths}]",
        f"+policy_model_name={model_name}",
        "+policy_base_url=http://unpublished.invalid/v1",
        "+policy_api_key=EMPTY",
        f"++{server}.endpoint_file={endpoint_file}",
        f"++{server}.uses_reasoning_parser=false",
        f"++{server}.{SESSION_ID_SETTING}=true",
        "+model_endpoint_readiness_timeout_seconds=0",
        "+use_absolute_ip=true",
        "+head_server.host=0.0.0.0",
        f"+head_server.port={port}",
    ]  # fmt: skip


def gym_bin_dir() -> Path:
    """The bin folder of Gym's own environment (`.venv-gym`, or where `NEMO_GYM_ENV` says)."""
    return inspect_environment(locate_environment(None)).bin_dir


def offline_gym_arguments(venv_dir: Path, cwd: Path = REPO_ROOT) -> list[str]:
    """What `attach_command` gets on this machine, which has no network (see the module docstring): each server's
    venv is a link, made here under `venv_dir`, to Gym's environment."""
    environment = inspect_environment(locate_environment(None))
    shim = gym_layout.write_interpreter_shim(venv_dir, str(environment.python))
    gym_layout.link_server_venvs(venv_dir, gym_layout.server_dirs([environment.install_root, cwd]), shim)
    return ["+skip_venv_if_present=true", f"+uv_venv_dir={venv_dir}"]


@dataclass
class ExternalGym:
    process: subprocess.Popen
    port: int
    endpoint_file: Path
    log: Path
    ray_dir: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(
        cls,
        work_dir: Path,
        config_paths: Sequence[str],
        *,
        model_name: str,
        port: int,
        cwd: Path = REPO_ROOT,
        timeout_s: float = 300.0,
    ) -> ExternalGym:
        """Start it from `cwd` (Gym finds config paths and server folders there first, then in its own root: the
        repository root holds our own environment, `uppercase_share`)."""
        endpoint_file = work_dir / "policy_endpoint"
        argv = attach_command(
            gym_bin_dir(), config_paths, endpoint_file=endpoint_file, model_name=model_name, port=port
        )
        argv += offline_gym_arguments(work_dir / "venvs", cwd)
        # Short: Ray's socket paths under it must stay within the 107 bytes a Unix socket allows.
        ray_dir = Path(tempfile.mkdtemp(prefix="ng-ext-", dir="/tmp"))
        env = clean_environment(os.environ) | {"RAY_TMPDIR": str(ray_dir), "PYTHONUNBUFFERED": "1"}
        log = work_dir / "gym.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        gym = cls(process, port, endpoint_file, log, ray_dir)
        try:
            gym.wait_until_ready(timeout_s)
        except BaseException:
            gym.stop()
            raise
        return gym

    def wait_until_ready(self, timeout_s: float) -> None:
        head = HeadClient("127.0.0.1", self.port, timeout_s=5.0)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gym env start exited {self.process.returncode}: see {self.log}")
            try:
                servers = head.instances()
            except OSError:
                servers = []
            if servers and all(s.host and http_alive(s.host, s.port, 2.0) for s in servers):
                return
            time.sleep(1.0)
        raise TimeoutError(f"the external NeMo Gym was not ready within {timeout_s:g}s: see {self.log}")

    def pids(self) -> list[int]:
        """Every live process of the Gym's session (launcher, servers, its Ray)."""
        found = []
        for proc in psutil.process_iter(["pid"]):
            try:
                if os.getsid(proc.pid) == self.process.pid and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc.pid)
            except (OSError, psutil.Error):
                continue
        return sorted(found)

    def stop(self, grace_s: float = 20.0) -> None:
        stop_group(self.process.pid, grace_s, first=signal.SIGINT)  # Gym's own orderly stop, then SIGKILL
        # Orphans that left the group keep the session: kill whatever is left of it.
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.process.poll() is None:
            self.process.wait(5.0)
        shutil.rmtree(self.ray_dir, ignore_errors=True)
