# SPDX-License-Identifier: Apache-2.0
"""NeMoGymJSONLDataset and its byte-offset index: laziness, file quirks, errors naming file and line, verl glue."""

from __future__ import annotations

import gc
import importlib.util
import json
import pickle
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader
from verl.protocol import DataProto
from verl.trainer.ppo.utils import create_rl_dataset
from verl.utils.dataset.rl_dataset import collate_fn, get_dataset_class

from recipe.nemo_gym.data_check import DataFilesError, validate_row
from recipe.nemo_gym.dataset import ROW_KEY, NeMoGymJSONLDataset, NeMoGymRowError
from recipe.nemo_gym.errors import ConfigError
from recipe.nemo_gym.jsonl_index import index_jsonl, line_number, read_line
from recipe.nemo_gym.verl_overrides import plugin_overrides
from tests.support.helpers import REPO_ROOT


def row(i: int, agent: str = "math_with_judge", prompt=None) -> dict:
    return {
        "responses_create_params": {"input": prompt if prompt is not None else [{"role": "user", "content": f"q{i}"}]},
        "agent_ref": {"name": agent},
        "id": i,
    }


def write(path: Path, lines: list, newline: str = "\n", trailing: bool = True) -> Path:
    text = newline.join(line if isinstance(line, str) else json.dumps(line, ensure_ascii=False) for line in lines)
    path.write_bytes((text + (newline if trailing else "")).encode("utf-8"))
    return path


# --------------------------------------------------------------------------------------------------------
# index
# --------------------------------------------------------------------------------------------------------


def test_index_holds_the_start_of_each_non_blank_line_and_skips_blank_ones(tmp_path):
    data = b'{"a":1}\n\n   \n{"b":2}\r\n\t\r\n  {"c":3}\n{"d":4}'
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    offsets = index_jsonl(path)
    assert offsets.tolist() == [0, 13, 25, 35]
    assert offsets.dtype == np.int64
    with open(path, "rb") as f:
        lines = [read_line(f.fileno(), offsets, k, len(data)) for k in range(4)]
    assert lines == [b'{"a":1}', b'{"b":2}\r', b'  {"c":3}', b'{"d":4}']
    assert [line_number(path, o) for o in offsets.tolist()] == [1, 4, 6, 7]


@pytest.mark.parametrize("chunk_bytes", [1, 2, 3, 5, 7, 64])
def test_index_is_the_same_for_any_chunk_size(tmp_path, chunk_bytes):
    data = b'\xef\xbb\xbf{"a":1}\n\n \n{"bb":2}\r\n \t\n {"c":3}\n\n{"d":4}\n   '
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    assert index_jsonl(path, chunk_bytes=chunk_bytes).tolist() == [3, 14, 27, 37]


def test_index_of_empty_and_blank_files_is_empty(tmp_path):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "blank.jsonl").write_bytes(b"\n \r\n\n")
    assert index_jsonl(tmp_path / "empty.jsonl").tolist() == []
    assert index_jsonl(tmp_path / "blank.jsonl").tolist() == []


# --------------------------------------------------------------------------------------------------------
# dataset
# --------------------------------------------------------------------------------------------------------


def test_item_has_what_verls_collate_and_trainer_need(tmp_path):
    path = write(tmp_path / "a.jsonl", [row(0), row(1, "workplace_assistant", prompt="plain string prompt")])
    dataset = NeMoGymJSONLDataset(data_files=str(path), tokenizer=None, processor=None, config=None)
    assert len(dataset) == 2
    first, second = dataset[0], dataset[1]
    assert torch.equal(first["dummy_tensor"], torch.tensor([0], dtype=torch.uint8))
    assert first["raw_prompt"] == [{"role": "user", "content": "q0"}]
    assert first["raw_prompt"] is first[ROW_KEY]["responses_create_params"]["input"]  # shared, not copied
    assert (first["data_source"], first["index"], first["extra_info"]) == ("math_with_judge", 0, {"index": 0})
    assert first[ROW_KEY] == row(0)
    assert second["raw_prompt"] == [{"role": "user", "content": "plain string prompt"}]
    assert second["data_source"] == "workplace_assistant"
    assert dataset.agent_names_seen == {"math_with_judge", "workplace_assistant"}


