"""VXLAN between two real OVS nodes on the userspace datapath, through br-phy.

Two node namespaces on a lab underlay (``podnet.testing.lab``), each with its own
``ovsdb-server``/``ovs-vswitchd``, br0 and a pod. ``UnderlaySetup`` sets up br-phy and
vxlan0; the test writes br0's few forwarding flows itself (the pipeline is not under
test here): to the other node's subnet with the VNID in ``tun_id``, and from the tunnel
only with that VNID. Every namespace, process and directory is removed by exact name and
PID, also when a test fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from ipaddress import IPv4Address, IPv4Interface
from pathlib import Path

import pytest

from podnet import netns
from podnet.dataplane.interface import NodeSetupRefused
from podnet.dataplane.ovs import tables
from podnet.dataplane.ovs.daemons import VSWITCHD, OvsDaemons, stop_instance
from podnet.dataplane.ovs.ofctl import OfctlRunner
from podnet.dataplane.ovs.ovsdb import Ovsdb
from podnet.dataplane.ovs.underlay import UNDERLAY_BRIDGE, Underlay
from podnet.dataplane.ovs.underlaysetup import NodeKernel, UnderlaySetup
from podnet.dataplane.vteppeers import VtepPeer
from podnet.testing import tools
from podnet.testing.lab import (
    CLUSTER,
    EXTERNAL_IP,
    MTU,
    Lab,
    ip,
    ping,
    reaches,
    sh,
    unique_run,
)
from podnet.testing.underlayforge import Spoof, arp_reply, write_frames
from podnet.testing.underlayforge import inject as forge
from podnet.testing.vxlan import Forgery, Receiver, inject

pytestmark = [pytest.mark.root]

VNID = 0x123
POD_PORT = 3
BULK = """
import socket, sys
s = socket.socket(); s.settimeout(15)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(1); print("ready", flush=True)
conn, _ = s.accept(); total = 0
while chunk := conn.recv(65536):
    total += len(chunk)
conn.sendall(str(total).encode()); conn.close()
"""
SEND = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
c.sendall(b"x" * int(sys.argv[3])); c.shutdown(socket.SHUT_WR); print(c.recv(100).decode())
"""


@dataclass
class Node:
    index: int
    ns: str
    pod_ns: str
    daemons: OvsDaemons
    db: Ovsdb
    runner: OfctlRunner
    setup: UnderlaySetup
    kernel: NodeKernel
    underlay: Underlay

    @property
    def pod_ip(self) -> IPv4Address:
        return IPv4Address(f"10.128.{2 * (self.index - 1)}.2")


async def start_node(lab: Lab, index: int, base: Path) -> Node:
    """OVS in node ``index`` with br0, a pod on ofport 3, and the underlay ensured."""
    ns = lab.node_ns(index)
    with netns.entered(ns):
        daemons = OvsDaemons(base / f"n{index}")
    await daemons.start()
    db = await Ovsdb.connect(daemons.paths.db_socket)
    await db.ensure_bridge(tables.BRIDGE, daemons.datapath)
    pod_ns = lab.namespace(f"p{index}")
    pod = IPv4Interface(f"10.128.{2 * (index - 1)}.2/{CLUSTER.prefixlen}")
    ip(ns, f"link add pod{index} type veth peer name eth0 netns {pod_ns}")
    ip(ns, f"link set pod{index} up")
    ip(pod_ns, f"link set eth0 up mtu {MTU}")
    ip(pod_ns, f"addr add {pod} dev eth0")
    sh(pod_ns, "ethtool", "-K", "eth0", "tx", "off")  # veth checksum offload breaks TCP
    await db.add_port(tables.BRIDGE, f"pod{index}", ofport=POD_PORT)
    runner = OfctlRunner(daemons.paths)
    with netns.entered(ns):
        kernel = NodeKernel()
    setup = UnderlaySetup(db, runner, kernel)
    underlay = await setup.discover(lab.network(index), daemons.datapath)
    node = Node(index, ns, pod_ns, daemons, db, runner, setup, kernel, underlay)
    assert await setup.ensure(underlay), "a fresh node needs changes"
    return node


