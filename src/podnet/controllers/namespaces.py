"""Namespace finalization: delete what a Terminating Namespace holds, then the Namespace.

Deleting a Namespace through the API only marks it ``Terminating`` (deletionTimestamp
set; new content is refused). This controller deletes the routes, pods, services,
endpoints, endpoint slices, policies and events left inside it, then, once its pods
are gone too (a pod's deletion is graceful: its node finalizes it), removes the
Namespace itself.
Once synced, and every resync period, it also finds namespaced objects whose Namespace
is gone entirely and removes those.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from functools import partial
from typing import Any

from podnet.client.watch import DELETED
from podnet.controllers.base import Controller, Watch, track
from podnet.controllers.cache import ObjectCache
from podnet.controllers.calls import (
    ControllerApi,
    call,
    create_unless_exists,
    delete_if_present,
    get_or_none,
)
from podnet.model.kinds import (
    EGRESS_NETWORK_POLICY,
    ENDPOINT_SLICE,
    ENDPOINTS,
    EVENT,
    LEASE,
    NAMESPACE,
    NETWORK_POLICY,
    POD,
    ROUTE,
    SERVICE,
    Kind,
)

Obj = dict[str, Any]
WORKERS = 4
SWEEP_RETRY_SECONDS = 10.0  # a failed orphan sweep (a list timing out under load) waits
SWEEP_RETRY_MAX_SECONDS = 300.0  # this long, times its failures in a row, up to this
# Pods are deleted gracefully: each stays (deletionTimestamp set) until the node running
# it finalizes it, or, with that node down, until a DELETE after its grace removes it.
# The namespace is looked at again this often until its pods are gone.
POD_RECHECK_SECONDS = 2.0

# Deleted in this order: what lets traffic in from outside (routes), workloads, then
# what describes them.
NAMESPACED_KINDS: tuple[Kind, ...] = (
    ROUTE,
    POD,
    SERVICE,
    ENDPOINTS,
    ENDPOINT_SLICE,
    NETWORK_POLICY,
    EGRESS_NETWORK_POLICY,
    LEASE,
    EVENT,
)


class NamespaceCleanupController(Controller):
    """Deletes the namespaced objects of deleted Namespaces."""

    name = "namespace-cleanup"

    def __init__(
        self,
        api: ControllerApi,
        resync_period: float | None = 300.0,
        kinds: tuple[Kind, ...] = NAMESPACED_KINDS,
    ) -> None:
        super().__init__(api, WORKERS, resync_period)
        self.kinds = kinds
        self.namespaces = ObjectCache()

    def watches(self) -> list[Watch]:
        return [Watch(NAMESPACE, self._on_namespace)]

    def background(self) -> list[tuple[Coroutine[Any, Any, Any], str]]:
        return [(self._sweep_orphans(), "namespace-cleanup-orphans")]

    def summary(self) -> str:
        return f"{len(self.namespaces)} namespaces"

    def _on_namespace(self, change: str, obj: Obj) -> None:
        name = track(self.namespaces, change, obj)
        if name is not None and (change == DELETED or terminating(obj)):
            self.queue.add(name)

    async def _sweep_orphans(self) -> None:
        """After the sync and every resync period (once without one): queue the namespaces
        that hold objects but no longer exist at all. It reads every object of every
        cleaned-up kind, so it runs beside the work, not before the controller is ready. A
        failed sweep is logged and tried again later: it never ends the controller (and so
        never costs the leader its term, as a failing task would)."""
        failures = 0
        while True:
            try:
                in_use = await self._namespaces_in_use()
            except Exception as exc:  # a sweep is best effort: never fatal
                failures += 1
                delay = min(SWEEP_RETRY_SECONDS * failures, SWEEP_RETRY_MAX_SECONDS)
                self.log.warning(
                    "orphan sweep failed (%s); again in %.0f s", exc or type(exc).__name__, delay
                )
                await asyncio.sleep(delay)
                continue
            failures = 0
            for name in in_use:
                if name not in self.namespaces:
                    self.queue.add(name)  # reconcile confirms with a fresh read
            if self.resync_period is None:
                await asyncio.Event().wait()
            else:
                await asyncio.sleep(self.resync_period)

    async def _namespaces_in_use(self) -> set[str]:
        """Every namespace that holds at least one object of the cleaned-up kinds."""
        names: set[str] = set()
        for kind in self.kinds:
            ask = partial(self.api.namespaces_in_use, kind)
            names |= await call(ask, f"namespaces holding {kind.plural}")
        return names

    async def _list(self, kind: Kind, namespace: str | None = None) -> list[Obj]:
        where = f" in {namespace}" if namespace else ""
        listing = await call(lambda: self.api.list(kind, namespace), f"list {kind.plural}{where}")
        return list(listing.items)

    async def reconcile(self, name: str) -> None:
        namespace = await get_or_none(self.api, NAMESPACE, None, name)
        if namespace is not None and not terminating(namespace):
            self.namespaces.put(namespace)  # alive (or recreated meanwhile): keep its objects
            return
        await self._delete_contents(name)
        if POD in self.kinds and await self._list(POD, name):  # their nodes finalize them
            self.log.info("namespace %s: waiting for its pods to terminate", name)
            self.queue.add_after(name, POD_RECHECK_SECONDS)
            return
        if namespace is not None:
            await call(lambda: self.api.finalize_namespace(name), f"finalize namespace {name}")
            self.log.info("namespace %s finalized", name)

    async def _delete_contents(self, name: str) -> None:
        removed: dict[str, int] = {}
        for kind in self.kinds:
            count = await self._delete_all(kind, name)
            if count:
                removed[kind.plural] = count
        if removed:
            summary = ", ".join(f"{n} {plural}" for plural, n in removed.items())
            self.log.info("namespace %s: deleted %s", name, summary)

    async def _delete_all(self, kind: Kind, namespace: str) -> int:
        deleted = 0
        for obj in await self._list(kind, namespace):
            name = obj["metadata"]["name"]
            deleted += await delete_if_present(self.api, kind, namespace, name)
        return deleted


def terminating(namespace: Obj) -> bool:
    """Whether a Namespace has been deleted and awaits finalization."""
    return bool((namespace.get("metadata") or {}).get("deletionTimestamp"))


async def ensure_namespace(api: ControllerApi, name: str) -> bool:
    """Create Namespace ``name`` if it is missing; True when this call created it."""
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    return await create_unless_exists(api, NAMESPACE, body) is not None
