# SPDX-License-Identifier: Apache-2.0
"""A right and a wrong answer for one example row of each environment of `configs/offline_blend.yaml`.

Each `Answer` is a NeMo Gym example row (from Gym's wheel), the scripted policy that plays it (one per row: the
shared engine takes each row's script by name, `script_choice.scripted_row`), and what the environment itself
must score it. Every completion is generated one token per character (`episodes._say`), so no turn re-tokenises to
the model's IDs. The verdicts were read from each environment's `verify` (or `step`) in Gym 0.7.0:

- calendar, row 0 (a pre-written history of 10 messages, 4 of them assistant turns): right repeats the calendar the
  last assistant turn showed (both events within their constraints), wrong moves event 1 to 13:00 (it ends after
  its "before 1:45pm"); 1.0 and 0.0.
- example_tool_call_multireward, row 0: right calls get_weather for San Francisco, then answers (reward 2.0:
  correctness 1, schema_valid 1, format 0, since Gym's simple_agent always ends on a message); wrong answers in
  text at once (0.0, every component 0).
- freeform_formatting, row 2: three lines starting with "-- " (1.0) against "- " (0.0).
- xlam_fc, row 0: both expected calls (type beta and type game) in one turn, then a closing message (1.0); the
  beta call alone (0.0). Gym's server implements no tool: each call gets a 404 body back.
- math_with_code, row 0: runs `print(32)` in the session's Python tool, then answers \\boxed{32} (1.0) or \\boxed{31}
  (0.0): two model calls around a stateful tool.
- structeval_nonrenderable, row 0 (JSON): an object holding all 17 expected paths between <|BEGIN_CODE|> and
  <|END_CODE|> (1.0: parsed, every path found); a JSON syntax error (0.0).
- wordle, row 0 (target "chump"): guesses "crane", then "chump": a win on turn 2 (1.8, Gym's 2.0 less 0.2 per
  turn after the first); or gives up in text after "crane" (0.0).
- reasoning_gym, row 0 (knights_knaves): the solution between <answer> tags (1.0, reasoning_gym's own scorer) or
  the two roles swapped (0.0).
- code_gen, row 3 (pouring water between barrels, 82 unit tests): a Python program in a ```python fence that sums
  the k + 1 fullest barrels (1.0: Gym runs every test in a Ray task on its own Ray, unsandboxed) or the k fullest
  (0.0: the first test's output differs).

Pure: builds rows and `ScriptedPolicy`s; no vLLM, HTTP or Gym import.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cpu_policy.answers import ANY, FIRST_TURN, TOOL_RESULT, Answer, example_row, policy, tool_call

CALENDAR = "calendar_simple_agent"
MULTIREWARD = "example_tool_call_multireward_simple_agent"
FORMATTING = "freeform_formatting_simple_agent"
XLAM = "xlam_fc_simple_agent"
MATH_WITH_CODE = "math_with_code_simple_agent"
STRUCTEVAL = "structeval_nonrenderable_simple_agent"
WORDLE = "wordle_gymnasium_agent"
REASONING_GYM = "reasoning_gym_simple_agent"
CODE_GEN = "code_gen_simple_agent"

EXAMPLES = {  # agent -> (Gym's example file, the row used)
    CALENDAR: ("resources_servers/calendar/data/example.jsonl", 0),
    MULTIREWARD: ("resources_servers/example_tool_call_multireward/data/example.jsonl", 0),
    FORMATTING: ("resources_servers/format_verification/data/example.jsonl", 2),
    XLAM: ("resources_servers/xlam_fc/data/example.jsonl", 0),
    MATH_WITH_CODE: ("resources_servers/math_with_code/data/example.jsonl", 0),
    STRUCTEVAL: ("resources_servers/structeval/data/example.jsonl", 0),
    WORDLE: ("resources_servers/wordle/data/example.jsonl", 0),
    REASONING_GYM: ("resources_servers/reasoning_gym/data/example.jsonl", 0),
    CODE_GEN: ("resources_servers/code_gen/data/example.jsonl", 3),
}

NOVEL = {
    "novel": {
        "title": "The Glass Orchard",
        "author": {"name": "Mara Ellis", "birth_year": 1975},
        "publication": {"year": 2019, "publisher": "Northwind Press"},
        "genres": ["literary fiction", "mystery"],
        "characters": [
            {"name": "Ivy", "role": "protagonist", "traits": ["curious", "stubborn"]},
            {"name": "Cole", "role": "antagonist", "traits": ["charming", "secretive"]},
        ],
        "chapters": [
            {"title": "Seeds", "word_count": 4200, "events": ["Ivy arrives"]},
            {"title": "Roots", "word_count": 3900},
        ],
    }
}


# code_gen's row 3: t test cases of n barrels, at most k pourings each, asking the largest difference between the
# fullest and the emptiest barrel: the sum of the k + 1 fullest (each pouring empties one more into one of them,
# and an emptied barrel holds 0). FULLEST is how many the program sums.
BARRELS = """import sys

