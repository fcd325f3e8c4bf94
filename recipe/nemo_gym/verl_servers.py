# SPDX-License-Identifier: Apache-2.0
"""Find the OpenAI-compatible vLLM servers verl 0.9.1 launched, and the model name they serve.

verl hands a custom manager an `LLMServerClient`, not server addresses. The client holds the global load
balancer actor, whose public actor method `get_all_servers()` returns the servers' "host:port" addresses (the
balancer is keyed by them; see verl/workers/rollout/llm_server.py `_init_global_load_balancer`). The handle
itself is the client's private `_load_balancer` attribute: there is no public accessor in verl 0.9.1, so that
one read is isolated here (checked against verl 0.9.1).

The served model name is asked of the servers (`GET /v1/models`), not guessed: vLLM serves under the model's
local path, or under `rollout.prometheus.served_model_name` when that is set.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from recipe.nemo_gym.errors import ConfigError, ServerError


async def discover_policy_servers(llm_client, *, deadline_s: float) -> tuple[list[str], str]:
    """Return (`["http://host:port/v1", ...]`, served model name)."""
    balancer = getattr(llm_client, "_load_balancer", None)  # verl 0.9.1: no public accessor
    if balancer is None:
        raise ConfigError("verl's llm_client has no load balancer: cannot find the vLLM server addresses")
    addresses = await balancer.get_all_servers.remote()
    if not addresses:
        raise ServerError("verl's load balancer lists no vLLM server")
    base_urls = [f"http://{address}/v1" for address in addresses]
    names = await asyncio.gather(*(served_model_name(url, deadline_s=deadline_s) for url in base_urls))
    if len(set(names)) != 1:
        served = dict(zip(base_urls, names, strict=True))
        raise ServerError(f"verl's vLLM servers serve different models: {served}", base_urls)
    return base_urls, names[0]


async def served_model_name(base_url: str, *, deadline_s: float) -> str:
    """Ask one server for its model name, retrying until it answers or the deadline passes."""
    deadline = time.monotonic() + deadline_s
    last_error: Exception | None = None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(f"{base_url}/models") as response:
                    response.raise_for_status()
                    return (await response.json())["data"][0]["id"]
            except (TimeoutError, aiohttp.ClientError, KeyError, IndexError) as e:
                last_error = e
                await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    raise ServerError(
        f"vLLM server {base_url} did not answer GET /models within {deadline_s:.0f} s: {last_error!r}", [base_url]
    )
