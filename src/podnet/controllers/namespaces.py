"""Namespace finalization: delete what a Terminating Namespace holds, then the Namespace.

Deleting a Namespace through the API only marks it ``Terminating`` (deletionTimestamp
set; new content is refused). This controller deletes the pods, services, endpoints,
policies and events left inside it, then removes the Namespace itself. At start it also
finds namespaced objects whose Namespace is gone entirely and removes those.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from podnet.api.registry import Registry
from podnet.controllers.informer import (
    DELETED,
    RESYNC,
    SYNCED,
    ObjectCache,
    call_with_retry,
    consume_until_synced,
    get_or_none,
    pump,
    resource_version,
    watch_objects,
)
from podnet.controllers.workqueue import KeyedQueue, cancel_all, spawn
from podnet.model.errors import ApiError
from podnet.model.kinds import (
    EGRESS_NETWORK_POLICY,
    ENDPOINTS,
    EVENT,
    LEASE,
    NAMESPACE,
    NETWORK_POLICY,
    POD,
    SERVICE,
    Kind,
)

Obj = dict[str, Any]

# Deleted in this order: workloads first, then what describes them.
NAMESPACED_KINDS: tuple[Kind, ...] = (
    POD,
    SERVICE,
    ENDPOINTS,
    NETWORK_POLICY,
    EGRESS_NETWORK_POLICY,
    LEASE,
    EVENT,
)


class NamespaceCleanupController:
    """Deletes the namespaced objects of deleted Namespaces."""

    def __init__(
        self,
        registry: Registry,
        log: logging.Logger | None = None,
        workers: int = 4,
        resync_period: float | None = 300.0,
        kinds: tuple[Kind, ...] = NAMESPACED_KINDS,
    ) -> None:
        self.registry = registry
        self.log = log or logging.getLogger("podnet.controllers.namespaces")
        self.kinds = kinds
        self.namespaces = ObjectCache()
        self.queue = KeyedQueue("namespace-cleanup", self._reconcile, workers)
        self.ready = False
        self._resync = resync_period
        self._tasks: list[Any] = []

    @property
    def tasks(self) -> list[Any]:
        """The controller's long-running tasks (for the manager to supervise)."""
        return self._tasks + self.queue.tasks

    async def start(self) -> None:
        """List Namespaces, clean up leftovers of deleted ones; return once done."""
        stream = watch_objects(self.registry, NAMESPACE, self._resync)
        await consume_until_synced(stream, self._on_namespace)
        for name in await self._namespaces_in_use():
            if name not in self.namespaces:
                self.queue.add(name)
        self.queue.start()
        spawn(self._tasks, pump(stream, self._on_namespace), "namespace-cleanup-watch")
        await self.queue.wait_idle()
        self.ready = True
        self.log.info("namespace cleanup controller synced: %d namespaces", len(self.namespaces))

    async def stop(self) -> None:
        """Stop the watch and workers."""
        self.ready = False
        await self.queue.stop()
        await cancel_all(self._tasks)
        self._tasks.clear()

    def _on_namespace(self, change: str, obj: Obj) -> None:
        if change == SYNCED:
            self.namespaces.forget_deletions(resource_version(obj))
        if change in (SYNCED, RESYNC):
            return
        name = obj["metadata"]["name"]
        if change == DELETED:
            self.namespaces.remove(name, resource_version(obj))
            self.queue.add(name)
        else:
            self.namespaces.put(obj)
            if terminating(obj):
                self.queue.add(name)

    async def _namespaces_in_use(self) -> set[str]:
        """Every namespace that holds at least one object of the cleaned-up kinds."""
        names: set[str] = set()
        for kind in self.kinds:
            items, _ = await call_with_retry(self._lister(kind), f"list {kind.plural}")
            names |= {obj["metadata"]["namespace"] for obj in items}
        return names

    def _lister(self, kind: Kind) -> Callable[[], Awaitable[tuple[list[Obj], int]]]:
        return lambda: self.registry.list(kind)

    async def _reconcile(self, name: str) -> None:
        namespace = await get_or_none(self.registry, NAMESPACE, name)
        if namespace is not None and not terminating(namespace):
            self.namespaces.put(namespace)  # alive (or recreated meanwhile): keep its objects
            return
        await self._delete_contents(name)
        if namespace is not None:
            await call_with_retry(
                lambda: self.registry.finalize_namespace(name), f"finalize namespace {name}"
            )
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
        items, _ = await call_with_retry(
            lambda: self.registry.list(kind, namespace), f"list {kind.plural} in {namespace}"
        )
        deleted = 0
        for obj in items:
            deleted += await self._delete(kind, namespace, obj["metadata"]["name"])
        return deleted

    async def _delete(self, kind: Kind, namespace: str, name: str) -> int:
        try:
            await call_with_retry(
                lambda: self.registry.delete(kind, namespace, name),
                f"delete {kind.singular} {namespace}/{name}",
            )
        except ApiError as exc:
            if exc.reason == "NotFound":
                return 0
            raise
        return 1


def terminating(namespace: Obj) -> bool:
    """Whether a Namespace has been deleted and awaits finalization."""
    return bool((namespace.get("metadata") or {}).get("deletionTimestamp"))


async def ensure_namespace(registry: Registry, name: str) -> bool:
    """Create Namespace ``name`` if it is missing; True when this call created it."""
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    try:
        await call_with_retry(lambda: registry.create(NAMESPACE, body), f"create namespace {name}")
    except ApiError as exc:
        if exc.reason == "AlreadyExists":
            return False
        raise
    return True
