# SPDX-License-Identifier: Apache-2.0
"""Two training nodes and a CPU node under a real Slurm: verl's `main_ppo` trains across both nodes against a NeMo Gym
attached from the CPU node, until one node's Ray dies.

The cluster (`tests/support/netns_nodes.py`, `slurm_cluster.py`): three nodes, each a network namespace with its own
address (10.x.y.1-3), host name, /etc/hosts, temporary folder and /dev/shm, each running its own slurmd; slurmctld on
the bridge's address. Nothing is replaced: the jobs are submitted the way users submit them.
- The Gym job (partition `cpu`, node `cpu1`): docs/attach-mode.md's `srun gym env start ... +use_absolute_ip=true`
  (offline venv links are the one difference), running the repository's `uppercase_share` environment.
- The training job (partition `gpu`, `sbatch --nodes=2 submit_math.sh`, submitted right after the Gym's, as users
  submit the two: the plugin waits for the Gym while its own start-up runs): a `backend: cpu` job with `cluster.nnodes:
  2` and the attach environments file naming `http://cpu1:<port>`. `ray_on_slurm.sh` starts Ray's head on node1 and a
  worker on node2; verl's trainer runs FSDP across one logical GPU per node and one vLLM server per node; the plugin
  puts a relay in front of the two servers and hands Gym its address, and its two collect processes
  (`nemo_gym.collect_processes: 2`) post the rows to the CPU node's Gym and read the results.
Once step 2 is logged the test kills node2's Ray (every process of node2 but slurmd and its step daemons: a node lost
mid-step). The job must end, FAILED, within the bootstrap's grace, the launcher saying it was stopped and the last line
naming node2, and leave nothing on any node: no process in node1's or node2's namespace but slurmd, an empty temporary
folder and /dev/shm on each. The attached Gym keeps running for the next trainer until its own job is cancelled; then
the CPU node is left clean too. (A job that completes is the one-node tests' case: `test_slurm.py`, `test_main_ppo.py`.)
The test prints the nodes' addresses, the job's wall time and the machine's peak memory while it ran.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import socket
import threading
import time
from pathlib import Path

import psutil
import pytest

from recipe.nemo_gym.gym.over_http.client import HeadClient
from recipe.nemo_gym.gym.over_http.health import http_alive
from recipe.nemo_gym_demo.data import UPPERCASE_ROWS, write_jsonl
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from tests.support import netns_nodes, slurm_cluster, slurm_jobs
from tests.support.engine import TEST_KV_CACHE
from tests.support.external_gym import attach_command, gym_bin_dir, offline_gym_arguments
from tests.support.helpers import REPO_ROOT
from tests.support.netns_nodes import NodeNetwork
from tests.support.suite_cost import memory_in_use

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("user_ray_auth_environment"), pytest.mark.timeout(1800)]

TRAINERS = ("node1", "node2")
GYM_NODE = "cpu1"
GYM_PORT = 11000  # the docs' port: the Gym has its node to itself
UPPERCASE = "uppercase_share_simple_agent"
UPPERCASE_CONFIG = "resources_servers/uppercase_share/configs/uppercase_share.yaml"  # ours, in the repository
NODE_DAEMONS = ("slurmd", "slurmstepd")  # what is left of a node whose Ray died


@pytest.fixture(scope="module")
def nodes():
    slurm_jobs.require_slurm()
    reason = netns_nodes.unavailable_reason()
    if reason:
        pytest.fail(f"the two-node tests cannot run: {reason}", pytrace=False)
    network = NodeNetwork([*TRAINERS, GYM_NODE], controller=socket.gethostname()).start()
    cluster = slurm_cluster.SlurmCluster(network=network, partitions={"gpu": list(TRAINERS), "cpu": [GYM_NODE]})
    try:
        cluster.start()
        yield cluster
    finally:
        try:
            slurm_jobs.stop_and_check(cluster)
        finally:
            killed = network.close()
        assert killed == [], f"processes left in the nodes' namespaces (killed now): {killed}"


def gym_job_script(tmp_path: Path, model: str) -> tuple[Path, Path]:
    """The attach docs' Gym job for the CPU node, and the endpoint file it names."""
    endpoint_file = tmp_path / "policy_endpoint"
    argv = attach_command(
        gym_bin_dir(), [UPPERCASE_CONFIG], endpoint_file=endpoint_file, model_name=model, port=GYM_PORT
    )
    argv += offline_gym_arguments(tmp_path / "venvs")
    script = tmp_path / "gym_job.sh"
    script.write_text(
        "#!/usr/bin/env bash\n"
        f"#SBATCH --job-name=nemo-gym --nodes=1 --partition=cpu\n"
        "set -euo pipefail\n"
        "# Gym's own Python: nothing of the submitting shell's Ray or Python 3.12 packages (clean_environment).\n"
        "unset PYTHONPATH PYTHONHOME VIRTUAL_ENV $(compgen -v RAY_ || true)\n"
        "# Gym's Ray keeps its session folder: in one of the job's own (short: Ray puts sockets under it), removed.\n"
        'export RAY_TMPDIR=$(mktemp -d "$TMPDIR/g.XXXXXX")\n'
        "trap 'rm -rf \"$RAY_TMPDIR\"' EXIT\n"
        f"cd {shlex.quote(str(REPO_ROOT))}\n"
        f"srun {shlex.join(argv)}\n"
    )
    return script, endpoint_file


