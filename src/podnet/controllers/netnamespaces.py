"""The NetNamespace controller: one VNID per project (multitenant and networkpolicy modes).

Start order: list the NetNamespaces and rebuild the VNID reference counts, then list the
Namespaces, then reconcile each name. Namespace ``default`` gets the global VNID 0; every
other namespace gets a fresh VNID, released when its last user is gone.

The change-network protocol: a request is the annotation
``pod.network.openshift.io/multitenant.change-network`` on a NetNamespace, one of
``global``, ``join:<namespace>`` or ``isolate``. The controller applies it and removes the
annotation in ONE update (pinned to the version it read). A request that cannot be
applied (``join`` to a namespace without a NetNamespace, an unknown request, changing
``default``, no VNID left) is answered in one update too: the request annotation is
removed and ``pod.network.openshift.io/multitenant.change-network-error`` says why, so a
client polling for the request to disappear can tell success (no error annotation) from
refusal. A later successful change removes a stale error annotation.
"""

from __future__ import annotations

import copy
from typing import Any

from podnet.client.watch import DELETED
from podnet.controllers.base import Controller, Watch, track
from podnet.controllers.cache import ObjectCache, revision_of
from podnet.controllers.calls import (
    ControllerApi,
    call,
    create_unless_exists,
    delete_if_present,
    get_or_none,
)
from podnet.controllers.vnids import GLOBAL_VNID, VnidAllocator, VnidsExhausted
from podnet.model.kinds import NAMESPACE, NET_NAMESPACE

Obj = dict[str, Any]
WORKERS = 8

CHANGE_NETWORK_ANNOTATION = "pod.network.openshift.io/multitenant.change-network"
CHANGE_NETWORK_ERROR_ANNOTATION = "pod.network.openshift.io/multitenant.change-network-error"
DEFAULT_NAMESPACE = "default"


class ChangeRefused(Exception):
    """A change-network request that cannot be applied; the message says why."""


def netnamespace_object(name: str, netid: int) -> Obj:
    """The NetNamespace of namespace ``name``."""
    return {
        "apiVersion": NET_NAMESPACE.api_version,
        "kind": NET_NAMESPACE.kind,
        "metadata": {"name": name},
        "netname": name,
        "netid": netid,
    }


def netid_of(netnamespace: Obj) -> int:
    """The NetNamespace's VNID."""
    return int(netnamespace.get("netid") or 0)


def change_request(netnamespace: Obj) -> str | None:
    """The pending change-network request, if any."""
    notes = (netnamespace.get("metadata") or {}).get("annotations") or {}
    value = notes.get(CHANGE_NETWORK_ANNOTATION)
    return None if value is None else str(value)


