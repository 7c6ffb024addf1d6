"""The endpoints controller against a real master and etcd: Endpoints and EndpointSlices
follow pods (readiness set through pods/status as a node sets it, labels, deletions, a
named targetPort with two numbers), hand-written Endpoints stay, invalid slices are
refused, a node may read slices but not write them, and kubectl and ``podnet get`` show
Kubernetes' columns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from podnet.api.auth import ensure_node_token
from podnet.controllers.endpointslicesdesired import MIRROR_CONTROLLER
from podnet.model.schemas_discovery import MANAGED_BY_LABEL, SERVICE_NAME_LABEL
from podnet.testing.api import client_for, namespace
from podnet.testing.cli import run_kubectl, run_podnet
from podnet.testing.e2e import wait_for
from podnet.testing.processes import MasterProcess

NS = "shop"
CORE = f"/api/v1/namespaces/{NS}"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
ALL_SLICES = "/apis/discovery.k8s.io/v1/endpointslices"


def service(name: str, target: int | str = 8080, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "selector": {"app": name},
        "ports": [{"name": "http", "port": 80, "targetPort": target}],
    }
    body.update(spec)
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": body}


def pod(name: str, app: str, web_port: int | None = None) -> dict[str, Any]:
    ports = [{"name": "web", "containerPort": web_port}] if web_port else []
    container = {"name": "main", "image": "busybox", "ports": ports}
    meta = {"name": name, "labels": {"app": app}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [container]},
    }


def set_status(api: httpx.Client, name: str, ip: str, ready: bool) -> None:
    """Write the pod's status through pods/status, as the node's agent does."""
    current = api.get(f"{CORE}/pods/{name}").json()
    current["status"] = {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    answer = api.put(f"{CORE}/pods/{name}/status", json=current)
    assert answer.status_code == 200, answer.text


def start_pod(
    api: httpx.Client, name: str, app: str, ip: str, web_port: int | None = None, ready: bool = True
) -> None:
    answer = api.post(f"{CORE}/pods", json=pod(name, app, web_port))
    assert answer.status_code == 201, answer.text
    set_status(api, name, ip, ready)


def endpoints_view(api: httpx.Client, name: str) -> dict[int, tuple[list[str], list[str]]] | None:
    """port -> (ready IPs, not-ready IPs) of the Service's Endpoints; None if absent."""
    answer = api.get(f"{CORE}/endpoints/{name}")
    if answer.status_code != 200:
        return None
    out = {}
    for subset in answer.json().get("subsets") or []:
        port = (subset.get("ports") or [{"port": 0}])[0]["port"]
        out[port] = (
            sorted(a["ip"] for a in subset.get("addresses") or []),
            sorted(a["ip"] for a in subset.get("notReadyAddresses") or []),
        )
    return out


def slices_of(api: httpx.Client, name: str) -> list[dict[str, Any]]:
    answer = api.get(SLICES, params={"labelSelector": f"{SERVICE_NAME_LABEL}={name}"})
    assert answer.status_code == 200, answer.text
    return list(answer.json()["items"])


def slices_view(api: httpx.Client, name: str) -> dict[int, list[tuple[str, bool]]]:
    """port -> [(IP, ready)] over the Service's slices (port 0: slices without ports)."""
    out: dict[int, list[tuple[str, bool]]] = {}
    for item in slices_of(api, name):
        port = (item.get("ports") or [{"port": 0}])[0]["port"]
        for endpoint in item.get("endpoints") or []:
            entry = (endpoint["addresses"][0], endpoint["conditions"]["ready"])
            out.setdefault(port, []).append(entry)
    return {port: sorted(entries) for port, entries in out.items()}


def until(check: Any, what: str) -> Any:
    return wait_for(check, 30, what, interval=0.05)


@pytest.fixture
def api(master: MasterProcess) -> Any:
    with client_for(master.kubeconfig) as admin:
        assert admin.post("/api/v1/namespaces", json=namespace(NS)).status_code == 201
        yield admin


