# SPDX-License-Identifier: Apache-2.0
"""A right and a wrong answer for one example row of nine code-scored, single-turn knowledge environments.

Each `Answer` is a NeMo Gym example row (from Gym's wheel), the scripted policy that plays it, and what the
environment's own `verify` must score it (read from each server's `app.py` in Gym 0.7.0). Every episode is one
model call through Gym's simple_agent; no environment here calls a judge.

- gpqa_diamond, row 0 (expected "C"): "Answer: C" (1.0) against "Answer: A" (0.0). GPQA's own `extract_letter`
  takes the last `\\boxed{}` letter or else the last "Answer: X" line; the letter must be one of the row's options
  and equal `expected_answer`.
- mcqa, row 0 (grading_mode strict_single_letter_boxed, expected "B" of ten options): `\\boxed{B}` (1.0) against
  `\\boxed{A}` (0.0). The config's grading_mode is null, so the row's mode applies: the last box must hold a single
  allowed letter (`BOXED_LETTER_ONLY_PATTERN`).
- bunsenbench_chemistry_mcq, row 0 (conjugate base of hydronium, expected "B" = "H2O"): `<choice>H2O</choice>`
  (1.0, error_mode "correct") against `<choice>OH-</choice>` (0.0, error_mode "wrong_answer"). The `<choice>` tag
  is an answer candidate outside the prompt's `<choices>` block; its text matches option B (resp. A) exactly.
- string_match, row 0 (extraction_mode boxed, expected "Paris"): `\\boxed{Paris}` (1.0, case-insensitive equality)
  against `\\boxed{London}` (0.0: no normalisation, numeric or list rule makes them equal).
- hotpotqa_qa, row 1 (expected "Chief of Protocol"): `{"answer": "Chief of Protocol"}` (1.0) against
  `{"answer": "Ambassador"}` (0.0). The reward is `is_correct_strict`: some surface form of the gold (here only the
  gold itself) must be a substring of the JSON's answer; answer_em/answer_f1 are 1/1 and 0/0.
- spartqa, row 0 (target "both of them", objects "a small shape" / "a big black triangle"): "Final answer: both of
  them" (1.0, exact) against "Final answer: a small shape" (0.0): the "Final answer:" line resolves to exactly one
  of the four candidate labels, compared article-insensitively with the target.
- equivalence_rule (config lc.yaml, grading_rule exact), row 3 (count the snippets about x-rated, expected "6"):
  "6" (1.0) against "7" (0.0). The whole response text must equal `expected_answer` after strip/lowercase/space
  collapsing, so the answer carries nothing else. (Rows 0-2 expect a long passage copied back; row 3 keeps the
  episode short.)
- polymath, row 0 ("What is 2 + 2?", expected "4"): "The sum is \\boxed{4}." (1.0) against the same with
  \\boxed{5} (0.0). Code-scored: polymath's config sets `should_use_judge: false`, so math_with_judge's
  `_verify_answer` returns the math-verify reward (library_reward) and never calls the judge, for either answer
  (judge_evaluations stays null), even though the config names a `judge_model_server`.
- citation_if, row 0 (grammar ascii_brackets, gold citation_rjzb among three retrieved pages): the date cited as
  `[citation_rjzb]` (1.0, no gate failed) against the same sentence citing a distractor page `[citation_ggxj]`
  (0.0, gate "correctness_missed_gold": well-formed and valid, but the gold page is not cited). The agent runs with
  max_steps 1; the row's prompt already holds the searches and ends on "Provide your final answer now."

Rows of mcqa, string_match and polymath carry no agent_ref (`example_row` sets it). equivalence_rule's config names
its resources server instance `lc_equivalence_rule`, hence the agent `lc_equivalence_rule_simple_agent`.
`OVERRIDES` re-spells spartqa's dataset license, without which Gym refuses its agent config and does not start.

Pure: builds rows and `ScriptedPolicy`s; no vLLM, HTTP or Gym import.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cpu_policy.answers import ANY, Answer, example_row, policy

CONFIGS = [
    "resources_servers/gpqa_diamond/configs/gpqa_diamond.yaml",
    "resources_servers/mcqa/configs/mcqa.yaml",
    "resources_servers/bunsenbench_chemistry_mcq/configs/bunsenbench_chemistry_mcq.yaml",
    "resources_servers/string_match/configs/string_match.yaml",
    "resources_servers/hotpotqa_qa/configs/hotpotqa_qa.yaml",
    "resources_servers/spartqa/configs/spartqa.yaml",
    "resources_servers/equivalence_rule/configs/lc.yaml",
    "resources_servers/polymath/configs/polymath.yaml",
    "resources_servers/citation_if/configs/citation_if.yaml",
]

GPQA = "gpqa_diamond_simple_agent"
MCQA = "mcqa_simple_agent"
BUNSEN = "bunsenbench_chemistry_mcq_simple_agent"
STRING_MATCH = "string_match_simple_agent"
HOTPOTQA = "hotpotqa_qa_simple_agent"
SPARTQA = "spartqa_simple_agent"
EQUIVALENCE = "lc_equivalence_rule_simple_agent"
POLYMATH = "polymath_simple_agent"
CITATION = "citation_if_simple_agent"

# spartqa's shipped config spells its datasets' license "CC-BY-SA-4.0", which Gym 0.7.0's dataset schema refuses
# (config_types.py accepts "CC BY-SA 4.0"): the agent is an "almost-server" and Gym's launcher aborts at start-up
# (error_on_almost_servers). The same two datasets, with the license spelled as Gym accepts it (a list is replaced
# whole when configs merge).
_SPARTQA_DATA = "resources_servers/spartqa/data"
OVERRIDES = {
    SPARTQA: {
        "responses_api_agents": {
            "simple_agent": {
                "datasets": [
                    {
                        "name": "example",
                        "type": "example",
                        "jsonl_fpath": f"{_SPARTQA_DATA}/example.jsonl",
                        "license": "CC BY-SA 4.0",
                    },
                    {
                        "name": "test",
                        "type": "validation",
                        "jsonl_fpath": f"{_SPARTQA_DATA}/spartqa_test.jsonl",
                        "license": "CC BY-SA 4.0",
                    },
                ]
            }
        }
    }
}

EXAMPLES = {  # agent -> (Gym's example file, the row used)
    GPQA: ("resources_servers/gpqa_diamond/data/example.jsonl", 0),
    MCQA: ("resources_servers/mcqa/data/example.jsonl", 0),
    BUNSEN: ("resources_servers/bunsenbench_chemistry_mcq/data/example.jsonl", 0),
    STRING_MATCH: ("resources_servers/string_match/data/example.jsonl", 0),
    HOTPOTQA: ("resources_servers/hotpotqa_qa/data/example.jsonl", 1),
    SPARTQA: ("resources_servers/spartqa/data/example.jsonl", 0),
    EQUIVALENCE: ("resources_servers/equivalence_rule/data/example.jsonl", 3),
    POLYMATH: ("resources_servers/polymath/data/example.jsonl", 0),
    CITATION: ("resources_servers/citation_if/data/example.jsonl", 0),
}


def _options(row: dict) -> dict[str, str]:
    """The row's options as letter -> text (Gym rows list them as one-key dicts)."""
    return {letter: text for entry in row["options"] for letter, text in entry.items()}


