"""OVS's own verdict for one packet: ``ofproto/trace`` on a bridge, run and read.

``trace`` sends ``ofproto/trace <bridge> <flow>`` to ``ovs-vswitchd``'s control socket
(through anything with an ``appctl(command, *args)``, such as ``ofctl.OfctlRunner``) and
``parse_trace`` reads the reply: OVS prints one section per pass through the pipeline
(a ``ct(table=N)`` recirculates and the trace resumes with the ``ct_state`` given by
``--ct-next``, ``trk,new`` by default), each listing the flows it matched::

    21. conj_id=7,ip, priority 200, cookie 0x5...
        ct(commit,exec(load:0x1->NXM_NX_CT_MARK[1]))
        goto_table:30
    80. ip,nw_dst=10.128.0.10, priority 100, cookie 0x6...
        drop

and ends each with ``Datapath actions: ...`` (datapath port numbers, not ofports). The
verdict is read at the OpenFlow level, from the ``output`` actions the packet reached
(``output:N``, or ``output:NXM_NX_REG2[]`` with OVS's note ``output port is N``): a port
when it got one, ``controller`` when it was sent there, else ``drop``. That also holds
for a tunnel port whose native tunnelling has no route (the trace says so; the OpenFlow
decision is made).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from ipaddress import IPv4Address
from typing import Protocol

from podnet.dataplane.ovs import tables as t

OUTPUT, DROP, CONTROLLER = "output", "drop", "controller"
PROTOCOLS = {"TCP": "tcp", "UDP": "udp", "SCTP": "sctp", "ICMP": "icmp"}

_STEP = re.compile(
    r"^\s*(?P<table>\d+)\. (?:(?P<match>.*?), )?priority (?P<priority>\d+)"
    r"(?:, cookie (?P<cookie>0x[0-9a-f]+))?$"
)
_BRIDGE = re.compile(r'^bridge\("([^"]+)"\)$')
_TUNNEL_SET = re.compile(r"^set_field:(\S+)->(tun_dst|tun_id)$")
_TUN_ID_NOTE = re.compile(r"NXM_NX_TUN_ID\[[0-9.]*\] is now (0x[0-9a-f]+|\d+)")
_NO_MATCH = re.compile(r"^\s*(?P<table>\d+)\. No match\.?")
_RESUME = re.compile(r"^recirc\(0x[0-9a-f]+\) - resume conntrack with (?:default )?ct_state=(\S+)")
_OUTPUT_ACTION = re.compile(r"^output:(\d+)$")
_OUTPUT_NOTE = re.compile(r"output port is (\d+)")


class Appctl(Protocol):
    """Runs a unixctl command in ``ovs-vswitchd`` (``ofctl.OfctlRunner`` is one)."""

    async def appctl(self, command: str, *args: str) -> str: ...


class TraceError(ValueError):
    """``ofproto/trace`` printed something this parser cannot read."""


@dataclass(frozen=True)
class TracePacket:
    """A packet to trace: where it enters and its headers. ``tun_id``/``tun_src`` for a
    packet from the tunnel port; ``port`` is the destination port (TCP/UDP/SCTP)."""

    in_port: int
    src: IPv4Address
    dst: IPv4Address
    protocol: str = "TCP"  # TCP, UDP, SCTP or ICMP
    port: int | None = None
    src_port: int = 40000
    src_mac: str | None = None
    dst_mac: str | None = None
    tun_id: int | None = None
    tun_src: IPv4Address | None = None
    tun_dst: IPv4Address | None = None

    def flow(self) -> str:
        """The packet in ``ofproto/trace``'s flow syntax."""
        name = PROTOCOLS.get(self.protocol.upper())
        if name is None:
            raise ValueError(f"cannot trace protocol {self.protocol!r}: one of {sorted(PROTOCOLS)}")
        fields = [f"in_port={self.in_port}", name]
        if self.tun_id is not None:
            fields.append(f"tun_id={self.tun_id:#x}")
        if self.tun_src is not None:
            fields.append(f"tun_src={self.tun_src}")
        if self.tun_dst is not None:
            fields.append(f"tun_dst={self.tun_dst}")
        if self.src_mac:
            fields.append(f"dl_src={self.src_mac}")
        if self.dst_mac:
            fields.append(f"dl_dst={self.dst_mac}")
        fields += [f"nw_src={self.src}", f"nw_dst={self.dst}"]
        if name != "icmp":
            fields.append(f"{name}_src={self.src_port}")  # tp_src: TCP only in a trace
            if self.port is not None:
                fields.append(f"{name}_dst={self.port}")
        return ",".join(fields)


