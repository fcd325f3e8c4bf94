# SPDX-License-Identifier: Apache-2.0
"""A vLLM 0.24 `EngineClient` that runs on CPU: the one part of vLLM's OpenAI server this package replaces.

Everything around the engine stays vLLM's: the caller builds vLLM's FastAPI app and serving classes on top of
`CPUEngineClient`, and each request goes through vLLM's own `InputProcessor.process_inputs` (the same call
`AsyncLLM.add_request` makes), so sampling parameters get the generation config's EOS and stop IDs, a default
`max_tokens` and vLLM's validation (an over-long prompt is rejected with vLLM's message).

Only token generation is ours, by one of two policies:
- a `ScriptedPolicy` (see `script`): the first matching rule decides the completion. A request whose `vllm_xargs`
  name a script file (`engine.script_choice`, as on the shared engine) plays that one instead of the server's;
- the model (see `model_policy`): the tiny model generates, greedy or sampled. Forward passes run in one
  worker thread, one request at a time, so the event loop keeps serving hundreds of concurrent requests.
  With a script whose `fallback` is "model", requests no rule matches go to the model.

`generate` yields exactly one finished `RequestOutput` per request: `CompletionOutput.token_ids` includes the
terminating EOS or stop token as vLLM does; `logprobs` holds one `{token_id: Logprob}` per token when the
request asked for log-probs; `text` is the detokenized output. Stop strings are honoured after generation
(the output is cut at the token that completes the stop string, which is where vLLM would have stopped).

Import this module only after `cpu_platform.use_cpu_platform()` has run: vLLM modules imported here read the
current platform, and on a machine without an accelerator any config built on the wrong one fails with
"Failed to infer device type".
"""

from __future__ import annotations

import asyncio
import math
import os
from argparse import Namespace
from collections.abc import AsyncGenerator, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from vllm.config import VllmConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.engine.protocol import EngineClient
from vllm.logprobs import Logprob
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.renderers import BaseRenderer, renderer_from_config
from vllm.sampling_params import SamplingParams
from vllm.v1.engine import EngineCoreRequest
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.engine.input_processor import InputProcessor

from tests.support.cpu_policy.model_policy import (
    CausalLMSampler,
    SampledGeneration,
    SampledToken,
    SamplingSpec,
)
from tests.support.cpu_policy.script import (
    ScriptedPolicy,
    choose_rule,
    cut_at_stop_string,
    describe_no_match,
    scripted_output,
)
from tests.support.engine.script_choice import SCRIPT_XARG

SUPPORTED_TASKS = ("generate",)


def build_vllm_config(args: Namespace) -> VllmConfig:
    """vLLM's engine config from the server's parsed CLI arguments, built as `vllm serve` builds it.

    `create_engine_config` also carries `--reasoning-parser` into the structured-outputs config the serving
    classes read; on the CPU platform it yields a CPU device config.
    """
    vllm_config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
    if vllm_config.device_config.device_type != "cpu":
        raise RuntimeError(
            f"the CPU policy engine got a {vllm_config.device_config.device_type!r} device config; call "
            "cpu_platform.use_cpu_platform() before importing vLLM's config modules"
        )
    return vllm_config


def build_engine_client(
    args: Namespace, script: ScriptedPolicy | None = None, *, score_scripted: bool = False
) -> CPUEngineClient:
    vllm_config = build_vllm_config(args)
    renderer = renderer_from_config(vllm_config)
    needs_model = script is None or script.fallback == "model" or score_scripted
    sampler = CausalLMSampler(vllm_config.model_config.model) if needs_model else None
    return CPUEngineClient(vllm_config, renderer, script=script, sampler=sampler, score_scripted=score_scripted)


@dataclass(frozen=True)
class _Completion:
    token_ids: list[int]
    logprobs: list[float]
    ranks: list[int | None]
    tops: list[tuple[tuple[int, float], ...]]
    finish_reason: str
    stop_reason: int | str | None


