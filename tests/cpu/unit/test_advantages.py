# SPDX-License-Identifier: Apache-2.0
"""The failure-aware advantage estimators (`recipe/nemo_gym/advantages.py`) against verl 0.9.1's own, on exact tensors.

For every wrapped estimator: a batch with failed rows (response_mask all 0, reward 0, as packing leaves them) and the
same batch with those rows removed give the valid rows the same advantages; failed rows get 0; a group that failures
leave with one valid member gets 0. verl's plain estimator on the batch with failures differs, which is what the
variant exists for (and shows the comparison can fail).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.ray_trainer import compute_advantage

from recipe.nemo_gym import advantages
from recipe.nemo_gym.advantages import (
    FAILURE_AWARE,
    SEQUENCE_MEAN_MODES,
    WRAPPED,
    groups_short_of_valid,
    loss_agg_mode_warning,
    plain_estimator_warning,
    register_failure_aware_estimators,
)

R = 4  # response length
# Group a: 4 samples, one failed. Group b: 3 samples, one failed. Group c: 2 samples, one failed (one valid left).
# Group d: 2 samples, both failed.
UIDS = np.array(["a"] * 4 + ["b"] * 3 + ["c"] * 2 + ["d"] * 2, dtype=object)
SCORES = [1.0, 1.0, 0.5, 0.0, 0.2, 0.9, 0.0, 1.0, 0.0, 0.0, 0.0]
VALID = [True, True, True, False, True, True, False, True, False, False, False]
KEPT = np.array([True, True, True, False, True, True, False, False, False, False, False])  # and group c removed


def rollout_batch(scores, valid, trained=3):
    """verl's `token_level_rewards` and `response_mask` for rows packed as the plugin packs them: a valid row trains on
    its first `trained` tokens with its score on the last; a failed row has an all-0 mask and reward 0."""
    rewards = torch.zeros(len(scores), R)
    mask = torch.zeros(len(scores), R, dtype=torch.int64)
    for row, (score, ok) in enumerate(zip(scores, valid, strict=True)):
        if ok:
            mask[row, :trained] = 1
            rewards[row, trained - 1] = score
    return rewards, mask


@pytest.fixture(scope="module", autouse=True)
def registered():
    register_failure_aware_estimators(2)


def per_row(advantages: torch.Tensor) -> list[float]:
    """Each row's advantage (outcome estimators broadcast one value over the row's trained tokens)."""
    return advantages[:, 0].tolist()


EXPECTED = {
    # verl's estimator on the kept rows, by hand: a = [1, 1, 0.5] (mean 5/6, std 0.2887), b = [0.2, 0.9].
    "grpo": [0.57735, 0.57735, -1.15470, 0, -0.70711, 0.70711, 0, 0, 0, 0, 0],
    "grpo_vectorized": [0.57735, 0.57735, -1.15470, 0, -0.70711, 0.70711, 0, 0, 0, 0, 0],
    "rloo": [0.25, 0.25, -0.5, 0, -0.7, 0.7, 0, 0, 0, 0, 0],
    "rloo_vectorized": [0.25, 0.25, -0.5, 0, -0.7, 0.7, 0, 0, 0, 0, 0],
    "opo": [1 / 6, 1 / 6, -1 / 3, 0, -0.35, 0.35, 0, 0, 0, 0, 0],
    "grpo_passk": [0, 0, 0, 0, 0, 1.41421, 0, 0, 0, 0, 0],
    # GPG scales by batch / non-zero scores: 5 / 5 on the kept rows (11 / 6 in verl's own, failures included).
    "gpg": [1 / 6, 1 / 6, -1 / 3, 0, -0.35, 0.35, 0, 0, 0, 0, 0],
    "reinforce_plus_plus_baseline": [0.56115, 0.56115, -1.12230, 0, -1.17841, 1.17841, 0, 0, 0, 0, 0],
}


@pytest.mark.parametrize("name", WRAPPED)
def test_valid_rows_get_verls_advantages_of_the_batch_without_the_failed_rows(name):
    estimator = core_algos.get_adv_estimator_fn(f"nemo_gym_{name}")
    config = AlgoConfig(adv_estimator=f"nemo_gym_{name}")
    rewards, mask = rollout_batch(SCORES, VALID)
    with_failures, returns = estimator(token_level_rewards=rewards, response_mask=mask, index=UIDS, config=config)
    removed, _ = estimator(token_level_rewards=rewards[KEPT], response_mask=mask[KEPT], index=UIDS[KEPT], config=config)
    assert torch.allclose(with_failures[KEPT], removed, atol=1e-6)
    assert per_row(with_failures) == pytest.approx(EXPECTED[name], abs=1e-5)
    # Failed rows and group c (one valid member left) are 0 on every token; advantages sit on trained tokens only.
    assert torch.count_nonzero(with_failures[~KEPT]) == 0
    assert torch.count_nonzero(with_failures * (1 - mask)) == 0
    assert torch.equal(returns[~KEPT], torch.zeros_like(returns[~KEPT]))


@pytest.mark.parametrize("name", WRAPPED)
def test_verls_plain_estimator_lets_the_failed_rows_move_their_siblings(name):
    plain = core_algos.get_adv_estimator_fn(name)
    config = AlgoConfig(adv_estimator=name)
    rewards, mask = rollout_batch(SCORES, VALID)
    advantages, _ = plain(token_level_rewards=rewards, response_mask=mask, index=UIDS, config=config)
    # The same rows through the variant are EXPECTED; verl's own differs on some valid row, or is not finite on the
    # group whose every episode failed (OPO: its length-weighted baseline divides 0 by 0; NaN * mask 0 is NaN).
    got = torch.tensor(per_row(advantages))
    expected = torch.tensor(EXPECTED[name], dtype=got.dtype)
    differs = ~torch.isclose(got, expected, atol=1e-5) | ~torch.isfinite(got)
    assert differs.any(), (name, got.tolist())


def test_opo_on_a_group_whose_every_episode_failed_is_nan_in_verl_and_zero_here():
    # OPO's length-weighted baseline already ignores failed rows (length 0), but divides 0 by 0 for a group of them.
    rewards, mask = rollout_batch([1.0, 0.5, 0.0, 0.0], [True, True, False, False])
    uids = np.array(["a", "a", "b", "b"], dtype=object)
    config = AlgoConfig(adv_estimator="opo")
    plain, _ = core_algos.get_adv_estimator_fn("opo")(rewards, mask, uids, config=config)
    aware, _ = core_algos.get_adv_estimator_fn("nemo_gym_opo")(rewards, mask, uids, config=config)
    assert torch.isnan(plain[2:]).all()
    assert per_row(aware) == pytest.approx([0.25, -0.25, 0.0, 0.0])


def test_grpo_honours_norm_adv_by_std_in_grpo_as_verls_inline_grpo_does():
    rewards, mask = rollout_batch([1.0, 0.0, 0.5, 0.0], [True, True, True, False])
    uids = np.array(["a", "a", "a", "a"], dtype=object)
    estimator = core_algos.get_adv_estimator_fn("nemo_gym_grpo")
    dr_grpo, _ = estimator(rewards, mask, uids, config=AlgoConfig(adv_estimator="x", norm_adv_by_std_in_grpo=False))
    grpo, _ = estimator(rewards, mask, uids, config=AlgoConfig(adv_estimator="x", norm_adv_by_std_in_grpo=True))
    assert per_row(dr_grpo) == pytest.approx([0.5, -0.5, 0.0, 0.0])
    assert per_row(grpo) == pytest.approx([1.0, -1.0, 0.0, 0.0], abs=1e-5)


def test_a_group_short_of_valid_members_is_zeroed_only_when_failures_made_it_short():
    valid = np.array([True, False, True, True, True, False, False])
    uids = np.array(["a", "a", "b", "b", "c", "d", "d"], dtype=object)
    # a: 1 of 2 valid (short); b: 2 of 2; c: 1 of 1 (never had more: rollout.n=1 keeps verl's treatment);
    # d: 0 of 2 (short).
    assert groups_short_of_valid(valid, uids, 2).tolist() == [True, True, False, False, False, True, True]
    assert groups_short_of_valid(valid, uids, 1).tolist() == [False, False, False, False, False, True, True]
    assert groups_short_of_valid(valid, uids, 3).tolist() == [True, True, False, False, False, True, True]


def test_min_valid_per_group_three_zeroes_a_group_left_with_two():
    register_failure_aware_estimators(3)
    try:
        rewards, mask = rollout_batch(SCORES, VALID)
        advantages, _ = core_algos.get_adv_estimator_fn("nemo_gym_grpo")(
            rewards, mask, UIDS, config=AlgoConfig(adv_estimator="nemo_gym_grpo")
        )
        assert per_row(advantages)[:6] == pytest.approx([0.57735, 0.57735, -1.1547, 0, 0, 0], abs=1e-5)
    finally:
        register_failure_aware_estimators(2)


def test_verls_compute_advantage_calls_the_registered_variant_by_name(tmp_path, monkeypatch):
    from verl import DataProto

    log = tmp_path / "advantages.jsonl"
    monkeypatch.setenv(advantages.ADVANTAGE_LOG_ENV, str(log))
    rewards, mask = rollout_batch(SCORES, VALID)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask}, non_tensors={"uid": UIDS}
    )
    config = AlgoConfig(adv_estimator="nemo_gym_grpo")
    out = compute_advantage(data, adv_estimator="nemo_gym_grpo", config=config)
    assert per_row(out.batch["advantages"]) == pytest.approx(EXPECTED["grpo"], abs=1e-5)
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert record["estimator"] == "nemo_gym_grpo" and record["uid"] == UIDS.tolist()
    assert record["valid"] == VALID and record["score"] == pytest.approx(SCORES)
    assert record["advantage"] == pytest.approx(EXPECTED["grpo"], abs=1e-5)


def test_registration_is_idempotent_and_names_every_wrapped_estimator():
    register_failure_aware_estimators(2)
    register_failure_aware_estimators(2)
    assert set(FAILURE_AWARE) == {f"nemo_gym_{name}" for name in WRAPPED}
    for name in FAILURE_AWARE:
        assert core_algos.get_adv_estimator_fn(name).__name__ == name
    with pytest.raises(ValueError, match="min_valid_per_group must be >= 1"):
        register_failure_aware_estimators(0)


def test_a_plain_group_estimator_gets_a_warning_naming_its_failure_aware_variant():
    assert plain_estimator_warning("grpo") == (
        "algorithm.adv_estimator=grpo: a failed NeMo Gym episode's reward 0 enters its group's baseline and shifts "
        "its siblings' advantages; set algorithm.adv_estimator=nemo_gym_grpo to compute it over valid episodes only"
    )
    assert plain_estimator_warning("nemo_gym_rloo") is None
    assert plain_estimator_warning("gae") is None  # rows are independent: nothing to warn about


def test_verls_sequence_mean_loss_counts_a_failed_row_and_token_mean_does_not():
    """What `loss_agg_mode_warning` warns of, on verl's own `agg_loss` with the global batch size its trainer passes
    (every row of the mini-batch): 3 valid rows and one failed (mask all 0)."""
    agg_loss = core_algos.agg_loss
    loss = torch.tensor([[1.0, 1.0, 0.0], [2.0, 0.0, 0.0], [3.0, 3.0, 3.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.float32)
    valid = slice(0, 3)
    without_failed = agg_loss(loss[valid], mask[valid], "seq-mean-token-mean", global_batch_size=3)
    assert without_failed.item() == pytest.approx((1.0 + 2.0 + 3.0) / 3)
    with_failed = agg_loss(loss, mask, "seq-mean-token-mean", global_batch_size=4)
    assert with_failed.item() == pytest.approx(without_failed.item() * 3 / 4)
    for mode in SEQUENCE_MEAN_MODES:  # every mode the warning names counts the failed row so
        alone = agg_loss(loss[valid], mask[valid], mode, global_batch_size=3).item()
        assert agg_loss(loss, mask, mode, global_batch_size=4).item() == pytest.approx(alone * 3 / 4), mode
    tokens = int(mask.sum())
    assert agg_loss(loss, mask, "token-mean", batch_num_tokens=tokens).item() == pytest.approx(
        agg_loss(loss[valid], mask[valid], "token-mean", batch_num_tokens=tokens).item()
    )
    assert [m for m in SEQUENCE_MEAN_MODES if loss_agg_mode_warning(m) is None] == []
    assert loss_agg_mode_warning("token-mean") is None and loss_agg_mode_warning("token-sum") is None
