# SPDX-License-Identifier: Apache-2.0
"""Packing NeMo Gym results into verl 0.9.1 rollout tensors: exact tensors, data faults, verl's own math on them."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from nemo_gym.openai_utils import NeMoGymResponse
from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import agg_loss, compute_grpo_outcome_advantage, get_policy_loss_fn
from verl.utils.model import compute_position_id_with_mask
from verl.workers.config.actor import FSDPActorConfig

from recipe.nemo_gym.failures import EpisodeDataError, EpisodeFailure, FailureCause
from recipe.nemo_gym.metrics import batch_metrics
from recipe.nemo_gym.packing.batch import BatchPacker
from recipe.nemo_gym.packing.episode import Episode, Segment, SegmentKind, episode_from_result
from tests.support.results import pack_batch, synthetic_result

PAD = 0

# A three-call tool episode: prompt [11, 12]; the model says [21, 22]; the tool adds [31, 32, 33]; the model
# says [41]; the user adds [51]; the model says [61, 62].
CALL_1 = ([11, 12], [21, 22], [-0.5, -0.25])
CALL_2 = ([11, 12, 21, 22, 31, 32, 33], [41], [-1.0])
CALL_3 = ([11, 12, 21, 22, 31, 32, 33, 41, 51], [61, 62], [-0.125, -2.0])
MULTI = [CALL_1, CALL_2, CALL_3]


def t(rows, dtype=torch.int64):
    return torch.tensor(rows, dtype=dtype)


def packed_tensors(packed: DataProto) -> dict[str, list]:
    return {key: value.tolist() for key, value in packed.batch.items()}


# --------------------------------------------------------------------------------------------------------
# result -> Episode
# --------------------------------------------------------------------------------------------------------


def test_multi_turn_result_becomes_alternating_segments_over_the_last_calls_tokens():
    episode = episode_from_result(synthetic_result(MULTI, reward=0.5, agent_name="workplace_assistant"))
    assert episode.token_ids.tolist() == [11, 12, 21, 22, 31, 32, 33, 41, 51, 61, 62]
    assert episode.segments == (
        Segment(SegmentKind.PROMPT, 0, 2),
        Segment(SegmentKind.GENERATION, 2, 4),
        Segment(SegmentKind.PROMPT, 4, 7),
        Segment(SegmentKind.GENERATION, 7, 8),
        Segment(SegmentKind.PROMPT, 8, 9),
        Segment(SegmentKind.GENERATION, 9, 11),
    )
    assert episode.response_mask.tolist() == [True, True, False, False, False, True, False, True, True]
    assert episode.response_log_probs.tolist() == [-0.5, -0.25, 0, 0, 0, -1.0, 0, -0.125, -2.0]
    assert (episode.prompt_length, episode.response_length) == (2, 9)
    assert (episode.num_model_calls, episode.num_turns, episode.generated_tokens, episode.env_tokens) == (3, 6, 5, 4)
    assert episode.reward == 0.5
    assert episode.agent_name == "workplace_assistant"


def test_result_validated_and_dumped_by_nemo_gyms_response_model_packs_the_same():
    # The real server returns NeMoGymResponse.model_dump(); the synthetic shape must survive it unchanged.
    result = synthetic_result(MULTI, reward=1.0)
    dumped = json.loads(NeMoGymResponse.model_validate(result["response"]).model_dump_json())
    direct, through_model = episode_from_result(result), episode_from_result({**result, "response": dumped})
    assert through_model.token_ids.tolist() == direct.token_ids.tolist()
    assert through_model.segments == direct.segments
    assert through_model.response_log_probs.tolist() == direct.response_log_probs.tolist()


def test_real_nemo_gym_rollouts_shipped_in_the_wheel_pack():
    # Rollouts recorded by NeMo Gym's own simple_agent + vllm_model with return_token_id_information.
    root = Path(importlib.util.find_spec("nemo_gym").origin).parents[1] / "resources_servers"  # the wheel's, not ours
    path = root / "competitive_coding_challenges" / "data" / "example_rollouts.jsonl"
    results = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    episodes = [episode_from_result(result, max_prompt_length=256) for result in results]
    for result, episode in zip(results, episodes, strict=True):
        (item,) = [o for o in result["response"]["output"] if "prompt_token_ids" in o]
        assert episode.token_ids.tolist() == item["prompt_token_ids"] + item["generation_token_ids"]
        assert episode.response_log_probs.tolist() == pytest.approx(item["generation_log_probs"], abs=1e-6)
        assert (episode.reward, episode.agent_name) == (result["reward"], "simple_agent")
    packed = pack_batch(episodes, prompt_length=256, response_length=2048, pad_token_id=151643)
    mask = packed.data.batch["response_mask"]
    assert mask.sum(-1).tolist() == [e.generated_tokens for e in episodes]
    assert packed.data.non_tensor_batch["data_source"].tolist() == ["simple_agent"] * len(episodes)


def test_incomplete_details_marks_an_episode_stopped_on_length():
    result = synthetic_result([CALL_1])
    result["response"]["incomplete_details"] = {"reason": "max_output_tokens"}
    assert episode_from_result(result).stopped_on_length is True
    assert episode_from_result(synthetic_result([CALL_1])).stopped_on_length is False


# --------------------------------------------------------------------------------------------------------
# Episode -> tensors
# --------------------------------------------------------------------------------------------------------


def test_single_turn_episode_packs_into_verls_padded_layout():
    episode = episode_from_result(synthetic_result([([11, 12, 13], [21, 22, 23], [-0.5, -0.25, -0.125])]))
    packed = pack_batch([episode], prompt_length=4, response_length=5, pad_token_id=PAD).data
    assert packed_tensors(packed) == {
        "prompts": [[0, 11, 12, 13]],
        "responses": [[21, 22, 23, 0, 0]],
        "response_mask": [[1, 1, 1, 0, 0]],
        "input_ids": [[0, 11, 12, 13, 21, 22, 23, 0, 0]],
        "attention_mask": [[0, 1, 1, 1, 1, 1, 1, 0, 0]],
        "position_ids": [[0, 0, 1, 2, 3, 4, 5, 5, 5]],
        "rollout_log_probs": [[-0.5, -0.25, -0.125, 0.0, 0.0]],
        "rm_scores": [[0.0, 0.0, 1.0, 0.0, 0.0]],
        "prompt_length": [3.0],
        "response_length": [3.0],
    }
    assert packed.non_tensor_batch["__num_turns__"].tolist() == [2]
    assert packed.non_tensor_batch["__num_turns__"].dtype == np.int32
    assert packed.non_tensor_batch["multi_modal_inputs"].tolist() == [{}]
    assert packed.meta_info == {}


def test_multi_turn_episode_masks_tool_and_user_tokens():
    packed = pack_batch(
        [episode_from_result(synthetic_result(MULTI, reward=0.75))],
        prompt_length=3,
        response_length=10,
        pad_token_id=PAD,
    )
    assert packed_tensors(packed.data) == {
        "prompts": [[0, 11, 12]],
        "responses": [[21, 22, 31, 32, 33, 41, 51, 61, 62, 0]],
        "response_mask": [[1, 1, 0, 0, 0, 1, 0, 1, 1, 0]],
        "input_ids": [[0, 11, 12, 21, 22, 31, 32, 33, 41, 51, 61, 62, 0]],
        "attention_mask": [[0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]],
        "position_ids": [[0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10]],
        "rollout_log_probs": [[-0.5, -0.25, 0.0, 0.0, 0.0, -1.0, 0.0, -0.125, -2.0, 0.0]],
        "rm_scores": [[0, 0, 0, 0, 0, 0, 0, 0, 0.75, 0]],
        "prompt_length": [2.0],
        "response_length": [9.0],
    }
    assert packed.data.non_tensor_batch["__num_turns__"].tolist() == [6]
    stats = packed.stats
    assert (stats.generated_tokens.tolist(), stats.trained_tokens.tolist(), stats.env_tokens.tolist()) == (
        [5],
        [5],
        [4],
    )
    assert (stats.total_tokens.tolist(), stats.truncated.tolist(), stats.failure_cause.tolist()) == (
        [11],
        [False],
        [""],
    )


def test_tensor_dtypes_and_position_ids_match_verls_own_helpers():
    packed = pack_batch(
        [episode_from_result(synthetic_result(MULTI)), EpisodeFailure(FailureCause.SERVER_ERROR, "503")],
        prompt_length=4,
        response_length=12,
        pad_token_id=PAD,
    ).data
    for key in ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert packed.batch[key].dtype == torch.int64, key
    for key in ("rollout_log_probs", "rm_scores"):
        assert packed.batch[key].dtype == torch.float32, key
    assert torch.equal(packed.batch["position_ids"], compute_position_id_with_mask(packed.batch["attention_mask"]))
    assert torch.equal(packed.batch["input_ids"], torch.cat([packed.batch["prompts"], packed.batch["responses"]], 1))
    # verl's own rm_scores placement (AgentLoopWorker._postprocess): the last valid response token.
    last_valid = packed.batch["attention_mask"][:, 4:].sum(dim=1) - 1
    assert last_valid.tolist() == [8, 0]
    assert packed.batch["rm_scores"][0, 8] == 1.0


def test_episode_longer_than_response_length_is_cut_flagged_and_keeps_its_reward_on_the_last_kept_generation():
    episode = episode_from_result(synthetic_result(MULTI, reward=0.5))
    # Cut inside the second generation's window end: the last kept token (41) is generated.
    six = pack_batch([episode], prompt_length=2, response_length=6, pad_token_id=PAD)
    assert packed_tensors(six.data) == {
        "prompts": [[11, 12]],
        "responses": [[21, 22, 31, 32, 33, 41]],
        "response_mask": [[1, 1, 0, 0, 0, 1]],
        "input_ids": [[11, 12, 21, 22, 31, 32, 33, 41]],
        "attention_mask": [[1, 1, 1, 1, 1, 1, 1, 1]],
        "position_ids": [[0, 1, 2, 3, 4, 5, 6, 7]],
        "rollout_log_probs": [[-0.5, -0.25, 0.0, 0.0, 0.0, -1.0]],
        "rm_scores": [[0, 0, 0, 0, 0, 0.5]],
        "prompt_length": [2.0],
        "response_length": [6.0],
    }
    assert six.stats.truncated.tolist() == [True]
    assert six.stats.trained_tokens.tolist() == [3]
    assert six.stats.generated_tokens.tolist() == [5]
    # Cut inside the tool output: the reward goes to the last generated token (22), not the tool token (32).
    four = pack_batch([episode], prompt_length=2, response_length=4, pad_token_id=PAD)
    assert four.data.batch["responses"].tolist() == [[21, 22, 31, 32]]
    assert four.data.batch["response_mask"].tolist() == [[1, 1, 0, 0]]
    assert four.data.batch["rm_scores"].tolist() == [[0, 0.5, 0, 0]]
    assert batch_metrics(four.stats)["nemo_gym/truncated"] == 1.0
    # Exactly fitting is not a cut.
    nine = pack_batch([episode], prompt_length=2, response_length=9, pad_token_id=PAD)
    assert nine.stats.truncated.tolist() == [False]
    assert nine.data.batch["rm_scores"].tolist() == [[0, 0, 0, 0, 0, 0, 0, 0, 0.5]]


def test_reward_sits_on_the_last_generated_token_when_the_last_call_generated_nothing():
    calls = [([11], [21, 22], [-1.0, -1.0]), ([11, 21, 22, 31], [], [])]
    packed = pack_batch(
        [episode_from_result(synthetic_result(calls, reward=-1))], prompt_length=1, response_length=4, pad_token_id=PAD
    ).data
    assert packed.batch["responses"].tolist() == [[21, 22, 31, 0]]
    assert packed.batch["response_mask"].tolist() == [[1, 1, 0, 0]]
    assert packed.batch["rm_scores"].tolist() == [[0, -1.0, 0, 0]]


def test_failed_episode_carries_its_prompt_and_one_attended_pad_and_trains_on_nothing():
    ok = episode_from_result(synthetic_result([([11, 12], [21], [-0.5])], reward=1.0))
    failed = EpisodeFailure(FailureCause.SERVER_ERROR, "HTTP 503 from the environment", row=1)
    no_prompt = EpisodeFailure(FailureCause.CONTIGUITY_BROKEN, "call 2 differs", row=2)
    long_prompt = EpisodeFailure(FailureCause.PROMPT_TOO_LONG, "too long", row=3)
    packed = pack_batch(
        [ok, failed, no_prompt, long_prompt],
        prompt_length=3,
        response_length=2,
        pad_token_id=9,
        fallback_prompt_ids=[None, [7, 8], None, [1, 2, 3, 4, 5]],
    )
    assert packed_tensors(packed.data) == {
        "prompts": [[9, 11, 12], [9, 7, 8], [9, 9, 9], [3, 4, 5]],
        "responses": [[21, 9], [9, 9], [9, 9], [9, 9]],
        "response_mask": [[1, 0], [0, 0], [0, 0], [0, 0]],
        "input_ids": [[9, 11, 12, 21, 9], [9, 7, 8, 9, 9], [9, 9, 9, 9, 9], [3, 4, 5, 9, 9]],
        "attention_mask": [[0, 1, 1, 1, 0], [0, 1, 1, 1, 0], [0, 0, 1, 1, 0], [1, 1, 1, 1, 0]],
        "position_ids": [[0, 0, 1, 2, 2], [0, 0, 1, 2, 2], [0, 0, 0, 1, 1], [0, 1, 2, 3, 3]],
        "rollout_log_probs": [[-0.5, 0], [0, 0], [0, 0], [0, 0]],
        "rm_scores": [[1.0, 0], [0, 0], [0, 0], [0, 0]],
        # verl's step metrics read these: a failed row has no response (an aborted sample, outside critic/score).
        "prompt_length": [2.0, 2.0, 1.0, 3.0],
        "response_length": [1.0, 0.0, 0.0, 0.0],
    }
    assert packed.stats.failure_cause.tolist() == ["", "server_error", "contiguity_broken", "prompt_too_long"]
    assert packed.stats.failed.tolist() == [False, True, True, True]
    assert packed.data.non_tensor_batch["__num_turns__"].tolist() == [2, 0, 0, 0]
    metrics = batch_metrics(packed.stats)
    assert (metrics["nemo_gym/failed"], metrics["nemo_gym/failed/server_error"]) == (3.0, 1.0)
    assert metrics["nemo_gym/reward/mean"] == 1.0  # means are over packed episodes only


def test_episode_with_prompt_over_the_prompt_length_is_packed_as_a_failure():
    # The manager's route: the cause is decided when the result is read, then the failure is packed masked.
    with pytest.raises(EpisodeDataError) as raised:
        episode_from_result(synthetic_result([([11, 12, 13], [21], [-0.5])]), max_prompt_length=2)
    failure = EpisodeFailure(raised.value.cause, raised.value.detail, row=0)
    packed = pack_batch([failure], prompt_length=2, response_length=2, pad_token_id=PAD)
    assert packed.stats.failure_cause.tolist() == ["prompt_too_long"]
    assert packed.data.batch["response_mask"].tolist() == [[0, 0]]
    assert packed.data.batch["rm_scores"].tolist() == [[0, 0]]


def test_batch_packer_prefaulted_and_filled_in_completion_order_equals_pack_batch_in_row_order():
    outcomes = [
        episode_from_result(synthetic_result(MULTI, reward=0.5, agent_name="a")),
        EpisodeFailure(FailureCause.SERVER_ERROR, "dead", row=1),
        episode_from_result(synthetic_result([CALL_1], reward=1.0, agent_name="b")),
    ]
    fallbacks = [None, [7, 8, 9], None]
    expected = pack_batch(outcomes, prompt_length=3, response_length=6, pad_token_id=PAD, fallback_prompt_ids=fallbacks)
    packer = BatchPacker(3, prompt_length=3, response_length=6, pad_token_id=PAD)
    packer.prefault()  # what the manager does during the rollout wait: it must not change a single value
    for row in (2, 0, 1):
        packer.add(row, outcomes[row], fallback_prompt_ids=fallbacks[row])
    packed = packer.finish()
    assert packed_tensors(packed.data) == packed_tensors(expected.data)
    # The failed row has no agent name and no input data_source was given, so data_source is left out.
    assert "data_source" not in packed.data.non_tensor_batch
    assert packed.stats.failure_cause.tolist() == ["", "server_error", ""]


def test_add_writes_every_element_of_the_tensors_it_allocates_uninitialised():
    # prefault() writes one element per page, not the whole tensor: whatever np.empty handed out must be
    # overwritten by add(). Poison those tensors (rows over a page long) and compare with a clean packing.
    outcomes = [
        episode_from_result(synthetic_result(MULTI, reward=0.5)),
        EpisodeFailure(FailureCause.SERVER_ERROR, "dead", row=1),
        episode_from_result(synthetic_result([CALL_1], reward=1.0)),
    ]
    fallbacks = [None, [7, 8, 9], None]
    shape = dict(prompt_length=600, response_length=700, pad_token_id=PAD)
    expected = pack_batch(outcomes, fallback_prompt_ids=fallbacks, **shape)
    packer = BatchPacker(3, **shape)
    for tensor in (packer.input_ids, packer.prompts, packer.responses, packer.attention_mask, packer.position_ids):
        tensor.fill(0x7777)
    packer.prefault()
    for row in (1, 2, 0):
        packer.add(row, outcomes[row], fallback_prompt_ids=fallbacks[row])
    packed = packer.finish().data
    for key, value in expected.data.batch.items():
        assert torch.equal(packed.batch[key], value), key
    assert not (packed.batch["input_ids"] == 0x7777).any()


def test_batch_packer_refuses_a_row_twice_a_row_outside_and_a_batch_with_rows_missing():
    episode = episode_from_result(synthetic_result([CALL_1]))
    packer = BatchPacker(3, prompt_length=2, response_length=2, pad_token_id=PAD)
    packer.add(1, episode)
    with pytest.raises(ValueError, match="row 1 was already packed"):
        packer.add(1, episode)
    with pytest.raises(ValueError, match="row 3 is outside the batch of 3"):
        packer.add(3, episode)
    with pytest.raises(ValueError, match="2 of 3 rows were never packed \\(first: \\[0, 2\\]\\)"):
        packer.finish()


def test_data_source_comes_from_the_input_rows_or_the_results_agent_names():
    episodes = [
        episode_from_result(synthetic_result([CALL_1], agent_name="math_with_judge")),
        episode_from_result(synthetic_result([CALL_1], agent_name="workplace_assistant")),
    ]
    failure = EpisodeFailure(FailureCause.SERVER_ERROR, "dead")
    from_results = pack_batch(episodes, prompt_length=2, response_length=2, pad_token_id=PAD)
    assert from_results.data.non_tensor_batch["data_source"].tolist() == ["math_with_judge", "workplace_assistant"]
    from_rows = pack_batch(
        [*episodes, failure],
        prompt_length=2,
        response_length=2,
        pad_token_id=PAD,
        data_sources=["math_with_judge", "workplace_assistant", "blackjack"],
    )
    assert from_rows.data.non_tensor_batch["data_source"].tolist() == [
        "math_with_judge",
        "workplace_assistant",
        "blackjack",
    ]
    assert from_rows.stats.data_source.tolist() == ["math_with_judge", "workplace_assistant", "blackjack"]
    # A failure with no input data_source leaves the key out rather than inventing a name.
    unknown = pack_batch([episodes[0], failure], prompt_length=2, response_length=2, pad_token_id=PAD)
    assert "data_source" not in unknown.data.non_tensor_batch


def test_a_result_from_another_agent_than_its_input_row_is_a_row_mixup():
    episode = episode_from_result(synthetic_result([CALL_1], agent_name="math_with_judge"))
    with pytest.raises(ValueError, match="row 0: the result comes from agent 'math_with_judge'.*'blackjack'"):
        pack_batch([episode], prompt_length=2, response_length=2, pad_token_id=PAD, data_sources=["blackjack"])


def test_pack_batch_rejects_bad_arguments():
    episode = episode_from_result(synthetic_result([CALL_1]))
    with pytest.raises(ValueError, match="empty batch"):
        pack_batch([], prompt_length=2, response_length=2, pad_token_id=PAD)
    with pytest.raises(ValueError, match="must be >= 1"):
        pack_batch([episode], prompt_length=2, response_length=0, pad_token_id=PAD)
    with pytest.raises(ValueError, match="fallback_prompt_ids has 2 entries for 1 outcomes"):
        pack_batch([episode], prompt_length=2, response_length=2, pad_token_id=PAD, fallback_prompt_ids=[[1], [2]])
    with pytest.raises(TypeError, match="row 0: expected Episode or EpisodeFailure, got dict"):
        pack_batch([{"reward": 1}], prompt_length=2, response_length=2, pad_token_id=PAD)


# --------------------------------------------------------------------------------------------------------
# data faults
# --------------------------------------------------------------------------------------------------------


def broken(cause_edit):
    result = synthetic_result(MULTI, reward=1.0)
    cause_edit(result)
    return result


def calls_of(result):
    return [item for item in result["response"]["output"] if "prompt_token_ids" in item]


def set_call(index, key, value):
    return lambda result: calls_of(result)[index].__setitem__(key, value)


DATA_FAULTS = [
    # contiguity
    ("retokenised_history", set_call(1, "prompt_token_ids", [11, 12, 21, 99, 31, 32, 33]), "contiguity_broken",
     "model call 2's prompt_token_ids do not extend call 1's prompt \\+ generation: differs at token 3: 99 where"),
    ("history_truncated", set_call(2, "prompt_token_ids", [11, 12, 21]), "contiguity_broken",
     "model call 3's .* is 3 tokens, shorter than the 8-token prefix"),
    ("first_prompt_changed", set_call(2, "prompt_token_ids", [10, 12, 21, 22, 31, 32, 33, 41, 51]),
     "contiguity_broken", "call 3's .* differs at token 0"),
    # missing or malformed generation data
    ("no_token_fields", lambda r: [c.pop(k) for c in calls_of(r) for k in ("prompt_token_ids", "generation_token_ids",
     "generation_log_probs")], "missing_generation", "return_token_id_information"),
    ("log_probs_missing", lambda r: calls_of(r)[1].pop("generation_log_probs"), "missing_generation",
     "model call 2 .*generation_log_probs is NoneType, not a list"),
    ("generation_null", set_call(0, "generation_token_ids", None), "missing_generation",
     "generation_token_ids is NoneType"),
    ("length_mismatch", set_call(2, "generation_log_probs", [-0.1]), "missing_generation",
     "model call 3 has 2 generation_token_ids but 1 generation_log_probs"),
    ("no_response", lambda r: r.pop("response"), "missing_generation", "response.output"),
    ("string_token_ids", set_call(2, "generation_token_ids", ["token_id:61", "token_id:62"]), "missing_generation",
     "token ids are not all 64-bit integers"),
    ("negative_token_id", set_call(2, "generation_token_ids", [61, -1]), "missing_generation", "negative token id -1"),
    ("string_log_prob", set_call(0, "generation_log_probs", [-0.5, "x"]), "missing_generation",
     "model call 1: generation_log_probs not numeric"),
    ("empty_first_prompt", lambda r: r.__setitem__("response", synthetic_result([([], [1], [-1.0])])["response"]),
     "missing_generation", "model call 1 has empty prompt_token_ids"),
    ("nothing_generated", lambda r: r.__setitem__("response", synthetic_result([([1], [], [])])["response"]),
     "missing_generation", "generated no tokens"),
    # non-finite log-probs
    ("nan_log_prob", set_call(1, "generation_log_probs", [math.nan]), "non_finite_logprob",
     "model call 2: generation log-prob nan at response token 5"),
    ("minus_inf_log_prob", set_call(2, "generation_log_probs", [-0.1, -math.inf]), "non_finite_logprob",
     "model call 3: generation log-prob -inf at response token 8"),
    ("float32_overflow_log_prob", set_call(0, "generation_log_probs", [-1e39, -0.1]), "non_finite_logprob",
     "-1e\\+39 at response token 0 is not finite in float32"),
    # reward
    ("reward_missing", lambda r: r.pop("reward"), "bad_reward", "result has no 'reward'"),
    ("reward_null", lambda r: r.__setitem__("reward", None), "bad_reward", "reward None \\(NoneType\\) is not a"),
    ("reward_string", lambda r: r.__setitem__("reward", "1.0"), "bad_reward", "reward '1.0' \\(str\\)"),
    ("reward_bool", lambda r: r.__setitem__("reward", True), "bad_reward", "reward True \\(bool\\)"),
    ("reward_nan", lambda r: r.__setitem__("reward", math.nan), "bad_reward", "reward nan is not finite"),
    # reward components (NeMo Gym 0.7's BaseMultiRewardVerifyResponse)
    ("components_list", lambda r: r.__setitem__("reward_components", [1.0]), "bad_reward",
     "reward_components is list, not a mapping of numbers"),
    ("component_string", lambda r: r.__setitem__("reward_components", {"format": "1"}), "bad_reward",
     "reward_components\\['format'\\] '1' \\(str\\) is not a number"),
    ("component_inf", lambda r: r.__setitem__("reward_components", {"format": math.inf}), "bad_reward",
     "reward_components\\['format'\\] inf is not finite"),
]  # fmt: skip


@pytest.mark.parametrize(("edit", "cause", "message"), [f[1:] for f in DATA_FAULTS], ids=[f[0] for f in DATA_FAULTS])
def test_each_data_fault_raises_episode_data_error_with_its_cause(edit, cause, message):
    with pytest.raises(EpisodeDataError, match=message) as raised:
        episode_from_result(broken(edit))
    assert raised.value.cause is FailureCause(cause)


def test_prompt_longer_than_the_prompt_length_raises_prompt_too_long():
    result = synthetic_result(MULTI)
    assert episode_from_result(result, max_prompt_length=2).prompt_length == 2
    with pytest.raises(EpisodeDataError, match="first prompt is 2 tokens, over the prompt length 1") as raised:
        episode_from_result(result, max_prompt_length=1)
    assert raised.value.cause is FailureCause.PROMPT_TOO_LONG


def test_reward_components_are_read_beside_the_reward_and_a_required_one_missing_is_a_bad_reward():
    result = {**synthetic_result(MULTI, reward=2.0), "reward_components": {"correctness": 1, "format": 1.0}}
    assert episode_from_result(result).reward_components == {"correctness": 1.0, "format": 1.0}
    assert episode_from_result(synthetic_result(MULTI)).reward_components == {}
    assert episode_from_result({**result, "reward_components": None}).reward_components == {}
    required = ("correctness", "schema_valid")
    with pytest.raises(
        EpisodeDataError, match=r"no reward_components \['schema_valid'\] \(algorithm.gdpo_reward_keys"
    ) as raised:
        episode_from_result(result, required_components=required)
    assert raised.value.cause is FailureCause.BAD_REWARD
    assert "it has ['correctness', 'format']" in str(raised.value)


def test_reward_components_reach_the_stats_and_the_gdpo_keys_reach_the_batch_zero_on_a_failed_row():
    def episode(reward, **components):
        return episode_from_result({**synthetic_result([CALL_1], reward=reward), "reward_components": components})

    outcomes = [
        episode(2.0, correctness=1.0, format=1.0),
        EpisodeFailure(FailureCause.SERVER_ERROR, "a 500", row=1),
        episode(0.0),  # an environment without components, in the same batch
        episode(1.0, correctness=0.0, format=1.0),
    ]
    packer = BatchPacker(4, prompt_length=4, response_length=4, pad_token_id=PAD, component_keys=("correctness",))
    for row, outcome in enumerate(outcomes):
        packer.add(row, outcome, data_source="env_a" if row != 2 else "env_b")
    packed = packer.finish()
    components = packed.stats.reward_components
    assert sorted(components) == ["correctness", "format"]
    assert np.array_equal(components["correctness"], [1.0, np.nan, np.nan, 0.0], equal_nan=True)
    assert np.array_equal(components["format"], [1.0, np.nan, np.nan, 1.0], equal_nan=True)
    # verl's GDPO reads np.asarray(non_tensor_batch[key], float32) per row: 0 where failed or absent.
    assert packed.data.non_tensor_batch["correctness"].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert "format" not in packed.data.non_tensor_batch  # only the keys GDPO is told to read travel
    # The metrics: per environment, over its packed episodes that returned the component.
    from recipe.nemo_gym.metrics import environment_metrics

    metrics = environment_metrics(packed.stats)
    assert metrics["nemo_gym/env_a/reward_component/correctness/mean"] == 0.5
    assert metrics["nemo_gym/env_a/reward_component/correctness/max"] == 1.0
    assert metrics["nemo_gym/env_a/reward_component/format/mean"] == 1.0
    assert metrics["nemo_gym/all/reward_component/correctness/mean"] == 0.5
    assert not [key for key in metrics if key.startswith("nemo_gym/env_b/reward_component/")]


def test_verls_gdpo_reads_the_packed_components_and_tells_apart_equal_sums_of_different_composition():
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.ray_trainer import compute_advantage

    def episode(correctness, format_):
        result = synthetic_result([CALL_1], reward=correctness + format_)
        return episode_from_result({**result, "reward_components": {"correctness": correctness, "format": format_}})

    # One group: right but unformatted, wrong but formatted (twice), neither. Rows 0 and 1 have the same sum.
    outcomes = [episode(1.0, 0.0), episode(0.0, 1.0), episode(0.0, 1.0), episode(0.0, 0.0)]
    keys = ("correctness", "format")
    packer = BatchPacker(4, prompt_length=4, response_length=4, pad_token_id=PAD, component_keys=keys)
    for row, outcome in enumerate(outcomes):
        packer.add(row, outcome, data_source="multireward")
    data = packer.finish().data
    data.batch["token_level_rewards"] = data.batch["rm_scores"]
    data.non_tensor_batch["uid"] = np.array(["a"] * 4, dtype=object)
    config = AlgoConfig(adv_estimator="gdpo", gdpo_reward_keys=list(keys))
    gdpo = compute_advantage(data, adv_estimator="gdpo", config=config).batch["advantages"][:, 1].tolist()
    grpo, _ = compute_grpo_outcome_advantage(
        data.batch["rm_scores"], data.batch["response_mask"], data.non_tensor_batch["uid"]
    )
    assert all(math.isfinite(a) for a in gdpo)
    # GRPO sees equal sums; GDPO normalizes each component in the group: the rarer objective met counts more.
    assert grpo[0, 1].item() == pytest.approx(grpo[1, 1].item())
    assert gdpo[1] == pytest.approx(gdpo[2])
    assert gdpo[0] > gdpo[1] > gdpo[3]


def test_result_that_is_not_a_dict_raises_missing_generation():
    with pytest.raises(EpisodeDataError, match="result is list, not a dict") as raised:
        episode_from_result([])
    assert raised.value.cause is FailureCause.MISSING_GENERATION


def test_every_token_of_every_earlier_call_is_checked():
    """Changing any one token of any call but the last breaks contiguity at that call (the check is exact)."""
    for index, key in [(0, "prompt_token_ids"), (0, "generation_token_ids"), (1, "prompt_token_ids"),
                       (1, "generation_token_ids"), (2, "prompt_token_ids")]:  # fmt: skip
        tokens = calls_of(synthetic_result(MULTI))[index][key]
        # The last prompt is only checked against what came before it, which covers its first 8 tokens.
        positions = range(8) if index == 2 else range(len(tokens))
        for position in positions:
            result = synthetic_result(MULTI)
            calls_of(result)[index][key][position] += 1000
            with pytest.raises(EpisodeDataError, match="do not extend") as raised:
                episode_from_result(result)
            assert raised.value.cause is FailureCause.CONTIGUITY_BROKEN, (index, key, position)


@pytest.mark.parametrize(
    ("call", "key", "value", "message"),
    [
        (
            0,
            "prompt_token_ids",
            [11, 12.0],
            "model call 1: prompt_token_ids\\[1\\] is 12.0 \\(float\\): token ids",
        ),
        (1, "generation_token_ids", [-41], "model call 2: generation_token_ids\\[0\\]: negative token id -41"),
        (2, "generation_token_ids", [61, 2**63], f"generation_token_ids\\[1\\] is {2**63}: token ids are not all 64"),
        (2, "generation_token_ids", [61, 2**64], f"generation_token_ids\\[1\\] is {2**64}: token ids are not all 64"),
        (2, "prompt_token_ids", None, "model call 3 .*prompt_token_ids is NoneType, not a list"),
    ],
    ids=["float_in_first_prompt", "negative_generation", "over_int64", "over_uint64", "null_prompt"],
)
def test_a_token_that_is_not_a_64_bit_id_is_named_by_call_list_and_position(call, key, value, message):
    result = synthetic_result(MULTI)
    calls_of(result)[call][key] = value
    with pytest.raises(EpisodeDataError, match=message) as raised:
        episode_from_result(result)
    assert raised.value.cause is FailureCause.MISSING_GENERATION


def test_a_call_that_generated_nothing_keeps_the_segments_contiguous():
    calls = [([1, 2], [], []), ([1, 2, 3], [4], [-0.5])]
    episode = episode_from_result(synthetic_result(calls))
    assert [(s.kind.value, s.start, s.stop) for s in episode.segments] == [
        ("prompt", 0, 2), ("generation", 2, 2), ("prompt", 2, 3), ("generation", 3, 4)
    ]  # fmt: skip
    assert episode.token_ids.tolist() == [1, 2, 3, 4]
    assert episode.response_mask.tolist() == [False, True]


def test_episode_is_frozen():
    episode = episode_from_result(synthetic_result([CALL_1]))
    assert isinstance(episode, Episode)
    with pytest.raises(AttributeError):
        episode.reward = 2.0


# --------------------------------------------------------------------------------------------------------
# verl's own advantage and loss on a packed batch
# --------------------------------------------------------------------------------------------------------


def grpo_batch():
    def ep(reward, generated):
        return episode_from_result(
            synthetic_result(
                [([11, 12], generated[:2], [-0.5, -1.5]), ([11, 12, *generated[:2], 31], generated[2:], [-0.25] * 2)],
                reward=reward,
            )
        )

    outcomes = [
        ep(1.0, [21, 22, 23, 24]),
        ep(0.0, [25, 26, 27, 28]),
        EpisodeFailure(FailureCause.SERVER_ERROR, "dead"),
        ep(0.5, [21, 22, 23, 24]),
        ep(0.25, [25, 26, 27, 28]),
        EpisodeFailure(FailureCause.NON_FINITE_LOGPROB, "nan"),
    ]
    uids = np.array(["a", "a", "a", "b", "b", "b"], dtype=object)
    packed = pack_batch(
        outcomes, prompt_length=3, response_length=6, pad_token_id=PAD, fallback_prompt_ids=[[11, 12]] * 6
    ).data
    return packed, uids


def test_grpo_advantages_are_finite_and_zero_on_failed_rows():
    packed, uids = grpo_batch()
    advantages, returns = compute_grpo_outcome_advantage(
        token_level_rewards=packed.batch["rm_scores"], response_mask=packed.batch["response_mask"], index=uids
    )
    assert torch.isfinite(advantages).all() and torch.isfinite(returns).all()
    assert advantages[2].abs().sum() == 0 and advantages[5].abs().sum() == 0
    # Packed rows get their group-normalised score on every generated token and nothing elsewhere.
    mask = packed.batch["response_mask"].bool()
    assert (advantages[~mask] == 0).all()
    scores_a = torch.tensor([1.0, 0.0, 0.0])
    expected_row0 = ((1.0 - scores_a.mean()) / (scores_a.std() + 1e-6)).item()
    assert advantages[0][mask[0]].tolist() == pytest.approx([expected_row0] * 4)


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_policy_loss_is_finite_and_failed_rows_get_no_gradient(loss_agg_mode):
    packed, uids = grpo_batch()
    response_mask = packed.batch["response_mask"]
    advantages, _ = compute_grpo_outcome_advantage(
        token_level_rewards=packed.batch["rm_scores"], response_mask=response_mask, index=uids
    )
    config = FSDPActorConfig(strategy="fsdp", ppo_mini_batch_size=6, ppo_micro_batch_size_per_gpu=6, rollout_n=3)
    policy_loss = get_policy_loss_fn(config.policy_loss.get("loss_mode", "vanilla"))
    old_log_prob = packed.batch["rollout_log_probs"]
    torch.manual_seed(0)
    log_prob = (old_log_prob + 0.1 * torch.randn_like(old_log_prob)).requires_grad_(True)
    loss, metrics = policy_loss(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
    )
    loss.backward()
    assert torch.isfinite(loss) and all(math.isfinite(v) for v in metrics.values())
    assert log_prob.grad[2].abs().sum() == 0 and log_prob.grad[5].abs().sum() == 0
    assert log_prob.grad[[0, 1, 3, 4]].abs().sum() > 0
    # Whatever the model says about a failed row's tokens, the loss does not change.
    with torch.no_grad():
        moved = log_prob.detach().clone()
        moved[[2, 5]] = -30.0
        moved_loss, _ = policy_loss(
            old_log_prob=old_log_prob,
            log_prob=moved,
            advantages=advantages,
            response_mask=response_mask,
            loss_agg_mode=loss_agg_mode,
            config=config,
        )
    assert moved_loss.item() == pytest.approx(loss.item())
    # The entropy / KL style aggregations verl also runs over the response stay finite.
    assert torch.isfinite(agg_loss(-log_prob.detach(), response_mask, loss_agg_mode))


def test_packed_batch_unions_with_the_trainers_batch_and_survives_verl_batch_ops():
    packed, _ = grpo_batch()
    trainer_batch = DataProto.from_single_dict(
        {"dummy_tensor": torch.zeros(6, 1, dtype=torch.uint8), "uid": np.array(list("aaabbb"), dtype=object)}
    )
    merged = trainer_batch.union(packed)
    assert set(merged.batch.keys()) >= {"prompts", "responses", "rm_scores", "dummy_tensor"}
    halves = merged.chunk(2)
    assert DataProto.concat(halves).batch["input_ids"].tolist() == packed.batch["input_ids"].tolist()


def test_packer_refuses_an_episode_longer_than_the_prompt_length_instead_of_deciding_its_failure():
    # PROMPT_TOO_LONG is decided once, where the result is read, so it reaches the manager's failure budget.
    episode = episode_from_result(synthetic_result([([11, 12], [21], [-0.5])]))
    with pytest.raises(ValueError, match="row 0: first prompt is 2 tokens, over the prompt length 1"):
        pack_batch([episode], prompt_length=1, response_length=2, pad_token_id=PAD)


def test_failed_rows_are_left_out_of_verls_score_metrics_and_the_plugins_validation_score():
    from verl.trainer.ppo.metric_utils import compute_data_metrics

    from recipe.nemo_gym.metrics import environment_metrics, validation_extra_info

    ok = [episode_from_result(synthetic_result([([11, 12], [21, 22], [-0.5, -0.5])], reward=r)) for r in (1.0, 0.5)]
    failed = EpisodeFailure(FailureCause.SERVER_ERROR, "HTTP 503", row=2)
    packed = pack_batch([ok[0], ok[1], failed], prompt_length=2, response_length=3, pad_token_id=PAD)
    data = packed.data
    # What verl's fit adds before its step metrics (no critic, no KL in the reward).
    data.batch["token_level_scores"] = data.batch["token_level_rewards"] = data.batch["rm_scores"]
    data.batch["advantages"] = data.batch["returns"] = torch.zeros_like(data.batch["rm_scores"])
    metrics = compute_data_metrics(data, use_critic=False)
    assert metrics["critic/score/mean"] == 0.75  # (1.0 + 0.5) / 2: the failed row's 0 is not averaged in
    assert metrics["critic/rewards/mean"] == 0.75
    assert metrics["response/aborted_ratio"] == pytest.approx(1 / 3)
    # Validation: `acc` is None for the failed episode, which verl's aggregation skips.
    assert validation_extra_info(packed.stats)["acc"].tolist() == [1.0, 0.5, None]
    # Retries and groups short of valid episodes, from the attempts and uids the manager adds.
    stats = dataclasses.replace(packed.stats, attempts=np.array([2, 1, 3]), uid=np.array(["a", "b", "b"], dtype=object))
    counted = environment_metrics(stats, min_valid_per_group=2)
    assert (counted["nemo_gym/all/retried"], counted["nemo_gym/all/recovered"]) == (2.0, 1.0)
    assert counted["nemo_gym/all/groups_short_of_valid"] == 1.0  # group b: one valid of two
    assert "nemo_gym/all/groups_short_of_valid" not in environment_metrics(stats)  # a plain estimator: not counted
