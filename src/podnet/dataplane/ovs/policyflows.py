"""Isolation and NetworkPolicy as OpenFlow: tables EGRESS_POLICY (21) and ISOLATION (80).

Pure: ``policy_groups`` turns one node's view (its name, its local pods, its own
addresses) and the compiled ``RuleSet`` into flows grouped by cookie. The contract with
the pipeline (``tables``): a pod's packets reach 21 with its VNID in reg0 and must leave
it by ``goto_table:30`` or be dropped; packets for a local pod reach 80 with the
destination VNID in reg1 and its port in reg2, and leave by ``output:NXM_NX_REG2[]`` or
are dropped. Identity is the IP address: the pipeline has checked every pod's source.

- subnet: 21 passes, 80 delivers.
- multitenant (``RuleSet.isolation``): 80 delivers when reg0 or reg1 is 0, and, per VNID
  of a local pod, when both are that VNID; the rest is dropped. A pod whose project has no
  VNID carries ``UNASSIGNED_VNID``, which has no flow of its own, so it meets only VNID 0.
  A join, isolate or global changes VNIDs only (the pipeline's loads, a group here).
- networkpolicy (``networkpolicy``): 21 judges the egress of local pods and 80 their
  ingress, from conntrack state; isolated pods need a rule, rules are conjunctive matches
  (targets x peers x ports), allowed connections are committed with a mark per table.

Flows grow as pods + policies, never pods x pods; each object's flows share a cookie, so
a change rewrites the groups of what changed (see ``networkpolicy``). The NetworkPolicy
render keeps each node's conjunction member flows from one call to the next and redoes
only the conjunctions that changed; the result is the same as a fresh render (tested).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable

from podnet.dataplane.ovs import tables as t
from podnet.dataplane.ovs.flow import Flow, Kind, cookie
from podnet.dataplane.ovs.networkpolicy import (
    DELIVER,
    P_DEFAULT,
    TO_ROUTE,
    Kept,
    LocalView,
    NetworkPolicyFlows,
    conjunction_cookie,
    match_cookie,
    mode_cookie,
    pod_cookie,
)
from podnet.model.network import MULTITENANT, NETWORKPOLICY, SUBNET
from podnet.policy.model import GLOBAL_VNID, RuleSet

__all__ = [
    "Groups",
    "LocalView",
    "conjunction_cookie",
    "match_cookie",
    "mode_cookie",
    "pod_cookie",
    "policy_flows",
    "policy_groups",
    "rule_conjunctions",
    "vnid_cookie",
]

Groups = dict[int, list[Flow]]  # cookie -> the flows of one object
KEPT_NODES = 8
_KEPT: OrderedDict[str, Kept] = OrderedDict()
_KEPT_LOCK = threading.Lock()


def vnid_cookie(vnid: int) -> int:
    """Multitenant: the group letting one VNID reach itself."""
    return cookie(Kind.ISOLATION, f"vnid/{vnid}")


def policy_groups(view: LocalView, rules: RuleSet | None) -> Groups:
    """Tables 21 and 80 for ``view``'s node, by cookie (``rules`` None: subnet)."""
    plugin = SUBNET if rules is None else rules.plugin
    if plugin == SUBNET:
        return _group(
            [
                Flow(t.EGRESS_POLICY, P_DEFAULT, "", TO_ROUTE, mode_cookie(SUBNET)),
                Flow(t.ISOLATION, P_DEFAULT, "", DELIVER, mode_cookie(SUBNET)),
            ]
        )
    assert rules is not None
    if plugin == MULTITENANT:
        return _group(_multitenant(view, rules))
    if plugin == NETWORKPOLICY:
        with _KEPT_LOCK:  # one render at a time updates a node's kept state
            kept = _kept(view.node)
            try:
                return _group(NetworkPolicyFlows(view, rules, kept).flows())
            except BaseException:
                _KEPT.pop(view.node, None)  # maybe half updated: the next one starts afresh
                raise
    raise ValueError(f"unknown network plugin {plugin!r}")


def _kept(node: str) -> Kept:
    """The member flows of ``node``'s last render (a few nodes' worth are kept: an agent
    renders one node; tests and tools may render several)."""
    found = _KEPT.pop(node, None)
    _KEPT[node] = found = Kept() if found is None else found
    while len(_KEPT) > KEPT_NODES:
        _KEPT.popitem(last=False)
    return found


def rule_conjunctions(view: LocalView, rules: RuleSet) -> dict[str, tuple[int, int]]:
    """Networkpolicy: rule id -> (table, conj id) of the conjunction holding the rule, for
    the rules with a target on this node (what a ``conj_id`` in a trace stands for)."""
    if rules.plugin != NETWORKPOLICY:
        return {}
    rendering = NetworkPolicyFlows(view, rules)
    rendering.flows()
    return rendering.conjunction_of


def policy_flows(view: LocalView, rules: RuleSet | None) -> list[Flow]:
    """Every flow of tables 21 and 80, in a stable order."""
    return sorted(flow for flows in policy_groups(view, rules).values() for flow in flows)


def _group(flows: Iterable[Flow]) -> Groups:
    """By cookie, each group's flows in a stable order (most groups are one flow)."""
    found: Groups = {}
    for flow in flows:
        found.setdefault(flow.cookie, []).append(flow)
    for group in found.values():
        if len(group) > 1:
            group.sort(key=_order)
    return found


# --- multitenant ---------------------------------------------------------------------------


def _multitenant(view: LocalView, rules: RuleSet) -> list[Flow]:
    assert rules.isolation is not None
    by_ip = rules.isolation.by_ip
    if t.UNASSIGNED_VNID in by_ip.values():
        raise ValueError(
            f"VNID {t.UNASSIGNED_VNID:#x} is reserved for pods without a VNID; "
            "no project may have it"
        )
    fixed = mode_cookie(MULTITENANT)
    src, dst = t.REG_SRC_VNID, t.REG_DST_VNID
    flows = [
        Flow(t.EGRESS_POLICY, P_DEFAULT, "", TO_ROUTE, fixed),
        Flow(t.ISOLATION, 210, f"{src}={GLOBAL_VNID}", DELIVER, fixed),
        Flow(t.ISOLATION, 200, f"{dst}={GLOBAL_VNID}", DELIVER, fixed),
        Flow(t.ISOLATION, P_DEFAULT, "", "drop", fixed),
    ]
    local_vnids = {by_ip[ip] for ip in view.pods if ip in by_ip}
    for vnid in sorted(local_vnids - {GLOBAL_VNID}):
        match = f"{src}={vnid:#x},{dst}={vnid:#x}"
        flows.append(Flow(t.ISOLATION, 100, match, DELIVER, vnid_cookie(vnid)))
    return flows


def _order(flow: Flow) -> tuple[int, int, str, str, int]:
    return flow.table, flow.priority, flow.match, flow.actions, flow.cookie
