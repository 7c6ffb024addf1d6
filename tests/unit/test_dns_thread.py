"""The cluster DNS answers from a thread of its own: while the agent's loop is busy
(here: blocked outright) queries are still answered, and index changes made on the
agent's loop reach the answers, never leaving a stale one in the cache. On 127.0.0.1
(the node's "pod subnet" is 127.0.0.0/24), a high port, no root."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest

from podnet.client import LISTED, MODIFIED, WatchEvent
from podnet.dns.sync import ClusterDns, DnsSettings
from podnet.dns.thread import run_in_thread
from podnet.model.kinds import ENDPOINT_SLICE, POD, SERVICE
from podnet.testing.dns import NODE, Feed, addresses, ask, service

SVC = "web.default.svc.cluster.local"


@pytest.fixture
async def serving() -> AsyncIterator[ClusterDns]:
    feed = Feed()
    settings = DnsSettings(port=0, device=None, upstream_resolv_conf=None, retry=0.05)
    cluster = ClusterDns(feed, NODE, settings)
    tasks = [asyncio.create_task(body()) for _, body in cluster.tasks()]
    feed.queue(SERVICE).put_nowait(WatchEvent(LISTED, items=(service("default", "web"),)))
    feed.queue(ENDPOINT_SLICE).put_nowait(WatchEvent(LISTED, items=()))
    feed.queue(POD).put_nowait(WatchEvent(LISTED, items=()))
    await asyncio.wait_for(cluster.bound.wait(), 10)
    while not cluster.is_ready():
        await asyncio.sleep(0.01)
    yield cluster
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert not cluster.server.serving  # the thread closed its sockets before it ended


async def test_answers_while_the_agents_loop_is_blocked(serving: ClusterDns) -> None:
    where = ("127.0.0.1", serving.server.port)
    # Asked from the loop's own thread, blocking it: on the loop the DNS would never
    # read the query (a TimeoutError after 3 s).
    for _ in range(5):
        assert addresses(ask(where, SVC)) == ["172.30.0.10"]
        assert addresses(ask(where, SVC, tcp=True)) == ["172.30.0.10"]


async def test_changes_on_the_agents_loop_reach_the_answers(serving: ClusterDns) -> None:
    where = ("127.0.0.1", serving.server.port)
    seen: set[tuple[str, ...]] = set()
    stop = threading.Event()

    def keep_asking() -> None:
        while not stop.is_set():
            seen.add(tuple(addresses(ask(where, SVC))))

    asker = asyncio.create_task(asyncio.to_thread(keep_asking))
    try:
        for i in range(300):  # each change invalidates the cached answer the asker reads
            ip = f"172.30.1.{i % 250 + 1}"
            await serving.take(SERVICE, WatchEvent(MODIFIED, service("default", "web", ip)))
            await asyncio.sleep(0)
    finally:
        stop.set()
        await asker
    assert all(len(answer) == 1 for answer in seen)  # never a half-made answer
    assert addresses(ask(where, SVC)) == ["172.30.1.50"]  # the last change, not a stale one


async def test_a_failure_in_the_thread_is_raised_in_the_caller() -> None:
    async def broken() -> None:
        raise RuntimeError("bind failed")

    with pytest.raises(RuntimeError, match="bind failed"):
        await run_in_thread(broken, "test-dns")
