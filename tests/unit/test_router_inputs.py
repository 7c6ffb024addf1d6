"""The router's view of the cluster (``podnet.router.inputs``): what each watch event
changes, slices gathered by Service, and snapshots."""

from __future__ import annotations

import copy
from typing import Any

from podnet.client import ADDED, DELETED, LISTED, MODIFIED, WatchEvent
from podnet.router.desired import EndpointPort
from podnet.router.inputs import NOTHING, SPEC, STATUS, RouterInputs
from podnet.testing.dns import endpoint_slice, service

Obj = dict[str, Any]
NS = "shop"


def route(name: str = "web", host: str = "www.example.com") -> Obj:
    return {
        "metadata": {"namespace": NS, "name": name, "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {"host": host, "to": {"kind": "Service", "name": "web"}},
    }


def event(kind: Any, obj: Obj) -> WatchEvent:
    return WatchEvent(kind, obj)


def test_route_spec_change_is_spec_status_change_is_status_version_only_is_nothing() -> None:
    inputs = RouterInputs()
    assert inputs.take("routes", WatchEvent(LISTED, items=(route(),))) == SPEC
    bumped = copy.deepcopy(route())
    bumped["metadata"]["resourceVersion"] = "2"
    assert inputs.take("routes", event(MODIFIED, bumped)) == NOTHING
    with_status = copy.deepcopy(bumped)
    with_status["status"] = {"ingress": [{"routerName": "default"}]}
    assert inputs.take("routes", event(MODIFIED, with_status)) == STATUS
    moved = copy.deepcopy(with_status)
    moved["spec"]["host"] = "shop.example.com"
    assert inputs.take("routes", event(MODIFIED, moved)) == SPEC
    annotated = copy.deepcopy(moved)
    annotated["metadata"]["annotations"] = {"a": "b"}
    assert inputs.take("routes", event(MODIFIED, annotated)) == SPEC
    assert inputs.routes[(NS, "web")] is annotated
    assert inputs.take("routes", event(DELETED, annotated)) == SPEC
    assert inputs.take("routes", event(DELETED, annotated)) == NOTHING
    assert inputs.routes == {}


def test_services_kept_by_key_and_only_spec_changes_count() -> None:
    inputs = RouterInputs()
    inputs.take("services", WatchEvent(LISTED, items=(service(NS, "web"),)))
    assert set(inputs.services) == {(NS, "web")}
    relabelled = copy.deepcopy(service(NS, "web"))
    relabelled["metadata"]["labels"] = {"x": "y"}
    assert inputs.take("services", event(MODIFIED, relabelled)) == NOTHING
    assert inputs.take("services", event(ADDED, service(NS, "db", "172.30.0.11"))) == SPEC
    assert inputs.take("services", event(DELETED, service(NS, "db"))) == SPEC
    assert inputs.take("services", event(DELETED, service(NS, "db"))) == NOTHING


def test_slices_of_one_service_are_merged_and_follow_readiness() -> None:
    inputs = RouterInputs()
    a = endpoint_slice(NS, "web-a", "web", [("10.0.0.1", None, True)])
    b = endpoint_slice(NS, "web-b", "web", [("10.0.0.2", None, True), ("10.0.0.1", None, True)])
    inputs.take("endpointslices", WatchEvent(LISTED, items=(a,)))
    assert inputs.take("endpointslices", event(ADDED, b)) == SPEC
    assert inputs.endpoints[(NS, "web")] == (
        EndpointPort("10.0.0.1", 8080, "http"),
        EndpointPort("10.0.0.2", 8080, "http"),
    )
    same = copy.deepcopy(b)
    same["metadata"]["resourceVersion"] = "7"
    assert inputs.take("endpointslices", event(MODIFIED, same)) == NOTHING
    not_ready = endpoint_slice(NS, "web-b", "web", [("10.0.0.2", None, False)])
    assert inputs.take("endpointslices", event(MODIFIED, not_ready)) == SPEC
    assert inputs.endpoints[(NS, "web")] == (EndpointPort("10.0.0.1", 8080, "http"),)
    assert inputs.take("endpointslices", event(DELETED, a)) == SPEC
    assert (NS, "web") not in inputs.endpoints
    assert inputs.take("endpointslices", event(DELETED, not_ready)) == SPEC
    assert inputs.slices == {} and inputs.endpoints == {}


def test_a_slice_moved_to_another_service_leaves_the_first() -> None:
    inputs = RouterInputs()
    inputs.take(
        "endpointslices", event(ADDED, endpoint_slice(NS, "s", "web", [("10.0.0.1", None, True)]))
    )
    moved = endpoint_slice(NS, "s", "canary", [("10.0.0.1", None, True)])
    assert inputs.take("endpointslices", event(MODIFIED, moved)) == SPEC
    assert set(inputs.endpoints) == {(NS, "canary")}
    unlabelled = copy.deepcopy(moved)
    unlabelled["metadata"]["labels"] = {}
    assert inputs.take("endpointslices", event(MODIFIED, unlabelled)) == SPEC
    assert inputs.endpoints == {}
    assert inputs.take("endpointslices", event(MODIFIED, unlabelled)) == NOTHING


def test_relist_replaces_and_snapshot_is_a_copy() -> None:
    inputs = RouterInputs()
    inputs.take("routes", WatchEvent(LISTED, items=(route("a"), route("b"))))
    inputs.take(
        "endpointslices", event(ADDED, endpoint_slice(NS, "s", "web", [("10.0.0.1", None, True)]))
    )
    snapshot = inputs.snapshot()
    inputs.take("routes", WatchEvent(LISTED, items=(route("c"),)))
    inputs.take("endpointslices", WatchEvent(LISTED, items=()))
    assert [r["metadata"]["name"] for r in snapshot.routes] == ["a", "b"]
    assert set(snapshot.endpoints) == {(NS, "web")}
    assert set(inputs.routes) == {(NS, "c")} and inputs.endpoints == {}
