# SPDX-License-Identifier: Apache-2.0
"""`tests/support/each_module.py`: each module in a pytest session of its own, the heavy ones in a lane of their own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.each_module import _lanes
from tests.support.helpers import REPO_ROOT

LIGHT = ["tests/cpu/unit/gym/test_limits.py", "tests/cpu/unit/test_failures.py"]


def test_the_heavy_modules_and_the_shuffle_heavy_ones_get_a_lane_of_their_own():
    modules = [Path(p) for p in ("e2e/test_main_ppo.py", "integration/test_multiturn_http.py", "unit/test_limits.py")]
    assert _lanes(modules) == {"heavy": modules[:2], "other": modules[2:]}


def test_each_module_runs_in_a_session_of_its_own_and_the_summary_says_so(tmp_path):
    # Started with a temporary folder that holds its output, as when each_module runs this test from inside one of its
    # own lanes (`/tmp/o`): the lanes are folders of their own in it, emptied and removed, and nothing beside them is.
    out, beside = tmp_path / "out", tmp_path / "beside.txt"
    beside.write_text("kept")
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.each_module", str(out), *LIGHT],
        cwd=REPO_ROOT, env={**os.environ, "TMPDIR": str(tmp_path)}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "2 of 2 modules passed alone"
    lanes = sorted(
        line.split(" temporary folder ")[1] for line in done.stdout.splitlines() if " temporary folder " in line
    )
    assert lanes == [str(tmp_path / "h"), str(tmp_path / "o")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["beside.txt", "out"] and beside.read_text() == "kept"
    summary = (out / "summary.txt").read_text().splitlines()
    assert [line.split(" s ")[-1] for line in summary] == sorted(LIGHT)
    assert all(line.startswith("passed ") for line in summary)
    for module in LIGHT:  # one pytest session each: its own log, which names only its own tests
        log = (out / (module.replace("/", "_") + ".log")).read_text()
        assert " passed" in log and all(other not in log for other in LIGHT if other != module)
