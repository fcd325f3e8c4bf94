# SPDX-License-Identifier: Apache-2.0
"""Waiting for the Ray cluster the bootstrap started: every node of the job joined, or a clear error in bounded time.

`count_ray_nodes(status_text)` is pure: the nodes `ray status` (Ray 2.60) lists as Active or Idle, each section a
list of ` <count> <node type>` lines. `wait_for_nodes` polls `ray status --address` until `expected` nodes are in,
and raises `ClusterNotFormed` naming how many joined and the last status once its deadline has passed.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable

from recipe.nemo_gym.errors import ServerError

_HEADING = re.compile(r"^(Active|Idle):\s*$")
_NODE_LINE = re.compile(r"^\s+(\d+)\s+\S")


class ClusterNotFormed(ServerError):
    """Not every node joined the job's Ray cluster within its deadline."""


def count_ray_nodes(status_text: str) -> int:
    total, in_section = 0, False
    for line in status_text.splitlines():
        if _HEADING.match(line):
            in_section = True
        elif line[:1].strip():  # any other heading ends a section
            in_section = False
        elif in_section and (match := _NODE_LINE.match(line)):
            total += int(match.group(1))
    return total


def ray_status(address: str, timeout_s: float = 60.0) -> str:
    try:
        done = subprocess.run(
            ["ray", "status", "--address", address], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"ray status failed: {e}"
    return done.stdout + done.stderr


def wait_for_nodes(
    address: str,
    expected: int,
    timeout_s: float,
    poll_s: float,
    status: Callable[[str], str] = ray_status,
    say: Callable[[str], None] = print,
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        text = status(address)
        count = count_ray_nodes(text)
        if count >= expected:
            say(f"the Ray cluster at {address} has {count} of {expected} nodes")
            return
        if time.monotonic() >= deadline:
            raise ClusterNotFormed(
                f"the Ray cluster at {address} has {count} of {expected} nodes after {timeout_s:.0f} s "
                f"(cluster.ray_join_timeout_s); the last 'ray status':\n{text}"
            )
        time.sleep(poll_s)
