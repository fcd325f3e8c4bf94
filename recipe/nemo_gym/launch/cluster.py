# SPDX-License-Identifier: Apache-2.0
"""Waiting for the Ray cluster the bootstrap started: every node of the job joined, or a clear error in bounded time.

`count_ray_nodes(status_text)` is pure: the nodes `ray status` (Ray 2.60) lists as Active or Idle, each section a
list of ` <count> <node type>` lines. `wait_for_nodes` polls `ray status --address` until `expected` nodes are in,
and raises `ClusterNotFormed` naming how many joined and the last status once its deadline has passed.

The Ray bootstrap starts the other nodes only once the head node itself is in (a worker's `ray start` gives up
after about 40 s without it, and a busy head takes longer to register):

    python -m recipe.nemo_gym.launch.cluster ADDRESS NODES TIMEOUT_S POLL_S   # exit 0 once NODES are in, else 1

`node_address(resolved, interface_addresses)` is pure too: the address of the head node that the other nodes reach,
which the bootstrap starts Ray's head on (`launch ray-env`, run on that node, exports it as NG_HEAD_IP).
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import subprocess
import sys
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
RAY_SOCKET_UNDER_JOB_TEMP = "/ngjob-xxxxxxxx/ray/session_2026-01-01_00-00-00_000000_4194304/sockets/dash_TaskEventsHead"
"""The longest path a job's own Ray puts under the folder that holds the job's temporary folder: Ray 2.60 keeps its
sessions in `$TMPDIR/ray` (here the job's `ngjob-*`), its sockets in `session_<time>_<pid>/sockets/` (Linux's
largest pid), the longest of them its dashboard's modules' (`dash_<module>`: `dash_MetricsHead` always,
`dash_TaskEventsHead` where Ray's config enables that module). A longer path and Ray's head fails at start
(`validate_socket_filename failed`, after a minute's wait for its dashboard). So the folder that holds the job's may
be 17 bytes long (/tmp/ngs-xxxxxxxx, the test suite's): a two-node test's 23-byte one failed so."""


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


def main(argv: Sequence[str]) -> int:
    if len(argv) != 4:
        print("usage: python -m recipe.nemo_gym.launch.cluster ADDRESS NODES TIMEOUT_S POLL_S", file=sys.stderr)
        return 2
    address, nodes, timeout_s, poll_s = argv[0], int(argv[1]), float(argv[2]), float(argv[3])
    try:
        wait_for_nodes(address, nodes, timeout_s, poll_s, say=lambda m: print(f"ray_on_slurm: {m}", file=sys.stderr))
    except ClusterNotFormed as e:
        print(f"ray_on_slurm: ERROR: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