def test_endpoints_and_slices_follow_pods(api: httpx.Client) -> None:
    assert api.post(f"{CORE}/services", json=service("web", "web")).status_code == 201
    start_pod(api, "a", "web", "10.128.0.5", web_port=8080)
    start_pod(api, "b", "web", "10.128.0.6", web_port=9090)
    start_pod(api, "c", "web", "10.128.0.7")  # has no port named "web"
    start_pod(api, "d", "web", "10.128.0.8", web_port=8080, ready=False)
    start_pod(api, "other", "db", "10.128.0.9", web_port=8080)

    expected = {8080: (["10.128.0.5"], ["10.128.0.8"]), 9090: (["10.128.0.6"], [])}
    until(lambda: endpoints_view(api, "web") == expected, "Endpoints split by port number")
    until(
        lambda: (
            slices_view(api, "web")
            == {
                0: [("10.128.0.7", True)],
                8080: [("10.128.0.5", True), ("10.128.0.8", False)],
                9090: [("10.128.0.6", True)],
            }
        ),
        "slices split by port number",
    )
    for item in slices_of(api, "web"):
        assert item["metadata"]["labels"][MANAGED_BY_LABEL] == "endpointslice-controller.k8s.io"
        (owner,) = item["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("Service", "web")

    set_status(api, "d", "10.128.0.8", ready=True)
    expected[8080] = (["10.128.0.5", "10.128.0.8"], [])
    until(lambda: endpoints_view(api, "web") == expected, "d ready in Endpoints")
    until(lambda: ("10.128.0.8", True) in slices_view(api, "web")[8080], "d ready in slices")

    relabel = {"metadata": {"labels": {"app": "gone"}}}
    merge = {"Content-Type": "application/merge-patch+json"}
    assert api.patch(f"{CORE}/pods/a", json=relabel, headers=merge).status_code == 200
    assert api.delete(f"{CORE}/pods/b").status_code == 200
    expected = {8080: (["10.128.0.8"], [])}
    until(lambda: endpoints_view(api, "web") == expected, "a relabelled away, b deleted")
    until(
        lambda: (
            slices_view(api, "web") == {0: [("10.128.0.7", True)], 8080: [("10.128.0.8", True)]}
        ),
        "slices after the relabel and the deletion",
    )

    assert api.delete(f"{CORE}/services/web").status_code == 200
    until(lambda: endpoints_view(api, "web") is None, "Endpoints removed with the Service")
    until(lambda: slices_of(api, "web") == [], "slices removed with the Service")


def test_hand_written_endpoints_stay_and_tables_show_kubernetes_columns(
    api: httpx.Client, master: MasterProcess, kubectl: str
) -> None:
    manual = {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": "external"},
        "subsets": [{"addresses": [{"ip": "192.0.2.10"}], "ports": [{"port": 5432}]}],
    }
    selectorless = service("external")
    del selectorless["spec"]["selector"]
    assert api.post(f"{CORE}/services", json=selectorless).status_code == 201
    written = api.post(f"{CORE}/endpoints", json=manual)
    assert written.status_code == 201, written.text
    assert api.post(f"{CORE}/services", json=service("web")).status_code == 201
    for i in range(4):
        start_pod(api, f"w{i}", "web", f"10.128.0.{10 + i}")
    until(lambda: len((endpoints_view(api, "web") or {8080: ([], [])})[8080][0]) == 4, "4 ready")

    kept = api.get(f"{CORE}/endpoints/external").json()
    assert kept["metadata"]["resourceVersion"] == written.json()["metadata"]["resourceVersion"]
    (mirrored,) = until(lambda: slices_of(api, "external"), "the mirrored slice")
    assert mirrored["metadata"]["labels"][MANAGED_BY_LABEL] == MIRROR_CONTROLLER
    assert mirrored["endpoints"][0]["addresses"] == ["192.0.2.10"]
    assert mirrored["metadata"]["ownerReferences"][0]["kind"] == "Endpoints"

    ep = run_kubectl(master.kubeconfig, "get", "ep", "-n", NS)
    assert ep.returncode == 0, ep.stderr
    lines = {line.split()[0]: line.split() for line in ep.stdout.splitlines()}
    assert lines["NAME"] == ["NAME", "ENDPOINTS", "AGE"]
    assert lines["web"][1:4] == ["10.128.0.10:8080,10.128.0.11:8080,10.128.0.12:8080", "+", "1"]
    assert lines["web"][4] == "more..."
    assert lines["external"][1] == "192.0.2.10:5432"

    slices = run_kubectl(master.kubeconfig, "get", "endpointslices", "-n", NS)
    assert slices.returncode == 0, slices.stderr
    rows = [line.split() for line in slices.stdout.splitlines()]
    assert rows[0] == ["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"]
    (web,) = [r for r in rows[1:] if r[0].startswith("web-")]
    assert web[1:6] == ["IPv4", "8080", "10.128.0.10,10.128.0.11,10.128.0.12", "+", "1"]

    ours = run_podnet(master.kubeconfig, "get", "endpointslices", "-n", NS)
    assert ours.returncode == 0, ours.stderr
    assert (
        "ADDRESSTYPE" in ours.stdout
        and "10.128.0.10,10.128.0.11,10.128.0.12 + 1 more..." in ours.stdout
    )
    ours = run_podnet(master.kubeconfig, "get", "ep", "-n", NS)
    assert ours.returncode == 0, ours.stderr
    assert "192.0.2.10:5432" in ours.stdout

    described = run_kubectl(master.kubeconfig, "describe", "endpointslices", "-n", NS)
    assert described.returncode == 0, described.stderr
    assert "AddressType:  IPv4" in described.stdout and "10.128.0.13" in described.stdout
    described = run_kubectl(master.kubeconfig, "describe", "ep", "web", "-n", NS)
    assert described.returncode == 0, described.stderr
    assert "10.128.0.10,10.128.0.11,10.128.0.12,10.128.0.13" in described.stdout


BAD_SLICES = [
    {"addressType": "IP"},
    {"addressType": "IPv4", "endpoints": [{"addresses": []}]},
    {"addressType": "IPv4", "endpoints": [{"addresses": ["127.0.0.1"]}]},
    {"addressType": "IPv4", "endpoints": [{"addresses": ["fd00::1"]}]},
    {"addressType": "IPv6", "endpoints": [{"addresses": ["10.0.0.1"]}]},
    {"addressType": "IPv4", "ports": [{"name": "a", "port": 1}, {"name": "a", "port": 2}]},
    {"addressType": "IPv4", "ports": [{"name": "A_B", "port": 1}]},
    {"addressType": "IPv4", "ports": [{"port": 1, "protocol": "ICMP"}]},
    {"addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.1"]}] * 1001},
    {"addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.1"], "hostname": "No_Good"}]},
]


