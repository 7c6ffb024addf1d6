"""Keeps ``default/kubernetes`` (the Service, its Endpoints and EndpointSlice) as the
masters say it must be: kube-apiserver's bootstrap controller and lease endpoint
reconciler, in every master (not only the leader, as in Kubernetes).

Each round: renew this master's lease (when it advertises an address), create the
Service if it is missing, repair it if it was changed (an update; a delete and create
when its cluster IP is not the reserved one), then write the Endpoints and slice when
they differ from the live leases (``podnet.api.masterleases``). Rounds run every
``interval`` and at once when a watch sees one of the three objects change (so a deleted
or edited object is back within one round trip) or a master joins or leaves (a crashed
master's lease expiring). All masters compute the same objects, so
they agree; a conflict only means another master wrote first. On ``stop`` the master
revokes its lease and writes the endpoints without itself.

The objects are written through the in-process API (the registry), so they pass the same
validation, claims (the reserved cluster IP) and watches as a user's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from podnet.api.masterleases import Leases, MasterAddress
from podnet.api.masterservice import (
    NAME,
    NAMESPACE,
    desired_endpoints,
    desired_service,
    desired_slice,
    endpoints_fix,
    repaired_service,
    service_fix,
    slice_fix,
)
from podnet.api.servicealloc import Network, kubernetes_service_ip
from podnet.client.errors import has_reason
from podnet.controllers.calls import ControllerApi, get_or_none
from podnet.controllers.namespaces import ensure_namespace
from podnet.controllers.workqueue import cancel_all
from podnet.model.kinds import ENDPOINT_SLICE, ENDPOINTS, SERVICE, Kind

log = logging.getLogger("podnet.api.kubernetesservice")
DEFAULT_INTERVAL = 10.0  # kube-apiserver's endpoint reconciler interval
RETRY = 1.0  # after a failed round or a broken watch
WATCHED = (SERVICE, ENDPOINTS, ENDPOINT_SLICE)
Obj = dict[str, Any]


@dataclass
class MasterServiceReconciler:
    """One master's share in keeping ``default/kubernetes`` right: ``port`` is the port it
    advertises, with the address ``advertise`` (None: it adds no endpoint)."""

    api: ControllerApi
    service_network: Callable[[], Awaitable[Network]]
    port: int
    leases: Leases | None = None
    advertise: str | None = None
    interval: float = DEFAULT_INTERVAL
    rounds: int = field(default=0, init=False)  # finished rounds
    _changed: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list, init=False)

    @property
    def address(self) -> MasterAddress | None:
        return MasterAddress(self.advertise, self.port) if self.advertise else None

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._loop(), name="kubernetes-service")]
        for kind in WATCHED:
            name = f"kubernetes-service-watch-{kind.plural}"
            self._tasks.append(asyncio.create_task(self._watch(kind), name=name))
        if self.leases is not None:
            watch = self._watch_leases(self.leases)
            self._tasks.append(asyncio.create_task(watch, name="kubernetes-service-leases"))

    async def stop(self) -> None:
        """Stop; revoke this master's lease and take its address out of the endpoints."""
        tasks, self._tasks = self._tasks, []
        with contextlib.suppress(Exception):
            await cancel_all(list(tasks))
        if self.leases is None or self.address is None:
            return
        await self.leases.release()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._write_endpoints(), RETRY * 5)

    async def reconcile(self) -> None:
        """One round (see the module docstring)."""
        if self.leases is not None and self.address is not None:
            await self.leases.hold(self.address)
        if self.rounds == 0:
            await ensure_namespace(self.api, NAMESPACE)
        network = await self.service_network()
        await self._write_service(desired_service(kubernetes_service_ip(network), self.port))
        await self._write_endpoints()
        self.rounds += 1

    async def _loop(self) -> None:
        while True:
            self._changed.clear()
            try:
                await self.reconcile()
                wait = self.interval
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("default/kubernetes not reconciled (again in %gs): %s", RETRY, exc)
                wait = RETRY
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), wait)

    async def _watch(self, kind: Kind) -> None:
        """Wake the loop when the ``kubernetes`` object of ``kind`` changes."""
        while True:
            try:
                listing = await self.api.list(kind, NAMESPACE)
                async for event in self.api.watch(kind, listing.resource_version, NAMESPACE):
                    meta = (event.object or {}).get("metadata") or {}
                    if meta.get("name") == NAME:
                        self._changed.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("watch of %s in %s ended (%s); again", kind.plural, NAMESPACE, exc)
            await asyncio.sleep(RETRY)

    async def _watch_leases(self, leases: Leases) -> None:
        """Wake the loop when a master joins or leaves (a crashed one: its lease expired)."""
        while True:
            try:
                async for _ in leases.joins_and_leaves():
                    self._changed.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("watch of the master leases ended (%s); again", exc)
            await asyncio.sleep(RETRY)

    async def _write_service(self, desired: Obj) -> None:
        live = await get_or_none(self.api, SERVICE, NAMESPACE, NAME)
        fix = "create" if live is None else service_fix(live, desired)
        if fix == "none":
            return
        log.info("default/kubernetes Service: %s", fix)
        if live is not None and fix == "recreate":
            version = live["metadata"].get("resourceVersion")
            await self.api.delete(SERVICE, NAMESPACE, NAME, resource_version=version)
        if live is not None and fix == "update":
            await self._quietly(self.api.update(SERVICE, repaired_service(live, desired)))
        else:
            await self._quietly(self.api.create(SERVICE, desired, NAMESPACE))

    async def _write_endpoints(self) -> None:
        live = await self.leases.live() if self.leases is not None else []
        addresses = [a.ip for a in live if a.port == self.port]
        if len(addresses) < len(live):
            log.warning("masters advertise other ports than %d; they are left out", self.port)
        writes = (
            (ENDPOINTS, desired_endpoints(addresses, self.port), endpoints_fix),
            (ENDPOINT_SLICE, desired_slice(addresses, self.port), slice_fix),
        )
        for kind, desired, fix in writes:
            current = await get_or_none(self.api, kind, NAMESPACE, NAME)
            write = fix(current, desired)
            if write is None:
                continue
            if current is None:
                await self._quietly(self.api.create(kind, write, NAMESPACE))
            else:
                await self._quietly(self.api.update(kind, write))
            log.info("default/kubernetes %s: %s", kind.plural, sorted(set(addresses)))

    async def _quietly(self, write: Awaitable[Obj]) -> None:
        """A write another master may have made first: a conflict means try again."""
        try:
            await write
        except Exception as exc:
            if not has_reason(exc, "Conflict") and not has_reason(exc, "AlreadyExists"):
                raise
            self._changed.set()
