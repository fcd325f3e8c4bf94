# SPDX-License-Identifier: Apache-2.0
"""The demo's console view of a running job: the lines a user at a terminal looks at, from the launcher's output and
verl's metrics file.

- `ConsoleView` takes the trainer's lines (all to the log, each after the seconds since the start; the manager's
  progress lines, cleaned by `progress_text`, to the console too) and the launcher's (`launch: ...`, to both), and
  shows one line per step (`format_step`) as soon as verl's file logger writes it (`StepFollower`), before the
  launcher's last lines.
- `environments(data)` names the environments a step's metrics report on, for the step line and the plot.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROGRESS_MARKER = "NeMo Gym rollout:"
"""Lines the manager logs while a batch runs; the console echoes them."""


STEP_POLL_S = 0.5
"""How often the console looks for steps verl has logged."""


HEAD_LINES = 400
"""Lines of the trainer's start-up output kept for the Ray start-up retry."""


class ConsoleView:
    """The console's lines from three threads, in order: a step's summary before the launcher's last lines.

    Two threads read the launcher's output; the third (`follow_steps`) reads verl's metrics file as it grows. A step's
    summary cannot wait for the trainer's next line: verl's console logger prints a step before its file logger
    writes it (verl 0.9.1's `Tracking` registers them in that order), and the next line may be a whole batch later.
    """

    def __init__(self, metrics_file: Path, console: Callable[[str], None], log: Any, started: float):
        self.console, self.log, self.started = console, log, started
        self.lock = threading.Lock()
        self.steps = StepFollower(metrics_file)
        self.shown: set[int] = set()
        self.head: list[str] = []
        self.outcome: list[str] = []

    def trainer_line(self, line: str) -> None:
        with self.lock:
            self.log.write(f"[{time.monotonic() - self.started:7.1f}s] {line}")  # where a slow start spends its time
            if len(self.head) < HEAD_LINES:
                self.head.append(line)
            if PROGRESS_MARKER in line:
                self.console(progress_text(line))
            self.show_new_steps()

    def launcher_line(self, line: str) -> None:
        with self.lock:
            self.log.write(line)
            self.show_new_steps()
            self.console(line.rstrip("\n"))
            self.outcome.append(line.rstrip("\n"))

    def show_new_steps(self) -> None:
        for step in self.steps.new_steps():
            if step["step"] not in self.shown:
                self.shown.add(step["step"])
                self.console(format_step(step))

    def follow_steps(self, stop: threading.Event, interval_s: float = STEP_POLL_S) -> None:
        while not stop.wait(interval_s):
            with self.lock:
                self.show_new_steps()


class StepFollower:
    """verl's metrics file (one JSON line per logged step) read as it grows: each call returns the steps of the
    complete lines written since the last call, and `read` holds every step read so far. A line still being written
    waits for the next call."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.read: list[dict[str, Any]] = []

    def new_steps(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        steps = [json.loads(line) for line in complete.splitlines() if line.strip()]
        self.read += steps
        return steps


_RAY_PREFIX = re.compile(r"^(\x1b\[[0-9;]*m)?\([^)]*pid=\d+[^)]*\)(\x1b\[[0-9;]*m)?\s*")


# verl's log format in Ray workers: "WARNING:2026-11-23 16:18:43,651:<message>"
_LOG_PREFIX = re.compile(r"^[A-Z]+:\d{4}-\d\d-\d\d [\d:,]+:")


def progress_text(line: str) -> str:
    """A worker's progress line as the console shows it: without Ray's process tag or the log record prefix."""
    return _LOG_PREFIX.sub("", _RAY_PREFIX.sub("", line.rstrip()))


def environments(data: dict[str, Any]) -> list[str]:
    """The environments a step's metrics report on (`timing_s/nemo_gym/<env>/episodes`), `all` excluded."""
    found = {m.group(1) for key in data if (m := re.fullmatch(r"timing_s/nemo_gym/(.+)/episodes", key))}
    return sorted(found - {"all"})


def format_step(step: dict[str, Any]) -> str:
    """One console line per logged step: what a user looks at, from verl's own metrics."""
    data = step["data"]
    gym = "timing_s/nemo_gym/"
    parts = [f"step {step['step']}"]
    # verl's core validation variable: the plugin's `acc` (the reward over episodes that did not fail).
    vals = {k.split("/")[1]: v for k, v in data.items() if k.startswith("val-core/") and "/acc/" in k}
    if vals:
        parts.append("validation " + " ".join(f"{env}={v:.3f}" for env, v in sorted(vals.items())))
    rewards = [f"{env}={data[f'{gym}{env}/reward/mean']:.3f}" for env in environments(data)]
    if rewards:
        parts.append("reward " + " ".join(rewards))
    if "actor/pg_loss" in data:
        parts.append(f"loss {data['actor/pg_loss']:+.4f} grad_norm {data.get('actor/grad_norm', float('nan')):.3g}")
    if f"{gym}all/failed" in data:
        parts.append(f"failed {int(data[f'{gym}all/failed'])}/{int(data[f'{gym}all/episodes'])}")
    if f"{gym}rollout_wait" in data:
        parts.append(f"rollout {data[f'{gym}rollout_wait']:.1f}s packing {1e3 * data[f'{gym}packing']:.0f}ms")
    if "timing_s/step" in data:
        parts.append(f"step {data['timing_s/step']:.0f}s")
    return " | ".join(parts)
