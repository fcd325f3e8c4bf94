# SPDX-License-Identifier: Apache-2.0
"""A right and a wrong answer for one example row of each code-scored long-context retrieval environment of NeMo
Gym 0.7.0 (every shipped example row is short: the longest, lc_niah's, renders to about 1.3k tokens).

Each `Answer` is a NeMo Gym example row (from Gym's wheel), the scripted policy that plays it and what the
environment's own `verify` must score it; every episode is one model call of Gym's simple_agent:

- lc_niah, row 2 (graphwalks-style "parents of node 8f14e45fce" over ~250 hashed edges, the node has a self-loop):
  right lists the sources of the edges into the node, less the node itself (1.0: F1 of the `Final Answer: [..]`
  node set on the last line against `expected_answer`, times 1 - reasoning_overlap, which is 0 since no reasoning
  parser runs and the response has no reasoning item); wrong lists the node's children instead, the edges read the
  wrong way round (0.0: no node in common).
- ruler, row 0 (subset "vt", variable tracking): right names the five variables of `outputs` (1.0: the share of
  `outputs` found, case-insensitively, as substrings of the answer); wrong names the first variable the text
  assigns, RIM, which holds another value (0.0). Its verify is annotated `-> BaseVerifyResponse`, so FastAPI cuts
  the answer to that model: the result holds the reward but neither the per-subset `vt` nor the row's fields.
- ruler2, row 1 (mv_niah_basic, match_type "all", two magic numbers): right says both (1.0: per reference,
  max(substring found, 1 - word error rate), averaged); wrong is the one word 1234567890, a number this text never
  gives (0.0: no substring, and one substituted word of one is a WER of 1).
- mrcr, row 1 (a pre-written history of 6 messages: a haiku about mountains, one about rivers, another about
  mountains; the last user turn asks for the 2nd mountain haiku, prefixed with "xyz789"): right repeats the 2nd
  mountain haiku after the prefix (1.0: difflib's SequenceMatcher ratio against `expected_answer`, both stripped of
  the prefix); wrong repeats the 1st one (0.35502958579881655, that ratio; `prefix_matched` true). An answer not
  starting with the prefix scores 0.0.
- graphwalks, row 2 ("BFS from node_0, nodes at exactly depth 2" over a small adjacency list): right gives the depth-2
  layer node_3, node_4, node_5 (1.0: F1 of the last line's `Final Answer: [..]` set against `expected_answer`);
  wrong gives the depth-1 layer (0.0: `parse_failed` false, no node in common). Both answers are computed here by a
  BFS over the row's adjacency list.

Quirks: ruler2's soft match goes below 0 for a wrong answer of several words (1 - WER with WER > 1: "I do not know"
would score -3.0 on this row); graphwalks, unlike lc_niah, does not strip quotes from the listed nodes, so a
JSON-quoted `["node_3", ...]` scores 0.0 there; mrcr's prefix gate means a `<think>` block before the answer (no
reasoning parser runs in these tests) scores 0.0. ruler's rows carry no agent_ref (`example_row` sets one). No
overrides are needed.

Pure: builds rows and `ScriptedPolicy`s; no vLLM, HTTP or Gym import.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.cpu_policy.answers import ANY, Answer, example_row, policy

CONFIGS = [
    "resources_servers/lc_niah/configs/lc_niah.yaml",
    "resources_servers/ruler/configs/ruler.yaml",
    "resources_servers/ruler2/configs/ruler2.yaml",
    "resources_servers/mrcr/configs/mrcr.yaml",
    "resources_servers/graphwalks/configs/graphwalks.yaml",
]

LC_NIAH = "lc_niah_simple_agent"
RULER = "ruler_simple_agent"
RULER2 = "ruler2_simple_agent"
MRCR = "mrcr_simple_agent"
GRAPHWALKS = "graphwalks_simple_agent"

EXAMPLES = {  # agent -> (Gym's example file, the row used)
    LC_NIAH: ("resources_servers/lc_niah/data/example.jsonl", 2),
    RULER: ("resources_servers/ruler/data/example.jsonl", 0),
    RULER2: ("resources_servers/ruler2/data/example.jsonl", 1),
    MRCR: ("resources_servers/mrcr/data/example.jsonl", 1),
    GRAPHWALKS: ("resources_servers/graphwalks/data/example.jsonl", 2),
}


def _prompt(row: dict) -> str:
    return row["responses_create_params"]["input"][-1]["content"]


def _final(nodes: list[str]) -> str:
    return f"Final Answer: [{', '.join(nodes)}]"


def _lc_niah(row: dict) -> tuple[str, str]:
    """The node's parents (right) and children (wrong), from the row's edge list (after its worked example)."""
    task = _prompt(row).split("<end example>", 1)[1]
    node = re.search(r"Find the parents of node (\w+)\.", task).group(1)
    edges = re.findall(r"^(\w+) -> (\w+)$", task, re.MULTILINE)
    parents = sorted({src for src, dst in edges if dst == node and src != node})
    children = sorted({dst for src, dst in edges if src == node and dst != node})
    return _final(parents), _final(children)


def _mrcr(row: dict) -> tuple[str, str]:
    """The 2nd mountain haiku of the history (right) and the 1st (wrong), each after the asked-for prefix."""
    prefix = row["random_string_to_prepend"]
    said = [m["content"] for m in row["responses_create_params"]["input"] if m["role"] == "assistant"]
    mountains = [text for text in said if text.startswith("aa-")]
    return prefix + mountains[1], prefix + mountains[0]


def _graphwalks(row: dict) -> tuple[str, str]:
    """The BFS layers at the asked depth (right) and one above it (wrong), from the row's adjacency list."""
    text = _prompt(row)
    start, depth = re.search(r"BFS from node (\w+) and return only the nodes at exactly depth (\d+)", text).groups()
    children = {
        src: [dst.strip() for dst in dsts.split(",")]
        for src, dsts in re.findall(r"^(\w+) -> (.+)$", text.split("Adjacency list:", 1)[1], re.MULTILINE)
    }
    layers, seen = [[start]], {start}
    for _ in range(int(depth)):
        layer = sorted({dst for src in layers[-1] for dst in children.get(src, []) if dst not in seen})
        seen.update(layer)
        layers.append(layer)
    return _final(layers[-1]), _final(layers[-2])


