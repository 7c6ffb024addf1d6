"""``ServiceSync`` against scripted watches and the fake data plane: nothing before every
listing, every change reaches the data plane as the table a full compile gives, and a
service the data plane refuses is left out while the rest is applied."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from ipaddress import IPv4Address
from typing import Any

import pytest

from podnet.agent.services import ServiceSync, pacing
from podnet.client import LISTED, WatchEvent
from podnet.dataplane.fake import FakeDataPlane
from podnet.model.kinds import ENDPOINT_SLICE, HOST_SUBNET, SERVICE, Kind
from podnet.reconcile import APPLIED, PARTIAL, Pacing
from podnet.services.compile import compile_services
from podnet.services.model import ServiceTable
from podnet.testing.e2e import eventually
from podnet.testing.nodenetwork import node_network

Obj = dict[str, Any]
NODE = node_network("node-1", "198.51.100.11", "10.128.0.0/23")


class ScriptedWatches:
    """Per kind: a listing released by ``list``, then the events ``send`` queues."""

    def __init__(self) -> None:
        self.queues: dict[str, asyncio.Queue[WatchEvent]] = {
            kind.plural: asyncio.Queue() for kind in (SERVICE, ENDPOINT_SLICE, HOST_SUBNET)
        }

    async def watch(self, kind: Kind) -> AsyncIterator[WatchEvent]:
        while True:
            yield await self.queues[kind.plural].get()

    def send(self, kind: Kind, event: WatchEvent) -> None:
        self.queues[kind.plural].put_nowait(event)


def service(name: str, host: int) -> Obj:
    spec = {"clusterIP": f"172.30.0.{host}", "ports": [{"port": 80, "protocol": "TCP"}]}
    return {"metadata": {"namespace": "default", "name": name}, "spec": spec}


def endpoint_slice(name: str, *hosts: int) -> Obj:
    return {
        "metadata": {
            "namespace": "default",
            "name": f"{name}-1",
            "labels": {"kubernetes.io/service-name": name},
        },
        "endpoints": [
            {"addresses": [f"10.128.2.{h}"], "conditions": {"ready": True}} for h in hosts
        ],
        "ports": [{"port": 8080, "protocol": "TCP"}],
    }


def hostsubnet(name: str, host: int) -> Obj:
    return {"metadata": {"name": name}, "host": name, "hostIP": f"198.51.100.{host}"}


def with_nodes(table: ServiceTable, *hosts: int) -> ServiceTable:
    return ServiceTable(table.ports, tuple(IPv4Address(f"198.51.100.{h}") for h in hosts))


@pytest.fixture
async def plane() -> FakeDataPlane:
    fake = FakeDataPlane()
    await fake.setup_node(NODE)
    return fake


async def test_applies_after_both_listings_then_follows_changes(plane: FakeDataPlane) -> None:
    watches = ScriptedWatches()
    sync = ServiceSync(watches, plane, NODE, Pacing(3600, 0.001, compile_in_thread=True))
    tasks = [asyncio.create_task(body()) for _, body in sync.tasks()]
    try:
        services, slices = [service("a", 1), service("b", 2)], [endpoint_slice("a", 5, 6)]
        watches.send(SERVICE, WatchEvent(LISTED, items=tuple(services)))
        await asyncio.sleep(0.05)
        assert plane.count("sync_services") == 0  # the slices have not listed yet
        watches.send(ENDPOINT_SLICE, WatchEvent(LISTED, items=tuple(slices)))
        await asyncio.sleep(0.05)
        assert plane.count("sync_services") == 0  # nor the HostSubnets
        watches.send(HOST_SUBNET, WatchEvent(LISTED, items=(hostsubnet("node-1", 11),)))
        want = with_nodes(compile_services(services, slices, "node-1"), 11)
        await eventually(lambda: plane.state.services == want, what="the first table")
        slices = [endpoint_slice("a", 7), endpoint_slice("b", 8)]
        for changed in slices:
            watches.send(ENDPOINT_SLICE, WatchEvent("MODIFIED", changed))
        watches.send(SERVICE, WatchEvent("DELETED", services[0]))
        watches.send(HOST_SUBNET, WatchEvent("ADDED", hostsubnet("node-2", 12)))
        want = with_nodes(compile_services(services[1:], slices, "node-1"), 11, 12)
        await eventually(lambda: plane.state.services == want, what="the changed table")
        assert sync.loop.last is not None and sync.loop.last.result == APPLIED
        assert [p.service for p in want.ports] == ["default/b"]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_refused_service_is_left_out_and_the_rest_applied(plane: FakeDataPlane) -> None:
    plane.refuse.add("default/bad")
    watches = ScriptedWatches()
    sync = ServiceSync(watches, plane, NODE, pacing(3600))
    services = [service("bad", 1), service("good", 2)]
    sync.queue(SERVICE, WatchEvent(LISTED, items=tuple(services)))
    sync.queue(ENDPOINT_SLICE, WatchEvent(LISTED, items=(endpoint_slice("good", 5),)))
    sync.queue(HOST_SUBNET, WatchEvent(LISTED, items=()))
    assert await sync.loop.reconcile_once()
    assert sync.loop.last is not None and sync.loop.last.result == PARTIAL
    assert sync.loop.left_out == frozenset({"default/bad"})
    assert plane.state.services is not None
    assert plane.state.services.services() == ["default/good"]


async def test_first_listings_reach_the_compiler_as_they_arrive_in_event_order(
    plane: FakeDataPlane,
) -> None:
    sync = ServiceSync(ScriptedWatches(), plane, NODE, pacing(3600))
    services = [service("a", 1), service("b", 2)]
    sync.queue(ENDPOINT_SLICE, WatchEvent(LISTED, items=(endpoint_slice("a", 5),)))
    sync.queue(SERVICE, WatchEvent("ADDED", service("c", 3)))  # then replaced by the listing
    sync.queue(SERVICE, WatchEvent(LISTED, items=tuple(services)))
    sync.queue(ENDPOINT_SLICE, WatchEvent("MODIFIED", endpoint_slice("a", 6)))  # after it
    for job in sync._early:  # the worker's jobs: both listings, before any pass
        job.result(timeout=10)
    early = compile_services(services, [endpoint_slice("a", 5)], "node-1")
    assert sync.compiler.table().ports == early.ports  # the compiler had them already
    sync.queue(HOST_SUBNET, WatchEvent(LISTED, items=(hostsubnet("node-1", 11),)))
    assert await sync.loop.reconcile_once()
    want = with_nodes(compile_services(services, [endpoint_slice("a", 6)], "node-1"), 11)
    assert plane.state.services == want
    assert sync._executor is None  # the worker is let go after the first pass
