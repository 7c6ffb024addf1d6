"""``podnet.router.routestatus``: this router's status.ingress entry is written only when
it differs, through routes/status with the read's resourceVersion, again after a
conflict (on the fresh object, keeping other routers' entries), never for a route gone."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from podnet.client.errors import Conflict, NotFound
from podnet.model.kinds import Kind
from podnet.router.admission import ADMITTED, Verdict
from podnet.router.routestatus import RouteStatusWriter

Obj = dict[str, Any]
KEY = ("shop", "web")
NOW = "2026-11-26T05:00:00Z"


def route(version: int, ingress: list[Obj] | None = None) -> Obj:
    meta = {"namespace": "shop", "name": "web", "resourceVersion": str(version)}
    return {
        "metadata": meta,
        "spec": {"host": "www.example.com"},
        "status": {"ingress": ingress or []},
    }


@dataclass
class FakeApi:
    """Routes by key; ``conflicts`` status writes are refused as a concurrent writer
    would make them (the stored object changes under the writer: another router's entry)."""

    stored: dict[tuple[str, str], Obj] = field(default_factory=dict)
    conflicts: int = 0
    puts: list[Obj] = field(default_factory=list)

    async def get(self, kind: Kind, namespace: str | None, name: str) -> Obj:
        if (namespace or "", name) not in self.stored:
            raise NotFound("not found", 404, "NotFound")
        return copy.deepcopy(self.stored[(namespace or "", name)])

    async def update_status(self, kind: Kind, obj: Obj) -> Obj:
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        if key not in self.stored:
            raise NotFound("not found", 404, "NotFound")
        self.puts.append(copy.deepcopy(obj))
        current = self.stored[key]
        if self.conflicts:
            self.conflicts -= 1
            other = {"routerName": "sharded", "host": "www.example.com", "conditions": []}
            current["status"]["ingress"].append(other)
            current["metadata"]["resourceVersion"] = str(
                int(current["metadata"]["resourceVersion"]) + 1
            )
        if obj["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"]:
            raise Conflict("changed", 409, "Conflict")
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        self.stored[key] = copy.deepcopy(obj)
        return obj


async def written(api: FakeApi, verdict: Verdict, conflicts: int = 0) -> RouteStatusWriter:
    api.conflicts = conflicts
    writer = RouteStatusWriter(api, "default", now=lambda: NOW)  # type: ignore[arg-type]
    writer.start()
    try:
        writer.sync(copy.deepcopy(api.stored), {KEY: verdict})  # as the watch showed them
        await writer.wait_idle()
    finally:
        await writer.stop()
    return writer


async def test_written_once_then_nothing_while_the_status_says_it() -> None:
    api = FakeApi({KEY: route(1)})
    writer = await written(api, ADMITTED)
    assert writer.writes == 1 and len(api.puts) == 1
    entry = api.stored[KEY]["status"]["ingress"][0]
    assert entry["routerName"] == "default" and entry["host"] == "www.example.com"
    assert entry["conditions"] == [
        {"type": "Admitted", "status": "True", "lastTransitionTime": NOW}
    ]
    again = await written(api, ADMITTED)
    assert again.writes == 0 and len(api.puts) == 1  # nothing queued: the status says it


async def test_a_conflict_is_retried_on_the_fresh_object_keeping_other_routers() -> None:
    api = FakeApi({KEY: route(1)})
    refused = Verdict(False, "HostAlreadyClaimed", "route first already exposes www.example.com")
    writer = await written(api, refused, conflicts=2)
    assert writer.writes == 1 and len(api.puts) == 3
    ingress = api.stored[KEY]["status"]["ingress"]
    assert sorted(e["routerName"] for e in ingress) == ["default", "sharded", "sharded"]
    mine = next(e for e in ingress if e["routerName"] == "default")
    assert mine["conditions"][0]["reason"] == "HostAlreadyClaimed"


async def test_a_route_deleted_before_its_write_is_skipped() -> None:
    api = FakeApi({KEY: route(1)})
    writer = RouteStatusWriter(api, "default", now=lambda: NOW)  # type: ignore[arg-type]
    writer.sync({KEY: route(1)}, {KEY: ADMITTED})  # queued, not started
    del api.stored[KEY]
    writer.start()
    try:
        await writer.wait_idle()
    finally:
        await writer.stop()
    assert writer.writes == 0 and api.puts == []


async def test_sync_looks_only_at_routes_whose_object_or_verdict_changed() -> None:
    api = FakeApi()
    writer = RouteStatusWriter(api, "default", now=lambda: NOW)  # type: ignore[arg-type]
    stale = route(1)
    routes = {KEY: stale}
    writer.sync(routes, {KEY: ADMITTED})
    assert writer.queue._queued == {"shop/web"}
    writer.queue._queued.clear()
    writer.sync(routes, {KEY: ADMITTED})  # same object, same verdict: not looked at
    assert writer.queue._queued == set()
    writer.sync(routes, {KEY: Verdict(False, "HostAlreadyClaimed", "x")})
    assert writer.queue._queued == {"shop/web"}
