"""A watch that fails after its head was sent ends with an ERROR event, not a 2nd answer.

Seen at scale: a late watcher served by its own etcd watch got aetcd's timeout, and the
error middleware wrote ``HTTP/1.1 500`` inside the chunked body of the 200 response.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from podnet.api.cachedobjects import WatchFilter
from podnet.api.metrics import ApiMetrics
from podnet.api.params import QueryParams
from podnet.api.watches import WatchServer
from podnet.model.kinds import HOST_SUBNET


class StoreTimeout(Exception):
    """Stands for aetcd's WatchTimeoutError: not an ApiError, not a ConnectionError."""


async def failing_events() -> AsyncIterator[Any]:
    yield 7  # a bookmark revision: rendered or skipped, never fatal
    raise StoreTimeout("watch timed out")


async def test_a_failing_store_watch_ends_with_an_error_event() -> None:
    server = WatchServer(registry=None, cache=None, metrics=ApiMetrics())  # type: ignore[arg-type]

    async def handler(request: web.Request) -> web.StreamResponse:
        wf = WatchFilter(HOST_SUBNET)
        return await server._stream(request, wf, QueryParams(), False, failing_events())

    app = web.Application()
    app.router.add_get("/watch", handler)
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/watch")
        assert resp.status == 200
        body = await resp.read()
    lines = [json.loads(line) for line in body.splitlines() if line.strip()]
    assert b"HTTP/1.1" not in body
    assert lines, body
    last = lines[-1]
    assert last["type"] == "ERROR"
    assert last["object"]["code"] == 410
    assert "StoreTimeout" in last["object"]["message"]