@dataclass(frozen=True)
class TraceStep:
    """One flow the packet matched: its table, match, priority, cookie and actions.
    ``priority`` is None for a table where nothing matched (OVS's ``No match``)."""

    table: int
    match: str
    priority: int | None
    cookie: int
    actions: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # OVS's comments: "-> output port is 3", ">> ..."
    bridge: str = ""  # the bridge it is in: the traced one, or the underlay's after a tunnel

    def __str__(self) -> str:
        if self.priority is None:
            return f"{self.table}. no match"
        return f"{self.table}. {self.match or '*'} priority {self.priority} cookie {self.cookie:#x}"


@dataclass(frozen=True)
class TracePass:
    """One pass through the pipeline (the first, or one resumed after ``ct``)."""

    ct_state: str  # the conntrack state it resumed with ("" for the first pass)
    steps: tuple[TraceStep, ...]
    datapath_actions: str
    final_flow: str = ""  # OVS's "Final flow:" ("unchanged", or the rewritten fields)


@dataclass(frozen=True)
class OfTrace:
    """A parsed ``ofproto/trace``: every pass, and the verdict they reach."""

    passes: tuple[TracePass, ...]
    output_ports: tuple[int, ...] = ()
    to_controller: bool = False
    bridge: str = ""  # the bridge traced
    text: str = field(default="", repr=False)

    def tunnel(self) -> tuple[int, IPv4Address] | None:
        """(tun_id, tun_dst) the traced bridge's flows gave the packet, read from their
        actions and OVS's notes (``set_field:..->tun_dst``, ``NXM_NX_TUN_ID[..] is now
        0xb``; the final flow omits tun_id); None when they set no tunnel destination."""
        tun_id, tun_dst = 0, None
        for step in self.steps:
            if step.bridge != self.bridge:
                continue
            for line in (*step.actions, *step.notes):
                found = _TUNNEL_SET.search(line)
                if found and found.group(2) == "tun_dst":
                    tun_dst = IPv4Address(found.group(1))
                elif found:
                    tun_id = int(found.group(1), 0)
                elif noted := _TUN_ID_NOTE.search(line):
                    tun_id = int(noted.group(1), 0)
        return None if tun_dst is None else (tun_id, tun_dst)

    @property
    def verdict(self) -> str:
        """``output`` (see ``output_ports``), ``controller`` or ``drop``."""
        if self.output_ports:
            return OUTPUT
        return CONTROLLER if self.to_controller else DROP

    @property
    def steps(self) -> list[TraceStep]:
        """The flows matched, across all passes, in order."""
        return [step for one in self.passes for step in one.steps]

    @property
    def datapath_actions(self) -> str:
        """The last pass's datapath actions."""
        return self.passes[-1].datapath_actions if self.passes else ""

    def tables(self) -> list[int]:
        """The tables visited, in order (a table visited twice appears twice)."""
        return [step.table for step in self.steps]

    def last_in(self, table: int) -> TraceStep | None:
        """The last flow matched in ``table`` (the one that decided there), if any."""
        found = [step for step in self.steps if step.table == table]
        return found[-1] if found else None


def parse_trace(text: str) -> OfTrace:
    """Read ``ofproto/trace``'s reply (see the module docstring)."""
    passes: list[TracePass] = []
    steps: list[TraceStep] = []
    ct_state, final, bridge, traced = "", "", "", ""
    actions: list[str] = []
    notes: list[str] = []

    def close_step() -> None:  # the lines read since the last step are its own
        if steps and (actions or notes):
            steps[-1] = replace(steps[-1], actions=tuple(actions), notes=tuple(notes))
        actions.clear()
        notes.clear()

    for raw in text.splitlines():
        line = raw.rstrip()
        resumed = _RESUME.match(line)
        if resumed:
            ct_state = resumed.group(1)
            continue
        named = _BRIDGE.match(line)
        if named:
            close_step()
            bridge = named.group(1)
            traced = traced or bridge  # the first one is the bridge traced
            continue
        if line.startswith("Final flow:"):
            close_step()
            final = line.split(":", 1)[1].strip()
            continue
        if line.startswith("Datapath actions:"):
            close_step()
            datapath = line.split(":", 1)[1].strip()
            passes.append(TracePass(ct_state, tuple(steps), datapath, final))
            steps, final = [], ""
            continue
        step = _STEP.match(line) or _NO_MATCH.match(line)
        if step:
            close_step()
            found = step.groupdict()
            priority = found.get("priority")
            steps.append(
                TraceStep(
                    int(found["table"]),
                    found.get("match") or "",
                    int(priority) if priority is not None else None,
                    int(found.get("cookie") or "0", 16),
                    bridge=bridge,
                )
            )
            continue
        body = line.strip()
        if steps and body and raw.startswith("    "):
            (notes if body.startswith(("->", ">>")) else actions).append(body)
    if not traced or not passes:
        raise TraceError(f"not an ofproto/trace reply: {text[:200]!r}")
    return _with_verdict(tuple(passes), traced, text)


