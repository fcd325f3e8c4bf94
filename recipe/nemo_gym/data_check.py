# SPDX-License-Identifier: Apache-2.0
"""Every row of the training and validation files, checked before the first step; all bad rows reported at once.

The dataset reads rows lazily (`dataset.py`), so without this a bad row 7 of 40 stops the run at the step whose
batch holds it, after earlier steps trained. `check_data_files(paths, agent_names)` reads each file once, line by
line, and checks every non-blank line as the dataset and the manager would: it parses as JSON, has the fields
(`dataset.validate_row`), and names an agent the configured environments serve. It returns every problem as a
`BadRow` (file, 1-based line as an editor shows it, what is wrong), one per row, never one per sample; the manager
raises `DataFilesError` listing them (`data.check_rows: false` in the plugin YAML turns the check off for files too
large to read at start-up). Lines are numbered as `jsonl_index` numbers them: blank lines are skipped but counted,
and a UTF-8 byte-order mark at the start of a file is ignored.

Pure: no Ray, HTTP or vLLM; a file is read in bounded memory (one line at a time).
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from recipe.nemo_gym.dataset import validate_row

__all__ = ["BadRow", "DataFilesError", "DataCheck", "check_data_files"]

MAX_LISTED = 20
"""Bad rows the error lists one by one; the rest are counted."""

_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class BadRow:
    path: str
    line: int
    """1-based, blank lines counted."""
    problem: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.problem}"


@dataclass(frozen=True)
class DataCheck:
    rows: int
    """Non-blank lines read, over all files."""
    bad: tuple[BadRow, ...]


class DataFilesError(ValueError):
    """Rows of the training or validation files that cannot run; every one is listed (up to `MAX_LISTED`)."""

    def __init__(self, check: DataCheck, paths: Sequence[str], hint: str = ""):
        self.check = check
        listed = [f"  {row}" for row in check.bad[:MAX_LISTED]]
        if len(check.bad) > MAX_LISTED:
            listed.append(f"  ... and {len(check.bad) - MAX_LISTED} more")
        head = (
            f"{len(check.bad)} of {check.rows} rows in {', '.join(paths)} cannot be trained on; nothing was trained. "
            f"Fix or remove them{hint}:"
        )
        super().__init__("\n".join([head, *listed]))


def check_data_files(
    paths: Sequence[str | os.PathLike],
    agent_names: Collection[str] | None,
    default_agent_name: str | None = None,
) -> DataCheck:
    """Check every row of `paths` (see the module docstring). `agent_names=None` skips the agent check;
    `default_agent_name` fills in rows without `agent_ref`, as `data.default_agent_name` does in the dataset."""
    bad: list[BadRow] = []
    rows = 0
    for path in map(os.fspath, paths):
        with open(path, "rb") as file:
            for number, raw in enumerate(file, start=1):
                if number == 1 and raw.startswith(_BOM):
                    raw = raw[len(_BOM) :]
                if not raw.strip():
                    continue
                rows += 1
                problem = _row_problem(raw, agent_names, default_agent_name)
                if problem is not None:
                    bad.append(BadRow(path, number, problem))
    return DataCheck(rows=rows, bad=tuple(bad))


def _row_problem(raw: bytes, agent_names: Collection[str] | None, default_agent_name: str | None) -> str | None:
    try:
        row = json.loads(raw)
    except json.JSONDecodeError as exc:
        return f"invalid JSON: {exc}"
    except UnicodeDecodeError as exc:
        return f"not UTF-8: {exc}"
    if default_agent_name and isinstance(row, dict) and row.get("agent_ref") is None:
        row["agent_ref"] = {"name": default_agent_name}
    try:
        name = validate_row(row)
    except ValueError as exc:
        return str(exc)
    if agent_names is not None and name not in agent_names:
        return f"agent_ref.name {name!r} is not an agent of the configured environments {sorted(agent_names)}"
    return None