async def forward(node: Node, peer: Node, send_vnid: int = VNID) -> None:
    """br0 of ``node``: pod traffic to ``peer``'s subnet into the tunnel with
    ``send_vnid``; from the tunnel, only from ``peer`` with VNID, to the pod."""
    subnet = f"10.128.{2 * (peer.index - 1)}.0/23"
    tunnel = f"set_field:{peer.underlay.address.ip}->tun_dst,set_field:{send_vnid:#x}->tun_id"
    out = f"{tunnel},output:{tables.VXLAN_PORT}"
    flows = [
        f"cookie=0x1,priority=100,ip,in_port={POD_PORT},nw_dst={subnet} actions={out}",
        f"cookie=0x1,priority=100,arp,in_port={POD_PORT},arp_tpa={subnet} actions={out}",
        f"cookie=0x1,priority=100,in_port={tables.VXLAN_PORT},"
        f"tun_src={peer.underlay.address.ip},tun_id={VNID:#x} actions=output:{POD_PORT}",
    ]
    await node.runner.replace_flows(tables.BRIDGE, "".join(f + "\n" for f in flows))


@contextlib.asynccontextmanager
async def two_nodes() -> AsyncIterator[tuple[Lab, Node, Node]]:
    tools.require("ovs-vswitchd")
    lab = Lab(unique_run("ovu"))
    base = Path(tempfile.mkdtemp(prefix="ovu-", dir="/tmp"))
    nodes: list[Node] = []
    try:
        lab.build(2)
        ip(lab.node_ns(1), f"route add default via {EXTERNAL_IP}")
        for index in (1, 2):
            nodes.append(await start_node(lab, index, base))
        one, two = nodes
        await forward(one, two)
        await forward(two, one)
        yield lab, one, two
    finally:
        for node in nodes:
            node.kernel.close()
            await node.db.close()
            node.daemons.close()
        for index in (1, 2):
            stop_instance(base / f"n{index}", remove=True)
        shutil.rmtree(base, ignore_errors=True)
        await lab.close()


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[Lab, Node, Node]]:
    async with two_nodes() as nodes:
        yield nodes


def bulk_tcp(client: Node, server: Node, size: int = 2_000_000) -> str:
    """Send ``size`` bytes over TCP from ``client``'s pod to ``server``'s; the count the
    server read."""
    with subprocess.Popen(
        netns.command(server.pod_ns, [sys.executable, "-c", BULK, "7000"]),
        stdout=subprocess.PIPE,
        text=True,
    ) as listener:
        try:
            assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
            argv = [sys.executable, "-c", SEND, str(server.pod_ip), "7000", str(size)]
            return sh(client.pod_ns, *argv).strip()
        finally:
            listener.kill()


async def until_known(node: Node, peer: IPv4Address, limit: float = 5.0) -> None:
    """Wait until OVS on ``node`` has a MAC for ``peer`` (its ARP reply was snooped)."""
    deadline = asyncio.get_running_loop().time() + limit
    while str(peer) not in await node.runner.appctl("tnl/neigh/show"):
        assert asyncio.get_running_loop().time() < deadline, f"OVS never learned {peer}"
        await asyncio.sleep(0.02)


def uplink_addresses(node: Node) -> str:
    return ip(node.ns, f"-4 -o addr show dev {node.underlay.uplink}")


async def test_pods_reach_each_other_over_vxlan_with_the_vnid(
    cluster: tuple[Lab, Node, Node],
) -> None:
    _, one, two = cluster
    assert one.underlay.native and one.underlay.gateway == EXTERNAL_IP
    assert two.underlay.gateway is None
    # first contact waits on ARP twice (OVS's for the peer VTEP, the pod's through the
    # tunnel): bounded by a deadline, not by a count a loaded machine can outrun
    assert reaches(one.pod_ns, two.pod_ip)
    assert ping(two.pod_ns, one.pod_ip)
    assert bulk_tcp(one, two) == "2000000"  # full-size segments: MTU 1450 + 50 fits
    neighbours = await one.runner.appctl("tnl/neigh/show")
    assert str(two.underlay.address.ip) in neighbours and UNDERLAY_BRIDGE in neighbours
    # the receiver checks the VNID: the same packets with another one are dropped
    await forward(one, two, send_vnid=VNID + 1)
    assert not ping(one.pod_ns, two.pod_ip, count=2)
    await forward(one, two)
    assert ping(one.pod_ns, two.pod_ip)


