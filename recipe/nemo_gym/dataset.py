# SPDX-License-Identifier: Apache-2.0
"""`NeMoGymJSONLDataset`: NeMo Gym JSONL rows for verl, read lazily through a byte-offset index.

verl constructs it as `cls(data_files=, tokenizer=, processor=, config=, max_samples=)` (set
`data.custom_cls.path` / `data.custom_cls.name`). Construction scans each file once for the start offset of
every non-blank line (`jsonl_index.index_jsonl`): memory is 8 bytes per row, not the rows. `__getitem__`
reads and parses one row, validates it and returns what verl's `collate_fn` and trainer need:

- `dummy_tensor`: `torch.tensor([0], dtype=torch.uint8)`, as verl's `RLHFDataset`: the DataProto path needs
  one tensor per item.
- `raw_prompt`: `responses_create_params.input` as a list of Responses-API input items (a string input
  becomes one user message). It shares its objects with the row below, so it costs no extra payload.
- `data_source`: the row's `agent_ref.name`, so verl splits validation metrics by environment.
- `nemo_gym_row` (`ROW_KEY`): the whole row, what the manager sends to NeMo Gym. It is popped into verl's
  generation batch and reaches only the manager, not every training worker.
- `index` and `extra_info = {"index": ...}`: the row's position over all files in file order (before any
  `max_samples` subset), as verl's agent loop reads `index` for trajectory info. `uid` is not set: the
  trainer assigns one per row itself (and would overwrite it).

Rows are validated on access: the line must be a JSON object with a non-empty `responses_create_params.input`
(string or list) and a non-empty string `agent_ref.name`; otherwise `NeMoGymRowError` names the file and the
1-based line. Whether the agent exists is the manager's check; `agent_names_seen` holds the names of rows
read so far in this process. In a job (`data.nemo_gym_config` names the environments file, as the recipe's overrides
do), construction also checks every row of verl's `data.train_files` and `data.val_files` before verl starts its
workers, and raises `DataFilesError` listing every bad one (`data_check.check_before_workers`).
Rows without `agent_ref` (such as the example data NeMo Gym ships, which get theirs at data preparation) get one
by `row_agents.py`'s rules: `+data.default_agent_name=<agent>` (like NeMo Gym's own `+agent_name`), else the agent
whose Gym config declares the file as a dataset, else the configuration's only agent. Only local files are read
(verl's hdfs copy is not supported).

`max_samples` follows verl's `RLHFDataset`: a positive value below the row count keeps the first rows, or a
random subset when `config.shuffle` is set, drawn with `config.seed` (0 when unset, so the subset is always
reproducible). The tokenizer and processor are accepted and unused: prompt tokens come from the vLLM server.

The dataset pickles without open files (DataLoader workers reopen lazily) and reads with `os.pread`, which
shares no file position between forked workers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from recipe.nemo_gym.data_check import PLUGIN_CONFIG_KEY, check_before_workers, validate_row
from recipe.nemo_gym.errors import ConfigError
from recipe.nemo_gym.jsonl_index import index_jsonl, line_number, read_line
from recipe.nemo_gym.row_agents import RowAgents, row_agents

__all__ = ["ROW_KEY", "NeMoGymJSONLDataset", "NeMoGymRowError"]

ROW_KEY = "nemo_gym_row"


class NeMoGymRowError(ConfigError):
    """A JSONL row that is not a usable NeMo Gym row; the message names the file and line."""

    def __init__(self, path: str, line: int, problem: str):
        super().__init__(f"{path}:{line}: {problem}")
        self.path = path
        self.line = line
        self.problem = problem


def prompt_messages(row: Mapping[str, Any]) -> list[Any]:
    """The row's prompt as chat messages: `responses_create_params.input`, a bare string being one user message."""
    prompt = row["responses_create_params"]["input"]
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt


def _row_agents(config: Any) -> RowAgents:
    """Who runs a row without `agent_ref` (`row_agents.py`): `data.default_agent_name`, and in a job (the environments
    file in `data.nemo_gym_config`) the agents of the Gym configs it names."""
    default = config.get("default_agent_name") if config is not None else None
    environments_file = config.get(PLUGIN_CONFIG_KEY) if config is not None else None
    if not environments_file:
        return RowAgents(default=default)
    from recipe.nemo_gym.config import load_config

    return row_agents(default, load_config(environments_file).nemo_gym)


