# SPDX-License-Identifier: Apache-2.0
"""Per-environment rollout metrics, from the statistics packing returns beside each batch (`PackStats`).

verl 0.9.1 has no channel for a rollout's own training scalars, but it copies every key of the rollout's
`meta_info["timing"]` into the step's metrics as `timing_s/<key>`, and logs those through every configured
logger (console, wandb, tensorboard, mlflow...) at the trainer's step. The manager puts these metrics there,
so they arrive as `timing_s/nemo_gym/<environment>/<metric>`; the README lists them.

Validation is different: verl 0.9.1's `_validate` never reads `meta_info["timing"]`. What it reads from the
rollout output is `rm_scores` and, through `extract_reward`, each non-tensor named in
`meta_info["reward_extra_keys"]`, which `process_validation_metrics` averages per `data_source` (and per prompt
over `val_kwargs.n` samples) into `val-aux/<data_source>/<key>/mean@N` (plus `std@N`, `best@N`, `worst@N` when
N > 1); string values are skipped there but written to the validation dumps (`trainer.validation_data_dir`).
`validation_extra_info` gives those per-episode fields, so a masked validation episode is left out of the
environment's score (`acc`, below) and visible as `val-aux/<env>/nemo_gym/failed/mean@N`.

Keys (for each environment, and for `all`): `episodes`, `failed`, `failed/<cause>`, `retried` (episodes run more
than once), `recovered` (retried and then packed), `truncated`, `truncated_rate`, `stopped_on_length`, and
`<x>/mean`, `<x>/max` over the episodes that were packed, for `num_turns`, `generated_tokens`, `trained_tokens`,
`env_tokens`, `total_tokens`, `reward`; and `reward_component/<name>/mean` and `/max` for each reward component an
environment returned (`reward_components`, NeMo Gym 0.7's multi-objective environments), over the packed episodes
that returned it (an environment without components adds none). With a failure-aware estimator,
`groups_short_of_valid`: prompt groups that failures left with fewer than `failures.min_valid_per_group` valid
episodes (advantage 0 on all their rows).

In validation, `acc` is each episode's reward, or None for a failed episode, which verl's `process_validation_metrics`
skips: `val-core/<env>/acc/mean@N` is the environment's score over the episodes that did not fail, while
`val-aux/<env>/reward/mean@N` (verl's own, from `rm_scores`) still counts a failed episode as 0.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np

from recipe.nemo_gym.advantages import groups_short_of_valid
from recipe.nemo_gym.failures import FailureCause
from recipe.nemo_gym.packing.stats import PackStats

PREFIX = "nemo_gym/"
COMPONENT = "reward_component/"
"""`<env>/reward_component/<name>/mean|max`: an environment's reward components, over its packed episodes that
returned them."""
VALIDATION_FAILED_KEY = "nemo_gym/failed"
"""Per validation episode: 1.0 if it failed (masked, reward 0), else 0.0."""
VALIDATION_CAUSE_KEY = "nemo_gym/failure_cause"
"""Per validation episode: its `FailureCause` value, "" if it did not fail."""
VALIDATION_SCORE_KEY = "acc"
"""Per validation episode: its reward, None if it failed. verl 0.9.1 makes `acc` the core variable of
`val-core/<data_source>/...` when a batch gives it (`RayPPOTrainer._val_metrics_update`) and skips None values."""


def select_rows(stats: PackStats, rows: np.ndarray) -> PackStats:
    """The statistics of the rows where the boolean mask `rows` is true."""
    return dataclasses.replace(
        stats,
        **{
            field.name: getattr(stats, field.name)[rows]
            for field in dataclasses.fields(stats)
            if isinstance(getattr(stats, field.name), np.ndarray)
        },
        reward_components={name: values[rows] for name, values in stats.reward_components.items()},
    )


def environment_metrics(stats: PackStats, min_valid_per_group: int | None = None) -> dict[str, float]:
    """Batch metrics for all rows (`nemo_gym/all/...`) and for each environment (`nemo_gym/<env>/...`).

    `min_valid_per_group` (a failure-aware estimator's setting; None otherwise) adds `groups_short_of_valid`."""
    out = _with_rates(stats, f"{PREFIX}all/", min_valid_per_group)
    if stats.data_source is not None:
        for env in sorted({str(s) for s in stats.data_source}):
            env_stats = select_rows(stats, stats.data_source == env)
            out.update(_with_rates(env_stats, f"{PREFIX}{env}/", min_valid_per_group))
    return out


def batch_metrics(stats: PackStats, prefix: str = PREFIX) -> dict[str, float]:
    """Batch-level scalars: counts, and means over episodes that were packed (not failed)."""
    ok = ~stats.failed
    n_ok = int(ok.sum())
    out = {
        f"{prefix}episodes": float(len(stats.failure_cause)),
        f"{prefix}failed": float(len(stats.failure_cause) - n_ok),
        f"{prefix}truncated": float(stats.truncated.sum()),
        f"{prefix}stopped_on_length": float(stats.stopped_on_length.sum()),
    }
    for cause in FailureCause:
        out[f"{prefix}failed/{cause.value}"] = float((stats.failure_cause == cause.value).sum())
    retried = stats.attempts > 1 if stats.attempts is not None else np.zeros(len(ok), dtype=bool)
    out[f"{prefix}retried"] = float(retried.sum())
    out[f"{prefix}recovered"] = float((retried & ok).sum())
    for name in ("num_turns", "generated_tokens", "trained_tokens", "env_tokens", "total_tokens", "reward"):
        values = getattr(stats, name)[ok]
        out[f"{prefix}{name}/mean"] = float(values.mean()) if n_ok else 0.0
        out[f"{prefix}{name}/max"] = float(values.max()) if n_ok else 0.0
    for name, values in sorted(stats.reward_components.items()):
        given = values[ok & ~np.isnan(values)]  # the packed episodes that returned this component
        if len(given):
            out[f"{prefix}{COMPONENT}{name}/mean"] = float(given.mean())
            out[f"{prefix}{COMPONENT}{name}/max"] = float(given.max())
    return out


def _with_rates(stats: PackStats, prefix: str, min_valid_per_group: int | None = None) -> dict[str, float]:
    out = batch_metrics(stats, prefix)
    episodes = len(stats.failure_cause)
    out[f"{prefix}truncated_rate"] = float(stats.truncated.sum()) / episodes if episodes else 0.0
    if min_valid_per_group is not None and stats.uid is not None:
        # Valid as the estimator sees it: a trained token in the row (`advantages.valid_rows`).
        short = groups_short_of_valid(stats.trained_tokens > 0, stats.uid, min_valid_per_group)
        out[f"{prefix}groups_short_of_valid"] = float(len(set(stats.uid[short].tolist())))
    return out


def validation_extra_info(stats: PackStats) -> dict[str, np.ndarray]:
    """The per-episode fields verl's validation metrics aggregate (`meta_info["reward_extra_keys"]`).

    Given for every validation batch, failures or not: verl asserts each extra key holds one value per sample
    over the whole validation set.
    """
    score = np.empty(len(stats.reward), dtype=object)
    for row, (failed, reward) in enumerate(zip(stats.failed, stats.reward, strict=True)):
        score[row] = None if failed else float(reward)
    return {
        VALIDATION_SCORE_KEY: score,
        VALIDATION_FAILED_KEY: stats.failed.astype(np.float64),
        VALIDATION_CAUSE_KEY: np.array([str(c) for c in stats.failure_cause], dtype=object),
    }


def describe_failures(stats: PackStats) -> str:
    """`"<failed> of <episodes> episodes failed (<cause>=<n>, ...; <env>: <n>, ...)"`, causes and environments
    with at least one failure, in sorted order."""
    failed = stats.failed
    causes = Counter(str(c) for c in stats.failure_cause[failed])
    parts = [", ".join(f"{cause}={n}" for cause, n in sorted(causes.items()))]
    if stats.data_source is not None:
        envs = Counter(str(s) for s in stats.data_source[failed])
        parts.append(", ".join(f"{env}: {n}" for env, n in sorted(envs.items())))
    detail = f" ({'; '.join(parts)})" if causes else ""
    return f"{int(failed.sum())} of {len(failed)} episodes failed{detail}"


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
