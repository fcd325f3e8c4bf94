# SPDX-License-Identifier: Apache-2.0
"""Failure-aware advantage estimators: verl's own outcome estimators, computed over the episodes that did not fail.

A failed episode is packed with `response_mask` all 0 and reward 0 (`packing/batch.py`), so it adds nothing to the
loss. But verl's group estimators (GRPO, RLOO, ...) take each group's baseline over every row with the group's
`uid`, the failed row's 0 included: in a group of 8 where 7 episodes scored 1.0 and one failed, the 7 would be
pushed up for nothing. The estimators here remove that:

- a row is *valid* when its `response_mask` has a 1 (no packed episode has an all-0 mask: an episode starts with a
  generation; a failed one has none);
- verl's estimator, looked up by its registered name, runs on the valid rows alone (`core_algos`
  `get_adv_estimator_fn`: a change in verl reaches us), and its advantages are written back into their rows;
- failed rows get advantage 0, and so does every row of a group that failures left with fewer than
  `min_valid_per_group` valid members (`groups_short_of_valid`). A group that had fewer members to begin with
  (`rollout.n` below the minimum) and lost none keeps verl's own treatment of it.

So for the valid rows the result equals verl's estimator on the same batch with the failed rows removed.

Registered names (`algorithm.adv_estimator=<name>`), each over the verl 0.9.1 estimator of the same suffix:
`nemo_gym_grpo` (`algorithm.norm_adv_by_std_in_grpo` is honoured, as verl's inline GRPO does; false is Dr.GRPO),
`nemo_gym_grpo_vectorized`, `nemo_gym_rloo`, `nemo_gym_rloo_vectorized`, `nemo_gym_opo`, `nemo_gym_grpo_passk`,
`nemo_gym_gpg`, `nemo_gym_reinforce_plus_plus_baseline`. Not wrapped: `gae` (a critic's per-row values; rows are
independent), `reinforce_plus_plus` and `remax` (no group baseline: whitening and REMAX's baseline row ignore
masked rows already), `gdpo` and the optimal-token-baseline pair (verl's `compute_advantage` hands their extra
inputs only to their own names).

`register_failure_aware_estimators(min_valid_per_group)` registers them with verl (idempotent); the manager calls it
when it is built, in verl's TaskRunner, the process that computes advantages. With `$NEMO_GYM_VERL_ADVANTAGE_LOG`
set to a file path, every call appends one JSON line with each row's uid, score, validity and advantage: a way to
audit a step.

The loss is exact for a failed row under verl's `token-mean` (its default) and `token-sum` aggregation, which count
tokens. Its `seq-mean-*` modes divide by every row of the mini-batch (`ppo_mini_batch_size × rollout.n`, verl 0.9.1's
`ray_trainer.py`), failed rows included, so there each failed episode scales the step's loss by the share of valid
rows; `loss_agg_mode_warning` is the start-up warning the manager logs for them.

No Ray, HTTP or vLLM here: torch, numpy and verl's `core_algos`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

PREFIX = "nemo_gym_"
WRAPPED = (
    "grpo",
    "grpo_vectorized",
    "rloo",
    "rloo_vectorized",
    "opo",
    "grpo_passk",
    "gpg",
    "reinforce_plus_plus_baseline",
)
"""verl 0.9.1's estimators that take a baseline over each `uid` group: each has a failure-aware `nemo_gym_<name>`."""
FAILURE_AWARE = {f"{PREFIX}{name}": name for name in WRAPPED}
NORM_BY_STD = frozenset({"grpo", "grpo_vectorized"})
"""verl calls these with `norm_adv_by_std_in_grpo` itself on its inline path only; the wrapper passes the config's."""
ADVANTAGE_LOG_ENV = "NEMO_GYM_VERL_ADVANTAGE_LOG"
DEFAULT_MIN_VALID_PER_GROUP = 2

# The one setting the registered functions read. One environments file per process (verl's TaskRunner runs one
# manager); set by `register_failure_aware_estimators`.
_min_valid_per_group = DEFAULT_MIN_VALID_PER_GROUP


def valid_rows(response_mask: torch.Tensor) -> np.ndarray:
    """Rows that hold an episode to train on: a 1 anywhere in the row's `response_mask` (bool [B])."""
    return (response_mask.sum(dim=-1) > 0).cpu().numpy()


def groups_short_of_valid(valid: np.ndarray, index: np.ndarray, min_valid: int) -> np.ndarray:
    """Per row: its group lost at least one member to a failure and has fewer than `min_valid` valid members left.

    `index` is verl's `uid` per row. Pure; bool [B]."""
    _, group, size = np.unique(index, return_inverse=True, return_counts=True)
    valid_count = np.bincount(group, weights=valid.astype(np.float64), minlength=len(size)).astype(np.int64)
    short = (valid_count < size) & (valid_count < min_valid)
    return short[group]


def trainable_rows(response_mask: torch.Tensor, index: np.ndarray, min_valid: int) -> np.ndarray:
    """Rows verl's estimator runs on: valid, in a group that failures did not leave short (bool [B])."""
    valid = valid_rows(response_mask)
    return valid & ~groups_short_of_valid(valid, index, min_valid)


