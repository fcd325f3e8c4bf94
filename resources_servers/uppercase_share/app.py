# SPDX-License-Identifier: Apache-2.0
"""`uppercase_share`: a NeMo Gym resources server with a graded reward, the example of adding an environment.

What it checks: the prompt asks the model to answer in CAPITAL LETTERS, and `/verify` grades the answer's text
(every `output_text` of the assistant's messages, joined) by how much of it is written in capitals:

    reward = (characters in A-Z) / (characters that are not whitespace)        (0.0 when there are none)

So "HELLO WORLD" scores 1.0, "Hello World" 0.2, "hello" 0.0, an empty answer 0.0. Digits, punctuation, lowercase
and non-Latin characters all count against the answer; whitespace is ignored. The score is continuous in
[0, 1]: unlike a 0/1 "correct answer" reward, two samples of the same prompt almost never score the same, so
every GRPO group has a non-zero spread and therefore an advantage to learn from, even for a random-weight model.
That is why this environment exists in the plugin: it is the one environment on which the tiny CPU test model
visibly learns within a few verl steps (see README.md beside this file for the measurements and settings).

How NeMo Gym runs it: `configs/uppercase_share.yaml` declares the resources server (`uppercase_share`, this
file's `UppercaseShareResourcesServer`) and an agent (`uppercase_share_simple_agent`, NeMo Gym's stock
`simple_agent`) that calls the policy once and then posts the episode here to `/verify`. A JSONL row reaches it
through `agent_ref.name: uppercase_share_simple_agent` (see `data/`). NeMo Gym starts the server with
`python app.py` from this folder, which it finds as `resources_servers/uppercase_share` under the current
directory (user servers) before the installed package (built-in servers): run the trainer from the repository
root.

This file imports nothing from the plugin: NeMo Gym starts it as a script in its own process.
"""

from typing import Any, ClassVar

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)

UPPERCASE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def count_uppercase(text: str) -> tuple[int, int]:
    """`(uppercase, counted)`: characters in A-Z, and characters that are not whitespace."""
    counted = uppercase = 0
    for char in text:
        if char.isspace():
            continue
        counted += 1
        uppercase += char in UPPERCASE
    return uppercase, counted


def uppercase_share(text: str) -> float:
    """The reward: the share of the non-whitespace characters of `text` that are ASCII capitals (0.0 if none)."""
    uppercase, counted = count_uppercase(text)
    return uppercase / counted if counted else 0.0


def response_text(response: Any) -> str:
    """The assistant's visible answer: every `output_text` of every assistant message, in order, joined.

    Tool calls, tool outputs and reasoning items are not part of the answer and are skipped.
    """
    parts = []
    for item in response.output:
        if item.type != "message" or getattr(item, "role", "assistant") != "assistant":
            continue
        for content in item.content:
            if content.type == "output_text":
                parts.append(content.text)
    return "".join(parts)


class UppercaseShareResourcesServerConfig(BaseResourcesServerConfig):
    """No settings of its own; `entrypoint`, `host`, `port` and `name` come from NeMo Gym's base config."""


class UppercaseShareVerifyResponse(BaseVerifyResponse):
    """NeMo Gym's verify response (the request echoed back, plus `reward`) with the two counts behind it."""

    uppercase_chars: int
    counted_chars: int


class UppercaseShareResourcesServer(SimpleResourcesServer):
    """Grades an episode by the share of capitals in the answer. Stateless: no tools, no session."""

    config: UppercaseShareResourcesServerConfig
    # No Ray in this server: NeMo Gym 0.7 then skips connecting it to its Ray cluster (0.4 ignores the key).
    ray_enabled: ClassVar[bool] = False

    async def verify(self, body: BaseVerifyRequest) -> UppercaseShareVerifyResponse:
        uppercase, counted = count_uppercase(response_text(body.response))
        return UppercaseShareVerifyResponse(
            **body.model_dump(),
            reward=uppercase / counted if counted else 0.0,
            uppercase_chars=uppercase,
            counted_chars=counted,
        )


if __name__ == "__main__":
    UppercaseShareResourcesServer.run_webserver()
