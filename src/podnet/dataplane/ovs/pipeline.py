"""br0's desired flows as pure functions of the agent's values, grouped by object.

``desired`` renders everything a node holds: the node's own pipeline (``node_flows``),
one group per remote node (``remote_node_flows``: who may send on the tunnel, the route
to its subnet), one per local pod (``pod_flows``: anti-spoofing by in_port, ARP answers,
delivery), one per cluster pod with a VNID (``source_vnid_flows``, multitenant: the VNID
its packets carry on the tunnel and from the host), and the policy tables 21 and 80
(``policy_flows``). Each group's flows carry the group's cookie (``flow.cookie``), so a
change to one object is one bundle of ``delete cookie=C/-1`` plus its new flows.

The roles are OpenShift SDN's (``tables``): a packet is tracked by conntrack first, then
sorted by in_port; a pod's source MAC and IP must be its own; the VNID rides in reg0
through ROUTE and in ``tun_id`` across nodes, where the receiver checks it against the
VNID it knows for the inner source address. Traffic to the gateway, the service network
and anything outside the cluster goes to tun0, where the host's nftables apply the
service proxy and the masquerade. A connection a pod opened through the host (a service,
DNATed there) is marked in conntrack when it comes back from tun0, and its replies are
sent to tun0 too, so the host undoes the DNAT (the userspace datapath's conntrack is not
the kernel's).

Multitenant VNIDs come from ``RuleSet.isolation``: a pod whose project has no VNID yet is
``UNASSIGNED_VNID``. Fail closed (``RuleSet.fails_closed``: multitenant or networkpolicy
with the pod networks known): only an address with a live owner (``RuleSet.owned``) has
a source identity, so VNID 0 goes only to what is positively global (pods of global
projects, the nodes' own addresses; in networkpolicy mode every owned pod, the VNID being
unused there). A local port whose address has no owner is quarantined (``quarantine_flows``:
nothing from it, nothing to it), and a pod-network source that no identity flow lists is
dropped from the tunnel and from the host (``fail_closed_flows``). Without the pod
networks (or in subnet mode) an unlisted address is VNID 0, as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address

from podnet.dataplane.interface import NodeNetwork, RemoteNode, pod_mac
from podnet.dataplane.ovs import tables as t
from podnet.dataplane.ovs.flow import Flow, Kind, cookie
from podnet.dataplane.ovs.policyflows import LocalView, policy_groups
from podnet.dataplane.wiring import usable_remotes
from podnet.policy.model import RuleSet

Groups = dict[int, list[Flow]]  # cookie -> the flows of one object
Vnids = Mapping[IPv4Address, int | None]  # cluster pod IP -> VNID (None: unassigned)

TUN_ID_TO_REG0 = f"move:NXM_NX_TUN_ID[0..31]->NXM_NX_{t.REG_SRC_VNID.upper()}[]"
REG0_TO_TUN_ID = f"move:NXM_NX_{t.REG_SRC_VNID.upper()}[]->NXM_NX_TUN_ID[0..31]"
VIA_HOST = f"{t.CT_MARK_VIA_HOST:#x}/{t.CT_MARK_VIA_HOST:#x}"  # the bit alone: policy has others
# (written as the switch reads a masked set_field back, so that comparisons find it equal)
_BIT = t.CT_MARK_VIA_HOST.bit_length() - 1
MARK_VIA_HOST = f"ct(commit,exec(load:0x1->NXM_NX_CT_MARK[{_BIT}]))"


@dataclass(frozen=True, order=True)
class LocalPod:
    """A pod wired on this node: its OVS port and the identity it must send with."""

    key: str  # container_id/ifname: names the pod's flow group
    ofport: int
    ip: IPv4Address
    mac: str


def node_cookie() -> int:
    return cookie(Kind.NODE, "node")


def remote_cookie(name: str) -> int:
    return cookie(Kind.REMOTE_NODE, f"remote/{name}")


def pod_cookie(key: str) -> int:
    return cookie(Kind.POD, f"pod/{key}")


def vnid_cookie(ip: IPv4Address) -> int:
    return cookie(Kind.ISOLATION, f"source-vnid/{ip}")


def fail_closed_cookie() -> int:
    return cookie(Kind.ISOLATION, "fail-closed")


def vnids_of(rules: RuleSet | None) -> dict[IPv4Address, int | None]:
    """The source identities: the multitenant VNID map (None: unassigned); failing
    closed, also every other owned pod-network address with VNID 0 (the nodes' gateways
    and hostNetwork addresses; in networkpolicy mode every running pod). Empty in the
    other cases (every source VNID 0)."""
    if rules is None:
        return {}
    found: dict[IPv4Address, int | None] = {}
    if rules.isolation is not None:
        found.update(rules.isolation.vnids)
        found.update((ip, None) for ip in rules.isolation.unassigned)
    if rules.fails_closed:
        for ip in rules.owned:  # in multitenant mode, a pod is listed already
            found.setdefault(ip, 0)
    return found


def quarantined(rules: RuleSet | None, ip: IPv4Address) -> bool:
    """Whether a local port with address ``ip`` gets nothing: failing closed, no live
    owner holds the address (a sandbox whose Pod object is gone)."""
    return rules is not None and rules.unowned(ip)


def register_vnid(vnids: Vnids, ip: IPv4Address) -> int:
    """The value reg0/reg1 holds for ``ip``: its VNID, 0 if unlisted, or UNASSIGNED."""
    if ip not in vnids:
        return 0
    vnid = vnids[ip]
    return t.UNASSIGNED_VNID if vnid is None else vnid


def _flows(cookie_: int, *specs: tuple[int, int, str, str]) -> list[Flow]:
    return [Flow(table, prio, match, actions, cookie_) for table, prio, match, actions in specs]


def node_flows(node: NodeNetwork) -> list[Flow]:
    """The node's own pipeline: conntrack, classification, the fixed routes, defaults."""
    gw, subnet, tun = node.gateway.ip, node.subnet, t.TUN_PORT
    to_tun = f"set_field:{pod_mac(gw)}->eth_dst"
    specs: list[tuple[int, int, str, str]] = [
        (t.CLASSIFY, 1000, "ip,ct_state=-trk", f"ct(table={t.CLASSIFY})"),
        (t.CLASSIFY, 400, f"ip,in_port={tun},nw_src={gw}", f"goto_table:{t.ROUTE}"),
        (t.CLASSIFY, 200, f"ip,in_port={tun}", f"goto_table:{t.HOST_IN}"),
        (t.CLASSIFY, 200, f"arp,in_port={tun}", f"goto_table:{t.ROUTE}"),
        (t.CLASSIFY, 150, f"in_port={t.VXLAN_PORT}", "drop"),
        (t.CLASSIFY, 150, f"in_port={tun}", "drop"),
        (t.CLASSIFY, 100, "ip", f"goto_table:{t.POD_IN}"),
        (t.CLASSIFY, 100, "arp", f"goto_table:{t.POD_IN}"),
        (t.CLASSIFY, 0, "", "drop"),
        (t.VXLAN_IN, 100, "ip,tun_id=0", f"goto_table:{t.ROUTE}"),
        (t.VXLAN_IN, 100, "arp", f"{TUN_ID_TO_REG0},goto_table:{t.ROUTE}"),
        (t.VXLAN_IN, 0, "", "drop"),
        (t.POD_IN, 0, "", "drop"),
        (t.HOST_IN, 0, "", f"goto_table:{t.ROUTE}"),
        # a reply to a connection that came through the host (a service): back to the
        # host, addressed to tun0 (a local pod sent it to the client's MAC)
        (t.ROUTE, 400, f"ip,ct_state=+trk+rpl,ct_mark={VIA_HOST}", f"{to_tun},output:{tun}"),
        (t.ROUTE, 300, f"arp,arp_tpa={gw}", f"output:{tun}"),
        (t.ROUTE, 300, f"ip,nw_dst={gw}", f"output:{tun}"),
        (t.ROUTE, 200, f"arp,arp_tpa={subnet}", f"goto_table:{t.ARP_LOCAL}"),
        (t.ROUTE, 200, f"ip,nw_dst={subnet}", f"goto_table:{t.LOCAL}"),
        (t.ROUTE, 150, f"ip,nw_dst={node.service_network}", f"goto_table:{t.SERVICE}"),
        (t.ROUTE, 10, "ip", f"goto_table:{t.EGRESS}"),  # above the drop of the rest
        (t.ROUTE, 0, "", "drop"),
        (t.ARP_LOCAL, 0, "", "drop"),
        (t.ARP_REMOTE, 0, "", "drop"),
        # commit the pod's connection to the service, so that the reply the host sends
        # back (un-DNATed) is established here, as it is in the kernel's conntrack
        (t.SERVICE, 0, "ip", f"ct(commit),output:{tun}"),
        (t.LOCAL, 0, "", "drop"),
        (t.REMOTE, 0, "", "drop"),
        (t.EGRESS, 0, "", f"output:{tun}"),
    ]
    for network in node.cluster_networks:
        # a new connection from the host with a cluster source: a pod's, DNATed there
        new = f"ip,in_port={tun},ct_state=+new+trk,nw_src={network}"
        specs.append((t.CLASSIFY, 300, new, f"{MARK_VIA_HOST},goto_table:{t.HOST_IN}"))
        specs.append((t.ROUTE, 100, f"arp,arp_tpa={network}", f"goto_table:{t.ARP_REMOTE}"))
        specs.append((t.ROUTE, 100, f"ip,nw_dst={network}", f"goto_table:{t.REMOTE}"))
    return _flows(node_cookie(), *specs)


