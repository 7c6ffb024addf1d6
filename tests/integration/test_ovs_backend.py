"""The ovs data plane with real OVS daemons and real traffic, inside namespaces only.

A lab per test (``podnet.testing.lab``: an underlay, an outside host, nodes, pods); each
node runs its own ``ovsdb-server`` and ``ovs-vswitchd`` (userspace datapath) under a short
directory of this run, stopped by PID and removed afterwards, even when a test fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator
from ipaddress import IPv4Address
from pathlib import Path

import pytest

from podnet import netns
from podnet.dataplane.interface import NodeNetwork
from podnet.dataplane.ovs.backend import OvsDataPlane
from podnet.dataplane.ovs.daemons import VSWITCHD, stop_instance
from podnet.model.network import MULTITENANT
from podnet.policy.model import RuleSet, VnidIsolation
from podnet.services.model import Endpoint, ServicePort, ServiceTable
from podnet.testing.lab import (
    EXTERNAL_IP,
    TCP_PORT,
    Lab,
    assert_spoofing_dropped,
    built_lab,
    ping,
    sh,
    tcp_peer_seen,
)

pytestmark = [pytest.mark.root]

SETTLE = 10.0  # seconds to wait for a condition that a restart restores


class OvsLab:
    """OVS data planes on lab nodes; ``open`` again is a restarted agent."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.planes: dict[int, OvsDataPlane] = {}
        self.bases: dict[int, Path] = {}

    def base(self, i: int) -> Path:
        return self.bases.setdefault(i, Path("/tmp") / f"{self.lab.run}-o{i}")

    def open(self, i: int) -> OvsDataPlane:
        with netns.entered(self.lab.node_ns(i)):
            self.planes[i] = OvsDataPlane(self.base(i))
        return self.planes[i]

    async def up(
        self, nodes: list[int], tunnel: str = "vxlan", **overrides: object
    ) -> dict[int, OvsDataPlane]:
        for i in nodes:
            await self.open(i).setup_node(self.lab.network(i, tunnel, **overrides))
        for i in nodes:
            remotes = [self.lab.remote(j) for j in nodes if j != i]
            node = self.lab.network(i, tunnel, **overrides)
            await self.planes[i].sync_remote_nodes(node, remotes)
        return self.planes

    def flows(self, i: int, *, stats: bool = False) -> str:
        """br0's flows on node ``i``; ``stats``: with counters, brought up to date first
        (the datapath hands them to the flows once per revalidator round)."""
        argv = ["ovs-ofctl", "-O", "OpenFlow13", "--no-names", "dump-flows", "br0"]
        env = self.planes[i].daemons.paths.env()
        if stats:
            ctl = str(self.planes[i].daemons.paths.unixctl(VSWITCHD))
            wait = ["ovs-appctl", "-t", ctl, "revalidator/wait"]
            subprocess.run(wait, capture_output=True, check=True, timeout=30)
        else:
            argv.insert(4, "--no-stats")
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30)
        return done.stdout if done.returncode == 0 else ""

    async def close(self) -> None:
        try:
            for plane in self.planes.values():
                await plane.close()
        finally:
            for base in self.bases.values():
                stop_instance(base, remove=True)
                shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
async def ovs() -> AsyncIterator[OvsLab]:
    async with built_lab("pno") as lab:
        the_lab = OvsLab(lab)
        try:
            yield the_lab
        finally:
            await the_lab.close()


async def until(what: str, check: object, limit: float = SETTLE) -> None:
    """Wait (polling) until ``check()`` is true; fail with ``what`` after ``limit`` s."""
    assert callable(check)
    deadline = asyncio.get_running_loop().time() + limit
    while not check():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.05)


def multitenant(vnids: dict[IPv4Address, int]) -> RuleSet:
    isolation = VnidIsolation(tuple(sorted(vnids.items())))
    return RuleSet(MULTITENANT, (), frozenset(), isolation=isolation)


