"""OVS's own verdict for the pairs ``podnet trace --ofproto`` traces, on the local cluster.

Each node of a cluster on the ``ovs`` data plane runs its own ``ovs-vswitchd`` under its
agent's state dir (``<state dir>/nodes/<node>/agent/ovs``). The CLI runs in the root
namespace and reaches it through unix sockets only: the node's OVSDB (which pods sit on
which ofport, from the identity in their ports' external_ids) and vswitchd's control
socket (``ofproto/trace``). ``OfprotoCluster.verdict`` then traces one packet with
``oftrace.ovs_verdict``: on the source pod's node from its port and, when it crosses, on
the destination node from vxlan0 with the ``tun_id`` and ``tun_src`` the tunnel delivers
it with. ``OfprotoCheck`` puts OVS's verdict next to podnet's; any difference is a
``DISAGREEMENT``.

Nothing here changes the switch: a trace is a lookup, not a packet.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Interface
from pathlib import Path

from podnet.cluster.nodes import node_paths
from podnet.cluster.state import ClusterState
from podnet.dataplane.interface import DataPlaneError, pod_mac
from podnet.dataplane.ovs import tables as t
from podnet.dataplane.ovs.flow import Kind, kind_of
from podnet.dataplane.ovs.instance import VSWITCHD, OvsPaths
from podnet.dataplane.ovs.ofctl import OfctlRunner
from podnet.dataplane.ovs.oftrace import OfTrace, OvsVerdict, TracedNode, TraceStep, ovs_verdict
from podnet.dataplane.ovs.ovsdb import Ovsdb
from podnet.dataplane.ovs.ovspods import IDENTITY, IDENTITY_VERSION
from podnet.dataplane.ovs.pipeline import register_vnid, vnids_of
from podnet.policy.model import RuleSet
from podnet.policy.trace import TraceError

DATAPLANE = "ovs"
KIND_NAMES = {
    Kind.NODE: "node",
    Kind.REMOTE_NODE: "remote node",
    Kind.POD: "pod",
    Kind.ISOLATION: "isolation",
    Kind.POLICY: "policy rule",
    Kind.POLICY_POD: "pod isolation",
    Kind.POLICY_MATCH: "policy match",
    Kind.NOTE: "note",
}
PORT_NAMES = {t.VXLAN_PORT: t.VXLAN, t.TUN_PORT: t.TUN}


def object_kind(cookie: int) -> str:
    """What object a flow's cookie names (``-`` for cookie 0, ``?`` for an unknown kind)."""
    if cookie == 0:
        return "-"
    try:
        return KIND_NAMES[kind_of(cookie)]
    except ValueError:
        return "?"


def node_ovs_paths(state_dir: Path, node: str) -> OvsPaths:
    """Where node ``node``'s agent keeps its OVS instance (registry: ``<state dir>/ovs``)."""
    return OvsPaths(node_paths(state_dir, node).agent_dir / "ovs")


def pod_ports(ports: Iterable[tuple[int, dict[str, str]]]) -> dict[IPv4Address, tuple[int, str]]:
    """Pod IP → (ofport, MAC) from (ofport, external_ids) of br0's ports: only ports that
    carry a pod's identity and were given an ofport."""
    found = {}
    for ofport, ids in ports:
        if ids.get(IDENTITY) != IDENTITY_VERSION or ofport < t.FIRST_POD_PORT:
            continue
        try:
            ip = IPv4Interface(ids.get("address", "")).ip
        except ValueError:
            continue
        found[ip] = (ofport, pod_mac(ip))
    return found


async def read_node(name: str, node_ip: str, paths: OvsPaths) -> TracedNode:
    """One node's switch and pods, read through its sockets; TraceError when its OVS is
    not there (the agent never started it, or it is down)."""
    socket = paths.unixctl(VSWITCHD)
    if not paths.db_socket.exists() or not socket.exists():
        raise TraceError(f"--ofproto: {name} has no running Open vSwitch at {paths.base}")
    try:
        db = await Ovsdb.connect(paths.db_socket)
    except DataPlaneError as exc:
        raise TraceError(f"--ofproto: {name}: {exc}") from exc
    try:
        ports = await db.ports(t.BRIDGE)
    finally:
        await db.close()
    pods = pod_ports((p.ofport, p.external_ids) for p in ports)
    return TracedNode(name, OfctlRunner(paths), IPv4Address(node_ip), pods)


def ovs_cluster(state_dir: Path) -> ClusterState:
    """The local cluster at ``state_dir``; TraceError when there is none or it does not
    run the ovs data plane."""
    state = ClusterState.load(state_dir)
    if state is None or not state.cluster_id:
        raise TraceError(f"--ofproto needs the local cluster, and there is none at {state_dir}")
    if state.dataplane != DATAPLANE:
        raise TraceError(
            f"--ofproto needs the ovs data plane: the local cluster at {state_dir} runs "
            f"the {state.dataplane} data plane, which has no OpenFlow tables to trace"
        )
    return state


