"""Packing speed: NeMo Gym result dicts -> `Episode`s -> verl `DataProto`, on one pinned core.

Builds synthetic results in the NeMo Gym shape (`packing.synthetic_result`): each episode has `--turns` model
calls, a first prompt of `--first-prompt` tokens, `--generation` generated and `--observation` tool tokens
per turn (defaults: 8 turns, 1,500 + 8 x 800 + 7 x 1,000 = 14,900 tokens). Each result goes through a JSON
round trip so that, as after an HTTP response, every token of every prompt is its own int object (no
identity shortcuts in the contiguity comparison). `--distinct` results are built and cycled to fill the
batch (default: all distinct; lower it to save memory: 1,024 distinct results hold about 2.5 GB).

Reports milliseconds per episode for `episode_from_result` (contiguity check, conversion), `pack_batch`
(padding into preallocated tensors) and both, median of `--repeats` runs. Target: <= 1 ms per episode.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_packing.py [--episodes 1024] [--distinct 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

import torch

from recipe.nemo_gym.packing import episode_from_result, pack_batch, synthetic_result


def build_result(rng: random.Random, turns: int, first_prompt: int, generation: int, observation: int) -> dict:
    sequence = [rng.randrange(300, 151_000) for _ in range(first_prompt)]
    calls = []
    for turn in range(turns):
        prompt = list(sequence)
        generated = [rng.randrange(300, 151_000) for _ in range(generation)]
        log_probs = [-rng.random() * 3 for _ in range(generation)]
        calls.append((prompt, generated, log_probs))
        sequence += generated
        if turn < turns - 1:
            sequence += [rng.randrange(300, 151_000) for _ in range(observation)]
    result = synthetic_result(calls, reward=rng.random(), agent_name="bench_agent")
    return json.loads(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1024)
    parser.add_argument("--distinct", type=int, default=1024)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--first-prompt", type=int, default=1500)
    parser.add_argument("--generation", type=int, default=800)
    parser.add_argument("--observation", type=int, default=1000)
    parser.add_argument("--prompt-length", type=int, default=2048)
    parser.add_argument("--response-length", type=int, default=14336)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    torch.set_num_threads(1)

    rng = random.Random(0)
    pool = [
        build_result(rng, args.turns, args.first_prompt, args.generation, args.observation)
        for _ in range(min(args.distinct, args.episodes))
    ]
    results = [pool[i % len(pool)] for i in range(args.episodes)]
    tokens = len(pool[0]["response"]["output"][-1]["prompt_token_ids"]) + args.generation
    print(
        f"{args.episodes} episodes ({len(pool)} distinct), {args.turns} turns, {tokens} tokens each; "
        f"prompt_length={args.prompt_length}, response_length={args.response_length}; one core"
    )

    convert, pack = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        episodes = [episode_from_result(r, max_prompt_length=args.prompt_length) for r in results]
        t1 = time.perf_counter()
        packed = pack_batch(
            episodes, prompt_length=args.prompt_length, response_length=args.response_length, pad_token_id=151643
        )
        t2 = time.perf_counter()
        convert.append((t1 - t0) * 1e3 / args.episodes)
        pack.append((t2 - t1) * 1e3 / args.episodes)
        del episodes, packed

    c, p = statistics.median(convert), statistics.median(pack)
    print(f"episode_from_result: {c:.3f} ms/episode (runs: {', '.join(f'{x:.3f}' for x in convert)})")
    print(f"pack_batch:          {p:.3f} ms/episode (runs: {', '.join(f'{x:.3f}' for x in pack)})")
    print(f"total:               {c + p:.3f} ms/episode (target <= 1 ms)")


if __name__ == "__main__":
    main()