def answers(gym_root: Path) -> list[Answer]:
    """A right and a wrong answer per environment, over the example rows under `gym_root` (Gym's installed files),
    each row naming its agent."""
    rows = {agent: example_row(gym_root, path, index, agent) for agent, (path, index) in EXAMPLES.items()}
    niah_right, niah_wrong = _lc_niah(rows[LC_NIAH])
    variables = ", ".join(rows[RULER]["outputs"])
    first_variable = re.search(r"VAR (\w+) =", _prompt(rows[RULER])).group(1)  # RIM, assigned another value
    numbers = " and ".join(rows[RULER2]["expected_answer"])
    mrcr_right, mrcr_wrong = _mrcr(rows[MRCR])
    walk_right, walk_wrong = _graphwalks(rows[GRAPHWALKS])
    return [
        Answer(LC_NIAH, "right", rows[LC_NIAH], policy((ANY, f"The parents are listed below.\n{niah_right}")), 1.0, 1),
        Answer(LC_NIAH, "wrong", rows[LC_NIAH], policy((ANY, f"The parents are listed below.\n{niah_wrong}")), 0.0, 1),
        Answer(RULER, "right", rows[RULER], policy((ANY, f"The variables are {variables}.")), 1.0, 1),
        Answer(RULER, "wrong", rows[RULER], policy((ANY, f"The variable is {first_variable}.")), 0.0, 1),
        Answer(RULER2, "right", rows[RULER2], policy((ANY, f"{numbers}.")), 1.0, 1),
        Answer(RULER2, "wrong", rows[RULER2], policy((ANY, "1234567890")), 0.0, 1),
        Answer(MRCR, "right", rows[MRCR], policy((ANY, mrcr_right)), 1.0, 1),
        Answer(MRCR, "wrong", rows[MRCR], policy((ANY, mrcr_wrong)), 0.35502958579881655, 1),
        Answer(GRAPHWALKS, "right", rows[GRAPHWALKS], policy((ANY, f"Depth 2 holds:\n{walk_right}")), 1.0, 1),
        Answer(GRAPHWALKS, "wrong", rows[GRAPHWALKS], policy((ANY, f"Depth 2 holds:\n{walk_wrong}")), 0.0, 1),
    ]
