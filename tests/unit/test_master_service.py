"""The default/kubernetes Service's desired objects and repairs (pure), and the
reconciler on the in-memory store: created, repaired, recreated, endpoints from leases."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator

import pytest

from podnet.api.kubernetesservice import MasterServiceReconciler
from podnet.api.masterleases import MasterAddress
from podnet.api.masterservice import (
    desired_endpoints,
    desired_service,
    desired_slice,
    endpoints_fix,
    repaired_service,
    reserved_ip_problems,
    service_fix,
    slice_fix,
)
from podnet.api.registry import Registry
from podnet.api.servicealloc import Network
from podnet.client.errors import NotFound
from podnet.controllers.inprocess import InProcessApi
from podnet.model.kinds import ENDPOINT_SLICE, ENDPOINTS, SERVICE, Kind
from podnet.store.memory import MemoryStore
from podnet.testing.e2e import eventually

NET = ipaddress.ip_network("172.30.0.0/16")


def test_desired_service_and_its_fixes() -> None:
    want = desired_service("172.30.0.1", 6443)
    assert want["spec"]["ports"] == [
        {"name": "https", "protocol": "TCP", "port": 443, "targetPort": 6443}
    ]
    assert service_fix(want, want) == "none"
    moved = {
        **want,
        "spec": {**want["spec"], "ports": [{**want["spec"]["ports"][0], "port": 8443}]},
    }
    assert service_fix(moved, want) == "update"
    selected = {**want, "spec": {**want["spec"], "selector": {"app": "x"}}}
    assert service_fix(selected, want) == "update"
    assert "selector" not in repaired_service(selected, want)["spec"]
    assert service_fix(repaired_service(moved, want), want) == "none"
    other_ip = {**want, "spec": {**want["spec"], "clusterIP": "172.30.9.9"}}
    assert service_fix(other_ip, want) == "recreate"


def test_only_default_kubernetes_may_ask_for_the_reserved_ip() -> None:
    def asking(namespace: str, name: str, ip: str = "172.30.0.1") -> dict[str, object]:
        return {"metadata": {"namespace": namespace, "name": name}, "spec": {"clusterIP": ip}}

    assert reserved_ip_problems(asking("default", "kubernetes"), None, "172.30.0.1") == []
    problems = reserved_ip_problems(asking("default", "grab"), None, "172.30.0.1")
    assert problems[0].field == "spec.clusterIP" and "reserved" in problems[0].message
    assert reserved_ip_problems(asking("other", "kubernetes"), None, "172.30.0.1")
    assert reserved_ip_problems(asking("default", "grab", "172.30.0.2"), None, "172.30.0.1") == []
    # A Service that already holds it (stored before the rule) stays editable.
    held = reserved_ip_problems(asking("default", "old"), {"clusterIP": "172.30.0.1"}, "172.30.0.1")
    assert held == []


def test_endpoints_and_slice_hold_the_masters_once_each() -> None:
    endpoints = desired_endpoints(["10.0.0.2", "10.0.0.1", "10.0.0.2"], 6443)
    assert endpoints["subsets"] == [
        {
            "addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}],
            "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
        }
    ]
    assert desired_endpoints([], 6443)["subsets"] == []
    slice_ = desired_slice(["10.0.0.1"], 6443)
    assert [e["addresses"] for e in slice_["endpoints"]] == [["10.0.0.1"]]
    assert endpoints_fix(endpoints, endpoints) is None and slice_fix(slice_, slice_) is None
    assert endpoints_fix(None, endpoints) == endpoints
    stale = {
        **endpoints,
        "subsets": [],
        "metadata": {**endpoints["metadata"], "labels": {"x": "y"}},
    }
    fixed = endpoints_fix(stale, endpoints)
    assert fixed is not None and fixed["subsets"] == endpoints["subsets"]
    assert fixed["metadata"]["labels"]["x"] == "y", "other labels stay"


class FakeLeases:
    def __init__(self) -> None:
        self.held: dict[str, MasterAddress] = {}

    async def hold(self, address: MasterAddress) -> None:
        self.held[address.ip] = address

    async def live(self) -> list[MasterAddress]:
        return list(self.held.values())

    async def release(self) -> None:
        self.held.pop("192.0.2.1", None)

    async def joins_and_leaves(self) -> AsyncIterator[None]:
        await asyncio.Event().wait()  # nobody joins or leaves here
        yield None


@pytest.fixture
async def api() -> AsyncIterator[InProcessApi]:
    async with InProcessApi.standalone(Registry(MemoryStore())) as made:
        yield made


async def test_the_reconciler_creates_repairs_and_follows_leases(api: InProcessApi) -> None:
    async def network() -> Network:
        return NET

    leases = FakeLeases()
    leases.held["192.0.2.7"] = MasterAddress("192.0.2.7", 6443)  # another live master
    reconciler = MasterServiceReconciler(api, network, 6443, leases, "192.0.2.1")
    await reconciler.reconcile()
    service = await api.get(SERVICE, "default", "kubernetes")
    assert service["spec"]["clusterIP"] == "172.30.0.1"
    endpoints = await api.get(ENDPOINTS, "default", "kubernetes")
    assert [a["ip"] for a in endpoints["subsets"][0]["addresses"]] == ["192.0.2.1", "192.0.2.7"]
    slice_ = await api.get(ENDPOINT_SLICE, "default", "kubernetes")
    version = slice_["metadata"]["resourceVersion"]
    await reconciler.reconcile()  # nothing differs: nothing written
    again = await api.get(ENDPOINT_SLICE, "default", "kubernetes")
    assert again["metadata"]["resourceVersion"] == version

    service["spec"]["ports"][0]["targetPort"] = 1
    await api.update(SERVICE, service)
    await api.delete(ENDPOINTS, "default", "kubernetes")
    await reconciler.reconcile()
    assert (await api.get(SERVICE, "default", "kubernetes"))["spec"]["ports"][0][
        "targetPort"
    ] == 6443
    assert (await api.get(ENDPOINTS, "default", "kubernetes"))["subsets"]

    await reconciler.stop()  # releases its lease, writes itself out
    endpoints = await api.get(ENDPOINTS, "default", "kubernetes")
    assert [a["ip"] for a in endpoints["subsets"][0]["addresses"]] == ["192.0.2.7"]


async def test_a_started_reconciler_repairs_at_once_and_stops_cleanly(api: InProcessApi) -> None:
    async def network() -> Network:
        return NET

    reconciler = MasterServiceReconciler(api, network, 6443, FakeLeases(), "192.0.2.1", 3600)
    reconciler.start()
    try:
        await eventually(lambda: reconciler.rounds >= 1, what="the first round")
        await api.delete(SERVICE, "default", "kubernetes")
        # The interval is an hour: only the watch can bring it back.
        await eventually(
            lambda: _exists(api, SERVICE), what="the Service made again", interval=0.02
        )
    finally:
        await reconciler.stop()
    assert all(task.done() for task in reconciler._tasks) and reconciler._tasks == []


async def _exists(api: InProcessApi, kind: Kind) -> bool:
    try:
        await api.get(kind, "default", "kubernetes")
    except NotFound:
        return False
    return True
