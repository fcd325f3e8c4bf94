# SPDX-License-Identifier: Apache-2.0
"""A right and a wrong answer for one example row of each LLM-judge-scored question-answering server of NeMo Gym 0.7.0.

Every server below scores by its judge's verdict alone (no code check decides these rows); each answer's `judge`
rules key on a phrase of that answer, which the judge prompt quotes, and give the verdict text the server's parser
reads. The verdicts were read from each server's `verify` in Gym 0.7.0:

- simpleqa, row 0 (the 2010 IEEE Frank Rosenblatt Award, gold "Michio Sugeno"): right names Michio Sugeno, wrong
  Lotfi A. Zadeh. The judge prompt (prompts/judge.yaml, over /v1/chat/completions) quotes the whole reply;
  `parse_judge_grade` reads the first letter: "A" is CORRECT (1.0), "B" INCORRECT (0.0).
- abstention, row 0 (publisher of Maddex's "Constitutions of the World", gold "CQ Press"): right answers
  \\boxed{CQ Press}, wrong \\boxed{Oxford University Press}. Only the boxed text reaches the judge ("Predicted
  answer: ..."); neither is the abstention token [IDK], so the judge is called: "A" gives correct_reward 1.0,
  "B" incorrect_reward 0.0 ("C" would give the abstention reward 0.5).
- omniscience, row 0 (the speed of light in m/s, gold 299792458): right "299,792,458 m/s", wrong "300,000,000 m/s"
  (wrong to the gold's last significant figure). `parse_judge_grade`: "A" is correct (1.0), "B" incorrect (0.0).
- equivalence_llm_judge, row 0 (who proposed evolution by natural selection, gold "darwin"; the row has no
  agent_ref, `example_row` adds it): right names Charles Darwin, wrong Jean-Baptiste Lamarck, each with a \\boxed{}
  answer. The config sets no extraction regex and no swap check, and the row no per-record regex, so one judge call
  sees the whole reply; the last verdict label wins: "[[A=B]]" gives 1.0, "[[A!=B]]" 0.0 (no rescue pass).
- false_statement_judge, row 3 (free nilpotent Mal'cev completions G_{r,c}: "finitely many orbits iff c <= 2",
  false as written since r = 2, c = 3 also has them): right says the statement is false and names the r = 2, c = 3
  case, wrong "proves" it as stated. The judge applies MathArena's 0-2 rubric; `parse_points` reads
  <points>N</points>: 2 gives reward 2 / 2 = 1.0, 0 gives 0.0.
- aalcr, row 2 (a non-expanding Australian business still exploiting opportunities, gold "Medium-sized business";
  the row's documents are cut short in the wheel, so the prompt is short): right "medium-sized", wrong "small".
  The legacy_v1_0 protocol needs the judge's whole reply to be exactly CORRECT (1.0) or INCORRECT (0.0).
- text_to_sql, row 1 (PostgreSQL: customers with more than 3 orders and over $500 spent; the row has no agent_ref):
  right is the gold query written without aliases, wrong keeps customers with at least 3 orders (COUNT(*) >= 3).
  The SQL is taken from the ```sql block; with `check_twice_swap` the judge is called twice when the first verdict
  is "[[A=B]]" (gold as A, then as B), and both calls get "[[A=B]]": 1.0. The wrong query gets "[[A!=B]]" on the
  first call: 0.0 (failure_reason judge_evaluation_failed), one judge call.
- multichallenge, row 0 (Alex, allergic to peanuts, asks for a snack; 2 rubric items, both pass_criteria YES,
  aggregation mean): right addresses Alex and suggests a peanut-free snack, wrong suggests peanut butter without
  the name. The judge is called once per rubric item (in parallel); `_extract_verdict` takes the last label:
  "[[YES]]" on both items gives 1.0, "[[NO]]" on both 0.0.

Blocked: longmemeval. Every shipped example row is over the 4000-token prompt budget (5819, 7695, 8993, 8207 and
4080 tokens in the tests' Qwen3 template): each row renders the whole multi-session chat history into its prompt
(`prepare_longmemeval.py`), and the wheel ships no shorter row (data/oracle.jsonl must be built from Hugging Face).

`TEST_OVERRIDES` (the test's, not the shipped config's): false_statement_judge asks its judge for max_output_tokens
131072 and multichallenge for 8192; that plus any judge prompt exceeds the tests' tiny model's 8192-token context,
so vLLM refuses the request ("This model's maximum context length is 8192 tokens. However, you requested ... output
tokens ..."), which the plugin's judge server reports as a failed judge call (`judge_failed`; Gym's vllm_model
would otherwise answer it with an empty reply, which both servers score 0 with no failure flag). Both are cut to
1024 here. Several configs name a judge model server of their own (simpleqa and abstention
`genrm_model`, aalcr a model no config defines, equivalence_llm_judge, text_to_sql and multichallenge
`policy_model`, false_statement_judge `judge_model`): the plugin points every one at its own judge.

Pure: builds rows and `ScriptedPolicy`s; no vLLM, HTTP or Gym import.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.cpu_policy.answers import ANY, Answer, example_row, policy, verdict

CONFIGS = [
    "resources_servers/simpleqa/configs/simpleqa.yaml",
    "resources_servers/abstention/configs/abstention.yaml",
    "resources_servers/omniscience/configs/omniscience.yaml",
    "resources_servers/equivalence_llm_judge/configs/equivalence_llm_judge.yaml",
    "resources_servers/false_statement_judge/configs/false_statement_judge.yaml",
    "resources_servers/aalcr/configs/aalcr.yaml",
    "resources_servers/text_to_sql/configs/text_to_sql.yaml",
    "resources_servers/multichallenge/configs/multichallenge.yaml",
]

# The tests' judge has an 8192-token context: a judge request whose prompt plus max_output_tokens exceeds it is
# refused by vLLM (a failed judge call). These two servers ask for more than the context holds.
JUDGE_MAX_OUTPUT_TOKENS = 1024
TEST_OVERRIDES = {
    server: {
        "resources_servers": {server: {"judge_responses_create_params": {"max_output_tokens": JUDGE_MAX_OUTPUT_TOKENS}}}
    }
    for server in ("false_statement_judge", "multichallenge")
}

SIMPLEQA = "simpleqa_simple_agent"
ABSTENTION = "abstention_simple_agent"
OMNISCIENCE = "omniscience_simple_agent"
EQUIVALENCE = "equivalence_llm_judge_simple_agent"
FALSE_STATEMENT = "false_statement_judge_simple_agent"
AALCR = "aalcr_simple_agent"
TEXT_TO_SQL = "text_to_sql_simple_agent"
MULTICHALLENGE = "multichallenge_simple_agent"

EXAMPLES = {  # agent -> (Gym's example file, the row used)
    SIMPLEQA: ("resources_servers/simpleqa/data/example.jsonl", 0),
    ABSTENTION: ("resources_servers/abstention/data/example.jsonl", 0),
    OMNISCIENCE: ("resources_servers/omniscience/data/example.jsonl", 0),
    EQUIVALENCE: ("resources_servers/equivalence_llm_judge/data/example.jsonl", 0),
    FALSE_STATEMENT: ("resources_servers/false_statement_judge/data/example.jsonl", 3),
    AALCR: ("resources_servers/aalcr/data/example.jsonl", 2),
    TEXT_TO_SQL: ("resources_servers/text_to_sql/data/example.jsonl", 1),
    MULTICHALLENGE: ("resources_servers/multichallenge/data/example.jsonl", 0),
}

# false_statement_judge row 3: the statement leaves out the r = 2, c = 3 case of the original.
CALLED_OUT = (
    "The statement is false as written. For r = 2 and c = 3 the group G_{2,3} also has finitely many orbits under "
    "automorphisms, although c > 2, so the 'only if' direction fails. What holds is: G_{r,c} has finitely many "
    "orbits if and only if c <= 2, or r = 2 and c = 3."
)
PROVED_ANYWAY = (
    "Proof. If c <= 2, Aut(G_{r,c}) maps onto GL_r(Q) and acts with finitely many orbits on each layer of the lower "
    "central series. If c >= 3, the automorphism group has smaller dimension than the variety of orbits it must "
    "cover, so there are infinitely many orbits. Hence G_{r,c} has finitely many orbits if and only if c <= 2."
)

# text_to_sql row 1 (PostgreSQL), as the policy writes it: the gold query without aliases, and one that keeps
# customers with 3 orders as well.
SQL_RIGHT = """SELECT customers.name, customers.email, COUNT(orders.order_id) AS order_count,
  SUM(orders.total_amount) AS total_spent
