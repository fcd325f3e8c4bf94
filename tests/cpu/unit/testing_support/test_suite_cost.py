# SPDX-License-Identifier: Apache-2.0
"""The suite's own cost report (`tests/support/suite_cost.py`): tiers, the slowest modules, peak memory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from tests.support.helpers import REPO_ROOT
from tests.support.suite_cost import (
    GIB,
    ModuleCost,
    RunCost,
    cpu_ticks,
    format_report,
    format_speeds,
    largest_processes,
    memory_in_use,
    report,
    running_tests,
    tier_of,
    track_modules,
)


def test_a_tests_tier_is_e2e_else_integration_else_unit_by_its_marks():
    assert tier_of(["test_x", "integration", "e2e", "cpu"]) == "e2e"
    assert tier_of(["test_x", "integration"]) == "integration"
    assert tier_of(["test_x", "parametrize"]) == "unit"


def test_memory_in_use_is_total_minus_available():
    meminfo = "MemTotal:       24000000 kB\nMemFree:  1000 kB\nMemAvailable:   20000000 kB\nCached: 5 kB\n"
    assert memory_in_use(meminfo) == 4_000_000 * 1024


def test_the_report_gives_each_run_each_tier_the_slowest_modules_and_the_peak():
    runs = [
        RunCost("gym-0.7", 600.0, [
            ModuleCost("tests/cpu/test_a.py", "unit", tests=10, seconds=30.0),
            ModuleCost("tests/cpu/test_b.py", "integration", tests=3, seconds=200.0),
            ModuleCost("tests/cpu/test_b.py", "unit", tests=2, seconds=1.0),
            ModuleCost("tests/cpu/e2e/test_main_ppo.py", "e2e", tests=2, seconds=400.0),
        ]),
        RunCost("gym-0.4", 120.0, [ModuleCost("tests/cpu/test_b.py", "integration", tests=3, seconds=110.0)]),
    ]  # fmt: skip
    memory = {"peak_bytes": 15 * GIB, "start_bytes": 1 * GIB, "total_bytes": 23.5 * GIB, "sample_s": 1.0}
    text = format_report(runs, memory, slowest=3)
    assert "run gym-0.7: 10.0 min wall, 17 tests" in text
    assert "run gym-0.4: 2.0 min wall, 3 tests" in text
    assert "total wall: 12.0 min" in text
    assert "  unit           2 modules   12 tests    0.5 min" in text
    assert "  integration    2 modules    6 tests    5.2 min" in text
    assert "  e2e            1 modules    2 tests    6.7 min" in text
    slowest = text.split("the 3 slowest modules:\n")[1].splitlines()[:3]
    assert slowest == [
        "    400.0 s  gym-0.7: tests/cpu/e2e/test_main_ppo.py",
        "    201.0 s  gym-0.7: tests/cpu/test_b.py",
        "    110.0 s  gym-0.4: tests/cpu/test_b.py",
    ]
    assert "peak memory in use: 15.0 GiB of 23.5 GiB (machine-wide, sampled every 1 s; 1.0 GiB at start)" in text
    assert "peak memory: not sampled" in format_report(runs, None)


def test_the_sampler_keeps_the_peak_until_sigterm_and_the_report_reads_the_folder(tmp_path):
    RunCost("gym-0.7", 60.0, [ModuleCost("tests/cpu/test_a.py", "unit", 1, 2.0)]).write(tmp_path)
    sampler = subprocess.Popen(
        [sys.executable, "-m", "tests.support.suite_cost", "sample", str(tmp_path)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "memory.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    sampler.send_signal(signal.SIGTERM)
    assert sampler.wait(timeout=30) == 0
    memory = json.loads((tmp_path / "memory.json").read_text())
    assert 0 < memory["start_bytes"] <= memory["peak_bytes"] < memory["total_bytes"]
    cpu = json.loads((tmp_path / "cpu.json").read_text())
    assert 0 <= cpu["busy_s"] <= cpu["all_s"] and cpu["cores"] == os.cpu_count()
    probe = [sys.executable, "-m", "tests.support.suite_cost", "probe", str(tmp_path), "after"]
    subprocess.run(probe, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, check=True)
    text = report(tmp_path)
    assert "run gym-0.7: 1.0 min wall, 1 tests" in text and "peak memory in use: " in text
    assert text.splitlines()[-1].startswith("the machine's speed: a fixed single-core Python workload took ")
    assert text.splitlines()[-1].endswith(" ms after the run (median of 7; lower is faster)")


def test_the_machines_speed_is_the_probes_median_at_each_moment_it_ran():
    speeds = {"before": [0.050, 0.040, 0.045], "after": [0.100, 0.090, 0.110, 0.095]}
    assert format_speeds(speeds) == (
        "the machine's speed: a fixed single-core Python workload took 45 ms before the run, 98 ms after the run "
        "(median of 3/4; lower is faster)"
    )
    assert format_report([], None, speeds=speeds).splitlines()[-1] == format_speeds(speeds)


def test_the_largest_processes_are_listed_largest_first_with_their_command_lines():
    every = largest_processes(count=10**6)
    assert any(line.split(":")[0].endswith(f"pid {os.getpid()}") and "pytest" in line for line in every), every[:5]
    sizes = [float(line.split(" GiB")[0]) for line in every]
    assert sizes == sorted(sizes, reverse=True) and len(largest_processes(count=3)) == 3


def test_the_tests_running_at_the_peak_are_read_from_the_xdist_workers_titles_and_reported_with_the_minute():
    titles = [
        "/work/.venv/bin/python -m pytest tests/cpu -n 2",
        "[pytest-xdist running] tests/cpu/e2e/test_slurm.py::test_job ",
        "[pytest-xdist running] tests/cpu/integration/test_gym_runtime.py::test_health",
        "ray::vLLMHttpServer",
    ]
    running = running_tests(titles)
    assert running == [
        "tests/cpu/e2e/test_slurm.py::test_job",
        "tests/cpu/integration/test_gym_runtime.py::test_health",
    ]
    memory = {
        "peak_bytes": 15 * GIB, "start_bytes": 1 * GIB, "total_bytes": 23.5 * GIB, "sample_s": 1.0,
        "started_at": 1000.0, "peak_at": 1000.0 + 90 * 60, "running": running,
        "largest_processes": ["9.00 GiB pid 7: x"],
    }  # fmt: skip
    lines = format_report([], memory).splitlines()
    at = lines.index("  at minute 90.0 of the run, while running:")
    assert lines[at + 1 : at + 5] == [
        "    tests/cpu/e2e/test_slurm.py::test_job",
        "    tests/cpu/integration/test_gym_runtime.py::test_health",
        "  the largest processes then:",
        "  9.00 GiB pid 7: x",
    ]


def test_each_modules_span_and_the_peak_memory_while_it_ran_are_tracked_and_reported_in_start_order():
    spans: dict = {}
    track_modules(
        spans, ["tests/cpu/e2e/test_a.py::test_x", "tests/cpu/integration/test_b.py::test_y"], 1060.0, 5 * GIB
    )
    track_modules(spans, ["tests/cpu/e2e/test_a.py::test_z"], 1120.0, 9 * GIB)
    track_modules(spans, ["tests/cpu/e2e/test_a.py::test_z", "tests/cpu/unit/test_c.py::test_q"], 1240.0, 7 * GIB)
    assert spans == {
        "tests/cpu/e2e/test_a.py": {"first": 1060.0, "last": 1240.0, "peak_bytes": 9 * GIB},
        "tests/cpu/integration/test_b.py": {"first": 1060.0, "last": 1060.0, "peak_bytes": 5 * GIB},
        "tests/cpu/unit/test_c.py": {"first": 1240.0, "last": 1240.0, "peak_bytes": 7 * GIB},
    }
    track_modules(spans, ["tests/cpu/integration/test_b.py::test_y"], 1100.0, 4 * GIB)
    memory = {"peak_bytes": 9 * GIB, "start_bytes": 1 * GIB, "total_bytes": 23.5 * GIB, "sample_s": 1.0,
              "started_at": 1000.0, "peak_at": 1120.0}  # fmt: skip
    lines = format_report([], memory, spans=spans).splitlines()
    at = lines.index("when the modules of 30 s or more ran, the peak memory in use meanwhile:")
    assert lines[at + 1 :] == [  # the one-sample module (test_c) is left out
        "    1.0 to   4.0 min    9.0 GiB  tests/cpu/e2e/test_a.py",
        "    1.0 to   1.7 min    5.0 GiB  tests/cpu/integration/test_b.py",
    ]


def test_the_machines_cpu_time_is_read_busy_and_in_all_from_proc_stat():
    stat = "cpu  400 100 200 1000 300 0 100 0 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"
    assert cpu_ticks(stat) == (800, 2100)  # user + nice + system + softirq busy; idle and iowait not


def test_each_modules_share_of_busy_cpu_time_and_the_runs_are_reported():
    spans: dict = {}
    track_modules(spans, ["tests/cpu/e2e/test_a.py::test_x", "tests/cpu/unit/test_b.py::t"], 1000.0, GIB, (1.5, 2.0))
    track_modules(spans, ["tests/cpu/e2e/test_a.py::test_x"], 1060.0, GIB, (0.5, 2.0))
    assert spans["tests/cpu/e2e/test_a.py"] == {
        "first": 1000.0, "last": 1060.0, "peak_bytes": GIB, "cpu_busy_s": 2.0, "cpu_all_s": 4.0,
    }  # fmt: skip
    assert (spans["tests/cpu/unit/test_b.py"]["cpu_busy_s"], spans["tests/cpu/unit/test_b.py"]["cpu_all_s"]) == (1.5, 2)
    memory = {"peak_bytes": GIB, "start_bytes": GIB, "total_bytes": 23.5 * GIB, "sample_s": 1.0,
              "started_at": 1000.0, "peak_at": 1000.0}  # fmt: skip
    lines = format_report([], memory, spans=spans, cpu={"busy_s": 90.0, "all_s": 100.0, "cores": 2}).splitlines()
    assert (
        "the machine's CPU: busy 90% of the run's CPU time (2 cores; not idle or waiting on I/O, machine-wide)" in lines
    )
    at = lines.index(
        "when the modules of 30 s or more ran, the peak memory in use meanwhile, and the share of CPU time busy:"
    )
    assert lines[at + 1 :] == ["    0.0 to   1.0 min    1.0 GiB   50% CPU  tests/cpu/e2e/test_a.py"]
