"""The endpoints controller over the in-memory store, the real validation and the
in-process object API (with its watch cache); the tests act as users on the registry."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from podnet.api.registry import Registry
from podnet.client.errors import error_from_status
from podnet.controllers.endpoints import EndpointsController
from podnet.controllers.endpointslicesdesired import MIRROR_CONTROLLER
from podnet.controllers.inprocess import InProcessApi
from podnet.model.kinds import ENDPOINT_SLICE, ENDPOINTS, NAMESPACE, POD, SERVICE
from podnet.model.schemas_discovery import MANAGED_BY_LABEL, SERVICE_NAME_LABEL
from podnet.testing.e2e import eventually

Obj = dict[str, Any]
NS = "shop"


def service(name: str = "web", **spec: Any) -> Obj:
    body: Obj = {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}
    body.update(spec)
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": body}


def pod(name: str, ip: str, ready: bool = True, app: str = "web") -> Obj:
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "main"}]},
        "status": {"phase": "Running", "podIP": ip, "conditions": [condition]},
    }


@pytest.fixture
async def controller(registry: Registry, api: InProcessApi) -> AsyncIterator[EndpointsController]:
    await registry.create(NAMESPACE, {"metadata": {"name": NS}})
    running = EndpointsController(api, resync_period=None)
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


async def ready_ips(registry: Registry, name: str = "web") -> list[str] | None:
    try:
        ep = await registry.get(ENDPOINTS, NS, name)
    except Exception:
        return None
    return sorted(a["ip"] for s in ep.get("subsets") or [] for a in s.get("addresses") or [])


async def slices_of(registry: Registry, name: str = "web") -> list[Obj]:
    items, _ = await registry.list(ENDPOINT_SLICE, NS)
    return [s for s in items if s["metadata"]["labels"].get(SERVICE_NAME_LABEL) == name]


async def slice_ips(registry: Registry, ready: bool = True) -> list[str]:
    return sorted(
        e["addresses"][0]
        for s in await slices_of(registry)
        for e in s["endpoints"] or []
        if e["conditions"]["ready"] is ready
    )


async def test_endpoints_follow_pods_readiness_and_deletion(
    registry: Registry, controller: EndpointsController
) -> None:
    await registry.create(SERVICE, service(), NS)
    await registry.create(POD, pod("a", "10.1.0.5"), NS)
    await registry.create(POD, pod("b", "10.1.0.6", ready=False), NS)
    await eventually(lambda: _equals(ready_ips(registry), ["10.1.0.5"]))
    await eventually(lambda: _equals(slice_ips(registry), ["10.1.0.5"]))
    assert await slice_ips(registry, ready=False) == ["10.1.0.6"]

    b = await registry.get(POD, NS, "b")
    b["status"]["conditions"][0]["status"] = "True"
    await registry.update(POD, b, NS, "b", "status")
    await eventually(lambda: _equals(ready_ips(registry), ["10.1.0.5", "10.1.0.6"]))
    await eventually(lambda: _equals(slice_ips(registry), ["10.1.0.5", "10.1.0.6"]))

    await registry.delete(POD, NS, "a")
    await eventually(lambda: _equals(ready_ips(registry), ["10.1.0.6"]))
    await eventually(lambda: _equals(slice_ips(registry), ["10.1.0.6"]))

    await registry.delete(SERVICE, NS, "web")
    await eventually(lambda: _equals(ready_ips(registry), None))
    await eventually(lambda: _equals(slices_of(registry), []))


async def test_nothing_is_written_when_nothing_differs(
    registry: Registry, controller: EndpointsController
) -> None:
    await registry.create(SERVICE, service(), NS)
    await registry.create(POD, pod("a", "10.1.0.5"), NS)
    await eventually(lambda: _equals(ready_ips(registry), ["10.1.0.5"]))
    await controller.queue.wait_idle()
    before = await _versions(registry)
    a = await registry.get(POD, NS, "a")
    a["metadata"]["annotations"] = {"note": "unrelated"}
    version = (await registry.update(POD, a, NS, "a"))["metadata"]["resourceVersion"]
    await eventually(lambda: _cached_version(controller, f"{NS}/a") == version)
    controller.queue.add(f"{NS}/web")
    await controller.queue.wait_idle()
    assert await _versions(registry) == before


async def test_edited_or_deleted_slices_and_endpoints_are_repaired(
    registry: Registry, controller: EndpointsController
) -> None:
    await registry.create(SERVICE, service(), NS)
    await registry.create(POD, pod("a", "10.1.0.5"), NS)
    await eventually(lambda: _equals(slice_ips(registry), ["10.1.0.5"]))
    (one,) = await slices_of(registry)
    one["endpoints"] = []
    await registry.update(ENDPOINT_SLICE, one, NS, one["metadata"]["name"])
    await eventually(lambda: _equals(slice_ips(registry), ["10.1.0.5"]))
    await registry.delete(ENDPOINT_SLICE, NS, one["metadata"]["name"])
    await eventually(lambda: _equals(slice_ips(registry), ["10.1.0.5"]))
    await registry.delete(ENDPOINTS, NS, "web")
    await eventually(lambda: _equals(ready_ips(registry), ["10.1.0.5"]))


async def test_selectorless_endpoints_are_left_alone_but_mirrored_external_names_get_none(
    registry: Registry, controller: EndpointsController
) -> None:
    manual = {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": "db"},
        "subsets": [{"addresses": [{"ip": "192.0.2.10"}], "ports": [{"port": 5432}]}],
    }
    await registry.create(SERVICE, service("db", selector=None), NS)
    stored = await registry.create(ENDPOINTS, manual, NS)
    await registry.create(SERVICE, service("ext", type="ExternalName", externalName="a.b"), NS)
    await registry.create(POD, pod("a", "10.1.0.5"), NS)
    await registry.create(SERVICE, service(), NS)
    await eventually(lambda: _equals(ready_ips(registry), ["10.1.0.5"]))
    await controller.queue.wait_idle()
    kept = await registry.get(ENDPOINTS, NS, "db")
    assert kept["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
    assert await slices_of(registry, "ext") == []
    (mirrored,) = await slices_of(registry, "db")
    assert mirrored["metadata"]["labels"][MANAGED_BY_LABEL] == MIRROR_CONTROLLER
    assert [e["addresses"] for e in mirrored["endpoints"]] == [["192.0.2.10"]]
    assert mirrored["ports"] == [{"name": "", "port": 5432, "protocol": "TCP"}]
    kept["subsets"][0]["addresses"].append({"ip": "192.0.2.11"})
    await registry.update(ENDPOINTS, kept, NS, "db")
    await eventually(lambda: _mirrored_count(registry, 2))
    await registry.delete(ENDPOINTS, NS, "db")
    await eventually(lambda: _equals(slices_of(registry, "db"), []))
    assert await ready_ips(registry, "ext") is None


async def _mirrored_count(registry: Registry, count: int) -> bool:
    return sum(len(s["endpoints"]) for s in await slices_of(registry, "db")) == count


def _cached_version(controller: EndpointsController, key: str) -> str | None:
    pod = controller.pods.get(key)
    return None if pod is None else str(pod["metadata"]["resourceVersion"])


async def _equals(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def _versions(registry: Registry) -> dict[str, str]:
    out = {}
    for kind in (ENDPOINTS, ENDPOINT_SLICE):
        items, _ = await registry.list(kind, NS)
        out |= {
            f"{kind.plural}/{o['metadata']['name']}": o["metadata"]["resourceVersion"]
            for o in items
        }
    return out


async def test_a_stale_cache_falls_back_to_read_modify_write(
    registry: Registry,
    api: InProcessApi,
    controller: EndpointsController,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An update pinned to the cached version that conflicts (the cache was behind) is
    redone at once as a fresh read-modify-write, not failed and retried later."""
    await registry.create(SERVICE, service(), NS)
    await registry.create(POD, pod("a", "10.1.0.5"), NS)
    await eventually(lambda: _equals(ready_ips(registry), ["10.1.0.5"]))
    real_update = api.update
    refused: list[str] = []

    async def stale_once(kind: Any, obj: Obj) -> Obj:
        if not refused:
            refused.append(obj["metadata"]["name"])
            raise error_from_status("the object has been modified", 409, "Conflict")
        return await real_update(kind, obj)

    monkeypatch.setattr(api, "update", stale_once)
    await registry.create(POD, pod("b", "10.1.0.6"), NS)
    await eventually(lambda: _equals(ready_ips(registry), ["10.1.0.5", "10.1.0.6"]))
    await eventually(lambda: _equals(slice_ips(registry), ["10.1.0.5", "10.1.0.6"]))
    assert refused
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]