# --- traffic ---------------------------------------------------------------------------


async def test_vxlan_pods_reach_each_other_the_host_and_the_outside(ovs: OvsLab) -> None:
    lab = ovs.lab
    planes = await ovs.up([1, 2])
    a_ns, a = lab.pod(1, 10, "a")
    _, b = lab.pod(1, 11, "b")
    c_ns, c = lab.pod(2, 10, "c")
    for node, pod in ((1, a), (1, b), (2, c)):
        await planes[node].attach_pod(pod)

    assert ping(a_ns, b.address.ip), "same-node pod to pod"
    assert ping(a_ns, c.address.ip), "cross-node pod to pod over VXLAN"
    assert ping(c_ns, b.address.ip), "cross-node, the other way"
    assert ping(a_ns, a.gateway), "pod to its gateway (tun0)"
    assert ping(lab.node_ns(1), c.address.ip), "a node to another node's pod"
    assert tcp_peer_seen(c_ns, a_ns, a.address.ip) == str(c.address.ip), "no NAT in cluster"
    seen = tcp_peer_seen(a_ns, f"{lab.run}-ext", EXTERNAL_IP)
    assert seen == str(lab.node_ip(1)), "pod traffic to the outside is masqueraded"
    for i in (1, 2):
        status = await planes[i].check_node(lab.network(i))
        assert status.ok, status.problems


async def test_host_gw_pods_reach_each_other(ovs: OvsLab) -> None:
    lab = ovs.lab
    planes = await ovs.up([1, 2], tunnel="host-gw")
    a_ns, a = lab.pod(1, 10, "a")
    c_ns, c = lab.pod(2, 10, "c")
    await planes[1].attach_pod(a)
    await planes[2].attach_pod(c)
    assert ping(a_ns, c.address.ip), "cross-node pod to pod over host-gw routes"
    assert tcp_peer_seen(a_ns, c_ns, c.address.ip) == str(a.address.ip)
    assert "vxlan0" not in sh(lab.node_ns(1), "ip", "link")


async def test_spoofed_ip_and_mac_are_dropped(ovs: OvsLab) -> None:
    lab = ovs.lab
    planes = await ovs.up([1])
    a_ns, a = lab.pod(1, 10, "a")
    _, b = lab.pod(1, 11, "b")
    await planes[1].attach_pod(a)
    await planes[1].attach_pod(b)
    assert ping(a_ns, b.address.ip)

    assert_spoofing_dropped(a_ns, a, b)


async def test_multitenant_vnids_isolate_across_nodes_and_a_join_is_live(ovs: OvsLab) -> None:
    lab = ovs.lab
    planes = await ovs.up([1, 2])
    a_ns, a = lab.pod(1, 10, "a")  # project 10, node 1
    c_ns, c = lab.pod(2, 10, "c")  # project 11, node 2
    _, d = lab.pod(2, 11, "d")  # project 10, node 2
    _, g = lab.pod(2, 12, "g")  # global (VNID 0), node 2
    for node, pod in ((1, a), (2, c), (2, d), (2, g)):
        await planes[node].attach_pod(pod)
    vnids = {a.address.ip: 10, c.address.ip: 11, d.address.ip: 10, g.address.ip: 0}
    for i in (1, 2):
        await planes[i].sync_policy(lab.network(i), multitenant(vnids))

    assert ping(a_ns, d.address.ip), "same VNID across nodes"
    assert ping(a_ns, g.address.ip), "to a global pod"
    assert not ping(a_ns, c.address.ip, count=2), "another VNID across nodes"
    assert not ping(c_ns, a.address.ip, count=2), "another VNID, the other way"
    joined = multitenant({**vnids, c.address.ip: 10})
    for i in (1, 2):
        await planes[i].sync_policy(lab.network(i), joined)
    assert ping(c_ns, a.address.ip), "joined live, without restarting a pod"


