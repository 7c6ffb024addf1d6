"""Routes on a real master over etcd: create, get, list, watch, the status subresource,
generated hosts, 422s with their reasons (a key never echoed), namespace cleanup, and
the real kubectl (apply -f, get routes) next to ``podnet get routes``."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import yaml

from podnet.router.admission import Verdict
from podnet.router.status import route_status
from podnet.testing.api import client_for
from podnet.testing.cli import run_kubectl, run_podnet
from podnet.testing.e2e import wait_for
from podnet.testing.processes import MasterProcess
from podnet.testing.routecerts import RouteCa, other_key_pem

Obj = dict[str, Any]
ROUTES = "/apis/route.openshift.io/v1/namespaces/shop/routes"
HOST = "www.example.com"
CA = RouteCa.new()
LEAF = CA.issue(HOST)


def route(name: str, spec: Obj, status: Obj | None = None) -> Obj:
    obj: Obj = {
        "apiVersion": "route.openshift.io/v1",
        "kind": "Route",
        "metadata": {"name": name},
        "spec": spec,
    }
    if status is not None:
        obj["status"] = status
    return obj


def make_namespace(api: httpx.Client, name: str = "shop") -> None:
    made = api.post("/api/v1/namespaces", json={"metadata": {"name": name}})
    assert made.status_code == 201, made.text


def watch_events(api: httpx.Client, path: str, since: str, count: int) -> list[Obj]:
    """The first ``count`` events of a watch from ``since`` (a read timeout fails)."""
    events: list[Obj] = []
    params = {"watch": "1", "resourceVersion": since}
    with api.stream("GET", path, params=params, timeout=10) as stream:
        assert stream.status_code == 200
        for line in stream.iter_lines():
            if line.strip():
                events.append(json.loads(line))
            if len(events) == count:
                break
    return events


def test_route_crud_status_subresource_and_watch(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        make_namespace(api)
        listed = api.get(ROUTES).json()["metadata"]["resourceVersion"]
        forged = {"ingress": [{"routerName": "default", "host": HOST}]}
        tls = {"termination": "edge", "certificate": LEAF.certificate, "key": LEAF.key}
        spec = {"host": HOST, "path": "/api", "to": {"name": "web"}, "tls": tls}
        made = api.post(ROUTES, json=route("web", spec, forged))
        assert made.status_code == 201, made.text
        assert made.json()["status"] == {}  # a route is admitted by routers, not its author
        assert made.json()["spec"]["to"] == {"kind": "Service", "name": "web", "weight": 100}
        assert made.json()["spec"]["tls"]["termination"] == "edge"

        generated = api.post(ROUTES, json=route("shop-front", {"to": {"name": "front"}}))
        assert generated.status_code == 201, generated.text
        assert (
            generated.json()["spec"]["host"] == "shop-front-shop.router.default.svc.cluster.local"
        )

        got = api.get(f"{ROUTES}/web").json()
        assert got["spec"] == made.json()["spec"]
        names = [r["metadata"]["name"] for r in api.get(ROUTES).json()["items"]]
        assert sorted(names) == ["shop-front", "web"]
        everywhere = api.get("/apis/route.openshift.io/v1/routes").json()
        assert everywhere["kind"] == "RouteList" and len(everywhere["items"]) == 2
        for selector, found in (
            (f"spec.host={HOST}", ["web"]),
            ("spec.to.name=front", ["shop-front"]),
            ("spec.path=/api", ["web"]),
            ("spec.host!=nothing.example.com", ["shop-front", "web"]),
        ):
            items = api.get(ROUTES, params={"fieldSelector": selector}).json()["items"]
            assert sorted(r["metadata"]["name"] for r in items) == found, selector
        assert api.get(ROUTES, params={"fieldSelector": "spec.tls=x"}).status_code == 400

        status = route_status(got, "default", Verdict(True), "2024-01-02T03:04:05Z")
        assert status is not None
        patch = {"status": status, "spec": {"host": "evil.example.com"}}
        patched = api.patch(
            f"{ROUTES}/web/status",
            json=patch,
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert patched.status_code == 200, patched.text
        assert patched.json()["status"] == status
        assert patched.json()["spec"]["host"] == HOST  # /status writes the status only

        respec = {**got, "spec": {**got["spec"], "path": "/v2"}, "status": {}}
        del respec["metadata"]["resourceVersion"]
        replaced = api.put(f"{ROUTES}/web", json=respec)
        assert replaced.status_code == 200, replaced.text
        assert replaced.json()["spec"]["path"] == "/v2"
        assert replaced.json()["status"] == status  # the spec path keeps the status

        assert api.delete(f"{ROUTES}/shop-front").status_code == 200
        events = watch_events(api, ROUTES, listed, 5)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "web"),
        ("ADDED", "shop-front"),
        ("MODIFIED", "web"),
        ("MODIFIED", "web"),
        ("DELETED", "shop-front"),
    ]
    assert events[2]["object"]["status"] == status


def test_deleting_a_namespace_deletes_its_routes(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        make_namespace(api)
        assert api.post(ROUTES, json=route("web", {"to": {"name": "web"}})).status_code == 201
        assert api.delete("/api/v1/namespaces/shop").status_code == 200

        def gone() -> bool:
            return api.get("/apis/route.openshift.io/v1/routes").json()["items"] == []

        wait_for(gone, 30, "the namespace's routes deleted")
        # The finalizer removes the Namespace itself only after its contents are gone,
        # so the routes go first and the 404 follows, a moment later.
        wait_for(
            lambda: api.get("/api/v1/namespaces/shop").status_code == 404,
            30,
            "the Terminating namespace finalized",
        )


BAD_ROUTES = [
    ({"host": "Bad_Host", "to": {"name": "web"}}, "spec.host", "is not a valid host"),
    ({"host": HOST, "path": "api", "to": {"name": "web"}}, "spec.path", "must start with /"),
    (
        {"host": HOST, "path": "/a", "to": {"name": "w"}, "tls": {"termination": "passthrough"}},
        "spec.path",
        "passthrough termination does not support paths",
    ),
    (
        {"host": HOST, "to": {"name": "w"}, "tls": {"termination": "edge", "key": "x"}},
        "spec.tls.certificate",
        "a key needs its certificate",
    ),
    (
        {
            "host": HOST,
            "to": {"name": "w"},
            "tls": {"termination": "edge", "certificate": LEAF.certificate, "key": other_key_pem()},
        },
        "spec.tls.key",
        "does not match the certificate",
    ),
    (
        {"host": HOST, "to": {"name": "w", "weight": 999}},
        "spec.to.weight",
        "must be between 0 and 256",
    ),
    (
        {"host": HOST, "to": {"name": "w", "kind": "Pod"}},
        "spec.to.kind",
        "must reference a Service",
    ),
]


@pytest.mark.parametrize(("spec", "field", "why"), BAD_ROUTES)
def test_bad_routes_get_422_with_the_reason(
    master: MasterProcess, spec: Obj, field: str, why: str
) -> None:
    with client_for(master.kubeconfig) as api:
        make_namespace(api)
        answer = api.post(ROUTES, json=route("bad", spec))
        assert answer.status_code == 422, answer.text
        causes = {c["field"]: c["message"] for c in answer.json()["details"]["causes"]}
        assert why in causes[field]
        key = spec.get("tls", {}).get("key")
        if key and len(key) > 1:
            assert key.splitlines()[1] not in answer.text  # a key is never echoed
        assert api.get(ROUTES).json()["items"] == []  # nothing stored


MANIFEST = f"""
apiVersion: route.openshift.io/v1
kind: Route
metadata: {{name: plain}}
spec:
  host: plain.example.com
  path: /api
  to: {{kind: Service, name: web}}
  port: {{targetPort: 8080}}