async def test_a_restarted_controller_repairs_what_changed_while_it_was_down(
    registry: Registry, api: InProcessApi, controller: EndpointsController
) -> None:
    """Drift and a deleted Service that no watch event reported: the new leader's first
    listings find them (as the periodic resync does)."""
    await registry.create(SERVICE, service(), NS)
    await registry.create(SERVICE, service("old"), NS)
    await registry.create(POD, pod("a", "10.1.0.5"), NS)
    await eventually(lambda: _equals(slice_ips(registry), ["10.1.0.5"]))
    await eventually(lambda: _equals(ready_ips(registry, "old"), ["10.1.0.5"]))
    await controller.stop()

    (one,) = await slices_of(registry)
    one["endpoints"] = [{"addresses": ["10.1.0.99"], "conditions": {"ready": True}}]
    await registry.update(ENDPOINT_SLICE, one, NS, one["metadata"]["name"])
    await registry.delete(SERVICE, NS, "old")
    await registry.create(POD, pod("b", "10.1.0.6"), NS)

    successor = EndpointsController(api, resync_period=None)
    await successor.start()  # returns once its first listings are handled
    try:
        assert await slice_ips(registry) == ["10.1.0.5", "10.1.0.6"]
        assert await ready_ips(registry) == ["10.1.0.5", "10.1.0.6"]
        assert await ready_ips(registry, "old") is None
        assert await slices_of(registry, "old") == []
    finally:
        await successor.stop()


async def test_each_resync_lists_the_controllers_own_kinds_again_but_not_every_pod(
    registry: Registry, api: InProcessApi
) -> None:
    """A resync lists Services, Endpoints and slices again (their drift is repaired), but
    not the pods, of which there may be 150,000: their stream is whole."""
    listed: list[str] = []

    class Counting(InProcessApi):
        async def list(self, kind: Any, namespace: str | None = None) -> Any:
            listed.append(kind.plural)
            return await super().list(kind, namespace)

    counting = Counting(api.registry, api.cache)
    running = EndpointsController(counting, resync_period=0.05)
    await running.start()
    try:
        await eventually(lambda: listed.count("services") >= 3, what="two resyncs")
    finally:
        await running.stop()
    assert listed.count("pods") == 1
    assert listed.count("endpoints") >= 2 and listed.count("endpointslices") >= 2
