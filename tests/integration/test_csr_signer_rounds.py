"""The CSR signer under many joining nodes (issue 20: 100 nodes at once, all Ready < 60 s).

A new request is handled when it arrives (the signer follows the master's watch cache),
not a round later; the requests of one round are handled together, not one after
another; and a signer woken by its own writes waits until its watch cache holds them,
so it never signs a request twice. The store is the in-memory one, its watch slowed
down (as etcd's trails a write) and its writes counted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from podnet.api.identity import BOOTSTRAPPERS_GROUP
from podnet.api.pki import ensure_pki, load_ca
from podnet.api.registry import Registry
from podnet.api.watchcache import WatchCache
from podnet.controllers.csrsigner import CsrSigner
from podnet.model.csr import KUBELET_CLIENT_SIGNER, certificate_of, encode_request
from podnet.model.kinds import CERTIFICATE_SIGNING_REQUEST as CSR
from podnet.store.base import Condition, Operation, WatchEvent
from podnet.store.memory import MemoryStore

USAGES = ["digital signature", "key encipherment", "client auth"]
KEY = ec.generate_private_key(ec.SECP256R1())


class SlowStore(MemoryStore):
    """Each write takes ``write_delay`` s (writes overlap, as etcd's do; the most at once
    is kept) and each watch event arrives ``watch_lag`` s after the one before."""

    def __init__(self, write_delay: float = 0.0, watch_lag: float = 0.0) -> None:
        super().__init__()
        self.write_delay = write_delay
        self.watch_lag = watch_lag
        self.in_flight = 0
        self.most_in_flight = 0

    async def commit(
        self, conditions: Sequence[Condition], operations: Sequence[Operation]
    ) -> int | None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.write_delay)
            return await super().commit(conditions, operations)
        finally:
            self.in_flight -= 1

    async def watch(self, prefix: str, after_revision: int) -> AsyncIterator[WatchEvent]:
        async for event in super().watch(prefix, after_revision):
            await asyncio.sleep(self.watch_lag)
            yield event


class CountingRegistry(Registry):
    """Counts the updates asked of each request's subresources (stale ones too)."""

    def __init__(self, store: SlowStore) -> None:
        super().__init__(store, prefix="/t/")
        self.updates: dict[tuple[str, str | None], int] = {}

    async def update(
        self, kind: Any, obj: Any, namespace: Any, name: str, *args: Any, **kw: Any
    ) -> Any:
        subresource = args[0] if args else kw.get("subresource")
        self.updates[name, subresource] = self.updates.get((name, subresource), 0) + 1
        return await super().update(kind, obj, namespace, name, *args, **kw)


def bootstrap_csr(node: str) -> dict[str, Any]:
    """A bootstrapper's request for node ``node``'s client certificate, as the API
    server stores it (the requester filled in)."""
    return {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": f"node-{node}"},
        "spec": {
            "request": encode_request(KEY, f"system:node:{node}", ("system:nodes",)),
            "signerName": KUBELET_CLIENT_SIGNER,
            "usages": USAGES,
            "username": "system:bootstrap:abcdef",
            "groups": [BOOTSTRAPPERS_GROUP],
        },
    }


async def signed(registry: Registry, name: str) -> None:
    """Until request ``name`` holds its certificate (the caller bounds the wait)."""
    while certificate_of(await registry.get(CSR, None, name)) is None:
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running(
    store: SlowStore, tmp_path: Path, interval: float
) -> AsyncIterator[tuple[CountingRegistry, CsrSigner]]:
    registry = CountingRegistry(store)
    cache = WatchCache(registry)
    await cache.start()
    signer = CsrSigner(
        registry, load_ca(ensure_pki(tmp_path / "pki", ["127.0.0.1"])), interval, cache
    )
    signer.start()
    try:
        yield registry, signer
    finally:
        await signer.stop()
        await cache.stop()


async def test_a_new_request_is_signed_when_it_arrives_not_a_round_later(tmp_path: Path) -> None:
    async with running(SlowStore(), tmp_path, interval=3600) as (registry, _):
        await registry.create(CSR, bootstrap_csr("a"))
        async with asyncio.timeout(30):
            await signed(registry, "node-a")  # the first round
        await registry.create(CSR, bootstrap_csr("b"))  # the signer waits its hour now
        async with asyncio.timeout(30):
            await signed(registry, "node-b")


async def test_the_requests_of_one_round_are_handled_together(tmp_path: Path) -> None:
    store = SlowStore(write_delay=0.05)
    registry = Registry(store, prefix="/t/")
    nodes = [f"n{i}" for i in range(8)]
    for node in nodes:
        await registry.create(CSR, bootstrap_csr(node))
    signer = CsrSigner(registry, load_ca(ensure_pki(tmp_path / "pki", ["127.0.0.1"])))
    store.most_in_flight = 0
    await signer.sync()
    for node in nodes:
        assert certificate_of(await registry.get(CSR, None, f"node-{node}")) is not None
    assert store.most_in_flight > 1


@pytest.mark.parametrize("count", [1, 6])
async def test_a_signer_woken_by_its_own_writes_signs_each_request_once(
    tmp_path: Path, count: int
) -> None:
    async with running(SlowStore(watch_lag=0.2), tmp_path, interval=3600) as (registry, _):
        for i in range(count):
            await registry.create(CSR, bootstrap_csr(f"n{i}"))
        async with asyncio.timeout(30):
            for i in range(count):
                await signed(registry, f"node-n{i}")
        await asyncio.sleep(1)  # a second signing would be under way by now
    wanted = {(f"node-n{i}", sub): 1 for i in range(count) for sub in ("approval", "status")}
    assert registry.updates == wanted
