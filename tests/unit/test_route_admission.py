"""Route admission (podnet.router.admission) and the status.ingress entry
(podnet.router.status): examples, and hypothesis properties against a plain statement of
OpenShift's rule (the oldest route's namespace owns a host; there the oldest route wins
each host + path), whatever the order of the input."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from podnet.model.kinds import ROUTE
from podnet.model.validation import validate
from podnet.router.admission import (
    HOST_ALREADY_CLAIMED,
    NO_HOST_VALUE,
    Verdict,
    admit,
    admitted_routes,
    age,
    route_key,
)
from podnet.router.status import route_status, status_without_router

Obj = dict[str, Any]
T0, T1, T2 = "2024-01-01T00:00:00Z", "2024-01-01T00:00:01Z", "2024-01-01T00:00:02Z"


def route(
    ns: str,
    name: str,
    host: str,
    path: str = "",
    created: str = T0,
    uid: str = "",
    termination: str | None = None,
) -> Obj:
    spec: Obj = {"host": host, "to": {"kind": "Service", "name": "web", "weight": 100}}
    if path:
        spec["path"] = path
    if termination:
        spec["tls"] = {"termination": termination}
    meta = {"namespace": ns, "name": name, "creationTimestamp": created, "uid": uid or name}
    return {"metadata": meta, "spec": spec}


def verdicts(*routes: Obj) -> dict[str, Verdict]:
    return {f"{ns}/{name}": v for (ns, name), v in admit(routes).items()}


def test_the_oldest_route_wins_a_host_and_path() -> None:
    old = route("a", "old", "www.example.com", "/x", created=T0)
    young = route("a", "young", "www.example.com", "/x", created=T1)
    found = verdicts(young, old)
    assert found["a/old"] == Verdict(True)
    assert found["a/young"] == Verdict(
        False, HOST_ALREADY_CLAIMED, "route old already exposes www.example.com/x and is older"
    )


def test_the_uid_breaks_a_tie_in_creation_time() -> None:
    first = route("a", "zz", "h.example.com", created=T0, uid="0001")
    second = route("a", "aa", "h.example.com", created=T0, uid="0002")
    assert verdicts(second, first)["a/zz"].admitted
    assert not verdicts(second, first)["a/aa"].admitted


def test_same_host_other_path_is_fine_in_the_owner_namespace() -> None:
    found = verdicts(
        route("a", "root", "h.example.com", created=T0),
        route("a", "api", "h.example.com", "/api", created=T1),
        route("a", "web", "H.Example.com", "/web", created=T2),  # hosts compare lower-cased
    )
    assert all(v.admitted for v in found.values())


def test_the_oldest_routes_namespace_owns_the_host() -> None:
    found = verdicts(
        route("a", "root", "h.example.com", created=T1),
        route("b", "api", "h.example.com", "/api", created=T2),
        route("b", "other", "other.example.com", created=T0),
    )
    assert found["a/root"].admitted and found["b/other"].admitted
    assert found["b/api"].reason == HOST_ALREADY_CLAIMED
    assert "owned by namespace a" in found["b/api"].message


def test_a_refused_route_claims_nothing() -> None:
    """b's old route loses to a's older one; a younger route of a on the same path as
    b's refused one is still admitted."""
    found = verdicts(
        route("a", "first", "h.example.com", "/", created=T0),
        route("b", "second", "h.example.com", "/x", created=T1),
        route("a", "third", "h.example.com", "/x", created=T2),
    )
    assert [found[k].admitted for k in ("a/first", "b/second", "a/third")] == [True, False, True]


def test_passthrough_has_no_path_and_a_missing_host_is_refused() -> None:
    found = verdicts(
        route("a", "pt", "h.example.com", termination="passthrough", created=T0),
        route("a", "edge", "h.example.com", termination="edge", created=T1),
        route("a", "nohost", "", created=T0),
    )
    assert found["a/pt"].admitted and found["a/edge"].reason == HOST_ALREADY_CLAIMED
    assert found["a/nohost"] == Verdict(
        False, NO_HOST_VALUE, "no host value was defined for the route"
    )


# ---- properties ---------------------------------------------------------------------------

NAMESPACES = ("a", "b", "c")
HOSTS = ("one.example.com", "two.example.com", "")
PATHS = ("", "/x", "/y")
TIMES = (T0, T1, T2)


@st.composite
def route_sets(draw: st.DrawFn) -> list[Obj]:
    count = draw(st.integers(0, 12))
    routes = []
    for i in range(count):
        routes.append(
            route(
                draw(st.sampled_from(NAMESPACES)),
                f"r{i}",
                draw(st.sampled_from(HOSTS)),
                draw(st.sampled_from(PATHS)),
                draw(st.sampled_from(TIMES)),
                uid=draw(st.uuids()).hex,
                termination=draw(st.sampled_from([None, "edge", "passthrough"])),
            )
        )
    return routes


def expected_admitted(routes: list[Obj]) -> set[tuple[str, str]]:
    """OpenShift's rule, stated without the algorithm: a route is admitted when its
    namespace is that of the oldest route with its host, and it is the oldest route of
    that namespace with its host and path (passthrough routes have no path)."""
    out = set()
    for r in routes:
        host = r["spec"]["host"]
        if not host:
            continue
        same_host = [o for o in routes if o["spec"]["host"] == host]
        owner = min(same_host, key=age)["metadata"]["namespace"]
        key = (host, _path(r))
        rivals = [o for o in same_host if o["metadata"]["namespace"] == owner]
        rivals = [o for o in rivals if (o["spec"]["host"], _path(o)) == key]
        if r["metadata"]["namespace"] == owner and min(rivals, key=age) is r:
            out.add(route_key(r))
    return out


