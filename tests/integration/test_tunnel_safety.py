"""Tunnel safety (issue 8, finding 1) against the real kernel, in lab namespaces only.

A pod, or a host on the underlay that is not a node, sends a hand-made VXLAN frame to a
node's tunnel port; the inner packet forges another pod's source address toward a target
pod. The target's receiver must see nothing. As a control, the very same kind of frame
from a real peer node is delivered, so a silent receiver means "dropped", not "the test
frame is malformed". Every send is a few datagrams; every wait is bounded.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from ipaddress import IPv4Address

import pytest

from podnet.dataplane.linux import LinuxDataPlane
from podnet.dataplane.linux.desired import vtep_mac
from podnet.testing.lab import EXTERNAL_IP, Lab, built_lab, ping, sh, up
from podnet.testing.vxlan import Forgery, Receiver, inject

pytestmark = [pytest.mark.root]  # root, nft and ip are required (tests/conftest.py)

PORT = 4789
VNI = 1
TARGET_PORT = 19999
# A kept sleep, the window of a negative check: a forged frame that got through would reach
# the receiver within milliseconds of being sent; none may have come before the control,
# which ends the receiver. It cannot fail a correct data plane, only widen the window.
LATE = 1.0


@pytest.fixture
async def lab() -> AsyncIterator[Lab]:
    """Underlay, outside host and three nodes; everything removed afterwards."""
    async with built_lab("pnv") as the_lab:
        yield the_lab


def forgery(
    lab: Lab, node: int, to: IPv4Address, src: IPv4Address, dst: IPv4Address, token: str
) -> Forgery:
    """A frame for node ``node``'s VTEP (sent to ``to``) forging ``src`` toward ``dst``."""
    mac = vtep_mac(lab.node_ip(node))
    return Forgery(to, PORT, VNI, mac, src, dst, TARGET_PORT, token)


def delivered(receiver: Receiver) -> list[str]:
    """The tokens the target received (the control's last)."""
    return [line.split(" ", 1)[1] for line in receiver.lines()]


async def pods(lab: Lab, planes: dict[int, LinuxDataPlane]) -> dict[str, tuple[str, IPv4Address]]:
    """attacker (node 1), target1 (node 1), target2 (node 2), victim (node 3, forged)."""
    placement = {"attacker": (1, 10), "target1": (1, 11), "target2": (2, 10), "victim": (3, 10)}
    found = {}
    for tag, (node, host) in placement.items():
        ns, pod = lab.pod(node, host, tag)
        await planes[node].attach_pod(pod)
        found[tag] = (ns, pod.address.ip)
    return found


async def test_forged_vxlan_from_pods_and_outsiders_is_dropped(lab: Lab) -> None:
    planes = await up(lab, [1, 2, 3])
    p = await pods(lab, planes)
    (attacker, _), (_, victim) = p["attacker"], p["victim"]
    assert ping(attacker, p["target2"][1]), "legitimate cross-node traffic"

    # (b) pod -> another node's VTEP; (c) the outside host -> a node; a pod -> a remote
    # node's gateway, i.e. VXLAN inside the tunnel (it arrives on vxlan0, not the underlay).
    target2_ns, target2 = p["target2"]
    receiver = Receiver(target2_ns, TARGET_PORT, stop="control")
    inject(attacker, forgery(lab, 2, lab.node_ip(2), victim, target2, "pod-to-remote"))
    inject(f"{lab.run}-ext", forgery(lab, 2, lab.node_ip(2), victim, target2, "outsider"))
    gateway2 = lab.subnet(2).network_address + 1
    inject(attacker, forgery(lab, 2, gateway2, victim, target2, "nested"))
    time.sleep(LATE)
    inject(lab.node_ns(3), forgery(lab, 2, lab.node_ip(2), victim, target2, "control"))
    assert delivered(receiver) == ["control"], "only the real peer's frame gets through"

    # (a) pod -> its own node's VTEP (its underlay address and its gateway).
    target1_ns, target1 = p["target1"]
    receiver = Receiver(target1_ns, TARGET_PORT, stop="control")
    inject(attacker, forgery(lab, 1, lab.node_ip(1), victim, target1, "pod-to-own-node"))
    gateway1 = lab.subnet(1).network_address + 1
    inject(attacker, forgery(lab, 1, gateway1, victim, target1, "pod-to-own-gateway"))
    time.sleep(LATE)
    inject(lab.node_ns(2), forgery(lab, 1, lab.node_ip(1), victim, target1, "control"))
    assert delivered(receiver) == ["control"]

    assert ping(attacker, p["target2"][1]), "cross-node traffic still works"
    for i in (1, 2, 3):
        status = await planes[i].check_node(lab.network(i))
        assert status.ok, status.problems


async def test_peer_set_follows_the_remote_nodes(lab: Lab) -> None:
    planes = await up(lab, [1, 2, 3])
    p = await pods(lab, planes)
    target1_ns, target1 = p["target1"]
    victim = p["victim"][1]
    # node 3 leaves node 1's remotes: its frames are refused from then on.
    await planes[1].sync_remote_nodes(lab.network(1), [lab.remote(2)])
    listing = sh(lab.node_ns(1), "nft", "list", "set", "inet", "podnet", "vtep_peers")
    assert str(lab.node_ip(2)) in listing and str(lab.node_ip(3)) not in listing
    receiver = Receiver(target1_ns, TARGET_PORT, stop="control")
    inject(lab.node_ns(3), forgery(lab, 1, lab.node_ip(1), victim, target1, "removed-peer"))
    time.sleep(LATE)
    inject(lab.node_ns(2), forgery(lab, 1, lab.node_ip(1), victim, target1, "control"))
    assert delivered(receiver) == ["control"]
    assert (await planes[1].check_node(lab.network(1))).ok

    # A restarted agent finds the peers in place: nothing to change.
    fresh = lab.plane(1)
    assert (await fresh.check_node(lab.network(1))).ok
    # A peer removed from the set by hand is drift that check reports and setup repairs.
    sh(lab.node_ns(1), "nft", "flush", "set", "inet", "podnet", "vtep_peers")
    status = await fresh.check_node(lab.network(1))
    assert not status.ok and any("vtep_peers" in p for p in status.problems), status.problems
    await fresh.setup_node(lab.network(1))
    assert (await fresh.check_node(lab.network(1))).ok
    assert ping(p["attacker"][0], p["target2"][1])


async def test_host_gw_pods_cannot_reach_the_tunnel_port(lab: Lab) -> None:
    """No vxlan0 to decapsulate, but pods are kept off the port all the same."""
    planes = await up(lab, [1, 2], tunnel="host-gw")
    attacker_ns, pod = lab.pod(1, 10, "attacker")
    await planes[1].attach_pod(pod)
    # the control comes last: the receiver ends with it (a fixed window was too short
    # for two sender processes to start on a loaded machine)
    receiver = Receiver(lab.node_ns(2), PORT, stop=f"from:{EXTERNAL_IP}", seconds=30)
    inject(attacker_ns, forgery(lab, 2, lab.node_ip(2), pod.address.ip, EXTERNAL_IP, "pod"))
    time.sleep(LATE)
    inject(f"{lab.run}-ext", forgery(lab, 2, lab.node_ip(2), EXTERNAL_IP, EXTERNAL_IP, "control"))
    assert {line.split(" ", 1)[0] for line in receiver.lines()} == {str(EXTERNAL_IP)}
