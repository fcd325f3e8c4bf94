# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures of the CPU tests, the `integration` tier, and `--shuffle SEED`.

Tiers: a test that starts a server, a subprocess stack, Ray, a trainer or Slurm is marked `integration`;
`pytest tests/cpu -m "not integration"` runs the rest, the unit tier (pure code, no servers).

`--shuffle SEED` runs the modules in a random order and, within each module, the tests in a random order (a
module's tests stay together, so its module-scoped fixtures are built once). The same seed gives the same order.
Without it, the modules that take minutes (`LONG_MODULES`) come first: `./run_tests.sh` runs the suite on two
pytest-xdist workers, one module at a time each (`--dist loadfile`, in collection order), and a long module
started last would leave one worker running it alone at the end.
Plain helpers (free ports, process scans, stub servers, rows) are in `recipe/nemo_gym_testing/helpers.py`.
"""

from __future__ import annotations

import random

import pytest

# Slowest first (minutes each on a 2-core machine: trainer runs, Slurm jobs, load tests, stacks of servers), so that
# the two workers, each taking the next module when it is free, end close together. Measured (2026-11-25, the 40
# slowest test phases of a passing `./run_tests.sh --durations=40`, summed by module): main_ppo 758 s, load 622,
# slurm 426, manager_exit 295, reliability 225, end_to_end 205, multiturn_http 137, server_patch 89, gym_runtime 89,
# template_matrix 61, cpu_policy_server 49, example_environment 38. The first two start together, one per worker.
# With NeMo Gym out of process (2026-11-26) gym_runtime took 120 s alone and more_environments is a stack like
# end_to_end's: both moved up. Attach mode (2026-11-26): attach 241 s, attach_training 152 s, run alone.
LONG_MODULES = (
    "test_load.py",
    "test_main_ppo.py",
    "test_slurm.py",
    "test_manager_exit.py",
    "test_reliability.py",
    "test_attach.py",
    "test_end_to_end.py",
    "test_attach_training.py",
    "test_gym_runtime.py",
    "test_more_environments.py",
    "test_multiturn_http.py",
    "test_server_patch.py",
    "test_template_matrix.py",
    "test_cpu_policy_server.py",
    "test_example_environment.py",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shuffle",
        metavar="SEED",
        type=int,
        default=None,
        help="run modules, and the tests within each module, in a random order drawn from SEED",
    )


def pytest_report_header(config: pytest.Config) -> str | None:
    seed = config.getoption("--shuffle")
    return None if seed is None else f"test order: shuffled with --shuffle {seed}"


@pytest.hookimpl(trylast=True)  # after -k / -m deselection: only the tests that run are reordered
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    groups = list(modules.values())
    seed = config.getoption("--shuffle")
    if seed is None:

        def rank(group: list[pytest.Item]) -> int:
            name = group[0].path.name
            return LONG_MODULES.index(name) if name in LONG_MODULES else len(LONG_MODULES)

        groups.sort(key=rank)  # stable: the other modules keep their order
    else:
        rng = random.Random(seed)
        rng.shuffle(groups)
        for group in groups:
            rng.shuffle(group)
    items[:] = [item for group in groups for item in group]


@pytest.fixture(scope="module")
def ray_address():
    """A new local Ray for the module (two CPUs, no dashboard, workers' logs not echoed); its GCS address.

    `address="local"`: never one found on this machine (a `ray start` cluster, another pytest worker's)."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def tokenizer():
    """The tiny Qwen3 model's tokenizer (the genuine Qwen3 tokenizer and chat template)."""
    from transformers import AutoTokenizer

    from recipe.nemo_gym_testing.cpu_policy.tiny_model import tiny_qwen3_dir

    return AutoTokenizer.from_pretrained(tiny_qwen3_dir())
