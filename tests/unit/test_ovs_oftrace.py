"""The ``ofproto/trace`` reader and the cross-node verdict (``oftrace``), on replies
OVS 3.1 gave here and on a fake switch; on real OVS: tests/integration/test_ovs_policy_trace.py.
"""

from __future__ import annotations

from dataclasses import replace
from ipaddress import IPv4Address

import pytest

from podnet.dataplane.ovs import oftrace
from podnet.dataplane.ovs import tables as t
from podnet.dataplane.ovs.oftrace import TracedNode, TracePacket, ovs_verdict, parse_trace

# --- ofproto/trace --------------------------------------------------------------------------

RULE = "=" * 79


def bridge(steps: str, datapath: str, resumed: str = "", name: str = "br0") -> str:
    """One pass of a trace as OVS 3.1 prints it: after a ``ct`` recirculation, resumed
    with a conntrack state (and from a table), then the flows matched and the actions."""
    head = ""
    if resumed:
        state, table = resumed.split("@")
        head = f"{RULE}\nrecirc(0x1) - resume conntrack with {state}\n{RULE}\n\n"
        steps = f"    thaw\n        Resuming from table {table}\n{steps}"
    return f'{head}bridge("{name}")\n-------------\n{steps}\nDatapath actions: {datapath}\n\n'


# a real reply of OVS 3.1 (netdev), the long Flow/Megaflow lines left out: a pod's packet
# to a pod of the same node, allowed by a conjunction in table 80 after two ct passes
LOCAL_ALLOWED = (
    bridge(
        " 0. ct_state=-trk,ip, priority 1000, cookie 0x1545ea538461003\n"
        "    ct(table=0)\n    drop\n"
        "     -> A clone of the packet is forked to recirculate.\n",
        "ct,recirc(0x1)",
    )
    + bridge(
        " 0. ip, priority 100, cookie 0x1545ea538461003\n    goto_table:20\n"
        "21. ip, priority 50, cookie 0x4e593749f38d332\n"
        "    ct(commit,exec(load:0x1->NXM_NX_CT_MARK[1]))\n    goto_table:30\n"
        "80. ct_state=-trk,ip, priority 400, cookie 0x4e593749f38d332\n"
        "    ct(table=80)\n    drop\n",
        "ct(commit,mark=0x2/0x2),set(eth(dst=0a:58:0a:80:00:0a)),ct,recirc(0x2)",
        "default ct_state=trk|new (use --ct-next to customize)@0",
    )
    + bridge(
        "80. conj_id=2193119859,ip, priority 200, cookie 0x568c6d6a3f6947b\n"
        "    ct(commit,exec(load:0x1->NXM_NX_CT_MARK[2]))\n    output:NXM_NX_REG2[]\n"
        "     -> output port is 3\n\nFinal flow: unchanged\n",
        "ct(commit,mark=0x4/0x4),4",
        "ct_state=est|trk@80",
    )
)

DROPPED = """\
bridge("br0")
-------------
70. ip,nw_dst=10.128.0.10, priority 100, cookie 0x3ad168c9f744dbc
    goto_table:80
80. ip,nw_dst=10.128.0.10, priority 100, cookie 0x6c263de73ea6a03
    drop
21. No match.
    drop

Datapath actions: drop
"""


def test_parse_trace_reads_passes_steps_and_verdict() -> None:
    found = parse_trace(LOCAL_ALLOWED)
    assert [p.ct_state for p in found.passes] == ["", "trk|new", "est|trk"]
    assert found.tables() == [0, 0, 21, 80, 80]
    assert found.verdict == oftrace.OUTPUT and found.output_ports == (3,)
    decided = found.last_in(80)
    assert decided is not None
    assert (decided.match, decided.priority, decided.cookie) == (
        "conj_id=2193119859,ip", 200, 0x568C6D6A3F6947B
    )  # fmt: skip
    assert decided.actions[-1] == "output:NXM_NX_REG2[]"
    assert decided.notes == ("-> output port is 3",)
    assert found.datapath_actions == "ct(commit,mark=0x4/0x4),4"
    assert found.passes[0].steps[0].actions == ("ct(table=0)", "drop")


def test_parse_trace_drop_and_no_match() -> None:
    found = parse_trace(DROPPED)
    assert found.verdict == oftrace.DROP and found.output_ports == ()
    assert found.steps[-1].priority is None and str(found.steps[-1]) == "21. no match"
    with_controller = DROPPED.replace("    drop\n21.", "    controller(reason=no_match)\n21.")
    assert parse_trace(with_controller).verdict == oftrace.CONTROLLER


def test_parse_trace_refuses_other_text() -> None:
    with pytest.raises(oftrace.TraceError, match="not an ofproto/trace reply"):
        parse_trace("ovs-appctl: unknown command")


