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

import functools
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from ipaddress import IPv4Address

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
    """The inputs known so far, and the adopted groups for the rest. Parts are rendered
    again only when their inputs change (``_memo``: the node, the remotes list, the rule
    set and the pods' ports, compared by identity or value), so a pod's attach at 5,000
    cluster pods does not render the 5,000 pods' VNID flows again."""

    node: NodeNetwork | None = None
    remotes: list[RemoteNode] | None = None  # None: not told yet
    pods: dict[str, LocalPod] = field(default_factory=dict)  # by LocalPod.key
    rules: RuleSet | None = None
    rules_known: bool = False
    adopted: Groups = field(default_factory=dict)
    _memos: dict[str, tuple[tuple[object, ...], Groups]] = field(default_factory=dict)
    _policy_last: tuple[Groups, Groups] = field(default_factory=lambda: ({}, {}))  # rendered, given
    _vnids_of: tuple[RuleSet | None, dict[IPv4Address, int | None]] | None = None

    def groups(self) -> Groups:
        """Every group br0 should hold (the node must be known), the note included."""
        node = self.node
        assert node is not None, "the node is not known yet"
        pods = sorted(self.pods.values())
        groups = dict(self._memo("node", (node,), lambda: _node_groups(node)))
        if self.remotes is None:
            groups.update(self._adopted(lambda kind: kind == Kind.REMOTE_NODE))
        else:
            remotes = self.remotes
            groups.update(self._memo("remotes", (node, remotes), lambda: _remotes(node, remotes)))
        adopted_rules = self._adopted(lambda kind: kind not in OWN_KINDS)
        vnids = self._vnids()
        # rules not known, none found either (a new node): nothing is isolated yet, as
        # with linux before its first policy sync; found: a new pod meets only VNID 0
        unknown_vnid = UNASSIGNED_VNID if adopted_rules else 0
        for pod in pods:
            key = pipeline.pod_cookie(pod.key)
            if self.rules_known and pipeline.quarantined(self.rules, pod.ip):
                groups[key] = _quarantine_flows(pod)
            elif self.rules_known:
                groups[key] = _pod_flows(pod, pipeline.register_vnid(vnids, pod.ip))
            else:
                groups[key] = self.adopted.get(key) or _pod_flows(pod, unknown_vnid)
        if not self.rules_known and adopted_rules:
            groups.update(adopted_rules)
        else:
            if self.rules_known:
                rules_ = self.rules
                groups.update(self._memo("vnids", (rules_,), lambda: _vnid_groups(vnids, rules_)))
            ports = tuple((pod.ip, pod.ofport) for pod in pods)
            rules = self.rules
            groups.update(
                self._memo("policy", (node, rules, ports), lambda: self._policy(node, rules, pods))
            )
        return groups

    def flows(self) -> list[Flow]:
        """Every flow, written as the switch reads it back (``as_read_back``)."""
        return [flow for flows in self.groups().values() for flow in flows]

    def _vnids(self) -> dict[IPv4Address, int | None]:
        """The source identities of the rule set (computed once per rule set)."""
        rules = self.rules
        cached = self._vnids_of
        if cached is None or cached[0] is not rules:
            cached = self._vnids_of = (rules, pipeline.vnids_of(rules))
        return cached[1]

    def _adopted(self, wanted: Callable[[Kind], bool]) -> Groups:
        return {c: flows for c, flows in self.adopted.items() if wanted(kind_of(c))}

    def _policy(self, node: NodeNetwork, rules: RuleSet | None, pods: list[LocalPod]) -> Groups:
        """Tables 21/80 (``policyflows``), as the switch reads them back. A group equal
        to the last render's is given as the same object again, so ``FlowSync`` passes
        over it without a look inside (the render keeps unchanged member flows, so the
        comparison mostly meets the very same flows)."""
        rendered = pipeline.policy_flows(node, rules, pods)
        last, given = self._policy_last
        groups: Groups = {}
        for value, flows in rendered.items():
            known = last.get(value)
            if known is not None and known == flows:
                rendered[value] = known
                groups[value] = given[value]
            else:
                groups[value] = [as_read_back(f) for f in flows]
        self._policy_last = (rendered, groups)
        return groups

    def _memo(self, name: str, inputs: tuple[object, ...], make: Callable[[], Groups]) -> Groups:
        """``make()``, unless the inputs are the ones of the last call (each the same
        object, or an equal node or ports)."""
        cached = self._memos.get(name)
        if cached is None or not all(
            a is b or (not isinstance(a, (list, RuleSet)) and a == b)
            for a, b in zip(cached[0], inputs, strict=True)
        ):
            cached = (inputs, make())
            self._memos[name] = cached
        return cached[1]


def _node_groups(node: NodeNetwork) -> Groups:
    flow = note(node)
    return {pipeline.node_cookie(): pipeline.node_flows(node), flow.cookie: [flow]}


def _remotes(node: NodeNetwork, remotes: list[RemoteNode]) -> Groups:
    return {
        pipeline.remote_cookie(r.name): pipeline.remote_node_flows(node, r)
        for r in usable_remotes(node, remotes)
    }


@functools.lru_cache(maxsize=4096)
def _pod_flows(pod: LocalPod, vnid: int) -> list[Flow]:
    return pipeline.pod_flows(pod, vnid)


@functools.lru_cache(maxsize=256)
def _quarantine_flows(pod: LocalPod) -> list[Flow]:
    return pipeline.quarantine_flows(pod)


def _vnid_groups(vnids: dict[IPv4Address, int | None], rules: RuleSet | None) -> Groups:
    """The source identities, and (failing closed) the drop of every other pod source."""
    groups = {
        pipeline.vnid_cookie(ip): pipeline.source_vnid_flows(ip, v) for ip, v in vnids.items()
    }
    if closed := pipeline.fail_closed_flows(rules):
        groups[pipeline.fail_closed_cookie()] = closed
    return groups
