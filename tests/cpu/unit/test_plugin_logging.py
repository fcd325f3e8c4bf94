# SPDX-License-Identifier: Apache-2.0
"""The plugin's log lines reach the trainer's output although importing vLLM's API server silences the root logger.

vLLM 0.24's API server imports `model_hosting_container_standards` (its SageMaker routes), whose import sets the root
logger and its handlers to ERROR unless `SAGEMAKER_CONTAINER_LOG_LEVEL` or `LOG_LEVEL` says otherwise. verl's
TaskRunner, where the manager runs, imports it, so WARNING records of any logger that relies on the root logger are
dropped there. `configure_plugin_logging` gives the plugin's loggers a handler of their own. Each case runs in a
fresh interpreter: the import changes process-wide logging state.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from recipe.nemo_gym_demo.console import REPO_ROOT

pytestmark = pytest.mark.timeout(300)

# What verl's TaskRunner does, in order: import verl (logging.basicConfig at WARNING), import vLLM's API server.
SCRIPT = """
import logging
import verl
import vllm.entrypoints.openai.api_server
print("root level", logging.getLogger().level, flush=True)
logging.getLogger("a_user_module").warning("USER WARNING")
from recipe.nemo_gym.agent_loop import configure_plugin_logging
configure_plugin_logging()
logging.getLogger("recipe.nemo_gym.agent_loop").warning("PLUGIN WARNING")
"""


def _run(**env_vars: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LOG_LEVEL", "SAGEMAKER_CONTAINER_LOG_LEVEL")}
    env.update(env_vars)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_plugin_warnings_print_after_vllms_api_server_import_raised_the_root_logger_to_error():
    done = _run()
    assert "root level 40" in done.stdout  # the dependency's doing: why the plugin needs a handler of its own
    assert "USER WARNING" not in done.stderr
    assert "PLUGIN WARNING" in done.stderr


def test_log_level_warning_keeps_the_root_logger_at_warning():
    done = _run(LOG_LEVEL="WARNING")  # the workaround docs/troubleshooting.md gives for a user's own loggers
    assert "root level 30" in done.stdout
    assert "USER WARNING" in done.stderr
    assert "PLUGIN WARNING" in done.stderr
