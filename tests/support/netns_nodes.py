# SPDX-License-Identifier: Apache-2.0
"""Nodes with addresses of their own on one machine: a network namespace per node, joined by a bridge.

What a process started on node `n` (`NodeNetwork.on_node(n, argv)`) sees, as it would on a cluster node:
- its own network stack: loopback and one interface with the node's address (10.a.b.<i>, a /24 picked unused on this
  machine), reaching the other nodes and the machine itself (the bridge's address, `controller_ip`) across the
  bridge, and nothing else;
- its own host name (a UTS namespace: `hostname` says `n`), and an /etc/hosts of the cluster's names (bind-mounted in
  a mount namespace of its own), so that resolving its own name gives its address, as `use_absolute_ip` and Ray do;
- its own temporary folder at one path that every node shares (`node_temp`, /tmp/ngt-xxxxxxxx: 17 bytes, the most a
  folder holding a job's own may have, `recipe/nemo_gym/launch/cluster.py`), and its own /dev/shm, each bind-mounted
  from the node's private folders (`private_temp(n)`, `private_shm(n)`, which a test reads from outside).
Everything else (the file system, the process table) is the machine's, as a shared file system is.

Set up and torn down as root with iproute2's `ip` and util-linux's `unshare` (`unavailable_reason` says what is
missing). `close()` kills whatever still runs in a node's namespace, removes the namespaces, the bridge and the
folders, and returns what it had to kill.
"""

from __future__ import annotations

import ipaddress
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

COMMANDS = ("ip", "nsenter", "unshare", "mount")
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin", "/sbin"])


def unavailable_reason() -> str | None:
    missing = [c for c in COMMANDS if shutil.which(c, path=SEARCH_PATH) is None]
    if missing:
        return f"commands not found: {', '.join(missing)} (Debian: apt-get install -y iproute2 util-linux mount)"
    if os.geteuid() != 0:
        return f"network namespaces need root, and this is uid {os.geteuid()}"
    return None


def free_subnet(used: Iterable[str], rng: random.Random) -> ipaddress.IPv4Network:
    """A 10.x.y.0/24 that overlaps none of the networks `used` (CIDR strings, such as `ip -o addr` lists)."""
    taken = [ipaddress.ip_network(u, strict=False) for u in used]
    for _ in range(1000):
        candidate = ipaddress.ip_network(f"10.{rng.randrange(200, 250)}.{rng.randrange(256)}.0/24")
        if not any(candidate.overlaps(t) for t in taken if t.version == 4):
            return candidate
    raise RuntimeError("no free 10.x.y.0/24 network on this machine")


def hosts_text(addresses: dict[str, str]) -> str:
    """/etc/hosts for the cluster: localhost, then each name with its address."""
    lines = ["127.0.0.1 localhost"] + [f"{address} {name}" for name, address in addresses.items()]
    return "\n".join(lines) + "\n"


# Runs as the node's first process, inside its network namespace: enter a UTS and a mount namespace of its own, take
# the node's name and /etc/hosts, mount its private folder at the shared path, and become the command.
_ENTER_NODE = (
    'hostname "$0" && mount --bind "$1" /etc/hosts && mount --bind "$2/tmp" "$3" && mount --bind "$2/shm" /dev/shm'
    ' && shift 3 && exec "$@"'
)


