# SPDX-License-Identifier: Apache-2.0
"""`failure_cause`: the lines a user needs from a failed run's console output, whichever process raised.

The inputs are excerpts of real `main_ppo.log` files (the demo's time prefix, Ray's process tags and colour
codes included), shortened where marked; the expected causes are exact.
"""

from __future__ import annotations

import subprocess
import sys

from recipe.nemo_gym.launch.failure_cause import MAX_LINES, clean_line, failure_cause
from recipe.nemo_gym_demo.console import REPO_ROOT

# CI, 2026-11-26: Ray's memory monitor killed the rollout during step 2's weight sync (frames shortened).
RAY_OOM = """\
[  276.1s] Error executing job with overrides: ['trainer.use_v1=false', 'algorithm.adv_estimator=grpo']
[  276.2s] Traceback (most recent call last):
[  276.2s]   File "/x/verl/trainer/main_ppo.py", line 93, in run_ppo
[  276.2s]     ray.get(runner.run.remote(config))
[  276.2s] ray.exceptions.RayTaskError(OutOfMemoryError): \x1b[36mray::TaskRunner.run()\x1b[39m (pid=492, ip=192.0.2.2)
[  276.2s]   File "/x/verl/trainer/ppo/ray_trainer.py", line 1716, in fit
[  276.3s] ray.exceptions.RayTaskError(OutOfMemoryError): \x1b[36mray::WorkerDict.actor_rollout_update_weights()\x1b[39m
[  276.3s]     await self.server_handle.wake_up.remote(tags=tags)
[  276.3s] ray.exceptions.OutOfMemoryError: 3 worker(s) were killed due to the node running low on memory. Memory was 21.99GB used / 23.54GB limit (0.934213)
[  276.3s] OOM kill reason: Memory usage 24024141824B exceeded threshold of 24012687360B (95.0% of 25276514304B limit)
[  276.3s] Object store memory usage: [- objects spillable: 0
[  276.3s] - bytes spillable: 0
"""  # noqa: E501

# The manager's own error, raised in the TaskRunner actor and re-raised by Ray in the driver; the actor's copy of
# the traceback is also printed with Ray's process tag before it.
ROLLOUT_ABORTED = """\
[  110.2s] \x1b[36m(TaskRunner pid=7)\x1b[0m NeMo Gym rollout: 8/32 episodes done (0 failed), 15 s
[  112.9s] Traceback (most recent call last):
[  112.9s]   File "/x/verl/trainer/main_ppo.py", line 93, in run_ppo
[  112.9s] ray.exceptions.RayTaskError(RolloutAborted): ray::TaskRunner.run() (pid=7, ip=10.0.0.1)
[  112.9s]   File "/x/recipe/nemo_gym/gym/over_http/collect.py", line 190, in _health_or_abort
[  112.9s]     raise RolloutAborted(
[  112.9s] recipe.nemo_gym.failures.RolloutAborted: NeMo Gym server(s) ['uppercase_share'] died with 24 of 32 episodes pending:
[  112.9s] uppercase_share (pid 4242) exited with code 137; last lines of its log /out/nemo_gym_logs/uppercase_share.log:
[  112.9s]   INFO:     127.0.0.1:5 - "POST /verify HTTP/1.1" 200 OK
[  112.9s]
[  113.0s] Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.
"""  # noqa: E501


def test_the_innermost_exception_of_rays_wrapping_is_the_cause_and_its_report_stops_before_the_stats():
    cause = failure_cause(RAY_OOM)
    assert cause is not None
    assert cause.exception == "OutOfMemoryError"
    assert cause.lines == (
        "OutOfMemoryError: 3 worker(s) were killed due to the node running low on memory. Memory was 21.99GB used / "
        "23.54GB limit (0.934213)",
        "OOM kill reason: Memory usage 24024141824B exceeded threshold of 24012687360B (95.0% of 25276514304B limit)",
    )


def test_our_manager_error_is_the_cause_with_every_line_of_its_message():
    cause = failure_cause(ROLLOUT_ABORTED)
    assert cause is not None
    assert str(cause) == (
        "RolloutAborted: NeMo Gym server(s) ['uppercase_share'] died with 24 of 32 episodes pending:\n"
        "uppercase_share (pid 4242) exited with code 137; last lines of its log "
        "/out/nemo_gym_logs/uppercase_share.log:\n"
        '  INFO:     127.0.0.1:5 - "POST /verify HTTP/1.1" 200 OK'
    )


def test_the_last_traceback_wins_and_a_chained_error_is_the_one_raised_last():
    text = (
        "Traceback (most recent call last):\n"
        "ValueError: an earlier, handled failure\n"
        "Traceback (most recent call last):\n"
        '  File "a.py", line 1, in f\n'
        "KeyError: 'x'\n"
        "\n"
        "During handling of the above exception, another exception occurred:\n"
        "\n"
        '  File "a.py", line 3, in f\n'
        "recipe.nemo_gym.data_check.DataFilesError: 1 of 3 rows in t.jsonl cannot be trained on\n"
        "  t.jsonl:2: invalid JSON\n"
    )
    cause = failure_cause(text)
    assert cause is not None
    assert cause.lines == ("DataFilesError: 1 of 3 rows in t.jsonl cannot be trained on", "  t.jsonl:2: invalid JSON")


def test_no_traceback_means_no_cause_and_warnings_are_not_exceptions():
    text = (
        "/x/verl/workers/engine/__init__.py:32: UserWarning: torchtitan engine is not available: "
        "ModuleNotFoundError(\"No module named 'torchtitan'\")\n"
        "WARNING:2026-11-23 16:18:43,651:NeMo Gym rollout: 14/14 episodes done\n"
    )
    assert failure_cause(text) is None
    assert failure_cause("Traceback (most recent call last):\n  File 'a.py', line 1\n") is None


def test_a_long_message_is_cut_saying_how_many_lines_were_left_out():
    rows = [f"  t.jsonl:{i}: invalid JSON" for i in range(1, 31)]
    text = "Traceback (most recent call last):\nDataFilesError: 30 of 30 rows\n" + "\n".join(rows) + "\n"
    cause = failure_cause(text)
    assert cause is not None
    assert len(cause.lines) == MAX_LINES
    assert cause.lines[-2] == rows[MAX_LINES - 3]
    assert cause.lines[-1] == f"... ({31 - MAX_LINES + 1} more lines in the log)"


def test_prefixes_of_the_job_runner_and_ray_are_removed():
    assert clean_line("[  12.5s] \x1b[36m(WorkerDict pid=3456)\x1b[0m KeyError: 'x'\n") == "KeyError: 'x'"
    assert clean_line("(pid=7, ip=10.0.0.1) ValueError: y") == "ValueError: y"


def test_the_command_line_prints_the_cause_of_a_log_file(tmp_path):
    log = tmp_path / "main_ppo.log"
    log.write_text(ROLLOUT_ABORTED)
    out = subprocess.run(
        [sys.executable, "-m", "recipe.nemo_gym.launch.failure_cause", str(log)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.splitlines()[0].startswith("RolloutAborted: NeMo Gym server(s) ['uppercase_share'] died")
