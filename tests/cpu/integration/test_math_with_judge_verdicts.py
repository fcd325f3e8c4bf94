# SPDX-License-Identifier: Apache-2.0
"""NeMo Gym's own `math_with_judge` `verify` (the installed Gym's server object in this process; each check forks a
process for math-verify) against `missing_verdict_failure`: a right, a wrong and a verdict-less answer are told
apart by the fields Gym returns. The pure cases are in `tests/cpu/unit/test_failures.py`."""

from __future__ import annotations

import pytest

from recipe.nemo_gym.failures import FailureCause

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("expected_answer", "verdict"), [("32", "right"), ("31", "wrong"), ("", "none: the check raised, Gym scored 0")]
)
def test_math_with_judge_verify_responses_are_told_apart_by_their_fields(expected_answer, verdict):
    """The signature read from NeMo Gym's own `verify` (the installed Gym's code, its forked math-verify check): an
    expected answer math-verify cannot parse makes the check raise, and Gym answers exactly as it does when the
    check times out or dies (reward 0, no extracted answer)."""
    import asyncio

    from nemo_gym.config_types import BaseServerConfig
    from nemo_gym.server_utils import ServerClient
    from omegaconf import OmegaConf
    from resources_servers.math_with_judge.app import (
        LibraryJudgeMathResourcesServer,
        LibraryJudgeMathResourcesServerConfig,
        LibraryJudgeMathVerifyRequest,
    )

    from recipe.nemo_gym.gym.over_http.outcomes import missing_verdict_failure

    config = LibraryJudgeMathResourcesServerConfig.model_validate(
        {
            "host": "127.0.0.1",
            "port": 0,
            "entrypoint": "app.py",
            "name": "math_with_judge",
            "judge_model_server": {"type": "responses_api_models", "name": "policy_model"},
            "judge_responses_create_params": {"input": []},
            "should_use_judge": False,
        }
    )
    client = ServerClient(
        head_server_config=BaseServerConfig(host="127.0.0.1", port=9), global_config_dict=OmegaConf.create({})
    )
    server = LibraryJudgeMathResourcesServer(config=config, server_client=client)
    text = "<think>\nThe known count is 32.\n</think>\n\nThe answer is \\boxed{32}."
    response = {
        "id": "resp_1",
        "created_at": 0.0,
        "model": "policy",
        "object": "response",
        "output": [
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
    }
    request = LibraryJudgeMathVerifyRequest.model_validate(
        {
            "responses_create_params": {"input": [{"role": "user", "content": "How many?"}]},
            "response": response,
            "question": "How many?",
            "expected_answer": expected_answer,
        }
    )
    result = asyncio.run(server.verify(request)).model_dump(mode="json")
    failure = missing_verdict_failure(0, "math_with_judge", result)
    if verdict == "right":
        assert (result["reward"], result["extracted_answer"], failure) == (1.0, "32", None)
    elif verdict == "wrong":
        assert (result["reward"], result["extracted_answer"], failure) == (0.0, "32", None)
    else:
        assert (result["reward"], result["extracted_answer"], result["library_reward"]) == (0.0, None, 0.0)
        assert failure is not None and failure.cause is FailureCause.ENVIRONMENT_FAILED
