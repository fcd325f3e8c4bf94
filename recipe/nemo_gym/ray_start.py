# SPDX-License-Identifier: Apache-2.0
"""Ray's start-up deadline, which a CPU-starved node can miss, and how the plugin recognises it in a process's output.

Ray 2.60's local node gives its raylet a fixed 30 s to register with the GCS (`Node.__init__`, ray/_private/node.py;
not configurable) and otherwise raises with `RAY_START_TIMEOUT` in its message. A later start on the same node meets
it once the load that starved the first has passed, so NeMo Gym's launcher is started again when its Ray missed it
(`gym/owned/launch.py`), and so is the demo's trainer (`recipe/nemo_gym_demo/console.py`).
"""

from __future__ import annotations

RAY_START_TIMEOUT = "The current node timed out during startup"


def missed_ray_start(output: str) -> bool:
    """Whether `output` (a log's tail, an error's message) shows Ray's local node missing its start-up deadline."""
    return RAY_START_TIMEOUT in output
