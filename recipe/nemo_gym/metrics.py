"""Per-environment rollout metrics, from the statistics packing returns beside each batch (`PackStats`).

verl 0.9.1 has no channel for a rollout's own training scalars, but it copies every key of the rollout's
`meta_info["timing"]` into the step's metrics as `timing_s/<key>`, and logs those through every configured
logger (console, wandb, tensorboard, mlflow...) at the trainer's step. The manager puts these metrics there,
so they arrive as `timing_s/nemo_gym/<environment>/<metric>`; the README lists them.

Keys (for each environment, and for `all`): `episodes`, `failed`, `failed/<cause>`, `truncated`,
`truncated_rate`, `stopped_on_length`, and `<x>/mean`, `<x>/max` over the episodes that were packed, for
`num_turns`, `generated_tokens`, `trained_tokens`, `env_tokens`, `total_tokens`, `reward`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from recipe.nemo_gym.packing import PackStats

PREFIX = "nemo_gym/"


def select_rows(stats: PackStats, rows: np.ndarray) -> PackStats:
    """The statistics of the rows where the boolean mask `rows` is true."""
    return dataclasses.replace(
        stats,
        **{
            field.name: getattr(stats, field.name)[rows]
            for field in dataclasses.fields(stats)
            if getattr(stats, field.name) is not None
        },
    )


def environment_metrics(stats: PackStats) -> dict[str, float]:
    """Batch metrics for all rows (`nemo_gym/all/...`) and for each environment (`nemo_gym/<env>/...`)."""
    out = _with_rates(stats, f"{PREFIX}all/")
    if stats.data_source is not None:
        for env in sorted({str(s) for s in stats.data_source}):
            out.update(_with_rates(select_rows(stats, stats.data_source == env), f"{PREFIX}{env}/"))
    return out


def _with_rates(stats: PackStats, prefix: str) -> dict[str, float]:
    out = stats.metrics(prefix=prefix)
    episodes = len(stats.failure_cause)
    out[f"{prefix}truncated_rate"] = float(stats.truncated.sum()) / episodes if episodes else 0.0
    return out


def summary_table(stats: PackStats) -> str:
    """A plain-text table, one line per environment: what the demo job prints."""
    header = ("environment", "episodes", "turns", "generated", "tool/env", "masked %", "reward", "truncated", "failed")
    lines = [header]
    groups = [("all", np.ones(len(stats.failure_cause), dtype=bool))]
    if stats.data_source is not None:
        groups = [(env, stats.data_source == env) for env in sorted({str(s) for s in stats.data_source})] + groups
    for env, rows in groups:
        s = select_rows(stats, rows)
        ok = ~s.failed
        generated, env_tokens = int(s.generated_tokens[ok].sum()), int(s.env_tokens[ok].sum())
        masked = 100.0 * env_tokens / max(generated + env_tokens, 1)
        lines.append(
            (
                env,
                str(len(s.failure_cause)),
                f"{s.num_turns[ok].mean():.1f}" if ok.any() else "-",
                str(generated),
                str(env_tokens),
                f"{masked:.1f}",
                f"{s.reward[ok].mean():.3f}" if ok.any() else "-",
                str(int(s.truncated.sum())),
                ", ".join(f"{c}={int((s.failure_cause == c).sum())}" for c in sorted(set(s.failure_cause[~ok]))) or "0",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) for line in lines)
