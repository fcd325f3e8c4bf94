# SPDX-License-Identifier: Apache-2.0
"""The pure parts of the two-node test cluster (tests/support/netns_nodes.py, slurm_cluster.py's multi-node config)."""

from __future__ import annotations

import ipaddress
import random

from tests.support import slurm_cluster
from tests.support.netns_nodes import NodeNetwork, free_subnet, hosts_text


def test_a_free_subnet_overlaps_no_network_of_the_machine():
    used = ["127.0.0.1/8", "192.0.2.2/24"] + [f"10.{a}.{b}.1/24" for a in range(200, 250) for b in range(256) if b]
    subnet = free_subnet(used, random.Random(0))
    assert subnet.prefixlen == 24 and subnet.network_address.packed[2] == 0  # the only 10.x.y left: y = 0
    assert not any(subnet.overlaps(ipaddress.ip_network(u, strict=False)) for u in used)


def test_the_hosts_file_names_every_node_and_the_controller():
    assert hosts_text({"vm": "10.1.2.254", "node1": "10.1.2.1"}) == (
        "127.0.0.1 localhost\n10.1.2.254 vm\n10.1.2.1 node1\n"
    )


def test_a_node_command_enters_its_namespace_name_hosts_and_private_folders(tmp_path):
    network = NodeNetwork(["node1"], controller="vm", seed=1, base_dir=str(tmp_path))  # not started: names only
    network.node_temp.rmdir()  # the one folder made outside base_dir
    assert len(str(network.node_temp)) == 17
    argv = network.on_node("node1", ["slurmd", "-D"])
    assert argv[1] == f"--net=/run/netns/ng{network.tag}-node1" and argv[2].endswith("unshare")
    assert argv[-2:] == ["slurmd", "-D"]
    node, hosts, private, shared = argv[-6:-2]
    assert (node, hosts, shared) == ("node1", str(network.root / "hosts"), str(network.node_temp))
    assert network.private_temp("node1") == network.root / "nodes" / "node1" / "tmp" and private.endswith("node1")


def test_a_multi_node_slurm_config_lists_each_node_at_its_address_and_its_partitions(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm_cluster, "node_hardware", lambda: {"CPUs": "2", "RealMemory": "1000"})
    network = NodeNetwork(["node1", "node2", "cpu1"], controller="vm", base_dir=str(tmp_path))
    network.node_temp.rmdir()
    network.addresses = {"vm": "10.9.9.254", "node1": "10.9.9.1", "node2": "10.9.9.2", "cpu1": "10.9.9.3"}
    cluster = slurm_cluster.SlurmCluster(
        base_dir=tmp_path, network=network, partitions={"gpu": ["node1", "node2"], "cpu": ["cpu1"]}
    )
    cluster.write_config()
    lines = cluster.conf.read_text().splitlines()
    assert f"SlurmctldHost={cluster.node}(10.9.9.254)" in lines
    assert "NodeName=node2 NodeAddr=10.9.9.2 CPUs=2 RealMemory=1000 State=UNKNOWN" in lines
    assert "PartitionName=gpu Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP" in lines
    assert "PartitionName=cpu Nodes=cpu1 Default=NO MaxTime=INFINITE State=UP" in lines
    assert f"SlurmdSpoolDir={cluster.root}/spool-%n" in lines  # one per node: slurmd substitutes its name
