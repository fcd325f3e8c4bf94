# SPDX-License-Identifier: Apache-2.0
"""Which agent runs a row that names none: NeMo Gym's example files ship rows without `agent_ref`.

NeMo Gym gives such rows their agent when it prepares data (`ng_prepare_data`, `gym data prepare`), from the agent
whose config declares the file (`datasets: [{jsonl_fpath: ...}]`). The plugin applies the same rule to the data
files verl trains on, so a user can train on the example files as they ship. A row without `agent_ref` gets, in
order (`RowAgents.for_file`):

1. `data.default_agent_name` (verl's config), when set: every such row, whatever its file;
2. the agent whose Gym config declares the row's file as one of its datasets (the paths compared once resolved,
   relative ones under Gym's root, as Gym resolves them), unless several agents declare it;
3. the one agent of the Gym configuration, when it has exactly one.

A row that names its agent keeps it. A row left without one is a bad row (`data_check.py` lists it).

`declared(merged, gym_root)` is pure (Gym's merged config dict in; only path arithmetic). `row_agents(default,
section)` reads the environments file's Gym config files, once and only when a row names no agent (an attached Gym's
files are not readable here: rule 1 only).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recipe.nemo_gym.config import NeMoGymSection

AGENT_SERVER_TYPE = "responses_api_agents"


@dataclass(frozen=True)
class DeclaredAgents:
    """What a Gym configuration says about its agents: the dataset files each declares and its only agent."""

    by_file: Mapping[str, str] = field(default_factory=dict)
    """Resolved path of a dataset file one agent declares -> that agent."""
    only_agent: str | None = None
    """The configuration's one agent, when it has exactly one."""


class RowAgents:
    """The agent of a row that names none, by the rules above. `declare` gives the Gym configuration's agents; it is
    called once, at the first row that needs it (most data names its agents, and then no Gym config is read)."""

    def __init__(self, default: str | None = None, declare: Callable[[], DeclaredAgents] | None = None):
        self.default = default
        self._declare = declare
        self._declared: DeclaredAgents | None = None

    def for_file(self, path: str | os.PathLike) -> str | None:
        """The agent of a row of `path` that names none, or None."""
        if self.default:
            return self.default
        if self._declare is None:
            return None
        if self._declared is None:
            self._declared = self._declare()
        return self._declared.by_file.get(os.path.realpath(path)) or self._declared.only_agent


def declared(merged: Mapping[str, Any], gym_root: Path) -> DeclaredAgents:
    """The agents of Gym's merged config `merged` and the dataset files each declares (relative under `gym_root`)."""
    agents: list[str] = []
    owners: dict[str, set[str]] = {}
    for name, block in merged.items():
        implementations = block.get(AGENT_SERVER_TYPE) if isinstance(block, Mapping) else None
        if not isinstance(implementations, Mapping):
            continue
        agents.append(str(name))
        for settings in implementations.values():
            datasets = settings.get("datasets") if isinstance(settings, Mapping) else None
            for dataset in datasets if isinstance(datasets, list) else []:
                path = dataset.get("jsonl_fpath") if isinstance(dataset, Mapping) else None
                if isinstance(path, str) and "${" not in path:
                    full = Path(path) if Path(path).is_absolute() else gym_root / path
                    owners.setdefault(os.path.realpath(full), set()).add(str(name))
    by_file = {path: next(iter(names)) for path, names in owners.items() if len(names) == 1}
    return DeclaredAgents(by_file=by_file, only_agent=agents[0] if len(agents) == 1 else None)


def row_agents(default: str | None, section: NeMoGymSection | None) -> RowAgents:
    """`RowAgents` for verl's `data.default_agent_name` and the environments file's `nemo_gym` section (None, or an
    attached Gym: the default only). The Gym config files the section names are read at the first row without an
    agent."""
    if section is None or section.attach is not None:
        return RowAgents(default)

    def declare() -> DeclaredAgents:
        from recipe.nemo_gym.gym.owned.global_config import merged_config
        from recipe.nemo_gym.gym.owned.gym_layout import section_config_paths, section_root

        return declared(merged_config(section_config_paths(section), section.config_overrides), section_root(section))

    return RowAgents(default, declare)
