"""A watch from a revision the watch cache no longer holds is told 410 Expired at once and
relists, as with kube-apiserver's watch cache: no etcd watch of its own (whose replay the
etcd client buffers without bound), and counted, so an operator sees such relists."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from podnet.api.cachedobjects import WatchFilter
from podnet.api.metrics import ApiMetrics
from podnet.api.params import QueryParams
from podnet.api.registry import Registry
from podnet.api.watchcache import WatchCache
from podnet.api.watches import WatchServer
from podnet.model import errors
from podnet.model.kinds import NAMESPACE, POD
from podnet.store.memory import MemoryStore
from podnet.testing.api import namespace, pod


async def test_a_watch_older_than_the_cache_is_410_without_an_etcd_watch() -> None:
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
            try:
                return await server.serve(request, WatchFilter(POD, "default"), params, False)
            except errors.ApiError as exc:
                return web.json_response(exc.status(), status=exc.code)

        app = web.Application()
        app.router.add_get("/watch", handler)
        async with TestClient(TestServer(app)) as client:
            resp = await client.get("/watch")
            status = resp.status
            body = await resp.json()
    finally:
        await cache.stop()
    assert status == 410 and body["reason"] == "Expired", body
    assert prefixes == []  # no etcd watch replays the kind's history for it
    counted = metrics.registry.get_sample_value(
        "podnet_apiserver_watches_expired_total", {"resource": "pods", "why": "too_old"}
    )
    assert counted == 1
