# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures of the CPU tests, the tiers, and `--shuffle SEED`.

Tiers, one folder each: `unit/` (pure code, no servers; laid out as `recipe/nemo_gym/` is), `integration/` (a
test starts a server, a subprocess stack, Ray or vLLM) and `e2e/` (it runs a training job: verl's `main_ppo`, a
submit script, the launcher). Each module of `integration/` and `e2e/` is marked `integration`; the tests of
`e2e/` are marked `e2e` too, here (`pytest_itemcollected`). So `-m "not integration"` selects the unit tier,
`-m "integration and not e2e"` the integration tier, `-m e2e` the end-to-end tier, as the folders do.

`--shuffle SEED` runs the modules in a random order and, within each module, the tests in a random order (a
module's tests stay together, so its module-scoped fixtures are built once). The same seed gives the same order.

Scheduling (`./run_tests.sh`: two pytest-xdist workers, `--dist loadfile`): every module is one work unit, except
the `HEAVY_MODULES`, which together are one unit (`pytest_xdist_make_scheduler` below), so one worker runs them
one after another while the other runs the rest. Each of them starts verl's trainer or vLLM server beside NeMo
Gym's servers (8-12 GB); two at once passed Ray's memory limit on a 24 GB machine (CI, 2026-11-26:
`OutOfMemoryError ... 21.99GB used / 23.54GB`, workers killed during step 2's weight sync of `test_main_ppo` while
`test_load` ran). Without `--shuffle` the heavy unit comes first; the other worker runs the modules without
servers first and the ones that start servers last (`SERVER_MODULES`), away from `test_main_ppo`. Under
`--shuffle` the heavy unit also takes `HEAVY_WHEN_SHUFFLED` (a module with a vLLM engine of its own).

Leftovers: the session gives every process it starts a temporary folder of its own (`TMPDIR`: a `ngs-*` folder
in the system's), so what test fixtures' servers leave there (vLLM's sockets, Ray's sessions) goes with it at the
end. At the end it fails if any training run left its temporary folder (`ngjob-*`, which the launcher removes
when a run ends), or if anything new is left in the system's temporary folder or in /dev/shm (nothing of the
runs may be; `recipe/nemo_gym/launch/leftovers.py` removes what vLLM and verl leave in /dev/shm). pytest's own folders
(`pytest-of-<user>`) stay where pytest puts them.

Plain helpers (free ports, process scans, stub servers, rows) are in `tests/support/helpers.py`.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import pytest

# The modules that start verl's trainer or vLLM server (see the docstring): one worker runs them in this order, and
# their sum is the suite's wall time (the other worker ends about 18 minutes earlier; docs/testing.md gives the
# figures). Trainers first, while the other worker runs its pure modules. Then the modules that share one verl vLLM
# server (the `shared_engine` fixture, about two minutes to start), together, so that the engine lives only while
# they run. The manager's lifetime tests, whose policy server only has to answer, are not here: they run on the
# other worker over the test support's PolicyStub.
HEAVY_MODULES = (
    "test_main_ppo.py",
    "test_slurm_training.py",
    # Two trainer ranks and two vLLM engines on a three-node Slurm cluster of network namespaces.
    "test_two_nodes.py",
    # The shared engine's modules: stacks of NeMo Gym beside verl's vLLM server, which beside a trainer pass Ray's
    # memory limit (a real Slurm job was OOM-killed at 95.0% beside test_more_environments and test_end_to_end).
    "test_end_to_end.py",
    "test_end_to_end_gym_0_4.py",
    "test_more_environments.py",
    "test_load.py",
    "test_attach.py",
    # NeMo Gym's catalogue: six stacks of about ten environments (test_catalogue), and one judged through a judge URL
    # (test_judges).
    # Last, so that their stacks, the suite's biggest, run once the other worker has ended or nearly.
    "test_catalogue.py",
    "test_judges.py",
    # A trainer on three of the catalogue's servers and a judge: last, with the engine stopped and the other worker
    # ended, where it runs beside nothing.
    "test_main_ppo_catalogue.py",
)
# Also heavy under `--shuffle`: a module of the other worker that starts a vLLM engine of its own (4.3 GB). In file
# order it runs beside the heavy worker's lighter modules; in a random order it could run beside another engine and
# a trainer (two engines at once reached 21.9 GiB), so a shuffle runs it on the heavy worker.
HEAVY_WHEN_SHUFFLED = ("test_multiturn_http.py",)
HEAVY_GROUP = "heavy"
# The folder of the modules that run a training job (verl's main_ppo, a submit script, the launcher): their
# integration tests are marked `e2e` too (`pytest_itemcollected`), the tier `-m e2e` selects.
E2E_FOLDER = "e2e"
# The other modules that start servers (NeMo Gym stacks, our CPU policy server, a Slurm cluster, a stand-in
# trainer's job): last on the other worker, the ones with the most processes last, and the two that start jobs
# after the heavy worker's first trainer.
SERVER_MODULES = (
    "test_example_environment.py",
    "test_cpu_policy_server.py",
    "test_template_matrix.py",
    "test_server_patch.py",
    "test_multiturn_http.py",
    "test_gym_runtime.py",
    "test_reliability.py",
    "test_manager_lifetime.py",
    "test_slurm.py",
    "test_job_failures.py",
    "test_manager_exit.py",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shuffle",
        metavar="SEED",
        type=int,
        default=None,
        help="run modules, and the tests within each module, in a random order drawn from SEED",
    )


_SYSTEM_TEMP = pytest.StashKey[Path]()
_COST = pytest.StashKey[dict]()
_SUITE_TEMP = pytest.StashKey[Path]()
_BEFORE = pytest.StashKey[set[str]]()
SHM = Path("/dev/shm")
SHARED_SHM_ENV = "NG_SUITE_SHM_SHARED"
"""Set (to 1) where other test sessions run beside this one (`tests/support/each_module.py`'s two lanes): /dev/shm is
one per machine, so the session checks only its own temporary folder for leftovers."""


def _entries(system_temp: Path) -> set[str]:
    found = {str(p) for p in system_temp.iterdir()}
    if os.environ.get(SHARED_SHM_ENV) == "1" or not SHM.is_dir():
        return found
    return found | {str(p) for p in SHM.iterdir()}


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller set this up and checks at the end
        return
    _CONFIG[:] = [config]
    system_temp = Path(tempfile.gettempdir())
    # pytest's own folders stay in the system's temporary folder (they outlive the session on purpose).
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", str(system_temp))
    config.stash[_COST] = {"started": time.monotonic(), "modules": {}}
    config.stash[_BEFORE] = _entries(system_temp)
    config.stash[_SYSTEM_TEMP] = system_temp
    # Short: a training run's folder under it holds Ray's sockets (`recipe/nemo_gym/launch/cluster.py`: 17 bytes).
    suite_temp = Path(tempfile.mkdtemp(prefix="ngs-", dir=system_temp))
    config.stash[_SUITE_TEMP] = suite_temp
    os.environ["TMPDIR"] = str(suite_temp)  # inherited by the workers and everything they start
    tempfile.tempdir = None  # this process's tempfile reads TMPDIR again
    # Ray's memory monitor kills workers at 95% of the machine's memory by default. With a trainer on one worker and a
    # NeMo Gym stack on the other, a 24 GB machine peaked at 95.0% (a weight sync's transient copy) with ~1.2 GB
    # still free: the suite's Ray instances (the trainers', the fixtures', the submit scripts') kill at 98% instead.
    os.environ.setdefault("RAY_memory_usage_threshold", "0.98")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each test phase's duration, summed per module (in the controller: xdist hands it every worker's reports)."""
    from tests.support.suite_cost import ModuleCost, tier_of

    cost = _controller_cost()
    if cost is None:
        return
    module = report.nodeid.split("::", 1)[0]
    tier = tier_of(report.keywords)
    entry = cost["modules"].setdefault((module, tier), ModuleCost(module, tier))
    entry.seconds += report.duration
    entry.tests += report.when == "call" or (report.when == "setup" and report.skipped)


_CONFIG: list[pytest.Config] = []


def _controller_cost() -> dict | None:
    config = _CONFIG[0] if _CONFIG else None
    return None if config is None or _COST not in config.stash else config.stash[_COST]


def _write_cost(config: pytest.Config) -> None:
    """The run's cost into `$NG_SUITE_COST_DIR/<label>.json`, which `./run_tests.sh` reports at its end."""
    from tests.support.suite_cost import RunCost

    folder = os.environ.get("NG_SUITE_COST_DIR")
    if not folder:
        return
    cost = config.stash[_COST]
    label = os.environ.get("NG_SUITE_COST_LABEL", "pytest")
    RunCost(label, time.monotonic() - cost["started"], list(cost["modules"].values())).write(Path(folder))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _SHARED_ENGINE:  # in each pytest process (an xdist worker or a run without workers) that started one
        _SHARED_ENGINE.pop().stop()
    config = session.config
    if hasattr(config, "workerinput") or _SUITE_TEMP not in config.stash:
        return
    _write_cost(config)
    system_temp, suite_temp = config.stash[_SYSTEM_TEMP], config.stash[_SUITE_TEMP]
    runs_left = sorted(str(p) for p in suite_temp.glob("ngjob-*"))
    shutil.rmtree(suite_temp, ignore_errors=True)
    new = sorted(_entries(system_temp) - config.stash[_BEFORE] - {str(suite_temp)})
    new = [p for p in new if not Path(p).name.startswith("pytest-of-")]
    if runs_left or new:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        lines = [f"a training run left its temporary folder: {p}" for p in runs_left]
        lines += [f"left by the suite: {p}" for p in new]
        if reporter is not None:
            reporter.write_sep("=", "leftovers in the temporary folder or /dev/shm", red=True)
            for line in lines:
                reporter.write_line(line)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def heavy_modules(config: pytest.Config) -> tuple[str, ...]:
    """The modules one worker runs one after another: `HEAVY_MODULES`, and `HEAVY_WHEN_SHUFFLED` under `--shuffle`."""
    return HEAVY_MODULES + (HEAVY_WHEN_SHUFFLED if config.getoption("--shuffle") is not None else ())


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadfile`, with all the heavy modules in one work unit (so on one worker, in collection order).

    pytest-xdist's `--dist loadgroup` would do this from `xdist_group` marks, but with pytest-xdist 3.8 here its
    workers ignored the marks (tests of one group ran on both workers), so the unit is made here instead, by
    overriding the scope function of xdist's own file scheduler the way its `LoadFileScheduling` does (checked
    against pytest-xdist 3.8.0)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    heavy = heavy_modules(config)

    class HeavyLaneScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return HEAVY_GROUP if Path(module).name in heavy else module

    return HeavyLaneScheduling(config, log)


def pytest_report_header(config: pytest.Config) -> str | None:
    seed = config.getoption("--shuffle")
    return None if seed is None else f"test order: shuffled with --shuffle {seed}"


def pytest_itemcollected(item: pytest.Item) -> None:
    """The e2e mark (before `-m` selects)."""
    if item.path.parent.name == E2E_FOLDER and item.get_closest_marker("integration") is not None:
        item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(trylast=True)  # after -k / -m deselection: only the tests that run are reordered
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The heavy modules first, then the modules without servers, then `SERVER_MODULES`; or a `--shuffle SEED`
    order."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(str(item.path), []).append(item)
    groups = list(modules.values())
    seed = config.getoption("--shuffle")
    if seed is None:

        def rank(group: list[pytest.Item]) -> int:
            name = group[0].path.name
            if name in HEAVY_MODULES:
                return HEAVY_MODULES.index(name)
            if name in SERVER_MODULES:
                return 200 + SERVER_MODULES.index(name)
            return 100  # the rest, in collection order, first on the other worker

        groups.sort(key=rank)  # stable: the other modules keep their order
    else:
        rng = random.Random(seed)
        rng.shuffle(groups)
        for group in groups:
            rng.shuffle(group)
    items[:] = [item for group in groups for item in group]


@pytest.fixture(scope="module", autouse=True)
def _release_memory_after_module():
    """After each module, `helpers.release_cached_memory`: vLLM's and transformers' memoized objects dropped, the
    memory returned to the operating system. After `test_template_matrix` and `test_server_patch` (vLLM's chat render
    for a dozen tokenizers, in process) a worker held 6.4 GiB beside the other worker's trainers; with every
    `lru_cache` cleared, 1.5 GiB (measured by hand)."""
    yield
    from tests.support.helpers import release_cached_memory

    release_cached_memory()


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
def policy_stub_address():
    """The "host:port" of a `PolicyStub` for the module (`tests/support/gym_runtime.py`): a policy server that
    answers each math row with the number its prompt names, for tests of the manager's Gym rather than its tokens."""
    from tests.support.gym_runtime import PolicyStub

    stub = PolicyStub()
    try:
        yield stub.address
    finally:
        stub.close()


_SHARED_ENGINE: list = []  # this pytest process's `SharedEngine`, once a module has asked for it


@pytest.fixture(scope="module")
def shared_engine(tmp_path_factory):
    """verl's vLLM rollout (standalone, vLLM's CPU build, splice patch armed) shared by the modules that only send it
    requests: each request names its scripted policy (`tests/support/engine/shared_engine.py`). It runs in a process
    of its own with its own Ray, started on first use. It stays up while the next modules of this pytest process use it
    too, is stopped before a heavy module that does not (`_no_idle_engine_beside_a_heavy_module`), and at the end
    of the session. A module that kills or reconfigures its engine starts its own. Returns an `EngineInfo`."""
    from tests.support.engine.shared_engine import SharedEngine

    if not _SHARED_ENGINE:
        _SHARED_ENGINE.append(SharedEngine(tmp_path_factory.mktemp("shared-engine")))
    return _SHARED_ENGINE[0].info()


@pytest.fixture(scope="module", autouse=True)
def _no_idle_engine_beside_a_heavy_module(request):
    """Stop the shared engine (4.3 GB) before a heavy module that does not use it: in file order the modules that
    use it run last and together, but in a `--shuffle` order a trainer would otherwise run beside an idle engine."""
    module = request.node.path
    if _SHARED_ENGINE and module.name in heavy_modules(request.config):
        items = [item for item in request.session.items if item.path == module]
        if not any("shared_engine" in item.fixturenames for item in items):
            _SHARED_ENGINE[0].stop()
    yield


@pytest.fixture
def plugin_caplog(caplog):
    """pytest's `caplog` for the plugin's loggers. Once a manager is built they write to stderr themselves and stop
    propagating to the root logger (`agent_loop.configure_plugin_logging`), where `caplog` listens; for the test
    they propagate again. Its level and that of caplog's handler are set as well: vLLM's API server import sets
    the root logger's handlers to ERROR (see `configure_plugin_logging`), pytest's capture handlers included,
    which live for the whole session; after a module that imports it, WARNING records were dropped."""
    import logging

    from recipe.nemo_gym.agent_loop import PLUGIN_LOGGER

    plugin = logging.getLogger(PLUGIN_LOGGER)
    saved = plugin.propagate
    plugin.propagate = True
    caplog.set_level(logging.INFO, logger=PLUGIN_LOGGER)  # caplog restores the level after the test
    try:
        yield caplog
    finally:
        plugin.propagate = saved


@pytest.fixture(scope="module")
def tokenizer():
    """The tiny Qwen3 model's tokenizer (the genuine Qwen3 tokenizer and chat template)."""
    from transformers import AutoTokenizer

    from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir

    return AutoTokenizer.from_pretrained(tiny_qwen3_dir())
