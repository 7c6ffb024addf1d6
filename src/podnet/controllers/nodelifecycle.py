"""Node lifecycle: a node whose agent stops renewing its Lease is no longer Ready.

Each node agent renews the Lease ``kube-node-lease/<node>`` every few seconds
(``podnet.agent.heartbeat``). As Kubernetes' node lifecycle controller does, this one
notes *when it saw* each renewal (its own clock: node clocks may be off) and, once a node
has been silent for ``grace`` seconds, sets the Node's ``Ready`` condition to
``Unknown`` (reason ``NodeStatusUnknown``) and records a ``NodeNotReady`` Event. When
renewals are seen again it sets ``Ready`` back to ``True``. A new leader gives every node
a full grace period from its start, and only a renewal it has seen itself makes a node
Ready again. Nodes that never were Ready (still starting) are left alone.

``PODNET_NODE_MONITOR_GRACE`` (seconds, default 40, Kubernetes' node-monitor-grace-period)
sets the grace for the master; tests use a short one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from podnet.api.objects import now_rfc3339
from podnet.client.errors import has_reason
from podnet.client.watch import DELETED
from podnet.controllers.base import SYNCED, Controller, Watch
from podnet.controllers.calls import ControllerApi, guaranteed_update
from podnet.controllers.objects import record_node_event
from podnet.envsettings import seconds_from_env
from podnet.model.kinds import LEASE, NODE
from podnet.model.schemas_coordination import NODE_LEASE_NAMESPACE

Obj = dict[str, Any]
DEFAULT_GRACE = 40.0
GRACE_ENV = "PODNET_NODE_MONITOR_GRACE"
READY = "Ready"
REASON_UNKNOWN = "NodeStatusUnknown"
REASON_READY = "PodnetReady"
SILENT_MESSAGE = "podnet node agent stopped renewing its Lease"
RENEWED_MESSAGE = "podnet node agent renews its Lease again"
Transition = tuple[str, str, str]  # status, reason, message


def grace_from_env() -> float:
    """The grace period: ``$PODNET_NODE_MONITOR_GRACE`` if it is a positive number, else 40."""
    return seconds_from_env(GRACE_ENV, DEFAULT_GRACE)


def ready_condition(node: Obj) -> Obj | None:
    """The node's ``Ready`` condition, if any."""
    conditions = (node.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if isinstance(c, dict) and c.get("type") == READY), None)


def ready_transition(node: Obj, silent_for: float, grace: float, heard: bool) -> Transition | None:
    """What ``Ready`` should become: Unknown after ``grace`` s of silence; True again once
    a renewal was ``heard`` after this controller marked it Unknown; else None."""
    cond = ready_condition(node)
    if cond is None:
        return None  # never Ready yet: the agent is still starting
    status, reason = cond.get("status"), cond.get("reason")
    if silent_for >= grace and status in ("True", "False"):
        return "Unknown", REASON_UNKNOWN, SILENT_MESSAGE
    if silent_for < grace and heard and status == "Unknown" and reason == REASON_UNKNOWN:
        return "True", REASON_READY, RENEWED_MESSAGE
    return None


def with_ready(node: Obj, change: Transition) -> Obj | None:
    """``node`` with its Ready condition set to ``change`` (None when it already is)."""
    status, reason, message = change
    cond = ready_condition(node)
    if cond is not None and (cond.get("status"), cond.get("reason")) == (status, reason):
        return None
    now = now_rfc3339()
    since = cond.get("lastTransitionTime", now) if cond and cond.get("status") == status else now
    new = {"type": READY, "status": status, "reason": reason, "message": message}
    new |= {"lastHeartbeatTime": now, "lastTransitionTime": since}
    status_obj = node.setdefault("status", {})
    others = [c for c in status_obj.get("conditions") or [] if c.get("type") != READY]
    status_obj["conditions"] = [*others, new]
    return node


def _renew_time(lease: Obj) -> str:
    return str((lease.get("spec") or {}).get("renewTime") or "")


class NodeLifecycleController(Controller):
    """Marks silent nodes' Ready condition Unknown, and Ready again when they renew."""

    name = "node-lifecycle"

    def __init__(
        self,
        api: ControllerApi,
        grace: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(api)
        self.grace = grace if grace is not None else grace_from_env()
        self.period = min(1.0, self.grace / 8)
        self.clock = clock
        self.nodes: dict[str, Obj] = {}
        self._seen_at: dict[str, float] = {}  # node -> when a renewal was last seen
        self._renewed: dict[str, str] = {}  # node -> last renewTime seen
        self._heard: set[str] = set()  # nodes whose renewal this controller saw itself
        self._syncing = True

    def watches(self) -> list[Watch]:
        """Nodes, then Leases: every node gets a full grace from this start."""
        return [Watch(NODE, self._on_node, False), Watch(LEASE, self._on_lease, False)]

    async def synced(self) -> None:
        self._syncing = False

    def background(self) -> list[tuple[Coroutine[Any, Any, Any], str]]:
        return [(self._monitor(), "node-lifecycle-monitor")]

    def summary(self) -> str:
        return f"{len(self.nodes)} nodes, grace {self.grace:.0f}s"

    def _on_node(self, change: str, obj: Obj) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return
        if change == DELETED:
            for table in (self.nodes, self._seen_at, self._renewed):
                table.pop(name, None)
            self._heard.discard(name)
            return
        self.nodes[name] = obj
        self._seen_at.setdefault(name, self.clock())

    def _on_lease(self, change: str, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if change in (SYNCED, DELETED) or meta.get("namespace") != NODE_LEASE_NAMESPACE:
            return
        renewed = _renew_time(obj)
        if name and renewed and renewed != self._renewed.get(name):
            self._renewed[name] = renewed
            self._seen_at[name] = self.clock()
            if not self._syncing:
                self._heard.add(name)

    async def _monitor(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            for name in sorted(self.nodes):
                await self.check(name)

    async def check(self, name: str) -> Transition | None:
        """Apply ``ready_transition`` to one node; the transition written, if any."""
        node = self.nodes.get(name)
        if node is None:
            return None
        silent = self.clock() - self._seen_at.get(name, self.clock())
        # One monitor period early, so the mark lands within the grace, never after it.
        limit = self.grace - self.period
        change = ready_transition(node, silent, limit, name in self._heard)
        if change is None:
            return None
        updated = await self._write(name, change)
        if updated is None:
            return None
        self.nodes[name] = updated
        if change[1] == REASON_UNKNOWN:
            self.log.warning("node %s: no Lease renewal for %.0fs; Ready=Unknown", name, silent)
            await record_node_event(self.api, updated, "NodeNotReady", change[2], self.log)
        else:
            self.log.info("node %s renews its Lease again; Ready=True", name)
        return change

    async def _write(self, name: str, change: Transition) -> Obj | None:
        try:
            return await guaranteed_update(
                self.api, NODE, None, name, lambda n: with_ready(n, change), status=True
            )
        except Exception as exc:
            if has_reason(exc, "NotFound"):
                return None
            raise
