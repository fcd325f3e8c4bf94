# SPDX-License-Identifier: Apache-2.0
"""The manager's wait loop alone: CPU per row of `collect.run_examples_in_order` as the batch grows.

Each row is a stand-in `post_run` that sleeps a seeded random time (uniform over `--spread-s`) and returns a small
dict, so no HTTP, agent or model is timed: only the loop that waits for the rows, keeps their order, wakes for health
checks and progress, and the rows' own tasks. The same rows are then run under a bare `asyncio.gather`, whose CPU is
the rows' own cost; the difference is the wait loop's. One event loop, the process's CPU time (`time.process_time`),
the median of `--repeats` runs per size. Sizes far apart show whether the loop's cost per row grows with the batch.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_collect_wait.py [--rows 512 2048 8192] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import statistics
import time

from recipe.nemo_gym.gym.over_http.collect import ProgressLine, run_examples_in_order


def make_rows(n: int, spread_s: float, seed: int) -> tuple[list[dict], list[float]]:
    rng = random.Random(seed)
    return [{"agent_ref": {"name": "a"}, "i": i} for i in range(n)], [rng.uniform(0, spread_s) for _ in range(n)]


async def post_after(delays: list[float], index: int, row: dict) -> dict:
    await asyncio.sleep(delays[index])
    return {"reward": 1.0, "i": row["i"]}


async def through_wait_loop(rows: list[dict], delays: list[float]) -> list:
    async def health() -> None:
        return None

    return await run_examples_in_order(
        rows,
        lambda i, row: post_after(delays, i, row),
        deadline_s=600.0,
        health_check=health,
        health_check_interval_s=1.0,
        progress=ProgressLine(interval_s=3600.0),
    )


async def through_gather(rows: list[dict], delays: list[float]) -> list:
    return await asyncio.gather(*(post_after(delays, i, row) for i, row in enumerate(rows)))


def cpu_ms(run, rows: list[dict], delays: list[float]) -> float:
    start = time.process_time()
    results = asyncio.run(run(rows, delays))
    spent = time.process_time() - start
    assert [r["i"] for r in results] == list(range(len(rows))), "outcomes out of order"
    return spent * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--spread-s", type=float, default=2.0, help="rows end uniformly over this many seconds")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.getLogger("recipe.nemo_gym.gym.over_http.collect").setLevel(logging.ERROR)  # the progress line's last line

    print(f"{'rows':>6} {'loop+rows ms':>13} {'gather ms':>10} {'loop CPU-ms/row':>16}")
    for n in args.rows:
        rows, delays = make_rows(n, args.spread_s, args.seed)
        looped, gathered = [], []
        for _ in range(args.repeats):  # alternated, so a slow moment of the machine hits both alike
            looped.append(cpu_ms(through_wait_loop, rows, delays))
            gathered.append(cpu_ms(through_gather, rows, delays))
        loop_ms, gather_ms = statistics.median(looped), statistics.median(gathered)
        print(f"{n:>6} {loop_ms:>13.1f} {gather_ms:>10.1f} {(loop_ms - gather_ms) / n:>16.3f}")


if __name__ == "__main__":
    main()