def _as_paths(data_files: Any) -> list[str]:
    if isinstance(data_files, str | os.PathLike):
        data_files = [data_files]
    paths = [os.path.expanduser(os.fspath(p)) for p in data_files]
    if not paths:
        raise ConfigError("NeMoGymJSONLDataset needs at least one data file")
    return paths


class NeMoGymJSONLDataset(Dataset):
    def __init__(
        self,
        data_files: str | os.PathLike | Sequence[str | os.PathLike],
        tokenizer: Any = None,
        processor: Any = None,
        config: Any = None,
        max_samples: int = -1,
    ):
        self.paths = _as_paths(data_files)
        self.tokenizer = tokenizer
        self.processor = processor
        self.config = config
        self._offsets: list[np.ndarray] = []
        self._sizes: list[int] = []
        for path in self.paths:
            if not os.path.isfile(path):
                raise ConfigError(f"NeMo Gym data file not found: {path}")
            self._offsets.append(index_jsonl(path))
            self._sizes.append(os.path.getsize(path))
        # _ends[f] = number of rows in files 0..f; row r lives in the first file whose end exceeds r.
        self._ends = np.cumsum([len(o) for o in self._offsets], dtype=np.int64)
        total = int(self._ends[-1])
        if total == 0:
            raise ConfigError(f"no rows in {', '.join(self.paths)}")

        self._selection: np.ndarray | None = None
        if max_samples is not None and 0 < max_samples < total:
            shuffle = bool(config.get("shuffle", False)) if config is not None else False
            if shuffle:
                seed = config.get("seed") if config is not None else None
                rng = np.random.default_rng(0 if seed is None else seed)
                self._selection = rng.choice(total, size=max_samples, replace=False).astype(np.int64)
            else:
                self._selection = np.arange(max_samples, dtype=np.int64)
        self._total = total
        self.row_agents = _row_agents(config)
        self.agent_names_seen: set[str] = set()
        self._fds: dict[int, int] = {}
        self._pid = os.getpid()
        # In a job, before verl starts a worker: every row of the training and validation files (`data_check.py`).
        check_before_workers(config)

    def __len__(self) -> int:
        return self._total if self._selection is None else len(self._selection)

    # pickling: never carry file descriptors into another process
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fds"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pid = os.getpid()

    def __del__(self) -> None:
        if getattr(self, "_pid", None) == os.getpid():
            for fd in getattr(self, "_fds", {}).values():
                os.close(fd)
            self._fds = {}

    def _fd(self, file: int) -> int:
        if self._pid != os.getpid():  # forked: the parent's descriptors stay the parent's to close
            self._fds, self._pid = {}, os.getpid()
        fd = self._fds.get(file)
        if fd is None:
            fd = self._fds[file] = os.open(self.paths[file], os.O_RDONLY)
        return fd

    def locate(self, index: int) -> tuple[str, int]:
        """(file path, 1-based line number) of dataset item `index` (scans the file: for messages)."""
        row = self._row_of(index)
        file = int(np.searchsorted(self._ends, row, side="right"))
        local = row - (int(self._ends[file - 1]) if file else 0)
        return self.paths[file], line_number(self.paths[file], int(self._offsets[file][local]))

    def _row_of(self, index: int) -> int:
        n = len(self)
        index = int(index)
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for a dataset of {n} rows")
        index %= n
        return int(self._selection[index]) if self._selection is not None else index

    def read_row(self, index: int) -> dict[str, Any]:
        """The parsed, validated JSONL row of dataset item `index`."""
        row_id = self._row_of(index)
        file = int(np.searchsorted(self._ends, row_id, side="right"))
        local = row_id - (int(self._ends[file - 1]) if file else 0)
        raw = read_line(self._fd(file), self._offsets[file], local, self._sizes[file])
        try:
            row = json.loads(raw)
            if isinstance(row, dict) and row.get("agent_ref") is None:
                agent = self.row_agents.for_file(self.paths[file])
                if agent:
                    row["agent_ref"] = {"name": agent}
            self.agent_names_seen.add(validate_row(row))
        except (ValueError, UnicodeDecodeError) as exc:
            path = self.paths[file]
            line = line_number(path, int(self._offsets[file][local]))
            problem = f"invalid JSON: {exc}" if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise NeMoGymRowError(path, line, problem) from None
        return row

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = self.read_row(index)
        raw_prompt = prompt_messages(row)
        row_id = self._row_of(index)
        return {
            "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
            "raw_prompt": raw_prompt,
            "data_source": row["agent_ref"]["name"],
            ROW_KEY: row,
            "index": row_id,
            "extra_info": {"index": row_id},
        }