data = sys.stdin.read().split()
pos, out = 1, []
for _ in range(int(data[0])):
    n, k = int(data[pos]), int(data[pos + 1])
    barrels = sorted(map(int, data[pos + 2 : pos + 2 + n]), reverse=True)
    pos += 2 + n
    out.append(str(sum(barrels[:FULLEST])))
print("\\n".join(out))
"""


def _calendar(row: dict) -> tuple[str, str]:
    shown = [m["content"] for m in row["responses_create_params"]["input"] if m["role"] == "assistant"][-1]
    events = json.loads(shown)
    late = [dict(event, start_time="13:00") if event["event_id"] == 1 else event for event in events]
    return f"Here is your calendar:\n{json.dumps(events)}", f"Here is your calendar:\n{json.dumps(late)}"


def answers(gym_root: Path) -> list[Answer]:
    """A right and a wrong answer per environment, over the example rows under `gym_root` (Gym's installed files),
    each row naming its agent."""
    rows = {agent: example_row(gym_root, path, index, agent) for agent, (path, index) in EXAMPLES.items()}
    calendar_right, calendar_wrong = _calendar(rows[CALENDAR])
    weather = tool_call("get_weather", {"city": "San Francisco"})
    beta, game = (tool_call("live_giveaways_by_type", {"type": kind}) for kind in ("beta", "game"))
    run_code = tool_call("execute_python", {"code": "print(32)"})
    novel = "<|BEGIN_CODE|>\n" + json.dumps(NOVEL) + "\n<|END_CODE|>"
    guess = {word: tool_call("submit_guess", {"guess": word}) for word in ("crane", "chump")}
    no_components = {"correctness": 0.0, "schema_valid": 0.0, "format": 0.0}
    knights = rows[REASONING_GYM]["answer"]  # "Zoey is a fool, and Riley is a sage."
    swapped = knights.replace("fool", "<f>").replace("sage", "fool").replace("<f>", "sage")
    program = {keep: f"```python\n{BARRELS.replace('FULLEST', keep)}```" for keep in ("k + 1", "k")}
    return [
        Answer(CALENDAR, "right", rows[CALENDAR], policy((ANY, calendar_right)), 1.0, 1),
        Answer(CALENDAR, "wrong", rows[CALENDAR], policy((ANY, calendar_wrong)), 0.0, 1),
        Answer(
            MULTIREWARD,
            "right",
            rows[MULTIREWARD],
            policy((TOOL_RESULT, "It is sunny in San Francisco."), (ANY, weather)),
            2.0,
            2,
            {"correctness": 1.0, "schema_valid": 1.0, "format": 0.0},
        ),
        Answer(MULTIREWARD, "wrong", rows[MULTIREWARD], policy((ANY, "I cannot say.")), 0.0, 1, no_components),
        Answer(FORMATTING, "right", rows[FORMATTING], policy((ANY, "-- France\n\n-- Italy\n\n-- Spain")), 1.0, 1),
        Answer(FORMATTING, "wrong", rows[FORMATTING], policy((ANY, "- France\n\n- Italy\n\n- Spain")), 0.0, 1),
        Answer(
            XLAM,
            "right",
            rows[XLAM],
            policy((TOOL_RESULT, "Those are the live giveaways."), (ANY, f"{beta}\n{game}")),
            1.0,
            2,
        ),
        Answer(XLAM, "wrong", rows[XLAM], policy((TOOL_RESULT, "That is the beta list."), (ANY, beta)), 0.0, 2),
        Answer(
            MATH_WITH_CODE,
            "right",
            rows[MATH_WITH_CODE],
            policy((TOOL_RESULT, "The count is \\boxed{32}."), (ANY, run_code)),
            1.0,
            2,
        ),
        Answer(
            MATH_WITH_CODE,
            "wrong",
            rows[MATH_WITH_CODE],
            policy((TOOL_RESULT, "The count is \\boxed{31}."), (ANY, run_code)),
            0.0,
            2,
        ),
        Answer(STRUCTEVAL, "right", rows[STRUCTEVAL], policy((ANY, novel)), 1.0, 1),
        Answer(STRUCTEVAL, "wrong", rows[STRUCTEVAL], policy((ANY, '<|BEGIN_CODE|>{"novel": }<|END_CODE|>')), 0.0, 1),
        Answer(
            WORDLE,
            "right",
            rows[WORDLE],
            policy((FIRST_TURN, guess["crane"]), (TOOL_RESULT, guess["chump"])),
            1.8,
            2,
        ),
        Answer(
            WORDLE, "wrong", rows[WORDLE], policy((FIRST_TURN, guess["crane"]), (TOOL_RESULT, "I give up.")), 0.0, 2
        ),
        Answer(REASONING_GYM, "right", rows[REASONING_GYM], policy((ANY, f"<answer>{knights}</answer>")), 1.0, 1),
        Answer(REASONING_GYM, "wrong", rows[REASONING_GYM], policy((ANY, f"<answer>{swapped}</answer>")), 0.0, 1),
        Answer(CODE_GEN, "right", rows[CODE_GEN], policy((ANY, program["k + 1"])), 1.0, 1),
        Answer(CODE_GEN, "wrong", rows[CODE_GEN], policy((ANY, program["k"])), 0.0, 1),
    ]
