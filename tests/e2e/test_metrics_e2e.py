"""The agents' /metrics in a local cluster: ``cluster up`` turns them on, bound to
127.0.0.1 inside each node's namespace, and ``cluster status`` says where they are.

One 1-node cluster with two pods for the module: the node's /metrics (read from inside
its namespace) carries process_*, podnet_build_info, the CNI ADDs of the two pods and
the node subnet's IPAM usage; neither a pod nor the root namespace reaches it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Network
from pathlib import Path

import pytest

from podnet import netns
from podnet.cluster import lifecycle, nodes, pods
from podnet.cluster.state import ClusterState
from podnet.model.kinds import HOST_SUBNET
from podnet.testing.dnsflood import metrics
from podnet.testing.e2e import TEST_DATAPLANE, cluster_down_with_logs
from podnet.testing.metricstext import sample

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(300)]

PODS = ("m1", "m2")


@dataclass
class Cluster:
    state_dir: Path
    node_netns: str
    node_ip: str
    port: int
    pod_netns: str
    gateway: str  # the node's address on its pod subnet


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state_dir = tmp_path_factory.mktemp("pn-metrics") / "state"
    try:
        spec = lifecycle.ClusterSpec(nodes=1, dataplane=TEST_DATAPLANE)
        lifecycle.cluster_up(state_dir, spec, say=print)
        made = [pods.run_pod(state_dir, name, node="node1") for name in PODS]
        with pods.admin_api(state_dir) as api:
            subnet = IPv4Network(api.get(HOST_SUBNET, None, "node1")["subnet"])
        state = ClusterState.load(state_dir)
        assert state is not None
        node = state.nodes["node1"]
        gateway = str(subnet.network_address + 1)
        yield Cluster(state_dir, node.netns, node.ip, node.metrics_port, made[0].netns, gateway)
    finally:
        cluster_down_with_logs(state_dir)


def test_the_agent_serves_its_metrics_in_the_node_namespace(cluster: Cluster) -> None:
    assert cluster.port == nodes.AGENT_METRICS_PORT
    text = metrics(cluster.node_netns, cluster.port)
    assert (sample(text, "process_resident_memory_bytes") or 0) > 0
    assert (sample(text, "process_open_fds") or 0) > 0
    assert (sample(text, "process_cpu_seconds_total") or 0) > 0
    assert sample(text, "podnet_build_info") == 1.0
    added = sample(text, "podnet_cni_requests_total", command="ADD", result="ok")
    assert added == len(PODS), text
    assert sample(text, "podnet_cni_request_duration_seconds_count", command="ADD") == len(PODS)
    assert sample(text, "podnet_ipam_addresses_allocated") == len(PODS)
    capacity = sample(text, "podnet_ipam_addresses_capacity")
    assert capacity is not None and capacity > len(PODS)
    assert "m1" not in text and "m2" not in text  # no pod name in any label


def test_the_listener_is_on_the_node_loopback_only(cluster: Cluster) -> None:
    listening = netns.run(cluster.node_netns, ["ss", "-Hltn", f"sport = :{cluster.port}"])
    local = {line.split()[3] for line in listening.stdout.splitlines() if line.strip()}
    assert local == {f"127.0.0.1:{cluster.port}"}
    # a pod (the attacker's side) cannot reach it, through its gateway or the node's IP
    for host in (cluster.gateway, cluster.node_ip):
        url = f"http://{host}:{cluster.port}/metrics"
        tried = netns.run(cluster.pod_netns, ["curl", "-sf", "--max-time", "3", url])
        assert tried.returncode != 0, (host, tried.stdout)
    # and the node's other side, the underlay: its address is not one the listener has
    assert f"{cluster.node_ip}:{cluster.port}" not in listening.stdout


def test_cluster_status_says_where_the_metrics_are(cluster: Cluster) -> None:
    argv = [sys.executable, "-m", "podnet", "cluster", "status"]
    argv += ["--state-dir", str(cluster.state_dir)]
    shown = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    where = f"metrics: http://127.0.0.1:{cluster.port}/metrics in netns {cluster.node_netns}"
    assert where in shown.stdout, shown.stdout
