"""The router's own identity on a real master (``podnet router-credentials``): what it
needs works (read routes, services, endpoints and slices anywhere; write its own entry
of a route's status), and the attacks are refused: a route's spec, another router's
status entry, other kinds, reads beyond its list. A node cannot read routes (they hold
TLS keys)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from podnet.master import node_credentials, router_credentials
from podnet.router.admission import Verdict
from podnet.router.status import route_status
from podnet.testing.api import client_for, kubeconfig_parts
from podnet.testing.cli import DISCOVERY_ROWS, can_i_rows, run_kubectl
from podnet.testing.processes import MasterProcess

Obj = dict[str, Any]
ROUTES = "/apis/route.openshift.io/v1/namespaces/shop/routes"
MERGE = {"Content-Type": "application/merge-patch+json"}


def router_kubeconfig(master: MasterProcess, tmp_path: Path) -> Path:
    kubeconfig = tmp_path / "router.kubeconfig"
    router_credentials(master.state_dir, "r1", kubeconfig=kubeconfig, server=master.server)
    return kubeconfig


def seed(master: MasterProcess) -> Obj:
    """Namespace shop with a Service and a route to it; the route as stored."""
    with client_for(master.kubeconfig) as admin:
        assert admin.post("/api/v1/namespaces", json={"metadata": {"name": "shop"}}).is_success
        service = {"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}}
        assert admin.post("/api/v1/namespaces/shop/services", json=service).is_success
        spec = {"host": "www.example.com", "to": {"name": "web"}}
        made = admin.post(ROUTES, json={"metadata": {"name": "web"}, "spec": spec})
        assert made.status_code == 201, made.text
        return dict(made.json())


def test_the_router_reads_its_kinds_and_writes_route_status(
    master: MasterProcess, tmp_path: Path
) -> None:
    stored = seed(master)
    _, _, token = kubeconfig_parts(router_kubeconfig(master, tmp_path))
    with client_for(master.kubeconfig, token=token) as router:
        for path in (
            "/apis/route.openshift.io/v1/routes",
            ROUTES + "/web",
            ROUTES + "/web/status",
            "/api/v1/services",
            "/api/v1/namespaces/shop/services/web",
            "/api/v1/endpoints",
            "/apis/discovery.k8s.io/v1/endpointslices",
        ):
            assert router.get(path).status_code == 200, path
        with router.stream("GET", "/apis/route.openshift.io/v1/routes?watch=1") as watch:
            assert watch.status_code == 200
        status = route_status(stored, "r1", Verdict(True), "2024-01-02T03:04:05Z")
        patched = router.patch(ROUTES + "/web/status", json={"status": status}, headers=MERGE)
        assert patched.status_code == 200, patched.text
        assert patched.json()["status"] == status
        body = {**patched.json(), "status": {"ingress": []}}
        assert router.put(ROUTES + "/web/status", json=body).status_code == 200


def refused_calls(router: httpx.Client, stored: Obj) -> list[tuple[str, httpx.Response]]:
    new_route = {"metadata": {"name": "evil"}, "spec": {"host": "evil.com", "to": {"name": "web"}}}
    respec = {**stored, "spec": {**stored["spec"], "host": "hijacked.example.com"}}
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    return [
        ("create a route", router.post(ROUTES, json=new_route)),
        ("replace a route's spec", router.put(ROUTES + "/web", json=respec)),
        ("patch a route's spec", router.patch(ROUTES + "/web", json=respec, headers=MERGE)),
        ("delete a route", router.delete(ROUTES + "/web")),
        ("update a service", router.put("/api/v1/namespaces/shop/services/web", json={})),
        ("create endpoints", router.post("/api/v1/namespaces/shop/endpoints", json={})),
        ("list pods", router.get("/api/v1/pods")),
        ("create a pod", router.post("/api/v1/namespaces/shop/pods", json=pod)),
        ("list nodes", router.get("/api/v1/nodes")),
        ("list namespaces", router.get("/api/v1/namespaces")),
        ("list events", router.get("/api/v1/events")),
        ("list hostsubnets", router.get("/apis/network.openshift.io/v1/hostsubnets")),
        ("list netnamespaces", router.get("/apis/network.openshift.io/v1/netnamespaces")),
        ("list leases", router.get("/apis/coordination.k8s.io/v1/leases")),
        ("list networkpolicies", router.get("/apis/networking.k8s.io/v1/networkpolicies")),
    ]


def test_the_router_is_refused_everything_else(master: MasterProcess, tmp_path: Path) -> None:
    stored = seed(master)
    _, _, token = kubeconfig_parts(router_kubeconfig(master, tmp_path))
    with client_for(master.kubeconfig, token=token) as router:
        answers = {what: r.status_code for what, r in refused_calls(router, stored)}
        assert answers == dict.fromkeys(answers, 403)
        assert router.delete(ROUTES).status_code == 405  # no delete-collection for anyone
        # Secrets are not served at all: nothing there for anyone to read.
        assert router.get("/api/v1/namespaces/shop/secrets").status_code == 404
        # The status subresource writes status only: a spec in the body is dropped.
        body = {"spec": {"host": "hijacked.example.com"}, "status": {}}
        patched = router.patch(ROUTES + "/web/status", json=body, headers=MERGE)
        assert patched.status_code == 200
    with client_for(master.kubeconfig) as admin:
        assert admin.get(ROUTES + "/web").json()["spec"] == stored["spec"]
        names = [r["metadata"]["name"] for r in admin.get(ROUTES).json()["items"]]
        assert names == ["web"]


def test_a_router_writes_only_its_own_status_entry(master: MasterProcess, tmp_path: Path) -> None:
    stored = seed(master)
    other = route_status(stored, "other", Verdict(True), "2024-01-02T03:04:05Z")
    with client_for(master.kubeconfig) as admin:  # another router's entry, by the admin
        assert admin.patch(ROUTES + "/web/status", json={"status": other}, headers=MERGE).is_success
        current = admin.get(ROUTES + "/web").json()
    _, _, token = kubeconfig_parts(router_kubeconfig(master, tmp_path))
    refused = Verdict(False, "HostAlreadyClaimed", "forged")
    forged = route_status(current, "other", refused, "2024-01-02T03:04:06Z")
    mine = route_status(current, "r1", Verdict(True), "2024-01-02T03:04:06Z")
    assert forged is not None and mine is not None
    with client_for(master.kubeconfig, token=token) as router:
        for status in (
            forged,
            {"ingress": []},
            {"ingress": [*mine["ingress"], mine["ingress"][1]]},
        ):
            answer = router.patch(ROUTES + "/web/status", json={"status": status}, headers=MERGE)
            assert answer.status_code == 403, answer.text
        answer = router.patch(ROUTES + "/web/status", json={"status": mine}, headers=MERGE)
        assert answer.status_code == 200, answer.text
    with client_for(master.kubeconfig) as admin:
        entries = admin.get(ROUTES + "/web").json()["status"]["ingress"]
    assert [e["routerName"] for e in entries] == ["other", "r1"]
    assert entries[0] == other["ingress"][0]  # untouched


@pytest.mark.usefixtures("kubectl")
def test_can_i_list_as_the_router_shows_exactly_its_rules(
    master: MasterProcess, tmp_path: Path
) -> None:
    kubeconfig = router_kubeconfig(master, tmp_path)
    result = run_kubectl(kubeconfig, "auth", "can-i", "--list", "-n", "shop")
    assert result.returncode == 0, result.stderr
    assert can_i_rows(result.stdout) == DISCOVERY_ROWS | {
        "endpoints [] [] [get list watch]",
        "services [] [] [get list watch]",
        "endpointslices.discovery.k8s.io [] [] [get list watch]",
        "routes.route.openshift.io/status [] [] [get list patch update watch]",
        "routes.route.openshift.io [] [] [get list watch]",
        "selfsubjectaccessreviews.authorization.k8s.io [] [] [create]",
        "selfsubjectrulesreviews.authorization.k8s.io [] [] [create]",
    }, result.stdout


def test_a_node_cannot_read_routes(master: MasterProcess, tmp_path: Path) -> None:
    seed(master)
    kubeconfig = node_credentials(master.state_dir, "n1", master.server, tmp_path / "n1.kc")
    _, _, token = kubeconfig_parts(kubeconfig)
    with client_for(master.kubeconfig, token=token) as node:
        assert node.get("/api/v1/namespaces/shop/services").status_code == 200  # as before
        for path in ("/apis/route.openshift.io/v1/routes", ROUTES + "/web"):
            assert node.get(path).status_code == 403, path
