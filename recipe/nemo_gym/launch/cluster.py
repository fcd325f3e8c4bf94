# SPDX-License-Identifier: Apache-2.0
"""Waiting for the Ray cluster the bootstrap started: every node of the job joined, or a clear error in bounded time.

`count_ray_nodes(status_text)` is pure: the nodes `ray status` (Ray 2.60) lists as Active or Idle, each section a
list of ` <count> <node type>` lines. `wait_for_nodes` polls `ray status --address` until `expected` nodes are in,
and raises `ClusterNotFormed` naming how many joined and the last status once its deadline has passed.

`node_address(resolved, interface_addresses)` is pure too: the address of the head node that the other nodes reach,
which the bootstrap starts Ray's head on (`launch ray-env`, run on that node, exports it as NG_HEAD_IP).
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import subprocess
import time
from collections.abc import Callable, Sequence

from recipe.nemo_gym.errors import ServerError

_HEADING = re.compile(r"^(Active|Idle):\s*$")
_NODE_LINE = re.compile(r"^\s+(\d+)\s+\S")


class ClusterNotFormed(ServerError):
    """Not every node joined the job's Ray cluster within its deadline."""


def node_address(resolved: str | None, interface_addresses: Sequence[str]) -> str:
    """This node's address for the other nodes: its host name's address (`hostname --ip-address`), unless that is a
    loopback one, as Debian's /etc/hosts gives (127.0.1.1); then its first non-loopback IPv4 interface address (as
    `hostname -I`); 127.0.0.1 when it has none."""
    if resolved and not ipaddress.ip_address(resolved).is_loopback:
        return resolved
    others = [a for a in interface_addresses if not ipaddress.ip_address(a).is_loopback]
    return others[0] if others else "127.0.0.1"


def this_node_address() -> str:
    """`node_address` of the machine this runs on."""
    import psutil

    try:
        resolved = socket.gethostbyname(socket.gethostname())
    except OSError:
        resolved = None
    interfaces = [
        a.address for addresses in psutil.net_if_addrs().values() for a in addresses if a.family == socket.AF_INET
    ]
    return node_address(resolved, interfaces)


UNIX_SOCKET_PATH_MAX = 107
"""Bytes a Unix socket's path may hold on Linux (`sockaddr_un.sun_path` is 108, its terminating NUL included)."""
RAY_SOCKET_UNDER_JOB_TEMP = "/ngjob-xxxxxxxx/ray/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store"
"""The longest path a job's own Ray puts under the folder that holds the job's temporary folder: Ray 2.60 keeps its
sessions in `$TMPDIR/ray` (here the job's `ngjob-*`), its sockets in `session_<time>_<pid>/sockets/` (Linux's
largest pid); a longer one and Ray fails at start (`validate_socket_filename failed`)."""


def job_temp_parent(temp: str, fallback: str = "/tmp") -> str:
    """Where a job's own temporary folder (`ngjob-*`) goes: under `temp` (the launcher's TMPDIR), or under `fallback`
    when Ray's socket paths below `temp` would pass the Unix limit (a Slurm node's TMPDIR, such as
    /scratch/<user>/<job>/tmp, often does)."""
    fits = len(os.fsencode(temp.rstrip("/"))) + len(RAY_SOCKET_UNDER_JOB_TEMP) <= UNIX_SOCKET_PATH_MAX
    return temp if fits else fallback


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
