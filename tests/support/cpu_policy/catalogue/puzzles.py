# SPDX-License-Identifier: Apache-2.0
"""A right and a wrong answer for one example row of each puzzle environment (ARC-AGI grids, alternate-universe
calculator tools) of NeMo Gym 0.7.0.

Each `Answer` is a NeMo Gym example row (from Gym's wheel), the scripted policy that plays it and what the
environment's own `verify` must score it. The verdicts were read from each server's `verify` in Gym 0.7.0:

- arc_agi, row 0 (task 00576224: a 2x2 grid tiled 3x3, its middle band of tiles mirrored left-right): right boxes
  `expected_output` as a JSON grid, `\\boxed{[[3, 2, ...], ...]}` (1.0: the first boxed grid equals it); wrong
  boxes the plain 3x3 tiling, the middle band not mirrored (0.0, `extraction_successful` true). One model call.
- nvarc transductive, row 0 (task 760b3cac, the row's own `agent_mode` "transductive"): right boxes
  `expected_output` as rows of space-separated digits, one row a line (1.0: Board.from_text reads the boxed text
  with the integer palette, then an exact match); wrong mirrors the 8-shape to the left instead of the right
  (0.0, `extraction_successful` true, `exact_match` false). One model call.
- nvarc inductive, row 4 (task 0520fde7, `agent_mode` "inductive": the model writes a `transform(grid)` in a
  ```python fence, which the server runs on `test_input` in a subprocess of its own Python, with a restricted
  import list and no sandbox): right marks 2 where both halves beside the grey column are 1 (1.0: the program's
  grid equals `expected_output`); wrong marks 2 where either half is 1 (0.0: extracted, another grid). One model
  call.
- math_advanced_calculations, row 2 ("the value for (4.0 ** 6.0 / pi) using only the given tools", whose tools
  compute another universe's arithmetic: power(a, b) = a ** (b + 2), pi() = e, divide(a, b) = 0.5 * a / b): the
  server scores the tool outputs only, 1.0 when every `ground_truth` value is among the `solution`s of the episode's
  function_call_outputs. Right calls power(4, 6) and pi() in one turn, then divide(65536.0, 2.718281828459045) on
  their results, then answers 12054.673528305822 in text (1.0: that divide's output is the ground truth); wrong
  makes the same first calls, then divides by this universe's values, divide(4096.0, 3.141592653589793) (0.0:
  651.8986469044033 is no ground-truth value). Three model calls each (two tool turns, then the answer).

Quirks: none of these rows carries an agent_ref (`example_row` sets one). nvarc ships two configs over the same
server code (transductive.yaml, inductive.yaml); each row's `agent_mode` overrides the config's, so both agents
could play any row. math_advanced_calculations reads only tool outputs: the final text answer is not scored, and a
tool error (HTTP 500) just adds no value. No overrides are needed.

Pure: builds rows and `ScriptedPolicy`s; no vLLM, HTTP or Gym import.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tests.support.cpu_policy.answers import ANY, Answer, example_row, policy, tool_call
from tests.support.cpu_policy.script import ScriptMatch

CONFIGS = [
    "resources_servers/arc_agi/configs/arc_agi.yaml",
    "resources_servers/nvarc/configs/transductive.yaml",
    "resources_servers/nvarc/configs/inductive.yaml",
    "resources_servers/math_advanced_calculations/configs/math_advanced_calculations.yaml",
]

ARC_AGI = "arc_agi_simple_agent"
NVARC_TRANSDUCTIVE = "nvarc_transductive_simple_agent"
NVARC_INDUCTIVE = "nvarc_inductive_simple_agent"
MATH_ADVANCED = "math_advanced_calculations_simple_agent"

EXAMPLES = {  # agent -> (Gym's example file, the row used)
    ARC_AGI: ("resources_servers/arc_agi/data/example.jsonl", 0),
    NVARC_TRANSDUCTIVE: ("resources_servers/nvarc/data/example.jsonl", 0),
    NVARC_INDUCTIVE: ("resources_servers/nvarc/data/example.jsonl", 4),
    MATH_ADVANCED: ("resources_servers/math_advanced_calculations/data/example.jsonl", 2),
}

# nvarc's row 4: a 3x7 grid, a 3x3 half either side of a grey column; the output marks 2 where both halves hold a 1.
# JOIN is how the program combines the two halves.
TRANSFORM = """def transform(grid):
    return [[2 if (row[i] == 1) JOIN (row[i + 4] == 1) else 0 for i in range(3)] for row in grid]
"""

SECOND_TURN = ScriptMatch(assistant_turns=1)  # after the first tool results
THIRD_TURN = ScriptMatch(assistant_turns=2)  # after the second


def _boxed_digits(grid: list[list[int]]) -> str:
    return "\\boxed{" + "\n".join(" ".join(str(cell) for cell in row) for row in grid) + "}"


def _mirrored_left(grid: list[list[int]]) -> list[list[int]]:
    """760b3cac's 8-shape (columns 3 to 5 of the rows holding an 8) mirrored into columns 0 to 2."""
    return [row[3:6][::-1] + row[3:] if 8 in row else list(row) for row in grid]


def _math_policy(dividend: float, divisor: float, reply: str):
    first = tool_call("power", {"a": 4.0, "b": 6.0}) + "\n" + tool_call("pi", {})
    divide = tool_call("divide", {"a": dividend, "b": divisor})
    return policy((THIRD_TURN, reply), (SECOND_TURN, divide), (ANY, first))


def answers(gym_root: Path) -> list[Answer]:
    """A right and a wrong answer per environment, over the example rows under `gym_root` (Gym's installed files),
    each row naming its agent."""
    rows = {agent: example_row(gym_root, path, index, agent) for agent, (path, index) in EXAMPLES.items()}
    arc = rows[ARC_AGI]
    tiled = [row * 3 for row in arc["test_input"]] * 3
    nvarc = rows[NVARC_TRANSDUCTIVE]
    program = {join: f"```python\n{TRANSFORM.replace('JOIN', join)}```" for join in ("and", "or")}
    math_right = _math_policy(65536.0, math.e, "The value is 12054.673528305822.")
    math_wrong = _math_policy(4096.0, math.pi, "The value is 651.8986469044033.")
    return [
        Answer(ARC_AGI, "right", arc, policy((ANY, f"\\boxed{{{json.dumps(arc['expected_output'])}}}")), 1.0, 1),
        Answer(ARC_AGI, "wrong", arc, policy((ANY, f"\\boxed{{{json.dumps(tiled)}}}")), 0.0, 1),
        Answer(NVARC_TRANSDUCTIVE, "right", nvarc, policy((ANY, _boxed_digits(nvarc["expected_output"]))), 1.0, 1),
        Answer(
            NVARC_TRANSDUCTIVE,
            "wrong",
            nvarc,
            policy((ANY, _boxed_digits(_mirrored_left(nvarc["test_input"])))),
            0.0,
            1,
        ),
        Answer(NVARC_INDUCTIVE, "right", rows[NVARC_INDUCTIVE], policy((ANY, program["and"])), 1.0, 1),
        Answer(NVARC_INDUCTIVE, "wrong", rows[NVARC_INDUCTIVE], policy((ANY, program["or"])), 0.0, 1),
        Answer(MATH_ADVANCED, "right", rows[MATH_ADVANCED], math_right, 1.0, 3),
        Answer(MATH_ADVANCED, "wrong", rows[MATH_ADVANCED], math_wrong, 0.0, 3),
    ]
