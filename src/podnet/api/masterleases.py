"""Master leases: which masters are alive, and at which address the nodes reach them.

Each master that advertises an address (``--advertise-address``) keeps one etcd key,
``<prefix>masterleases/<address>``, bound to an etcd lease of ``ttl`` seconds that it
renews on every round of the ``kubernetes`` Service reconciler. A master that dies stops
renewing and its key vanishes with the lease, at most ``ttl`` later; a master that stops
cleanly revokes it at once. This is kube-apiserver's ``lease`` endpoint reconciler:
the live keys are the addresses that go into ``default/kubernetes``'s endpoints. The
value is the master's port, which all masters must share (one port per Endpoints subset).
A renewal is a lease keep-alive and writes no key, so the watch that tells the masters of
a joining or leaving master (``joins_and_leaves``) stays quiet in between.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from podnet.store.base import StoreUnavailable
from podnet.store.etcd import EtcdStore

log = logging.getLogger("podnet.api.masterleases")
DEFAULT_TTL = 15


@dataclass(frozen=True)
class MasterAddress:
    """Where one live master is reached."""

    ip: str
    port: int


class Leases(Protocol):
    """The master leases, as the reconciler uses them (etcd, or a fake in unit tests)."""

    async def hold(self, address: MasterAddress) -> None: ...

    async def live(self) -> list[MasterAddress]: ...

    async def release(self) -> None: ...

    def joins_and_leaves(self) -> AsyncIterator[None]: ...


class EtcdMasterLeases:
    """Master leases as etcd keys bound to etcd leases."""

    def __init__(self, store: EtcdStore, prefix: str, ttl: int = DEFAULT_TTL) -> None:
        if ttl < 2:
            raise ValueError("the master lease ttl must be at least 2 seconds")
        self.store = store
        self.prefix = f"{prefix}masterleases/"
        self.ttl = ttl
        self._lease_id: int | None = None

    async def hold(self, address: MasterAddress) -> None:
        """Renew this master's lease, or take a new one if it lapsed; write the key when
        it is new or gone (a renewal alone changes no key, so it wakes no watcher)."""
        client = self.store.client
        key = f"{self.prefix}{address.ip}"
        value = json.dumps({"port": address.port}).encode()
        try:
            fresh = self._lease_id is None
            if self._lease_id is not None:
                renewed = await client.refresh_lease(self._lease_id)
                if int(getattr(renewed, "TTL", 0)) <= 0:
                    log.warning("master lease %x lapsed; taking a new one", self._lease_id)
                    fresh = True
            if fresh:
                self._lease_id = int((await client.lease(self.ttl)).id)
            current = None if fresh else await self.store.get(key)
            if current is None or current.value != value:
                await client.put(key.encode(), value, lease=self._lease_id)
        except Exception as exc:
            raise StoreUnavailable(f"master lease not renewed: {exc}") from exc

    async def live(self) -> list[MasterAddress]:
        """Every master whose lease holds."""
        kvs, _ = await self.store.list(self.prefix)
        out = []
        for kv in kvs:
            try:
                port = int(json.loads(kv.value)["port"])
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring malformed master lease %s", kv.key)
                continue
            out.append(MasterAddress(kv.key[len(self.prefix) :], port))
        return out

    async def joins_and_leaves(self) -> AsyncIterator[None]:
        """Yields when a master's key appears or goes (its lease expired or was revoked);
        ends when the watch does."""
        _, revision = await self.store.list(self.prefix)
        async for event in self.store.watch(self.prefix, revision):
            if event.type == "DELETE" or event.create_revision == event.revision:
                yield None

    async def release(self) -> None:
        """Revoke this master's lease: its key (its address in the endpoints) goes now."""
        lease_id, self._lease_id = self._lease_id, None
        if lease_id is None:
            return
        try:
            await self.store.client.revoke_lease(lease_id)
        except Exception as exc:  # it expires by itself
            log.warning("could not revoke master lease %x: %s", lease_id, exc)