def test_verls_collate_and_dataproto_take_dataset_items(tmp_path):
    path = write(tmp_path / "a.jsonl", [row(i, agent=f"env{i % 2}") for i in range(4)])
    dataset = NeMoGymJSONLDataset(data_files=[str(path)], tokenizer=None, processor=None, config=None)
    batch = collate_fn([dataset[i] for i in range(4)])
    assert batch["dummy_tensor"].shape == (4, 1)
    assert batch["data_source"].tolist() == ["env0", "env1", "env0", "env1"]
    assert batch["index"].tolist() == [0, 1, 2, 3]
    assert batch[ROW_KEY][3] == row(3, agent="env1")
    proto = DataProto.from_single_dict(batch)
    assert len(proto) == 4 and proto.non_tensor_batch["raw_prompt"][2] == [{"role": "user", "content": "q2"}]
    # The trainer repeats prompts rollout.n times, interleaved.
    assert proto.repeat(2, interleave=True).non_tensor_batch["index"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_verl_loads_the_class_through_data_custom_cls(tmp_path):
    module = REPO_ROOT / "recipe" / "nemo_gym" / "dataset.py"
    config = OmegaConf.create({"custom_cls": {"path": str(module), "name": "NeMoGymJSONLDataset"}})
    cls = get_dataset_class(config)
    assert cls.__name__ == "NeMoGymJSONLDataset"
    path = write(tmp_path / "a.jsonl", [row(0)])
    assert cls(data_files=[str(path)], tokenizer=None, processor=None, config=config, max_samples=-1)[0]["index"] == 0


def test_in_a_job_verl_building_the_dataset_refuses_every_bad_row_of_train_and_val_files(tmp_path):
    """`main_ppo` builds the datasets before it starts a worker: with the recipe's overrides (the environments file
    named in `data.nemo_gym_config`) every row of both files is checked then, as verl builds the training dataset."""
    train = write(tmp_path / "train.jsonl", [row(0), "{cut short", row(2)])
    val = write(tmp_path / "val.jsonl", [row(3), {"agent_ref": {"name": "env1"}}])
    plugin = REPO_ROOT / "recipe" / "nemo_gym" / "configs" / "uppercase.yaml"
    dataset_keys = [o for o in plugin_overrides(plugin) if o.lstrip("+").startswith("data.")]
    cli = OmegaConf.from_dotlist([o.lstrip("+") for o in dataset_keys] + [f"data.train_files={train}"])
    data = OmegaConf.merge(cli.data, {"val_files": [str(val)]})
    with pytest.raises(DataFilesError) as raised:
        create_rl_dataset(data.train_files, data, None, None, is_train=True)
    assert str(raised.value).splitlines()[1:] == [
        f"  {train}:2: invalid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        f"  {val}:2: row has no 'responses_create_params' object",
    ]


def test_rows_from_several_files_are_concatenated_in_file_order(tmp_path):
    a = write(tmp_path / "a.jsonl", [row(0), row(1)])
    b = write(tmp_path / "b.jsonl", [row(10, "blackjack")])
    c = write(tmp_path / "c.jsonl", [row(20), row(21), row(22)])
    dataset = NeMoGymJSONLDataset(data_files=[str(a), str(b), str(c)], tokenizer=None, processor=None, config=None)
    assert len(dataset) == 6
    assert [dataset[i][ROW_KEY]["id"] for i in range(6)] == [0, 1, 10, 20, 21, 22]
    assert [dataset[i]["index"] for i in range(6)] == [0, 1, 2, 3, 4, 5]
    assert dataset[2]["data_source"] == "blackjack"
    assert dataset[-1][ROW_KEY]["id"] == 22
    assert dataset.locate(4) == (str(c), 2)
    with pytest.raises(IndexError, match="index 6 out of range for a dataset of 6 rows"):
        dataset[6]


def test_blank_lines_crlf_unicode_and_missing_final_newline(tmp_path):
    unicode_prompt = "Ünïcödé ✓ 数学 🧮 \u2028 line separator inside a string"
    lines = ["", row(0), "   ", row(1, prompt=unicode_prompt), "\t", row(2)]
    path = write(tmp_path / "crlf.jsonl", lines, newline="\r\n", trailing=False)
    dataset = NeMoGymJSONLDataset(data_files=str(path), tokenizer=None, processor=None, config=None)
    assert len(dataset) == 3
    assert dataset[1]["raw_prompt"] == [{"role": "user", "content": unicode_prompt}]
    assert [dataset[i][ROW_KEY]["id"] for i in range(3)] == [0, 1, 2]
    assert dataset.locate(2) == (str(path), 6)


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        ('{"responses_create_params": {"input": "x"}, "agent_ref": {"name": "a"', "invalid JSON"),
        ("[1, 2]", "row is a JSON list, not an object"),
        ('{"agent_ref": {"name": "a"}}', "no 'responses_create_params' object"),
        ('{"responses_create_params": {"input": []}, "agent_ref": {"name": "a"}}', "input is missing or empty"),
        ('{"responses_create_params": {"input": "x"}}', "no 'agent_ref.name'"),
        ('{"responses_create_params": {"input": "x"}, "agent_ref": {"name": ""}}', "no 'agent_ref.name'"),
    ],
)
def test_a_bad_row_raises_an_error_naming_file_and_line(tmp_path, bad_line, problem):
    path = write(tmp_path / "bad.jsonl", [row(0), "", bad_line, row(2)])
    dataset = NeMoGymJSONLDataset(data_files=str(path), tokenizer=None, processor=None, config=None)
    assert dataset[0]["index"] == 0 and dataset[2]["index"] == 2  # the good rows around it still read
    with pytest.raises(NeMoGymRowError, match=problem) as raised:
        dataset[1]
    assert str(raised.value).startswith(f"{path}:3: ")
    assert (raised.value.path, raised.value.line) == (str(path), 3)