def _path(r: Obj) -> str:
    tls = r["spec"].get("tls") or {}
    return "" if tls.get("termination") == "passthrough" else r["spec"].get("path", "")


@settings(max_examples=300, deadline=None)
@given(route_sets(), st.randoms(use_true_random=False))
def test_admission_follows_the_rule_whatever_the_order(routes: list[Obj], rnd: Any) -> None:
    found = admit(routes)
    assert set(found) == {route_key(r) for r in routes}
    assert {k for k, v in found.items() if v.admitted} == expected_admitted(routes)
    shuffled = list(routes)
    rnd.shuffle(shuffled)
    assert admit(shuffled) == found
    for verdict in found.values():
        if not verdict.admitted:
            assert verdict.reason in (HOST_ALREADY_CLAIMED, NO_HOST_VALUE) and verdict.message
    kept = [route_key(r) for r in admitted_routes(shuffled)]
    assert kept == sorted(kept, key=lambda k: age(next(r for r in routes if route_key(r) == k)))


@settings(max_examples=200, deadline=None)
@given(route_sets())
def test_the_oldest_route_of_a_host_is_always_admitted(routes: list[Obj]) -> None:
    found = admit(routes)
    for host in {r["spec"]["host"] for r in routes if r["spec"]["host"]}:
        oldest = min((r for r in routes if r["spec"]["host"] == host), key=age)
        assert found[route_key(oldest)].admitted
        served = [r for r in routes if r["spec"]["host"] == host and found[route_key(r)].admitted]
        assert {r["metadata"]["namespace"] for r in served} == {oldest["metadata"]["namespace"]}
        keys = [_path(r) for r in served]
        assert len(keys) == len(set(keys))  # one route per host + path


# ---- status.ingress ------------------------------------------------------------------------


def stored(r: Obj, status: Obj | None = None) -> Obj:
    """``r`` as the API would store it with ``status`` (validated as a status update)."""
    obj = {"apiVersion": "route.openshift.io/v1", "kind": "Route", **r}
    obj = {**obj, "metadata": {"name": r["metadata"]["name"], "namespace": "a"}}
    if status is not None:
        obj["status"] = status
    return validate(ROUTE, obj, obj)


def test_an_admitted_routes_entry_is_storable_and_written_once() -> None:
    r = route("a", "web", "www.example.com")
    status = route_status(r, "default", Verdict(True), T0)
    assert status == {
        "ingress": [
            {
                "host": "www.example.com",
                "routerName": "default",
                "wildcardPolicy": "None",
                "conditions": [{"type": "Admitted", "status": "True", "lastTransitionTime": T0}],
            }
        ]
    }
    again = stored(r, status)
    assert again["status"] == status  # the schema keeps it as written
    assert route_status(again, "default", Verdict(True), T2) is None  # nothing to write


def test_last_transition_time_moves_only_when_the_status_does() -> None:
    r = route("a", "web", "www.example.com")
    refused = Verdict(False, HOST_ALREADY_CLAIMED, "route old already exposes it")
    first = stored(r, route_status(r, "default", refused, T0))
    condition = first["status"]["ingress"][0]["conditions"][0]
    assert condition == {
        "type": "Admitted",
        "status": "False",
        "reason": HOST_ALREADY_CLAIMED,
        "message": "route old already exposes it",
        "lastTransitionTime": T0,
    }
    reworded = Verdict(False, HOST_ALREADY_CLAIMED, "another message")
    second = route_status(first, "default", reworded, T1)
    assert second is not None
    assert second["ingress"][0]["conditions"][0]["lastTransitionTime"] == T0
    assert second["ingress"][0]["conditions"][0]["message"] == "another message"
    admitted = route_status(stored(r, second), "default", Verdict(True), T2)
    assert admitted is not None
    assert admitted["ingress"][0]["conditions"] == [
        {"type": "Admitted", "status": "True", "lastTransitionTime": T2}
    ]


def test_other_routers_entries_are_kept_in_place() -> None:
    r = route("a", "web", "www.example.com")
    theirs = {"host": "www.example.com", "routerName": "other", "wildcardPolicy": "None"}
    mine_old = {"host": "old.example.com", "routerName": "default"}
    last = {"routerName": "third"}
    with_others = stored(r, {"ingress": [theirs, mine_old, last]})
    status = route_status(with_others, "default", Verdict(True), T1)
    assert status is not None
    assert [e["routerName"] for e in status["ingress"]] == ["other", "default", "third"]
    assert status["ingress"][0] == theirs and status["ingress"][2] == last
    assert status["ingress"][1]["host"] == "www.example.com"
    new_router = route_status(stored(r, {"ingress": [theirs]}), "default", Verdict(True), T1)
    assert new_router is not None
    assert [e["routerName"] for e in new_router["ingress"]] == ["other", "default"]
    assert status_without_router(with_others, "default") == {"ingress": [theirs, last]}
    assert status_without_router(stored(r, {"ingress": [theirs]}), "default") is None
