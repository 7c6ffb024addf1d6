"""Watch: initial state, resume from a resourceVersion, 410 after compaction, filters."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
from typing import Any

import httpx

from podnet.store.etcd import EtcdStore
from podnet.store.etcd_process import EtcdProcess
from podnet.testing.api import (
    aiohttp_session_for,
    async_client_for,
    kubeconfig_parts,
    namespace,
    pod,
)
from podnet.testing.e2e import eventually
from podnet.testing.processes import MasterProcess

NS = "/api/v1/namespaces"


async def read_events(
    api: httpx.AsyncClient,
    path: str,
    count: int,
    timeout: float = 10.0,
    into: list[dict[str, Any]] | None = None,
    **params: str,
) -> list[dict[str, Any]]:
    """The first ``count`` events of a watch (or fewer if ``timeout`` passes), appended to
    ``into`` as they come when given (so a test sees the watch's progress)."""
    events: list[dict[str, Any]] = [] if into is None else into

    async def consume() -> None:
        async with api.stream("GET", path, params={"watch": "1", **params}) as stream:
            assert stream.status_code == 200, await stream.aread()
            async for line in stream.aiter_lines():
                if line.strip():
                    events.append(json.loads(line))
                    if len(events) >= count:
                        return

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(consume(), timeout)
    return events


def summary(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"].get("name", "")) for e in events]


async def test_watch_resume_replays_only_what_came_after(master: MasterProcess) -> None:
    pods = "/api/v1/namespaces/default/pods"
    async with async_client_for(master.kubeconfig) as api:
        first = (await api.post(pods, json=pod("w1"))).json()
        mark = first["metadata"]["resourceVersion"]
        await api.post(pods, json=pod("w2"))
        await api.patch(
            f"{pods}/w1",
            json={"metadata": {"labels": {"x": "1"}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        await api.delete(f"{pods}/w2")
        events = await read_events(api, pods, 3, resourceVersion=mark)
        assert summary(events) == [("ADDED", "w2"), ("MODIFIED", "w1"), ("DELETED", "w2")]
        revisions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
        assert revisions == sorted(revisions) and revisions[0] > int(mark)


async def test_namespace_delete_is_seen_as_terminating_then_deleted(master: MasterProcess) -> None:
    async with async_client_for(master.kubeconfig) as api:
        created = (await api.post(NS, json=namespace("fading"))).json()
        await api.delete(f"{NS}/fading")
        events = await read_events(
            api, f"{NS}/fading", 2, resourceVersion=created["metadata"]["resourceVersion"]
        )
        assert summary(events) == [("MODIFIED", "fading"), ("DELETED", "fading")]
        assert events[0]["object"]["status"]["phase"] == "Terminating"


async def test_watch_without_version_sends_state_then_live(master: MasterProcess) -> None:
    async with async_client_for(master.kubeconfig) as api:
        await api.post(NS, json=namespace("live-a", {"team": "x"}))
        seen: list[dict[str, Any]] = []
        task = asyncio.create_task(read_events(api, NS, 2, into=seen, labelSelector="team=x"))
        await eventually(lambda: len(seen) == 1, what="the state first: live-a")
        await api.post(NS, json=namespace("live-b", {"team": "y"}))
        await api.post(NS, json=namespace("live-c", {"team": "x"}))
        events = await task
        assert summary(events) == [("ADDED", "live-a"), ("ADDED", "live-c")]


async def test_label_change_out_of_selector_is_deleted_for_that_watcher(
    master: MasterProcess,
) -> None:
    async with async_client_for(master.kubeconfig) as api:
        created = (await api.post(NS, json=namespace("sel", {"team": "x"}))).json()
        rv = created["metadata"]["resourceVersion"]
        await api.patch(
            f"{NS}/sel",
            json={"metadata": {"labels": {"team": "y"}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        events = await read_events(api, NS, 1, resourceVersion=rv, labelSelector="team=x")
        assert summary(events) == [("DELETED", "sel")]


async def test_compacted_version_is_gone(master: MasterProcess, etcd: EtcdProcess) -> None:
    async with async_client_for(master.kubeconfig) as api:
        old = (await api.post(NS, json=namespace("c1"))).json()["metadata"]["resourceVersion"]
        await api.post(NS, json=namespace("c2"))
        latest = (await api.post(NS, json=namespace("c3"))).json()["metadata"]["resourceVersion"]
        store = EtcdStore(etcd.endpoint)
        await store.connect()
        try:
            await store.compact(int(latest))
        finally:
            await store.close()
        answer = await api.get(NS, params={"watch": "1", "resourceVersion": old})
        assert answer.status_code == 410
        assert answer.json()["reason"] == "Expired"
        # The client relists and resumes from the list's version.
        listed = (await api.get(NS)).json()
        names = {n["metadata"]["name"] for n in listed["items"]}
        assert {"c1", "c2", "c3"} <= names
        # Watched from the list's version: c4, made after the list, is seen whenever the
        # watch connects.
        task = asyncio.create_task(
            read_events(api, NS, 1, resourceVersion=listed["metadata"]["resourceVersion"])
        )
        await api.post(NS, json=namespace("c4"))
        assert summary(await task) == [("ADDED", "c4")]


async def test_watch_of_one_object_sees_only_that_object(master: MasterProcess) -> None:
    async with async_client_for(master.kubeconfig) as api:
        created = (await api.post(NS, json=namespace("one"))).json()
        await api.post(NS, json=namespace("two"))
        rv = created["metadata"]["resourceVersion"]
        # From ``rv``: both patches come after it, whenever the watch connects.
        task = asyncio.create_task(read_events(api, f"{NS}/one", 1, resourceVersion=rv))
        await api.patch(
            f"{NS}/two",
            json={"metadata": {"labels": {"a": "b"}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        await api.patch(
            f"{NS}/one",
            json={"metadata": {"labels": {"a": "b"}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert summary(await task) == [("MODIFIED", "one")]


async def test_a_stalled_watcher_is_dropped_alone(master: MasterProcess) -> None:
    """A watcher that never reads gets 410 and loses its connection; the others get every
    event. Bounded by sizes, not time: 60 events of ~200 kB (12 MB) are more than the
    stalled connection's kernel buffers (~4 MiB: it never reads, so they do not grow)
    and the 4 MiB backlog."""
    pods, total = "/api/v1/namespaces/default/pods", 60
    server, ca, token = kubeconfig_parts(master.kubeconfig)
    host, port = server.removeprefix("https://").rsplit(":", 1)
    async with async_client_for(master.kubeconfig) as api:
        listed = (await api.get(pods)).json()["metadata"]["resourceVersion"]
        stalled = socket.create_connection((host, int(port)))
        context = ssl.create_default_context(cadata=ca.decode())
        stalled = context.wrap_socket(stalled, server_hostname=host)
        path = f"{pods}?watch=1&resourceVersion={listed}"
        stalled.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
        )
        readers = [asyncio.create_task(_names_seen(master, path, total)) for _ in range(2)]
        big = {"big": "x" * 200_000}
        for i in range(total):
            body = pod(f"heavy-{i}")
            body["metadata"]["annotations"] = big
            assert (await api.post(pods, json=body)).status_code == 201
        for reader in readers:
            assert await reader == [f"heavy-{i}" for i in range(total)]
    received = await asyncio.to_thread(_read_to_end, stalled)
    assert b'"type":"ERROR"' in received and b'"code":410' in received
    assert 0 < received.count(b'"type":"ADDED"') < total


async def _names_seen(master: MasterProcess, path: str, count: int) -> list[str]:
    """The names in the first ``count`` events of a watch (read in bulk: the lines are long)."""
    names: list[str] = []
    async with aiohttp_session_for(master.kubeconfig, 2) as api, api.get(path) as stream:
        assert stream.status == 200
        pending = b""
        async for data in stream.content.iter_any():
            *lines, pending = (pending + data).split(b"\n")
            names += [json.loads(line)["object"]["metadata"]["name"] for line in lines if line]
            if len(names) >= count:
                return names
    return names


def _read_to_end(sock: ssl.SSLSocket) -> bytes:
    """Everything the server sends until it closes the connection."""
    sock.settimeout(60)
    chunks = []
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        while chunk := sock.recv(1 << 20):
            chunks.append(chunk)
    sock.close()
    return b"".join(chunks)