async def test_a_service_reaches_endpoints_here_and_there_with_the_clients_address(
    ovs: OvsLab,
) -> None:
    """A pod's connection to a cluster IP is DNATed by the host's nftables (reached
    through tun0); the replies go back through tun0, here and from another node. (With
    isolation on, the service proxy keeps the client's address between local pods.)"""
    lab = ovs.lab
    planes = await ovs.up([1, 2], isolation=True)
    a_ns, a = lab.pod(1, 10, "a")
    b_ns, b = lab.pod(1, 11, "b")
    c_ns, c = lab.pod(2, 10, "c")
    for node, pod in ((1, a), (1, b), (2, c)):
        await planes[node].attach_pod(pod)
    cluster_ip = lab.network(1).service_network.network_address + 10
    for endpoint_ns, endpoint in ((b_ns, b), (c_ns, c)):
        port = ServicePort(
            "x",
            "s",
            "",
            "tcp",
            TCP_PORT,
            cluster_ip,
            endpoints=(Endpoint(endpoint.address.ip, TCP_PORT),),
        )
        await planes[1].sync_services(lab.network(1, isolation=True), ServiceTable((port,)))
        seen = tcp_peer_seen(a_ns, endpoint_ns, endpoint.address.ip, via=cluster_ip)
        assert seen == str(a.address.ip), f"to {endpoint.address.ip} through the service"


# --- restarts ----------------------------------------------------------------------------


async def test_a_restarted_plane_changes_no_flow(ovs: OvsLab) -> None:
    lab = ovs.lab
    planes = await ovs.up([1, 2])
    node: NodeNetwork = lab.network(1)
    a_ns, a = lab.pod(1, 10, "a")
    _, c = lab.pod(2, 10, "c")
    await planes[1].attach_pod(a)
    await planes[2].attach_pod(c)
    rules = multitenant({a.address.ip: 10, c.address.ip: 10})
    for i in (1, 2):
        await planes[i].sync_policy(lab.network(i), rules)
    assert ping(a_ns, c.address.ip)
    before, counted = ovs.flows(1), ovs.flows(1, stats=True)

    await planes[1].close()
    restarted = ovs.open(1)  # as the agent starts again: check, remotes, pods, policy
    assert (await restarted.check_node(node)).ok
    await restarted.sync_remote_nodes(node, [lab.remote(2)])
    assert await restarted.attached_pods()
    _, b = lab.pod(1, 11, "b")
    await restarted.attach_pod(b)  # a new pod before the rules are known: no VNID yet
    await restarted.detach_pod(b.container_id, b.ifname, b.netns)
    await restarted.sync_policy(node, rules)
    assert ovs.flows(1) == before, "byte-identical"
    assert _packets(ovs.flows(1, stats=True)) >= _packets(counted), "no flow was re-added"
    assert ping(a_ns, c.address.ip)


def _packets(dump: str) -> int:
    """The packets counted by br0's flows: re-adding a flow resets its counter."""
    return sum(
        int(part.split("=")[1].rstrip(","))
        for line in dump.splitlines()
        for part in line.split()
        if part.startswith("n_packets=")
    )


async def test_a_killed_vswitchd_is_restarted_and_the_node_reprogrammed(ovs: OvsLab) -> None:
    lab = ovs.lab
    planes = await ovs.up([1, 2])
    a_ns, a = lab.pod(1, 10, "a")
    _, c = lab.pod(2, 10, "c")
    await planes[1].attach_pod(a)
    await planes[2].attach_pod(c)
    assert ping(a_ns, c.address.ip)
    before = ovs.flows(1)
    pid = planes[1].daemons.pid(VSWITCHD)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    await until("vswitchd restarted", lambda: planes[1].daemons.pid(VSWITCHD) not in (None, pid))
    # the same flows (listed in another order among equal priorities: they were re-added)
    await until(
        "flows reprogrammed", lambda: sorted(ovs.flows(1).split("\n")) == sorted(before.split("\n"))
    )
    assert ping(a_ns, c.address.ip), "traffic is back"
    status = await planes[1].check_node(lab.network(1))
    assert status.ok, status.problems


