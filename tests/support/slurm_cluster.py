# SPDX-License-Identifier: Apache-2.0
"""A private Slurm cluster for tests: its own munged, slurmctld and slurmd, started as root. One node (this machine)
by default; with a `NodeNetwork` (tests/support/netns_nodes.py), one slurmd per node of it, each in the node's own
network namespace with the node's address, and slurmctld on the bridge's address.

Everything lives under one fresh directory (`/tmp/ngslurm-*`, short: munge and slurmd put Unix sockets in it):
the munge key, socket, PID and log files; slurm.conf; slurmctld's state; slurmd's spool; the daemons' logs.
The ports (SlurmctldPort, SlurmdPort) are picked free. Each node is this machine with the CPUs, sockets, cores,
threads and memory `slurmd -C` reports (several nodes share them: their resources are logical). Without cgroups
(none here), processes are tracked by parentage (`proctrack/linuxproc`) and tasks are not bound (`task/none`);
`select/cons_tres`; no accounting.

Every daemon and client command runs with `SLURM_CONF` pointing at the cluster's own slurm.conf (the daemons
also get `-f`), and with the marker variable `NG_SLURM_TEST_CLUSTER=<directory>`. Batch jobs inherit the
submitting environment (sbatch's default `--export=ALL`), so every process of the cluster or of one of its jobs
carries the marker: that is how `processes()` finds what is left, wherever it was reparented.

Not thread-safe; one cluster per `SlurmCluster` object. `stop()` cancels jobs, stops the daemons (SIGTERM, then
SIGKILL after a grace), kills anything else that still carries the marker and returns what it had to kill.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from recipe.nemo_gym.ports import pick_free_ports
from tests.support.helpers import processes_with_env
from tests.support.netns_nodes import NodeNetwork

MARKER = "NG_SLURM_TEST_CLUSTER"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "scontrol", "sinfo", "squeue", "scancel")
INSTALL_HINT = (
    "install them as root with `apt-get install -y --no-install-recommends slurm-wlm munge` (Debian/Ubuntu; "
    "./run_tests.sh does this when it runs as root), or set NG_SLURM_TESTS=skip to skip these tests"
)
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin", "/sbin"])
FINAL_STATES = {
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "TIMEOUT",
}


class SlurmError(RuntimeError):
    """The cluster could not start, or a command against it failed; the message carries the logs."""


def which(name: str) -> str | None:
    return shutil.which(name, path=SEARCH_PATH)


def unavailable_reason() -> str | None:
    """Why a private Slurm cluster cannot run here (None when it can): missing commands, or not root."""
    missing = [name for name in (*DAEMONS, *CLIENTS) if which(name) is None]
    if missing:
        return f"Slurm/munge commands not found: {', '.join(missing)}; {INSTALL_HINT}"
    if os.geteuid() != 0:
        return (
            "the private Slurm cluster runs slurmctld, slurmd and munged as root (SlurmUser=root, jobs as root), "
            f"and this is uid {os.geteuid()}: run the tests as root, or set NG_SLURM_TESTS=skip to skip them"
        )
    return None


def free_ports(count: int) -> list[int]:
    """Ports free on every address now, distinct, outside the kernel's ephemeral range (`recipe.nemo_gym.ports`)."""
    return pick_free_ports(count, host="")


def node_hardware() -> dict[str, str]:
    """This machine as `slurmd -C` sees it: CPUs, Boards, SocketsPerBoard, CoresPerSocket, ThreadsPerCore,
    RealMemory (MiB)."""
    out = subprocess.run([which("slurmd"), "-C"], capture_output=True, text=True, timeout=60, check=True).stdout
    fields = dict(item.split("=", 1) for item in out.split() if "=" in item)
    keys = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
    return {key: fields[key] for key in keys if key in fields}


def parse_scontrol_record(text: str) -> dict[str, str]:
    """One `scontrol show ... -o` line -> {key: value} (values without spaces, except the last key's)."""
    record: dict[str, str] = {}
    key = None
    for token in text.split():
        if "=" in token and not token.startswith("="):
            key, value = token.split("=", 1)
            record[key] = value
        elif key is not None:  # a value with spaces (e.g. Command, Reason)
            record[key] += " " + token
    return record


@dataclass
class Daemon:
    name: str
    process: subprocess.Popen
    log: Path
    node: str | None = None