def test_trace_packet_flow_text() -> None:
    a, b = IPv4Address("10.128.0.10"), IPv4Address("10.128.1.10")
    packet = TracePacket(1, a, b, "udp", 53, tun_id=10, tun_src=IPv4Address("10.0.1.2"))
    assert packet.flow() == (
        "in_port=1,udp,tun_id=0xa,tun_src=10.0.1.2,nw_src=10.128.0.10,nw_dst=10.128.1.10,"
        "udp_src=40000,udp_dst=53"
    )
    assert TracePacket(3, a, b, "ICMP", src_mac="0a:58:0a:80:00:0a").flow() == (
        "in_port=3,icmp,dl_src=0a:58:0a:80:00:0a,nw_src=10.128.0.10,nw_dst=10.128.1.10"
    )
    with pytest.raises(ValueError, match="cannot trace protocol"):
        TracePacket(3, a, b, "GRE").flow()


class FakeSwitch:
    """Answers every trace with one reply, and remembers what it was asked."""

    def __init__(self, reply: str) -> None:
        self.reply, self.asked = reply, list[tuple[str, ...]]()

    async def appctl(self, command: str, *args: str) -> str:
        self.asked.append((command, *args))
        return self.reply


async def test_ovs_verdict_traces_on_both_nodes() -> None:
    a, b = IPv4Address("10.128.0.10"), IPv4Address("10.128.1.10")
    outside = IPv4Address("1.1.1.1")
    leaves = LOCAL_ALLOWED.replace("-> output port is 3", "-> output port is 1")
    one, two = FakeSwitch(leaves), FakeSwitch(LOCAL_ALLOWED)
    nodes = [
        TracedNode("n1", one, IPv4Address("10.0.1.1"), {a: (3, "0a:58:0a:80:00:0a")}),
        TracedNode("n2", two, IPv4Address("10.0.1.2"), {b: (3, "0a:58:0a:80:01:0a")}),
    ]
    verdict = await ovs_verdict(nodes, a, b, "TCP", 80, tun_id=11)
    assert verdict.allowed and [n for n, _ in verdict.traces] == ["n1", "n2"]
    assert "in_port=3,tcp,dl_src=0a:58:0a:80:00:0a" in one.asked[0][2]
    assert two.asked[0][2].startswith("in_port=1,tcp,tun_id=0xb,tun_src=10.0.1.1,")
    assert not (await ovs_verdict(nodes, b, a, "TCP", 80)).allowed  # n2 outputs to 3, not 1
    assert (await ovs_verdict(nodes, outside, b)).allowed  # from tun0 on n2
    assert two.asked[-1][2].startswith(f"in_port={t.TUN_PORT},")
    with pytest.raises(ValueError, match="neither"):
        await ovs_verdict(nodes, outside, outside)


# a pod's packet to another node, as OVS 3.1 printed it here: out vxlan0 by native
# tunnelling, then the underlay bridge's own flow (its uplink made port 2 here)
TUNNELLED = bridge(
    "90. ip,nw_dst=10.128.2.0/23, priority 100, cookie 0x2612fd28905f327\n"
    "    move:NXM_NX_REG0[]->NXM_NX_TUN_ID[0..31]\n"
    "     -> NXM_NX_TUN_ID[0..31] is now 0xb\n"
    "    set_field:198.51.100.12->tun_dst\n    output:1\n"
    "     -> output to native tunnel\n     -> tunneling to 198.51.100.12 via br-phy\n\n"
    'bridge("br-phy")\n----------------\n'
    " 0. in_port=LOCAL, priority 100, cookie 0x13f3ba051cf028e\n    output:2\n\n"
    "Final flow: recirc_id=0x1,eth,tcp,reg0=0xb,tun_src=0.0.0.0,tun_dst=198.51.100.12,"
    "tun_ipv6_src=::,in_port=3,nw_src=10.128.0.10,nw_dst=10.128.2.10\n",
    "tnl_push(tnl_port(5),header(size=50,type=4)),out_port(2)),2",
)


def test_the_underlay_bridge_after_a_tunnel_is_not_the_traced_one() -> None:
    found = parse_trace(TUNNELLED)
    assert found.bridge == "br0" and found.output_ports == (1,)  # not br-phy's port 2
    assert [s.bridge for s in found.steps] == ["br0", "br-phy"]
    assert found.tunnel() == (0xB, IPv4Address("198.51.100.12"))
    assert parse_trace(LOCAL_ALLOWED).tunnel() is None


async def test_ovs_verdict_takes_the_tunnel_the_source_set() -> None:
    a, b = IPv4Address("10.128.0.10"), IPv4Address("10.128.2.10")
    one, two = FakeSwitch(TUNNELLED), FakeSwitch(LOCAL_ALLOWED)
    here = TracedNode("n1", one, IPv4Address("198.51.100.11"), {a: (3, "0a:58:0a:80:00:0a")})
    there = TracedNode("n2", two, IPv4Address("198.51.100.12"), {b: (3, "0a:58:0a:80:02:0a")})
    verdict = await ovs_verdict([here, there], a, b, "TCP", 80, tun_id=7)
    assert verdict.allowed  # with the VNID on the wire (0xb), not the one expected (7)
    assert two.asked[0][2].startswith("in_port=1,tcp,tun_id=0xb,tun_src=198.51.100.11,")
    elsewhere = replace(there, node_ip=IPv4Address("198.51.100.13"))
    assert not (await ovs_verdict([here, elsewhere], a, b, "TCP", 80)).allowed
