"""The whole local cluster, for real: etcd, master, 3 node namespaces with real agents,
2 pods per node wired by the real CNI plugin, for the vxlan and host-gw backends.

Each backend gets its own cluster (random id, its own state dir), torn down in a
finalizer even when a test fails; the finalizer then checks that no namespace or process
of it is left. Every traffic loop is bounded (ping counts, timeouts).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

import pytest

from podnet import netns
from podnet.cluster import lifecycle, matrix, nodes, pods
from podnet.cluster.state import ClusterState
from podnet.cluster.underlay import external_log
from podnet.testing import planeview
from podnet.testing.e2e import TEST_DATAPLANE, Ping, wait_for
from podnet.testing.e2e import load_state as load

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(600)]

NODES = 3
PODS_PER_NODE = 2


@pytest.fixture(scope="module", params=["vxlan", "host-gw"])
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """A 3-node cluster with 2 echo pods per node; yields its state dir."""
    state_dir = tmp_path_factory.mktemp(f"pn-{request.param}")
    try:
        spec = lifecycle.ClusterSpec(nodes=NODES, tunnel=request.param, dataplane=TEST_DATAPLANE)
        lifecycle.cluster_up(state_dir, spec, say=print)
        for k in range(1, NODES + 1):
            for j in range(PODS_PER_NODE):
                pods.run_pod(state_dir, f"p{k}{'ab'[j]}", node=f"node{k}", labels={"app": "e2e"})
        yield state_dir
    finally:
        _down_and_check(state_dir)


def _down_and_check(state_dir: Path) -> None:
    state = ClusterState.load(state_dir)
    for name in state.nodes if state else ():
        log = nodes.node_paths(state_dir, name).agent_log
        print(f"--- {log} (tail)\n{nodes.log_tail(log, 15)}")  # shown when a test failed
    switches = planeview.switch_pids(state_dir, state) if state else {}
    lifecycle.cluster_down(state_dir, say=print)
    if state is None:
        return
    assert not planeview.switches_left(switches), "OVS daemons left"
    left = [name for name in state.namespaces if netns.exists(name)]
    assert not left, f"namespaces left behind: {left}"
    records = [n.agent for n in state.nodes.values()] + [p.process for p in state.pods.values()]
    assert not [r.pid for r in records if r is not None and r.alive()], "processes left"
    assert not state_dir.exists()


def ip_json(namespace: str, *args: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        ["ip", "-j", "-n", namespace, *args], capture_output=True, text=True, check=True, timeout=10
    )
    return list(json.loads(out.stdout or "[]"))


def ip_text(namespace: str, *args: str) -> str:
    return subprocess.run(
        ["ip", "-n", namespace, *args], capture_output=True, text=True, check=True, timeout=10
    ).stdout


def link_snapshot(namespace: str) -> dict[str, tuple[Any, ...]]:
    """Every link: ifindex, MTU, MAC, master, kind (from ``ip -d link``)."""
    return {
        link["ifname"]: (
            link["ifindex"],
            link.get("mtu"),
            link.get("address"),
            link.get("master"),
            (link.get("linkinfo") or {}).get("info_kind"),
        )
        for link in ip_json(namespace, "-d", "link", "show")
    }


def addr_snapshot(namespace: str) -> set[tuple[str, str]]:
    """Every IPv4 address with the link holding it (from ``ip addr``)."""
    return {
        (link["ifname"], f"{a['local']}/{a['prefixlen']}")
        for link in ip_json(namespace, "-4", "addr", "show")
        for a in link.get("addr_info", [])
    }


def test_full_mesh_ping_and_tcp(cluster: Path) -> None:
    state = load(cluster)
    endpoints = lifecycle.endpoints(state)
    assert len(endpoints) == NODES * PODS_PER_NODE
    assert len({e.ip for e in endpoints}) == len(endpoints)
    results = matrix.run_matrix(endpoints)
    table = matrix.render_matrix(endpoints, results)
    print(table)
    assert len(results) == len(endpoints) * (len(endpoints) - 1)
    assert all(r.ok for r in results), table


def test_cluster_up_again_changes_nothing(cluster: Path) -> None:
    before = load(cluster)
    lifecycle.cluster_up(
        cluster,
        lifecycle.ClusterSpec(nodes=NODES, tunnel=before.tunnel, dataplane=before.dataplane),
        say=print,
    )
    after = load(cluster)
    assert after.namespaces == before.namespaces
    assert {n: r.agent for n, r in after.nodes.items()} == {
        n: r.agent for n, r in before.nodes.items()
    }
    assert (after.master_pid, after.etcd_pid) == (before.master_pid, before.etcd_pid)


def test_pod_reaches_the_external_host_through_nat(cluster: Path) -> None:
    state = load(cluster)
    assert state.external is not None
    pod = state.pods["default/p1a"]
    source = matrix.Endpoint(pod.name, pod.node, pod.ip, pod.netns)
    assert matrix.ping_probe(source, state.external.ip).ok
    assert matrix.tcp_probe(source, state.external.ip).ok
    # The external host has no route to the cluster network: the answer came back only
    # because the node masqueraded the pod's address to its own.
    routes = ip_text(state.external.netns, "route").splitlines()
    assert routes and all(line.startswith(state.underlay_cidr) for line in routes), routes
    log = external_log(cluster).read_text()
    node_ip = state.nodes[pod.node].ip
    assert re.search(rf"tcp connection from {re.escape(node_ip)}:\d+", log), log
    assert f"from {pod.ip}:" not in log


def test_agent_crash_and_restart_lose_no_packet(cluster: Path) -> None:
    state = load(cluster)
    src, dst = state.pods["default/p1a"], state.pods["default/p2a"]
    restarted = [state.nodes["node1"], state.nodes["node2"]]
    links = {n.name: link_snapshot(n.netns) for n in restarted}
    addrs = {n.name: addr_snapshot(n.netns) for n in restarted}
    flows = {n.name: planeview.switch_flows(cluster, state, n.name) for n in restarted}
    old_pids = {n.name: n.agent.pid for n in restarted if n.agent}
    ping = Ping(src.netns, dst.ip, 400, 0.02)
    try:
        ping.flowing()
        for node in restarted:
            nodes.stop_agent(node, signal.SIGKILL, timeout=5)
        for node in restarted:
            nodes.start_agent(state, node, cluster)
        with pods.admin_api(cluster) as api:
            for node in restarted:
                nodes.wait_agent_ready(node, cluster, api)
        assert ping.running(), "the agents restarted after the ping had ended"
    finally:
        out = ping.finish(60)
    assert "400 packets transmitted, 400 received" in out, out
    for node in restarted:
        assert node.agent is not None and node.agent.pid != old_pids[node.name]
        assert link_snapshot(node.netns) == links[node.name], f"links changed on {node.name}"
        assert addr_snapshot(node.netns) == addrs[node.name], f"addresses changed on {node.name}"
        now = planeview.switch_flows(cluster, state, node.name)
        assert now == flows[node.name], f"OpenFlow table changed on {node.name}"
    again = matrix.probe_pair(
        matrix.Endpoint(src.name, src.node, src.ip, src.netns),
        matrix.Endpoint(dst.name, dst.node, dst.ip, dst.netns),
    )
    assert again.ok, again


def test_pod_commands_through_the_cli(cluster: Path) -> None:
    podnet = [sys.executable, "-m", "podnet"]
    flag = ["--state-dir", str(cluster)]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*podnet, *args], capture_output=True, text=True, timeout=120)

    created = run("pod", "run", "cli-pod", "-n", "e2e", "--node", "node2", "-l", "tier=x", *flag)
    assert created.returncode == 0, created.stderr
    pod = load(cluster).pods["e2e/cli-pod"]
    assert pod.node == "node2" and pod.labels == {"tier": "x"} and pod.ip in created.stdout
    shown = run(
        "pod", "exec", "cli-pod", "-n", "e2e", *flag, "--", "ip", "-4", "-o", "addr", "show", "eth0"
    )
    assert shown.returncode == 0 and f"inet {pod.ip}/" in shown.stdout, shown
    status = run("cluster", "status", *flag)
    assert status.returncode == 0 and status.stdout.count("healthy (") == NODES, status.stdout
    table = run("cluster", "matrix", "-n", "e2e", "-n", "default", *flag)
    assert table.returncode == 0, table.stdout
    deleted = run("pod", "delete", "cli-pod", "-n", "e2e", *flag)
    assert deleted.returncode == 0, deleted.stderr
    assert not netns.exists(pod.netns)
    assert "e2e/cli-pod" not in load(cluster).pods
    with pods.admin_api(cluster) as api:
        assert not api.list("pods", namespace="e2e")["items"]


def test_deleting_a_node_removes_its_routes_and_fdb_and_releases_its_subnet(cluster: Path) -> None:
    state = load(cluster)
    gone, others = state.nodes["node3"], [state.nodes["node1"], state.nodes["node2"]]
    with pods.admin_api(cluster) as api:
        subnet = nodes.host_subnet(api, gone.name)
        assert subnet
        # Routes (both backends) and, for vxlan, FDB entries (linux) or br0 flows (ovs)
        # towards node3 exist first.
        for node in others:
            text = planeview.remote_node_state(cluster, state, node)
            assert subnet in text or gone.ip in text, text
        nodes.stop_agent(gone)  # so it cannot register its Node again
        api.delete("nodes", None, gone.name)
        wait_for(lambda: nodes.host_subnet(api, gone.name) is None, 30, "HostSubnet released")

    def forgotten() -> bool:
        return all(
            subnet not in (text := planeview.remote_node_state(cluster, state, n))
            and gone.ip not in text
            for n in others
        )

    wait_for(forgotten, 30, f"routes/FDB of {gone.name} removed from the other nodes")
    for node in others:
        static = [line for line in ip_text(node.netns, "neigh").splitlines() if "PERMANENT" in line]
        stale = [line for line in static if ip_address(line.split()[0]) in ip_network(subnet)]
        assert not stale, f"static neighbour entries for {subnet} left on {node.name}: {stale}"