class SlurmCluster:
    def __init__(
        self,
        base_dir: str | os.PathLike | None = None,
        start_timeout_s: float = 90,
        network: NodeNetwork | None = None,
        partitions: dict[str, list[str]] | None = None,
    ) -> None:
        """One node, this machine, in partition `test`; or with `network`, its nodes, in `partitions` (name: nodes;
        the first is the default; default: all nodes in `test`)."""
        self.root = Path(tempfile.mkdtemp(prefix="ngslurm-", dir=base_dir or "/tmp"))
        self.root.chmod(0o755)
        self.start_timeout_s = start_timeout_s
        self.node = socket.gethostname().split(".")[0]
        self.network = network
        self.nodes = list(network.nodes) if network else [self.node]
        self.partitions = partitions or {"test": self.nodes}
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.log_dir = self.root / "log"
        self.daemons: list[Daemon] = []
        self.ctld_port, self.slurmd_port = free_ports(2)

    # --- environment and commands ---------------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        """os.environ without any Slurm job or client settings of an enclosing allocation, plus SLURM_CONF, the
        marker, /usr/sbin on PATH, and `extra`."""
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_", "SINFO_"))
        }
        env["PATH"] = SEARCH_PATH
        env["SLURM_CONF"] = str(self.conf)
        env[MARKER] = str(self.root)
        env.update(extra)
        return env

    def run(self, *args: str, timeout: float = 60, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster."""
        result = subprocess.run(
            [which(args[0]) or args[0], *args[1:]],
            env=kwargs.pop("env", None) or self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            **kwargs,
        )
        if check and result.returncode != 0:
            raise SlurmError(
                f"{' '.join(args)} exited with {result.returncode}: {result.stderr.strip()}\n{self.log_tails()}"
            )
        return result

    # --- start ----------------------------------------------------------------------------------------------

    def write_config(self) -> None:
        state = self.root / "state"
        spool = self.root / "spool"
        for path in (state, spool, self.log_dir):
            path.mkdir(mode=0o755)
        (self.root / "plugstack.conf").write_text("")
        hardware = " ".join(f"{key}={value}" for key, value in node_hardware().items())
        controller = self.network.controller_ip if self.network else "127.0.0.1"
        per_node = "-%n" if self.network else ""  # slurmd's files, one set per node (Slurm substitutes the name)
        settings = {
            "ClusterName": "ngtest",
            "SlurmctldHost": f"{self.node}({controller})",
            "SlurmctldPort": self.ctld_port,
            "SlurmdPort": self.slurmd_port,
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "AuthType": "auth/munge",
            "CredType": "cred/munge",
            "AuthInfo": f"socket={self.munge_socket}",
            "StateSaveLocation": state,
            "SlurmdSpoolDir": f"{spool}{per_node}",
            "SlurmctldPidFile": self.root / "slurmctld.pid",
            "SlurmdPidFile": self.root / f"slurmd{per_node}.pid",
            "SlurmctldLogFile": self.log_dir / "slurmctld.log",
            "SlurmdLogFile": self.log_dir / f"slurmd{per_node}.log",
            "PlugStackConfig": self.root / "plugstack.conf",
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_Core",
            "SchedulerType": "sched/backfill",
            "AccountingStorageType": "accounting_storage/none",
            "JobAcctGatherType": "jobacct_gather/none",
            "JobCompType": "jobcomp/none",
            "MpiDefault": "none",
            "MailProg": "/bin/true",
            "ReturnToService": 2,
            "InactiveLimit": 0,
            "MinJobAge": 3600,  # finished jobs stay visible to `scontrol show job`
            # Seconds between SIGTERM and SIGKILL for a cancelled job: room for the submit scripts' teardown
            # (STOP_GRACE_S per process), which proctrack/linuxproc cannot replace (it loses reparented orphans).
            "KillWait": 120,
            "Waittime": 0,
            "SlurmctldDebug": "info",
            "SlurmdDebug": "info",
        }
        lines = [f"{key}={value}" for key, value in settings.items()]
        for node in self.nodes:
            address = self.network.addresses[node] if self.network else "127.0.0.1"
            lines.append(f"NodeName={node} NodeAddr={address} {hardware} State=UNKNOWN")
        for i, (partition, nodes) in enumerate(self.partitions.items()):
            default = "YES" if i == 0 else "NO"
            listed = ",".join(nodes)
            lines.append(f"PartitionName={partition} Nodes={listed} Default={default} MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        if self.network:
            for node in self.nodes:
                (self.root / f"spool-{node}").mkdir(mode=0o755)

    def _spawn(self, name: str, *args: str, node: str | None = None) -> None:
        """Start daemon `name`; with `node`, as a process of that node of the network."""
        log = self.log_dir / (f"{name}-{node}.out" if node else f"{name}.out")
        argv = [which(name), *args]
        with open(log, "wb") as out:
            process = subprocess.Popen(
                self.network.on_node(node, argv) if node else argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env(),
                cwd=self.root,
                start_new_session=True,
            )
        self.daemons.append(Daemon(name, process, log, node))

    def _wait(self, what: str, ready, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            for daemon in self.daemons:
                if daemon.process.poll() is not None:
                    raise SlurmError(f"{daemon.name} exited with {daemon.process.returncode}\n{self.log_tails()}")
            if time.monotonic() > deadline:
                raise SlurmError(f"{what} not ready after {timeout_s:.0f} s\n{self.log_tails()}")
            time.sleep(0.5)

    def node_state(self, node: str | None = None) -> str:
        result = self.run("sinfo", "--noheader", "--Node", "--format=%T", "--nodes", node or self.node, check=False)
        return result.stdout.strip() if result.returncode == 0 else f"unreachable: {result.stderr.strip()}"

    def all_idle(self) -> bool:
        return all(self.node_state(node) == "idle" for node in self.nodes)

    def start(self) -> SlurmCluster:
        """Start munged, slurmctld and slurmd; return once the node is idle (bounded by start_timeout_s)."""
        try:
            self.write_config()
            munge_dir = self.munge_socket.parent
            munge_dir.mkdir(mode=0o755)
            key_dir = self.root / "munge-key"
            key_dir.mkdir(mode=0o700)
            key = key_dir / "munge.key"
            key.write_bytes(os.urandom(1024))
            key.chmod(0o400)
            self._spawn(
                "munged",
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={self.munge_socket}",
                f"--pid-file={munge_dir / 'munged.pid'}",
                f"--seed-file={munge_dir / 'munged.seed'}",
                f"--log-file={self.log_dir / 'munged.log'}",
            )
            self._wait("munged", self.munge_socket.exists, 30)
            self._spawn("slurmctld", "-D", "-i", "-f", str(self.conf))
            for node in self.nodes:
                self._spawn("slurmd", "-D", "-N", node, "-f", str(self.conf), node=node if self.network else None)
            self._wait(f"node(s) {', '.join(self.nodes)}", self.all_idle, self.start_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    # --- jobs -----------------------------------------------------------------------------------------------

    def sbatch(
        self,
        script: str | os.PathLike,
        *options: str,
        script_args: Iterable[str] = (),
        cwd: str | os.PathLike,
        **env: str,
    ) -> str:
        """Submit; return the job id. `env` is added to the submitting (hence the job's) environment."""
        args = ("sbatch", "--parsable", *options, str(script), *script_args)
        result = self.run(*args, cwd=cwd, env=self.env(**env))
        return result.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        return parse_scontrol_record(self.run("scontrol", "show", "job", "--oneliner", job_id).stdout)

    def wait_job(self, job_id: str, timeout_s: float, cancel_grace_s: float = 150) -> dict[str, str]:
        """Poll until the job reaches a final state. On timeout cancel it, give it up to `cancel_grace_s` to end
        (its own teardown runs within KillWait), and raise."""
        deadline = time.monotonic() + timeout_s
        while True:
            record = self.job(job_id)
            if record.get("JobState") in FINAL_STATES:
                return record
            if time.monotonic() > deadline:
                break
            time.sleep(1)
        state = record.get("JobState")
        self.run("scancel", job_id, check=False)
        deadline = time.monotonic() + cancel_grace_s
        while record.get("JobState") not in FINAL_STATES and time.monotonic() < deadline:
            time.sleep(1)
            record = self.job(job_id)
        raise SlurmError(
            f"job {job_id} still {state} after {timeout_s:.0f} s; cancelled (now {record.get('JobState')})"
        )

    # --- processes and stop ---------------------------------------------------------------------------------

    def processes(self, marker_value: str | None = None, exclude: Iterable[int] = ()) -> list[psutil.Process]:
        """Live processes whose environment carries `marker=value` (default: this cluster's marker)."""
        wanted = f"{MARKER}={self.root}" if marker_value is None else marker_value
        key, _, value = wanted.partition("=")
        return processes_with_env(key, value, exclude)

    @staticmethod
    def describe(processes: Iterable[psutil.Process]) -> list[str]:
        described = []
        for process in processes:
            try:
                described.append(f"{process.pid} {' '.join(process.cmdline())[:200] or process.name()}")
            except psutil.Error:
                continue
        return described

    def log_tails(self, lines: int = 15) -> str:
        parts = []
        for path in sorted(self.log_dir.glob("*")) if self.log_dir.exists() else []:
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name} ---\n" + "\n".join(text))
        return "\n".join(parts)

    def stop(self, grace_s: float = 30, jobs_grace_s: float = 150) -> list[str]:
        """Cancel every job (waiting up to `jobs_grace_s` for them to end), stop the daemons (slurmd, slurmctld,
        munged; `grace_s` each), kill whatever else still carries the cluster's marker, remove the directory.
        Returns the processes that had to be killed after the daemons stopped (empty when the cluster shut down
        cleanly)."""
        if any(d.name == "slurmctld" and d.process.poll() is None for d in self.daemons):
            self.run("scancel", "--full", "--user=root", check=False, timeout=30)
            deadline = time.monotonic() + jobs_grace_s
            while time.monotonic() < deadline:
                queue = self.run("squeue", "--noheader", "--format=%i", check=False, timeout=30)
                if queue.returncode != 0 or not queue.stdout.strip():
                    break
                time.sleep(1)
        for name in ("slurmd", "slurmctld", "munged"):
            for daemon in self.daemons:
                if daemon.name == name:
                    _terminate(daemon.process, grace_s)
        leftovers = self.processes()
        described = self.describe(leftovers)
        for process in leftovers:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(leftovers, timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)
        return described


def _terminate(process: subprocess.Popen, grace_s: float) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)
