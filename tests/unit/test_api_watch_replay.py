"""A watch's replay from an older revision is streamed in bounded writes and stops with
410 Expired past a live watcher's backlog bound (issue 19, finding 3); a short one is
replayed whole, then the watcher is live. Per-identity caps on watches and lists: 429
with Retry-After beyond them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from podnet.api.cachedobjects import WatchFilter
from podnet.api.limits import RequestLimits
from podnet.api.metrics import ApiMetrics
from podnet.api.params import QueryParams
from podnet.api.registry import Registry
from podnet.api.replay import REPLAY_WRITE, OverBudget, replay
from podnet.api.watchcache import WatchCache
from podnet.api.watches import WatchServer
from podnet.model import errors
from podnet.model.kinds import NAMESPACE, POD
from podnet.store.memory import MemoryStore
from podnet.testing.api import namespace, pod

BUDGET = 256 * 1024  # the cache's backlog bound in these tests
PADDING = "x" * 4096  # 4 KiB pods, as in the issue


def big_pod(name: str) -> dict[str, Any]:
    obj = pod(name)
    obj["metadata"]["annotations"] = {"padding": PADDING}
    return obj


@pytest.fixture
async def cached() -> AsyncIterator[tuple[Registry, WatchCache]]:
    registry = Registry(MemoryStore())
    await registry.create(NAMESPACE, namespace("default"))
    cache = WatchCache(registry, backlog_limit=BUDGET, coalesce=0)
    await cache.start()
    try:
        yield registry, cache
    finally:
        await cache.stop()


async def created(registry: Registry, cache: WatchCache, count: int) -> int:
    """``count`` big pods; the revision before them."""
    start = await registry.store.revision()
    for i in range(count):
        await registry.create(POD, big_pod(f"p{i}"))
    assert await cache.wait_for(await registry.store.revision(), 5)
    return start


async def test_replay_over_the_budget_is_410_after_bounded_writes(
    cached: tuple[Registry, WatchCache],
) -> None:
    registry, cache = cached
    start = await created(registry, cache, 200)  # ~800 KiB of events: 3x the budget
    writes: list[int] = []

    async def write(data: bytes) -> None:
        writes.append(len(data))

    with pytest.raises(OverBudget) as raised:
        await replay(cache, WatchFilter(POD), start, write, BUDGET)
    assert raised.value.code == 410
    assert sum(writes) <= BUDGET  # never more than a live watcher's bound
    assert max(writes) < REPLAY_WRITE + 8192  # one event past a write's size at most


async def test_a_short_replay_is_whole_then_the_watcher_is_live(
    cached: tuple[Registry, WatchCache],
) -> None:
    registry, cache = cached
    start = await created(registry, cache, 20)
    lines: list[bytes] = []

    async def write(data: bytes) -> None:
        lines.extend(data.splitlines())

    reached = await replay(cache, WatchFilter(POD), start, write, BUDGET)
    assert reached == await registry.store.revision()
    assert [json.loads(line)["object"]["metadata"]["name"] for line in lines] == [
        f"p{i}" for i in range(20)
    ]


def watch_app(server: WatchServer, params: QueryParams) -> web.Application:
    async def handler(request: web.Request) -> web.StreamResponse:
        try:
            return await server.serve(request, WatchFilter(POD), params, False)
        except errors.ApiError as exc:
            return web.json_response(exc.status(), status=exc.code)

    app = web.Application()
    app.router.add_get("/watch", handler)
    return app


async def test_an_http_watch_from_an_old_revision_gets_410_as_its_last_event(
    cached: tuple[Registry, WatchCache],
) -> None:
    registry, cache = cached
    start = await created(registry, cache, 200)
    metrics = ApiMetrics()
    params = QueryParams(watch=True, resource_version=start, timeout_seconds=5)
    app = watch_app(WatchServer(registry, cache, metrics), params)
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/watch")
        body = await asyncio.wait_for(resp.read(), 10)
    events = [json.loads(line) for line in body.splitlines()]
    assert events[-1]["type"] == "ERROR" and events[-1]["object"]["code"] == 410
    assert 0 < len(events) - 1 < 200  # part of the history, then the 410
    counted = metrics.registry.get_sample_value(
        "podnet_apiserver_watches_expired_total", {"resource": "pods", "why": "over_budget"}
    )
    assert counted == 1


def test_an_identity_over_its_cap_gets_429_with_retry_after() -> None:
    limits = RequestLimits(watches=2, lists=1)
    with limits.hold("node-a", "watch"), limits.hold("node-a", "watch"):
        with pytest.raises(errors.ApiError) as raised, limits.hold("node-a", "watch"):
            pass
        assert raised.value.code == 429
        assert raised.value.status()["details"]["retryAfterSeconds"] >= 1
        with limits.hold("node-b", "watch"), limits.hold("node-a", "get"):
            pass  # another identity, and verbs without a cap, are not counted
    with limits.hold("node-a", "watch"):  # released when the watch ends
        assert limits.in_flight("node-a", "watch") == 1
    assert limits.in_flight("node-a", "watch") == 0
    with pytest.raises(ValueError):
        RequestLimits(watches=-1)
