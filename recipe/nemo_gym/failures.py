# SPDX-License-Identifier: Apache-2.0
"""Typed rollout failures and the per-batch failure budget.

Every episode that cannot be trained on exactly as generated is one `EpisodeFailure` with a `FailureCause`.
Such an episode is never replaced by a placeholder: it is packed with `response_mask` all 0 and reward 0
(so it contributes no gradient), and counted by cause. When a batch's failures exceed its budget, the
step fails with `FailureBudgetExceeded`, whose message is the per-cause summary. The budget of a batch of B
episodes is ceil(`max_fraction` x B) failures (`FailureBudget.allowed`).

Two kinds of cause:
- infrastructure: the episode died on a server (HTTP 5xx after NeMo Gym's own bounded retries, a request
  error). Nothing about the data is known to be wrong.
- data: the episode came back but breaks an invariant the trainer relies on (token contiguity between
  turns, missing generation IDs, a non-finite log-prob, a reward that is not a number, a prompt that
  does not fit the context).

NeMo Gym 0.6+ also reports failures itself, on rows that come back with HTTP 200: `_ng_failure_class` (with
`_ng_failure_type`, `_ng_failure_message`, ...) is ENVIRONMENT_FAILED (infrastructure), JUDGE_FAILED (infrastructure)
for `judge_failed` (the resources server's LLM judge call failed: HTTP error, timeout, refused request) or, for a
row its dispatch budget drained, CANCELLED (infrastructure); a row marked `mask_sample` is MASKED_BY_ENVIRONMENT
(data).
Such rows carry no reward to train on, so they are masked like every other failure, never scored 0 and trained.

A dead server or a batch that outlives its deadline is not an episode failure: it fails the whole step
(`RolloutAborted`), because every pending episode is lost with it.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from recipe.nemo_gym.errors import RefusedError, RolloutError


class FailureKind(enum.StrEnum):
    INFRASTRUCTURE = "infrastructure"
    DATA = "data"


class FailureCause(enum.StrEnum):
    SERVER_ERROR = "server_error"
    CONTIGUITY_BROKEN = "contiguity_broken"
    MISSING_GENERATION = "missing_generation"
    NON_FINITE_LOGPROB = "non_finite_logprob"
    BAD_REWARD = "bad_reward"
    PROMPT_TOO_LONG = "prompt_too_long"
    ENVIRONMENT_FAILED = "environment_failed"
    JUDGE_FAILED = "judge_failed"
    CANCELLED = "cancelled"
    MASKED_BY_ENVIRONMENT = "masked_by_environment"

    @property
    def kind(self) -> FailureKind:
        infrastructure = (
            FailureCause.SERVER_ERROR,
            FailureCause.ENVIRONMENT_FAILED,
            FailureCause.JUDGE_FAILED,
            FailureCause.CANCELLED,
        )
        return FailureKind.INFRASTRUCTURE if self in infrastructure else FailureKind.DATA

    @property
    def retryable(self) -> bool:
        """Worth running again: nothing is known to be wrong with the row (an infrastructure cause). A data cause
        fails the same way every time, and `mask_sample` is the environment's verdict on the episode."""
        return self.kind is FailureKind.INFRASTRUCTURE


@dataclass(frozen=True)
class EpisodeFailure:
    """Why one episode (one input row) cannot be trained on."""

    cause: FailureCause
    detail: str
    row: int | None = None

    def __str__(self) -> str:
        where = f"row {self.row}: " if self.row is not None else ""
        return f"{where}{self.cause.value}: {self.detail}"


class EpisodeDataError(RefusedError):
    """Raised by the pure packing functions when a NeMo Gym result breaks an invariant."""

    def __init__(self, cause: FailureCause, detail: str):
        super().__init__(f"{cause.value}: {detail}")
        self.cause = cause
        self.detail = detail


class RolloutAborted(RolloutError):
    """The whole batch is lost: a server died, or the batch outlived its deadline."""


class FailureBudgetExceeded(RolloutError):
    """More episodes failed in one batch than the configured budget allows."""


@dataclass(frozen=True)
class FailureBudget:
    """At most `allowed(batch_size)` = ceil(`max_fraction` x batch_size) failed episodes per batch.

    Rounding up is what makes the budget usable at every batch size: with a bare `failures > max_fraction x
    batch` test, any batch under 20 episodes failed its step on a single failure at the default 5%. With it,
    every batch tolerates at least one failure when `max_fraction > 0`, 0.0 still means zero tolerance, and
    1.0 tolerates a whole batch of failures. The default (0.05) absorbs the rare bad episode of a long run
    while a systematic fault (a broken template, a dying environment) still stops the run within one step.
    """

    max_fraction: float = 0.05

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_fraction <= 1.0:
            raise ValueError(f"failure budget max_fraction must be in [0, 1], got {self.max_fraction}")

    def allowed(self, batch_size: int) -> int:
        """How many of `batch_size` episodes may fail without failing the step."""
        # Rounded to 9 places before the ceiling so binary noise (0.07 x 100 = 7.000000000000001) adds no episode.
        return math.ceil(round(self.max_fraction * batch_size, 9))

    def check(self, failures: Iterable[EpisodeFailure], batch_size: int) -> None:
        failures = list(failures)
        if len(failures) > self.allowed(batch_size):
            raise FailureBudgetExceeded(summarize(failures, batch_size, self.max_fraction))


def count_by_cause(failures: Iterable[EpisodeFailure]) -> dict[str, int]:
    counts = Counter(f.cause.value for f in failures)
    return {cause.value: counts.get(cause.value, 0) for cause in FailureCause}


def summarize(failures: list[EpisodeFailure], batch_size: int, max_fraction: float) -> str:
    counts = {k: v for k, v in count_by_cause(failures).items() if v}
    allowed = FailureBudget(max_fraction).allowed(batch_size)
    lines = [
        f"{len(failures)} of {batch_size} episodes failed, over the budget of {allowed} "
        f"(failures.max_fraction {max_fraction:.1%} of {batch_size}, rounded up). By cause: "
        + ", ".join(f"{cause} ({FailureCause(cause).kind.value}) = {n}" for cause, n in counts.items())
        + ".",
        "First failures:",
    ]
    lines += [f"  {f}" for f in failures[:5]]
    return "\n".join(lines)
