# SPDX-License-Identifier: Apache-2.0
"""The CPU training backend's server actor answers verl's server calls as verl's `vLLMHttpServer` does.

`CPUPolicyServerActor` is used here as a plain object (Ray only wraps it): it starts a real CPU policy server
(vLLM 0.24's OpenAI app over the tiny model) and is driven through the calls verl 0.9.1 makes on it: token-in /
token-out `generate` with and without log-probs, `sleep` / `wake_up`, and `load_weights` from a state dict.
"""

from __future__ import annotations

import asyncio
import urllib.error

import pytest
import torch
from safetensors.torch import load_file

from recipe.nemo_gym_testing.cpu_policy.tiny_model import tiny_qwen3_dir
from recipe.nemo_gym_testing.cpu_training.rollout import CPUPolicyServerActor

pytestmark = pytest.mark.integration

PROMPT = [151644, 872, 198, 14990, 151645, 198, 151644, 77091, 198]  # <|im_start|>user\nhello<|im_end|>\n...
GREEDY = {"max_tokens": 6, "temperature": 0.0}


@pytest.fixture(scope="module")
def server():
    actor = CPUPolicyServerActor(model_path=str(tiny_qwen3_dir()), replica_rank=0)
    actor.launch_server()
    yield actor
    actor.shutdown()


def generate(actor, **sampling):
    return asyncio.run(actor.generate(PROMPT, {**GREEDY, **sampling}, request_id="test"))


def test_generate_returns_token_ids_and_log_probs_only_when_asked(server):
    plain = generate(server)
    with_logprobs = generate(server, logprobs=True)
    assert 1 <= len(plain.token_ids) <= GREEDY["max_tokens"]
    assert plain.log_probs is None
    assert with_logprobs.token_ids == plain.token_ids  # greedy: the same tokens either way
    assert len(with_logprobs.log_probs) == len(with_logprobs.token_ids)
    assert all(value <= 0.0 for value in with_logprobs.log_probs)
    assert plain.stop_reason == "completed"


def test_a_sleeping_server_refuses_generation_until_woken(server):
    asyncio.run(server.sleep())
    try:
        with pytest.raises(urllib.error.HTTPError):
            generate(server)
    finally:
        asyncio.run(server.wake_up())
    assert generate(server).token_ids


def test_loaded_weights_change_the_served_log_probs(server):
    before = generate(server, logprobs=True)
    state = load_file(f"{tiny_qwen3_dir()}/model.safetensors")
    changed = {name: tensor * 3.0 if "embed_tokens" in name else tensor for name, tensor in state.items()}
    loaded = asyncio.run(server.load_weights(changed, global_steps=1))
    assert loaded == len(state)
    assert asyncio.run(server.get_weight_version()) == 1
    after = generate(server, logprobs=True)
    assert after.log_probs != before.log_probs
    # the original weights back: the original log-probs back, exactly
    asyncio.run(server.load_weights(state, global_steps=2))
    restored = generate(server, logprobs=True)
    assert restored.token_ids == before.token_ids
    assert torch.allclose(torch.tensor(restored.log_probs), torch.tensor(before.log_probs), atol=0, rtol=0)