def remote_node_flows(node: NodeNetwork, remote: RemoteNode) -> list[Flow]:
    """One remote node: VXLAN from its node IP with inner sources in its subnet (IP
    readdressed to this node's gateway MAC), and the way to its subnet (vxlan0 with the
    VNID in tun_id, or tun0 with host-gw, where the host's route to the node applies)."""
    subnet = remote.subnet
    if node.tunnel != "vxlan":
        return _flows(
            remote_cookie(remote.name),
            (t.REMOTE, 100, f"ip,nw_dst={subnet}", f"output:{t.TUN_PORT}"),
        )
    send = f"{REG0_TO_TUN_ID},set_field:{remote.node_ip}->tun_dst,output:{t.VXLAN_PORT}"
    from_remote = f"in_port={t.VXLAN_PORT},tun_src={remote.node_ip}"
    # the frame was sent to the remote's gateway: readdressed to ours, so that what goes
    # on to tun0 (to the host, a service's reply) is for tun0 (delivery sets the pod's)
    to_gateway = f"set_field:{pod_mac(node.gateway.ip)}->eth_dst"
    vxlan_in = f"goto_table:{t.VXLAN_IN}"
    return _flows(
        remote_cookie(remote.name),
        (t.CLASSIFY, 200, f"ip,{from_remote},nw_src={subnet}", f"{to_gateway},{vxlan_in}"),
        (t.CLASSIFY, 200, f"arp,{from_remote},arp_spa={subnet}", vxlan_in),
        (t.ARP_REMOTE, 100, f"arp,arp_tpa={subnet}", send),
        (t.REMOTE, 100, f"ip,nw_dst={subnet}", send),
    )