class NodeNetwork:
    def __init__(self, nodes: Sequence[str], controller: str, seed: int | None = None, base_dir: str = "/tmp") -> None:
        rng = random.Random(seed)
        self.tag = f"{rng.randrange(16**4):04x}"
        self.nodes = list(nodes)
        self.controller = controller
        self.root = Path(tempfile.mkdtemp(prefix=f"ngn{self.tag}-", dir=base_dir))
        self.node_temp = Path(tempfile.mkdtemp(prefix="ngt-", dir="/tmp"))  # each node's own folder is seen here
        self.subnet: ipaddress.IPv4Network | None = None
        self.addresses: dict[str, str] = {}
        self.bridge = f"ngb{self.tag}"
        self._namespaces: list[str] = []

    # --- names ------------------------------------------------------------------------------------------------

    def namespace(self, node: str) -> str:
        return f"ng{self.tag}-{node}"

    def private_temp(self, node: str) -> Path:
        return self.root / "nodes" / node / "tmp"

    def private_shm(self, node: str) -> Path:
        return self.root / "nodes" / node / "shm"

    @property
    def controller_ip(self) -> str:
        return self.addresses[self.controller]

    def on_node(self, node: str, argv: Sequence[str]) -> list[str]:
        """`argv` run as a process of `node` (see the module docstring)."""
        return [
            # nsenter, not `ip netns exec`: that mounts a sysfs of the namespace's over /sys, hiding the machine's
            # cgroup mounts under /sys/fs/cgroup, and slurmd 22.05 refuses to start without them.
            shutil.which("nsenter", path=SEARCH_PATH), f"--net=/run/netns/{self.namespace(node)}",
            shutil.which("unshare", path=SEARCH_PATH), "--uts", "--mount", "--propagation", "private",
            "sh", "-c", _ENTER_NODE, node, str(self.root / "hosts"), str(self.root / "nodes" / node),
            str(self.node_temp), *argv,
        ]  # fmt: skip

    # --- set up and tear down ---------------------------------------------------------------------------------

    def _ip(self, *args: str) -> None:
        result = subprocess.run(
            [shutil.which("ip", path=SEARCH_PATH), *args], capture_output=True, text=True, timeout=30, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)} exited with {result.returncode}: {result.stderr.strip()}")

    def start(self) -> NodeNetwork:
        try:
            used = subprocess.run(
                [shutil.which("ip", path=SEARCH_PATH), "-4", "-o", "addr"], capture_output=True, text=True, check=True
            ).stdout
            self.subnet = free_subnet([line.split()[3] for line in used.splitlines()], random.Random())
            hosts = list(self.subnet.hosts())
            self.addresses = {self.controller: str(hosts[-1])}
            self.addresses |= {node: str(hosts[i]) for i, node in enumerate(self.nodes)}
            (self.root / "hosts").write_text(hosts_text(self.addresses))
            self._ip("link", "add", self.bridge, "type", "bridge")
            self._ip("addr", "add", f"{self.controller_ip}/{self.subnet.prefixlen}", "dev", self.bridge)
            self._ip("link", "set", self.bridge, "up")
            for i, node in enumerate(self.nodes):
                namespace, veth = self.namespace(node), f"ngv{self.tag}{i}"
                for folder in (self.private_temp(node), self.private_shm(node)):
                    folder.mkdir(parents=True)
                    folder.chmod(0o1777)
                self._ip("netns", "add", namespace)
                self._namespaces.append(namespace)
                self._ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace)
                self._ip("link", "set", veth, "master", self.bridge, "up")
                address = f"{self.addresses[node]}/{self.subnet.prefixlen}"
                self._ip("-n", namespace, "addr", "add", address, "dev", "eth0")
                self._ip("-n", namespace, "link", "set", "eth0", "up")
                self._ip("-n", namespace, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def pids(self, node: str) -> list[int]:
        """The processes in `node`'s network namespace."""
        result = subprocess.run(
            [shutil.which("ip", path=SEARCH_PATH), "netns", "pids", self.namespace(node)],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        return [int(p) for p in result.stdout.split()] if result.returncode == 0 else []

    def close(self) -> list[str]:
        killed = []
        for node in self.nodes:
            for pid in self.pids(node):
                try:
                    killed.append(f"{node}: {pid} {Path(f'/proc/{pid}/cmdline').read_bytes()[:200]!r}")
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        deadline = time.monotonic() + 10
        while any(self.pids(n) for n in self.nodes) and time.monotonic() < deadline:
            time.sleep(0.2)
        for namespace in self._namespaces:
            subprocess.run([shutil.which("ip", path=SEARCH_PATH), "netns", "del", namespace], check=False, timeout=30)
        subprocess.run(
            [shutil.which("ip", path=SEARCH_PATH), "link", "del", self.bridge],
            capture_output=True, check=False, timeout=30,
        )  # fmt: skip
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.node_temp, ignore_errors=True)  # the mount point: empty outside the nodes
        return killed
