# SPDX-License-Identifier: Apache-2.0
"""The `cpu_vllm` rollout: verl's replica / server / in-worker adapter contract, served by the CPU policy server.

verl 0.9.1 (`trainer.use_v1=false`, hybrid engine) drives a rollout through three objects; each is here:

- `CPURolloutReplica` (verl's `RolloutReplica`): created by verl's `LLMServerManager`, starts one
  `CPUPolicyServerActor` per replica and hands its address to verl's load balancer, from which the NeMo Gym
  manager reads it. `sleep()`/`wake_up()` reach the server as in verl's own replicas.
- `CPUPolicyServerActor` (a Ray actor, the counterpart of verl's `vLLMHttpServer`): runs the CPU policy server
  (`recipe.nemo_gym_testing.cpu_policy.server`: vLLM 0.24's own OpenAI app with only the engine replaced, splice patch
  on) as a child process that exits with the actor, and implements the server calls verl makes: token-in /
  token-out `generate` (through vLLM's `/v1/completions`), `sleep`/`wake_up` (vLLM's dev endpoints: a request
  reaching a sleeping engine fails, so a manager that lets a request outlive its batch is caught), KV-cache and
  abort/resume calls (no state to keep on CPU), and `load_weights` (vLLM's dev `collective_rpc`).
- `CPUServerAdapter` (verl's `BaseRollout`, built inside each FSDP worker): at every weight sync it receives
  the actor's full tensors from verl's `update_weights` and sends them to its replica's server actor through
  Ray; the server loads them before the next batch.

The policy is the model directory verl trains (`actor_rollout_ref.model.path`), generating on CPU. With
`NEMO_GYM_CPU_POLICY_SCRIPT` set to a `ScriptedPolicy` JSON file, scripted turns (tool calls, answers) are
emitted instead, and their log-probs are the model's own under the current weights, as a trainer recomputes
them. Checked against verl 0.9.1 and vLLM 0.24.0.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import ray
import torch
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import HFModelConfig
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

from recipe.nemo_gym_testing.cpu_training import ROLLOUT_NAME

SCRIPT_ENV = "NEMO_GYM_CPU_POLICY_SCRIPT"
"""Path of a `ScriptedPolicy` JSON file; when set, the CPU policy replays it (log-probs from the model)."""


def server_actor_name(replica_rank: int, name_suffix: str = "") -> str:
    return f"{ROLLOUT_NAME}_server_{replica_rank}_0{name_suffix}"


class CPUPolicyServerActor:
    """One CPU policy server process, owned by this actor. Methods mirror verl's `vLLMHttpServer`."""

    def __init__(self, model_path: str, replica_rank: int, max_model_len: int | None = None):
        self.model_path = model_path
        self.replica_rank = replica_rank
        self.max_model_len = max_model_len
        self._server = None
        self._weights_dir = tempfile.TemporaryDirectory(prefix="cpu-vllm-weights-")
        self.weight_version = 0

    def launch_server(self) -> tuple[str, int]:
        from recipe.nemo_gym_testing.cpu_policy.script import ScriptedPolicy
        from recipe.nemo_gym_testing.cpu_policy.server import CPUPolicyServer

        script_path = os.environ.get(SCRIPT_ENV)
        script = ScriptedPolicy.from_file(script_path) if script_path else None
        extra = ["--max-model-len", str(self.max_model_len)] if self.max_model_len else []
        env = dict(os.environ)
        env["VLLM_SERVER_DEV_MODE"] = "1"  # vLLM's /sleep, /wake_up and /collective_rpc routes
        env.pop("CUDA_VISIBLE_DEVICES", None)
        self._server = CPUPolicyServer(
            self.model_path,
            script=script,
            extra_args=extra,
            score_script_with_model=script is not None,
            exit_with_parent=True,
            env=env,
        ).start()
        print(f"CPU policy server for replica {self.replica_rank} at {self._server.base_url}", flush=True)
        return self._server.host, self._server.port

    def get_server_address(self) -> tuple[str, int]:
        return self._server.host, self._server.port

    def _post(self, path: str, body: dict[str, Any] | None = None, timeout_s: float = 120.0) -> Any:
        data = json.dumps(body).encode() if body is not None else b""
        request = urllib.request.Request(
            f"{self._server.root_url}{path}", data=data, headers={"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            payload = response.read()
        return json.loads(payload) if payload else None

    # -- verl's server calls -------------------------------------------------------------------------------

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        **_: Any,
    ) -> TokenOutput:
        """Token-in / token-out generation (verl's `LLMServerClient`), through vLLM's `/v1/completions`."""
        if image_data or video_data:
            raise ValueError("the CPU policy serves text only")
        params = dict(sampling_params)
        body = {
            "model": self.model_path,
            "prompt": list(prompt_ids),
            "max_tokens": int(params.pop("max_tokens", params.pop("max_new_tokens", 16))),
            "temperature": float(params.pop("temperature", 1.0)),
            "top_p": float(params.pop("top_p", 1.0)),
            "top_k": int(params.pop("top_k", -1)),
            # Always asked for: the completion's token IDs are read from the log-prob entries ("token_id:<n>").
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        result = await asyncio.to_thread(self._post, "/v1/completions", body)
        choice = result["choices"][0]
        logprobs = choice["logprobs"]
        token_ids = [int(token.removeprefix("token_id:")) for token in logprobs["tokens"]]
        return TokenOutput(
            token_ids=token_ids,
            log_probs=[float(v) for v in logprobs["token_logprobs"]] if params.get("logprobs") else None,
            stop_reason="completed" if choice.get("finish_reason") else None,
        )

    async def wake_up(self, tags: list[str] | None = None) -> None:
        await asyncio.to_thread(self._post, "/wake_up")

    async def sleep(self) -> None:
        await asyncio.to_thread(self._post, "/sleep?level=1")

    async def load_weights(self, state: dict[str, torch.Tensor], global_steps: int | None = None) -> int:
        """Load the actor's full weights into the engine; returns how many tensors were loaded."""
        from safetensors.torch import save_file

        path = Path(self._weights_dir.name) / "weights.safetensors"
        save_file({name: tensor.contiguous() for name, tensor in state.items()}, str(path))
        try:
            result = await asyncio.to_thread(
                self._post, "/collective_rpc", {"method": "load_weights", "args": [str(path)]}
            )
        finally:
            path.unlink(missing_ok=True)
        self.weight_version += 1
        # printed, not logged: Ray forwards an actor's stdout to the driver, and verl's log level hides INFO
        print(f"CPU policy replica {self.replica_rank}: weights of step {global_steps} loaded", flush=True)
        return int(result["results"][0]["loaded_tensors"])

    async def get_weight_version(self) -> int:
        return self.weight_version

    # KV cache, profiling, aborts: the CPU engine keeps no KV cache between requests and nothing is in flight
    # between batches in synchronous training, so these have nothing to do.
    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def wait_for_requests_to_drain(self) -> None:
        return None

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None

    async def set_global_steps(self, global_steps: int) -> None:
        return None

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        return {"aborted_count": 0, "request_ids": []}

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True) -> dict:
        return {"aborted": False, "request_id": request_id}

    async def resume_generation(self) -> None:
        return None

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        self._weights_dir.cleanup()


class CPURolloutReplica(RolloutReplica):
    """verl's rollout replica for `rollout.name=cpu_vllm`: one CPU policy server actor per replica."""

    async def launch_servers(self) -> None:
        # As verl's vLLMHttpServer does: the served directory is the model config's local copy.
        model = omega_conf_to_dataclass(self.model_config, dataclass_type=HFModelConfig)
        server_class = ray.remote(CPUPolicyServerActor)
        server = server_class.options(
            name=server_actor_name(self.replica_rank, self.name_suffix),
            num_cpus=0,  # the server process takes what it needs; Ray's bundles belong to the FSDP workers
            max_concurrency=self.max_concurrency,
        ).remote(
            model_path=model.local_path,
            replica_rank=self.replica_rank,
            max_model_len=self.config.max_model_len,
        )
        host, port = await server.launch_server.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"{host}:{port}"


class CPUServerAdapter(BaseRollout):
    """verl's in-worker rollout for `cpu_vllm`: forwards weight syncs and wake-ups to the replica's server actor."""

    def __init__(self, config, model_config, device_mesh, *args, **kwargs):
        super().__init__(config, model_config, device_mesh)
        rollout_world_size = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self.replica_rank = rank // rollout_world_size
        self.is_leader = rank % rollout_world_size == 0
        self._server = None

    @property
    def server(self):
        if self._server is None:
            self._server = ray.get_actor(server_actor_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        if self.is_leader and "kv_cache" in tags:
            await self.server.wake_up.remote(tags)

    async def release(self) -> None:
        if self.is_leader:
            await self.server.sleep.remote()

    async def update_weights(self, weights, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"the CPU rollout takes full named tensors, not {wire_format!r}")
        if kwargs.get("peft_config") is not None:
            raise ValueError("the CPU rollout does not serve LoRA adapters")
        # Every rank walks the generator (FSDP gathers collectively); only the replica's leader sends.
        state = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights}
        if self.is_leader:
            await self.server.load_weights.remote(state, kwargs.get("global_steps"))
