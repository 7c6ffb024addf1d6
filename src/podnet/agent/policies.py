"""Isolation and NetworkPolicy: the cluster's objects watched, compiled and applied.

``PolicySync`` watches, cluster-wide, what the network plugin's rule set reads:

- ``redhat/openshift-ovs-subnet``: nothing. It applies the empty rule set once (removing
  what an earlier mode left in the data plane) and again at every resync.
- ``redhat/openshift-ovs-multitenant``: Pods, NetNamespaces and HostSubnets (``hostIP``:
  the node addresses, VNID 0 like the outside).
- ``redhat/openshift-ovs-networkpolicy``: those, Namespaces and NetworkPolicies.

The watch handlers queue each change, slimmed to the fields compile reads. PolicySync is
the ``podnet.reconcile`` target: its loop does nothing until every watch has delivered
its listing (a partial view would isolate pods from peers it has not seen yet), then
waits ``coalesce`` for the rest of a burst, applies the queued changes to a
``PolicyCompiler`` and compiles in a worker thread (a rebuild after a pod change takes
~0.6 s at 5,000 pods and 1,000 policies, which must not stall CNI requests; a policy
change takes a few ms), and hands the ``RuleSet`` to ``DataPlane.sync_policy``. A
failed apply is retried with backoff, and every ``resync_period`` the same rule set is
applied again (the backend makes that cheap) to repair drift.

A rule set the data plane refuses (a policy whose rendering nft rejects) is bisected by
policy: the policies at fault are left out and the rest applies. A left-out policy
keeps its pods isolated but allows nothing (``leave_out``): failing closed, as a policy
that could not be enforced must not open its pods to everyone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gc
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any, Protocol

from podnet.agent.watchtasks import Task, loop_tasks
from podnet.client import DELETED, LISTED, WatchEvent
from podnet.dataplane.interface import DataPlane, NodeNetwork
from podnet.files import write_atomic
from podnet.model.kinds import HOST_SUBNET, NAMESPACE, NET_NAMESPACE, NETWORK_POLICY, POD, Kind
from podnet.model.network import MULTITENANT, NETWORKPOLICY, SUBNET, plugin_name
from podnet.policy.compile import hostsubnet_addresses
from podnet.policy.incremental import (
    NAMESPACES,
    NETNAMESPACES,
    PODS,
    POLICIES,
    SLIM,
    PolicyCompiler,
)
from podnet.policy.model import RuleSet
from podnet.reconcile import ApplyRecord, Pacing, ReconcileLoop, ReconcileMetrics

log = logging.getLogger("podnet.agent.policies")

Obj = Mapping[str, Any]
Change = tuple[str, str, Any]  # (verb, collection, slim object or list of them)
PUT, REMOVE, REPLACE = "put", "remove", "replace"
COALESCE_SECONDS = 0.015  # wait this long after a change for the rest of a burst

WATCHED: dict[str, tuple[Kind, ...]] = {
    SUBNET: (),
    MULTITENANT: (POD, NET_NAMESPACE, HOST_SUBNET),
    NETWORKPOLICY: (POD, NAMESPACE, NET_NAMESPACE, NETWORK_POLICY, HOST_SUBNET),
}
COLLECTION_OF = {
    POD.plural: PODS,
    NAMESPACE.plural: NAMESPACES,
    NET_NAMESPACE.plural: NETNAMESPACES,
    NETWORK_POLICY.plural: POLICIES,
}


class WatchSource(Protocol):
    """What ``PolicySync`` needs of the API client: ``AsyncApiClient.watch``."""

    def watch(self, kind: Kind) -> AsyncIterator[WatchEvent]:
        """``LISTED`` with every object, then ADDED, MODIFIED and DELETED, for ever."""
        ...


def network_plugin(cluster_network: Obj) -> str:
    """The full plugin name of ClusterNetwork ``default`` (subnet when it names none)."""
    return plugin_name(str(cluster_network.get("pluginName") or SUBNET))


def host_ip(hostsubnet: Obj) -> str | None:
    """A HostSubnet's ``hostIP`` when it is a usable IPv4 address."""
    try:
        return str(IPv4Address(str(hostsubnet.get("hostIP") or "")))
    except ValueError:
        return None