FROM customers
JOIN orders ON orders.customer_id = customers.customer_id
GROUP BY customers.customer_id, customers.name, customers.email
HAVING COUNT(orders.order_id) > 3 AND SUM(orders.total_amount) > 500
ORDER BY total_spent DESC;"""
SQL_WRONG = """SELECT c.name, c.email, COUNT(*) AS order_count, SUM(o.total_amount) AS total_spent
FROM customers c
JOIN orders o ON o.customer_id = c.customer_id
GROUP BY c.customer_id, c.name, c.email
HAVING COUNT(*) >= 3 AND SUM(o.total_amount) > 500
ORDER BY total_spent DESC;"""


def _judge(name: str, phrase: str, text: str):
    """The judge says `text` to every judge request quoting `phrase` (the answer's own words)."""
    return verdict(name, re.escape(phrase), text)


def answers(gym_root: Path) -> list[Answer]:
    """A right and a wrong answer per server, in CONFIGS order, over the example rows under `gym_root`."""
    rows = {agent: example_row(gym_root, path, index, agent) for agent, (path, index) in EXAMPLES.items()}
    winner = rows[SIMPLEQA]["expected_answer"]  # "Michio Sugeno"
    publisher = rows[ABSTENTION]["answer"]  # "CQ Press"
    sql = {"right": f"```sql\n{SQL_RIGHT}\n```", "wrong": f"```sql\n{SQL_WRONG}\n```"}
    snack = {
        "right": "Sure, Alex! Try crisp apple slices with sunflower seed butter: filling, and completely peanut-free.",
        "wrong": "How about a classic peanut butter and celery snack? Spread peanut butter on a few celery sticks.",
    }
    return [
        Answer(
            SIMPLEQA,
            "right",
            rows[SIMPLEQA],
            policy((ANY, f"The 2010 IEEE Frank Rosenblatt Award went to {winner}.")),
            1.0,
            1,
            judge=(_judge("simpleqa right", f"went to {winner}.", "A"),),
        ),
        Answer(
            SIMPLEQA,
            "wrong",
            rows[SIMPLEQA],
            policy((ANY, "The 2010 IEEE Frank Rosenblatt Award went to Lotfi A. Zadeh.")),
            0.0,
            1,
            judge=(_judge("simpleqa wrong", "went to Lotfi A. Zadeh.", "B"),),
        ),
        Answer(
            ABSTENTION,
            "right",
            rows[ABSTENTION],
            policy((ANY, f"\\boxed{{{publisher}}}")),
            1.0,
            1,
            judge=(verdict("abstention right", re.escape(f"Predicted answer: {publisher}") + r"\n", "A"),),
        ),
        Answer(
            ABSTENTION,
            "wrong",
            rows[ABSTENTION],
            policy((ANY, "\\boxed{Oxford University Press}")),
            0.0,
            1,
            judge=(_judge("abstention wrong", "Predicted answer: Oxford University Press", "B"),),
        ),
        Answer(
            OMNISCIENCE,
            "right",
            rows[OMNISCIENCE],
            policy((ANY, "299,792,458 m/s")),
            1.0,
            1,
            judge=(_judge("omniscience right", "Predicted answer: 299,792,458 m/s", "A"),),
        ),
        Answer(
            OMNISCIENCE,
            "wrong",
            rows[OMNISCIENCE],
            policy((ANY, "300,000,000 m/s")),
            0.0,
            1,
            judge=(_judge("omniscience wrong", "Predicted answer: 300,000,000 m/s", "B"),),
        ),
        Answer(
            EQUIVALENCE,
            "right",
            rows[EQUIVALENCE],
            policy((ANY, "Natural selection was proposed by Charles Darwin.\n\n\\boxed{Charles Darwin}")),
            1.0,
            1,
            judge=(
                _judge(
                    "equivalence_llm_judge right",
                    "proposed by Charles Darwin.",
                    "The candidate names Darwin, as the GOLD does.\n\n[[A=B]] they are equivalent",
                ),
            ),
        ),
        Answer(
            EQUIVALENCE,
            "wrong",
            rows[EQUIVALENCE],
            policy((ANY, "Natural selection was proposed by Jean-Baptiste Lamarck.\n\n\\boxed{Jean-Baptiste Lamarck}")),
            0.0,
            1,
            judge=(
                _judge(
                    "equivalence_llm_judge wrong",
                    "proposed by Jean-Baptiste Lamarck.",
                    "The candidate names Lamarck, not Darwin.\n\n[[A!=B]] they are not equivalent",
                ),
            ),
        ),
        Answer(
            FALSE_STATEMENT,
            "right",
            rows[FALSE_STATEMENT],
            policy((ANY, CALLED_OUT)),
            1.0,
            1,
            judge=(
                _judge(
                    "false_statement_judge right",
                    "The statement is false as written. For r = 2 and c = 3",
                    "<points>2</points>\n<assessment>The model says the statement is false and names the "
                    "r = 2, c = 3 case.</assessment>",
                ),
            ),
        ),
        Answer(
            FALSE_STATEMENT,
            "wrong",
            rows[FALSE_STATEMENT],
            policy((ANY, PROVED_ANYWAY)),
            0.0,
            1,
            judge=(
                _judge(
                    "false_statement_judge wrong",
                    "Proof. If c <= 2, Aut(G_{r,c}) maps onto GL_r(Q)",
                    "<points>0</points>\n<assessment>The model proves the false statement as if it were "
                    "true.</assessment>",
                ),
            ),
        ),
        Answer(
            AALCR,
            "right",
            rows[AALCR],
            policy((ANY, "You most likely run a medium-sized business.")),
            1.0,
            1,
            judge=(_judge("aalcr right", "most likely run a medium-sized business.", "CORRECT"),),
        ),
        Answer(
            AALCR,
            "wrong",
            rows[AALCR],
            policy((ANY, "You most likely run a small business.")),
            0.0,
            1,
            judge=(_judge("aalcr wrong", "most likely run a small business.", "INCORRECT"),),
        ),
        Answer(
            TEXT_TO_SQL,
            "right",
            rows[TEXT_TO_SQL],
            policy((ANY, sql["right"])),
            1.0,
            1,
            judge=(
                _judge(
                    "text_to_sql right",
                    "JOIN orders ON orders.customer_id = customers.customer_id",
                    "Both queries keep customers with more than 3 orders and over 500 spent.\n[[A=B]]",
                ),
            ),
        ),
        Answer(
            TEXT_TO_SQL,
            "wrong",
            rows[TEXT_TO_SQL],
            policy((ANY, sql["wrong"])),
            0.0,
            1,
            judge=(
                _judge(
                    "text_to_sql wrong",
                    "HAVING COUNT(*) >= 3",
                    "One query also keeps customers with exactly 3 orders.\n[[A!=B]]",
                ),
            ),
        ),
        Answer(
            MULTICHALLENGE,
            "right",
            rows[MULTICHALLENGE],
            policy((ANY, snack["right"])),
            1.0,
            1,
            judge=(
                _judge(
                    "multichallenge right",
                    "apple slices with sunflower seed butter",
                    "The response meets the criterion.\n[[YES]]",
                ),
            ),
        ),
        Answer(
            MULTICHALLENGE,
            "wrong",
            rows[MULTICHALLENGE],
            policy((ANY, snack["wrong"])),
            0.0,
            1,
            judge=(
                _judge(
                    "multichallenge wrong",
                    "classic peanut butter and celery snack",
                    "The response fails the criterion.\n[[NO]]",
                ),
            ),
        ),
    ]