def _other_letter(row: dict) -> str:
    """The first option letter that is not the row's expected answer."""
    return next(letter for letter in _options(row) if letter != row["expected_answer"])


def _pair(agent: str, row: dict, right: str, wrong: str) -> list[Answer]:
    """A right (1.0) and a wrong (0.0) single-turn answer to `row`."""
    return [
        Answer(agent, "right", row, policy((ANY, right)), 1.0, 1),
        Answer(agent, "wrong", row, policy((ANY, wrong)), 0.0, 1),
    ]


def answers(gym_root: Path) -> list[Answer]:
    """A right and a wrong answer per environment, over the example rows under `gym_root` (Gym's installed files),
    each row naming its agent."""
    rows = {agent: example_row(gym_root, path, index, agent) for agent, (path, index) in EXAMPLES.items()}
    gpqa, mcqa, bunsen = rows[GPQA], rows[MCQA], rows[BUNSEN]
    bunsen_options = _options(bunsen)
    hotpot_gold = rows[HOTPOTQA]["expected_answer"]
    spart = rows[SPARTQA]
    spart_wrong = next(option for option in spart["options"] if option != spart["target"])
    count = rows[EQUIVALENCE]["expected_answer"]
    verifier = rows[CITATION]["verifier"]
    gold_page = verifier["expected_ids"][0]
    other_page = next(page for page in verifier["valid_id_set"] if page not in verifier["expected_ids"])
    cited = "Gateway sold the Amiga rights to Amino Development on 31 December 1999 [{}]."
    return [
        *_pair(GPQA, gpqa, f"Answer: {gpqa['expected_answer']}", f"Answer: {_other_letter(gpqa)}"),
        *_pair(MCQA, mcqa, f"\\boxed{{{mcqa['expected_answer']}}}", f"\\boxed{{{_other_letter(mcqa)}}}"),
        *_pair(
            BUNSEN,
            bunsen,
            f"<choice>{bunsen_options[bunsen['expected_answer']]}</choice>",
            f"<choice>{bunsen_options[_other_letter(bunsen)]}</choice>",
        ),
        *_pair(
            STRING_MATCH, rows[STRING_MATCH], f"\\boxed{{{rows[STRING_MATCH]['expected_answer']}}}", "\\boxed{London}"
        ),
        *_pair(
            HOTPOTQA,
            rows[HOTPOTQA],
            json.dumps({"answer": hotpot_gold}),
            json.dumps({"answer": "Ambassador"}),
        ),
        *_pair(SPARTQA, spart, f"Final answer: {spart['target']}", f"Final answer: {spart_wrong}"),
        *_pair(EQUIVALENCE, rows[EQUIVALENCE], count, str(int(count) + 1)),
        *_pair(
            POLYMATH,
            rows[POLYMATH],
            f"The sum is \\boxed{{{rows[POLYMATH]['expected_answer']}}}.",
            f"The sum is \\boxed{{{int(rows[POLYMATH]['expected_answer']) + 1}}}.",
        ),
        *_pair(CITATION, rows[CITATION], cited.format(gold_page), cited.format(other_page)),
    ]
