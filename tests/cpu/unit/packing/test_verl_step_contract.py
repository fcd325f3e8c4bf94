# SPDX-License-Identifier: Apache-2.0
"""A packed batch survives the conversions verl 0.9.1's trainer applies at every training step (fast, no servers).

`RayPPOTrainer._compute_old_log_prob` / `_update_actor` turn the rollout's `DataProto` into a TensorDict
(`DataProto.to_tensordict`, which asserts tensordict >= 0.10) and strip the padding (`left_right_2_no_padding`);
the actor's per-token outputs come back through `no_padding_2_padding`. With tensordict 0.8.3 (the lock before
this test existed) the first call raised at step 1 on every machine. Here the real verl functions run on a batch
packed by the plugin, and every token of every row must come back where it was.
"""

from __future__ import annotations

import tensordict
import torch
from packaging.version import Version
from verl import DataProto
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

from recipe.nemo_gym.failures import EpisodeFailure, FailureCause
from recipe.nemo_gym.packing.episode import episode_from_result
from tests.support.results import pack_batch, synthetic_result

PAD = 0
CALL_1 = ([11, 12], [21, 22], [-0.5, -0.25])
CALL_2 = ([11, 12, 21, 22, 31, 32, 33], [41], [-1.0])
SINGLE = ([7, 8, 9], [5, 6, 4], [-0.1, -0.2, -0.3])


def packed_batch() -> DataProto:
    outcomes = [
        episode_from_result(synthetic_result([CALL_1, CALL_2], reward=1.0, agent_name="workplace")),
        episode_from_result(synthetic_result([SINGLE], reward=0.25, agent_name="math")),
        EpisodeFailure(FailureCause.SERVER_ERROR, "500 from the agent", row=2),
    ]
    packed = pack_batch(
        outcomes, prompt_length=4, response_length=8, pad_token_id=PAD, fallback_prompt_ids=[None, None, [3, 3]]
    )
    return packed.data


def test_locked_tensordict_is_one_verl_trainer_accepts():
    assert Version(tensordict.__version__) >= Version("0.10")


def test_packed_batch_converts_to_tensordict_and_back_without_change():
    data = packed_batch()
    td = data.to_tensordict()
    back = DataProto.from_tensordict(td)
    for key, value in data.batch.items():
        assert torch.equal(back.batch[key], value), key


def test_no_padding_round_trip_returns_every_response_token_to_its_place():
    data = packed_batch()
    td = left_right_2_no_padding(data.to_tensordict())
    # verl's actor returns one value per non-padding token; use each token's own id as that value.
    input_ids = tu.get(td, "input_ids")
    per_token = torch.nested.nested_tensor_from_jagged(
        input_ids.values().to(torch.float32), offsets=input_ids.offsets()
    )
    restored = no_padding_2_padding(per_token, td)
    # Response position t gets the output at the token before it (the one that predicts it), as for log-probs:
    # row 0 = prompt [11, 12] + generation [21, 22] + tool [31, 32, 33] + generation [41];
    # row 1 = prompt [7, 8, 9] + generation [5, 6, 4]; row 2 = a failed row's fallback prompt [3, 3] + one pad.
    expected = torch.tensor(
        [
            [12, 21, 22, 31, 32, 33, 0, 0],
            [9, 5, 6, 0, 0, 0, 0, 0],
            [3, 0, 0, 0, 0, 0, 0, 0],
        ],
        dtype=torch.float32,
    )
    assert torch.equal(restored, expected)
    assert data.batch["response_mask"].tolist() == [
        [1, 1, 0, 0, 0, 1, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0],
    ]
