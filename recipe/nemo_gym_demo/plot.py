# SPDX-License-Identifier: Apache-2.0
"""The demo's reward plot: the mean training reward of each environment per step, from verl's logged metrics."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recipe.nemo_gym_demo.view import environments


def write_reward_plot(steps: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """Mean training reward of each environment per step, as a PNG; None when no step reported a reward."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[int, float]]] = {}
    for step in steps:
        for env in environments(step["data"]):
            series.setdefault(env, []).append((step["step"], step["data"][f"timing_s/nemo_gym/{env}/reward/mean"]))
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for env, points in sorted(series.items()):
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=env)
    ax.set_xlabel("training step")
    ax.set_ylabel("mean reward (training batch)")
    ax.set_title("NeMo Gym environments: reward per step (verl main_ppo, CPU)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
