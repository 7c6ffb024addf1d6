"""The router's controller (``podnet.router.controller``) over the master's in-process
API (real validation, in-memory store) with a fake HAProxy driver: tables follow the
Routes, Services and slices; status.ingress is written once per verdict; a route HAProxy
refuses is left out and marked, the others are served."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from podnet.api.registry import Registry
from podnet.client.informers import Informers
from podnet.controllers.inprocess import InProcessApi
from podnet.controllers.workqueue import cancel_all
from podnet.model.kinds import ENDPOINT_SLICE, NAMESPACE, ROUTE, SERVICE
from podnet.router.admission import age
from podnet.router.controller import RouterController
from podnet.router.haproxy import ConfigRejected, DriverCounters
from podnet.router.metrics import ReloadFigures, RouterMetrics
from podnet.router.routestatus import RouteStatusWriter
from podnet.router.status import admitted_condition, router_entry
from podnet.router.table import RouteBackend, RouterTable, Server
from podnet.testing.dns import endpoint_slice
from podnet.testing.e2e import eventually

Obj = dict[str, Any]
NS = "shop"


@dataclass
class FakeDriver:
    """``HAProxyRouter``'s update/settle protocol: serves what it is given, except tables
    holding a route it is told to refuse (counted as HAProxy counts a refusal)."""

    refuse: set[str] = field(default_factory=set)  # route keys "ns:name"
    served: RouterTable | None = None
    counters: DriverCounters = field(default_factory=DriverCounters)
    fail_next: str = ""  # a transient failure of the next update
    starts: int = 0
    checks: int = 0
    history: list[RouterTable] = field(default_factory=list)  # every table served, in order
    started_with: RouterTable | None = None  # the table of the successful start

    @property
    def live_table(self) -> RouterTable | None:
        return self.served

    def update(self, table: RouterTable) -> int:
        bad = sorted(r.key for r in table.routes if r.key in self.refuse)
        number = self.counters.applied + 1
        if bad:
            error = f"unable to load certs/{bad[0]}.pem"
            self.counters = replace(
                self.counters, rejected=self.counters.rejected + 1, last_error=error
            )
        elif self.fail_next:
            self.counters, self.fail_next = replace(self.counters, last_error=self.fail_next), ""
        else:
            self.served = table
            self.history.append(table)
        self.counters = replace(self.counters, applied=number)
        return number

    async def settled(self, update: int | None = None) -> DriverCounters:
        return self.counters

    async def check(self, table: RouterTable) -> None:
        self.checks += 1
        bad = sorted(r.key for r in table.routes if r.key in self.refuse)
        if bad:
            raise ConfigRejected(f"unable to load certs/{bad[0]}.pem")

    async def start(self, table: RouterTable) -> None:
        self.starts += 1
        refused = self.counters.rejected
        self.update(table)
        if self.counters.rejected > refused:
            raise ConfigRejected(self.counters.last_error)
        if self.served is not table:
            raise OSError("haproxy: cannot bind socket")
        self.started_with = table

    def route(self, name: str) -> RouteBackend | None:
        return self.served.route(NS, name) if self.served is not None else None

    def servers(self, name: str) -> tuple[Server, ...] | None:
        backend = self.route(name)
        return backend.servers if backend is not None else None


@dataclass
class Running:
    controller: RouterController
    driver: FakeDriver
    statuses: RouteStatusWriter
    registry: Registry


async def no_stats() -> dict[tuple[str, str], Any]:
    return {}


@contextlib.asynccontextmanager
async def started(
    registry: Registry, api: InProcessApi, driver: FakeDriver
) -> AsyncIterator[Running]:
    """The controller and its status writer running against ``api`` and ``driver``."""
    statuses = RouteStatusWriter(api, "default")
    metrics = RouterMetrics(no_stats, ReloadFigures)
    informers = Informers(api)
    controller = RouterController(informers, driver, statuses, metrics, "default")
    statuses.start()
    tasks = [asyncio.create_task(run(), name=name) for name, run in controller.tasks()]
    try:
        yield Running(controller, driver, statuses, registry)
    finally:
        await cancel_all(tasks)
        await statuses.stop()
        await informers.close()


@pytest.fixture
async def running(registry: Registry, api: InProcessApi) -> AsyncIterator[Running]:
    await registry.create(NAMESPACE, {"metadata": {"name": NS}})
    async with started(registry, api, FakeDriver()) as made:
        yield made


def service(name: str = "web") -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {
            "selector": {"app": name},
            "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
        },
    }


def route(name: str, host: str = "www.example.com", path: str = "", **spec: Any) -> Obj:
    body: Obj = {"host": host, "to": {"kind": "Service", "name": "web"}, **spec}
    if path:
        body["path"] = path
    return {"metadata": {"name": name}, "spec": body}


async def slice_of(
    registry: Registry, name: str, ips: list[str], service_name: str = "web"
) -> None:
    obj = endpoint_slice(NS, name, service_name, [(ip, None, True) for ip in ips])
    del obj["metadata"]["resourceVersion"]
    try:
        current = await registry.get(ENDPOINT_SLICE, NS, name)
    except Exception:
        await registry.create(ENDPOINT_SLICE, obj, NS)
        return
    obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    await registry.update(ENDPOINT_SLICE, obj, NS, name)


async def condition(registry: Registry, name: str) -> Mapping[str, Any] | None:
    stored = await registry.get(ROUTE, NS, name)
    return admitted_condition(router_entry(stored, "default"))


async def test_route_is_served_with_its_endpoints_and_follows_them(running: Running) -> None:
    registry, driver = running.registry, running.driver
    await registry.create(SERVICE, service(), NS)
    await slice_of(registry, "web-1", ["10.128.0.5"])
    await registry.create(ROUTE, route("web", host="www.example.com"), NS)
    backend = await eventually(lambda: driver.route("web"), what="route served")
    assert backend.host == "www.example.com"
    servers = await eventually(lambda: driver.servers("web"), what="servers")
    assert [(s.ip, s.port) for s in servers] == [("10.128.0.5", 8080)]

    await slice_of(registry, "web-1", ["10.128.0.5", "10.128.1.9"])
    await eventually(lambda: len(driver.servers("web") or ()) == 2, what="scale up")
    await registry.delete(ENDPOINT_SLICE, NS, "web-1")
    await eventually(lambda: driver.servers("web") == (), what="no servers")
    await registry.delete(ROUTE, NS, "web")
    await eventually(lambda: driver.served == RouterTable(), what="route removed")


async def test_missing_service_is_admitted_without_servers(running: Running) -> None:
    await slice_of(running.registry, "gone-1", ["10.128.0.5"], "gone")
    await running.registry.create(ROUTE, route("web", to={"kind": "Service", "name": "gone"}), NS)
    admitted = await eventually(lambda: condition(running.registry, "web"), what="status")
    assert admitted["status"] == "True"
    assert running.driver.servers("web") == ()


async def test_conflicting_route_is_not_admitted_and_the_older_keeps_serving(
    running: Running,
) -> None:
    registry, driver = running.registry, running.driver
    first = await registry.create(ROUTE, route("first"), NS)
    second = await registry.create(ROUTE, route("second"), NS)
    other_path = await registry.create(ROUTE, route("api", path="/api"), NS)
    older, younger = sorted([first, second], key=age)
    older_name, younger_name = older["metadata"]["name"], younger["metadata"]["name"]
    refused = await eventually(lambda: condition(registry, younger_name), what="refusal")
    assert refused["status"] == "False" and refused["reason"] == "HostAlreadyClaimed"
    assert older_name in refused["message"]
    assert (await eventually(lambda: condition(registry, older_name)))["status"] == "True"
    assert (await eventually(lambda: condition(registry, "api")))["status"] == "True"
    assert driver.served is not None
    assert {r.name for r in driver.served.routes} == {older_name, other_path["metadata"]["name"]}

    # the older one goes: the younger takes the host over
    await registry.delete(ROUTE, NS, older_name)

    async def taken_over() -> bool:
        found = await condition(registry, younger_name)
        return found is not None and found["status"] == "True"

    await eventually(taken_over, what="younger admitted")
    await eventually(lambda: driver.route(younger_name) is not None, what="younger served")


async def test_status_is_written_once_per_verdict_and_restored_after_a_foreign_change(
    running: Running,
) -> None:
    registry, statuses, controller = running.registry, running.statuses, running.controller
    await registry.create(ROUTE, route("web"), NS)
    first = await eventually(lambda: condition(registry, "web"), what="status")
    await statuses.wait_idle()
    assert statuses.writes == 1
    # passes with nothing new (a resync) write nothing
    for _ in range(3):
        controller.synced.clear()
        controller.loop.poke()
        await controller.synced.wait()
    await statuses.wait_idle()
    assert statuses.writes == 1
    assert await condition(registry, "web") == first

    # someone else empties the status: the router writes its entry again
    stored = await registry.get(ROUTE, NS, "web")
    await registry.update(
        ROUTE, {**stored, "status": {"ingress": []}}, NS, "web", subresource="status"
    )
    again = await eventually(lambda: condition(registry, "web"), what="status restored")
    assert again["status"] == "True"
    await statuses.wait_idle()
    assert statuses.writes == 2


async def test_route_haproxy_refuses_is_left_out_and_marked_others_serve(running: Running) -> None:
    registry, driver = running.registry, running.driver
    driver.refuse.add(f"{NS}:bad")
    await registry.create(ROUTE, route("good", host="good.example.com"), NS)
    await registry.create(ROUTE, route("bad", host="bad.example.com"), NS)
    refused = await eventually(lambda: condition(registry, "bad"), what="bad marked")
    assert refused["status"] == "False" and refused["reason"] == "ExtendedValidationFailed"
    assert "unable to load certs/shop:bad.pem" in refused["message"]
    assert (await eventually(lambda: condition(registry, "good")))["status"] == "True"
    assert driver.route("good") is not None and driver.route("bad") is None
    assert running.controller.metrics.render_errors._value.get() >= 1
    # the bisection's probes were only checked: once served, good never left HAProxy
    assert driver.checks >= 1
    first = next(i for i, t in enumerate(driver.history) if t.route(NS, "good") is not None)
    assert all(t.route(NS, "good") is not None for t in driver.history[first:])

    # fixed (a new table, which HAProxy takes): admitted and served
    driver.refuse.clear()
    stored = await registry.get(ROUTE, NS, "bad")
    stored["spec"]["path"] = "/fixed"
    await registry.update(ROUTE, stored, NS, "bad")

    async def admitted_again() -> bool:
        found = await condition(registry, "bad")
        return found is not None and found["status"] == "True"

    await eventually(admitted_again, what="bad admitted once fixed")
    assert driver.route("bad") is not None


async def test_a_table_haproxy_did_not_take_for_another_reason_is_tried_again(
    running: Running,
) -> None:
    running.driver.fail_next = "OSError: the master socket refused the connection"
    await running.registry.create(ROUTE, route("web"), NS)
    await eventually(lambda: running.driver.route("web"), what="served after a retry")
    metrics = running.controller.metrics
    assert metrics.reconcile.applies.labels("router", "failed")._value.get() == 1
    assert metrics.render_errors._value.get() == 0  # not a refusal: nothing left out
    assert running.controller.loop.left_out == frozenset()


async def test_haproxy_starts_once_with_the_first_whole_table(
    registry: Registry, api: InProcessApi
) -> None:
    """Routes that exist before the router are in HAProxy's first table (an adopted
    HAProxy is never reloaded with an empty one); a route HAProxy refuses at the start
    is left out of it like any other time."""
    await registry.create(NAMESPACE, {"metadata": {"name": NS}})
    await registry.create(ROUTE, route("good", host="good.example.com"), NS)
    await registry.create(ROUTE, route("bad", host="bad.example.com"), NS)
    driver = FakeDriver(refuse={f"{NS}:bad"})
    async with started(registry, api, driver) as running:
        refused = await eventually(lambda: condition(registry, "bad"), what="bad marked")
        assert refused["reason"] == "ExtendedValidationFailed"
        assert driver.served is not None and [r.name for r in driver.served.routes] == ["good"]
        assert running.controller.started
        starts = driver.starts
        await registry.create(ROUTE, route("late", host="late.example.com"), NS)
        await eventually(lambda: driver.route("late"), what="late route served")
    assert starts == driver.starts  # later tables are updates, not starts
    assert driver.started_with is not None
    assert [r.name for r in driver.started_with.routes] == ["good"]  # never an empty start


async def test_a_younger_route_takes_the_host_of_an_older_one_haproxy_refuses(
    running: Running,
) -> None:
    registry, driver = running.registry, running.driver
    driver.refuse.add(f"{NS}:old")
    await registry.create(ROUTE, route("old"), NS)
    await eventually(lambda: condition(registry, "old"), what="old marked")
    await registry.create(ROUTE, route("new"), NS)  # refused, old claims nothing

    async def new_admitted() -> bool:
        found = await condition(registry, "new")
        return found is not None and found["status"] == "True"

    await eventually(new_admitted, what="the younger route admitted")
    assert driver.route("new") is not None and driver.route("old") is None
    refused = await condition(registry, "old")
    assert refused is not None and refused["reason"] == "ExtendedValidationFailed"
