# SPDX-License-Identifier: Apache-2.0
"""docs/environments.md, the tables of NeMo Gym's resources servers and environments, against the Gym installed in
`.venv-gym`.

Resources servers (the first table):
- One row per folder of the installed Gym's `resources_servers/` and no other, the message naming the rows to add and
  the rows to remove.
- Every status is "runs here: ...", "judge: ..." (an LLM judge scores it; "...; runs here with the plugin's judge:
  ..." when it runs here), "needs: ..." (the page's kinds of need) or "candidate: nothing blocking found (not run)".
- Every row that runs here names test files that exist and a shipped environments file (`recipe/nemo_gym/configs/`)
  that starts the server's own config, or a test that mentions the server; the counts in the page's sentence ("75 of
  the 145 ...: 50 scored by code, 25 by an LLM judge") are the table's.

Environments (the second table):
- The table has one row per folder of the installed Gym's `environments/` and no other: a Gym release that adds or
  drops an environment fails here, the message naming the rows to add and the rows to remove.
- Every status is one of the page's four kinds ("runs here: ...", "needs: ...", "candidate: nothing blocking found
  (not run)", "moved to `...`"); a "needs" status lists only the page's kinds of need; a moved row points at another
  row of the table; a PyPI package a row says is missing is indeed not in `packaging/gym-requirements.txt`.
- Every "runs here" row names test files that exist and mention the environment's resources server (read from the
  environment's own config in the wheel, and the configs it names, with `yaml`).
- Every config path in either table is a file under the installed Gym's root.

Gym's root is `gym_layout.nemo_gym_install_root()`: the Gym environment's interpreter says where `nemo_gym` lies
(`importlib.util.find_spec`); no module of NeMo Gym is imported. Without an `environments/` folder there (Gym before
0.7, named by `$NEMO_GYM_ENV`), the tests skip.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from recipe.nemo_gym.gym.owned.gym_layout import nemo_gym_install_root
from tests.support.helpers import REPO_ROOT as REPO

PAGE = REPO / "docs" / "environments.md"
GYM_REQUIREMENTS = REPO / "packaging" / "gym-requirements.txt"
HEADER = "| Environment | Task | Status here | Config to start from |"

RUNS_HERE = "runs here: "
NEEDS = "needs: "
CANDIDATE = "candidate: nothing blocking found (not run)"
MOVED = re.compile(r"moved to `([\w.-]+)`")
NEED_KINDS = (
    "judge model",
    "user-simulator model",
    "sandbox",
    "docker",
    "network access",
    "CLI agent harness",
    "git-only dependency",
    "image-capable policy",
    "PyPI packages",
    "data download",
)
"""The page's kinds of need, each what the CPU test machine (no network, model hub or docker) cannot give."""
SERVER_NEED_KINDS = (
    *NEED_KINDS,
    "GPU",
    "vLLM inside Gym",
    "model download",
    "audio-capable policy",
    "git-only dependencies",
    "internal data",
    "Singularity/Apptainer",
    "Java",
    "bundled package",
    "a domain-exclusion file",
    "a vLLM policy server",
    "a subclass",
    "a server that imports it",
)
"""The kinds of need of the resources-server table: the environments' and what single servers need besides."""
SERVERS_HEADER = "| Resources server | What it scores | Agent | Status here | Config to start from |"
JUDGE = "judge: "
RUNS_WITH_JUDGE = "; runs here with the plugin's judge: "
SHIPPED_CONFIG = re.compile(r"`(recipe/nemo_gym/configs/[\w.-]+\.yaml)`")

_CODE = re.compile(r"`([^`]+)`")
_NEED_SEPARATOR = re.compile(r";\s*(?![^()]*\))")  # a semicolon outside parentheses


@dataclass(frozen=True)
class Row:
    environment: str
    task: str
    status: str
    configs: tuple[str, ...]
    line: int

    def where(self) -> str:
        return f"docs/environments.md:{self.line} ({self.environment})"


def _rows(header: str) -> list[tuple[int, list[str]]]:
    """(line number, cells) of the table headed `header`, from the line after its separator to the first non-row."""
    lines = PAGE.read_text().splitlines()
    assert header in lines, f"docs/environments.md has no table headed {header!r}"
    start = lines.index(header) + 2
    width = header.count("|") - 1
    rows = []
    for number, line in enumerate(lines[start:], start + 1):
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == width, f"docs/environments.md:{number}: {len(cells)} cells, not {width}: {line}"
        name = re.fullmatch(r"`([\w.-]+)`", cells[0])
        assert name, f"docs/environments.md:{number}: the first cell is not one `name`: {cells[0]}"
        rows.append((number, [name[1], *cells[1:]]))
    return rows


