# SPDX-License-Identifier: Apache-2.0
"""verl's sampling settings reach NeMo Gym's request exactly (greedy where verl marks rows not to sample), nothing
else in the row changes, and a validation batch's padding is recognised."""

import json

import numpy as np
import pytest
from omegaconf import OmegaConf

from recipe.nemo_gym.rollout_requests import (
    Sampling,
    build_example,
    real_rows,
    row_samplings,
    sampling_from_rollout_config,
)
from recipe.nemo_gym_demo.data import write_jsonl

ROLLOUT = OmegaConf.create(
    {
        "temperature": 0.8,
        "top_p": 0.95,
        "top_k": -1,
        "response_length": 512,
        "val_kwargs": {"temperature": 0.6, "top_p": 1.0, "top_k": 20, "do_sample": True},
    }
)

ROW = {
    "responses_create_params": {
        "input": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "name": "f", "parameters": {}}],
        "temperature": 0.1,
        "metadata": None,
    },
    "agent_ref": {"name": "workplace_assistant_simple_agent"},
    "expected_answer": "32",
}


def test_training_sampling_overrides_the_rows_own_and_drops_null_metadata():
    sampling = sampling_from_rollout_config(ROLLOUT, validate=False)
    assert sampling == Sampling(temperature=0.8, top_p=0.95, top_k=-1, max_output_tokens=512)
    example = build_example(ROW, sampling)
    assert example["responses_create_params"] == {
        "input": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "name": "f", "parameters": {}}],
        "temperature": 0.8,
        "top_p": 0.95,
        "max_output_tokens": 512,
    }
    assert example["agent_ref"] == ROW["agent_ref"] and example["expected_answer"] == "32"
    assert ROW["responses_create_params"]["temperature"] == 0.1  # the input row is not mutated


@pytest.mark.parametrize(("own", "sent"), [(None, 512), (32, 32), (512, 512), (4096, 512)])
def test_a_rows_own_token_limit_is_kept_when_the_response_length_allows_it(own, sent):
    params = {**ROW["responses_create_params"], **({"max_output_tokens": own} if own is not None else {})}
    sampling = sampling_from_rollout_config(ROLLOUT, validate=False)
    assert (
        build_example({**ROW, "responses_create_params": params}, sampling)["responses_create_params"][
            "max_output_tokens"
        ]
        == sent
    )


def test_validation_uses_val_kwargs_and_top_k_travels_in_metadata_extra_body():
    row = {**ROW, "responses_create_params": {**ROW["responses_create_params"], "metadata": {"extra_body": '{"a": 1}'}}}
    sampling = sampling_from_rollout_config(ROLLOUT, validate=True)
    assert sampling == Sampling(temperature=0.6, top_p=1.0, top_k=20, max_output_tokens=512)
    params = build_example(row, sampling)["responses_create_params"]
    assert json.loads(params["metadata"]["extra_body"]) == {"a": 1, "top_k": 20}


def test_validation_without_sampling_is_greedy():
    rollout = OmegaConf.merge(ROLLOUT, {"val_kwargs": {"do_sample": False}})
    assert sampling_from_rollout_config(rollout, validate=True).temperature == 0.0


# ------------------------------------------------------------------------- rows verl marks not to sample

GREEDY = Sampling(temperature=0.0, top_p=1.0, top_k=-1, max_output_tokens=512)
SAMPLED = Sampling(temperature=0.8, top_p=0.95, top_k=-1, max_output_tokens=512)


def test_training_rows_marked_do_sample_false_go_out_greedy_as_in_verls_agent_loop():
    # verl 0.9.1's REMAX step: n sampled rows (__do_sample__ True) then one greedy baseline row per prompt (False).
    flags = np.array([True, True, False], dtype=bool)
    samplings = row_samplings(ROLLOUT, {"global_steps": 3}, flags, 3)
    assert samplings == [SAMPLED, SAMPLED, GREEDY]
    params = build_example(ROW, samplings[2])["responses_create_params"]
    assert (params["temperature"], params["top_p"]) == (0.0, 1.0) and "metadata" not in params


def test_greedy_rows_drop_top_k_while_sampled_rows_keep_it():
    rollout = OmegaConf.merge(ROLLOUT, {"top_k": 20})
    sampled, greedy = row_samplings(rollout, {}, np.array([True, False]), 2)
    assert json.loads(build_example(ROW, sampled)["responses_create_params"]["metadata"]["extra_body"]) == {"top_k": 20}
    assert "metadata" not in build_example(ROW, greedy)["responses_create_params"]


def test_batch_flag_do_sample_false_makes_the_whole_batch_greedy():
    assert row_samplings(ROLLOUT, {"do_sample": False}, None, 2) == [GREEDY, GREEDY]
    assert row_samplings(ROLLOUT, {"do_sample": True}, None, 1) == [SAMPLED]
    assert row_samplings(ROLLOUT, {}, None, 1) == [SAMPLED]


