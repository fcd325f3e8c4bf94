# SPDX-License-Identifier: Apache-2.0
"""Packing speed: NeMo Gym result dicts -> `Episode`s -> verl `DataProto`, on one pinned core.

Builds synthetic results in the NeMo Gym shape (`tests.support.results.synthetic_result`): each
episode has `--turns` model calls, a first prompt of `--first-prompt` tokens, `--generation` generated and
`--observation` tool tokens per turn (defaults: 8 turns, 1,500 + 8 x 800 + 7 x 1,000 = 14,900 tokens). Each
result goes through a JSON round trip so that, as after an HTTP response, every token of every prompt is its own
int object (no identity shortcuts in the contiguity comparison). `--distinct` results are built and cycled to
fill the batch (default: all distinct; lower it to save memory: 1,024 distinct results hold about 2.5 GB).

Each run does what the manager does for a batch: `BatchPacker.prefault` (first touch of the ~800 MB of batch
tensors; the manager runs it in a worker thread while NeMo Gym runs), then per result `episode_from_result`
(read the token lists, check contiguity, convert) and `BatchPacker.add` (write the row), then `finish`.
Reports milliseconds per episode for each part, from result dicts to the batch (reading + adding + finish: what
runs after NeMo Gym returns), and that plus the prefault summed as if on one core; medians of `--repeats` runs
after the first, which also pays for the process's first touch of its memory (printed apart). Target: <= 1 ms
per episode from result dicts to the batch.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_packing.py [--episodes 1024] [--distinct 1024]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import time

import torch

from recipe.nemo_gym.packing.batch import BatchPacker
from recipe.nemo_gym.packing.episode import episode_from_result
from tests.support.results import synthetic_result

PAD = 151643  # Qwen3's <|endoftext|>


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
    parser.add_argument("--repeats", type=int, default=6)
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

    convert, pack, prefault = [], [], []
    for _ in range(args.repeats):
        gc.collect()  # each run starts clean, as a training step does once the previous batch is freed
        packer = BatchPacker(
            args.episodes, prompt_length=args.prompt_length, response_length=args.response_length, pad_token_id=PAD
        )
        t0 = time.perf_counter()
        packer.prefault()  # the manager does this in a worker thread during the rollout wait
        prefault.append((time.perf_counter() - t0) * 1e3 / args.episodes)
        reading = packing = 0.0
        for row, result in enumerate(results):
            t0 = time.perf_counter()
            episode = episode_from_result(result, max_prompt_length=args.prompt_length)
            t1 = time.perf_counter()
            packer.add(row, episode)
            t2 = time.perf_counter()
            reading += t1 - t0
            packing += t2 - t1
        t0 = time.perf_counter()
        packed = packer.finish()
        packing += time.perf_counter() - t0
        convert.append(reading * 1e3 / args.episodes)
        pack.append(packing * 1e3 / args.episodes)
        del episode, packer, packed

    # The first run also pays for the process's first touch of its memory; a training step never does again.
    print(f"first run: read {convert[0]:.3f}, add {pack[0]:.3f}, prefault {prefault[0]:.3f} ms/episode (not below)")
    convert, pack, prefault = convert[1:], pack[1:], prefault[1:]

    def show(name: str, values: list[float], note: str = "") -> None:
        runs = ", ".join(f"{x:.3f}" for x in values)
        print(f"{name:<22}{statistics.median(values):.3f} ms/episode median (runs: {runs}){note}")

    show("episode_from_result", convert)
    show("BatchPacker.add", pack)
    show("BatchPacker.prefault", prefault, "; the manager runs it while NeMo Gym runs")
    show("result dicts -> batch", [c + p for c, p in zip(convert, pack, strict=True)], " (target <= 1)")
    show("with prefault, summed", [c + p + f for c, p, f in zip(convert, pack, prefault, strict=True)])


if __name__ == "__main__":
    main()