def table_rows() -> list[Row]:
    """The rows of the environments' table."""
    return [Row(c[0], c[1], c[2], tuple(_CODE.findall(c[3])), number) for number, c in _rows(HEADER)]


def server_rows() -> list[Row]:
    """The rows of the resources servers' table (`task` holds what it scores)."""
    return [Row(c[0], c[1], c[3], tuple(_CODE.findall(c[4])), number) for number, c in _rows(SERVERS_HEADER)]


@pytest.fixture(scope="module")
def gym_root() -> Path:
    """The installed Gym's root (its site-packages folder: `nemo_gym/`, `environments/`, `resources_servers/`)."""
    root = nemo_gym_install_root()
    if not (root / "environments").is_dir():
        pytest.skip(f"the NeMo Gym at {root} has no environments/ folder (a Gym before 0.7)")
    return root


def environment_folders(root: Path) -> set[str]:
    return {p.name for p in (root / "environments").iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}


def needs_of(status: str) -> list[str]:
    return [need.strip() for need in _NEED_SEPARATOR.split(status.removeprefix(NEEDS))]


def resources_server_folders(root: Path) -> set[str]:
    return {p.name for p in (root / "resources_servers").iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}


def resources_servers(root: Path, environment: str) -> set[str]:
    """The resources servers (their folder names under `resources_servers/`) that the environment's own configs,
    and the configs those name in `config_paths`, start."""
    found: set[str] = set()
    pending = sorted((root / "environments" / environment).glob("config*.yaml"))
    seen: set[Path] = set()
    while pending:
        path = pending.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        config = yaml.safe_load(path.read_text()) or {}
        pending.extend(root / named for named in config.get("config_paths", []))
        for instance in config.values():
            if isinstance(instance, dict) and isinstance(instance.get("resources_servers"), dict):
                found.update(instance["resources_servers"])
    return found


