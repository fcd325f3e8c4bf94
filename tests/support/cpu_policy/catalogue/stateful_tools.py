# SPDX-License-Identifier: Apache-2.0
"""A right and a wrong answer for Gym's stateful tool servers played by its `simple_agent` (tool calls until a
turn without one; the server runs each tool, then `verify` scores the whole response). The verdicts were read from
each server's tools and `verify` in Gym 0.7.0:

- example_multi_step, row 0 (the synonyms of "Hot" that the query needs, in the order the system prompt lists
  them: "Blazing", then "Warm"): the `get_synonym_value` tool returns the sum of the synonym's character codes;
  `verify` takes the arguments of the last `extract_synonym_values` call and scores 1.0 when they equal the row's
  `expected_synonym_values` ([711, 407]) in order. Right: looks both up (one call a turn), extracts [711, 407],
  then closes (1.0, four model calls); wrong: the same lookups, then extracts them swapped (0.0, with the server's
  `order_instruction_following_failure` set: the set is right, the order is not).
- example_session_state_mgmt, row 0 ("add 1 then add 2 then get the count"; the agent's `/seed_session` starts the
  session's counter at the row's `initial_count`, 3): `increment_counter` adds to the counter of the request's
  session, and `verify` scores 1.0 when that counter equals `expected_count` (6). Right: adds 1, adds 2, reads
  the counter, says 6 (1.0, four model calls); wrong: adds 1 only, reads, says 4 (0.0, three model calls). The
  reward is the counter's state, not what the answer says.

The rows of both example files carry no `agent_ref` (`example_row` adds it). example_session_state_mgmt uses its
`simple_agent` config (`example_session_state_mgmt.yaml`), not the `_nooa` one.

Pure: builds rows and `ScriptedPolicy`s; no vLLM, HTTP or Gym import.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.cpu_policy.answers import Answer, example_row, policy, tool_call
from tests.support.cpu_policy.script import ScriptMatch

CONFIGS = [
    "resources_servers/example_multi_step/configs/example_multi_step.yaml",
    "resources_servers/example_session_state_mgmt/configs/example_session_state_mgmt.yaml",
]

MULTI_STEP = "example_multi_step_simple_agent"
COUNTER = "example_session_state_mgmt_simple_agent"

EXAMPLES = {  # agent -> (Gym's example file, the row used)
    MULTI_STEP: ("resources_servers/example_multi_step/data/example.jsonl", 0),
    COUNTER: ("resources_servers/example_session_state_mgmt/data/example.jsonl", 0),
}


def _turns(*texts: str):
    """A script saying `texts[k]` on the turn after k assistant messages."""
    return policy(*((ScriptMatch(assistant_turns=k), text) for k, text in enumerate(texts)))


def _multi_step(row: dict) -> tuple[list[str], list[str]]:
    lookups = [tool_call("get_synonym_value", {"synonym": synonym}) for synonym in row["expected_synonyms"]]
    values = row["expected_synonym_values"]
    right, swapped = (tool_call("extract_synonym_values", {"synonym_values": v}) for v in (values, values[::-1]))
    done = "I have extracted the synonym values."
    return [*lookups, right, done], [*lookups, swapped, done]


def _counter(row: dict) -> tuple[list[str], list[str]]:
    task = row["responses_create_params"]["input"][-1]["content"]  # "add 1 then add 2 then get the count"
    first, second = (int(n) for n in re.findall(r"add (\d+)", task))
    start = row["initial_count"]
    add = {n: tool_call("increment_counter", {"count": n}) for n in (first, second)}
    read = tool_call("get_counter_value", {})
    right = [add[first], add[second], read, f"The count is {start + first + second}."]
    wrong = [add[first], read, f"The count is {start + first}."]
    return right, wrong


def answers(gym_root: Path) -> list[Answer]:
    """A right and a wrong answer per server, over the example rows under `gym_root` (Gym's installed files), each
    row naming its agent."""
    rows = {agent: example_row(gym_root, path, index, agent) for agent, (path, index) in EXAMPLES.items()}
    steps_right, steps_wrong = _multi_step(rows[MULTI_STEP])
    count_right, count_wrong = _counter(rows[COUNTER])
    return [
        Answer(MULTI_STEP, "right", rows[MULTI_STEP], _turns(*steps_right), 1.0, len(steps_right)),
        Answer(MULTI_STEP, "wrong", rows[MULTI_STEP], _turns(*steps_wrong), 0.0, len(steps_wrong)),
        Answer(COUNTER, "right", rows[COUNTER], _turns(*count_right), 1.0, len(count_right)),
        Answer(COUNTER, "wrong", rows[COUNTER], _turns(*count_wrong), 0.0, len(count_wrong)),
    ]
