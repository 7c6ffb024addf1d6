"""Underlay injection (issue 19, finding 7) on the linux data plane, in lab namespaces only.

The outside host sits on the underlay with the nodes. It writes whole Ethernet frames
(``podnet.testing.underlayforge``): VXLAN to node 2 whose outer source address is node
3's, whose inner packet forges a node-3 pod's address toward a pod of node 2. Forging the
address alone is refused (node 3's published MAC is checked, and node 2 holds a permanent
neighbour entry for it); forging the MAC too is the residual risk, which the switch's port
security (here the lab underlay's bridge) closes. As a control, node 3 itself sends the
very same frame, so a silent receiver means "dropped", not "malformed".
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import pytest

from podnet import netns
from podnet.dataplane.linux import nftables, portsecurity
from podnet.dataplane.linux.desired import vtep_mac
from podnet.testing.lab import Lab, built_lab, ping, sh, up
from podnet.testing.underlayforge import Spoof, arp_reply, inject, write_frames
from podnet.testing.vxlan import Forgery, Receiver

pytestmark = [pytest.mark.root]

PORT = 4789
VNI = 1
TARGET_PORT = 19998
LATE = 1.0  # the window of a negative check, closed by the control (see test_tunnel_safety)


@pytest.fixture
async def lab() -> AsyncIterator[Lab]:
    async with built_lab("pnu") as the_lab:
        yield the_lab


def spoof(lab: Lab, sender_ns: str, src_mac: str, token: str) -> Spoof:
    """A frame from ``sender_ns``'s eth0, Ethernet source ``src_mac``, outer source node
    3's address, to node 2's VTEP; inside, a node-3 pod's address to node 2's target."""
    victim = lab.subnet(3).network_address + 10
    target = lab.subnet(2).network_address + 10
    forgery = Forgery(
        lab.node_ip(2), PORT, VNI, vtep_mac(lab.node_ip(2)), victim, target, TARGET_PORT, token
    )
    return Spoof("eth0", src_mac, lab.underlay_mac(lab.node_ns(2)), lab.node_ip(3), forgery)


async def target(lab: Lab) -> str:
    """Nodes 1-3 up (each publishing its MAC), and node 2's target pod; its namespace."""
    planes = await up(lab, [1, 2, 3])
    ns, pod = lab.pod(2, 10, "target")
    await planes[2].attach_pod(pod)
    return ns


def delivered(receiver: Receiver) -> list[str]:
    """The tokens received, each once (every frame is sent in a few copies), in order."""
    return list(dict.fromkeys(line.split(" ", 1)[1] for line in receiver.lines()))


def attempt(lab: Lab, target_ns: str, src_mac: str, token: str) -> list[str]:
    """The outside host's frame (Ethernet source ``src_mac``), then node 3's control:
    the tokens node 2's target received."""
    receiver = Receiver(target_ns, TARGET_PORT, stop="control")
    inject(f"{lab.run}-ext", spoof(lab, f"{lab.run}-ext", src_mac, token))
    time.sleep(LATE)
    node3 = lab.node_ns(3)
    inject(node3, spoof(lab, node3, lab.underlay_mac(node3), "control"))
    return delivered(receiver)


def neighbour(lab: Lab, node: int, of: int) -> dict[str, object]:
    """Node ``node``'s neighbour entry for node ``of``'s address on the underlay."""
    ns = lab.node_ns(node)
    entries = json.loads(sh(ns, "ip", "-j", "neigh", "show", "dev", "eth0"))
    return next(n for n in entries if n["dst"] == str(lab.node_ip(of)))


def forge_arp(lab: Lab) -> None:
    """The outside host tells node 2 that node 3's address is at the outside host's MAC."""
    outside = f"{lab.run}-ext"
    reply = arp_reply(
        lab.underlay_mac(outside), lab.underlay_mac(lab.node_ns(2)), lab.node_ip(3), lab.node_ip(2)
    )
    write_frames(outside, "eth0", reply)
    time.sleep(0.5)


async def test_a_forged_peer_address_alone_is_dropped(lab: Lab) -> None:
    target_ns = await target(lab)
    outsider = lab.underlay_mac(f"{lab.run}-ext")
    assert attempt(lab, target_ns, outsider, "forged-ip") == ["control"]
    # node 2 sends to node 3's published MAC whatever ARP says
    entry = neighbour(lab, 2, 3)
    assert entry["lladdr"] == lab.underlay_mac(lab.node_ns(3))
    assert "PERMANENT" in str(entry["state"])
    forge_arp(lab)
    assert neighbour(lab, 2, 3)["lladdr"] == lab.underlay_mac(lab.node_ns(3))
    assert (await lab.planes[1].check_node(lab.network(2))).ok


async def test_a_peer_without_a_published_mac_is_checked_by_address_alone(lab: Lab) -> None:
    """A rolling upgrade: node 3's agent publishes no MAC yet. Node 2 keeps taking its
    VXLAN (by address, as before), and has no neighbour entry to pin for it."""
    target_ns = await target(lab)
    remotes = [lab.remote(1), lab.remote(3, mac=False)]
    await lab.planes[1].sync_remote_nodes(lab.network(2), remotes)
    outsider = lab.underlay_mac(f"{lab.run}-ext")
    assert attempt(lab, target_ns, outsider, "forged-ip") == ["forged-ip", "control"]
    listing = sh(lab.node_ns(2), "nft", "list", "set", "inet", "podnet", "vtep_ip_only")
    assert str(lab.node_ip(3)) in listing
    assert "PERMANENT" not in sh(lab.node_ns(2), "ip", "neigh", "show", str(lab.node_ip(3)))
    # once it publishes its MAC, the forgery is refused again; no pod traffic is lost
    await lab.planes[1].sync_remote_nodes(lab.network(2), [lab.remote(1), lab.remote(3)])
    assert attempt(lab, target_ns, outsider, "forged-ip") == ["control"]


async def test_a_forged_peer_address_and_mac_needs_port_security(lab: Lab) -> None:
    """The residual risk: a host on the segment that forges the peer's MAC as well is
    indistinguishable from the peer at node 2. The switch's port security (each port
    takes only its own host's source MAC) closes it; the nodes' traffic still flows."""
    target_ns = await target(lab)
    node3_mac = lab.underlay_mac(lab.node_ns(3))
    assert attempt(lab, target_ns, node3_mac, "forged-ip-and-mac") == [
        "forged-ip-and-mac",
        "control",
    ]
    lab.port_security()
    with netns.entered(lab.underlay):
        assert nftables.list_table(portsecurity.KEY) is not None
        assert not portsecurity.allow("u-n3", node3_mac), "already bound: nothing to change"
    assert attempt(lab, target_ns, node3_mac, "forged-ip-and-mac") == ["control"]
    for node in (1, 2, 3):
        assert ping(lab.node_ns(node), lab.node_ip(1 + node % 3))
