"""``WatchCache.follow``, the in-process controllers' watch: every event in order, a
bookmark after silence, and followers that never disturb one another's wakeups."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from podnet.api.cachedobjects import CachedEvent
from podnet.api.registry import Registry
from podnet.api.watchcache import WatchCache
from podnet.model import errors
from podnet.model.kinds import NAMESPACE, NODE
from podnet.store.memory import MemoryStore
from podnet.testing.api import namespace, node


@pytest.fixture
async def cached() -> AsyncIterator[tuple[Registry, WatchCache]]:
    registry = Registry(MemoryStore())
    cache = WatchCache(registry, coalesce=0)
    await cache.start()
    try:
        yield registry, cache
    finally:
        await cache.stop()


async def _names(follower: AsyncIterator[CachedEvent | int], count: int) -> list[str]:
    seen: list[str] = []
    async for item in follower:
        if isinstance(item, CachedEvent):
            seen.append(item.name)
            if len(seen) == count:
                return seen
    return seen


async def test_followers_see_every_event_in_order(cached: tuple[Registry, WatchCache]) -> None:
    registry, cache = cached
    start = await registry.store.revision()
    readers = [asyncio.create_task(_names(cache.follow(start, 30.0), 20)) for _ in range(3)]
    for i in range(20):
        await registry.create(NAMESPACE, namespace(f"ns-{i}"))
        if i % 3 == 0:
            await asyncio.sleep(0)  # some writes land while the followers wait, some not
    expected = [f"ns-{i}" for i in range(20)]
    assert await asyncio.wait_for(asyncio.gather(*readers), 30) == [expected] * 3


async def test_a_silent_cache_sends_a_bookmark(cached: tuple[Registry, WatchCache]) -> None:
    registry, cache = cached
    await registry.create(NAMESPACE, namespace("a"))
    revision = await registry.store.revision()
    assert await cache.wait_for(revision, 5)
    follower = cache.follow(revision, 0.01)
    assert await asyncio.wait_for(anext(follower), 30) == revision  # nothing new: a bookmark
    await follower.aclose()  # type: ignore[attr-defined]


async def test_a_cancelled_follower_leaves_the_others_waiting(
    cached: tuple[Registry, WatchCache],
) -> None:
    registry, cache = cached
    start = await registry.store.revision()
    gone = asyncio.create_task(_names(cache.follow(start, 30.0), 1))
    stays = asyncio.create_task(_names(cache.follow(start, 30.0), 1))
    for _ in range(3):
        await asyncio.sleep(0)  # both are waiting on the same wakeup now
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    await registry.create(NAMESPACE, namespace("after"))
    assert await asyncio.wait_for(stays, 30) == ["after"]


async def _small_ring() -> tuple[Registry, WatchCache]:
    registry = Registry(MemoryStore())
    cache = WatchCache(registry, capacity=5, history=0, coalesce=0)
    await cache.start()
    return registry, cache


async def _settled(registry: Registry, cache: WatchCache) -> None:
    assert await cache.wait_for(await registry.store.revision(), 5)


async def test_a_kind_follower_sees_its_kind_only(cached: tuple[Registry, WatchCache]) -> None:
    registry, cache = cached
    start = await registry.store.revision()
    nodes = asyncio.create_task(_names(cache.follow(start, 30.0, NODE), 3))
    for i in range(3):
        await registry.create(NAMESPACE, namespace(f"ns-{i}"))
        await registry.create(NODE, node(f"n-{i}", f"192.0.2.{i + 1}"))
    assert await asyncio.wait_for(nodes, 30) == ["n-0", "n-1", "n-2"]


async def _held(registry: Registry, cache: WatchCache) -> list[AsyncIterator[CachedEvent | int]]:
    """A Node follower and a follower of every kind, each holding the event of Node n-0
    (suspended where it handed it over) in a ring of 5."""
    start = await registry.store.revision()
    followers = [cache.follow(start, 30.0, NODE), cache.follow(start, 30.0)]
    await registry.create(NODE, node("n-0", "192.0.2.100"))
    for follower in followers:
        item = await asyncio.wait_for(anext(follower), 30)
        assert isinstance(item, CachedEvent) and item.name == "n-0"
    return followers


async def test_other_kinds_overrunning_the_ring_do_not_expire_a_kind_follower() -> None:
    """Its place left the ring, but no change of its kind did: it reads on, where a
    follower of every kind must relist."""
    registry, cache = await _small_ring()
    try:
        nodes, everything = await _held(registry, cache)
        for i in range(12):  # more than the ring holds
            await registry.create(NAMESPACE, namespace(f"ns-{i}"))
        await registry.create(NODE, node("n-1", "192.0.2.1"))
        await _settled(registry, cache)
        item = await asyncio.wait_for(anext(nodes), 30)
        assert isinstance(item, CachedEvent) and item.name == "n-1"
        with pytest.raises(errors.ApiError) as gone:
            await anext(everything)
        assert gone.value.code == 410
    finally:
        await cache.stop()


async def test_a_kind_follower_whose_changes_left_the_ring_must_relist() -> None:
    registry, cache = await _small_ring()
    try:
        nodes, _ = await _held(registry, cache)
        await registry.create(NODE, node("n-1", "192.0.2.1"))  # then pushed out unread
        for i in range(12):
            await registry.create(NAMESPACE, namespace(f"ns-{i}"))
        await _settled(registry, cache)
        with pytest.raises(errors.ApiError) as gone:
            await anext(nodes)
        assert gone.value.code == 410
    finally:
        await cache.stop()
