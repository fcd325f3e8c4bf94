# SPDX-License-Identifier: Apache-2.0
"""The example environment `uppercase_share` (`resources_servers/uppercase_share`), for its tests: where it lives,
its agent, exact reward cases and the body of a `/verify` request.

Its tests: the reward function and `verify` in process
(`tests/cpu/unit/resources_servers/test_example_environment_units.py`), the shipped blend started for real
(`tests/cpu/integration/test_example_environment.py`).
"""

from __future__ import annotations

from tests.support.helpers import REPO_ROOT

ENV_DIR = REPO_ROOT / "resources_servers" / "uppercase_share"
AGENT = "uppercase_share_simple_agent"

# (answer, reward, uppercase characters, counted characters): none of the target class, all of it, fractions.
REWARD_CASES = [
    ("hello world", 0.0, 0, 10),
    ("HELLO WORLD", 1.0, 10, 10),
    ("Hello World", 0.2, 2, 10),
    ("ABcd", 0.5, 2, 4),
    ("  A b\n\tC d  ", 0.5, 2, 4),  # whitespace is not counted
    ("YES, 420!", 0.375, 3, 8),  # digits and punctuation count against the answer
    ("ÀÉ AB", 0.5, 2, 4),  # only ASCII A-Z are capitals here
    ("数字 OK", 0.5, 2, 4),
    ("", 0.0, 0, 0),
    (" \n ", 0.0, 0, 0),
]


def response_json(*texts: str, extra_items: tuple[dict, ...] = ()) -> dict:
    """A minimal NeMo Gym response whose assistant messages carry `texts` (one message each)."""
    messages = [
        {
            "id": f"msg_{i}",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        for i, text in enumerate(texts)
    ]
    return {
        "id": "resp_test",
        "object": "response",
        "created_at": 0.0,
        "model": "tiny-qwen3",
        "output": [*extra_items, *messages],
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
    }


def verify_body(*texts: str, extra_items: tuple[dict, ...] = ()) -> dict:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "Answer in CAPITAL LETTERS only."}]},
        "response": response_json(*texts, extra_items=extra_items),
    }
