# SPDX-License-Identifier: Apache-2.0
"""`check_data_files`: every row of the data files checked at once, each bad row named by file and editor line;
`check_before_workers`: the same over verl's configured files, when verl builds the dataset."""

from __future__ import annotations

import json

import pytest
import yaml
from omegaconf import OmegaConf

from recipe.nemo_gym.config import ConfigError
from recipe.nemo_gym.data_check import (
    MAX_LISTED,
    PLUGIN_CONFIG_KEY,
    BadRow,
    DataCheck,
    DataFilesError,
    check_before_workers,
    check_data_files,
    configured_files,
)
from recipe.nemo_gym.row_agents import RowAgents, declared

AGENTS = {"math_with_judge_simple_agent", "uppercase_share_simple_agent"}


def _row(agent: str | None = "math_with_judge_simple_agent", prompt="What is 2+2?") -> str:
    row: dict = {"responses_create_params": {"input": prompt}}
    if agent is not None:
        row["agent_ref"] = {"name": agent}
    return json.dumps(row)


def test_every_bad_row_is_reported_once_with_its_file_and_editor_line(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text(
        "\n".join(
            [
                _row(),  # 1
                "",  # 2: blank, skipped but counted
                "{not json",  # 3
                json.dumps({"agent_ref": {"name": "math_with_judge_simple_agent"}}),  # 4: no responses_create_params
                _row("wordle_agent"),  # 5: an agent nobody serves
                _row(prompt=""),  # 6: empty prompt
                _row("uppercase_share_simple_agent"),  # 7
            ]
        )
        + "\n"
    )
    val = tmp_path / "val.jsonl"
    val.write_text(_row() + "\n" + "[1, 2]\n")
    check = check_data_files([train, val], AGENTS)
    assert check.rows == 8
    assert [(row.path, row.line) for row in check.bad] == [
        (str(train), 3),
        (str(train), 4),
        (str(train), 5),
        (str(train), 6),
        (str(val), 2),
    ]
    assert check.bad[0].problem.startswith("invalid JSON: Expecting property name enclosed in double quotes")
    assert check.bad[1].problem == "row has no 'responses_create_params' object"
    assert check.bad[2].problem == (
        "agent_ref.name 'wordle_agent' is not an agent of the configured environments "
        "['math_with_judge_simple_agent', 'uppercase_share_simple_agent']"
    )
    assert check.bad[3].problem.startswith("responses_create_params.input is missing or empty")
    assert check.bad[4].problem == "row is a JSON list, not an object"


def test_a_default_agent_fills_rows_without_one_and_a_byte_order_mark_is_ignored(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + (_row(agent=None) + "\n" + _row(agent=None)).encode())
    assert check_data_files([path], AGENTS, RowAgents(default="uppercase_share_simple_agent")) == DataCheck(2, ())
    missing = check_data_files([path], AGENTS).bad
    assert [row.line for row in missing] == [1, 2]
    assert missing[0].problem.startswith("row has no 'agent_ref.name' (NeMo Gym routes each row to the agent it names;")
    assert "+data.default_agent_name=<agent>" in missing[0].problem


def test_a_row_without_agent_takes_the_agent_declaring_its_file_else_the_only_agent(tmp_path):
    """Gym's rule for its example files (`row_agents.py`): the agent whose config declares the file as a dataset; in a
    configuration of one agent, that one; an explicit default wins over both."""
    gym_root = tmp_path / "gym"
    declared_file = gym_root / "resources_servers" / "env" / "data" / "example.jsonl"
    declared_file.parent.mkdir(parents=True)
    declared_file.write_text(_row(agent=None) + "\n")
    other = tmp_path / "mine.jsonl"
    other.write_text(_row(agent=None) + "\n")

    def agent(name, *paths):
        datasets = [{"name": "example", "type": "example", "jsonl_fpath": p} for p in paths]
        return {name: {"responses_api_agents": {"simple_agent": {"datasets": datasets}}}}

    relative = "resources_servers/env/data/example.jsonl"
    configs = {**agent("math_with_judge_simple_agent", relative), **agent("uppercase_share_simple_agent")}
    two = RowAgents(declare=lambda: declared(configs, gym_root))
    assert two.for_file(declared_file) == "math_with_judge_simple_agent" and two.for_file(other) is None
    assert check_data_files([declared_file], AGENTS, two) == DataCheck(1, ())
    assert [row.line for row in check_data_files([other], AGENTS, two).bad] == [1]
    one = RowAgents(declare=lambda: declared(agent("uppercase_share_simple_agent"), gym_root))
    assert one.for_file(other) == "uppercase_share_simple_agent"
    # A file two agents declare belongs to neither; an environment server is not an agent; a default wins.
    both = {**agent("a", relative), **agent("b", str(declared_file)), "env": {"environment_servers": {}}}
    assert RowAgents(declare=lambda: declared(both, gym_root)).for_file(declared_file) is None
    assert RowAgents("b", lambda: declared(agent("a", relative), gym_root)).for_file(declared_file) == "b"


def test_gym_configs_are_read_only_for_a_row_that_names_no_agent(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(_row() + "\n")
    reads = []
    agents = RowAgents(declare=lambda: reads.append(1) or declared({}, tmp_path))
    assert check_data_files([path], AGENTS, agents) == DataCheck(1, ()) and reads == []


def test_without_agent_names_only_parsing_and_fields_are_checked(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(_row("anything") + "\n")
    assert check_data_files([path], None) == DataCheck(1, ())


def test_the_error_lists_the_rows_up_to_a_limit_and_counts_the_rest():
    bad = tuple(BadRow("t.jsonl", i, "invalid JSON") for i in range(1, MAX_LISTED + 4))
    error = DataFilesError(DataCheck(rows=40, bad=bad), ["t.jsonl"])
    lines = str(error).splitlines()
    assert lines[0] == (
        f"{MAX_LISTED + 3} of 40 rows in t.jsonl cannot be trained on; nothing was trained. Fix or remove them:"
    )
    assert lines[1] == "  t.jsonl:1: invalid JSON"
    assert lines[MAX_LISTED] == f"  t.jsonl:{MAX_LISTED}: invalid JSON"
    assert lines[-1] == "  ... and 3 more"
    assert len(lines) == MAX_LISTED + 2


def test_bytes_that_are_not_utf8_are_a_bad_row_not_a_crash(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(_row().encode() + b'\n{"a": "\xff"}\n')
    assert check_data_files([path], AGENTS).bad == (
        BadRow(str(path), 2, "not UTF-8: 'utf-8' codec can't decode byte 0xff in position 7: invalid start byte"),
    )


# ------------------------------------------------------------- when verl builds the dataset, before its workers


def _environments_file(tmp_path, check_rows: bool = True):
    path = tmp_path / "plugin.yaml"
    path.write_text(yaml.safe_dump({"nemo_gym": {"config_paths": ["a.yaml"]}, "data": {"check_rows": check_rows}}))
    return path


def test_before_workers_every_configured_row_is_checked_once_and_every_bad_one_listed(tmp_path):
    train, val = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    train.write_text(_row() + "\n{cut short\n" + _row("an_agent_only_gym_knows") + "\n")
    val.write_text(json.dumps({"agent_ref": {"name": "x"}}) + "\n")
    data = OmegaConf.create(  # as verl hands its data config to the dataset; the training file is named twice
        {
            "train_files": [str(train)],
            "val_files": [str(val), str(train)],
            PLUGIN_CONFIG_KEY: str(_environments_file(tmp_path)),
        }
    )
    with pytest.raises(DataFilesError) as raised:
        check_before_workers(data)
    assert str(raised.value).splitlines() == [
        f"2 of 4 rows in {train}, {val} cannot be trained on; nothing was trained. Fix or remove them:",
        f"  {train}:2: invalid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        f"  {val}:1: row has no 'responses_create_params' object",
    ]  # the agent no configured environment may serve is the manager's check, once NeMo Gym runs


def test_before_workers_files_that_passed_are_not_read_again_until_they_change(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text(_row() + "\n" + _row() + "\n")
    data = {"train_files": str(train), "val_files": str(train), PLUGIN_CONFIG_KEY: str(_environments_file(tmp_path))}
    assert check_before_workers(data) == DataCheck(rows=2, bad=())
    assert check_before_workers(data) is None  # the validation dataset, built next from the same config
    train.write_text(_row() + "\n[]\n")
    with pytest.raises(DataFilesError, match=r"1 of 2 rows"):
        check_before_workers(data)


def test_before_workers_nothing_is_read_without_the_plugin_yaml_or_with_check_rows_off(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text("{cut short\n")
    assert check_before_workers(None) is None
    assert check_before_workers({"train_files": str(train)}) is None
    off = {"train_files": str(train), PLUGIN_CONFIG_KEY: str(_environments_file(tmp_path, check_rows=False))}
    assert check_before_workers(off) is None


def test_before_workers_a_missing_file_is_left_to_the_dataset_that_opens_it(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text(_row() + "\n")
    missing = tmp_path / "val.jsonl"
    data = {"train_files": str(train), "val_files": str(missing), PLUGIN_CONFIG_KEY: str(_environments_file(tmp_path))}
    assert configured_files(data) == ([str(train)], [str(missing)])
    assert check_before_workers(data) == DataCheck(rows=1, bad=())


def test_before_workers_a_bad_plugin_yaml_is_named_before_anything_starts(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text(_row() + "\n")
    bad = tmp_path / "plugin.yaml"
    bad.write_text("data:\n  check_rows: maybe\n")
    with pytest.raises(ConfigError, match=rf"{bad}: .*data.check_rows"):
        check_before_workers({"train_files": str(train), PLUGIN_CONFIG_KEY: str(bad)})