@dataclass(frozen=True)
class OfprotoCluster:
    """The local cluster's switches, ready to trace."""

    nodes: tuple[TracedNode, ...]

    @staticmethod
    async def load(state_dir: Path) -> OfprotoCluster:
        """Every node of the cluster at ``state_dir`` (see ``ovs_cluster``)."""
        state = ovs_cluster(state_dir)
        found = [
            await read_node(name, record.ip, node_ovs_paths(state_dir, name))
            for name, record in sorted(state.nodes.items())
        ]
        return OfprotoCluster(tuple(found))

    def holds(self, ip: IPv4Address) -> bool:
        """Whether ``ip`` is a pod wired on one of the switches."""
        return any(ip in node.pods for node in self.nodes)

    async def verdict(
        self, rules: RuleSet, src: IPv4Address, dst: IPv4Address, protocol: str, port: int | None
    ) -> OvsVerdict | None:
        """OVS's verdict for the packet (None when neither end is a pod on a switch)."""
        if not (self.holds(src) or self.holds(dst)):
            return None
        tun_id = register_vnid(vnids_of(rules), src)
        try:
            return await ovs_verdict(self.nodes, src, dst, protocol, port, tun_id)
        except DataPlaneError as exc:
            raise TraceError(f"--ofproto: ofproto/trace failed: {exc}") from exc


# --- the comparison -----------------------------------------------------------------------


@dataclass(frozen=True)
class OfprotoCheck:
    """podnet's verdict for a packet next to OVS's (``ovs`` None: not traced)."""

    allowed: bool
    ovs: OvsVerdict | None

    @property
    def agrees(self) -> bool:
        """Whether OVS decides as podnet does (an untraced packet cannot disagree)."""
        return self.ovs is None or self.ovs.allowed == self.allowed

    def line(self) -> str:
        """``ofproto/trace: ALLOWED (agrees)`` or a loud DISAGREEMENT line."""
        if self.ovs is None:
            return "ofproto/trace: not traced (neither end is a pod on an ovs node)"
        said = _word(self.allowed)
        if self.agrees:
            return f"ofproto/trace: {said} (OVS agrees)"
        return (
            f"DISAGREEMENT: the rules say {said} but OVS's ofproto/trace "
            f"{'delivers' if self.ovs.allowed else 'drops'} it: a data plane bug"
        )

    def decided(self, detail: bool = True) -> list[str]:
        """The tables that decided, per traced node (one line each, source first)."""
        if self.ovs is None:
            return []
        return [f"  {name} br0: {path(trace, detail)}" for name, trace in self.ovs.traces]


def _word(allowed: bool) -> str:
    return "ALLOWED" if allowed else "DENIED"


def path(trace: OfTrace, detail: bool = True) -> str:
    """The flows that decided, one per table in the order visited, then the outcome:
    ``0 p100 node -> 20 p100 pod -> ... => output:1 (vxlan0)``; with ``detail``,
    each with its cookie."""
    steps = _deciding(trace.steps)
    hops = " -> ".join(_hop(step, detail) for step in steps) or "no flow matched"
    return f"{hops} => {_outcome(trace)}"


def _deciding(steps: Sequence[TraceStep]) -> list[TraceStep]:
    """The last flow of each run of the same table (a resubmit revisits a table)."""
    kept: list[TraceStep] = []
    for step in steps:
        if kept and kept[-1].table == step.table and kept[-1].priority == step.priority:
            kept[-1] = step
        else:
            kept.append(step)
    return kept


def _hop(step: TraceStep, detail: bool) -> str:
    if step.priority is None:
        return f"{step.table} no match"
    text = f"{step.table} p{step.priority} {object_kind(step.cookie)}"
    return f"{text} ({step.cookie:#x})" if detail else text


def _outcome(trace: OfTrace) -> str:
    if not trace.output_ports:
        return trace.verdict
    named = [f"output:{p}" + (f" ({PORT_NAMES[p]})" if p in PORT_NAMES else "") for p in
             trace.output_ports]  # fmt: skip
    return ", ".join(named)


async def checks(
    cluster: OfprotoCluster,
    rules: RuleSet,
    packets: Sequence[tuple[IPv4Address, IPv4Address, bool]],
    protocol: str,
    port: int | None,
) -> list[OfprotoCheck]:
    """OVS's verdict for each (src, dst, podnet's allowed), in order."""
    return [
        OfprotoCheck(allowed, await cluster.verdict(rules, src, dst, protocol, port))
        for src, dst, allowed in packets
    ]