@pytest.mark.parametrize("body", BAD_SLICES, ids=range(len(BAD_SLICES)))
def test_invalid_slices_are_refused_and_not_stored(api: httpx.Client, body: dict[str, Any]) -> None:
    obj = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice"}
    obj |= {"metadata": {"name": "bad"}, **body}
    answer = api.post(SLICES, json=obj)
    assert answer.status_code == 422, answer.text
    assert answer.json()["reason"] == "Invalid"
    assert api.get(f"{SLICES}/bad").status_code == 404


def test_a_node_reads_slices_and_services_everywhere_but_writes_none(
    api: httpx.Client, master: MasterProcess
) -> None:
    assert api.post(f"{CORE}/services", json=service("web")).status_code == 201
    until(lambda: slices_of(api, "web"), "the placeholder slice")
    token = ensure_node_token(master.state_dir / "tokens.csv", "node-1")
    with client_for(master.kubeconfig, token=token) as node:
        listed = node.get(ALL_SLICES)
        assert listed.status_code == 200 and listed.json()["items"]
        assert node.get("/api/v1/services").status_code == 200
        watch = node.get(ALL_SLICES, params={"watch": "1", "timeoutSeconds": "1"})
        assert watch.status_code == 200
        (one,) = slices_of(api, "web")
        name = one["metadata"]["name"]
        one["endpoints"] = [{"addresses": ["10.128.0.99"]}]
        assert node.put(f"{SLICES}/{name}", json=one).status_code == 403
        assert node.delete(f"{SLICES}/{name}").status_code == 403
        forged = {**one, "metadata": {"name": "forged", "labels": one["metadata"]["labels"]}}
        assert node.post(SLICES, json=forged).status_code == 403
        assert node.delete(f"{CORE}/services/web").status_code == 403
    assert api.get(f"{SLICES}/forged").status_code == 404
    assert api.get(f"{SLICES}/{name}").json()["endpoints"] in (None, [])


def test_deleting_the_namespace_deletes_its_slices(api: httpx.Client) -> None:
    """A slice nobody manages (written by hand) goes with its Namespace."""
    mine = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice"}
    mine |= {"metadata": {"name": "by-hand"}, "addressType": "IPv4"}
    mine["endpoints"] = [{"addresses": ["192.0.2.20"]}]
    assert api.post(SLICES, json=mine).status_code == 201
    assert api.delete(f"/api/v1/namespaces/{NS}").status_code == 200
    until(lambda: api.get(f"/api/v1/namespaces/{NS}").status_code == 404, "the namespace gone")
    listed = api.get(ALL_SLICES).json()["items"]
    assert [s for s in listed if s["metadata"]["namespace"] == NS] == []


SLICE_MANIFEST = """
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: by-hand
  namespace: shop
  labels: {kubernetes.io/service-name: external}
addressType: IPv4
endpoints:
- addresses: [192.0.2.30]
ports:
- {name: pg, port: PORT}
"""


def test_kubectl_apply_replaces_a_slices_ports(
    api: httpx.Client, master: MasterProcess, kubectl: str, tmp_path: Path
) -> None:
    """An EndpointSlice's ports are atomic (kube's listType): applying a new port
    replaces the old one, where a Service's ports would be merged by port number."""
    manifest = tmp_path / "slice.yaml"
    for port in (5432, 6432):
        manifest.write_text(SLICE_MANIFEST.replace("PORT", str(port)))
        applied = run_kubectl(master.kubeconfig, "apply", "-f", str(manifest))
        assert applied.returncode == 0, applied.stderr
    ports = api.get(f"{SLICES}/by-hand").json()["ports"]
    assert ports == [{"name": "pg", "port": 6432, "protocol": "TCP"}]
