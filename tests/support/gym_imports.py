# SPDX-License-Identifier: Apache-2.0
"""For tests that load NeMo Gym code into the test process: `restore_process_globals` undoes what it does there.

The plugin imports no NeMo Gym module (Gym runs out of process, `recipe/nemo_gym/gym/`). A few tests load Gym's
request and response models, or our environment's `app.py`, in process: the trainer's environment holds
nemo-gym 0.4.0 for them (and as the 0.4 Gym environment the suite runs the end-to-end module on). Importing it
sets `HF_HOME`, `HF_DATASETS_CACHE` and `TOKENIZERS_PARALLELISM`, replaces `builtins.print` and appends
site-packages to `sys.path` (checked against 0.4.0); this restores all of that when the import is done.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import sys
from collections.abc import Iterator

_ENV_KEYS = ("HF_HOME", "HF_DATASETS_CACHE", "TOKENIZERS_PARALLELISM", "UV_CACHE_DIR")


@contextlib.contextmanager
def restore_process_globals() -> Iterator[None]:
    env_before = {key: os.environ.get(key) for key in _ENV_KEYS}
    print_before = builtins.print
    path_before = list(sys.path)
    try:
        yield
    finally:
        for key, value in env_before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        builtins.print = print_before
        sys.path[:] = path_before