def test_invalid_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(row(0)).encode() + b'\n{"responses_create_params": {"input": "caf\xe9"}}\n')
    dataset = NeMoGymJSONLDataset(data_files=str(path), tokenizer=None, processor=None, config=None)
    with pytest.raises(NeMoGymRowError, match=f"^{path}:2: "):
        dataset[1]


def test_row_without_agent_ref_is_an_error_unless_a_default_agent_is_configured(tmp_path):
    path = write(tmp_path / "a.jsonl", [{"responses_create_params": {"input": "x"}}, row(1, "blackjack")])
    with pytest.raises(NeMoGymRowError, match=r":1: row has no 'agent_ref.name'"):
        NeMoGymJSONLDataset(data_files=str(path), tokenizer=None, processor=None, config=None)[0]
    config = OmegaConf.create({"default_agent_name": "workplace_assistant_simple_agent"})
    dataset = NeMoGymJSONLDataset(data_files=str(path), tokenizer=None, processor=None, config=config)
    assert dataset[0]["data_source"] == "workplace_assistant_simple_agent"
    assert dataset[1]["data_source"] == "blackjack"  # a row's own agent wins


def test_nemo_gyms_example_rows_without_agent_ref_take_the_agent_whose_config_declares_their_file(tmp_path):
    """The shipped `configs/knowledge.yaml` and three of its servers' example files in `.venv-gym` as they ship: mcqa's,
    string_match's and polymath's rows name no agent, and each takes the one whose Gym config declares the file (the
    check before verl's workers agrees); a file no agent declares, in a blend of several, is refused by line."""
    from recipe.nemo_gym.gym.owned.gym_layout import nemo_gym_install_root

    servers = nemo_gym_install_root() / "resources_servers"
    agents = {
        "mcqa": "mcqa_simple_agent",
        "string_match": "string_match_simple_agent",
        "polymath": "polymath_simple_agent",
    }
    files = [str(servers / name / "data" / "example.jsonl") for name in agents]
    assert all("agent_ref" not in json.loads(Path(f).read_text().splitlines()[0]) for f in files)
    plugin = Path(__file__).resolve().parents[3] / "recipe" / "nemo_gym" / "configs" / "knowledge.yaml"
    config = OmegaConf.create({"train_files": files, "val_files": files[:1], "nemo_gym_config": str(plugin)})
    dataset = NeMoGymJSONLDataset(data_files=files, tokenizer=None, processor=None, config=config)
    assert [dataset[i]["data_source"] for i in range(0, 15, 5)] == list(agents.values())
    copied = write(tmp_path / "copy.jsonl", [json.loads(Path(files[0]).read_text().splitlines()[0])])
    config = OmegaConf.create({"train_files": [str(copied)], "nemo_gym_config": str(plugin)})
    with pytest.raises(DataFilesError, match=r"copy\.jsonl:1: row has no 'agent_ref\.name'"):
        NeMoGymJSONLDataset(data_files=[str(copied)], tokenizer=None, processor=None, config=config)


def test_validate_row_returns_the_agent_name():
    assert validate_row(row(0, "calendar")) == "calendar"


