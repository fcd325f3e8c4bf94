# SPDX-License-Identifier: Apache-2.0
"""A right and a wrong answer for one example row of four code-scored science environments.

Each `Answer` is a NeMo Gym example row (from Gym's wheel), the scripted policy that plays it, and what the
environment's own `verify` must score it (read from each server's `app.py` in Gym 0.7.0). Every episode is one
model call through Gym's simple_agent; no server here calls a judge, downloads anything or needs the network.

- fukuyamabench, row 1 (S002: bromoethane + hydroxide, one checkpoint, gold products CCO and [Br-]): a fenced JSON
  pathway of one step whose `product_smiles` is the gold products dot-joined (1.0, status "scored", 1 of 1
  checkpoints) against the same step naming acetaldehyde, CC=O (0.0, status "scored", 0 of 1). `score_pathway`
  compares RDKit canonical-SMILES sets per checkpoint (lenient: a subset of the gold also matches, so the wrong
  product must share no species with it).
- moldetox, row 1 (task 3, scoring_mode smiles, gold O=C(O)CCCCC1CCSS1): `{"answer": <gold>}` (1.0: RDKit
  canonical SMILES equal; validity 1, Tanimoto 1) against `{"answer": <the row's toxic_smiles>}`, the unedited
  input molecule (0.0: valid, similar, but not the gold structure).
- assaybench, row 0 (40 screened genes, 6 with positive relevance): a DSPy-formatted reply (`[[ ## reasoning ## ]]`,
  `[[ ## answer ## ]]`, `[[ ## completed ## ]]`) whose answer lists the six positive genes by falling relevance
  (1.0: adjusted nDCG@100 is 1 for the ideal order) against six zero-relevance genes of the screen (0.0: nDCG 0,
  below the random baseline, which `compute_adjusted_ndcg` clamps to 0). Both keep `failure_reason` null.
- scicodepile, row 0 (get_S_pharma, whose test patches `bulk_fp_similarity` into the candidate's globals and checks
  the "erg" fingerprint type): a ```python block calling `bulk_fp_similarity(ref_m, gen_ms, fp_type="erg")`
  (1.0, status "pass") against the same with fp_type "ecfp" (0.0, status "fail": an AssertionError in `check`,
  failure_reason null since the fault is the model's). The code runs in a fresh `scp_runner.py` subprocess of the
  server's own Python (process isolation, an RLIMIT_AS cap and a throwaway CWD; no sandbox or container).

What each needs: fukuyamabench rdkit; moldetox rdkit and safe-mol (`huggingface-hub` in its requirements is only
used by scripts/prepare_moldetox.py to fetch the full data set, never by the server); assaybench the `assaybench`
package, whose HGNC tables ship in the wheel (`assaybench/data/hgnc/hgnc_symbols_cache.tsv`, so GeneMapper never
takes its `requests.get` download path); scicodepile nothing beyond Gym (the test's numpy seeding is wrapped in
try/except). Rows of fukuyamabench, assaybench and scicodepile carry no agent_ref (`example_row` sets it). No
override is needed.

Pure: builds rows and `ScriptedPolicy`s; no vLLM, HTTP or Gym import.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cpu_policy.answers import ANY, Answer, example_row, policy

CONFIGS = [
    "resources_servers/fukuyamabench/configs/fukuyamabench.yaml",
    "resources_servers/moldetox/configs/moldetox.yaml",
    "resources_servers/assaybench/configs/assaybench.yaml",
    "resources_servers/scicodepile/configs/scicodepile.yaml",
]

FUKUYAMA = "fukuyamabench_simple_agent"
MOLDETOX = "moldetox_simple_agent"
ASSAYBENCH = "assaybench_simple_agent"
SCICODEPILE = "scicodepile_simple_agent"

EXAMPLES = {  # agent -> (Gym's example file, the row used)
    FUKUYAMA: ("resources_servers/fukuyamabench/data/example.jsonl", 1),
    MOLDETOX: ("resources_servers/moldetox/data/example.jsonl", 1),
    ASSAYBENCH: ("resources_servers/assaybench/data/example.jsonl", 0),
    SCICODEPILE: ("resources_servers/scicodepile/data/example.jsonl", 0),
}


def _pathway(products: str) -> str:
    step = {"step_id": 1, "reaction_type": "SN2", "product_smiles": products, "is_terminal": True}
    return f"## Result\n\n```json\n{json.dumps([step])}\n```"


def _ranking(genes: list[str]) -> str:
    return (
        "[[ ## reasoning ## ]]\nRanked by expected effect.\n\n[[ ## answer ## ]]\n"
        + ", ".join(genes)
        + "\n\n[[ ## completed ## ]]"
    )


def _solution(row: dict, fp_type: str) -> str:
    name = row["verifier_metadata"]["entry_point"]  # get_S_pharma
    return (
        f'```python\ndef {name}(ref_m, gen_ms):\n    return bulk_fp_similarity(ref_m, gen_ms, fp_type="{fp_type}")\n```'
    )


def answers(gym_root: Path) -> list[Answer]:
    """A right and a wrong answer per environment, over the example rows under `gym_root` (Gym's installed files)."""
    rows = {agent: example_row(gym_root, path, index, agent) for agent, (path, index) in EXAMPLES.items()}

    (gold_step,) = rows[FUKUYAMA]["verifier_metadata"]["gt_pathway"]
    products = ".".join(gold_step["products"])  # CCO.[Br-]

    detox = rows[MOLDETOX]["verifier_metadata"]
    detox_right, detox_wrong = (json.dumps({"answer": smiles}) for smiles in (detox["answer"], detox["toxic_smiles"]))

    screen = rows[ASSAYBENCH]
    scored = sorted(zip(screen["relevance_scores"], screen["relevance_genes"], strict=True), key=lambda pair: -pair[0])
    hits = [gene for score, gene in scored if score > 0]
    misses = [
        gene for score, gene in zip(screen["relevance_scores"], screen["relevance_genes"], strict=True) if score == 0
    ]

    return [
        Answer(FUKUYAMA, "right", rows[FUKUYAMA], policy((ANY, _pathway(products))), 1.0, 1),
        Answer(FUKUYAMA, "wrong", rows[FUKUYAMA], policy((ANY, _pathway("CC=O"))), 0.0, 1),
        Answer(MOLDETOX, "right", rows[MOLDETOX], policy((ANY, detox_right)), 1.0, 1),
        Answer(MOLDETOX, "wrong", rows[MOLDETOX], policy((ANY, detox_wrong)), 0.0, 1),
        Answer(ASSAYBENCH, "right", screen, policy((ANY, _ranking(hits))), 1.0, 1),
        Answer(ASSAYBENCH, "wrong", screen, policy((ANY, _ranking(misses[: len(hits)]))), 0.0, 1),
        Answer(SCICODEPILE, "right", rows[SCICODEPILE], policy((ANY, _solution(rows[SCICODEPILE], "erg"))), 1.0, 1),
        Answer(SCICODEPILE, "wrong", rows[SCICODEPILE], policy((ANY, _solution(rows[SCICODEPILE], "ecfp"))), 0.0, 1),
    ]
