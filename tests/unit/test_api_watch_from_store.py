"""A watch from a revision the watch cache no longer holds is served by an etcd watch of
its own (every change after that revision, then live), and counted: at scale such
watchers cost far more than the fan-out's, so an operator must be able to see them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from podnet.api.cachedobjects import WatchFilter
from podnet.api.metrics import ApiMetrics
from podnet.api.params import QueryParams
from podnet.api.registry import Registry
from podnet.api.watchcache import WatchCache
from podnet.api.watches import WatchServer
from podnet.model.kinds import NAMESPACE, POD
from podnet.store.memory import MemoryStore
from podnet.testing.api import namespace, pod


async def test_a_watch_older_than_the_cache_is_served_from_the_store_and_counted() -> None:
    registry = Registry(MemoryStore())
    await registry.create(NAMESPACE, namespace("default"))
    cache = WatchCache(registry, capacity=2, history=0, coalesce=0)
    await cache.start()
    metrics = ApiMetrics()
    server = WatchServer(registry, cache, metrics)
    prefixes: list[str] = []
    real_watch = registry.store.watch

    def recording_watch(prefix: str, after: int) -> Any:
        prefixes.append(prefix)
        return real_watch(prefix, after)

    try:
        start = await registry.store.revision()
        for i in range(5):
            await registry.create(POD, pod(f"p{i}"))
        current = await registry.store.revision()
        assert await cache.wait_for(current, 5) and not cache.covers(start)
        registry.store.watch = recording_watch  # type: ignore[method-assign]

        async def handler(request: web.Request) -> web.StreamResponse:
            params = QueryParams(watch=True, resource_version=start, timeout_seconds=1)
            return await server.serve(request, WatchFilter(POD, "default"), params, False)

        app = web.Application()
        app.router.add_get("/watch", handler)
        async with TestClient(TestServer(app)) as client:
            resp = await client.get("/watch")
            assert resp.status == 200
            names = []
            while len(names) < 6:
                line = await asyncio.wait_for(resp.content.readline(), 5)
                assert line, f"the watch ended after {names}"
                event = json.loads(line)
                names.append(event["object"]["metadata"]["name"])
                if len(names) == 5:
                    await registry.create(POD, pod("live"))
            resp.close()
    finally:
        await cache.stop()
    assert names == ["p0", "p1", "p2", "p3", "p4", "live"]
    # etcd replays the pods of the watched namespace only, not every change since.
    assert prefixes == [registry.kind_prefix(POD, "default")]
    counted = metrics.registry.get_sample_value(
        "podnet_apiserver_watches_from_store_total", {"resource": "pods"}
    )
    assert counted == 1
