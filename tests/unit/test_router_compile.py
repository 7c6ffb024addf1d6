"""``podnet.router.compile``: a pass reuses the last pass's verdicts and route backends
for what did not change, and always equals a computation from scratch."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from podnet.client import ADDED, DELETED, LISTED, MODIFIED, WatchEvent
from podnet.router.compile import Desired, RouterCompiler, final_verdicts
from podnet.router.inputs import RouterInputs
from podnet.testing.dns import endpoint_slice, service

Obj = dict[str, Any]
NS = "shop"


def route(name: str, host: str, to: str = "web", created: str = "2026-01-01T00:00:00Z") -> Obj:
    meta = {"namespace": NS, "name": name, "uid": f"uid-{name}", "creationTimestamp": created}
    return {"metadata": meta, "spec": {"host": host, "to": {"kind": "Service", "name": to}}}


def inputs_with(routes: list[Obj]) -> RouterInputs:
    inputs = RouterInputs()
    inputs.take("routes", WatchEvent(LISTED, items=tuple(routes)))
    inputs.take("services", WatchEvent(LISTED, items=(service(NS, "web"), service(NS, "db"))))
    slices = (
        endpoint_slice(NS, "web-1", "web", [("10.0.0.1", None, True)]),
        endpoint_slice(NS, "db-1", "db", [("10.0.1.1", None, True)]),
    )
    inputs.take("endpointslices", WatchEvent(LISTED, items=slices))
    return inputs


def backend_of(desired: Desired, name: str) -> Any:
    return desired.table.route(NS, name)


def test_an_unchanged_pass_reuses_everything_and_a_change_recomputes_only_its_routes() -> None:
    inputs = inputs_with([route("a", "a.example.com"), route("b", "b.example.com", "db")])
    compiler = RouterCompiler()
    first = compiler.compute(inputs.snapshot())
    again = compiler.compute(inputs.snapshot())
    assert again == first and again.verdicts is first.verdicts
    assert backend_of(again, "a") is backend_of(first, "a")

    # web's endpoints change: a is computed again, b (on db) is reused
    scaled = endpoint_slice(
        NS, "web-1", "web", [("10.0.0.1", None, True), ("10.0.0.2", None, True)]
    )
    inputs.take("endpointslices", WatchEvent(MODIFIED, scaled))
    after = compiler.compute(inputs.snapshot())
    assert after.verdicts is first.verdicts  # no route changed: admission not run again
    assert len(backend_of(after, "a").servers) == 2
    assert backend_of(after, "b") is backend_of(first, "b")

    # web goes away: a keeps its place, without servers
    inputs.take("services", WatchEvent(DELETED, service(NS, "web")))
    gone = compiler.compute(inputs.snapshot())
    assert backend_of(gone, "a").servers == ()
    assert gone == RouterCompiler().compute(inputs.snapshot())


def test_a_route_change_is_admitted_again() -> None:
    older = route("old", "www.example.com", created="2026-01-01T00:00:00Z")
    younger = route("new", "other.example.com", created="2026-01-02T00:00:00Z")
    inputs = inputs_with([older, younger])
    compiler = RouterCompiler()
    assert all(v.admitted for v in compiler.compute(inputs.snapshot()).verdicts.values())
    clash = copy.deepcopy(younger)
    clash["spec"]["host"] = "www.example.com"
    inputs.take("routes", WatchEvent(MODIFIED, clash))
    desired = compiler.compute(inputs.snapshot())
    assert desired.verdicts[(NS, "new")].reason == "HostAlreadyClaimed"
    assert backend_of(desired, "new") is None and backend_of(desired, "old") is not None


def test_routes_haproxy_refused_are_marked_not_admitted() -> None:
    inputs = inputs_with([route("a", "a.example.com"), route("b", "b.example.com")])
    desired = RouterCompiler().compute(inputs.snapshot())
    cut = desired.without(frozenset({"shop:b"}))
    assert [r.name for r in cut.table.routes] == ["a"] and cut.verdicts is desired.verdicts
    verdicts = final_verdicts(desired, frozenset({"shop:b"}), "unable to load certs/shop:b.pem")
    assert verdicts[(NS, "a")].admitted
    assert verdicts[(NS, "b")].reason == "ExtendedValidationFailed"
    assert "unable to load certs/shop:b.pem" in verdicts[(NS, "b")].message


HOSTS = ["a.example.com", "b.example.com"]
change = st.one_of(
    st.tuples(
        st.just("route"),
        st.sampled_from("xyz"),
        st.sampled_from(HOSTS),
        st.sampled_from(["web", "db"]),
    ),
    st.tuples(st.just("delete-route"), st.sampled_from("xyz"), st.just(""), st.just("")),
    st.tuples(
        st.just("slice"),
        st.sampled_from(["web", "db"]),
        st.sampled_from(["1", "2", "3"]),
        st.just(""),
    ),
    st.tuples(
        st.just("service"), st.sampled_from(["web", "db"]), st.booleans().map(str), st.just("")
    ),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(change, max_size=12))
def test_passes_equal_a_computation_from_scratch(changes: list[tuple[str, str, str, str]]) -> None:
    inputs = inputs_with([route("x", "a.example.com")])
    compiler = RouterCompiler()
    for kind, name, value, extra in changes:
        if kind == "route":
            inputs.take("routes", WatchEvent(ADDED, route(name, value, extra)))
        elif kind == "delete-route":
            inputs.take("routes", WatchEvent(DELETED, route(name, "")))
        elif kind == "slice":
            ips = [(f"10.9.0.{i}", None, True) for i in range(int(value))]
            inputs.take(
                "endpointslices", WatchEvent(MODIFIED, endpoint_slice(NS, f"{name}-1", name, ips))
            )
        else:
            inputs.take(
                "services", WatchEvent(ADDED if value == "True" else DELETED, service(NS, name))
            )
        assert compiler.compute(inputs.snapshot()) == RouterCompiler().compute(inputs.snapshot())


def test_a_route_haproxy_refused_claims_no_host_until_it_changes() -> None:
    older = route("old", "www.example.com", created="2026-01-01T00:00:00Z")
    younger = route("new", "www.example.com", created="2026-01-02T00:00:00Z")
    inputs = inputs_with([older, younger])
    compiler = RouterCompiler()
    first = compiler.compute(inputs.snapshot())
    assert first.verdicts[(NS, "new")].reason == "HostAlreadyClaimed"
    compiler.refuse(frozenset({"shop:old"}), "unable to load certs/shop:old.pem")
    after = compiler.compute(inputs.snapshot())
    assert after.verdicts[(NS, "old")].reason == "ExtendedValidationFailed"
    assert "certs/shop:old.pem" in after.verdicts[(NS, "old")].message
    assert after.verdicts[(NS, "new")].admitted
    assert [r.name for r in after.table.routes] == ["new"]
    # its status written (a new object, the same spec): still refused, not tried again
    marked = {**older, "status": {"ingress": [{"routerName": "default", "conditions": []}]}}
    inputs.take("routes", WatchEvent(MODIFIED, marked))
    assert compiler.compute(inputs.snapshot()).verdicts[(NS, "old")].reason == (
        "ExtendedValidationFailed"
    )
    # the refused route changes (a new certificate, say): tried again, and it is older
    fixed = copy.deepcopy(marked)
    fixed["metadata"]["annotations"] = {"certificate": "replaced"}
    inputs.take("routes", WatchEvent(MODIFIED, fixed))
    again = compiler.compute(inputs.snapshot())
    assert again.verdicts[(NS, "old")].admitted
    assert again.verdicts[(NS, "new")].reason == "HostAlreadyClaimed"
    # deleted, it is forgotten too
    compiler.refuse(frozenset({"shop:old"}), "refused again")
    inputs.take("routes", WatchEvent(DELETED, fixed))
    assert compiler.compute(inputs.snapshot()).verdicts[(NS, "new")].admitted
    assert compiler._refused == {}
