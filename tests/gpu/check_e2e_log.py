# SPDX-License-Identifier: Apache-2.0
"""Check the console log of the GPU end-to-end run (tests/gpu/run_gpu_e2e.sh); exit 0 only if it passes.

verl's console logger prints one line per training step, `step:<k> - <metric>:<value> - ...` (Ray may put a
`(TaskRunner pid=...)` prefix in front). The run passes when every step 1..N is logged, and on every step the
loss metric is finite, the reward metric is finite, the episode count is positive, and the broken-contiguity
count is present and zero. Metric names come from the command line, so the shell script keeps them in one place.

Usage: python check_e2e_log.py LOG --steps N --loss-metric K --reward-metric K --episodes-metric K
       --contiguity-metric K [--report-metric K ...]
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

_STEP_LINE = re.compile(r"(?:^|\s)step:(\d+) - (.*)$")


def parse_step_metrics(log_text: str) -> dict[int, dict[str, float]]:
    """Metrics of each logged step; a step logged twice keeps its last line. Non-numeric values are skipped."""
    steps: dict[int, dict[str, float]] = {}
    for line in log_text.splitlines():
        match = _STEP_LINE.search(line)
        if not match:
            continue
        metrics: dict[str, float] = {}
        for item in match.group(2).split(" - "):
            key, sep, value = item.rpartition(":")
            if not sep:
                continue
            try:
                metrics[key.strip()] = float(value)
            except ValueError:
                continue
        steps[int(match.group(1))] = metrics
    return steps


def check_steps(
    steps: dict[int, dict[str, float]],
    *,
    expected_steps: int,
    loss_metric: str,
    reward_metric: str,
    episodes_metric: str,
    contiguity_metric: str,
) -> list[str]:
    """Every problem found, one message each, naming the step and metric; empty when the run passed."""
    problems = []
    for step in range(1, expected_steps + 1):
        metrics = steps.get(step)
        if metrics is None:
            problems.append(f"step {step}: no console log line (saw steps {sorted(steps)})")
            continue
        for key in (loss_metric, reward_metric):
            if key not in metrics:
                problems.append(f"step {step}: {key} missing")
            elif not math.isfinite(metrics[key]):
                problems.append(f"step {step}: {key} is {metrics[key]}")
        if metrics.get(episodes_metric, 0.0) <= 0:
            problems.append(f"step {step}: {episodes_metric} is {metrics.get(episodes_metric, 'missing')}")
        if contiguity_metric not in metrics:
            problems.append(f"step {step}: {contiguity_metric} missing")
        elif metrics[contiguity_metric] != 0:
            problems.append(f"step {step}: {contiguity_metric} is {metrics[contiguity_metric]:g}, expected 0")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--loss-metric", required=True)
    parser.add_argument("--reward-metric", required=True)
    parser.add_argument("--episodes-metric", required=True)
    parser.add_argument("--contiguity-metric", required=True)
    parser.add_argument("--report-metric", action="append", default=[], help="printed per step, not checked")
    args = parser.parse_args(argv)
    steps = parse_step_metrics(args.log.read_text(errors="replace"))
    problems = check_steps(
        steps,
        expected_steps=args.steps,
        loss_metric=args.loss_metric,
        reward_metric=args.reward_metric,
        episodes_metric=args.episodes_metric,
        contiguity_metric=args.contiguity_metric,
    )
    if problems:
        print(f"{args.log}: FAILED", *problems, sep="\n  ", file=sys.stderr)
        return 1
    for step in range(1, args.steps + 1):
        m = steps[step]
        print(
            f"step {step}: {args.loss_metric}={m[args.loss_metric]:.6g}"
            f" {args.reward_metric}={m[args.reward_metric]:.4g}"
            f" {args.episodes_metric}={m[args.episodes_metric]:g} {args.contiguity_metric}=0"
            + "".join(f" {key}={m.get(key, float('nan')):.3g}" for key in args.report_metric)
        )
    print(f"{args.log}: PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
