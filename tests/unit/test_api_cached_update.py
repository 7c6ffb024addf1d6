"""A PUT whose resourceVersion is the watch cache's copy writes over that copy without
reading etcd first; every other outcome is the one a fresh read of etcd gives (a real API
server over TLS, the node's own token and its own Lease)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from podnet.agent.heartbeat import lease_object, micro_time, renewed
from podnet.api.cachedobjects import CachedObject
from podnet.api.registry import Registry
from podnet.api.server import ApiServer
from podnet.client import ClientError, has_reason
from podnet.client.aio import AsyncApiClient
from podnet.model.kinds import LEASE, NAMESPACE
from podnet.model.schemas_coordination import NODE_LEASE_NAMESPACE
from podnet.testing.api import namespace, node_api_server

NODE = "node-a"
Obj = dict[str, Any]


class Setup:
    def __init__(self, registry: Registry, server: ApiServer, client: AsyncApiClient) -> None:
        self.registry = registry
        self.server = server
        self.client = client
        self.reads: list[str] = []  # keys read from the store one by one

    async def settled(self) -> None:
        assert await self.server.cache.wait_for(await self.registry.store.revision(), 10)

    def cache_lags_at(self, copy: Obj, monkeypatch: pytest.MonkeyPatch) -> None:
        """The cache still shows ``copy`` (as if etcd's later changes had not reached it)."""
        revision = int(copy["metadata"]["resourceVersion"])
        lagging = CachedObject(json.dumps(copy).encode(), revision, {})
        monkeypatch.setattr(self.server.cache, "current", lambda *_: lagging)


@pytest.fixture
async def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Setup]:
    async with node_api_server(tmp_path, NODE) as (registry, server, config):
        await registry.create(NAMESPACE, namespace(NODE_LEASE_NAMESPACE))
        await registry.create(LEASE, lease_object(NODE, 40, micro_time()), NODE_LEASE_NAMESPACE)
        client = AsyncApiClient(config)
        ready = Setup(registry, server, client)
        store_get = registry.store.get

        async def counted_get(key: str) -> Any:
            ready.reads.append(key)
            return await store_get(key)

        monkeypatch.setattr(registry.store, "get", counted_get)
        await ready.settled()
        try:
            yield ready
        finally:
            await client.close()


def lease_key(registry: Registry) -> str:
    return registry.key(LEASE, NODE_LEASE_NAMESPACE, NODE)


async def test_a_renewal_over_the_cached_version_does_not_read_etcd(setup: Setup) -> None:
    current = await setup.registry.get(LEASE, NODE_LEASE_NAMESPACE, NODE)
    setup.reads.clear()
    now = micro_time()
    written = await setup.client.update(LEASE, renewed(current, NODE, 40, now))
    assert lease_key(setup.registry) not in setup.reads
    stored = await setup.registry.get(LEASE, NODE_LEASE_NAMESPACE, NODE)
    assert stored == written
    assert stored["spec"]["renewTime"] == now
    assert int(stored["metadata"]["resourceVersion"]) > int(current["metadata"]["resourceVersion"])


async def test_a_stale_cached_copy_gives_the_conflict_etcd_gives(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = await setup.registry.get(LEASE, NODE_LEASE_NAMESPACE, NODE)
    newer = renewed(old, NODE, 40, micro_time())
    await setup.registry.update(LEASE, newer, NODE_LEASE_NAMESPACE, NODE)  # etcd moves on
    setup.cache_lags_at(old, monkeypatch)
    setup.reads.clear()
    with pytest.raises(ClientError) as failed:
        await setup.client.update(LEASE, renewed(old, NODE, 40, micro_time()))
    assert has_reason(failed.value, "Conflict")
    assert lease_key(setup.registry) in setup.reads  # decided by a read of etcd
    stored = await setup.registry.get(LEASE, NODE_LEASE_NAMESPACE, NODE)
    assert stored["spec"]["renewTime"] == newer["spec"]["renewTime"]


async def test_an_object_deleted_behind_the_cache_is_not_found(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = await setup.registry.get(LEASE, NODE_LEASE_NAMESPACE, NODE)
    await setup.registry.delete(LEASE, NODE_LEASE_NAMESPACE, NODE)
    setup.cache_lags_at(old, monkeypatch)
    with pytest.raises(ClientError) as failed:
        await setup.client.update(LEASE, renewed(old, NODE, 40, micro_time()))
    assert has_reason(failed.value, "NotFound")  # not the txn's Conflict


async def test_an_unchanged_body_over_a_stale_copy_is_a_conflict_not_a_no_op(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = await setup.registry.get(LEASE, NODE_LEASE_NAMESPACE, NODE)
    await setup.registry.update(
        LEASE, renewed(old, NODE, 40, micro_time()), NODE_LEASE_NAMESPACE, NODE
    )
    setup.cache_lags_at(old, monkeypatch)
    with pytest.raises(ClientError) as failed:
        await setup.client.update(LEASE, old)  # nothing changed against the cached copy
    assert has_reason(failed.value, "Conflict")


async def test_an_unchanged_body_over_the_current_version_is_answered_as_it_is(
    setup: Setup,
) -> None:
    current = await setup.registry.get(LEASE, NODE_LEASE_NAMESPACE, NODE)
    answer = await setup.client.update(LEASE, current)
    assert answer == current
