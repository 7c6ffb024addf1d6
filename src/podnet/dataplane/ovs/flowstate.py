"""What br0 should hold, from what the agent has told this data plane so far (pure).

The flows depend on the node, the remote nodes, the local pods (their ports) and the rule
set (VNIDs, policies). A data plane that just started knows the node (``check_node`` or
``setup_node``) and its pods (from OVSDB), but not yet the remotes or the rule set: the
agent gives those a moment later. Until then the groups of those kinds are *adopted*:
taken as the switch holds them (``parse_dump``), so a restarted agent's first flow sync,
which replaces the whole table (``FlowSync``), finds them equal and changes nothing. A
pod whose VNID is not known yet and that has no flows on the switch gets
``UNASSIGNED_VNID`` (it meets only VNID 0) until the rule set arrives.

The version note is a digest of the node's set-up and its own flows, so a node whose
pipeline changed (another podnet) is found out of date.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, replace

from podnet.dataplane.interface import NodeNetwork, RemoteNode
from podnet.dataplane.ovs import pipeline
from podnet.dataplane.ovs.flow import Flow, Kind, flows_text, kind_of
from podnet.dataplane.ovs.flowsync import note_flow
from podnet.dataplane.ovs.ofctl import parse_flow
from podnet.dataplane.ovs.pipeline import Groups, LocalPod
from podnet.dataplane.ovs.tables import UNASSIGNED_VNID
from podnet.dataplane.wiring import usable_remotes
from podnet.policy.model import RuleSet

NOTE_TAG = b"podnet"
OWN_KINDS = frozenset({Kind.NODE, Kind.NOTE, Kind.REMOTE_NODE, Kind.POD})  # the rest: rules'


def note(node: NodeNetwork) -> Flow:
    """The version note of ``node``: ``podnet`` and 8 bytes of a digest of its set-up and
    of the node's own flows."""
    text = node.version_note() + "\n" + flows_text(pipeline.node_flows(node))
    return note_flow(NOTE_TAG + hashlib.sha256(text.encode()).digest()[:8])


def parse_dump(text: str) -> Groups:
    """``dump-flows --no-stats`` output as groups (flows as the switch shows them)."""
    groups: Groups = {}
    for line in text.splitlines():
        if line.strip() and "actions=" in line:
            found = parse_flow(line)
            flow = Flow(found.table, found.priority, found.match, found.actions, found.cookie)
            groups.setdefault(flow.cookie, []).append(flow)
    return groups


_ONE_BIT_CT_MARK = re.compile(r"set_field:(0x[0-9a-f]+)/\1->ct_mark")


def as_read_back(flow: Flow) -> Flow:
    """``flow`` as the switch shows it when read back, where the two differ in form
    only: a one-bit ``set_field:0xN/0xN->ct_mark`` comes back as
    ``load:0x1->NXM_NX_CT_MARK[b]``, and ``ovs-ofctl`` (diff-flows, replace-flows) would
    otherwise take the flow for a different one on every comparison."""
    if "->ct_mark" not in flow.actions:
        return flow
    actions = _ONE_BIT_CT_MARK.sub(_as_load, flow.actions)
    return flow if actions == flow.actions else replace(flow, actions=actions)


def _as_load(found: re.Match[str]) -> str:
    value = int(found.group(1), 16)
    if value & (value - 1):  # several bits: left as written
        return found.group(0)
    return f"load:0x1->NXM_NX_CT_MARK[{value.bit_length() - 1}]"


@dataclass
class FlowState:
    """The inputs known so far, and the adopted groups for the rest."""

    node: NodeNetwork | None = None
    remotes: list[RemoteNode] | None = None  # None: not told yet
    pods: dict[str, LocalPod] = field(default_factory=dict)  # by LocalPod.key
    rules: RuleSet | None = None
    rules_known: bool = False
    adopted: Groups = field(default_factory=dict)
    _policy: tuple[object, RuleSet | None, Groups] | None = None  # the last policy render

    def groups(self) -> Groups:
        """Every group br0 should hold (the node must be known), the note included."""
        node = self.node
        assert node is not None, "the node is not known yet"
        pods = sorted(self.pods.values())
        groups: Groups = {pipeline.node_cookie(): pipeline.node_flows(node)}
        if self.remotes is None:
            groups.update(self._adopted(Kind.REMOTE_NODE))
        else:
            for remote in usable_remotes(node, self.remotes):
                groups[pipeline.remote_cookie(remote.name)] = pipeline.remote_node_flows(
                    node, remote
                )
        vnids = pipeline.vnids_of(self.rules)
        adopted_rules = {c: f for c, f in self.adopted.items() if kind_of(c) not in OWN_KINDS}
        # rules not known, none found either (a new node): nothing is isolated yet, as
        # with linux before its first policy sync; found: a new pod meets only VNID 0
        unknown_vnid = UNASSIGNED_VNID if adopted_rules else 0
        for pod in pods:
            key = pipeline.pod_cookie(pod.key)
            if self.rules_known:
                groups[key] = pipeline.pod_flows(pod, pipeline.register_vnid(vnids, pod.ip))
            else:
                groups[key] = self.adopted.get(key) or pipeline.pod_flows(pod, unknown_vnid)
        if not self.rules_known and adopted_rules:
            groups.update(adopted_rules)
        elif not self.rules_known:
            groups.update(self._policy_groups(node, pods))
        else:
            for ip, vnid in vnids.items():
                groups[pipeline.vnid_cookie(ip)] = pipeline.source_vnid_flows(ip, vnid)
            groups.update(self._policy_groups(node, pods))
        flow = note(node)
        groups[flow.cookie] = [flow]
        return groups

    def flows(self) -> list[Flow]:
        """Every flow, written as the switch reads it back (``as_read_back``)."""
        return [as_read_back(flow) for flows in self.groups().values() for flow in flows]

    def _adopted(self, kind: Kind) -> Groups:
        return {c: flows for c, flows in self.adopted.items() if kind_of(c) == kind}

    def _policy_groups(self, node: NodeNetwork, pods: list[LocalPod]) -> Groups:
        """Tables 21/80, rendered again only when the node, the rules or the pods changed."""
        ports = tuple((pod.ip, pod.ofport) for pod in pods)
        cached = self._policy
        if cached is None or cached[1] is not self.rules or cached[0] != (node, ports):
            self._policy = (
                (node, ports),
                self.rules,
                pipeline.policy_flows(node, self.rules, pods),
            )
        assert self._policy is not None
        return self._policy[2]