async def test_the_node_keeps_its_ip_and_its_own_traffic(cluster: tuple[Lab, Node, Node]) -> None:
    _, one, two = cluster
    assert f"{one.underlay.address}" in uplink_addresses(one)
    routes = ip(one.ns, "-4 route show table main")
    assert UNDERLAY_BRIDGE not in routes, routes
    assert one.underlay.uplink in ip(one.ns, f"route get {two.underlay.address.ip}")
    assert ping(one.ns, EXTERNAL_IP) and ping(one.ns, two.underlay.address.ip)
    # not seen twice (the uplink and br-phy): no duplicate replies
    done = netns.run(one.ns, ["ping", "-n", "-c", "3", "-i", "0.2", str(EXTERNAL_IP)])
    assert "DUP!" not in done.stdout
    route_show = await one.runner.appctl("ovs/route/show")
    gateway = f"User: 0.0.0.0/0 dev {UNDERLAY_BRIDGE} GW {EXTERNAL_IP}"
    assert gateway in route_show, route_show


async def underlay_state(node: Node) -> tuple[str, list[str], str]:
    """What ensure manages: br-phy's flows, OVS's user routes (sorted: the table's order,
    and the routes OVS caches from the kernel, such as an IPv6 link-local one that
    appears once its DAD ends, are not ensure's) and the IPv4 addresses."""
    routes = await node.runner.appctl("ovs/route/show")
    user = sorted(line for line in routes.splitlines() if line.startswith("User:"))
    return (
        await node.runner.dump_flows(UNDERLAY_BRIDGE),
        user,
        ip(node.ns, "-4 -d addr show"),
    )


async def test_a_second_ensure_changes_nothing(cluster: tuple[Lab, Node, Node]) -> None:
    lab, one, two = cluster
    before = await underlay_state(one)
    for node in (one, two):
        assert await node.setup.check(node.underlay) == []
        assert await node.setup.ensure(node.underlay) == []
    # an agent restart: a new setup on the same switch finds nothing to do
    with netns.entered(one.ns):
        kernel = NodeKernel()
    try:
        again = UnderlaySetup(one.db, one.runner, kernel)
        underlay = await again.discover(lab.network(1), one.daemons.datapath)
        assert underlay == one.underlay
        assert await again.ensure(underlay) == []
    finally:
        kernel.close()
    assert await underlay_state(one) == before


async def test_check_reports_drift_and_ensure_repairs_it(cluster: tuple[Lab, Node, Node]) -> None:
    _, one, two = cluster
    await one.runner.appctl("ovs/route/del", str(one.underlay.address.network))
    await one.runner.bundle(UNDERLAY_BRIDGE, "delete cookie=0x0/0\n")  # every flow
    address = f"{one.underlay.address}"
    ip(one.ns, f"addr del {address} dev {UNDERLAY_BRIDGE}")
    ip(one.ns, f"addr add {address} dev {UNDERLAY_BRIDGE}")  # with a prefix route: hijack
    await one.db.delete_port(tables.BRIDGE, tables.VXLAN)
    drift = await one.setup.check(one.underlay)
    for words in ("route", "flows differ", "lacks", "kernel route", tables.VXLAN):
        assert any(words in line for line in drift), (words, drift)
    changed = await one.setup.ensure(one.underlay)
    assert changed and await one.setup.check(one.underlay) == []
    assert UNDERLAY_BRIDGE not in ip(one.ns, "-4 route show table main")
    assert reaches(one.pod_ns, two.pod_ip)  # first contact in this test


async def test_restarted_vswitchd_is_restored(cluster: tuple[Lab, Node, Node]) -> None:
    _, one, two = cluster
    pid = one.daemons.pid(VSWITCHD)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert ping(one.ns, EXTERNAL_IP)  # the node's own traffic does not need OVS
    assert await one.daemons.start() == [VSWITCHD]
    drift = await one.setup.check(one.underlay)
    assert any("flows differ" in line for line in drift), drift
    assert any("OVS route" in line for line in drift), drift
    await forward(one, two)  # the pipeline's part of a restore
    assert await one.setup.ensure(one.underlay)
    assert await one.setup.check(one.underlay) == []
    peer = two.underlay.address.ip
    assert await one.setup.prime(one.underlay, [peer]) == [peer]  # OVS forgot its MAC
    await until_known(one, peer)
    assert ping(one.pod_ns, two.pod_ip, count=1)  # the first packet is not lost
    assert f"{one.underlay.address}" in uplink_addresses(one)


