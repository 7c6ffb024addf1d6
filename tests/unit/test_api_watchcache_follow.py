"""``WatchCache.follow``, the in-process controllers' watch: every event in order, a
bookmark after silence, and followers that never disturb one another's wakeups."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from podnet.api.cachedobjects import CachedEvent
from podnet.api.registry import Registry
from podnet.api.watchcache import WatchCache
from podnet.model.kinds import NAMESPACE
from podnet.store.memory import MemoryStore
from podnet.testing.api import namespace


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