def failure_aware_advantages(
    base: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    min_valid: int,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`base` (a verl estimator) on the trainable rows; 0 on every other row. Returns `(advantages, returns)`."""
    keep = trainable_rows(response_mask, index, min_valid)
    batch = len(keep)
    advantages = torch.zeros_like(token_level_rewards)
    returns = torch.zeros_like(token_level_rewards)
    if keep.any():
        rows = torch.from_numpy(np.flatnonzero(keep)).to(token_level_rewards.device)
        # Per-row inputs verl may add (`reward_baselines`) are cut to the same rows.
        kwargs = {k: v[rows] if _per_row(v, batch) else v for k, v in kwargs.items()}
        sub_advantages, sub_returns = base(
            token_level_rewards=token_level_rewards[rows],
            response_mask=response_mask[rows],
            index=index[keep],
            **kwargs,
        )
        advantages[rows] = sub_advantages.to(advantages.dtype)
        returns[rows] = sub_returns.to(returns.dtype)
    return advantages, returns


def _per_row(value: Any, batch: int) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0 and len(value) == batch


def _estimator(name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The function registered as `nemo_gym_<name>`: what verl's `compute_advantage` calls with its keywords."""

    def estimate(
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        index: np.ndarray | None = None,
        config: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from verl.trainer.ppo import core_algos

        if index is None:
            raise ValueError(f"{PREFIX}{name} groups episodes by uid, but verl's batch has no 'uid'")
        base = core_algos.get_adv_estimator_fn(name)
        extra = dict(kwargs, config=config)
        if name in NORM_BY_STD:
            extra["norm_adv_by_std_in_grpo"] = config.get("norm_adv_by_std_in_grpo", True) if config else True
        index = np.asarray(index, dtype=object)
        advantages, returns = failure_aware_advantages(
            base, token_level_rewards, response_mask, index, _min_valid_per_group, **extra
        )
        path = os.environ.get(ADVANTAGE_LOG_ENV)
        if path:
            _append_record(path, f"{PREFIX}{name}", token_level_rewards, response_mask, index, advantages)
        return advantages, returns

    estimate.__name__ = estimate.__qualname__ = f"{PREFIX}{name}"
    estimate.__doc__ = f"verl's `{name}` over the valid episodes of each group (recipe/nemo_gym/advantages.py)."
    return estimate


_ESTIMATORS = {f"{PREFIX}{name}": _estimator(name) for name in WRAPPED}


def register_failure_aware_estimators(min_valid_per_group: int = DEFAULT_MIN_VALID_PER_GROUP) -> None:
    """Register every `nemo_gym_<name>` with verl's estimator registry (idempotent: the same functions each time)."""
    global _min_valid_per_group
    if min_valid_per_group < 1:
        raise ValueError(f"min_valid_per_group must be >= 1, got {min_valid_per_group}")
    from verl.trainer.ppo.core_algos import register_adv_est

    _min_valid_per_group = int(min_valid_per_group)
    for name, fn in _ESTIMATORS.items():
        register_adv_est(name)(fn)


def plain_estimator_warning(adv_estimator: str) -> str | None:
    """The start-up warning for a plain verl group estimator (failed rows' zeros enter the baseline), else None."""
    name = str(getattr(adv_estimator, "value", adv_estimator))
    if name == "gdpo":
        return (
            "algorithm.adv_estimator=gdpo: a failed NeMo Gym episode's reward components (0) enter its group's "
            "per-component normalization and shift its siblings' advantages; verl 0.9.1 hands GDPO's per-component "
            "inputs to no other estimator name, so the plugin has no failure-aware GDPO"
        )
    if name not in WRAPPED:
        return None
    return (
        f"algorithm.adv_estimator={name}: a failed NeMo Gym episode's reward 0 enters its group's baseline and shifts "
        f"its siblings' advantages; set algorithm.adv_estimator={PREFIX}{name} to compute it over valid episodes only"
    )


SEQUENCE_MEAN_MODES = ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def loss_agg_mode_warning(loss_agg_mode: str) -> str | None:
    """The start-up warning for a verl loss aggregation that counts failed rows (the `seq-mean-*` modes), else None."""
    if loss_agg_mode not in SEQUENCE_MEAN_MODES:
        return None
    return (
        f"actor_rollout_ref.actor.loss_agg_mode={loss_agg_mode}: verl divides the loss by every row of a mini-batch, "
        "failed NeMo Gym episodes included, so each failed episode scales the step's loss by the share of valid rows; "
        "token-mean (verl's default) and token-sum are exact"
    )


def _append_record(
    path: str,
    estimator: str,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    advantages: torch.Tensor,
) -> None:
    """One JSON line: per row its uid, score, validity and advantage (on its first trained token, else 0)."""
    mask = response_mask.bool()
    first = mask.float().argmax(dim=-1)
    per_row = advantages.gather(1, first.unsqueeze(-1)).squeeze(-1) * mask.any(dim=-1)
    record = {
        "estimator": estimator,
        "min_valid_per_group": _min_valid_per_group,
        "uid": [str(u) for u in index],
        "score": token_level_rewards.sum(dim=-1).tolist(),
        "valid": valid_rows(response_mask).tolist(),
        "advantage": per_row.tolist(),
    }
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
