"""One node's egress firewall (``podnet.egress.nodetable``): per VNID, only for the pods on
the node, with OpenShift SDN's limits said out loud and failing closed."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

from podnet.dataplane.interface import NodeNetwork
from podnet.egress.nodetable import EVERYTHING, node_firewall

A, B = IPv4Address("10.128.0.5"), IPv4Address("10.128.0.6")

NODE = NodeNetwork(
    "node-a",
    IPv4Address("192.0.2.10"),
    IPv4Network("10.128.0.0/24"),
    (IPv4Network("10.128.0.0/14"),),
    IPv4Network("172.30.0.0/16"),
    1450,
)


def policy(namespace: str, name: str = "default", cidr: str = "0.0.0.0/0") -> dict[str, object]:
    return {
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"egress": [{"type": "Deny", "to": {"cidrSelector": cidr}}]},
    }


def test_a_policy_applies_to_its_projects_pods_on_this_node_only() -> None:
    fw = node_firewall([policy("a", cidr="192.0.2.0/24")], {"a": 10, "b": 11}, [("a", A), ("b", B)])
    assert fw.pods == {A: 10}  # b has no policy: nothing to do for it
    assert fw.denied == {10: ((int(IPv4Address("192.0.2.0")), int(IPv4Address("192.0.2.255"))),)}
    elsewhere = node_firewall([policy("a")], {"a": 10}, [])
    assert elsewhere.denied == {} and elsewhere.pods == {}


def test_joined_projects_share_one_firewall_and_two_policies_fail_closed() -> None:
    vnids = {"a": 10, "b": 10}
    shared = node_firewall([policy("a", cidr="192.0.2.0/24")], vnids, [("b", B)])
    assert shared.pods == {B: 10} and 10 in shared.denied  # b is in a's network
    both = node_firewall([policy("a"), policy("b")], vnids, [("a", A)])
    assert both.denied == {10: EVERYTHING}
    assert set(both.problems) == {("a", "default"), ("b", "default")}
    assert "one EgressNetworkPolicy per network" in both.problems[("a", "default")]
    twice = node_firewall([policy("a"), policy("a", "second")], {"a": 10}, [("a", A)])
    assert twice.denied == {10: EVERYTHING} and len(twice.problems) == 2


def test_a_global_project_is_not_firewalled_and_says_why() -> None:
    fw = node_firewall([policy("default")], {"default": 0}, [("default", A)])
    assert fw.denied == {} and fw.pods == {}
    assert "global (VNID 0)" in fw.problems[("default", "default")]


def test_a_policy_that_does_not_compile_fails_closed() -> None:
    broken = {"metadata": {"namespace": "a", "name": "x"}, "spec": {"egress": [{"type": "?"}]}}
    fw = node_firewall([broken], {"a": 10}, [("a", A)])
    assert fw.denied == {10: EVERYTHING} and ("a", "x") in fw.problems


def test_the_nftables_table_a_node_renders() -> None:
    from podnet.dataplane.linux.egressnft import render

    node = NODE
    fw = node_firewall([policy("a", cidr="192.0.2.0/24")], {"a": 10}, [("a", A)])
    text = render(node, fw)
    assert text is not None
    assert "elements = { 10.128.0.0/14, 172.30.0.0/16 }" in text  # never judged
    assert "10.128.0.5 : jump fw_10" in text
    assert "ip daddr { 192.0.2.0-192.0.2.255 } counter drop" in text
    assert text.index("ip daddr @internal return") < text.index("ip saddr vmap @pods")
    assert render(node, node_firewall([], {}, [("a", A)])) is None  # nothing firewalled


def test_the_agent_view_compiles_its_own_pods_and_nothing_with_the_subnet_plugin() -> None:
    from podnet.agent.egress import EgressSync, pacing
    from podnet.client import LISTED, WatchEvent
    from podnet.model.kinds import EGRESS_NETWORK_POLICY, NET_NAMESPACE, POD
    from podnet.model.network import NETWORKPOLICY, SUBNET

    node = NODE
    sync = EgressSync(None, None, node, pacing(60.0))  # type: ignore[arg-type]

    def pod(name: str, node_name: str, ip: str) -> dict[str, object]:
        meta = {"namespace": "a", "name": name}
        return {"metadata": meta, "spec": {"nodeName": node_name}, "status": {"podIP": ip}}

    pods = (pod("here", "node-a", str(A)), pod("there", "node-b", "10.128.1.5"))
    sync.queue(POD, WatchEvent(LISTED, items=pods))
    sync.queue(NET_NAMESPACE, WatchEvent(LISTED, items=({"metadata": {"name": "a"}, "netid": 10},)))
    sync.queue(EGRESS_NETWORK_POLICY, WatchEvent(LISTED, items=(policy("a"),)))
    sync.plugin = lambda: NETWORKPOLICY
    assert sync.take()().pods == {A: 10}  # the other node's pod is not this node's
    sync.plugin = lambda: SUBNET
    assert sync.take()() == node_firewall([], {}, [])  # the subnet plugin firewalls nothing
