# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures of the CPU tests, the `integration` tier, and `--shuffle SEED`.

Tiers: a test that starts a server, a subprocess stack, Ray, a trainer or Slurm is marked `integration`;
`pytest tests/cpu -m "not integration"` runs the rest, the unit tier (pure code, no servers).

`--shuffle SEED` runs the modules in a random order and, within each module, the tests in a random order (a
module's tests stay together, so its module-scoped fixtures are built once). The same seed gives the same order.
Plain helpers (free ports, process scans, stub servers, rows) are in `recipe/nemo_gym_testing/helpers.py`.
"""

from __future__ import annotations

import random

import pytest


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


@pytest.hookimpl(trylast=True)  # after -k / -m deselection: only the tests that run are shuffled
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seed = config.getoption("--shuffle")
    if seed is None:
        return
    rng = random.Random(seed)
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    groups = list(modules.values())
    rng.shuffle(groups)
    for group in groups:
        rng.shuffle(group)
    items[:] = [item for group in groups for item in group]


@pytest.fixture(scope="module")
def ray_address():
    """A local Ray for the module (two CPUs, no dashboard, workers' logs not echoed); its GCS address."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
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