async def test_remove_leaves_the_uplink_to_the_kernel(cluster: tuple[Lab, Node, Node]) -> None:
    _, one, two = cluster
    await one.setup.remove()
    assert await one.db.port(UNDERLAY_BRIDGE) is None
    assert UNDERLAY_BRIDGE not in ip(one.ns, "-o link show")
    assert "User:" not in await one.runner.appctl("ovs/route/show")
    assert "PROMISC" not in ip(one.ns, f"link show dev {one.underlay.uplink}")
    assert f"{one.underlay.address}" in uplink_addresses(one)
    assert ping(one.ns, EXTERNAL_IP)
    assert not ping(one.pod_ns, two.pod_ip, count=2)


async def test_discover_refuses_a_missing_ip_or_a_small_mtu(
    cluster: tuple[Lab, Node, Node],
) -> None:
    lab, one, _ = cluster
    elsewhere = replace(lab.network(1), node_ip=IPv4Address("192.0.2.77"))
    with pytest.raises(NodeSetupRefused, match=r"192\.0\.2\.77"):
        await one.setup.discover(elsewhere, "netdev")
    with pytest.raises(NodeSetupRefused, match="MTU 1500 is below 1510"):
        await one.setup.discover(replace(lab.network(1), mtu=1460), "netdev")


async def test_tunnel_source_reaches_br0_so_forged_vxlan_is_refused(
    cluster: tuple[Lab, Node, Node],
) -> None:
    """The outer source survives decapsulation as ``tun_src``: a VXLAN datagram with the
    right VNID and the pod's MAC is delivered from the peer node's IP, and dropped by
    br0's ``tun_src`` check when the outside host sends it (OVS decapsulates it first:
    the kernel's tunnel guard never sees OVS's copy)."""
    lab, one, two = cluster
    pod_mac = ip(two.pod_ns, "-br link show dev eth0").split()[2]
    for sender, token in ((lab.run + "-ext", "forged"), (one.ns, "peer")):
        # a veth leaves the UDP checksum to "hardware", and OVS drops VXLAN whose
        # checksum is wrong: the kernel must write it (OVS's own VXLAN carries none)
        sh(sender, "ethtool", "-K", "eth0", "tx", "off")
        receiver = Receiver(two.pod_ns, 7001, stop=token, seconds=3)
        source = IPv4Address("10.128.0.9")
        inject(
            sender,
            Forgery(two.underlay.address.ip, 4789, VNID, pod_mac, source, two.pod_ip, 7001, token),
        )
        seen = receiver.lines()
        assert (seen != []) == (token == "peer"), (sender, seen)


async def test_prime_resolves_the_peer_before_the_first_packet(
    cluster: tuple[Lab, Node, Node],
) -> None:
    """Without it the first packet to a peer is dropped while OVS ARPs, and the pod's own
    ARP request through the tunnel is retried only after a second: ``ping -c 1`` fails."""
    _, one, two = cluster
    peer = two.underlay.address.ip
    assert str(peer) not in await one.runner.appctl("tnl/neigh/show")
    assert await one.setup.prime(one.underlay, [peer, peer]) == [peer]
    await until_known(one, peer)
    assert await one.setup.prime(one.underlay, [peer]) == []  # known: nothing to do
    assert ping(one.pod_ns, two.pod_ip, count=1)


def spoofed(lab: Lab, sender: str, src_mac: str, one: Node, two: Node, token: str) -> Spoof:
    """VXLAN from ``sender``'s eth0 with Ethernet source ``src_mac`` and node one's
    address as the outer source, to two's pod with the right VNID and the pod's MAC."""
    pod_mac = ip(two.pod_ns, "-br link show dev eth0").split()[2]
    inner = Forgery(
        two.underlay.address.ip,
        4789,
        VNID,
        pod_mac,
        IPv4Address("10.128.0.9"),
        two.pod_ip,
        7001,
        token,
    )
    return Spoof("eth0", src_mac, two.underlay.mac, one.underlay.address.ip, inner)