def _with_verdict(passes: tuple[TracePass, ...], traced: str, text: str) -> OfTrace:
    """The outputs of the traced bridge's flows (an underlay bridge that carries a
    tunnelled packet on has ports of its own)."""
    ports: list[int] = []
    controller = False
    for step in (s for one in passes for s in one.steps if s.bridge == traced):
        for action in step.actions:
            direct = _OUTPUT_ACTION.match(action)
            if direct:
                ports.append(int(direct.group(1)))
            controller = controller or action.lower().startswith("controller")
        for note in step.notes:
            noted = _OUTPUT_NOTE.search(note)
            if noted:
                ports.append(int(noted.group(1)))
    return OfTrace(passes, tuple(dict.fromkeys(ports)), controller, traced, text)


async def trace(
    switch: Appctl, bridge: str, packet: TracePacket, ct_next: tuple[str, ...] = ()
) -> OfTrace:
    """Trace ``packet`` through ``bridge``; ``ct_next``: the ``ct_state`` each ``ct``
    recirculation resumes with, in order (OVS's default for the rest: ``trk,new``)."""
    args = [bridge, packet.flow()]
    for state in ct_next:
        args += ["--ct-next", state]
    return parse_trace(await switch.appctl("ofproto/trace", *args))


# --- a packet's verdict across nodes -------------------------------------------------------


@dataclass(frozen=True)
class TracedNode:
    """One node as the cross-node verdict needs it: its switch, bridge, node IP, and its
    pods (IP → (ofport, MAC))."""

    name: str
    switch: Appctl
    node_ip: IPv4Address
    pods: Mapping[IPv4Address, tuple[int, str]]
    bridge: str = t.BRIDGE


@dataclass(frozen=True)
class OvsVerdict:
    """Whether OVS lets the packet reach its destination, with the traces that say so
    (node name, trace), source node first."""

    allowed: bool
    traces: tuple[tuple[str, OfTrace], ...]


async def ovs_verdict(
    nodes: Iterable[TracedNode],
    src: IPv4Address,
    dst: IPv4Address,
    protocol: str = "TCP",
    port: int | None = None,
    tun_id: int = 0,
) -> OvsVerdict:
    """The verdict of OVS on every node the packet crosses. A source pod's packet is
    traced from its port on its node; one for a pod of another node must leave on
    vxlan0 for that node's address and is traced again there from vxlan0, with the
    ``tun_id`` the source trace set (``tun_id`` here: the VNID podnet expects, used when
    the trace does not show it); a packet from outside the cluster's pods enters the
    destination pod's node on tun0. It is allowed when it reaches the destination pod's
    port, or tun0 for a destination that is not a pod."""
    by_ip = {ip: node for node in nodes for ip in node.pods}
    src_node, dst_node = by_ip.get(src), by_ip.get(dst)
    traces: list[tuple[str, OfTrace]] = []
    if src_node is not None:
        ofport, mac = src_node.pods[src]
        packet = TracePacket(ofport, src, dst, protocol, port, src_mac=mac)
        first = await trace(src_node.switch, src_node.bridge, packet)
        traces.append((src_node.name, first))
        if dst_node is None:
            return OvsVerdict(first.output_ports == (t.TUN_PORT,), tuple(traces))
        if dst_node is src_node:
            return OvsVerdict(first.output_ports == (dst_node.pods[dst][0],), tuple(traces))
        # what the source node put on the wire (its final flow); ``tun_id`` when the
        # trace does not say (a recorded one may leave the final flow out)
        tunnel = first.tunnel() or (tun_id, dst_node.node_ip)
        if first.output_ports != (t.VXLAN_PORT,) or tunnel[1] != dst_node.node_ip:
            return OvsVerdict(False, tuple(traces))  # dropped, or sent to another node
        packet = TracePacket(
            t.VXLAN_PORT, src, dst, protocol, port, tun_id=tunnel[0], tun_src=src_node.node_ip
        )
    elif dst_node is not None:
        packet = TracePacket(t.TUN_PORT, src, dst, protocol, port)
    else:
        raise ValueError(f"neither {src} nor {dst} is a pod of the traced nodes")
    last = await trace(dst_node.switch, dst_node.bridge, packet)
    traces.append((dst_node.name, last))
    return OvsVerdict(last.output_ports == (dst_node.pods[dst][0],), tuple(traces))
