# SPDX-License-Identifier: Apache-2.0
"""Each test module of `tests/cpu` in a pytest session of its own: that no module's result depends on another's.

    .venv/bin/python -m tests.support.each_module OUT_DIR [MODULE ...]

Two lanes run side by side, as the suite's two workers do: the heavy modules (`tests/cpu/conftest.py`'s
`HEAVY_MODULES` and `HEAVY_WHEN_SHUFFLED`) one after another in one, the rest one after another in the other. So
each module runs alone in its session, with nothing shared: the shared engine is started for each module that uses
it. Each lane has its own temporary folder, `h` and `o` in the one this module was started with (`/tmp/h`,
`/tmp/o`), so the session-end leftover check of one lane never sees the other's files, and a run started from inside a
lane (this module's own test, run by this module) empties folders of its own, not its caller's. A training run's own
folder goes in `/tmp` there (its Ray's socket paths would not fit under `<lane>/ngs-*`:
`recipe/nemo_gym/launch/cluster.py`), where neither lane's check looks. /dev/shm is one per machine, so those checks
leave it out (`NG_SUITE_SHM_SHARED=1`); the full suite, one session, checks it. Writes one log per
module and `summary.txt` under OUT_DIR; exits 1 if any module failed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.cpu.conftest import HEAVY_MODULES, HEAVY_WHEN_SHUFFLED, SHARED_SHM_ENV
from tests.support.helpers import REPO_ROOT, TESTS_CPU


def _lanes(modules: list[Path]) -> dict[str, list[Path]]:
    heavy = set(HEAVY_MODULES) | set(HEAVY_WHEN_SHUFFLED)
    return {
        "heavy": [m for m in modules if m.name in heavy],
        "other": [m for m in modules if m.name not in heavy],
    }


_SAY = threading.Lock()


def _say(line: str) -> None:
    """One whole line on stdout: the two lanes' threads print at the same moments (both lanes' first lines at once), and
    `print` writes the text and its newline apart, so two lines unguarded can interleave."""
    with _SAY:
        print(line, flush=True)


def _run_lane(name: str, modules: list[Path], out: Path, results: list[str]) -> None:
    temp = Path(tempfile.gettempdir()) / name[0]
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir(parents=True)
    _say(f"[{name}] temporary folder {temp}")
    env = {**os.environ, "TMPDIR": str(temp), SHARED_SHM_ENV: "1"}
    for module in modules:
        relative = module.relative_to(REPO_ROOT)
        log = out / (str(relative).replace("/", "_") + ".log")
        start = time.monotonic()
        with log.open("wb") as stream:
            status = subprocess.call(
                [sys.executable, "-m", "pytest", str(relative), "-q", "-p", "no:cacheprovider", "--durations=8"],
                cwd=REPO_ROOT, env=env, stdout=stream, stderr=subprocess.STDOUT,
            )  # fmt: skip
        line = f"{'passed' if status == 0 else f'FAILED (exit {status})'} {time.monotonic() - start:.0f} s {relative}"
        results.append(line)
        _say(f"[{name}] {line}")
    shutil.rmtree(temp, ignore_errors=True)


def main(argv: list[str]) -> int:
    out = Path(argv[0]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    chosen = [(REPO_ROOT / m).resolve() for m in argv[1:]] or sorted(TESTS_CPU.rglob("test_*.py"))
    results: list[str] = []
    threads = [
        threading.Thread(target=_run_lane, args=(name, modules, out, results))
        for name, modules in _lanes(chosen).items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    (out / "summary.txt").write_text("\n".join(sorted(results, key=lambda r: r.split()[-1])) + "\n")
    failed = [r for r in results if not r.startswith("passed")]
    print(f"{len(results) - len(failed)} of {len(results)} modules passed alone" + "".join(f"\n{r}" for r in failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