def pod_flows(pod: LocalPod, vnid: int) -> list[Flow]:
    """One local pod: its frames must carry its MAC and IP (ARP: sender MAC and IP too);
    its VNID goes into reg0; ARP for it and IP to it are delivered to its port, IP by
    way of ISOLATION with its VNID in reg1 and its port in reg2. ARP skips the policy.
    Its packets that come back from tun0 (a service, DNATed by the host) pass its egress
    policy again: the first time, their destination was the service's address."""
    port, ip, mac = pod.ofport, pod.ip, pod.mac
    load = f"load:{vnid:#x}->NXM_NX_{t.REG_SRC_VNID.upper()}[]"
    deliver = (
        f"load:{vnid:#x}->NXM_NX_{t.REG_DST_VNID.upper()}[],"
        f"load:{port:#x}->NXM_NX_{t.REG_OUT_PORT.upper()}[],"
        f"set_field:{mac}->eth_dst,goto_table:{t.ISOLATION}"
    )
    sender = f"in_port={port},dl_src={mac}"
    return _flows(
        pod_cookie(pod.key),
        (t.POD_IN, 100, f"ip,{sender},nw_src={ip}", f"{load},goto_table:{t.EGRESS_POLICY}"),
        (t.POD_IN, 100, f"arp,{sender},arp_spa={ip},arp_sha={mac}", f"{load},goto_table:{t.ROUTE}"),
        # back from the host after a service's DNAT: egress judged again, to the endpoint
        # (resubmit: OpenFlow's goto_table only goes forward)
        (t.HOST_IN, 150, f"ip,nw_src={ip}", f"{load},resubmit(,{t.EGRESS_POLICY})"),
        (t.ARP_LOCAL, 100, f"arp,arp_tpa={ip}", f"output:{port}"),
        (t.LOCAL, 100, f"ip,nw_dst={ip}", deliver),
    )


