# SPDX-License-Identifier: Apache-2.0
"""`recipe/nemo_gym/launch/job.py`: the job file as one validated object, its overrides, and errors that name the
file, the key and where a bad value came from."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipe.nemo_gym.launch.job import JobError, load_job
from tests.support.helpers import REPO_ROOT

MINIMAL = """\
model: models/tiny
checkpoint_dir: /ckpt
environments: envs/math.yaml
data:
  train_files: [data/train.jsonl]
  val_files: [/abs/val.jsonl]
"""


def _job_file(tmp_path: Path, text: str = MINIMAL, name: str = "my_job.yaml") -> Path:
    path = tmp_path / "jobs" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", ["math", "multienv"])
def test_the_repositorys_job_files_are_valid_and_name_existing_environments(name):
    job = load_job(REPO_ROOT / "jobs" / f"{name}.yaml", environ={})
    assert job.environments == REPO_ROOT / "recipe" / "nemo_gym" / "configs" / f"{name}.yaml"
    assert job.environments.is_file()
    assert (job.backend, job.training.strategy, job.experiment) == ("gpu", "fsdp", name)


def test_relative_paths_are_taken_from_the_job_files_folder_and_defaults_fill_the_rest(tmp_path):
    job = load_job(_job_file(tmp_path), environ={})
    assert job.model == tmp_path / "jobs" / "models" / "tiny"
    assert job.environments == tmp_path / "jobs" / "envs" / "math.yaml"
    assert job.data.train_files == [tmp_path / "jobs" / "data" / "train.jsonl"]
    assert job.data.val_files == [Path("/abs/val.jsonl")]
    assert job.checkpoint_dir == Path("/ckpt")
    assert (job.cluster.nnodes, job.cluster.gpus_per_node, job.training.lr, job.training.tool_call_parser) == (
        1,
        8,
        1e-6,
        "hermes",
    )
    assert job.experiment == "my_job" and job.logging.loggers is None


def test_the_environment_overrides_the_file_and_the_command_line_overrides_both(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    environ = {
        "JOB__TRAINING__LR": "3e-6",
        "JOB__CLUSTER__NNODES": "4",
        "JOB__DATA__TRAIN_FILES": "a.jsonl,b.jsonl",
        "JOB__TRAINING__TOOL_CALL_PARSER": "null",
        "OTHER": "ignored",
    }
    job = load_job(_job_file(tmp_path), ["cluster.nnodes=2", "backend=cpu", "model=here/model"], environ)
    assert job.training.lr == 3e-6 and job.cluster.nnodes == 2 and job.backend == "cpu"
    assert job.training.tool_call_parser is None
    # override paths are taken from the current directory, not the job file's
    assert job.data.train_files == [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    assert job.model == tmp_path / "here" / "model"


@pytest.mark.parametrize(
    ("text", "sets", "environ", "expected"),
    [
        (MINIMAL + "trainig: {lr: 1}\n", [], {}, "  trainig: unknown key"),
        (MINIMAL, ["training.lr=fast"], {}, "  training.lr: Input should be a valid number"),
        (MINIMAL, ["training.lr=-1"], {}, "  training.lr: Input should be greater than 0 (from --set training.lr)"),
        (MINIMAL, [], {"JOB__TRAINING__STRATEGI": "fsdp"}, "(from the environment's JOB__TRAINING__STRATEGI)"),
        (MINIMAL, ["training.strategy=deepspeed"], {}, "training.strategy: Input should be 'fsdp' or 'megatron'"),
        (MINIMAL.replace("model: models/tiny\n", ""), [], {}, "  model: Field required"),
        (MINIMAL, ["data.train_files=[]"], {}, "  data.train_files: List should have at least 1 item"),
        (MINIMAL, [], {"JOB__DATA__VAL_FILES": ""}, "not 0 (from the environment's JOB__DATA__VAL_FILES)"),
        (MINIMAL + "verl_overrides: [trainer.x]\n", [], {}, "'trainer.x' is not a Hydra override"),
    ],
    ids=[
        "unknown-key",
        "wrong-type",
        "out-of-range",
        "unknown-env-key",
        "choice",
        "missing",
        "empty-list",
        "empty-env-list",
        "hydra",
    ],
)
def test_an_invalid_job_is_refused_naming_the_file_and_key(tmp_path, text, sets, environ, expected):
    path = _job_file(tmp_path, text)
    with pytest.raises(JobError) as raised:
        load_job(path, sets, environ)
    message = str(raised.value)
    assert message.startswith(f"the job file {path} is not a valid job:"), message
    assert expected in message


@pytest.mark.parametrize(
    ("text", "sets", "expected"),
    [
        (None, [], "cannot read the job file {path}"),
        ("model: [unclosed\n", [], "the job file {path} is not valid YAML"),
        ("- a\n- b\n", [], "the job file {path} must hold a mapping"),
        (MINIMAL + "name: x\n", [], "{path}: name: unknown key"),
        (MINIMAL, ["lr"], "--set 'lr': expected key=value"),
        (MINIMAL, ["model.path=x"], "cannot set model.path: model is not a section"),
    ],
    ids=["absent", "yaml", "not-a-mapping", "name", "set-without-value", "set-into-a-value"],
)
def test_an_unreadable_job_file_or_override_is_refused_naming_it(tmp_path, text, sets, expected):
    path = tmp_path / "job.yaml" if text is None else _job_file(tmp_path, text)
    with pytest.raises(JobError) as raised:
        load_job(path, sets, {})
    assert expected.format(path=path) in str(raised.value)
