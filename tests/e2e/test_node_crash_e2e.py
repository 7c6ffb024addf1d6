"""Issue 8 finding 4 on the real kernel: an agent SIGKILLed with 20 ADDs in flight, then
damaged IPAM files planted (0 bytes, garbage, a live pod's file torn), then a restart.

A 1-node cluster (etcd, master, agent in its node namespace, linux data plane); CNI
calls go through the installed shim inside the node namespace, as a runtime makes them.
After the restart the agent serves, every IPAM file names its owner, every address is
held once and matches one wired pod port (veth + anti-spoofing element), and after DEL
of everything nothing is left.
"""

from __future__ import annotations

import json
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from ipaddress import IPv4Network
from pathlib import Path

import pytest
from test_runtime import cni, node_record

from podnet import netns
from podnet.cluster import lifecycle, nodes
from podnet.cluster.state import ClusterState
from podnet.ipam.reservations import well_formed
from podnet.testing import planeview
from podnet.testing.chaos import quick_api
from podnet.testing.chaoscheck import ipam_files, pod_veths
from podnet.testing.e2e import TEST_DATAPLANE, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(600)]
NETWORK = "podnet"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state_dir = tmp_path_factory.mktemp("pn-crash")
    try:
        lifecycle.cluster_up(
            state_dir, lifecycle.ClusterSpec(nodes=1, dataplane=TEST_DATAPLANE), say=print
        )
        yield state_dir
    finally:
        lifecycle.cluster_down(state_dir, say=print)


def _wait(condition: Callable[[], bool], what: str, timeout: float) -> None:
    wait_for(condition, timeout, what, interval=0.05)


def test_sigkill_with_twenty_adds_in_flight_and_damaged_files(cluster: Path) -> None:
    node_ns = node_record(cluster, "node1").netns
    ipam_dir = nodes.node_paths(cluster, "node1").ipam_dir / NETWORK
    before_veths, (before_held, _) = pod_veths(node_ns), ipam_files(cluster, "node1")
    tag = uuid.uuid4().hex[:4]
    live = [f"{node_ns[:9]}-l{tag}{i}" for i in range(3)]
    flight = [f"{node_ns[:9]}-f{tag}{i}" for i in range(20)]
    for name in live + flight:
        netns.create(name)
    try:
        for name in live:
            assert cni(cluster, "node1", "ADD", name, name).returncode == 0
        threads = [
            threading.Thread(target=cni, args=(cluster, "node1", "ADD", n, n)) for n in flight
        ]
        for thread in threads:
            thread.start()
        _wait(lambda: len(ipam_files(cluster, "node1")[0]) >= len(before_held) + 6, "ADDs", 60)
        state = ClusterState.load(cluster)
        assert state is not None
        nodes.stop_agent(state.nodes["node1"], signal.SIGKILL, timeout=5)
        for thread in threads:
            thread.join(120)

        held, _ = ipam_files(cluster, "node1")
        torn = next(ip for ip, cid in held.items() if cid == live[0])
        subnet = IPv4Network(nodes.host_subnet(quick_api(cluster), "node1") or "")
        hosts = list(subnet.hosts())
        empty, garbage = str(hosts[-1]), str(hosts[-2])
        (ipam_dir / empty).write_bytes(b"")
        (ipam_dir / garbage).write_bytes(b"\x00\x01 \xfe\xff")
        (ipam_dir / torn).write_bytes(b"")

        nodes.start_agent(state, state.nodes["node1"], cluster)
        nodes.wait_agent_ready(state.nodes["node1"], cluster, quick_api(cluster))

        held, strays = ipam_files(cluster, "node1")
        assert strays == []
        texts = [(ipam_dir / ip).read_bytes().decode() for ip in held]
        assert all(well_formed(t) for t in texts), texts
        assert empty not in held and garbage not in held
        assert held[torn] == live[0]  # rewritten for the pod that has the address
        assert set(live) <= set(held.values())
        ports = {ip for _, _, ip in planeview.anti_spoofing(cluster, state, "node1")}
        assert ports == set(held)  # every held address is wired once, nothing else is
        assert len(pod_veths(node_ns)) == len(held)
        fresh = f"{node_ns[:9]}-n{tag}"
        netns.create(fresh)
        flight.append(fresh)  # cleaned up with the others
        answer = cni(cluster, "node1", "ADD", fresh, fresh)
        assert answer.returncode == 0, answer.stdout
        assert json.loads(answer.stdout)["ips"][0]["address"].split("/")[0] not in held
    finally:
        for name in live + flight:
            cni(cluster, "node1", "DEL", name, name if netns.exists(name) else None)
            netns.remove(name)
    assert pod_veths(node_ns) == before_veths
    assert ipam_files(cluster, "node1")[0] == before_held