def test_nemo_gyms_shipped_example_data_reads(tmp_path):
    root = Path(importlib.util.find_spec("nemo_gym").origin).parents[1] / "resources_servers"  # the wheel's, not ours
    files = [
        root / "workplace_assistant" / "data" / "example.jsonl",
        root / "math_with_judge" / "data" / "example.jsonl",
    ]
    config = OmegaConf.create({"default_agent_name": "simple_agent"})
    dataset = NeMoGymJSONLDataset(data_files=[str(f) for f in files], tokenizer=None, processor=None, config=config)
    expected = sum(1 for f in files for line in f.read_text().splitlines() if line.strip())
    assert len(dataset) == expected
    items = [dataset[i] for i in range(len(dataset))]
    assert all(item["raw_prompt"] and item[ROW_KEY]["responses_create_params"]["input"] for item in items)
    assert items[0][ROW_KEY]["responses_create_params"]["tools"]  # workplace rows keep their tool list


def test_max_samples_keeps_the_first_rows_or_a_seeded_random_subset(tmp_path):
    path = write(tmp_path / "a.jsonl", [row(i) for i in range(20)])

    def ids(config, max_samples):
        dataset = NeMoGymJSONLDataset(
            data_files=str(path), tokenizer=None, processor=None, config=config, max_samples=max_samples
        )
        return [dataset[i][ROW_KEY]["id"] for i in range(len(dataset))]

    assert ids(None, 3) == [0, 1, 2]
    assert ids(None, -1) == list(range(20))
    assert ids(None, 50) == list(range(20))
    shuffled = OmegaConf.create({"shuffle": True, "seed": 7})
    expected = np.random.default_rng(7).choice(20, size=5, replace=False).tolist()
    assert ids(shuffled, 5) == expected
    unseeded = OmegaConf.create({"shuffle": True})
    assert ids(unseeded, 5) == ids(unseeded, 5) == np.random.default_rng(0).choice(20, 5, replace=False).tolist()


def test_pickles_without_file_handles_and_reads_in_dataloader_workers(tmp_path):
    path = write(tmp_path / "a.jsonl", [row(i) for i in range(8)])
    dataset = NeMoGymJSONLDataset(data_files=str(path), tokenizer=None, processor=None, config=None)
    dataset[0]  # opens a descriptor in this process
    assert dataset._fds
    clone = pickle.loads(pickle.dumps(dataset))
    assert clone._fds == {}
    assert [clone[i][ROW_KEY]["id"] for i in range(8)] == list(range(8))
    # fork is what verl's StatefulDataLoader gets on Linux; spawn pickles the dataset into each worker (its
    # collate is `list`, so that the workers need not import verl, which takes most of a minute here).
    forked = DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=collate_fn, multiprocessing_context="fork")
    assert [i for batch in forked for i in batch["index"].tolist()] == list(range(8))
    spawned = DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=list, multiprocessing_context="spawn")
    assert [item["index"] for batch in spawned for item in batch] == list(range(8))


def test_memory_does_not_grow_with_rows_read(tmp_path):
    # ~4 MB, 4,000 rows of ~1 KB: the dataset keeps 8 bytes per row, and reading rows keeps nothing.
    path = tmp_path / "big.jsonl"
    with path.open("w") as f:
        for i in range(4000):
            f.write(json.dumps(row(i, prompt="x" * 1000)) + "\n")
    assert path.stat().st_size > 4_000_000
    gc.collect()
    tracemalloc.start()
    dataset = NeMoGymJSONLDataset(data_files=str(path), tokenizer=None, processor=None, config=None)
    after_open, _ = tracemalloc.get_traced_memory()
    # A first round of reads may allocate once what any reader keeps (the file's buffer, interned keys); the second
    # round, of other rows, must add nothing: keeping the rows it read would add their ~290 KB.
    for i in range(0, 4000, 14):
        dataset[i]
    gc.collect()
    after_first_reads, _ = tracemalloc.get_traced_memory()
    for i in range(7, 4000, 14):
        dataset[i]
    gc.collect()
    after_reads, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert after_open < 200_000, after_open  # 32 KB of offsets plus bookkeeping, not 4 MB of rows
    assert after_first_reads - after_open < 100_000, after_first_reads - after_open
    assert after_reads - after_first_reads < 20_000, after_reads - after_first_reads


def test_missing_file_and_file_without_rows_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="NeMo Gym data file not found: .*nope.jsonl"):
        NeMoGymJSONLDataset(data_files=str(tmp_path / "nope.jsonl"), tokenizer=None, processor=None, config=None)
    (tmp_path / "blank.jsonl").write_text("\n\n")
    with pytest.raises(ConfigError, match="no rows in .*blank.jsonl"):
        NeMoGymJSONLDataset(data_files=str(tmp_path / "blank.jsonl"), tokenizer=None, processor=None, config=None)
