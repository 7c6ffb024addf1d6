"""The Route table (``podnet get routes``, ``kubectl get routes``): oc's columns plus
ADMITTED, read from the object as the API stores it; discovery and OpenAPI list routes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from podnet.api.discovery import api_group, api_resource_list
from podnet.api.openapi import group_version_document
from podnet.api.tables import column_definitions, row
from podnet.cli.servicedescribe import describe_view
from podnet.model.kinds import KINDS, ROUTE
from podnet.model.routecells import (
    redacted_route,
    route_admitted,
    route_port,
    route_services,
    route_termination,
)
from podnet.testing.routecerts import RouteCa

Obj = dict[str, Any]


def route(spec: Obj, ingress: list[Obj] | None = None) -> Obj:
    obj: Obj = {"metadata": {"name": "web", "namespace": "shop"}, "spec": spec}
    if ingress is not None:
        obj["status"] = {"ingress": ingress}
    return obj


def entry(router: str, status: str | None) -> Obj:
    conditions = [] if status is None else [{"type": "Admitted", "status": status}]
    return {"routerName": router, "conditions": conditions}


@pytest.mark.parametrize(
    ("spec", "shown"),
    [
        ({"to": {"name": "a"}}, "a"),
        ({"to": {"name": "a", "weight": 0}}, "a"),  # one backend: no share shown
        (
            {"to": {"name": "a", "weight": 75}, "alternateBackends": [{"name": "b", "weight": 25}]},
            "a(75%),b(25%)",
        ),
        (
            {"to": {"name": "a", "weight": 3}, "alternateBackends": [{"name": "b", "weight": 1}]},
            "a(75%),b(25%)",
        ),
        (
            {
                "to": {"name": "a", "weight": 1},
                "alternateBackends": [{"name": "b", "weight": 1}, {"name": "c", "weight": 1}],
            },
            "a(33%),b(33%),c(33%)",  # rounded down, as oc does
        ),
        (
            {"to": {"name": "a", "weight": 0}, "alternateBackends": [{"name": "b", "weight": 0}]},
            "a(0%),b(0%)",
        ),
        ({"to": {"name": "a"}, "alternateBackends": [{"name": "b"}]}, "a(50%),b(50%)"),  # 100s
    ],
)
def test_services(spec: Obj, shown: str) -> None:
    assert route_services(route(spec)) == shown


def test_port_and_termination() -> None:
    assert route_port(route({"to": {"name": "a"}})) == "<all>"
    assert route_port(route({"port": {"targetPort": 8080}})) == "8080"
    assert route_port(route({"port": {"targetPort": "https"}})) == "https"
    assert route_termination(route({})) == ""
    assert route_termination(route({"tls": {"termination": "edge"}})) == "edge"
    tls = {"termination": "passthrough", "insecureEdgeTerminationPolicy": "Redirect"}
    assert route_termination(route({"tls": tls})) == "passthrough/Redirect"


@pytest.mark.parametrize(
    ("ingress", "shown"),
    [
        (None, ""),
        ([], ""),
        ([entry("default", None)], ""),
        ([entry("default", "True")], "True"),
        ([entry("default", "False")], "False"),
        ([entry("default", "True"), entry("other", "False")], "False"),
        ([entry("default", "True"), entry("other", "True")], "True"),
        ([entry("default", "True"), entry("other", "Unknown")], ""),
    ],
)
def test_admitted(ingress: list[Obj] | None, shown: str) -> None:
    assert route_admitted(route({}, ingress)) == shown


def test_the_table_row() -> None:
    obj = route(
        {
            "host": "www.example.com",
            "path": "/api",
            "to": {"name": "a", "weight": 75},
            "alternateBackends": [{"name": "b", "weight": 25}],
            "port": {"targetPort": 8080},
            "tls": {"termination": "edge", "insecureEdgeTerminationPolicy": "Redirect"},
            "wildcardPolicy": "None",
        },
        [entry("default", "True")],
    )
    headers = [c["name"] for c in column_definitions(ROUTE)]
    assert headers == [
        "Name", "Host/Port", "Path", "Services", "Port", "Termination", "Admitted", "Age",
        "Wildcard",
    ]  # fmt: skip
    assert row(ROUTE, obj)["cells"][:7] == [
        "web", "www.example.com", "/api", "a(75%),b(25%)", "8080", "edge/Redirect", "True"
    ]  # fmt: skip
    assert row(ROUTE, obj)["cells"][8] == "None"
    plain = row(ROUTE, route({"host": "h.example.com", "to": {"name": "a"}}))["cells"]
    assert plain[:7] == ["web", "h.example.com", "<none>", "a", "<all>", "<none>", "<none>"]


def test_names_discovery_and_openapi() -> None:
    for name in ("routes", "route", "Route", "routes.route.openshift.io"):
        assert KINDS.by_name(name) is ROUTE
    assert KINDS.by_kind("route.openshift.io/v1", "Route") is ROUTE
    group = api_group("route.openshift.io")
    assert (
        group is not None and group["preferredVersion"]["groupVersion"] == "route.openshift.io/v1"
    )
    listing = api_resource_list("route.openshift.io/v1")
    assert listing is not None
    resources = {r["name"]: r for r in listing["resources"]}
    assert resources["routes"]["namespaced"] is True and resources["routes"]["kind"] == "Route"
    assert resources["routes/status"]["verbs"] == ["get", "patch", "update"]
    document = group_version_document("route.openshift.io/v1")
    assert document is not None
    paths = json.loads(document)["paths"]
    assert "/apis/route.openshift.io/v1/namespaces/{namespace}/routes/{name}" in paths


def test_describe_shows_no_key_and_no_pem() -> None:
    ca = RouteCa.new()
    leaf = ca.issue("www.example.com")
    tls = {
        "termination": "reencrypt",
        "certificate": leaf.certificate,
        "key": leaf.key,
        "caCertificate": ca.pem,
        "destinationCACertificate": ca.pem,
        "insecureEdgeTerminationPolicy": "Redirect",
    }
    obj = route({"host": "www.example.com", "to": {"name": "a"}, "tls": tls})
    text = describe_view(None, ROUTE, obj)
    assert "<redacted>" in text and f"<PEM, {len(leaf.certificate)} bytes>" in text
    assert "Redirect" in text and "www.example.com" in text
    for secret in (leaf.key.splitlines()[1], leaf.certificate.splitlines()[1], "BEGIN"):
        assert secret not in text
    assert obj["spec"]["tls"]["key"] == leaf.key  # the object itself is left as it was
    plain = route({"host": "h.example.com", "to": {"name": "a"}})
    assert redacted_route(plain) == plain
