# SPDX-License-Identifier: Apache-2.0
"""The example environment `uppercase_share` (resources_servers/uppercase_share): its reward, exactly, in process.

- the pure reward function (`uppercase_share`, `count_uppercase`);
- the server's `verify` called in process (NeMo Gym's request/response models, no HTTP): which text is graded;
- the rows it ships.

The shipped blend started for real, `/verify` over HTTP and rows through its agent:
`tests/cpu/integration/test_example_environment.py`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from types import ModuleType

import pytest

from tests.support.gym_imports import restore_process_globals
from tests.support.uppercase_share import AGENT, ENV_DIR, REWARD_CASES, verify_body


@pytest.fixture(scope="module")
def app() -> ModuleType:
    """The server's app.py, loaded from its file as NeMo Gym runs it (a script in its folder, not a package)."""
    spec = importlib.util.spec_from_file_location("uppercase_share_app", ENV_DIR / "app.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the models' annotations through sys.modules
    with restore_process_globals():
        spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("text", "reward", "upper", "counted"), REWARD_CASES)
def test_reward_is_the_share_of_capitals_among_non_whitespace_characters(app, text, reward, upper, counted) -> None:
    assert app.count_uppercase(text) == (upper, counted)
    assert app.uppercase_share(text) == reward


def test_reward_is_graded_and_bounded(app) -> None:
    rewards = [app.uppercase_share("A" * k + "b" * (8 - k)) for k in range(9)]
    assert rewards == [k / 8 for k in range(9)]
    assert all(0.0 <= r <= 1.0 for r in rewards)


# ------------------------------------------------------------------------------------- verify in process


def test_verify_grades_the_assistant_messages_joined_and_reports_the_counts(app) -> None:
    from unittest.mock import MagicMock

    with restore_process_globals():
        from nemo_gym.base_resources_server import BaseVerifyRequest
        from nemo_gym.server_utils import ServerClient

    config = app.UppercaseShareResourcesServerConfig(host="127.0.0.1", port=0, entrypoint="app.py", name="t")
    server = app.UppercaseShareResourcesServer(config=config, server_client=MagicMock(spec=ServerClient))
    reasoning = {"id": "rs_0", "type": "reasoning", "summary": [{"type": "summary_text", "text": "lowercase"}]}
    for texts, reward, upper, counted in [
        (("HELLO",), 1.0, 5, 5),
        (("HEL", "lo"), 0.6, 3, 5),  # every assistant message's text, joined
        ((), 0.0, 0, 0),  # no answer at all
    ]:
        body = BaseVerifyRequest.model_validate(verify_body(*texts, extra_items=(reasoning,)))
        out = asyncio.run(server.verify(body))
        assert (out.reward, out.uppercase_chars, out.counted_chars) == (reward, upper, counted)
        assert out.response.output == body.response.output  # the request is echoed back, as NeMo Gym expects


# ----------------------------------------------------------------------------------------- shipped rows


def test_shipped_rows_name_our_agent_and_follow_nemo_gyms_layout() -> None:
    train = [json.loads(line) for line in (ENV_DIR / "data" / "train.jsonl").read_text().splitlines()]
    example = [json.loads(line) for line in (ENV_DIR / "data" / "example.jsonl").read_text().splitlines()]
    assert len(example) == 5 and example == train[:5]  # NeMo Gym's `gym env test` wants exactly 5 examples
    assert len(train) == 32
    for row in train:
        assert row["agent_ref"] == {"name": AGENT}
        assert row["responses_create_params"]["input"][-1]["role"] == "user"
    assert (ENV_DIR / "requirements.txt").is_file()  # how NeMo Gym recognises a server folder under the cwd
