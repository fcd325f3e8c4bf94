# SPDX-License-Identifier: Apache-2.0
"""Chat preprocessing time per request with and without the token-exact splice patch.

Builds vLLM 0.24's own `OpenAIServingRender` for the tiny Qwen3 model directory (genuine Qwen3 tokenizer and
chat template, CPU device config, hermes tool parser), makes histories of 2, 8 and 32 assistant turns that
carry NeMo Gym's token IDs (each turn alternating a tool call with its result and a text answer with
reasoning, generated one token per character so re-tokenization drifts), and times `render_chat` on the
request for the next turn (the whole chat completions preprocessing), unpatched and patched in alternation,
on one event loop. Reports the median over repeats of each, the ratio, the number of chat template renders per
request (calls of the tokenizer's `apply_chat_template`, through which vLLM applies every template, tokenized
or not) and of tokenizations (calls of its `encode`).
The targets: at most one extra template render per request, and under 2x at 32 turns.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_splice.py [--repeats 60] [--turns 2 8 32]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass

from recipe.nemo_gym import server_patch
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from tests.support.cpu_policy.qwen3 import IM_END as EOS
from tests.support.cpu_policy.qwen3 import WEATHER_TOOL
from tests.support.cpu_policy.tokenizer_calls import COUNTED, counted_tokenizer_calls
from tests.support.vllm_render import build_render_serving

TOOLS = [WEATHER_TOOL]


def build_history(render, turns: int) -> list[dict]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    tok = render.renderer.tokenizer

    def ids(messages):
        request = ChatCompletionRequest.model_validate({"model": "policy", "messages": messages, "tools": TOOLS})
        return list(asyncio.run(render.render_chat(request))[1][0]["prompt_token_ids"])

    def per_char(text):
        return [t for ch in text for t in tok.encode(ch, add_special_tokens=False)]

    history: list[dict] = [
        {"role": "system", "content": "You are a weather assistant."},
        {"role": "user", "content": "Weather in city 0?"},
    ]
    for turn in range(turns):
        prompt = ids(history)
        if turn % 2 == 0:
            call = {"id": f"c{turn}", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
            call["function"]["arguments"] = f'{{"city": "city {turn}"}}'
            text = f'<tool_call>\n{{"name":"get_weather","arguments":{{"city":"city {turn}"}}}}\n</tool_call>'
            gen = per_char(text) + [EOS]
            history.append(
                {"role": "assistant", "content": "", "tool_calls": [call], "prompt_token_ids": prompt,
                 "generation_token_ids": gen, "generation_log_probs": [-0.1] * len(gen)}
            )  # fmt: skip
            history.append({"role": "tool", "tool_call_id": f"c{turn}", "content": f"{turn % 30}C, sunny"})
        else:
            text = f"<think>\nThe tool said {turn % 30}C.\n</think>\n\nIt is {turn % 30}C in city {turn - 1}."
            gen = per_char(text) + [EOS]
            history.append(
                {"role": "assistant", "content": text, "prompt_token_ids": prompt, "generation_token_ids": gen,
                 "generation_log_probs": [-0.1] * len(gen)}
            )  # fmt: skip
            history.append({"role": "user", "content": f"Weather in city {turn + 1}?"})
    return history


@dataclass(frozen=True)
class Timing:
    seconds: float  # median over the repeats
    prompt_tokens: int
    renders: int  # chat template renders per request
    tokenizations: int  # tokenizer `encode` calls per request


def time_requests(render, history: list[dict], repeats: int) -> tuple[Timing, Timing]:
    """Time `render_chat` on this history unpatched and patched, counting template renders and tokenizations.

    The two are interleaved request by request (unpatched, patched, unpatched, ...), so that a slow spell of
    the machine weighs on both sides of the ratio alike.
    """
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    samples: dict[bool, list[float]] = {False: [], True: []}
    calls = {False: dict.fromkeys(COUNTED, 0), True: dict.fromkeys(COUNTED, 0)}
    n_tokens: dict[bool, int] = {}

    async def one(patched: bool) -> None:
        # The request is validated outside the timed region, as FastAPI does before the handler runs.
        request = ChatCompletionRequest.model_validate({"model": "policy", "messages": history, "tools": TOOLS})
        (server_patch.install if patched else server_patch.uninstall)()
        with counted_tokenizer_calls(render.renderer.tokenizer) as counts:
            start = time.perf_counter()
            _, (engine_input,) = await render.render_chat(request)
            samples[patched].append(time.perf_counter() - start)
        for name in COUNTED:
            calls[patched][name] += counts[name]
        n_tokens[patched] = len(engine_input["prompt_token_ids"])

    async def run() -> None:  # one event loop for all requests, as in the server
        for _ in range(repeats):
            await one(False)
            await one(True)

    asyncio.run(run())
    base, patched = (
        Timing(
            statistics.median(samples[p]),
            n_tokens[p],
            calls[p]["apply_chat_template"] // repeats,
            calls[p]["encode"] // repeats,
        )
        for p in (False, True)
    )
    return base, patched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--turns", type=int, nargs="+", default=[2, 8, 32])
    args = parser.parse_args()

    server_patch.install()  # before the render object is built: its turn terminator is found then, as in a server
    render, _ = build_render_serving(str(tiny_qwen3_dir()), max_model_len=8192)
    print(f"vLLM {server_patch.vllm_version()}, tiny Qwen3 (genuine tokenizer/template), {args.repeats} repeats")
    print(
        f"{'turns':>5} {'prompt tokens':>13} {'unpatched ms':>12} {'patched ms':>10} {'ratio':>6} {'renders':>8} "
        f"{'tokenizations':>13}"
    )
    for turns in args.turns:
        history = build_history(render, turns)
        base, patched = time_requests(render, history, args.repeats)
        print(
            f"{turns:>5} {patched.prompt_tokens:>13} {base.seconds * 1e3:>12.2f} {patched.seconds * 1e3:>10.2f} "
            f"{patched.seconds / base.seconds:>6.2f} {f'{base.renders}->{patched.renders}':>8} "
            f"{f'{base.tokenizations}->{patched.tokenizations}':>13}"
        )
        # One extra template render and no extra tokenization per spliced request.
        assert (base.renders, patched.renders) == (1, 2), (base, patched)
        assert (base.tokenizations, patched.tokenizations) == (1, 1), (base, patched)
        assert base.prompt_tokens != patched.prompt_tokens  # the drifted history really is spliced


if __name__ == "__main__":
    main()
