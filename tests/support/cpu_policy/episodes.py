# SPDX-License-Identifier: Apache-2.0
"""A scripted policy that plays NeMo Gym's shipped example rows (math and workplace assistant) for real.

For the CPU end-to-end test and `demo --policy scripted`: every turn is decided in advance, so tests can
assert exact outcomes, while the environments, their tools and their verifiers are NeMo Gym's own. Every
completion is generated one token per character, so re-tokenising any turn gives other IDs than the
"model" produced, which is exactly what the splice and the contiguity checks must survive.

- math rows: a `<think>` block, then `\\boxed{32}`: reward 1 on the row whose expected answer is 32, 0 on
  the others (math-verify decides).
- the workplace row about Carlos's email: the tool call the ground truth expects (`email_reply_email`), then a
  closing message: reward 1 from the environment's state comparison.
- every other workplace row: one harmless lookup (`company_directory_find_email_address`), then a closing
  message: two model calls with a real tool result between them, reward 0.

`tools_and_games_policy` plays `configs/tools_and_games.yaml`'s environments: the weather rows call `get_weather`
and answer once its result is in (reward 1); blackjack hits once, then stands (the game's own cards decide).

`server_test_policy` is the script of the CPU policy server's own tests (its pure functions in
`tests/cpu/unit/testing_support/test_cpu_policy_server_units.py`, the server over HTTP in
`tests/cpu/integration/test_cpu_policy_server.py`): a greeting one token per character, a weather tool call with
its reasoning (`SERVER_TEST_TOOL_CALL`), the answer after the tool's result on another stop token, explicit token
IDs; the tiny model for everything else.
"""

from __future__ import annotations

import json

from tests.support.cpu_policy.qwen3 import ENDOFTEXT
from tests.support.cpu_policy.script import ScriptCompletion, ScriptedPolicy, ScriptMatch, ScriptRule

CARLOS_REPLY = {"email_id": "00000057", "body": "Thanks for the update - I will get back to you tomorrow."}


def _say(text: str) -> ScriptCompletion:
    """`text` as one token per character: re-tokenizing the decoded text gives other IDs, as with a real model."""
    return ScriptCompletion(text=text, split="char")


def _tool_call(name: str, arguments: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def example_episodes_policy() -> ScriptedPolicy:
    return ScriptedPolicy(
        rules=[
            ScriptRule(
                name="math answer",
                when=ScriptMatch(last_message_regex="Solve the following math problem"),
                completion=_say("<think>\nThe known count is 32.\n</think>\n\nThe answer is \\boxed{32}."),
            ),
            ScriptRule(
                name="tool result seen: close",
                when=ScriptMatch(last_message_regex="<tool_response>"),
                completion=_say("Done: I have taken care of it."),
            ),
            ScriptRule(
                name="reply to carlos",
                when=ScriptMatch(assistant_turns=0, last_message_regex="Reply to carlos's last email"),
                completion=_say(_tool_call("email_reply_email", CARLOS_REPLY)),
            ),
            ScriptRule(
                name="other workplace task: look someone up",
                when=ScriptMatch(assistant_turns=0),
                completion=_say(_tool_call("company_directory_find_email_address", {"name": "carlos"})),
            ),
        ]
    )


WEATHER_CALL = _tool_call("get_weather", {"city": "San Francisco"})


def tools_and_games_policy() -> ScriptedPolicy:
    return ScriptedPolicy(
        rules=[
            ScriptRule(
                name="weather: tool result seen, answer",
                when=ScriptMatch(last_message_regex="<tool_response>"),
                completion=_say("It is cold in San Francisco: take a coat."),
            ),
            ScriptRule(
                name="blackjack: first hand, hit",
                when=ScriptMatch(assistant_turns=0, last_message_regex="Your hand:|Deal me in"),
                completion=_say("<think>\nOne more card.\n</think>\n\n<action>hit</action>"),
            ),
            ScriptRule(
                name="blackjack: later hands, stand",
                when=ScriptMatch(last_message_regex="Your hand:"),
                completion=_say("<action>stand</action>"),
            ),
            ScriptRule(
                name="weather: first turn, call the tool",
                when=ScriptMatch(assistant_turns=0),
                completion=_say(WEATHER_CALL),
            ),
        ]
    )


SERVER_TEST_TOOL_CALL = (
    "<think>\nI need the weather.\n</think>\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)


def server_test_policy() -> ScriptedPolicy:
    return ScriptedPolicy(
        fallback="model",
        rules=[
            ScriptRule(
                name="greet-by-char",
                when=ScriptMatch(last_message_regex=r"^user\nhello"),
                completion=ScriptCompletion(text="Hello there!", split="char"),
            ),
            ScriptRule(
                name="weather-tool",
                when=ScriptMatch(last_message_regex=r"weather", assistant_turns=0),
                completion=ScriptCompletion(text=SERVER_TEST_TOOL_CALL),
            ),
            ScriptRule(
                name="after-tool",
                when=ScriptMatch(last_message_regex=r"<tool_response>", assistant_turns=1),
                completion=ScriptCompletion(text="It is sunny.", end="stop_token", stop_token_id=ENDOFTEXT),
            ),
            ScriptRule(
                name="explicit-ids",
                when=ScriptMatch(prompt_regex=r"say ids"),
                completion=ScriptCompletion(token_ids=[9707, 11, 1879], end="length", logprobs=[-0.5, -0.25, -0.125]),
            ),
        ],
    )