def wait_for_gym(cluster, job_id: str, url_host: str, timeout_s: float = 300) -> list:
    head = HeadClient(url_host, GYM_PORT, timeout_s=5.0)
    deadline = time.monotonic() + timeout_s
    while True:
        state = cluster.job(job_id).get("JobState")
        assert state not in slurm_cluster.FINAL_STATES, f"the Gym job {job_id} ended ({state}) before it was ready"
        try:
            servers = head.instances()
        except OSError:
            servers = []
        if servers and all(http_alive(s.host, s.port, 2.0) for s in servers):
            return servers
        assert time.monotonic() < deadline, f"the Gym job {job_id} was not ready within {timeout_s:g} s"
        time.sleep(2)


class MemoryPeak:
    """The machine's used memory, sampled every second while the test runs: its peak in GiB."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(1.0):
            self.peak = max(self.peak, memory_in_use(Path("/proc/meminfo").read_text()))  # the suite's figure

    def __enter__(self) -> MemoryPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def node_processes(cluster, node: str) -> list[psutil.Process]:
    """The live processes in `node`'s namespace other than its Slurm daemons."""
    found = []
    for pid in cluster.network.pids(node):
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            if process.name() not in NODE_DAEMONS and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
    return found


def kill_node_ray_after_step_2(cluster, job_log: Path, node: str, timeout_s: float = 1500):
    """A `while_running` callback: once verl's console logger has printed step 2, SIGKILL every process of `node`
    but its Slurm daemons (its Ray: `ray start`, the raylet, the workers, and what they started)."""
    killed: list[str] = []

    def kill(job_id: str) -> None:
        slurm_jobs.wait_for_step(cluster, job_log, job_id, 2, timeout_s)
        for process in node_processes(cluster, node):
            with contextlib.suppress(psutil.Error):
                killed.append(f"{process.pid} {' '.join(process.cmdline())[:80]}")
                process.kill()
        killed.append(f"at {time.monotonic():.1f}")

    kill.killed = killed
    return kill


def console_metrics(log: str, step: int) -> dict[str, float]:
    """verl's console logger line of `step` as {metric: value} (numpy's scalars print as `np.float64(<value>)`)."""
    line = next(line for line in log.splitlines() if re.search(rf"\bstep:{step} - ", line))
    pairs = re.findall(r"([\w/@.-]+):(?:np\.\w+\()?([-+0-9.eE]+|nan)\)?(?= - |$)", line)
    return {k: float(v) for k, v in pairs}


