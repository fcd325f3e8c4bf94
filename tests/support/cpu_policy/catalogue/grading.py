# SPDX-License-Identifier: Apache-2.0
"""A right and a wrong answer for one example row of six code-scored grading environments.

In each, the policy grades, compares or judges something (a proof, a pair of proofs or responses, a candidate patch,
an answer against its sources) and the resources server checks that verdict against the row's label. No server here
calls an LLM judge: every verdict is parsed and compared in `verify` (read from each server's `app.py` in Gym
0.7.0). Every episode is one model call through Gym's simple_agent.

- imo_gradingbench, row 0 (induction proof of 1 + ... + n, expected "correct"): a one-line analysis ending on
  "correct" (1.0) against the same ending on "incorrect" (0.0). `extract_grade` takes the last whitespace-delimited
  word, strips markdown/punctuation, lowercases it and must equal `expected_answer` (binary_match is True, resp.
  False; score_diff 0 resp. 7).
- math_proof_judgement, row 0 ((x+1)^2 expansion, expected "Judgement: Yes"): "<judgement>Judgement: Yes
  </judgement>" (1.0, tp 1) against "Judgement: No" (0.0, fn 1). `parse_judgement` reads the first "Judgement:"
  and the Yes/No after it, on both the reply and the gold label.
- proof_genselect, row 2 (the inequality, correct_index 2; rows 0, 1, 3 and 4 render over 4000 tokens):
  "<best_solution>2</best_solution>" (1.0) against "<best_solution>1</best_solution>" (0.0). The config's
  assert_think_end is false, so no `</think>` is needed; the tag must hold 1 or 2 and equal `correct_index`.
- ragtruth, row 0 (QA: the Mona Lisa attributed to van Gogh, is_halu true): `{"hallucination list": ["Vincent van
  Gogh", "1889"]}` (1.0, pred_halu 1) against an empty list (0.0, pred_halu 0). The reward is whether a non-empty
  list was predicted equals the gold `is_halu`; the spans themselves are not compared.
- swerl_llm_judge, row 4 (dvc move patch, two options, grading_mode strict, expected "A"): "<solution>A</solution>"
  (1.0) against "<solution>B</solution>" (0.0, the other option letter). Strict mode accepts only one (bracketed)
  letter in the block, which must be one of the row's option keys and the expected letter.
- generative_reward_model, row 1 (one rubric, id 3; gold overall and rubric scores 4 / 2, ranking 2): the gold's
  own numbers as the one JSON object (0.0: every L1 error is 0, so no penalty) against the verdict reversed, scores
  2 / 4 and ranking 5 (-15.0 = -(2 + 2 + 2 * 3) overall, less 0.5 * 10 for the rubric). The reward is a
  penalty (0 at best), which is why Gym's example rollouts are negative; `verify` never sets `mask_sample` (it
  stays False for both), and only an unparseable reply or a rubric-ID mismatch gets the flat -100 of
  `parse_failure_penalty`. The rubric must be written with the row's rubric_id (3), not the template's 1.

Rows of math_proof_judgement carry no agent_ref (`example_row` sets it). No override is needed. ragtruth's config
also lists validation datasets (test_qa.jsonl, ...) that the wheel lacks; they are only read when preparing data.
swerl_llm_judge's `utils.py` (datasets, git clones, tokenizers) is not imported by its `app.py`.

Pure: builds rows and `ScriptedPolicy`s; no vLLM, HTTP or Gym import.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cpu_policy.answers import ANY, Answer, example_row, policy

CONFIGS = [
    "resources_servers/imo_gradingbench/configs/imo_gradingbench.yaml",
    "resources_servers/math_proof_judgement/configs/math_proof_judgement.yaml",
    "resources_servers/proof_genselect/configs/proof_genselect.yaml",
    "resources_servers/ragtruth/configs/ragtruth.yaml",
    "resources_servers/swerl_llm_judge/configs/swerl_llm_judge.yaml",
    "resources_servers/generative_reward_model/configs/genrm_train.yaml",
]

IMO_GRADING = "imo_gradingbench_simple_agent"
PROOF_JUDGEMENT = "math_proof_judgement_simple_agent"
GENSELECT = "proof_genselect_simple_agent"
RAGTRUTH = "ragtruth_simple_agent"
SWERL = "swerl_llm_judge_simple_agent"
GENRM = "generative_reward_model_simple_agent"

EXAMPLES = {  # agent -> (Gym's example file, the row used)
    IMO_GRADING: ("resources_servers/imo_gradingbench/data/example.jsonl", 0),
    PROOF_JUDGEMENT: ("resources_servers/math_proof_judgement/data/example.jsonl", 0),
    GENSELECT: ("resources_servers/proof_genselect/data/example.jsonl", 2),
    RAGTRUTH: ("resources_servers/ragtruth/data/example.jsonl", 0),
    SWERL: ("resources_servers/swerl_llm_judge/data/example.jsonl", 4),
    GENRM: ("resources_servers/generative_reward_model/data/example.jsonl", 1),
}

GRADES = ("correct", "almost", "partial", "incorrect")


def _genrm_verdict(rubric_ids: list[int], score_1: float, score_2: float, ranking: float) -> str:
    """One JSON object in GenRM's unified format, every rubric and the overall verdict given the same numbers."""
    scores = {"score_1": score_1, "score_2": score_2, "ranking": ranking}
    verdict = {"rubric_evaluations": [{"rubric_id": rid, **scores} for rid in rubric_ids], "overall": scores}
    return f"```json\n{json.dumps(verdict)}\n```"