class NetNamespaceController(Controller):
    """Keeps one NetNamespace per Namespace and applies change-network requests."""

    name = "netnamespaces"

    def __init__(
        self, api: ControllerApi, plugin_name: str, resync_period: float | None = 300.0
    ) -> None:
        super().__init__(api, WORKERS, resync_period)
        self.plugin_name = plugin_name
        self.vnids = VnidAllocator()
        self.namespaces = ObjectCache()
        self.netnamespaces = ObjectCache()
        self._starved: set[str] = set()  # namespaces that found no free VNID

    def watches(self) -> list[Watch]:
        """Rebuild VNID usage from the NetNamespaces first, then list Namespaces."""
        return [
            Watch(NET_NAMESPACE, self._on_netnamespace),
            Watch(NAMESPACE, self._on_namespace),
        ]

    def summary(self) -> str:
        return f"{len(self.netnamespaces)} NetNamespaces"

    # ---- events -------------------------------------------------------------------------

    def _on_netnamespace(self, change: str, obj: Obj) -> None:
        name = track(self.netnamespaces, change, obj, self._remember, self._forget)
        if name is None:
            return
        self.queue.add(name)
        for starved in self._starved:  # a VNID may have come free
            self.queue.add(starved)

    def _on_namespace(self, change: str, obj: Obj) -> None:
        name = track(self.namespaces, change, obj)
        if name is None:
            return
        if change == DELETED:
            self._starved.discard(name)
        self.queue.add(name)

    def _remember(self, netnamespace: Obj, reserved: int | None = None) -> None:
        """Cache a NetNamespace version; each cached NetNamespace holds one VNID use.

        ``reserved`` is a use this controller took before writing ``netnamespace``: it is
        handed to the cached object instead of counting its netid a second time.
        """
        stored, old = self.netnamespaces.put(netnamespace)
        new = netid_of(netnamespace)
        if not stored:
            if reserved is not None:
                self.vnids.release(reserved)
            return
        if reserved is None or reserved != new:
            self.vnids.mark(new)
            if reserved is not None:
                self.vnids.release(reserved)
        if old is not None:
            self.vnids.release(netid_of(old))

    def _forget(self, name: str, revision: int) -> bool:
        """Drop a deleted NetNamespace; True when its VNID has no user left."""
        old = self.netnamespaces.remove(name, revision)
        return old is not None and self.vnids.release(netid_of(old))

    # ---- reconcile ----------------------------------------------------------------------

    async def reconcile(self, name: str) -> None:
        namespace = self.namespaces.get(name)
        netnamespace = self.netnamespaces.get(name)
        if namespace is None:
            if netnamespace is not None:
                await self._delete(netnamespace)
        elif netnamespace is None:
            await self._create(name)
        elif (request := change_request(netnamespace)) is not None:
            await self._change_network(netnamespace, request)

    async def _create(self, name: str) -> None:
        try:
            netid = self._reserve_new(name)
        except VnidsExhausted:
            if name not in self._starved:
                self._starved.add(name)
                self.log.error("no VNIDs available for namespace %s", name)
            return
        self._starved.discard(name)
        try:
            created = await create_unless_exists(
                self.api, NET_NAMESPACE, netnamespace_object(name, netid)
            )
        except BaseException:
            self.vnids.release(netid)
            raise
        if created is None:
            self.vnids.release(netid)
            existing = await get_or_none(self.api, NET_NAMESPACE, None, name)
            if existing is not None:
                self._remember(existing)
            return
        self._remember(created, reserved=netid)
        self.log.info("created NetNamespace %s with netid %d", name, netid)

    def _reserve_new(self, name: str) -> int:
        if name == DEFAULT_NAMESPACE:
            self.vnids.mark(GLOBAL_VNID)
            return GLOBAL_VNID
        return self.vnids.allocate()

    async def _delete(self, netnamespace: Obj) -> None:
        name = netnamespace["metadata"]["name"]
        namespace = await get_or_none(self.api, NAMESPACE, None, name)  # the cache may lag: confirm
        if namespace is not None:
            self.namespaces.put(namespace)
            self.queue.add(name)
            return
        version = revision_of(netnamespace)
        if not await delete_if_present(self.api, NET_NAMESPACE, None, name, version):
            return
        freed = self._forget(name, version)  # the version the delete was pinned to
        netid = netid_of(netnamespace)
        self.log.info(
            "deleted NetNamespace %s (netid %d, %s)",
            name,
            netid,
            "released" if freed else "still in use",
        )

    # ---- change-network -----------------------------------------------------------------

    async def _change_network(self, netnamespace: Obj, request: str) -> None:
        name = netnamespace["metadata"]["name"]
        try:
            netid, reserved = await self._target_netid(netnamespace, request)
        except ChangeRefused as exc:
            await self._refuse(netnamespace, request, str(exc))
            return
        body = _answered(netnamespace, netid, None)
        try:
            updated = await self._write(body, f"change network of NetNamespace {name}")
        except BaseException:
            if reserved is not None:
                self.vnids.release(reserved)
            raise
        old = netid_of(netnamespace)
        self._remember(updated, reserved=reserved)
        released = old != netid and old != GLOBAL_VNID and self.vnids.users(old) == 0
        self.log.info(
            "NetNamespace %s: %s: netid %d -> %d%s",
            name,
            request,
            old,
            netid,
            f" (VNID {old} released)" if released else "",
        )

    async def _target_netid(self, netnamespace: Obj, request: str) -> tuple[int, int | None]:
        """The netid ``request`` asks for, and the VNID use reserved for it (if fresh)."""
        name, current = netnamespace["metadata"]["name"], netid_of(netnamespace)
        if name == DEFAULT_NAMESPACE and request != "global":
            raise ChangeRefused("the default namespace must stay global (netid 0)")
        if request == "global":
            return GLOBAL_VNID, None
        if request == "isolate":
            if current != GLOBAL_VNID and self.vnids.users(current) == 1:
                return current, None  # already alone on its VNID
            try:
                fresh = self.vnids.allocate()
            except VnidsExhausted as exc:
                raise ChangeRefused(str(exc)) from exc
            return fresh, fresh
        if request.startswith("join:") and request[5:]:
            return await self._netid_of_namespace(request[5:]), None
        raise ChangeRefused(
            f"unknown request {request!r}: expected global, isolate or join:<namespace>"
        )

    async def _netid_of_namespace(self, other: str) -> int:
        # fresh: a change may be due
        target = await get_or_none(self.api, NET_NAMESPACE, None, other)
        if target is None:
            raise ChangeRefused(f"cannot join namespace {other!r}: it has no NetNamespace")
        return netid_of(target)

    async def _refuse(self, netnamespace: Obj, request: str, why: str) -> None:
        name = netnamespace["metadata"]["name"]
        self.log.error("NetNamespace %s: change-network %r refused: %s", name, request, why)
        body = _answered(netnamespace, netid_of(netnamespace), why)
        updated = await self._write(body, f"refuse network change of NetNamespace {name}")
        self._remember(updated)

    async def _write(self, body: Obj, what: str) -> Obj:
        return await call(lambda: self.api.update(NET_NAMESPACE, body), what)


def _answered(netnamespace: Obj, netid: int, error: str | None) -> Obj:
    """``netnamespace`` with ``netid``, the request removed and the error (if any) recorded.

    The body keeps the resourceVersion it was read at, so the update is refused (409) if
    anything changed since: the request is applied exactly once.
    """
    body = copy.deepcopy(netnamespace)
    body["netid"] = netid
    meta = body.setdefault("metadata", {})
    notes = dict(meta.get("annotations") or {})
    notes.pop(CHANGE_NETWORK_ANNOTATION, None)
    notes.pop(CHANGE_NETWORK_ERROR_ANNOTATION, None)
    if error is not None:
        notes[CHANGE_NETWORK_ERROR_ANNOTATION] = error
    meta["annotations"] = notes
    return body
