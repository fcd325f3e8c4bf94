# SPDX-License-Identifier: Apache-2.0
"""Every row of the training and validation files, checked before the first step; all bad rows reported at once.

The dataset reads rows lazily (`dataset.py`), so without this a bad row 7 of 40 stops the run at the step whose
batch holds it, after earlier steps trained. `check_data_files(paths, agent_names)` reads each file once, line by
line, and checks every non-blank line as the dataset and the manager would: it parses as JSON, has the fields
(`validate_row`), and names an agent the configured environments serve. It returns every problem as a `BadRow`
(file, 1-based line as an editor shows it, what is wrong), one per row, never one per sample. Lines are numbered
as `jsonl_index` numbers them: blank lines are skipped but counted, and a UTF-8 byte-order mark at the start of a
file is ignored.

It runs twice in a `main_ppo` job, each time over `data.train_files` and `data.val_files` (`configured_files`):
- When verl builds the dataset, before any worker or vLLM server starts (`check_before_workers`): JSON and fields.
  The dataset finds the environments file in verl's `data.nemo_gym_config` (`PLUGIN_CONFIG_KEY`, which
  `verl_overrides.plugin_overrides` sets). verl builds the training dataset, then the validation one, from the
  same config: files that passed once in a process are not read again.
- When the manager has started NeMo Gym (`agent_loop.py`): the same, and each row's agent among the running Gym's,
  which only a running Gym knows (its configuration composes agents from several files).
Either raises `DataFilesError` listing the rows; `data.check_rows: false` in the environments file turns both off, for
files too large to read at start-up.

Pure: no Ray, HTTP or vLLM; a file is read in bounded memory (one line at a time).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from recipe.nemo_gym.errors import ConfigError
from recipe.nemo_gym.row_agents import RowAgents, row_agents

__all__ = [
    "PLUGIN_CONFIG_KEY",
    "BadRow",
    "DataFilesError",
    "DataCheck",
    "check_before_workers",
    "check_data_files",
    "configured_files",
    "validate_row",
]

logger = logging.getLogger(__name__)

PLUGIN_CONFIG_KEY = "nemo_gym_config"
"""verl's `data.<key>`: the environments file, for the check when verl builds the dataset (`check_before_workers`)."""

MAX_LISTED = 20
"""Bad rows the error lists one by one; the rest are counted."""

_BOM = b"\xef\xbb\xbf"

# Files that passed `check_before_workers` in this process, by (path, size, modification time).
_PASSED: set[tuple[str, int, int]] = set()


def validate_row(row: Any) -> str:
    """Check a parsed row's shape; return its agent name or raise `ValueError` saying what is wrong."""
    if not isinstance(row, dict):
        raise ValueError(f"row is a JSON {type(row).__name__}, not an object")
    params = row.get("responses_create_params")
    if not isinstance(params, Mapping):
        raise ValueError("row has no 'responses_create_params' object")
    prompt = params.get("input")
    if not isinstance(prompt, str | list) or not prompt:
        raise ValueError("responses_create_params.input is missing or empty (expected a string or a list of items)")
    agent_ref = row.get("agent_ref")
    name = agent_ref.get("name") if isinstance(agent_ref, Mapping) else None
    if not isinstance(name, str) or not name:
        raise ValueError(
            "row has no 'agent_ref.name' (NeMo Gym routes each row to the agent it names; a file without them takes "
            "the agent whose Gym config declares it as a dataset, the configuration's only agent, or "
            "+data.default_agent_name=<agent>)"
        )
    return name


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


class DataFilesError(ConfigError):
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
    agents: RowAgents | None = None,
) -> DataCheck:
    """Check every row of `paths` (see the module docstring). `agent_names=None` skips the agent check; `agents`
    gives rows without `agent_ref` theirs, as the dataset does (`row_agents.py`)."""
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
                problem = _row_problem(raw, agent_names, agents, path)
                if problem is not None:
                    bad.append(BadRow(path, number, problem))
    return DataCheck(rows=rows, bad=tuple(bad))


def _row_problem(raw: bytes, agent_names: Collection[str] | None, agents: RowAgents | None, path: str) -> str | None:
    try:
        row = json.loads(raw)
    except json.JSONDecodeError as exc:
        return f"invalid JSON: {exc}"
    except UnicodeDecodeError as exc:
        return f"not UTF-8: {exc}"
    if agents is not None and isinstance(row, dict) and row.get("agent_ref") is None:
        agent = agents.for_file(path)
        if agent:
            row["agent_ref"] = {"name": agent}
    try:
        name = validate_row(row)
    except ValueError as exc:
        return str(exc)
    if agent_names is not None and name not in agent_names:
        return f"agent_ref.name {name!r} is not an agent of the configured environments {sorted(agent_names)}"
    return None


def configured_files(data_config: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """verl's `data.train_files` and `data.val_files` (each one path or a list), a file given as both once, so that
    each bad row is reported once: (existing files, missing ones)."""
    paths: dict[str, None] = {}
    for key in ("train_files", "val_files"):
        files = data_config.get(key)
        if files is None:
            continue
        for p in [files] if isinstance(files, str | os.PathLike) else list(files):
            paths[os.path.expanduser(os.fspath(p))] = None
    existing = [p for p in paths if os.path.isfile(p)]
    return existing, [p for p in paths if p not in existing]


def check_before_workers(data_config: Mapping[str, Any] | None) -> DataCheck | None:
    """Check every row of the configured files, JSON and fields, when verl builds the dataset; raise
    `DataFilesError` listing the bad ones. Returns None without reading when nothing is asked: no
    `data.nemo_gym_config`, `data.check_rows: false` there, or every file already passed in this process."""
    environments_file = data_config.get(PLUGIN_CONFIG_KEY) if data_config is not None else None
    if not environments_file:
        return None
    from recipe.nemo_gym.config import load_config  # pydantic models: only when a job names its environments file

    config = load_config(environments_file)
    if not config.data.check_rows:
        return None
    paths, _ = configured_files(data_config)  # a missing file is the dataset's own error, naming it
    identities = {_identity(p) for p in paths}
    if not paths or identities <= _PASSED:
        return None
    started = time.perf_counter()
    check = check_data_files(paths, None, row_agents(data_config.get("default_agent_name"), config.nemo_gym))
    if check.bad:
        raise DataFilesError(check, paths)
    _PASSED.update(identities)
    logger.warning(
        "NeMo Gym: all %d rows of %s are well-formed (checked in %.1f s, before verl starts its workers)",
        check.rows,
        ", ".join(paths),
        time.perf_counter() - started,
    )
    return check


def _identity(path: str) -> tuple[str, int, int]:
    stat = os.stat(path)
    return os.path.realpath(path), stat.st_size, stat.st_mtime_ns