def injected(lab: Lab, one: Node, two: Node, src_mac: str, token: str) -> list[str]:
    """The outside host's forgery (Ethernet source ``src_mac``), then node one's own
    frame as the control: the tokens two's pod received, each once."""
    receiver = Receiver(two.pod_ns, 7001, stop="control", seconds=10)
    outside = f"{lab.run}-ext"
    forge(outside, spoofed(lab, outside, src_mac, one, two, token))
    time.sleep(1.0)  # the window of the negative check, closed by the control
    forge(one.ns, spoofed(lab, one.ns, one.underlay.mac, one, two, "control"))
    return list(dict.fromkeys(line.split(" ", 1)[1] for line in receiver.lines()))


async def test_underlay_injection_with_a_forged_peer_address(
    cluster: tuple[Lab, Node, Node],
) -> None:
    """Issue 19, finding 7: a host on the underlay forges node one's outer address. While
    one's MAC is unknown (no peer flows: as before, or an older peer), br0's ``tun_src``
    check cannot tell it from one and the pod gets the packet; with one's MAC checked on
    br-phy it is dropped. Forging the MAC as well is the residual risk, which the
    switch's port security closes."""
    lab, one, two = cluster
    outsider = lab.underlay_mac(f"{lab.run}-ext")
    assert injected(lab, one, two, outsider, "forged-ip") == ["forged-ip", "control"]
    peer = VtepPeer(one.underlay.address.ip, one.underlay.mac.lower())
    assert await two.setup.ensure_peers(two.underlay, [peer])
    assert not await two.setup.ensure_peers(two.underlay, [peer]), "nothing left to change"
    assert injected(lab, one, two, outsider, "forged-ip") == ["control"]
    # the base flows are right: ensure leaves the peer flows alone
    assert await two.setup.check(two.underlay) == []
    assert await two.setup.ensure(two.underlay) == []
    assert injected(lab, one, two, outsider, "forged-ip") == ["control"]
    # residual: the forged address and MAC pass, until the switch binds MACs to ports
    mac = one.underlay.mac.lower()
    assert injected(lab, one, two, mac, "forged-both") == ["forged-both", "control"]
    lab.port_security()
    assert injected(lab, one, two, mac, "forged-both") == ["control"]
    assert reaches(one.pod_ns, two.pod_ip) and ping(two.pod_ns, one.pod_ip)


async def neighbour_mac(node: Node, ip_address: IPv4Address) -> str | None:
    """The MAC OVS on ``node`` holds for ``ip_address`` on br-phy (``tnl/neigh/show``)."""
    for line in (await node.runner.appctl("tnl/neigh/show")).splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == str(ip_address) and words[2] == UNDERLAY_BRIDGE:
            return words[1]
    return None


async def test_a_forged_arp_reply_cannot_move_a_peer_s_neighbour_entry(
    cluster: tuple[Lab, Node, Node],
) -> None:
    """OVS learns its tunnels' next hops from the ARP replies it snoops on br-phy: a host
    on the underlay that answers for node one's address would get two's VXLAN to one.
    With one's MAC checked, br-phy passes an ARP reply for one's address only from one
    (what linux's permanent neighbour entries do)."""
    lab, one, two = cluster
    peer, outside = one.underlay.address.ip, f"{lab.run}-ext"
    forged = arp_reply(lab.underlay_mac(outside), two.underlay.mac, peer, two.underlay.address.ip)
    real = one.underlay.mac.lower()
    for checked in (False, True):
        peers = [VtepPeer(peer, real)] if checked else []
        await two.setup.ensure_peers(two.underlay, peers)
        await two.runner.appctl("tnl/neigh/flush")
        await two.setup.prime(two.underlay, [peer])
        await until_known(two, peer)
        assert await neighbour_mac(two, peer) == real
        write_frames(outside, "eth0", forged)
        time.sleep(0.5)  # a snooped reply is learned within the millisecond
        moved = await neighbour_mac(two, peer) != real
        assert moved != checked, ("checked" if checked else "unchecked", moved)
    assert ping(one.pod_ns, two.pod_ip) and ping(two.pod_ns, one.pod_ip)
