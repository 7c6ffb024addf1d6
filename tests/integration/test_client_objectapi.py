"""The asyncio HTTPS client is an ObjectApi: against a real master and etcd, with the
master's kubeconfig (CA and token), every call of the protocol does what it promises,
errors come as the one tree, and the reflector runs over it (relist after compaction)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from podnet.client import (
    ADDED,
    BOOKMARK,
    DELETED,
    LISTED,
    MODIFIED,
    AlreadyExists,
    Conflict,
    Expired,
    NotFound,
    ObjectApi,
    WatchEvent,
    resource_version,
)
from podnet.client.aio import AsyncApiClient
from podnet.client.reflector import reflect
from podnet.kubeconfig import load_client_config
from podnet.model.kinds import POD
from podnet.store.base import Put
from podnet.store.etcd import EtcdStore
from podnet.store.etcd_process import EtcdProcess
from podnet.testing.api import pod
from podnet.testing.processes import MasterProcess

NS = "default"


@pytest.fixture
async def etcd_written(etcd: EtcdProcess) -> None:
    """A write to etcd before the master starts: revision 1 is older than the master."""
    store = EtcdStore(etcd.endpoint)
    await store.connect()
    try:
        await store.commit([], [Put(f"/podnet-client-test/{uuid.uuid4().hex}", b"x")])
    finally:
        await store.close()


@pytest.fixture
async def client(etcd_written: None, master: MasterProcess) -> AsyncIterator[AsyncApiClient]:
    config = load_client_config(str(master.kubeconfig))
    assert config.server.startswith("https://") and config.token
    api = AsyncApiClient(config, agent="podnet-test")
    try:
        yield api
    finally:
        await api.close()


async def changes(stream: AsyncIterator[WatchEvent], count: int) -> list[tuple[str, str]]:
    """The first ``count`` non-bookmark events of ``stream`` as (type, name)."""
    got: list[tuple[str, str]] = []
    async with asyncio.timeout(30):
        async for event in stream:
            if event.type != BOOKMARK:
                got.append((str(event.type), event.object["metadata"]["name"]))
            if len(got) == count:
                return got
    return got


async def test_crud_with_preconditions(client: AsyncApiClient) -> None:
    api: ObjectApi = client
    created = await api.create(POD, pod("crud"))
    assert created["metadata"]["namespace"] == NS and resource_version(created) > 0
    with pytest.raises(AlreadyExists) as exists:
        await api.create(POD, pod("crud"), NS)
    assert (exists.value.code, exists.value.reason) == (409, "AlreadyExists")
    got = await api.get(POD, NS, "crud")
    assert got["metadata"]["uid"] == created["metadata"]["uid"]
    labelled = {**got, "metadata": {**got["metadata"], "labels": {"tier": "web"}}}
    updated = await api.update(POD, labelled)
    assert updated["metadata"]["labels"] == {"tier": "web"}
    assert resource_version(updated) > resource_version(got)
    with pytest.raises(Conflict):
        await api.update(POD, labelled)  # its resourceVersion is stale now
    with pytest.raises(Conflict):
        await api.delete(POD, NS, "crud", resource_version=resource_version(got))
    await api.delete(POD, NS, "crud", resource_version=resource_version(updated))
    with pytest.raises(NotFound) as missing:
        await api.get(POD, NS, "crud")
    assert missing.value.code == 404
    assert await client.get_or_none(POD, NS, "crud") is None


async def test_list_then_watch_from_the_listing(client: AsyncApiClient) -> None:
    api: ObjectApi = client
    await api.create(POD, pod("before"))
    listing = await api.list(POD, NS)
    assert "before" in {o["metadata"]["name"] for o in listing.items}
    assert listing.resource_version >= max(resource_version(o) for o in listing.items)
    stream = api.watch(POD, listing.resource_version, NS)
    watching = asyncio.create_task(changes(stream, 3))
    await api.create(POD, pod("after"))
    patched = await client.patch(POD, NS, "after", {"metadata": {"labels": {"x": "1"}}})
    assert patched["metadata"]["labels"] == {"x": "1"}
    await api.delete(POD, NS, "before")
    assert await watching == [(ADDED, "after"), (MODIFIED, "after"), (DELETED, "before")]


async def test_watch_from_a_compacted_version_is_expired(
    client: AsyncApiClient, etcd: EtcdProcess
) -> None:
    # Revision 1 is older than the master (etcd_written wrote before it started) and,
    # once compacted, older than etcd keeps: the watch must be refused with 410.
    latest = resource_version(await client.create(POD, pod("new")))
    await compact(etcd, latest)
    with pytest.raises(Expired) as expired:
        await changes(client.watch(POD, 1, NS), 1)
    assert (expired.value.code, expired.value.reason) == (410, "Expired")


async def test_reflector_over_https(client: AsyncApiClient) -> None:
    await client.create(POD, pod("r1"))
    stream = reflect(client, POD, NS)
    first = await anext(stream)
    assert first.type == LISTED and first.resource_version > 0
    assert [o["metadata"]["name"] for o in first.items] == ["r1"]
    await client.create(POD, pod("r2"))
    await client.patch(POD, NS, "r1", {"metadata": {"labels": {"x": "1"}}})
    await client.delete(POD, NS, "r2")
    assert await changes(stream, 3) == [(ADDED, "r2"), (MODIFIED, "r1"), (DELETED, "r2")]
    await stream.aclose()


async def compact(etcd: EtcdProcess, revision: int) -> None:
    store = EtcdStore(etcd.endpoint)
    await store.connect()
    try:
        await store.compact(revision)
    finally:
        await store.close()