# --- attacks ------------------------------------------------------------------------------


def delivered(ovs: OvsLab, node: int, ip: IPv4Address) -> int:
    """Packets br0 of ``node`` has delivered to local pod ``ip`` (its LOCAL flow)."""
    for line in ovs.flows(node, stats=True).splitlines():
        if "table=70," in line and f"nw_dst={ip} " in line:
            return int(line.split("n_packets=")[1].split(",")[0])
    raise AssertionError(f"no delivery flow for {ip}")


async def test_a_pod_cannot_route_around_br0_through_its_veths_host_end(ovs: OvsLab) -> None:
    """The node's kernel sees the frames of a pod's veth host end too: a spoofed packet
    sent to that end's MAC (learned by hand) must not be routed by the host, around br0's
    anti-spoofing."""
    lab = ovs.lab
    planes = await ovs.up([1, 2])
    a_ns, a = lab.pod(1, 10, "a")
    _, c = lab.pod(2, 10, "c")
    host_end = (await planes[1].attach_pod(a)).host_ifname
    await planes[2].attach_pod(c)
    assert ping(a_ns, c.address.ip)
    (link,) = json.loads(sh(lab.node_ns(1), "ip", "-j", "link", "show", "dev", host_end))
    mac = link["address"]
    sh(a_ns, "ip", "addr", "add", "10.128.0.77/23", "dev", "eth0")
    sh(a_ns, "ip", "neigh", "replace", str(a.gateway), "lladdr", mac, "dev", "eth0")
    before = delivered(ovs, 2, c.address.ip)
    assert not ping(a_ns, c.address.ip, "-I", "10.128.0.77", count=3)
    assert delivered(ovs, 2, c.address.ip) == before, "the spoofed packets reached c"


async def test_a_vnid_the_receiver_does_not_know_for_the_source_is_dropped(ovs: OvsLab) -> None:
    """Multitenant: the VNID in tun_id is checked against the VNID the receiving node
    knows for the inner source; a sender that claims another one is not believed."""
    lab = ovs.lab
    planes = await ovs.up([1, 2])
    _, a = lab.pod(1, 10, "a")
    c_ns, c = lab.pod(2, 10, "c")
    await planes[1].attach_pod(a)
    await planes[2].attach_pod(c)
    truth = multitenant({a.address.ip: 10, c.address.ip: 11})
    await planes[1].sync_policy(lab.network(1), truth)
    lie = multitenant({a.address.ip: 10, c.address.ip: 10})  # node 2 puts c in a's project
    await planes[2].sync_policy(lab.network(2), lie)
    before = delivered(ovs, 1, a.address.ip)
    assert not ping(c_ns, a.address.ip, count=3)
    assert delivered(ovs, 1, a.address.ip) == before
    await planes[1].sync_policy(lab.network(1), lie)  # both agree: it passes
    assert ping(c_ns, a.address.ip)


async def test_the_first_packet_to_a_new_node_is_not_lost(ovs: OvsLab) -> None:
    """sync_remote_nodes has OVS resolve the new node's MAC (the userspace tunnel drops
    a packet whose next hop it has not resolved yet)."""
    lab = ovs.lab
    planes = await ovs.up([1, 2])
    a_ns, a = lab.pod(1, 10, "a")
    _, c = lab.pod(2, 10, "c")
    await planes[1].attach_pod(a)
    await planes[2].attach_pod(c)
    ctl = planes[1].daemons.paths.unixctl(VSWITCHD)

    def resolved() -> bool:
        argv = ["ovs-appctl", "-t", str(ctl), "tnl/neigh/show"]
        return str(lab.node_ip(2)) in subprocess.run(argv, capture_output=True, text=True).stdout

    await until("node 2's MAC resolved", resolved)
    assert ping(a_ns, c.address.ip, count=1), "the first packet arrives"