def test_validation_follows_val_kwargs_and_the_trainers_flag_and_ignores_row_flags():
    # verl applies __do_sample__ only outside validation; the trainer sets meta_info["do_sample"] from val_kwargs.
    val = Sampling(temperature=0.6, top_p=1.0, top_k=20, max_output_tokens=512)
    flags = np.array([False, True])
    assert row_samplings(ROLLOUT, {"validate": True, "do_sample": True}, flags, 2) == [val, val]
    assert row_samplings(ROLLOUT, {"validate": True, "do_sample": False}, flags, 2) == [GREEDY, GREEDY]
    rollout = OmegaConf.merge(ROLLOUT, {"val_kwargs": {"do_sample": False}})
    assert row_samplings(rollout, {"validate": True}, None, 1) == [GREEDY]


def test_row_flags_shorter_than_the_batch_are_refused():
    with pytest.raises(ValueError, match="__do_sample__ has 1 entries for a batch of 2 rows"):
        row_samplings(ROLLOUT, {}, np.array([True]), 2)


# ------------------------------------------------------------------------------- validation padding


def _uids(prompts: int, n: int) -> list[str]:
    return [f"u{p}" for p in range(prompts) for _ in range(n)]


def _padded(values: list, divisor: int) -> list:
    """verl's pad_dataproto_to_divisor on a list: copies of the leading rows appended until a multiple."""
    out = list(values)
    while len(out) % divisor:
        out.append(values[(len(out) - len(values)) % len(values)])
    return out


@pytest.mark.parametrize(("prompts", "n", "divisor"), [(10, 1, 8), (3, 1, 8), (1, 1, 8), (5, 2, 8), (7, 3, 4)])
def test_real_rows_finds_verls_padding(prompts, n, divisor):
    uids = _uids(prompts, n)
    rows = [{"q": uid} for uid in uids]
    padded_uids, padded_rows = _padded(uids, divisor), _padded(rows, divisor)
    assert len(padded_uids) > len(uids)
    assert real_rows(
        np.array(padded_uids, dtype=object), np.array(padded_rows, dtype=object), n=n, divisor=divisor
    ) == (prompts * n)


def test_real_rows_takes_every_row_as_real_when_the_batch_does_not_look_padded():
    uids = _uids(4, 2)
    rows = [{"q": uid} for uid in uids]
    assert real_rows(uids, rows, n=2, divisor=8) == 8  # already a multiple: no padding
    assert real_rows(None, rows, n=2, divisor=8) == 8  # no uids
    padded_uids, padded_rows = _padded(uids[:6], 8), _padded(rows[:6], 8)
    assert real_rows(padded_uids, padded_rows, n=2, divisor=8) == 6
    assert real_rows(padded_uids, padded_rows, n=1, divisor=8) == 8  # uids occur twice, not n=1 times
    assert real_rows(padded_uids, padded_rows, n=2, divisor=16) == 8  # 6 rounds up to 16, not 8
    other = [*padded_rows[:6], {"q": "something else"}, padded_rows[7]]
    assert real_rows(padded_uids, other, n=2, divisor=8) == 8  # a "copy" that differs from its row
    tail = [*uids[:6], "u1", "u1"]  # extra rows that copy rows 2-3, not the leading rows 0-1
    assert real_rows(tail, [{"q": uid} for uid in tail], n=2, divisor=8) == 8


def test_real_rows_on_the_batch_verls_validation_builds(tmp_path):
    from recipe.nemo_gym.dataset import ROW_KEY, NeMoGymJSONLDataset
    from tests.support.cpu_policy import harness

    rows = [
        {"responses_create_params": {"input": f"q{i}"}, "agent_ref": {"name": "math_with_judge_simple_agent"}}
        for i in range(10)
    ]
    data = write_jsonl(rows, tmp_path / "rows.jsonl")
    config = harness.compose_verl_config(
        harness.cpu_trainer_overrides(
            tmp_path,
            harness.REPO_ROOT / "recipe/nemo_gym/configs/math.yaml",
            prompt_length=64,
            response_length=64,
            n=2,
            batch_size=10,
        )
        + ["actor_rollout_ref.rollout.val_kwargs.n=3"]
    )
    dataset = NeMoGymJSONLDataset(data_files=[str(data)], tokenizer=None, processor=None, config=config.data)
    _, batch = harness.trainer_batches(dataset, range(10), config, validate=True)
    assert len(batch) == 32  # 10 prompts x 3, padded to a multiple of rollout.agent.num_workers (8)
    found = real_rows(batch.non_tensor_batch["uid"], batch.non_tensor_batch[ROW_KEY], n=3, divisor=8)
    assert found == 30