def locked_gym_packages() -> set[str]:
    """The packages `packaging/gym-requirements.txt` locks (`name==version` lines), names normalised."""
    names = re.findall(r"^([A-Za-z0-9][\w.-]*)==", GYM_REQUIREMENTS.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[-_.]+", "-", name).lower() for name in names}


def test_the_table_has_one_row_per_environment_folder_of_the_installed_gym(gym_root):
    named = [row.environment for row in table_rows()]
    folders = environment_folders(gym_root)
    to_add, to_remove = sorted(folders - set(named)), sorted(set(named) - folders)
    twice = sorted({name for name in named if named.count(name) > 1})
    assert not (to_add or to_remove or twice), (
        f"docs/environments.md is out of step with {gym_root / 'environments'}: rows to add {to_add}, "
        f"rows to remove {to_remove}, rows given twice {twice}"
    )


def test_every_status_is_runs_here_a_list_of_needs_a_candidate_or_moved():
    rows = table_rows()
    names = {row.environment for row in rows}
    moved = {row.environment for row in rows if MOVED.fullmatch(row.status)}
    locked = locked_gym_packages()
    wrong = []
    for row in rows:
        if row.status.startswith(NEEDS):
            wrong += _wrong_needs(row, NEED_KINDS, locked)
        elif target := MOVED.fullmatch(row.status):
            if target[1] not in names or target[1] in moved:
                wrong.append(f"{row.where()}: moved to {target[1]!r}, which is no row of its own in the table")
        elif not row.status.startswith((RUNS_HERE, CANDIDATE)):
            wrong.append(f"{row.where()}: status {row.status!r} is none of runs here / needs / candidate / moved")
    assert not wrong, "\n".join(wrong)


def test_every_runs_here_row_names_existing_tests_that_mention_its_resources_server(gym_root):
    rows = [row for row in table_rows() if row.status.startswith(RUNS_HERE)]
    assert rows, "no row of docs/environments.md runs here"
    wrong = []
    for row in rows:
        tests = re.findall(r"`(tests/[^`]+\.py)`", row.status)
        servers = resources_servers(gym_root, row.environment)
        if not tests:
            wrong.append(f"{row.where()}: runs here, but names no test file")
        if not servers:
            wrong.append(f"{row.where()}: no resources server found in the environment's configs")
        for test in tests:
            if not (REPO / test).is_file():
                wrong.append(f"{row.where()}: {test} does not exist")
            elif servers and not (
                any(server in (REPO / test).read_text() for server in servers) or _shipped_configs_start(row, servers)
            ):
                wrong.append(
                    f"{row.where()}: {test} does not mention its resources server {sorted(servers)}, and no shipped "
                    "config the row names starts it"
                )
    assert not wrong, "\n".join(wrong)


def test_the_servers_table_has_one_row_per_resources_server_of_the_installed_gym(gym_root):
    named = [row.environment for row in server_rows()]
    folders = resources_server_folders(gym_root)
    to_add, to_remove = sorted(folders - set(named)), sorted(set(named) - folders)
    twice = sorted({name for name in named if named.count(name) > 1})
    assert not (to_add or to_remove or twice), (
        f"docs/environments.md is out of step with {gym_root / 'resources_servers'}: rows to add {to_add}, "
        f"rows to remove {to_remove}, rows given twice {twice}"
    )
    assert named == sorted(named), "the servers' rows are not in alphabetical order"


def test_every_server_status_runs_here_names_its_judge_lists_its_needs_or_is_a_candidate():
    locked = locked_gym_packages()
    wrong = []
    for row in server_rows():
        if row.status.startswith(NEEDS):
            wrong += _wrong_needs(row, SERVER_NEED_KINDS, locked)
        elif not row.status.startswith((RUNS_HERE, JUDGE, CANDIDATE)):
            wrong.append(f"{row.where()}: status {row.status!r} is none of runs here / judge / needs / candidate")
        elif row.status.startswith(JUDGE) and RUNS_HERE in row.status and RUNS_WITH_JUDGE not in row.status:
            wrong.append(f"{row.where()}: a judged server that runs here says so as {RUNS_WITH_JUDGE.strip()!r}")
    assert not wrong, "\n".join(wrong)


def _wrong_needs(row: Row, kinds: tuple[str, ...], locked: set[str]) -> list[str]:
    """What is wrong with a "needs: ..." row: a need of none of `kinds`, a PyPI package named missing that is locked."""
    wrong = []
    for need in needs_of(row.status):
        if not need.startswith(kinds):
            wrong.append(f"{row.where()}: {need!r} is none of the page's needs {kinds}")
        elif need.startswith("PyPI packages"):
            wrong += [
                f"{row.where()}: {package!r} is named as missing, but gym-requirements.txt locks it"
                for package in _CODE.findall(need)
                if re.sub(r"[-_.]+", "-", package).lower() in locked
            ]
    return wrong


def _shipped_configs_start(row: Row, servers: set[str]) -> list[str]:
    """The shipped environments files the row's status names that start one of `servers` (their folders' configs)."""
    found = []
    for config in SHIPPED_CONFIG.findall(row.status):
        paths = yaml.safe_load((REPO / config).read_text())["nemo_gym"]["config_paths"]
        if any(f"resources_servers/{server}/" in path for server in servers for path in paths):
            found.append(config)
    return found


def _runs_here(row: Row) -> bool:
    return row.status.startswith(RUNS_HERE) or RUNS_WITH_JUDGE in row.status


def test_every_server_that_runs_here_names_its_tests_and_a_shipped_config_that_starts_it():
    rows = [row for row in server_rows() if _runs_here(row)]
    wrong = []
    for row in rows:
        tests = re.findall(r"`(tests/[^`]+\.py)`", row.status)
        if not tests:
            wrong.append(f"{row.where()}: runs here, but names no test file")
        missing = [test for test in tests if not (REPO / test).is_file()]
        wrong += [f"{row.where()}: {test} does not exist" for test in missing]
        starts = _shipped_configs_start(row, {row.environment})
        mentioned = any(row.environment in (REPO / test).read_text() for test in tests if test not in missing)
        if not (starts or mentioned):
            wrong.append(f"{row.where()}: neither a shipped config it names starts it nor a test it names mentions it")
    assert not wrong, "\n".join(wrong)
    judged = [row for row in rows if row.status.startswith(JUDGE)]
    counts = re.search(
        r"(\d+) of the (\d+) run end to end here: (\d+) scored by code, (\d+) by an LLM judge", PAGE.read_text()
    )
    assert counts, "docs/environments.md gives no count of the servers that run here"
    assert tuple(map(int, counts.groups())) == (len(rows), len(server_rows()), len(rows) - len(judged), len(judged))


def test_every_config_in_the_table_is_a_file_of_the_installed_gym(gym_root):
    wrong = []
    for row in [*table_rows(), *server_rows()]:
        if not row.configs:
            wrong.append(f"{row.where()}: names no config")
        missing = [path for path in row.configs if not (gym_root / path).is_file()]
        wrong += [f"{row.where()}: no file {gym_root / path}" for path in missing]
    assert not wrong, "\n".join(wrong)