def quarantine_flows(pod: LocalPod) -> list[Flow]:
    """A local port whose address has no live owner: whatever it sends is dropped, and no
    flow delivers to it (LOCAL and ARP_LOCAL have none for it: their defaults drop)."""
    return _flows(pod_cookie(pod.key), (t.POD_IN, 100, f"in_port={pod.ofport}", "drop"))


def local_pod_flows(pod: LocalPod, rules: RuleSet | None, vnids: Vnids) -> list[Flow]:
    """A local pod's group: its flows with its VNID, or its quarantine."""
    if quarantined(rules, pod.ip):
        return quarantine_flows(pod)
    return pod_flows(pod, register_vnid(vnids, pod.ip))


def fail_closed_flows(rules: RuleSet | None) -> list[Flow]:
    """Failing closed: a packet with a pod-network source that no identity flow lists
    (``source_vnid_flows``, above these) is dropped, from the tunnel (whatever its
    tun_id: 0 is no longer "global" for an unknown source) and from the host (tun0)."""
    if rules is None or not rules.fails_closed:
        return []
    specs: list[tuple[int, int, str, str]] = []
    for network in rules.pod_networks:
        specs.append((t.VXLAN_IN, 120, f"ip,nw_src={network}", "drop"))
        specs.append((t.HOST_IN, 50, f"ip,nw_src={network}", "drop"))
    return _flows(fail_closed_cookie(), *specs)


def source_vnid_flows(ip: IPv4Address, vnid: int | None) -> list[Flow]:
    """Multitenant, one pod of the cluster: the VNID its packets get in reg0 when they
    come from the tunnel (only with that VNID in tun_id: the sender's view is checked
    against ours) or from the host (a service's DNATed traffic keeps the pod's source)."""
    value = t.UNASSIGNED_VNID if vnid is None else vnid
    load = f"load:{value:#x}->NXM_NX_{t.REG_SRC_VNID.upper()}[],goto_table:{t.ROUTE}"
    tunnel = f"ip,nw_src={ip}" if vnid is None else f"ip,tun_id={vnid:#x},nw_src={ip}"
    specs = [(t.VXLAN_IN, 200, tunnel, load), (t.HOST_IN, 100, f"ip,nw_src={ip}", load)]
    if vnid is not None:  # any other tun_id (0 included) is a disagreement: drop
        specs.append((t.VXLAN_IN, 150, f"ip,nw_src={ip}", "drop"))
    return _flows(vnid_cookie(ip), *specs)


def policy_flows(node: NodeNetwork, rules: RuleSet | None, pods: Iterable[LocalPod]) -> Groups:
    """Tables 21 (egress policy) and 80 (isolation), from ``policyflows``: this node's
    view is its name, its pods' ports and its own addresses (node IP, gateway)."""
    ports = {pod.ip: pod.ofport for pod in pods}
    addresses = frozenset({node.node_ip, node.gateway.ip})
    view = LocalView(node.node_name, ports, addresses, node.service_network)
    return policy_groups(view, rules)


def desired(
    node: NodeNetwork,
    remotes: Iterable[RemoteNode],
    pods: Iterable[LocalPod],
    rules: RuleSet | None,
) -> Groups:
    """Every flow of the node, by group. ``rules`` None: no rule set yet (subnet)."""
    pods = sorted(pods)
    vnids = vnids_of(rules)
    groups: Groups = {node_cookie(): node_flows(node)}
    for remote in usable_remotes(node, remotes):
        groups[remote_cookie(remote.name)] = remote_node_flows(node, remote)
    for pod in pods:
        groups[pod_cookie(pod.key)] = local_pod_flows(pod, rules, vnids)
    for ip, vnid in vnids.items():
        groups[vnid_cookie(ip)] = source_vnid_flows(ip, vnid)
    if closed := fail_closed_flows(rules):
        groups[fail_closed_cookie()] = closed
    groups.update(policy_flows(node, rules, pods))
    return groups
