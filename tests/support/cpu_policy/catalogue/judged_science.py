# SPDX-License-Identifier: Apache-2.0
"""A right and a wrong answer for one example row of each LLM-judge-scored math and science server of NeMo Gym 0.7.0.

math_with_autograder, physics_judge and ugphysics_judge subclass math_with_judge: math-verify first compares the
reply with the gold answer, and only on a symbolic miss (library_reward 0) is the judge called, once (no order
swap). Every answer below is one math-verify misses, so the judge's verdict decides each reward (and each answer's
`judge` rules key on a phrase the judge prompt quotes). The verdicts were read from each server's `verify` in Gym
0.7.0:

- math_with_autograder, row 3 (the supremum of t with d > t h possible in a triangular pyramid, gold $\\frac{3}{2}$):
  right \\boxed{\\frac{3}{2}\\ (\\text{not attained})}, which math-verify mis-parses (3*notattained/2, 0.0); wrong
  \\boxed{\\frac{2}{3}} (math-verify 0.0). The judge gets the raw boxed LaTeX ("Model Solution: ..."); the first of
  \\boxed{Correct} / \\boxed{Incorrect} in its reply decides: 1.0 and 0.0.
- physics_judge, row 1 (isothermal work of an ideal gas, gold nRT\\ln(V_2/V_1)): right \\boxed{nRT(\\ln V_2 -
  \\ln V_1)}, which math-verify does not reduce to the gold (0.0); wrong \\boxed{nRT(V_2 - V_1)/V_1} (the work at
  constant pressure). The judge (over /v1/chat/completions) sees the whole reply; "[Correct]" anywhere in its reply
  (case-insensitive) gives 1.0, "[Incorrect]" 0.0.
- ugphysics_judge, row 1 (isobaric work of one mole from 300 K to 600 K, gold 2494.2): right \\boxed{2494} (math-verify
  0.0: not 2494.2), wrong \\boxed{4988.4} (nRT at 600 K). The judge sees the row's reference solution and the whole
  reply; `parse_judgement` reads "## Equivalence Judgement" then TRUE (1.0) or FALSE (0.0).
- frontierscience_judge, row 0 (the chemical formula of water, gold H2O; olympiad mode, judge only, over
  /v1/chat/completions): right says H2O, two hydrogen atoms and one oxygen, wrong HO. The last "Judgement: YES"
  (1.0) or "Judgement: NO" (0.0) of the judge's reply decides.

The right answers pass by the judge, not math-verify, only through math-verify's quirks above (a \\text remark
multiplied in, a logarithm difference not simplified, a rounded number): a plain \\boxed{\\frac{3}{2}},
\\boxed{nRT\\ln\\frac{V_2}{V_1}} or \\boxed{2494.2} would score 1.0 with no judge call. No override is needed: each
config's own judge model server (`judge_model`, in frontierscience_judge an openai_model on NVIDIA's hosted API) is
replaced by the plugin's judge.

Pure: builds rows and `ScriptedPolicy`s; no vLLM, HTTP or Gym import.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.cpu_policy.answers import ANY, Answer, example_row, policy, verdict

CONFIGS = [
    "resources_servers/math_with_autograder/configs/math_with_autograder.yaml",
    "resources_servers/physics_judge/configs/physics_judge.yaml",
    "resources_servers/ugphysics_judge/configs/ugphysics_judge.yaml",
    "resources_servers/frontierscience_judge/configs/frontierscience_judge.yaml",
]

AUTOGRADER = "math_with_autograder_simple_agent"
PHYSICS = "physics_judge_simple_agent"
UGPHYSICS = "ugphysics_judge_simple_agent"
FRONTIERSCIENCE = "frontierscience_judge_simple_agent"

EXAMPLES = {  # agent -> (Gym's example file, the row used)
    AUTOGRADER: ("resources_servers/math_with_autograder/data/example.jsonl", 3),
    PHYSICS: ("resources_servers/physics_judge/data/example.jsonl", 1),
    UGPHYSICS: ("resources_servers/ugphysics_judge/data/example.jsonl", 1),
    FRONTIERSCIENCE: ("resources_servers/frontierscience_judge/data/example.jsonl", 0),
}

SUPREMUM = {"right": "\\frac{3}{2}\\ (\\text{not attained})", "wrong": "\\frac{2}{3}"}
REPLY = {
    AUTOGRADER: {
        "right": "The ratio $d/h$ can be pushed arbitrarily close to $3/2$ but never reaches it, so "
        f"\\boxed{{{SUPREMUM['right']}}}",
        "wrong": "Comparing the volume computed two ways gives $d \\le \\frac{2}{3}h$, so "
        f"\\boxed{{{SUPREMUM['wrong']}}}",
    },
    PHYSICS: {
        "right": "For an isothermal process $W = \\int_{V_1}^{V_2} p\\,dV$ with $p = nRT/V$, so "
        "\\boxed{nRT(\\ln V_2 - \\ln V_1)}",
        "wrong": "Treating the pressure as constant, $W = p\\Delta V$ with $p = nRT/V_1$, so "
        "\\boxed{nRT(V_2 - V_1)/V_1}",
    },
    UGPHYSICS: {
        "right": "At constant pressure $W = P\\Delta V = nR\\Delta T = 8.314 \\times 300 \\approx 2494$ J. "
        "So the final answer is \\boxed{2494}(J).",
        "wrong": "The work is $W = nRT_2 = 8.314 \\times 600 = 4988.4$ J. So the final answer is \\boxed{4988.4}(J).",
    },
    FRONTIERSCIENCE: {
        "right": "Water is H2O: two hydrogen atoms bonded to one oxygen atom.",
        "wrong": "Water is HO: one hydrogen atom bonded to one oxygen atom.",
    },
}

# What each judge replies (the part its server's parser reads comes last, as the prompts ask).
AUTOGRADER_VERDICT = {
    "right": "<thinking>\n1. **Golden Answer:** 3/2\n2. **Extracted Model Answer:** 3/2, noted as not attained\n"
    "3. **Equivalence Analysis:** The same value.\n4. **Conclusion:** Correct\n</thinking>\n\\boxed{Correct}",
    "wrong": "<thinking>\n1. **Golden Answer:** 3/2\n2. **Extracted Model Answer:** 2/3\n"
    "3. **Equivalence Analysis:** 2/3 is not 3/2.\n4. **Conclusion:** Incorrect\n</thinking>\n\\boxed{Incorrect}",
}
UGPHYSICS_VERDICT = {
    "right": "## Justification\nThe student's 2494 J is the reference 2494.2 J rounded.\n\n"
    "## Equivalence Judgement\nTRUE",
    "wrong": "## Justification\nThe student used T = 600 K instead of the temperature change of 300 K.\n\n"
    "## Equivalence Judgement\nFALSE",
}


def _judge(name: str, phrase: str, text: str):
    """The judge says `text` to every judge request quoting `phrase` (the answer's own words)."""
    return verdict(name, re.escape(phrase), text)


def answers(gym_root: Path) -> list[Answer]:
    """A right and a wrong answer per server, in CONFIGS order, over the example rows under `gym_root`."""
    rows = {agent: example_row(gym_root, path, index, agent) for agent, (path, index) in EXAMPLES.items()}
    judged = {
        AUTOGRADER: {
            kind: _judge(
                f"math_with_autograder {kind}", f"Model Solution: {SUPREMUM[kind]}\n", AUTOGRADER_VERDICT[kind]
            )
            for kind in ("right", "wrong")
        },
        PHYSICS: {
            "right": _judge("physics_judge right", "\\boxed{nRT(\\ln V_2 - \\ln V_1)}", "[Correct]"),
            "wrong": _judge("physics_judge wrong", "\\boxed{nRT(V_2 - V_1)/V_1}", "[Incorrect]"),
        },
        UGPHYSICS: {
            "right": _judge("ugphysics_judge right", "\\boxed{2494}(J)", UGPHYSICS_VERDICT["right"]),
            "wrong": _judge("ugphysics_judge wrong", "\\boxed{4988.4}(J)", UGPHYSICS_VERDICT["wrong"]),
        },
        FRONTIERSCIENCE: {
            "right": _judge(
                "frontierscience_judge right",
                "two hydrogen atoms bonded to one oxygen atom",
                "The attempted answer gives H2O, the reference formula.\nJudgement: YES",
            ),
            "wrong": _judge(
                "frontierscience_judge wrong",
                "one hydrogen atom bonded to one oxygen atom",
                "HO is not H2O: one hydrogen short.\nJudgement: NO",
            ),
        },
    }
    return [
        Answer(agent, kind, rows[agent], policy((ANY, REPLY[agent][kind])), reward, 1, judge=(judged[agent][kind],))
        for agent in EXAMPLES
        for kind, reward in (("right", 1.0), ("wrong", 0.0))
    ]
