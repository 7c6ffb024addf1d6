"""``ClusterDns``: watch events applied to the zone, SERVFAIL until every kind is listed,
listings replacing what vanished, and the listeners kept bound (on 127.0.0.1 here: the
node's "pod subnet" is 127.0.0.0/24, so no root is needed)."""

from __future__ import annotations

import asyncio

import pytest
from dnslib import RCODE, DNSRecord

from podnet.api.authorizer import allowed_by_rules
from podnet.api.identity import User
from podnet.client import ADDED, DELETED, LISTED, MODIFIED, WatchEvent
from podnet.dns import sync as sync_module
from podnet.dns.handler import QueryHandler
from podnet.dns.sync import ClusterDns, DnsSettings
from podnet.model.kinds import ENDPOINT_SLICE, POD, SERVICE
from podnet.testing.dns import NODE, Feed, addresses, ask, endpoint_slice, pod, query, service
from podnet.testing.e2e import eventually

SVC = "web.default.svc.cluster.local"


def dns(feed: Feed | None = None) -> ClusterDns:
    settings = DnsSettings(port=0, device=None, upstream_resolv_conf=None, retry=0.05)
    return ClusterDns(feed or Feed(), NODE, settings)


def listed(*items: dict[str, object]) -> WatchEvent:
    return WatchEvent(LISTED, items=tuple(items))


async def test_events_reach_answers_and_readiness_waits_for_every_listing() -> None:
    cluster = dns()
    h = cluster.handler
    await cluster.take(SERVICE, listed(service("default", "web")))
    await cluster.take(ENDPOINT_SLICE, listed())
    assert not cluster.is_ready()
    assert rcode(h, SVC) == RCODE.SERVFAIL
    await cluster.take(POD, listed(pod("default", "p", "10.128.0.9")))
    assert cluster.is_ready() and rcode(h, SVC) == RCODE.NOERROR
    await cluster.take(SERVICE, WatchEvent(MODIFIED, service("default", "web", "172.30.0.11")))
    assert [r.data for r in cluster.index.records(SVC)] == [("172.30.0.11",)]
    await cluster.take(SERVICE, WatchEvent(DELETED, service("default", "web")))
    assert rcode(h, SVC) == RCODE.NXDOMAIN


def rcode(h: QueryHandler, name: str) -> int:
    raw = h.answer(bytes(query(name).pack()))
    assert isinstance(raw, bytes)
    return int(DNSRecord.parse(raw).header.rcode)


async def test_a_new_listing_removes_what_vanished() -> None:
    cluster = dns()
    await cluster.take(SERVICE, listed(service("default", "web"), service("default", "old")))
    await cluster.take(
        ENDPOINT_SLICE, listed(endpoint_slice("default", "s", "old", [("10.128.0.5", None, True)]))
    )
    await cluster.take(POD, listed(pod("default", "p", "10.128.0.9")))
    await cluster.take(SERVICE, listed(service("default", "web")))
    await cluster.take(ENDPOINT_SLICE, listed())
    await cluster.take(POD, listed())
    assert set(cluster.index.services) == {("default", "web")}
    assert not cluster.index.slices and not cluster.index.pods


async def test_serving_from_the_watches() -> None:
    feed = Feed()
    cluster = dns(feed)
    tasks = [asyncio.create_task(body()) for _, body in cluster.tasks()]
    try:
        feed.queue(SERVICE).put_nowait(listed(service("default", "web")))
        feed.queue(ENDPOINT_SLICE).put_nowait(listed())
        feed.queue(POD).put_nowait(listed())
        await asyncio.wait_for(cluster.bound.wait(), 10)
        while not cluster.is_ready():
            await asyncio.sleep(0.01)
        where = ("127.0.0.1", cluster.server.port)
        assert addresses(await asyncio.to_thread(ask, where, SVC)) == ["172.30.0.10"]
        seen = cluster.changes
        feed.queue(SERVICE).put_nowait(WatchEvent(ADDED, service("default", "new", "172.30.0.20")))
        while cluster.changes == seen:
            await asyncio.sleep(0.01)
        new = "new.default.svc.cluster.local"
        assert addresses(await asyncio.to_thread(ask, where, new)) == ["172.30.0.20"]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert not cluster.server.serving


def test_a_node_may_list_and_watch_what_the_dns_watches_and_write_none_of_it() -> None:
    node = User("system:node:node-1", ("system:nodes",))
    for kind in (SERVICE, ENDPOINT_SLICE, POD):
        for verb in ("list", "watch"):
            assert allowed_by_rules(node, verb, kind.group, kind.plural, None, None), kind
    for kind in (SERVICE, ENDPOINT_SLICE):
        assert not allowed_by_rules(node, "create", kind.group, kind.plural, "default", None)


async def test_listeners_are_bound_again_when_the_bridge_is_made_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    index = iter([7, 7, 7, 8, 8, 8, 8, 8, 8, 8])  # br0's ifindex; the bridge is made again
    monkeypatch.setattr(sync_module, "_device_index", lambda device: next(index, 8))
    cluster = dns()
    starts: list[int] = []
    original = cluster.server.start

    async def counted() -> None:
        starts.append(1)
        await original()

    monkeypatch.setattr(cluster.server, "start", counted)
    task = asyncio.create_task(cluster.serve())
    try:
        await eventually(lambda: len(starts) == 2 and cluster.bound.is_set(), 10, "rebound")
        assert cluster.server.serving
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert not cluster.server.serving and not cluster.bound.is_set()


async def test_without_verified_pod_records_pods_are_not_watched() -> None:
    settings = DnsSettings(port=0, device=None, upstream_resolv_conf=None, pod_records="insecure")
    cluster = ClusterDns(Feed(), NODE, settings)
    assert [name for name, _ in cluster.tasks()] == [
        "dns-serve",
        "dns-watch-services",
        "dns-watch-endpointslices",
    ]
    await cluster.take(SERVICE, listed())
    await cluster.take(ENDPOINT_SLICE, listed())
    assert cluster.is_ready()
    assert rcode(cluster.handler, "10-128-0-9.team.pod.cluster.local") == RCODE.NOERROR


async def test_first_listings_wait_for_after_and_later_events_do_not() -> None:
    after = asyncio.Event()
    settings = DnsSettings(port=0, device=None, upstream_resolv_conf=None, retry=0.05)
    cluster = ClusterDns(Feed(), NODE, settings, after=after)
    first = asyncio.create_task(cluster.take(SERVICE, listed(service("default", "web"))))
    for _ in range(20):  # the task runs up to its wait for ``after``, and stays there
        await asyncio.sleep(0)
    assert not first.done() and not cluster.index.records(SVC)
    after.set()
    await first
    assert cluster.index.records(SVC)
    after.clear()  # waited once: a relist and a change are applied at once
    await cluster.take(SERVICE, listed(service("default", "web", "172.30.0.12")))
    await cluster.take(SERVICE, WatchEvent(MODIFIED, service("default", "web", "172.30.0.13")))
    assert [r.data for r in cluster.index.records(SVC)] == [("172.30.0.13",)]


async def test_first_listings_wait_for_after_only_so_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sync_module, "AFTER_TIMEOUT", 0.01)
    settings = DnsSettings(port=0, device=None, upstream_resolv_conf=None, retry=0.05)
    cluster = ClusterDns(Feed(), NODE, settings, after=asyncio.Event())  # never set
    await cluster.take(SERVICE, listed(service("default", "web")))
    assert cluster.index.records(SVC)
