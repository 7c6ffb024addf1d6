"""The asyncio client (podnet.client.aio) against a scripted aiohttp server: list+watch
through the reflector (relist on 410, resume after a dropped connection, synthesized
DELETED), error classes, retries, and the ObjectApi writes' URLs and bodies."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from podnet.client import (
    LISTED,
    Backoff,
    InvalidResponse,
    NotFound,
    ServerError,
    StatusError,
    Unreachable,
    is_transient,
    with_retry,
)
from podnet.client.aio import AsyncApiClient
from podnet.client.reflector import reflect
from podnet.client.wire import Call
from podnet.kubeconfig import ClientConfig
from podnet.model.kinds import HOST_SUBNET, LEASE, NODE, POD

Obj = dict[str, Any]


def hostsubnet(name: str, subnet: str | None, ip: str, rv: int = 1) -> Obj:
    obj: Obj = {"metadata": {"name": name, "resourceVersion": str(rv)}, "host": name, "hostIP": ip}
    if subnet:
        obj["subnet"] = subnet
    return obj


# ---- the API client against a scripted server ----------------------------------------------


@dataclass
class ScriptedApi:
    """Answers lists and watches of HostSubnets from a script, recording the watch RVs."""

    lists: list[tuple[int, Obj]]
    watches: list[tuple[int, list[Obj]]]
    seen_versions: list[str] = field(default_factory=list)
    hang: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            status, body = self.lists.pop(0)
            return web.json_response(body, status=status)
        self.seen_versions.append(request.query["resourceVersion"])
        status, lines = self.watches.pop(0) if self.watches else (200, [])
        if status != 200:
            return web.json_response({"kind": "Status", "code": status}, status=status)
        response = web.StreamResponse()
        await response.prepare(request)
        for line in lines:
            await response.write(json.dumps(line).encode() + b"\n")
        if not self.watches:
            await self.hang.wait()
        return response


def marker(rv: int) -> Obj:
    return {"metadata": {"resourceVersion": str(rv)}}


async def not_found(request: web.Request) -> web.Response:
    body = {"kind": "Status", "code": 404, "reason": "NotFound", "message": "nodes not found"}
    return web.json_response(body, status=404)


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[ScriptedApi, AsyncApiClient]]:
    a = hostsubnet("a", "10.128.1.0/24", "192.0.2.1", 5)
    b = hostsubnet("b", "10.128.2.0/24", "192.0.2.2", 11)
    c = hostsubnet("c", "10.128.3.0/24", "192.0.2.3", 15)
    c2 = hostsubnet("c", "10.128.3.0/24", "192.0.2.33", 41)
    api = ScriptedApi(
        lists=[
            (503, {"kind": "Status", "code": 503, "message": "etcd down"}),
            (200, {"metadata": {"resourceVersion": "10"}, "items": [a]}),
            (200, {"metadata": {"resourceVersion": "20"}, "items": [a, c]}),
            (200, {"metadata": {"resourceVersion": "30"}, "items": [c]}),
        ],
        watches=[
            (200, [{"type": "ADDED", "object": b}]),  # then the connection ends
            (200, [{"type": "ERROR", "object": {"kind": "Status", "code": 410}}]),
            (410, []),
            (200, [{"type": "BOOKMARK", "object": marker(40)}, {"type": "MODIFIED", "object": c2}]),
        ],
    )
    app = web.Application()
    app.router.add_get("/apis/network.openshift.io/v1/hostsubnets", api.handle)
    app.router.add_get("/api/v1/nodes/{name}", not_found)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    client = AsyncApiClient(ClientConfig(f"http://127.0.0.1:{port}", token="t"), timeout=5)
    try:
        yield api, client
    finally:
        api.hang.set()
        await client.close()
        await runner.cleanup()


async def test_watch_relists_on_410_and_resumes_after_a_dropped_connection(
    scripted: tuple[ScriptedApi, AsyncApiClient],
) -> None:
    api, client = scripted
    events: list[tuple[str, list[str]]] = []
    stream = reflect(client, HOST_SUBNET, backoff=Backoff(0.01, 0.05))
    async for event in stream:
        objects = list(event.items) if event.type == LISTED else [event.object]
        events.append((event.type, [o["metadata"]["name"] for o in objects]))
        if len(events) == 7:
            break
    await stream.aclose()
    assert events == [
        (LISTED, ["a"]),
        ("ADDED", ["b"]),
        ("DELETED", ["b"]),  # b vanished between the listings at 10 and 20
        (LISTED, ["a", "c"]),
        ("DELETED", ["a"]),
        (LISTED, ["c"]),
        ("MODIFIED", ["c"]),
    ]
    assert api.seen_versions == ["10", "11", "20", "30"]


async def test_errors_are_classified(scripted: tuple[ScriptedApi, AsyncApiClient]) -> None:
    _, client = scripted
    with pytest.raises(NotFound) as info:
        await client.get(NODE, None, "x")
    assert (info.value.code, info.value.reason) == (404, "NotFound")
    assert not is_transient(info.value)
    assert await client.get_or_none(NODE, None, "x") is None
    down = AsyncApiClient(ClientConfig("http://127.0.0.1:9"), timeout=1)
    with pytest.raises(Unreachable) as unreachable:
        await down.list(HOST_SUBNET)
    assert is_transient(unreachable.value)
    attempts = []

    async def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise ServerError("etcd down", 503, "ServiceUnavailable")
        return "ok"

    assert await with_retry(flaky, "flaky", 5.0, Backoff(0.001, 0.01)) == "ok"
    with pytest.raises(StatusError, match="forbidden"):
        await with_retry(lambda: down_permanent(attempts), "perm", 5.0, Backoff(0.001, 0.01))
    assert len(attempts) == 4  # a permanent error is not retried
    await down.close()


async def down_permanent(attempts: list[int]) -> None:
    attempts.append(1)
    raise StatusError("forbidden", 403, "Forbidden")


# ---- what the writes send -------------------------------------------------------------------


@dataclass
class Recorder:
    """Answers every request with its own object (or {}), recording what came."""

    seen: list[tuple[str, str, str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        if request.path == "/not-json":
            return web.Response(text="<html>")
        body = await request.read()
        self.seen.append(
            (request.method, request.path, request.content_type, json.loads(body) if body else None)
        )
        self.headers.append(dict(request.headers))
        return web.json_response(json.loads(body) if body else {})


@pytest.fixture
async def recorded() -> AsyncIterator[tuple[Recorder, AsyncApiClient]]:
    recorder = Recorder()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    config = ClientConfig(f"http://127.0.0.1:{runner.addresses[0][1]}", token="secret")
    client = AsyncApiClient(config, agent="podnet-test")
    try:
        yield recorder, client
    finally:
        await client.close()
        await runner.cleanup()


async def test_writes_go_to_their_paths_with_their_bodies(
    recorded: tuple[Recorder, AsyncApiClient],
) -> None:
    rec, client = recorded
    lease = {"metadata": {"name": "n1", "namespace": "kube-node-lease", "resourceVersion": "7"}}
    node = {"metadata": {"name": "n1", "resourceVersion": "3"}, "status": {"phase": "x"}}
    await client.create(LEASE, lease)
    await client.update(LEASE, lease)
    await client.update_status(NODE, node)
    await client.patch(POD, "shop", "web", {"status": {"podIP": "10.0.0.2"}}, subresource="status")
    await client.delete(POD, "shop", "web", resource_version=12)
    await client.delete(NODE, None, "n1")
    leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
    assert rec.seen == [
        ("POST", leases, "application/json", lease),
        ("PUT", f"{leases}/n1", "application/json", lease),
        ("PUT", "/api/v1/nodes/n1/status", "application/json", node),
        (
            "PATCH",
            "/api/v1/namespaces/shop/pods/web/status",
            "application/merge-patch+json",
            {"status": {"podIP": "10.0.0.2"}},
        ),
        (
            "DELETE",
            "/api/v1/namespaces/shop/pods/web",
            "application/json",
            {"preconditions": {"resourceVersion": "12"}},
        ),
        ("DELETE", "/api/v1/nodes/n1", "application/octet-stream", None),
    ]
    assert {h["Authorization"] for h in rec.headers} == {"Bearer secret"}
    assert {h["User-Agent"] for h in rec.headers} == {"podnet-test"}


async def test_a_non_json_answer_is_a_transient_invalid_response(
    recorded: tuple[Recorder, AsyncApiClient],
) -> None:
    _, client = recorded
    with pytest.raises(InvalidResponse, match="GET /not-json: the server did not answer") as info:
        await client.request(Call("GET", "/not-json"))
    assert is_transient(info.value)
