# SPDX-License-Identifier: Apache-2.0
"""The demo's data: NeMo Gym's example rows as its data preparation hands them to training, and ours.

`example_rows(agents)` reads the example rows NeMo Gym ships with each environment and sets `agent_ref` on each,
as NeMo Gym's data preparation does; `demo_rows` adds the first rows of this repository's example environment
`uppercase_share`. `with_tools` cuts a row's tool list, `write_jsonl` writes rows where `data.train_files` reads
them. The tests and benchmarks use the same functions for their data.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
BLEND = REPO_ROOT / "recipe" / "nemo_gym" / "configs" / "demo_blend.yaml"
UPPERCASE_ROWS = REPO_ROOT / "resources_servers" / "uppercase_share" / "data" / "train.jsonl"

EXAMPLE_DATA = {
    "math_with_judge_simple_agent": "resources_servers/math_with_judge/data/example.jsonl",
    "workplace_assistant_simple_agent": "resources_servers/workplace_assistant/data/example.jsonl",
    "example_single_tool_call_simple_agent": "resources_servers/example_single_tool_call/data/example.jsonl",
}
DEFAULT_EXAMPLE_AGENTS = ("math_with_judge_simple_agent", "workplace_assistant_simple_agent")


def example_rows(
    agents: Sequence[str] = DEFAULT_EXAMPLE_AGENTS, environment: str | Path | None = None
) -> list[dict[str, Any]]:
    """NeMo Gym's example rows for `agents`, each with `agent_ref` set as NeMo Gym's data preparation does, from
    the Gym in `environment` (`nemo_gym.environment`'s rule: unset, `$NEMO_GYM_ENV`, else `.venv-gym`)."""
    from recipe.nemo_gym.config import NeMoGymSection
    from recipe.nemo_gym.gym.owned.gym_layout import section_root

    root = section_root(NeMoGymSection(config_paths=["-"], environment=environment))
    rows = []
    for agent in agents:
        for line in (root / EXAMPLE_DATA[agent]).read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                row["agent_ref"] = {"type": "responses_api_agents", "name": agent}
                rows.append(row)
    return rows


def with_tools(row: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """`row` offering the policy only the tools `names` (in the row's order); an unknown name is an error.

    NeMo Gym's workplace rows list all 27 tools (~4,000 prompt tokens); the CPU jobs in the tests keep the ones
    their scripted episodes call, so each training row is ~1,000 positions instead of ~5,000. The environment
    still runs the calls: its tools do not depend on what the prompt listed.
    """
    params = row["responses_create_params"]
    offered = [tool["name"] for tool in params.get("tools", [])]
    missing = sorted(set(names) - set(offered))
    if missing:
        raise ValueError(f"row does not offer the tools {missing}; it offers {offered}")
    tools = [tool for tool in params["tools"] if tool["name"] in names]
    return {**row, "responses_create_params": {**params, "tools": tools}}


def write_jsonl(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    path = Path(path)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# The workplace rows as NeMo Gym ships them offer all 27 tools (~4,100 prompt tokens). On CPU every row of a
# batch is padded to the longest prompt the job allows, so the demo offers three of them (~580 tokens) and
# trains at a prompt length of 768 instead of 4,608: the same rows, a step about five times cheaper.
WORKPLACE_TOOLS = ("company_directory_find_email_address", "email_search_emails", "email_reply_email")


def demo_rows(uppercase_rows: int, *, workplace: bool) -> list[dict]:
    """NeMo Gym's shipped math example rows, its workplace example rows if `workplace` (with `agent_ref`), and the
    first `uppercase_rows` of our uppercase_share rows."""
    agents = ["math_with_judge_simple_agent"] + (["workplace_assistant_simple_agent"] if workplace else [])
    rows = [
        with_tools(row, WORKPLACE_TOOLS) if row["agent_ref"]["name"].startswith("workplace") else row
        for row in example_rows(agents)
    ]
    lines = [line for line in UPPERCASE_ROWS.read_text().splitlines() if line.strip()]
    rows += [json.loads(line) for line in lines[:uppercase_rows]]
    return rows