def leave_out(rules: RuleSet, keys: frozenset[str]) -> RuleSet:
    """``rules`` with the policies named in ``keys`` (``namespace/name``) enforcing
    nothing: their pods stay isolated (the isolated sets are unchanged) but their rules,
    what they allow, are gone."""
    if not keys:
        return rules
    policies = tuple(
        dataclasses.replace(p, rules=()) if p.key in keys else p for p in rules.policies
    )
    return dataclasses.replace(rules, policies=policies)


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _change(collection: str, event: WatchEvent) -> Change:
    """One watch event as a change to the compiler's view. A changed object is slimmed
    here, so a burst queues only what compile reads; a listing is slimmed by the compiler
    in the worker thread (5,000 pods take ~0.1 s, too long to stall the event loop)."""
    if event.type == LISTED:
        return REPLACE, collection, event.items
    assert event.object is not None
    slim = SLIM[collection](event.object)
    return REMOVE if event.type == DELETED else PUT, collection, slim


class PolicySync:
    """Keeps the data plane's isolation and policy rules equal to the compiled cluster."""

    name = "policy"

    def __init__(
        self,
        api: WatchSource,
        dataplane: DataPlane,
        node: NodeNetwork,
        plugin: str,
        resync_period: float,
        coalesce: float = COALESCE_SECONDS,
        status_path: Path | None = None,
        metrics: ReconcileMetrics | None = None,
        report: Callable[[ApplyRecord], None] | None = None,
    ) -> None:
        self.api = api
        self.status_path = status_path  # a JSON note of the last applied change
        self.dataplane = dataplane
        self.node = node
        self.plugin = plugin
        self.coalesce = coalesce
        self.compiler = PolicyCompiler(plugin)  # touched only by the compile thread
        self.kinds = WATCHED[plugin]
        self.last_rules: RuleSet | None = None
        self.applied = 0  # rule sets applied that differ from the one before
        self.applied_at: float | None = None  # time.monotonic() of the last of them
        self.last_latency: float | None = None  # seconds from its first change to applied
        self._pending: list[Change] = []
        self._node_ips: dict[str, str] = {}  # HostSubnet name -> hostIP
        self._node_addresses: dict[str, list[tuple[str, str]]] = {}  # name -> (node, address)
        self._announced_plugin = plugin
        self.loop = ReconcileLoop(
            self,
            Pacing(resync_period, coalesce, compile_in_thread=True),
            inputs=[kind.plural for kind in self.kinds],  # subnet mode: none, apply at once
            metrics=metrics,
            report=report,
        )
        self.synced = self.loop.synced  # set after each successful apply
        self.ready = self.loop.ready  # whether every watch has delivered its listing
        self.poke = self.loop.poke  # apply now even if nothing changed (node set up again)

    def tasks(self) -> list[Task]:
        """(name, coroutine function) to run supervised: the sync loop, one watch per kind."""
        return loop_tasks("policy", self.loop.run, self.watch, self.kinds)

    def plugin_change(self, cluster_network: Obj) -> list[str]:
        """``pluginName: old -> new``, once, when ClusterNetwork names another plugin than
        the one announced (this one, at first); applying it takes an agent restart."""
        plugin = network_plugin(cluster_network)
        if plugin == self._announced_plugin:
            return []
        old, self._announced_plugin = self._announced_plugin, plugin
        return [f"pluginName: {old} -> {plugin}"]

    # ---- the watches ---------------------------------------------------------------------

    async def watch(self, kind: Kind) -> None:
        """Queue one kind's events for the sync loop; the API client relists on expiry."""
        async for event in self.api.watch(kind):
            self.queue(kind, event)

    def queue(self, kind: Kind, event: WatchEvent) -> None:
        """Queue one watch event of ``kind``."""
        if kind.plural == HOST_SUBNET.plural:
            self._take_hostsubnet(event)
        else:
            self._pending.append(_change(COLLECTION_OF[kind.plural], event))
        if event.type == LISTED:
            self.loop.listed(kind.plural)
        else:
            self.loop.changed()

    def _take_hostsubnet(self, event: WatchEvent) -> None:
        if event.type == LISTED:
            found = ((_name(hs), host_ip(hs)) for hs in event.items)
            self._node_ips = {name: ip for name, ip in found if ip is not None}
            self._node_addresses = {_name(hs): hostsubnet_addresses(hs) for hs in event.items}
            return
        assert event.object is not None
        name, ip = _name(event.object), host_ip(event.object)
        if event.type == DELETED or ip is None:
            self._node_ips.pop(name, None)
        else:
            self._node_ips[name] = ip
        if event.type == DELETED:
            self._node_addresses.pop(name, None)
        else:
            self._node_addresses[name] = hostsubnet_addresses(event.object)

    # ---- the reconcile target ------------------------------------------------------------

    def take(self) -> Callable[[], RuleSet]:
        """Take the queued changes; the step compiles them (in the loop's worker thread)."""
        pending, self._pending = self._pending, []
        node_ips = sorted(set(self._node_ips.values()))
        addresses = [pair for pairs in self._node_addresses.values() for pair in pairs]
        return functools.partial(self._compile, pending, node_ips, addresses)

    async def apply(self, desired: RuleSet) -> None:
        """The whole rule set to the data plane, in one atomic change."""
        await self.dataplane.sync_policy(self.node, desired)

    def keys(self, desired: RuleSet) -> Sequence[str]:
        """Policies by ``namespace/name``, in key order."""
        return [policy.key for policy in desired.policies]

    def without(self, desired: RuleSet, left_out: frozenset[str]) -> RuleSet:
        """See ``leave_out``."""
        return leave_out(desired, left_out)

    def describe(self, desired: RuleSet) -> str:
        """Sizes: pods, policies, rules."""
        pods, policies, rules = len(desired.endpoints), len(desired.policies), len(desired.rules)
        return f"{pods} pods, {policies} policies, {rules} rules"

    async def after_apply(self, desired: RuleSet, record: ApplyRecord) -> None:
        """Log and note a rule set that differs from the last one applied."""
        if desired is not self.last_rules:
            self.applied += 1
            self.applied_at = time.monotonic()
            self.last_latency = self.loop.last_latency
            log.info(
                "policy rules applied (%s): %s; compiled in %.1f ms, %.1f ms after the change",
                self.plugin.rsplit("-", 1)[-1],
                record.what,
                record.compile_seconds * 1000,
                (self.last_latency or 0.0) * 1000,
            )
            await self._note_applied(desired, record)
            if self.last_rules is None:
                gc.freeze()  # the view is built: keep full collections from walking it
        self.last_rules = desired

    def _compile(
        self, changes: list[Change], node_ips: list[str], addresses: list[tuple[str, str]]
    ) -> RuleSet:
        """Runs in a worker thread, one at a time: the compiler is not shared."""
        compiler = self.compiler
        for verb, collection, payload in changes:
            if verb == REPLACE:
                compiler.replace(collection, payload)
            elif verb == REMOVE:
                compiler.remove(collection, payload)
            else:
                compiler.put(collection, payload)
        compiler.set_node_ips(node_ips)
        compiler.set_node_addresses(addresses)
        compiler.set_pod_networks(self.node.cluster_networks)
        return compiler.rules()

    async def _note_applied(self, rules: RuleSet, record: ApplyRecord) -> None:
        """Write ``status_path`` (for people and benchmarks: what was applied, when, and
        how long compiling and applying took)."""
        if self.status_path is None:
            return
        note = {
            "plugin": self.plugin,
            "applied_at": time.time(),
            "changes": self.applied,
            "pods": len(rules.endpoints),
            "policies": len(rules.policies),
            "compile_ms": round(record.compile_seconds * 1000, 1),
            "apply_ms": round((record.seconds - record.compile_seconds) * 1000, 1),
            "latency_ms": round((self.last_latency or 0.0) * 1000, 1),
            "result": record.result,
            "left_out": list(record.left_out),
        }
        text = json.dumps(note, indent=1) + "\n"
        try:
            await asyncio.to_thread(write_atomic, self.status_path, text, 0o644)
        except OSError as exc:
            log.warning("cannot write %s: %s", self.status_path, exc)