class CPUEngineClient(EngineClient):
    def __init__(
        self,
        vllm_config: VllmConfig,
        renderer: BaseRenderer,
        *,
        script: ScriptedPolicy | None = None,
        sampler: CausalLMSampler | None = None,
        score_scripted: bool = False,
    ):
        if script is None and sampler is None:
            raise ValueError("CPUEngineClient needs a script, a model sampler, or both")
        if score_scripted and sampler is None:
            raise ValueError("score_scripted needs a model sampler to score the scripted tokens")
        if script is not None and script.fallback == "model" and sampler is None:
            raise ValueError('a script with fallback="model" needs a model sampler')
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.renderer = renderer
        self.input_processor = InputProcessor(vllm_config, renderer)
        self.script = script
        self.sampler = sampler
        self.score_scripted = score_scripted
        self._request_scripts: dict[str, tuple[tuple[int, int], ScriptedPolicy]] = {}
        self.tokenizer = renderer.get_tokenizer()
        self._added_vocab = dict(self.tokenizer.get_added_vocab())
        self._eos_token_id = renderer.get_eos_token_id()
        # One worker: forward passes never overlap, and never run on the event loop.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cpu-policy-model")
        self._aborted: set[str] = set()
        self._paused = False
        self._resumed: asyncio.Event | None = None
        self._sleep_level = 0
        self._stopped = False
        self._dead: BaseException | None = None

    # -- generation ---------------------------------------------------------------------------------------

    async def generate(
        self,
        prompt: Any,
        sampling_params: SamplingParams,
        request_id: str,
        *,
        prompt_text: str | None = None,
        lora_request: Any = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        trace_headers: Mapping[str, str] | None = None,
        priority: int = 0,
        data_parallel_rank: int | None = None,
        reasoning_ended: bool | None = None,
        reasoning_parser_kwargs: dict[str, Any] | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        if self._dead is not None:
            raise EngineDeadError() from self._dead
        if self._stopped:
            raise EngineDeadError("the CPU engine was shut down")
        if isinstance(prompt, AsyncGenerator):
            raise ValueError("the CPU policy engine does not accept streaming (async generator) inputs")
        if lora_request is not None:
            raise ValueError("the CPU policy engine serves no LoRA adapters")
        await self._wait_until_resumed()
        if self._sleep_level > 0:
            # verl puts the rollout to sleep right after `generate_sequences` returns: a request arriving now
            # was sent by a manager that let an HTTP request outlive its batch.
            raise RuntimeError(f"request {request_id} reached the CPU policy engine while it sleeps")

        if isinstance(prompt, EngineCoreRequest):
            request = prompt
        else:
            # vLLM's own input processing: validation, default max_tokens, generation-config EOS / stop IDs.
            request = self.input_processor.process_inputs(
                request_id,
                prompt,
                sampling_params,
                supported_tasks=SUPPORTED_TASKS,
                tokenization_kwargs=tokenization_kwargs,
                trace_headers=trace_headers,
                priority=priority,
                data_parallel_rank=data_parallel_rank,
            )
        params = request.sampling_params
        assert params is not None and request.prompt_token_ids is not None
        prompt_ids = list(request.prompt_token_ids)
        if prompt_text is None and isinstance(prompt, dict):
            prompt_text = prompt.get("prompt")

        try:
            outputs = []
            for index in range(params.n):
                completion = await self._complete(request_id, prompt_ids, params, index)
                outputs.append(self._to_output(index, completion, params))
        finally:
            self._aborted.discard(request_id)
        yield RequestOutput(
            request_id=request_id,
            prompt=prompt_text,
            prompt_token_ids=prompt_ids,
            prompt_logprobs=None,
            outputs=outputs,
            finished=True,
            num_cached_tokens=0,
        )

    def _script_for(self, params: SamplingParams) -> ScriptedPolicy | None:
        """The script a request plays: the file its `vllm_xargs` name (`script_choice.SCRIPT_XARG`, as on the shared
        engine), else the server's own."""
        path = (getattr(params, "extra_args", None) or {}).get(SCRIPT_XARG)
        if path is None:
            return self.script
        stat = os.stat(path)
        version = (stat.st_mtime_ns, stat.st_size)
        cached = self._request_scripts.get(path)
        if cached is None or cached[0] != version:
            cached = self._request_scripts[path] = (version, ScriptedPolicy.from_file(path))
        return cached[1]

    async def _complete(self, request_id: str, prompt_ids: list[int], params: SamplingParams, index: int):
        max_tokens = params.max_tokens if params.max_tokens is not None else 1
        script = self._script_for(params)
        if script is not None:
            prompt_text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
            rule = choose_rule(script, prompt_text)
            if rule is not None:
                out = scripted_output(
                    rule.completion,
                    encode=lambda text: self.tokenizer.encode(text, add_special_tokens=False),
                    added_vocab=self._added_vocab,
                    eos_token_id=self._eos_token_id,
                    max_tokens=max_tokens,
                )
                n = len(out.token_ids)
                logprobs = out.logprobs
                if self.score_scripted:
                    assert self.sampler is not None
                    loop = asyncio.get_running_loop()
                    logprobs = await loop.run_in_executor(
                        self._executor, self.sampler.score, prompt_ids, list(out.token_ids)
                    )
                return _Completion(out.token_ids, logprobs, [None] * n, [()] * n, out.finish_reason, out.stop_reason)
            if script.fallback == "error":
                raise ValueError(describe_no_match(script, request_id, prompt_text))

        assert self.sampler is not None
        seed = params.seed + index if params.seed is not None else None
        spec = SamplingSpec(
            max_tokens=max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            seed=seed,
            eos_token_id=params.eos_token_id,
            stop_token_ids=frozenset(params.stop_token_ids or ()),
            ignore_eos=params.ignore_eos,
            min_tokens=params.min_tokens,
            num_top_logprobs=max(params.logprobs or 0, 0),
        )
        if request_id in self._aborted:
            return _Completion([], [], [], [], "abort", None)
        loop = asyncio.get_running_loop()
        sample = self.sampler.generate
        generation: SampledGeneration = await loop.run_in_executor(self._executor, sample, prompt_ids, spec)
        tokens: list[SampledToken] = generation.tokens
        return _Completion(
            [t.token_id for t in tokens],
            [t.logprob for t in tokens],
            [t.rank for t in tokens],
            [t.top for t in tokens],
            generation.finish_reason,
            generation.stop_reason,
        )

    def _to_output(self, index: int, c: _Completion, params: SamplingParams) -> CompletionOutput:
        token_ids, finish_reason, stop_reason = list(c.token_ids), c.finish_reason, c.stop_reason
        # As vLLM's detokenizer: a terminating EOS / stop token is kept in token_ids but not in the text.
        stop_terminated = finish_reason == "stop" and not isinstance(stop_reason, str) and bool(token_ids)
        text_ids = token_ids[:-1] if stop_terminated and not params.include_stop_str_in_output else token_ids
        text = self.tokenizer.decode(text_ids, skip_special_tokens=params.skip_special_tokens)
        if params.stop:
            cut = cut_at_stop_string(
                text_ids,
                params.stop,
                params.include_stop_str_in_output,
                lambda ids: self.tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens),
            )
            if cut is not None:
                kept, text, stop_reason = cut
                token_ids, finish_reason = token_ids[:kept], "stop"
        n = len(token_ids)
        logprobs = None
        cumulative = None
        if params.logprobs is not None:
            logprobs = []
            for token, lp, rank, top in zip(token_ids, c.logprobs[:n], c.ranks[:n], c.tops[:n], strict=True):
                entry = {tid: Logprob(logprob=v, rank=i + 1) for i, (tid, v) in enumerate(top)}
                entry[token] = Logprob(logprob=lp, rank=rank)
                logprobs.append(entry)
            cumulative = math.fsum(c.logprobs[:n])
        return CompletionOutput(
            index=index,
            text=text,
            token_ids=token_ids,
            cumulative_logprob=cumulative,
            logprobs=logprobs,
            finish_reason=finish_reason,
            stop_reason=stop_reason,
        )

    async def _wait_until_resumed(self) -> None:
        while self._paused:
            if self._resumed is None:
                self._resumed = asyncio.Event()
            await self._resumed.wait()

    # -- the rest of the EngineClient protocol --------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        return not self._stopped and self._dead is None

    @property
    def is_stopped(self) -> bool:
        return self._stopped

    @property
    def errored(self) -> bool:
        return self._dead is not None

    @property
    def dead_error(self) -> BaseException:
        return EngineDeadError()

    async def encode(self, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
        raise ValueError("the CPU policy engine only generates; pooling is not supported")
        yield  # an async generator, as the protocol requires

    async def abort(self, request_id: str | Iterable[str]) -> None:
        self._aborted.update([request_id] if isinstance(request_id, str) else request_id)

    async def notify_kv_transfer_request_rejected(
        self, request_id: str, kv_transfer_params: dict[str, Any], *, data_parallel_rank: int | None = None
    ) -> None:
        return None

    async def is_tracing_enabled(self) -> bool:
        return False

    async def do_log_stats(self) -> None:
        return None

    async def check_health(self) -> None:
        if self._dead is not None or self._stopped:
            raise self.dead_error

    async def start_profile(self) -> None:
        return None

    async def stop_profile(self) -> None:
        return None

    async def reset_mm_cache(self) -> None:
        return None

    async def reset_encoder_cache(self) -> None:
        return None

    async def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        return True

    async def sleep(self, level: int = 1, mode: Any = "abort") -> None:
        self._sleep_level = level

    async def wake_up(self, tags: list[str] | None = None) -> None:
        self._sleep_level = 0

    async def is_sleeping(self) -> bool:
        return self._sleep_level > 0

    async def add_lora(self, lora_request: Any) -> bool:
        raise ValueError("the CPU policy engine serves no LoRA adapters")

    async def pause_generation(
        self, *, mode: Any = "abort", wait_for_inflight_requests: bool = False, clear_cache: bool = True
    ) -> None:
        self._paused = True
        self._resumed = asyncio.Event()

    async def resume_generation(self) -> None:
        self._paused = False
        if self._resumed is not None:
            self._resumed.set()

    async def is_paused(self) -> bool:
        return self._paused

    async def collective_rpc(
        self, method: str, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None
    ) -> list[Any]:
        """vLLM's dev RPC (`POST /collective_rpc`), for one method: `load_weights` with a safetensors path.

        The trainer's weight sync uses it; the load runs on the model's worker thread, between forward passes.
        """
        if method != "load_weights" or len(args) != 1 or kwargs:
            raise ValueError(
                f"the CPU policy engine supports only collective_rpc('load_weights', [path]), got {method!r}"
            )
        if self.sampler is None:
            raise ValueError("the CPU policy engine has no model to load weights into (script-only policy)")
        loop = asyncio.get_running_loop()
        loaded = await loop.run_in_executor(self._executor, self.sampler.load_weights, args[0])
        return [{"loaded_tensors": loaded}]

    async def get_supported_tasks(self) -> tuple[str, ...]:
        return SUPPORTED_TASKS

    def shutdown(self, timeout: float | None = None) -> None:
        self._stopped = True
        self._executor.shutdown(wait=False, cancel_futures=True)
