# SPDX-License-Identifier: Apache-2.0
"""One verl vLLM server for many test modules: the scripted policy is chosen per request, not per engine.

Why: starting verl's vLLM rollout on CPU costs 100-160 s and about 4.3 GB, and each module that needed a scripted
policy used to start its own, because the engine read its script once (`SCRIPT_ENV`). Now a request names its
script itself, so one engine plays every module's policy:

- a NeMo Gym row carries `{"vllm_xargs": {SCRIPT_XARG: "<script.json>"}}` in `responses_create_params.metadata
  .extra_body` (`script_choice.scripted_row`). NeMo Gym's `vllm_model` server (0.4 and 0.7) merges a row's
  `metadata.extra_body` into every chat completion it sends for that row's episode; vLLM 0.24's OpenAI server
  turns a request's `vllm_xargs` into `SamplingParams.extra_args`; `scripted_logits.ScriptedLogitsProcessor`
  reads the script named there when the request joins the batch. A request that names no script is the model's
  own (or the engine-wide `SCRIPT_ENV` script, where one is set).
- A direct OpenAI request adds `script_choice.script_body(script_file)` to its JSON body.

`serve()` is the engine host: a process of its own (`python -m tests.support.engine.shared_engine
STATE_FILE`) with its own local Ray and verl's standalone rollout (`standalone.verl_rollout`), so that the modules
using it keep their own Ray lifecycles. It writes `EngineInfo` as JSON to STATE_FILE once it serves, and stops
(verl's actors killed, their leftovers removed) on SIGTERM or when its standard input closes. `SharedEngine` starts
and stops one from a test session. The engine's size covers every module that shares it: 8192 prompt tokens, 1024
response tokens, 256 sequences in a batch (the load test's 512 episodes run their model calls together).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from recipe.nemo_gym.cpu_backend.overrides import KV_CACHE_BYTES
from recipe.nemo_gym.process_group import stop_group
from tests.support.engine import kv_cache_override

# 256 sequences in a batch and the CPU backend's KV cache (512 MiB, not the tests' 128: its load is 512 episodes).
ENGINE_OVERRIDES = (
    "actor_rollout_ref.rollout.max_num_seqs=256",
    kv_cache_override(KV_CACHE_BYTES),
)
PROMPT_LENGTH, RESPONSE_LENGTH = 8192, 1024
STARTUP_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class EngineInfo:
    address: str
    """"host:port" of verl's vLLM server."""
    server_pid: int
    """The process of its `vLLMHttpServer` actor."""
    server_log: str
    """That actor's stderr in Ray's session logs."""
    ray_address: str
    """The engine host's Ray (a child that needs Ray may join it, with `ray_env` in its environment)."""
    ray_env: dict[str, str]
    """What a process joining that Ray needs in its environment: Ray 2.60 turns token authentication on for a
    local Ray when a token file exists, in the starting process only (`RAY_AUTH_MODE`)."""
    host_pid: int

    @property
    def base_url(self) -> str:
        return f"http://{self.address}/v1"


class SharedEngine:
    """An engine host started on first `info()` and stopped by `stop()`; each test session holds at most one."""

    def __init__(self, state_dir: Path) -> None:
        self._state_file = state_dir / "shared-engine.json"
        self._log_file = state_dir / "shared-engine.log"
        self._process: subprocess.Popen | None = None
        self._info: EngineInfo | None = None

    def info(self) -> EngineInfo:
        if self._info is None:
            self._info = self._start()
        return self._info

    def _start(self) -> EngineInfo:
        repo_root = Path(__file__).resolve().parents[3]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, (str(repo_root), os.environ.get("PYTHONPATH")))),
        }
        self._state_file.unlink(missing_ok=True)
        with self._log_file.open("ab") as log:
            self._process = subprocess.Popen(  # noqa: S603
                [sys.executable, "-m", __name__, str(self._state_file)],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=repo_root,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self._state_file.exists():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self._log_file.read_text(errors="replace")[-4000:]
                raise RuntimeError(f"the shared vLLM engine did not start ({self._log_file}):\n{tail}")
            time.sleep(0.5)
        return EngineInfo(**json.loads(self._state_file.read_text()))

    def stop(self) -> None:
        process, self._process, self._info = self._process, None, None
        if process is None:
            return
        process.stdin.close()  # the host's signal to stop
        try:
            process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            stop_group(process.pid, grace_s=0, first=None)  # SIGKILL to its group, confirmed gone
            process.wait(timeout=30)


def _engine_config():
    from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
    from tests.support.cpu_policy import harness
    from tests.support.engine.standalone import standalone_overrides

    overrides = harness.cpu_trainer_overrides(
        tiny_qwen3_dir(), "/unused.yaml", prompt_length=PROMPT_LENGTH, response_length=RESPONSE_LENGTH, n=1,
        batch_size=1,
    )  # fmt: skip
    return harness.compose_verl_config([*overrides, *standalone_overrides(scripted=True), *ENGINE_OVERRIDES])


def serve(state_file: Path) -> None:
    import ray

    from tests.support.engine.standalone import init_local_ray, verl_rollout

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    ray_address = init_local_ray()
    try:
        with verl_rollout(_engine_config()) as rollout:
            info = EngineInfo(
                address=rollout.addresses[0],
                server_pid=rollout.server_pid(),
                server_log=str(rollout.server_log()),
                ray_address=ray_address,
                ray_env={key: os.environ[key] for key in ("RAY_AUTH_MODE",) if key in os.environ},
                host_pid=os.getpid(),
            )
            partial = state_file.with_suffix(".partial")
            partial.write_text(json.dumps(asdict(info)))
            partial.replace(state_file)  # readers see the whole file or none
            print(f"shared engine serving at {info.address}", flush=True)
            while not stop.wait(1.0):
                pass
    finally:
        ray.shutdown()


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
