# SPDX-License-Identifier: Apache-2.0
"""`recipe/nemo_gym/launch/cluster.py`: counting the nodes `ray status` lists, waiting for them in bounded time, and
the head node's address for the others."""

from __future__ import annotations

import pytest

from recipe.nemo_gym.launch.cluster import (
    RAY_SOCKET_UNDER_JOB_TEMP,
    UNIX_SOCKET_PATH_MAX,
    ClusterNotFormed,
    count_ray_nodes,
    job_temp_parent,
    node_address,
    wait_for_nodes,
)

# `ray status` of Ray 2.60 (autoscaler v2 layout) for a cluster of three nodes, one still launching.
RAY_STATUS_THREE_NODES = """======== Autoscaler status: 2026-01-01 00:00:00.000000 ========
Node status
---------------------------------------------------------------
Active:
 2 node_1f3a
Idle:
 1 node_9bc0
Pending:
 gpu_worker, 3 launching
Recent failures:
 (no failures)

Resources
---------------------------------------------------------------
Total Usage:
 0.0/48.0 CPU
 0.0/16.0 GPU
"""
RAY_STATUS_EMPTY = """Node status
---------------------------------------------------------------
Active:
 (no active nodes)
Idle:
 (no idle nodes)
Pending:
 (no pending nodes)
"""


@pytest.mark.parametrize(
    ("status", "expected"), [(RAY_STATUS_THREE_NODES, 3), (RAY_STATUS_EMPTY, 0), ("connection refused", 0)]
)
def test_count_ray_nodes_sums_active_and_idle_only(status, expected):
    assert count_ray_nodes(status) == expected


def test_waiting_returns_once_every_node_is_in():
    answers = iter([RAY_STATUS_EMPTY, "connection refused", RAY_STATUS_THREE_NODES])
    said = []
    wait_for_nodes("10.0.0.1:6379", 3, timeout_s=30, poll_s=0, status=lambda address: next(answers), say=said.append)
    assert said == ["the Ray cluster at 10.0.0.1:6379 has 3 of 3 nodes"]


def test_waiting_gives_up_after_its_deadline_naming_the_count_and_the_last_status():
    with pytest.raises(ClusterNotFormed) as raised:
        wait_for_nodes("10.0.0.1:6379", 4, timeout_s=0.2, poll_s=0.05, status=lambda address: RAY_STATUS_THREE_NODES)
    message = str(raised.value)
    assert message.startswith(
        "the Ray cluster at 10.0.0.1:6379 has 3 of 4 nodes after 0 s (cluster.ray_join_timeout_s)"
    )
    assert message.endswith(RAY_STATUS_THREE_NODES)


def test_the_head_address_is_the_host_names_unless_loopback_then_the_first_other_interface_address():
    assert node_address("10.0.0.5", ["127.0.0.1", "10.0.0.5"]) == "10.0.0.5"
    assert node_address("127.0.1.1", ["127.0.0.1", "192.168.1.4", "10.0.0.5"]) == "192.168.1.4"  # Debian's /etc/hosts
    assert node_address(None, ["127.0.0.1", "10.0.0.5"]) == "10.0.0.5"  # the host name does not resolve
    assert node_address("127.0.1.1", ["127.0.0.1"]) == "127.0.0.1"  # no other interface


def test_a_jobs_temporary_folder_goes_under_tmpdir_unless_rays_socket_paths_there_would_pass_the_unix_limit():
    longest = "/" + "t" * (UNIX_SOCKET_PATH_MAX - len(RAY_SOCKET_UNDER_JOB_TEMP) - 1)  # 17 bytes
    assert job_temp_parent("/tmp") == "/tmp"
    assert job_temp_parent("/tmp/ngs-lzbcnmow") == "/tmp/ngs-lzbcnmow"  # the suite's own, 17 bytes
    assert job_temp_parent("/tmp/ngsuite-lzbcnmow") == "/tmp"  # its earlier name: Ray's dashboard would fail there
    assert job_temp_parent(longest) == longest
    assert job_temp_parent(longest + "/") == longest + "/"  # a trailing slash adds nothing to the paths
    assert job_temp_parent(longest + "t") == "/tmp"
    # Measured in bytes, as the kernel does: two characters of two bytes each pass where two of one byte fit.
    assert job_temp_parent(longest[:-2] + "éé") == "/tmp"
    assert job_temp_parent("/scratch/alice/1234567/tmp", fallback="/var/tmp") == "/var/tmp"
