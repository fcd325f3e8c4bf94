# SPDX-License-Identifier: Apache-2.0
"""NeMoGymJSONLDataset on a 1 GB, 1M-row JSONL: resident memory after opening, and time per random row.

Writes `--rows` rows of about `--row-bytes` bytes each (NeMo Gym shape: a system and a user message, an agent
name, a ground truth) to a temporary file in /tmp, deleted at the end whatever happens.

Memory is measured as process RSS (psutil; /proc/self/statm) after `gc.collect()`: the baseline is taken with
everything imported (torch, numpy, the dataset module) and the file written and closed, so the reported
growth is what opening the dataset itself keeps resident (index plus bookkeeping). The file's page cache is not
in RSS: rows are read with `os.pread`, not mapped. Target: < 64 MB beyond the baseline.

The start-up check of every row (`recipe/nemo_gym/data_check.py`, what the manager runs before step 1 unless
`data.check_rows: false`) is timed over the whole file last.

Random access: `--samples` uniformly random `dataset[i]` (read, parse, validate, build the item) after
opening; reports the mean and the 99th percentile. Target: < 1 ms per row. The file was just written, so it
is in the page cache: this measures the dataset's own cost, not the disk.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_dataset.py [--rows 1000000] [--row-bytes 1000]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import tempfile
import time

import numpy as np
import psutil

from recipe.nemo_gym.data_check import check_data_files
from recipe.nemo_gym.dataset import NeMoGymJSONLDataset

AGENTS = ("math_with_judge_simple_agent", "workplace_assistant_simple_agent", "blackjack_agent")


def write_file(path: str, rows: int, row_bytes: int) -> None:
    rng = random.Random(0)
    agents = AGENTS
    base = {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": ""},
            ]
        },
        "agent_ref": {"name": ""},
        "expected_answer": "",
    }
    overhead = len(json.dumps(base)) + 30
    with open(path, "w", encoding="utf-8") as f:
        for i in range(rows):
            base["responses_create_params"]["input"][1]["content"] = f"Question {i}: " + "x" * (row_bytes - overhead)
            base["agent_ref"]["name"] = agents[i % len(agents)]
            base["expected_answer"] = str(rng.randrange(10**6))
            f.write(json.dumps(base) + "\n")


def rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--row-bytes", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=20_000)
    args = parser.parse_args()

    fd, path = tempfile.mkstemp(prefix="bench_nemo_gym_", suffix=".jsonl", dir="/tmp")
    os.close(fd)
    try:
        t0 = time.perf_counter()
        write_file(path, args.rows, args.row_bytes)
        size = os.path.getsize(path)
        print(f"wrote {args.rows:,} rows, {size / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s")

        baseline = rss()
        t0 = time.perf_counter()
        dataset = NeMoGymJSONLDataset(data_files=path, tokenizer=None, processor=None, config=None)
        opened = time.perf_counter() - t0
        after_open = rss()
        print(f"opened in {opened:.2f} s: {len(dataset):,} rows")
        print(
            f"RSS baseline {baseline / 2**20:.1f} MiB, after opening {after_open / 2**20:.1f} MiB: "
            f"+{(after_open - baseline) / 2**20:.1f} MiB (target < 64 MB)"
        )

        rng = random.Random(1)
        indices = [rng.randrange(len(dataset)) for _ in range(args.samples)]
        times = np.empty(len(indices))
        for k, i in enumerate(indices):
            t = time.perf_counter()
            dataset[i]
            times[k] = time.perf_counter() - t
        after_reads = rss()
        print(
            f"random row: mean {times.mean() * 1e3:.3f} ms, p99 {np.percentile(times, 99) * 1e3:.3f} ms "
            f"over {len(indices):,} reads (target < 1 ms)"
        )
        print(f"RSS after the reads {after_reads / 2**20:.1f} MiB (+{(after_reads - after_open) / 2**20:.1f} MiB)")

        # The start-up check of every row (`data.check_rows`, on by default): parse, fields, agent.
        t0 = time.perf_counter()
        check = check_data_files([path], AGENTS)
        checked = time.perf_counter() - t0
        print(
            f"checked all {check.rows:,} rows in {checked:.2f} s ({size / 2**20 / checked:.0f} MiB/s), "
            f"{len(check.bad)} bad; RSS after {rss() / 2**20:.1f} MiB"
        )
    finally:
        os.unlink(path)


if __name__ == "__main__":
    main()