---
apiVersion: route.openshift.io/v1
kind: Route
metadata: {{name: edge}}
spec:
  host: {HOST}
  to: {{kind: Service, name: a, weight: 75}}
  alternateBackends:
  - {{kind: Service, name: b, weight: 25}}
  tls:
    termination: edge
    insecureEdgeTerminationPolicy: Redirect
    certificate: {json.dumps(LEAF.certificate)}
    key: {json.dumps(LEAF.key)}
---
apiVersion: route.openshift.io/v1
kind: Route
metadata: {{name: pt}}
spec:
  host: pt.example.com
  to: {{kind: Service, name: db}}
  tls: {{termination: passthrough, insecureEdgeTerminationPolicy: Redirect}}
"""


def kubectl_ok(master: MasterProcess, *args: str, stdin: str | None = None) -> str:
    result = run_kubectl(master.kubeconfig, *args, stdin=stdin)
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result.stdout


def rows(text: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in text.splitlines()}


@pytest.mark.usefixtures("kubectl")
def test_kubectl_apply_and_get_routes(master: MasterProcess) -> None:
    kubectl_ok(master, "create", "namespace", "shop")
    applied = kubectl_ok(master, "-n", "shop", "apply", "-f", "-", stdin=MANIFEST)
    assert "route.route.openshift.io/edge created" in applied
    again = kubectl_ok(master, "-n", "shop", "apply", "-f", "-", stdin=MANIFEST)
    assert "route.route.openshift.io/edge unchanged" in again
    admitted = {"status": {"ingress": [{"routerName": "default", "host": HOST, "conditions": [
        {"type": "Admitted", "status": "True", "lastTransitionTime": "2024-01-02T03:04:05Z"}
    ]}]}}  # fmt: skip
    kubectl_ok(
        master, "-n", "shop", "patch", "route", "edge", "--subresource=status", "--type=merge",
        "-p", json.dumps(admitted),
    )  # fmt: skip

    table = rows(kubectl_ok(master, "-n", "shop", "get", "routes"))
    assert table["NAME"] == [
        "NAME", "HOST/PORT", "PATH", "SERVICES", "PORT", "TERMINATION", "ADMITTED", "AGE"
    ]  # fmt: skip
    assert table["plain"][1:7] == ["plain.example.com", "/api", "web", "8080", "<none>", "<none>"]
    assert table["edge"][1:7] == [HOST, "<none>", "a(75%),b(25%)", "<all>", "edge/Redirect", "True"]
    assert table["pt"][5] == "passthrough/Redirect"
    wide = rows(kubectl_ok(master, "-n", "shop", "get", "routes", "-o", "wide"))
    assert wide["NAME"][-1] == "WILDCARD" and wide["edge"][-1] == "None"

    ours = run_podnet(master.kubeconfig, "get", "routes", "-n", "shop")
    assert ours.returncode == 0, ours.stderr
    assert {k: v[:7] for k, v in rows(ours.stdout).items()} == {k: v[:7] for k, v in table.items()}

    stored = yaml.safe_load(kubectl_ok(master, "-n", "shop", "get", "route", "edge", "-o", "yaml"))
    assert stored["spec"]["tls"]["key"] == LEAF.key
    assert stored["status"] == admitted["status"]

    bad = MANIFEST.replace("path: /api", "path: api")
    refused = run_kubectl(master.kubeconfig, "-n", "shop", "apply", "-f", "-", stdin=bad)
    assert refused.returncode != 0
    assert "spec.path" in refused.stderr and "must start with /" in refused.stderr
