"""Remote nodes: HostSubnets -> RemoteNode, the sync loop, the fake data plane's checks,
and the API client's list+watch (relist on 410, resume after a dropped connection)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Interface, IPv4Network
from typing import Any

import pytest
from aiohttp import web

from podnet.agent.agent import apply_event
from podnet.agent.apiclient import (
    LISTED,
    AsyncApiClient,
    Backoff,
    PermanentApiError,
    TransientApiError,
    WatchEvent,
    with_retry,
)
from podnet.agent.remotes import RemoteNodeSync, remote_nodes
from podnet.dataplane.fake import FakeDataPlane
from podnet.dataplane.interface import (
    DataPlaneError,
    NodeNetwork,
    NodeSetupRefused,
    PodNetwork,
    RemoteNode,
)
from podnet.kubeconfig import ClientConfig
from podnet.model.kinds import HOST_SUBNET, NODE

Obj = dict[str, Any]
LOCAL = NodeNetwork(
    "node-a",
    IPv4Address("192.0.2.10"),
    IPv4Network("10.128.0.0/24"),
    (IPv4Network("10.128.0.0/14"),),
    IPv4Network("172.30.0.0/16"),
    1450,
)


def hostsubnet(name: str, subnet: str | None, ip: str, rv: int = 1) -> Obj:
    obj: Obj = {"metadata": {"name": name, "resourceVersion": str(rv)}, "host": name, "hostIP": ip}
    if subnet:
        obj["subnet"] = subnet
    return obj


def remote(name: str, ip: str, subnet: str) -> RemoteNode:
    return RemoteNode(name, IPv4Address(ip), IPv4Network(subnet))


# ---- the pure function ---------------------------------------------------------------------


def test_remote_nodes_skip_this_node_and_subnetless_hostsubnets() -> None:
    subnets = [
        hostsubnet("node-c", "10.128.2.0/24", "192.0.2.12"),
        hostsubnet("node-a", "10.128.0.0/24", "192.0.2.10"),
        hostsubnet("node-b", "10.128.1.0/24", "192.0.2.11"),
        hostsubnet("pending", None, "192.0.2.13"),
        hostsubnet("broken", "not-a-cidr", "192.0.2.14"),
    ]
    assert remote_nodes(subnets, "node-a") == [
        remote("node-b", "192.0.2.11", "10.128.1.0/24"),
        remote("node-c", "192.0.2.12", "10.128.2.0/24"),
    ]


def test_apply_event_folds_listings_and_changes() -> None:
    objects: dict[str, Obj] = {"stale": {}}
    apply_event(objects, WatchEvent(LISTED, items=(hostsubnet("a", "10.0.0.0/24", "1.1.1.1"),)))
    assert list(objects) == ["a"]
    apply_event(objects, WatchEvent("ADDED", hostsubnet("b", "10.0.1.0/24", "1.1.1.2")))
    apply_event(objects, WatchEvent("DELETED", hostsubnet("a", "10.0.0.0/24", "1.1.1.1")))
    assert list(objects) == ["b"]


# ---- the sync loop -------------------------------------------------------------------------


@pytest.fixture
async def dataplane() -> FakeDataPlane:
    fake = FakeDataPlane()
    await fake.setup_node(LOCAL)
    return fake


async def settle(sync: RemoteNodeSync, calls: int, dataplane: FakeDataPlane) -> None:
    for _ in range(500):
        if dataplane.calls.count("sync_remote_nodes") >= calls and sync.synced.is_set():
            return
        await asyncio.sleep(0.01)
    raise TimeoutError(f"fewer than {calls} syncs: {dataplane.calls}")


async def test_a_burst_of_changes_is_one_sync(dataplane: FakeDataPlane) -> None:
    sync = RemoteNodeSync(dataplane, LOCAL, resync_period=60, coalesce=0.05)
    task = asyncio.create_task(sync.run())
    subnets: dict[str, Obj] = {}
    for i in range(1, 11):
        subnets[f"n{i}"] = hostsubnet(f"n{i}", f"10.128.{i}.0/24", f"192.0.2.{20 + i}")
        sync.replace(subnets)
    await settle(sync, 1, dataplane)
    await asyncio.sleep(0.1)
    assert dataplane.calls.count("sync_remote_nodes") == 1
    assert sorted(dataplane.state.remotes) == sorted(subnets)
    assert dataplane.vtep_peers() == {IPv4Address(f"192.0.2.{20 + i}") for i in range(1, 11)}
    task.cancel()


async def test_failed_sync_is_retried_and_drift_is_repaired(dataplane: FakeDataPlane) -> None:
    sync = RemoteNodeSync(dataplane, LOCAL, resync_period=0.2, coalesce=0.01)
    dataplane.fail_next["sync_remote_nodes"] = DataPlaneError("netlink busy")
    sync.replace({"b": hostsubnet("b", "10.128.1.0/24", "192.0.2.11")})
    task = asyncio.create_task(sync.run())
    await settle(sync, 2, dataplane)
    assert list(dataplane.state.remotes) == ["b"]
    dataplane.drift_remove_remote("b")
    before = dataplane.calls.count("sync_remote_nodes")
    await settle(sync, before + 1, dataplane)
    assert list(dataplane.state.remotes) == ["b"]
    assert dataplane.remote_changes == ["add b", "add b"]
    task.cancel()


# ---- the fake data plane refuses what a kernel would ----------------------------------------


async def test_fake_refuses_overlapping_or_duplicate_remotes(dataplane: FakeDataPlane) -> None:
    bad = [
        [remote("b", "192.0.2.11", "10.128.0.128/25")],  # inside the local subnet
        [remote("b", "192.0.2.11", "10.128.1.0/24"), remote("c", "192.0.2.12", "10.128.1.0/25")],
        [remote("b", "192.0.2.10", "10.128.1.0/24")],  # this node's IP
        [remote("node-a", "192.0.2.11", "10.128.1.0/24")],
    ]
    for remotes in bad:
        with pytest.raises(DataPlaneError):
            await dataplane.sync_remote_nodes(LOCAL, remotes)
    assert dataplane.state.remotes == {}


def pod(cid: str, address: str, **changes: Any) -> PodNetwork:
    gateway = IPv4Address("10.128.0.1")
    base = PodNetwork(cid, "/var/run/netns/x", "eth0", IPv4Interface(address), gateway, 1450)
    return dataclasses.replace(base, **changes)


async def test_fake_refuses_bad_pods(dataplane: FakeDataPlane) -> None:
    await dataplane.attach_pod(pod("c1", "10.128.0.2/24"))
    refused = [
        pod("c1", "10.128.0.3/24"),  # same container and ifname
        pod("c2", "10.128.0.2/24"),  # address in use
        pod("c2", "10.128.1.2/24"),  # outside the node subnet
        pod("c2", "10.128.0.1/24"),  # the gateway
        pod("c2", "10.128.0.3/24", mtu=9000),
        pod("c2", "10.128.0.3/24", netns=""),
        pod("c2", "10.128.0.3/24", ifname="a-name-too-long-x"),
        pod("c2", "10.128.0.3/24", gateway=IPv4Address("10.128.0.254")),
    ]
    for bad in refused:
        with pytest.raises(DataPlaneError):
            await dataplane.attach_pod(bad)
    await dataplane.detach_pod("c1", "eth0", None)
    await dataplane.detach_pod("c1", "eth0", None)  # already gone: fine
    assert await dataplane.attached_pods() == []


async def test_fake_refuses_work_before_set_up_and_bad_nodes() -> None:
    fresh = FakeDataPlane()
    assert not (await fresh.check_node(LOCAL)).ok
    with pytest.raises(DataPlaneError):
        await fresh.attach_pod(pod("c1", "10.128.0.2/24"))
    too_big = dataclasses.replace(LOCAL, mtu=1480)
    outside = dataclasses.replace(LOCAL, subnet=IPv4Network("10.200.0.0/24"))
    for bad in (too_big, outside):
        with pytest.raises(NodeSetupRefused):
            await fresh.setup_node(bad)
    await fresh.setup_node(LOCAL)
    assert (await fresh.check_node(LOCAL)).ok


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
    stream = client.watch(HOST_SUBNET, backoff=Backoff(0.01, 0.05))
    async for event in stream:
        objects = list(event.items) if event.type == LISTED else [event.object or {}]
        events.append((event.type, [o["metadata"]["name"] for o in objects]))
        if len(events) == 5:
            break
    await stream.aclose()
    assert events == [
        (LISTED, ["a"]),
        ("ADDED", ["b"]),
        (LISTED, ["a", "c"]),
        (LISTED, ["c"]),
        ("MODIFIED", ["c"]),
    ]
    assert api.seen_versions == ["10", "11", "20", "30"]


async def test_errors_are_classified(scripted: tuple[ScriptedApi, AsyncApiClient]) -> None:
    _, client = scripted
    with pytest.raises(PermanentApiError) as info:
        await client.get(NODE, "x")
    assert (info.value.code, info.value.reason) == (404, "NotFound")
    down = AsyncApiClient(ClientConfig("http://127.0.0.1:9"), timeout=1)
    with pytest.raises(TransientApiError):
        await down.list(HOST_SUBNET)
    attempts = []

    async def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise TransientApiError("503")
        return "ok"

    assert await with_retry(flaky, "flaky", 5.0, Backoff(0.001, 0.01)) == "ok"
    with pytest.raises(PermanentApiError):
        await with_retry(lambda: down_permanent(attempts), "perm", 5.0, Backoff(0.001, 0.01))
    assert len(attempts) == 4  # a permanent error is not retried
    await down.close()


async def down_permanent(attempts: list[int]) -> None:
    attempts.append(1)
    raise PermanentApiError("forbidden", 403, "Forbidden")