@pytest.fixture(scope="module")
def run(nodes, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("two_nodes")
    cluster, network = nodes, nodes.network
    model = str(tiny_qwen3_dir())
    gym_script, endpoint_file = gym_job_script(tmp_path, model)
    gym_log = tmp_path / "gym-%j.log"
    gym_job = cluster.sbatch(gym_script, f"--output={gym_log}", cwd=REPO_ROOT, TMPDIR=str(network.node_temp))
    try:
        rows = [json.loads(line) for line in UPPERCASE_ROWS.read_text().splitlines() if line.strip()][:6]
        for row in rows:
            row["responses_create_params"]["max_output_tokens"] = 16
        train = write_jsonl(rows, tmp_path / "train.jsonl")
        plugin = tmp_path / "attach.yaml"
        plugin.write_text(
            f"nemo_gym:\n  attach:\n    head_server_url: http://{GYM_NODE}:{GYM_PORT}\n  collect_processes: 2\n"
            "timeouts: {startup_s: 600, batch_s: 900, health_check_interval_s: 2, policy_health_timeout_s: 2}\n"
            "failures: {max_fraction: 0.0}\n"
        )
        job = slurm_jobs.write_job(
            tmp_path,
            None,
            backend="cpu",
            model=model,
            environments=str(plugin),
            data={"train_files": [str(train)], "val_files": [str(train)]},
            cluster__nnodes=2,
            training={
                "train_batch_size": 2,
                "rollout_n": 2,
                "ppo_mini_batch_size": 2,
                "micro_batch_size_per_gpu": 1,
                "max_prompt_length": 1024,
                "max_response_length": 32,
                "lr": 1e-2,
                "total_training_steps": 3,
                "save_freq": -1,
                "test_freq": -1,
                "val_before_train": False,
            },
            logging={"project": "nemo_gym_two_nodes", "experiment": "cpu_backend", "loggers": ["console"]},
            # Each node's engine holds the tests' 128 MiB of KV cache: at the CPU backend's 512, two engines' 1 GiB
            # was resident beside the other worker's modules (the suite's peak, 17.1 GiB, 2026-11-29).
            verl_overrides=["data.shuffle=false", TEST_KV_CACHE],
        )
        kill_node2 = kill_node_ray_after_step_2(cluster, tmp_path / "job-%j.log", "node2")
        servers = []

        def while_running(job_id: str) -> None:
            # The trainer's job goes in at once, as users submit the two: its start-up overlaps the Gym's, and the
            # plugin waits for the Gym (`timeouts.startup_s`).
            servers[:] = wait_for_gym(cluster, gym_job, network.addresses[GYM_NODE])
            kill_node2(job_id)

        started = time.monotonic()
        with MemoryPeak() as memory:
            record, log, left = slurm_jobs.submit_ray_job(
                cluster,
                tmp_path,
                slurm_jobs.SUBMIT,
                nodes=2,
                partition="gpu",
                timeout_s=1500,
                while_running=while_running,
                JOB=str(job),
                NEMO_GYM_HEAD_SERVER_URL=f"http://{GYM_NODE}:{GYM_PORT}",
                TMPDIR=str(network.node_temp),  # each node's own /tmp, as on a cluster
            )
        wall_s = time.monotonic() - started
        after = {node: cluster.describe(node_processes(cluster, node)) for node in TRAINERS}
        gym_alive = (
            cluster.job(gym_job).get("JobState") == "RUNNING"
            and HeadClient(network.addresses[GYM_NODE], GYM_PORT, timeout_s=5.0).instances()
        )
        print(
            f"two nodes: {network.addresses}; job {record.get('JobId')} {record.get('JobState')} in {wall_s:.0f} s "
            f"(RunTime={record.get('RunTime')}); peak memory {memory.peak / 2**30:.1f} GiB; killed: {kill_node2.killed}"
        )
        gym_record = stop_gym_job(cluster, gym_job)
        gym_after = cluster.describe(node_processes(cluster, GYM_NODE))
        yield {
            "record": record, "log": log, "left": left, "after": after, "servers": servers, "gym_alive": gym_alive,
            "killed": kill_node2.killed, "endpoint_file": endpoint_file, "network": network, "gym_record": gym_record,
            "gym_after": gym_after,
        }  # fmt: skip
    finally:
        stop_gym_job(cluster, gym_job)


def stop_gym_job(cluster, job_id: str) -> dict:
    """Gym's own orderly stop, SIGINT to its step (`scancel --signal=INT` signals the steps, not the batch script),
    then the job's final record."""
    if cluster.job(job_id).get("JobState") not in slurm_cluster.FINAL_STATES:
        cluster.run("scancel", "--signal=INT", job_id, check=False)
    try:
        return cluster.wait_job(job_id, 120)
    except slurm_cluster.SlurmError as e:
        return {"JobState": f"not ended: {e}"}


def test_main_ppo_trains_across_two_nodes_against_a_gym_on_a_cpu_node(run):
    log, network = run["log"], run["network"]
    failure = "\n".join(log.splitlines()[-80:])
    head, worker = network.addresses["node1"], network.addresses["node2"]
    # Ray's head on node1's own address, and both nodes in the cluster.
    assert f"starting the Ray head on node1 ({head}:" in log, failure
    assert re.search(rf"the Ray cluster at {re.escape(head)}:\d+ has 2 of 2 nodes", log), failure
    # Gym's servers listen on the CPU node's address (use_absolute_ip), not on loopback.
    assert {s.host for s in run["servers"]} == {network.addresses[GYM_NODE]}
    # One verl server per node; Gym was handed the relay in front of both, at the address of the node where verl's
    # TaskRunner (which holds the manager) runs: Ray places it on either node.
    attached = re.search(r"policy http://([\d.]+):\d+/v1 published in \S+ through a relay to \[([^]]*)\]", log)
    assert attached, failure
    assert attached[1] in (head, worker) and sorted(re.findall(r"http://([\d.]+):", attached[2])) == sorted(
        [head, worker]
    )
    for step in (1, 2):
        metrics = console_metrics(log, step)
        assert metrics["timing_s/nemo_gym/all/failed"] == 0, failure
        assert metrics[f"timing_s/nemo_gym/{UPPERCASE}/episodes"] == 4, failure
        assert metrics["training/rollout_probs_diff_max"] < 1e-6, failure  # token-exact across the nodes
        assert metrics["actor/grad_norm"] > 0, failure
    assert not re.search(r"\bstep:3 - ", log), failure
    # The rows were posted, and the results read into episodes, by the manager's two collect processes.
    assert re.search(r"NeMo Gym: 2 collect processes post the rows and read the results \(pids \d+, \d+;", log), failure


def test_a_node_whose_ray_dies_mid_step_ends_the_job_naming_it_and_each_node_is_left_clean(run):
    record, log, network = run["record"], run["log"], run["network"]
    failure = "\n".join(log.splitlines()[-80:])
    assert len(run["killed"]) > 1, "nothing of node2 was killed"
    assert record["JobState"] == "FAILED" and record["ExitCode"] == "1:0", failure
    # The launcher was stopped with SIGTERM to its step (not killed by srun with it), so it stopped the trainer and
    # said how the job ended; the bootstrap's line naming the node comes last.
    assert "launch: SIGTERM received: SIGINT to the trainer" in log, failure
    assert re.search(r"^launch: the trainer stopped [\d.]+ s after SIGINT$", log, re.MULTILINE), failure
    assert log.rstrip().splitlines()[-2:] == [
        "launch: the job was stopped by SIGTERM (exit status 143)",
        "ray_on_slurm: ERROR: the job failed because the Ray worker on node2 exited while the job ran",
    ], failure
    assert run["left"] == [], f"left running after the job: {run['left']}"
    assert run["after"] == {node: [] for node in TRAINERS}, "processes left on the training nodes"
    for node in TRAINERS:
        assert sorted(p.name for p in network.private_temp(node).iterdir()) == [], f"{node}'s temporary folder"
        assert sorted(p.name for p in network.private_shm(node).iterdir()) == [], f"{node}'s /dev/shm"


def test_the_gym_on_the_cpu_node_outlives_the_trainer_and_stops_with_its_own_job_leaving_its_node_clean(run):
    assert run["gym_alive"], "the attached Gym's job ended with the trainer's"
    # Ray places verl's TaskRunner (the manager, and the relay Gym was handed) on either node. Where it ran on node2,
    # it died with the node; its watchdog, on node2 too, may have died with it, and then nothing emptied the endpoint
    # file (the next trainer's address replaces it). Where it ran on node1, it stopped with the job and its address
    # was withdrawn: by its SIGTERM hook, or by its watchdog if Ray's SIGKILL came first.
    relay = re.search(r"policy http://([\d.]+):\d+/v1 published in", run["log"])
    assert relay, "the manager published no address"
    published = run["endpoint_file"].read_text()
    if relay[1] == run["network"].addresses["node2"]:
        assert published.strip() == "" or published.startswith(f"http://{relay[1]}:"), published
    else:
        assert published.strip() == "", published
    assert run["gym_record"]["JobState"] == "COMPLETED", run["gym_record"]  # SIGINT: Gym's orderly stop
    assert run["gym_after"] == []
    network = run["network"]
    assert sorted(p.name for p in network.private_temp(GYM_NODE).iterdir()) == []
    assert sorted(p.name for p in network.private_shm(GYM_NODE).iterdir()) == []
