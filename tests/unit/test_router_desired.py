"""The router's desired state (``podnet.router.desired``): Routes, Services and
EndpointSlices in, a ``RouterTable`` out, as OpenShift's router computes it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from podnet.router.desired import (
    EndpointPort,
    ServiceEndpoints,
    merge_endpoints,
    route_backend,
    router_table,
    scaled_weight,
    slice_endpoints,
)
from podnet.router.table import Server
from podnet.testing.dns import endpoint_slice, service

Obj = dict[str, Any]
NS = "shop"


def route(name: str = "web", host: str = "www.example.com", **spec: Any) -> Obj:
    body: Obj = {"host": host, "to": {"kind": "Service", "name": "web"}, **spec}
    return {"metadata": {"namespace": NS, "name": name}, "spec": body}


def eps(*ips: str, port: int = 8080, name: str = "http") -> ServiceEndpoints:
    return tuple(EndpointPort(ip, port, name) for ip in ips)


SERVICES = {(NS, n): service(NS, n) for n in ("web", "canary", "idle")}


def servers_of(r: Obj, endpoints: Mapping[tuple[str, str], ServiceEndpoints]) -> tuple[Server, ...]:
    backend = route_backend(r, SERVICES, endpoints)
    assert backend is not None
    return backend.servers


def test_plain_route_serves_every_ready_endpoint_with_equal_weight() -> None:
    servers = servers_of(route(), {(NS, "web"): eps("10.128.0.5", "10.128.1.7")})
    assert servers == (Server("10.128.0.5", 8080, 256), Server("10.128.1.7", 8080, 256))


def test_three_to_one_split_of_one_endpoint_each_comes_out_three_to_one() -> None:
    r = route(
        to={"kind": "Service", "name": "web", "weight": 3},
        alternateBackends=[{"kind": "Service", "name": "canary", "weight": 1}],
    )
    servers = servers_of(r, {(NS, "web"): eps("10.0.0.1"), (NS, "canary"): eps("10.0.0.2")})
    assert servers == (Server("10.0.0.1", 8080, 256), Server("10.0.0.2", 8080, 85))


def test_service_weight_is_shared_among_its_endpoints() -> None:
    # OpenShift's own example: A (20) over 2 endpoints, B (10) over 4: 256 and 64.
    r = route(
        to={"kind": "Service", "name": "web", "weight": 20},
        alternateBackends=[{"kind": "Service", "name": "canary", "weight": 10}],
    )
    endpoints = {
        (NS, "web"): eps("10.0.0.1", "10.0.0.2"),
        (NS, "canary"): eps("10.0.1.1", "10.0.1.2", "10.0.1.3", "10.0.1.4"),
    }
    weights = {s.ip: s.weight for s in servers_of(r, endpoints)}
    assert weights == {
        "10.0.0.1": 256,
        "10.0.0.2": 256,
        **{f"10.0.1.{i}": 64 for i in range(1, 5)},
    }


def test_weight_zero_keeps_the_servers_with_weight_zero() -> None:
    r = route(
        to={"kind": "Service", "name": "web", "weight": 1},
        alternateBackends=[{"kind": "Service", "name": "canary", "weight": 0}],
    )
    servers = servers_of(r, {(NS, "web"): eps("10.0.0.1"), (NS, "canary"): eps("10.0.0.2")})
    assert servers == (Server("10.0.0.1", 8080, 256), Server("10.0.0.2", 8080, 0))
    only_zero = route(to={"kind": "Service", "name": "web", "weight": 0})
    assert servers_of(only_zero, {(NS, "web"): eps("10.0.0.1")}) == (Server("10.0.0.1", 8080, 0),)


def test_a_tiny_share_is_never_rounded_to_zero() -> None:
    assert scaled_weight(1 / 1000, 256.0) == 1
    assert scaled_weight(0.0, 256.0) == 0


def test_missing_service_is_admitted_without_servers() -> None:
    r = route(to={"kind": "Service", "name": "gone"})
    backend = route_backend(r, SERVICES, {(NS, "gone"): eps("10.0.0.9")})
    assert backend is not None and backend.servers == ()
    # the service of another namespace with the same name does not count
    other = {("other", "web"): service("other", "web")}
    assert route_backend(route(), other, {("other", "web"): eps("10.0.0.1")}) is not None
    assert servers_of(route(to={"kind": "Service", "name": "idle"}), {}) == ()


def test_target_port_picks_the_endpoint_port_by_name_or_number() -> None:
    both = (EndpointPort("10.0.0.1", 8080, "http"), EndpointPort("10.0.0.1", 8443, "https"))
    endpoints = {(NS, "web"): both}
    by_name = servers_of(route(port={"targetPort": "https"}), endpoints)
    by_number = servers_of(route(port={"targetPort": 8080}), endpoints)
    by_text_number = servers_of(route(port={"targetPort": "8443"}), endpoints)
    assert [s.port for s in by_name] == [8443]
    assert [s.port for s in by_number] == [8080]
    assert [s.port for s in by_text_number] == [8443]
    assert servers_of(route(port={"targetPort": "nope"}), endpoints) == ()
    assert [s.port for s in servers_of(route(), endpoints)] == [8080, 8443]


def test_two_services_sharing_a_pod_give_one_server() -> None:
    r = route(alternateBackends=[{"kind": "Service", "name": "canary", "weight": 100}])
    servers = servers_of(r, {(NS, "web"): eps("10.0.0.1"), (NS, "canary"): eps("10.0.0.1")})
    assert servers == (Server("10.0.0.1", 8080, 256),)


def test_only_ready_tcp_endpoints_of_ip_slices() -> None:
    one = endpoint_slice(NS, "web-1", "web", [("10.0.0.1", None, True), ("10.0.0.2", None, False)])
    unknown = endpoint_slice(NS, "web-2", "web", [("10.0.0.3", None, True)])
    del unknown["endpoints"][0]["conditions"]["ready"]  # unset: ready, as Kubernetes says
    udp = endpoint_slice(NS, "web-3", "web", [("10.0.0.4", None, True)], [("dns", 53, "UDP")])
    fqdn = {**endpoint_slice(NS, "web-4", "web", [("10.0.0.5", None, True)]), "addressType": "FQDN"}
    assert slice_endpoints(one) == [EndpointPort("10.0.0.1", 8080, "http")]
    assert slice_endpoints(udp) == [] and slice_endpoints(fqdn) == []
    merged = merge_endpoints(slice_endpoints(s) for s in [one, unknown, one, udp, fqdn])
    assert merged == eps("10.0.0.1", "10.0.0.3")


def test_host_is_lower_case_and_tls_fields_are_carried() -> None:
    tls = {
        "termination": "edge",
        "certificate": "CERT\n",
        "key": "  KEY",
        "caCertificate": "CA",
        "insecureEdgeTerminationPolicy": "Redirect",
    }
    backend = route_backend(route(host="WWW.Example.COM", path="/api", tls=tls), SERVICES, {})
    assert backend is not None
    assert (backend.host, backend.path, backend.termination) == ("www.example.com", "/api", "edge")
    assert backend.insecure == "Redirect"
    assert backend.certificate_pem == "CERT\nKEY\nCA\n"
    assert backend.destination_ca_pem is None and backend.sticky


def test_edge_without_certificate_uses_the_default_one() -> None:
    backend = route_backend(route(tls={"termination": "edge"}), SERVICES, {})
    assert backend is not None and backend.certificate_pem is None
    assert backend.insecure == "None"


def test_reencrypt_carries_the_destination_ca_and_passthrough_drops_path_and_certs() -> None:
    reencrypt = {"termination": "reencrypt", "destinationCACertificate": "DEST"}
    backend = route_backend(route(tls=reencrypt), SERVICES, {})
    assert backend is not None and backend.destination_ca_pem == "DEST\n"
    assert backend.service == "web"  # the pod's certificate must name web.shop.svc
    passthrough = {"termination": "passthrough", "certificate": "CERT", "key": "KEY"}
    backend = route_backend(route(path="/x", tls=passthrough), SERVICES, {})
    assert backend is not None
    assert (backend.path, backend.certificate_pem, backend.termination) == ("", None, "passthrough")


def test_plain_route_ignores_an_insecure_policy_and_cookies_can_be_disabled() -> None:
    r = route()
    r["metadata"]["annotations"] = {"haproxy.router.openshift.io/disable_cookies": "true"}
    backend = route_backend(r, SERVICES, {})
    assert backend is not None
    assert (backend.termination, backend.insecure, backend.sticky) == ("http", "None", False)


def test_table_leaves_out_a_route_without_host_and_sorts() -> None:
    table = router_table(
        [route("b", host="b.example.com"), route("a", host="a.example.com"), route("c", host="")],
        SERVICES,
        {},
    )
    assert [(r.name, r.host) for r in table.routes] == [
        ("a", "a.example.com"),
        ("b", "b.example.com"),
    ]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 256), st.integers(1, 6)), min_size=1, max_size=4, unique=False
    )
)
def test_each_service_gets_its_weights_share_of_the_traffic(
    spec: list[tuple[int, int]],
) -> None:
    """Whatever the weights and endpoint counts, a service's servers together carry its
    weight's share (to within the rounding to integers), and a weight-0 service none."""
    names = [f"s{i}" for i in range(len(spec))]
    targets = [{"kind": "Service", "name": f"s{i}", "weight": w} for i, (w, _) in enumerate(spec)]
    r = route(to=targets[0], alternateBackends=targets[1:])
    services = {(NS, n): service(NS, n) for n in names}
    endpoints = {
        (NS, f"s{i}"): eps(*(f"10.{i}.0.{j}" for j in range(count)))
        for i, (_, count) in enumerate(spec)
    }
    backend = route_backend(r, services, endpoints)
    assert backend is not None
    largest = max(w / c for w, c in spec)
    for i, (weight, count) in enumerate(spec):
        mine = [s.weight for s in backend.servers if s.ip.startswith(f"10.{i}.")]
        assert len(mine) == count and all(0 <= w <= 256 for w in mine)
        if weight == 0:
            assert mine == [0] * count
            continue
        exact = weight / count * 256 / largest  # each server's exact scaled share
        assert all(w >= 1 and abs(w - exact) < 1 for w in mine)
