# SPDX-License-Identifier: Apache-2.0
"""A process that behaves, for the launcher, like verl's `main_ppo`: for testing the launcher's own semantics.

What the launcher (`recipe/nemo_gym/launch/`, under the demo's console) does with a trainer is independent of what
the trainer computes: it forwards SIGINT and SIGTERM, kills the process group after a grace period, waits for the
whole group, removes the run's temporary folder and reports the exit status and the last lines. Testing that against
a full `main_ppo` costs minutes a test; this stand-in costs a second. Run as `JobSpec(trainer_module=<this module>)`
(the launcher's `NG_TRAINER_MODULE`), it:

- takes the same command line as `main_ppo` (Hydra overrides, ignored);
- starts a child in its own process group, as Ray's workers are (the launcher must wait for it; like a Ray worker,
  it ends once the trainer has);
- writes a file into its `TMPDIR` (the launcher removes the folder) and prints where, then prints the line the NeMo
  Gym manager prints when training is next (`NeMo Gym <version> ready in <n> s: agents [...]`);
- waits until signalled. On SIGINT it stops as verl's driver does, by Python's KeyboardInterrupt (a traceback in its
  output, exit status 1) after stopping its child; SIGKILL kills it outright;
- or, once the file named by `$NG_STAND_IN_FINISH_FILE` exists, logs one step as verl's `file` logger does
  (`$VERL_FILE_LOGGER_PATH`, one JSON line) and exits 0 as a finished training run does;
- once the file named by `$NG_STAND_IN_STEP_FILE` exists, logs that step and goes on waiting, printing nothing (a
  trainer between a step's metrics and its next line: verl's next batch).

The faults of the plugin itself (a Gym server or the policy server killed, bad rows) are still injected into a real
`main_ppo` (tests/cpu/e2e/test_job_failures.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

FINISH_FILE_ENV = "NG_STAND_IN_FINISH_FILE"
STEP_FILE_ENV = "NG_STAND_IN_STEP_FILE"
STEP_METRICS = {
    "timing_s/nemo_gym/stand_in_simple_agent/episodes": 2.0,
    "timing_s/nemo_gym/stand_in_simple_agent/reward/mean": 1.0,
}

# Like a Ray worker whose driver is gone: it ends once its parent has (it is then reparented), within a second.
_CHILD = "import os, time\nparent = os.getppid()\nwhile os.getppid() == parent:\n    time.sleep(0.2)\n"


def main() -> None:
    child = subprocess.Popen([sys.executable, "-c", _CHILD])
    with open(os.path.join(tempfile.gettempdir(), "stand_in_trainer.txt"), "w") as f:
        f.write("a file of the run's own\n")
    print(f"stand-in trainer: TMPDIR {tempfile.gettempdir()}", flush=True)
    print("NeMo Gym 0.7.0 ready in 1 s: agents ['stand_in_simple_agent']; policy stand-in", flush=True)
    finish, step = os.environ.get(FINISH_FILE_ENV), os.environ.get(STEP_FILE_ENV)
    logged = False
    try:
        while not (finish and os.path.exists(finish)):
            if step and not logged and os.path.exists(step):
                _log_step()
                logged = True
            time.sleep(0.1)
        if not logged:
            _log_step()
    finally:
        child.terminate()
        child.wait()


def _log_step() -> None:
    with open(os.environ["VERL_FILE_LOGGER_PATH"], "a") as f:
        f.write(json.dumps({"step": 1, "data": STEP_METRICS}) + "\n")


if __name__ == "__main__":
    main()
