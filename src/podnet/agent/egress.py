"""The egress firewall on this node: EgressNetworkPolicies, NetNamespaces (VNIDs) and this
node's pods watched, compiled (``podnet.egress.nodetable``) and applied
(``DataPlane.sync_egress_firewall``) by a ``podnet.reconcile`` loop, as the services are:
nothing is applied until every listing has arrived (a partial view could leave a pod
unfiltered, or filter it by another network's rules), bursts are coalesced, failures
retried with backoff, and a periodic resync applies the same firewall again.

A policy's problems (a global project, two policies for one network) are logged here;
the data plane fails closed for the latter.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from ipaddress import IPv4Address
from typing import Any

from podnet.agent.policies import WatchSource
from podnet.agent.watchtasks import Task, loop_tasks
from podnet.client import BOOKMARK, DELETED, LISTED, WatchEvent
from podnet.dataplane.interface import DataPlane, NodeNetwork
from podnet.egress.nodetable import NodeFirewall, node_firewall
from podnet.model.kinds import EGRESS_NETWORK_POLICY, NET_NAMESPACE, POD, Kind
from podnet.model.network import NETWORKPOLICY, uses_vnids
from podnet.reconcile import ApplyRecord, Pacing, ReconcileLoop

log = logging.getLogger("podnet.agent.egress")

KINDS: tuple[Kind, ...] = (EGRESS_NETWORK_POLICY, NET_NAMESPACE, POD)
COALESCE_SECONDS = 0.01
Obj = dict[str, Any]


def pacing(resync_period: float) -> Pacing:
    return Pacing(resync_period, COALESCE_SECONDS)


def _key(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def local_pod_ip(pod: Obj, node: str) -> IPv4Address | None:
    """The address of a running pod of this node (None for others, and finished ones)."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    if spec.get("nodeName") != node or status.get("phase") in ("Succeeded", "Failed"):
        return None
    try:
        return IPv4Address(str(status.get("podIP") or ""))
    except ValueError:
        return None


class EgressSync:
    """Keeps the data plane's egress firewall equal to the compiled policies."""

    name = "egress"

    def __init__(
        self, api: WatchSource, dataplane: DataPlane, node: NodeNetwork, pacing: Pacing, **loop: Any
    ) -> None:
        self.api, self.dataplane, self.node = api, dataplane, node
        self.policies: dict[tuple[str, str], Obj] = {}
        self.vnids: dict[str, int] = {}
        self.pods: dict[tuple[str, str], IPv4Address] = {}
        self.last: NodeFirewall | None = None
        self._problems: dict[tuple[str, str], str] = {}
        # the cluster's plugin (ClusterNetwork's pluginName, the agent's): the subnet
        # plugin firewalls nothing, as the API tells the policy's writer
        self.plugin: Callable[[], str] = lambda: NETWORKPOLICY
        self.loop = ReconcileLoop(self, pacing, inputs=[k.plural for k in KINDS], **loop)
        self.synced = self.loop.synced

    def tasks(self) -> list[Task]:
        return loop_tasks("egress", self.loop.run, self.watch, KINDS)

    async def watch(self, kind: Kind) -> None:
        async for event in self.api.watch(kind):
            self.queue(kind, event)

    def queue(self, kind: Kind, event: WatchEvent) -> None:
        """Take one watch event of ``kind`` into the current view."""
        if event.type == BOOKMARK:
            return
        items = event.items if event.type == LISTED else (event.object,)
        gone = event.type == DELETED
        if kind.plural == EGRESS_NETWORK_POLICY.plural:
            self._take(self.policies, items, event.type, lambda o: None if gone else o)
        elif kind.plural == NET_NAMESPACE.plural:
            if event.type == LISTED:
                self.vnids = {}
            for obj in items:
                name = str((obj.get("metadata") or {}).get("name") or "")
                netid = obj.get("netid")
                if gone or not isinstance(netid, int):
                    self.vnids.pop(name, None)
                else:
                    self.vnids[name] = netid
        else:
            node = self.node.node_name
            self._take(
                self.pods, items, event.type, lambda o: None if gone else local_pod_ip(o, node)
            )
        if event.type == LISTED:
            self.loop.listed(kind.plural)
        else:
            self.loop.changed()

    @staticmethod
    def _take(
        held: dict[tuple[str, str], Any],
        items: Sequence[Obj],
        type_: str,
        value: Callable[[Obj], Any],
    ) -> None:
        if type_ == LISTED:
            held.clear()
        for obj in items:
            found = value(obj)
            if found is None:
                held.pop(_key(obj), None)
            else:
                held[_key(obj)] = found

    # ---- the reconcile target ------------------------------------------------------------

    def take(self) -> Callable[[], NodeFirewall]:
        if not uses_vnids(self.plugin()):
            return NodeFirewall
        pods = [(ns, ip) for (ns, _), ip in sorted(self.pods.items())]
        return functools.partial(
            node_firewall, list(self.policies.values()), dict(self.vnids), pods
        )

    async def apply(self, desired: NodeFirewall) -> None:
        await self.dataplane.sync_egress_firewall(self.node, desired)

    def keys(self, desired: NodeFirewall) -> Sequence[str]:
        return [str(vnid) for vnid in sorted(desired.denied)]

    def without(self, desired: NodeFirewall, left_out: frozenset[str]) -> NodeFirewall:
        """Never leaves a network unfiltered: a refused network's pods are kept off every
        outside destination instead (fail closed)."""
        everything = ((0, 2**32 - 1),)
        denied = {v: everything if str(v) in left_out else d for v, d in desired.denied.items()}
        return NodeFirewall(denied, desired.pods, desired.problems)

    def describe(self, desired: NodeFirewall) -> str:
        return f"{len(desired.denied)} firewalled networks, {len(desired.pods)} pods"

    async def after_apply(self, desired: NodeFirewall, record: ApplyRecord) -> None:
        for key, why in desired.problems.items():
            if self._problems.get(key) != why:
                log.warning("EgressNetworkPolicy %s/%s: %s", *key, why)
        self._problems = dict(desired.problems)
        if (
            self.last is None
            or desired.denied != self.last.denied
            or desired.pods != self.last.pods
        ):
            log.info("egress firewall: %s", self.describe(desired))
        self.last = desired