def answers(gym_root: Path) -> list[Answer]:
    """A right and a wrong answer per environment, over the example rows under `gym_root` (Gym's installed files)."""
    rows = {agent: example_row(gym_root, path, index, agent) for agent, (path, index) in EXAMPLES.items()}

    grade = rows[IMO_GRADING]["expected_answer"]  # "correct"
    other_grade = next(g for g in reversed(GRADES) if g != grade)  # "incorrect"
    imo = {g: f"The induction is sound in every step.\n{g}" for g in (grade, other_grade)}

    gold_judgement = rows[PROOF_JUDGEMENT]["expected_judgement"]  # "Judgement: Yes"
    flipped = "Judgement: No" if gold_judgement.endswith("Yes") else "Judgement: Yes"
    judgement = {j: f"<summary>The expansion is checked term by term.</summary>\n<judgement>{j}</judgement>"
                 for j in (gold_judgement, flipped)}  # fmt: skip

    best = rows[GENSELECT]["correct_index"]  # 2
    pick = {
        i: f"<analysis>Solution {i} is the sound one.</analysis>\n<best_solution>{i}</best_solution>" for i in (1, 2)
    }

    spans = {"hallucination list": ["Vincent van Gogh", "1889"]}
    none_found = {"hallucination list": []}
    halu = (spans, none_found) if rows[RAGTRUTH]["is_halu"] else (none_found, spans)

    letter = rows[SWERL]["expected_answer"]  # "A"
    other_letter = next(k for option in rows[SWERL]["options"] for k in option if k != letter)  # "B"

    gold = rows[GENRM]["ground_truth_overall"]  # score_1 4, score_2 2, ranking 2
    rubric_ids = [r["rubric_id"] for r in rows[GENRM]["ground_truth_rubric_scores"]]  # [3]
    genrm_right = _genrm_verdict(rubric_ids, gold["score_1"], gold["score_2"], gold["ranking"])
    genrm_wrong = _genrm_verdict(rubric_ids, gold["score_2"], gold["score_1"], 7 - gold["ranking"])

    return [
        Answer(IMO_GRADING, "right", rows[IMO_GRADING], policy((ANY, imo[grade])), 1.0, 1),
        Answer(IMO_GRADING, "wrong", rows[IMO_GRADING], policy((ANY, imo[other_grade])), 0.0, 1),
        Answer(PROOF_JUDGEMENT, "right", rows[PROOF_JUDGEMENT], policy((ANY, judgement[gold_judgement])), 1.0, 1),
        Answer(PROOF_JUDGEMENT, "wrong", rows[PROOF_JUDGEMENT], policy((ANY, judgement[flipped])), 0.0, 1),
        Answer(GENSELECT, "right", rows[GENSELECT], policy((ANY, pick[best])), 1.0, 1),
        Answer(GENSELECT, "wrong", rows[GENSELECT], policy((ANY, pick[3 - best])), 0.0, 1),
        Answer(RAGTRUTH, "right", rows[RAGTRUTH], policy((ANY, json.dumps(halu[0]))), 1.0, 1),
        Answer(RAGTRUTH, "wrong", rows[RAGTRUTH], policy((ANY, json.dumps(halu[1]))), 0.0, 1),
        Answer(SWERL, "right", rows[SWERL], policy((ANY, f"<solution>{letter}</solution>")), 1.0, 1),
        Answer(SWERL, "wrong", rows[SWERL], policy((ANY, f"<solution>{other_letter}</solution>")), 0.0, 1),
        Answer(GENRM, "right", rows[GENRM], policy((ANY, genrm_right)), 0.0, 1),
        Answer(GENRM, "wrong", rows[GENRM], policy((ANY, genrm_wrong)), -15.0, 1),
    ]
