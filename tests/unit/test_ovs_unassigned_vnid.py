"""A pod whose project has no VNID yet (``UNASSIGNED_VNID``) meets only VNID 0, on its
node and across nodes, as both nodes' rendered flows send and judge its packets."""

from __future__ import annotations

import re
from ipaddress import IPv4Address

from podnet.controllers import vnids
from podnet.dataplane.interface import RemoteNode, pod_mac
from podnet.dataplane.ovs import pipeline
from podnet.dataplane.ovs import tables as t
from podnet.dataplane.ovs.flow import Flow
from podnet.dataplane.ovs.pipeline import LocalPod
from podnet.model.network import MULTITENANT
from podnet.policy.model import RuleSet, VnidIsolation
from podnet.testing.nodenetwork import node_network

ONE = node_network("node-1", "198.51.100.11", "10.128.0.0/23")
TWO = node_network("node-2", "198.51.100.12", "10.128.2.0/23")
REMOTES = {
    "node-1": [RemoteNode("node-2", TWO.node_ip, TWO.subnet)],
    "node-2": [RemoteNode("node-1", ONE.node_ip, ONE.subnet)],
}
GLOBAL, TOP, LOST = (IPv4Address(f"10.128.0.{i}") for i in (10, 11, 12))  # on node-1
REMOTE_LOST = IPv4Address("10.128.2.10")  # on node-2
VNI_BITS = 0xFFFFFF  # what VXLAN carries of tun_id


def local(ip: IPv4Address, ofport: int) -> LocalPod:
    return LocalPod(f"c{ofport}/eth0", ofport, ip, pod_mac(ip))


# GLOBAL is VNID 0, TOP the highest VNID a project can get; the LOST ones have none
RULES = RuleSet(
    MULTITENANT,
    (),
    frozenset(),
    isolation=VnidIsolation(((GLOBAL, 0), (TOP, vnids.MAX_VNID)), frozenset({LOST, REMOTE_LOST})),
)
FLOWS = {
    "node-1": pipeline.desired(
        ONE, REMOTES["node-1"], [local(GLOBAL, 3), local(TOP, 4), local(LOST, 5)], RULES
    ),
    "node-2": pipeline.desired(TWO, REMOTES["node-2"], [local(REMOTE_LOST, 3)], RULES),
}


def first_flow(node: str, table: int, fields: dict[str, int | str]) -> Flow:
    """The highest-priority flow of ``table`` on ``node`` whose match holds for
    ``fields`` (every ``name=value`` part names a given field; ``ip`` holds)."""

    def holds(match: str) -> bool:
        for part in filter(None, match.split(",")):
            name, _, value = part.partition("=")
            want = fields.get(name)
            if name == "ip":
                continue
            if want is None or (int(value, 0) if isinstance(want, int) else value) != want:
                return False
        return True

    found = [f for fs in FLOWS[node].values() for f in fs if f.table == table and holds(f.match)]
    assert found, f"no flow of table {table} on {node} for {fields}"
    return max(found, key=lambda f: f.priority)


def loaded(flow: Flow, register: str) -> int:
    found = re.search(rf"load:(\w+)->NXM_NX_{register.upper()}\[\]", flow.actions)
    assert found is not None, f"{flow.text()} loads no {register}"
    return int(found.group(1), 0)


def source_vnid(ip: IPv4Address, ofport: int, node: str = "node-1") -> int:
    """reg0 as POD_IN loads it for a local pod's IP packet."""
    sent = {"in_port": ofport, "dl_src": str(pod_mac(ip)), "nw_src": str(ip)}
    return loaded(first_flow(node, t.POD_IN, sent), t.REG_SRC_VNID)


def delivered(src_vnid: int, dst: IPv4Address) -> bool:
    """Whether node-1's ISOLATION delivers a packet with ``src_vnid`` to ``dst``."""
    dst_vnid = loaded(first_flow("node-1", t.LOCAL, {"nw_dst": str(dst)}), t.REG_DST_VNID)
    verdict = first_flow("node-1", t.ISOLATION, {"reg0": src_vnid, "reg1": dst_vnid})
    return verdict.actions.startswith("output:")


def test_the_unassigned_value_is_reserved_and_fits_the_vni() -> None:
    assert 0 < t.UNASSIGNED_VNID < vnids.MIN_VNID, "one the master never allocates"
    assert t.UNASSIGNED_VNID & VNI_BITS == t.UNASSIGNED_VNID, "it crosses nodes as itself"


def test_an_unassigned_pod_meets_only_vnid_0_on_its_node() -> None:
    lost = source_vnid(LOST, 5)
    assert lost == t.UNASSIGNED_VNID
    assert [delivered(lost, dst) for dst in (GLOBAL, TOP, LOST)] == [True, False, False]
    assert delivered(source_vnid(GLOBAL, 3), LOST)
    assert not delivered(source_vnid(TOP, 4), LOST)
    assert delivered(source_vnid(TOP, 4), TOP), "the verdicts above can be True"


def test_an_unassigned_pod_meets_only_vnid_0_across_nodes() -> None:
    sent = source_vnid(REMOTE_LOST, 3, "node-2")
    remote = first_flow("node-2", t.REMOTE, {"nw_dst": str(ONE.subnet)})  # to node-1
    assert "move:NXM_NX_REG0[]->NXM_NX_TUN_ID[0..31]" in remote.actions
    wire = sent & VNI_BITS  # the VNI as node-1 receives it
    assert not vnids.MIN_VNID <= wire <= vnids.MAX_VNID, "no project's VNID"
    arrived = first_flow("node-1", t.VXLAN_IN, {"tun_id": wire, "nw_src": str(REMOTE_LOST)})
    lost = loaded(arrived, t.REG_SRC_VNID)
    assert lost == t.UNASSIGNED_VNID
    assert [delivered(lost, dst) for dst in (GLOBAL, TOP, LOST)] == [True, False, False]
    # a pod node-1 knows with a VNID may not arrive with the unassigned one
    spoofed = first_flow("node-1", t.VXLAN_IN, {"tun_id": wire, "nw_src": str(TOP)})
    assert spoofed.actions == "drop"
