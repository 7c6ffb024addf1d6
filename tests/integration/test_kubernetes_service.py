"""The ``default/kubernetes`` Service on real etcd and real masters: created at start,
with the first service IP (which nobody else may take), recreated when deleted, repaired
when changed, its Endpoints/EndpointSlice holding the live masters' advertised addresses,
the serving certificate valid for its names, and kubectl showing it."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from podnet.store.etcd import EtcdStore
from podnet.store.etcd_process import EtcdProcess
from podnet.testing.api import client_for, kubeconfig_parts
from podnet.testing.cli import run_kubectl
from podnet.testing.e2e import wait_for
from podnet.testing.processes import MasterProcess

SERVICE = "/api/v1/namespaces/default/services/kubernetes"
ENDPOINTS = "/api/v1/namespaces/default/endpoints/kubernetes"
SLICE = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes"
ADVERTISED = "192.0.2.50"
SECOND = "192.0.2.51"
PORT = 6443
MASTER = [sys.executable, "-m", "podnet", "master"]


def advertising(etcd: EtcdProcess, state_dir: Path, prefix: str, address: str) -> MasterProcess:
    """A master advertising ``address``; ready once it serves (a second one does not lead)."""
    args = ["--service-network", "172.30.0.0/16", "--advertise-address", address]
    process = MasterProcess(
        etcd.endpoint, state_dir, prefix, args=[*args, "--advertise-port", str(PORT)]
    )
    process.start(wait=False)
    process.wait_ready(60, "/healthz")
    return process


@pytest.fixture
def first(etcd: EtcdProcess, tmp_path: Path, prefix: str) -> Iterator[MasterProcess]:
    process = advertising(etcd, tmp_path / "master", prefix, ADVERTISED)
    try:
        yield process
    finally:
        process.stop()


def body(api: httpx.Client, path: str) -> Any:
    answer = api.get(path)
    return answer.json() if answer.status_code == 200 else None


def endpoint_ips(api: httpx.Client) -> tuple[list[str], list[str]] | None:
    """The addresses in the Endpoints and in the slice (None while either is missing)."""
    endpoints, slice_ = body(api, ENDPOINTS), body(api, SLICE)
    if endpoints is None or slice_ is None:
        return None
    in_endpoints = [a["ip"] for s in endpoints.get("subsets") or [] for a in s["addresses"]]
    in_slice = [ip for e in slice_.get("endpoints") or [] for ip in e["addresses"]]
    return in_endpoints, in_slice


def holds(api: httpx.Client, *ips: str) -> bool:
    return endpoint_ips(api) == (list(ips), list(ips))


def test_the_master_keeps_the_kubernetes_service(first: MasterProcess) -> None:
    with client_for(first.kubeconfig) as api:
        service = wait_for(lambda: body(api, SERVICE), what="the kubernetes Service")
        spec = service["spec"]
        assert spec["type"] == "ClusterIP" and "selector" not in spec
        assert spec["clusterIP"] == "172.30.0.1" and spec["clusterIPs"] == ["172.30.0.1"]
        assert spec["ports"] == [
            {"name": "https", "protocol": "TCP", "port": 443, "targetPort": PORT}
        ]
        assert service["metadata"]["labels"] == {"component": "apiserver", "provider": "kubernetes"}
        wait_for(lambda: holds(api, ADVERTISED), what="the master in the endpoints")
        endpoints, slice_ = body(api, ENDPOINTS), body(api, SLICE)
        assert endpoints["subsets"][0]["ports"] == [
            {"name": "https", "port": PORT, "protocol": "TCP"}
        ]
        assert endpoints["metadata"]["labels"]["endpointslice.kubernetes.io/skip-mirror"] == "true"
        assert slice_["ports"] == [{"name": "https", "port": PORT, "protocol": "TCP"}]
        assert slice_["metadata"]["labels"] == {
            "kubernetes.io/service-name": "kubernetes",
            "endpointslice.kubernetes.io/managed-by": "podnet-master",
        }
        assert slice_["endpoints"][0]["conditions"]["ready"] is True
        # No other slice mirrors the Endpoints (the mirroring controller skips them).
        slices = api.get(
            "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
            params={"labelSelector": "kubernetes.io/service-name=kubernetes"},
        ).json()["items"]
        assert [s["metadata"]["name"] for s in slices] == ["kubernetes"]


def test_the_reserved_ip_cannot_be_taken(first: MasterProcess) -> None:
    with client_for(first.kubeconfig) as api:
        wait_for(lambda: body(api, SERVICE), what="the kubernetes Service")
        services = "/api/v1/namespaces/default/services"
        grab = {
            "metadata": {"name": "grab"},
            "spec": {"clusterIP": "172.30.0.1", "ports": [{"port": 443}]},
        }
        answer = api.post(services, json=grab)
        assert answer.status_code == 422, answer.text
        assert "reserved for the Service default/kubernetes" in answer.text
        # Not even while the kubernetes Service is gone: the address stays reserved.
        assert api.delete(SERVICE).status_code == 200
        answer = api.post(services, json=grab)
        assert answer.status_code == 422, answer.text
        assert api.get(f"{services}/grab").status_code == 404
        other = api.post("/api/v1/namespaces", json={"metadata": {"name": "other"}})
        assert other.status_code == 201, other.text
        same_name = {**grab, "metadata": {"name": "kubernetes"}}
        answer = api.post("/api/v1/namespaces/other/services", json=same_name)
        assert answer.status_code == 422, "only default/kubernetes may hold it"
        back = wait_for(lambda: body(api, SERVICE), what="the Service recreated")
        assert back["spec"]["clusterIP"] == "172.30.0.1"


def test_deleted_or_changed_objects_are_repaired(first: MasterProcess) -> None:
    with client_for(first.kubeconfig) as api:
        service = wait_for(lambda: body(api, SERVICE), what="the kubernetes Service")
        wait_for(lambda: holds(api, ADVERTISED), what="the master in the endpoints")
        uid = service["metadata"]["uid"]
        assert api.delete(SERVICE).status_code == 200
        back = wait_for(
            lambda: (s := body(api, SERVICE)) and s["metadata"]["uid"] != uid and s,
            what="the deleted Service made again",
        )
        assert back["spec"]["clusterIP"] == "172.30.0.1"

        changed = json.loads(json.dumps(back))
        changed["spec"]["ports"][0]["targetPort"] = 8443
        changed["spec"]["selector"] = {"app": "impostor"}
        answer = api.put(SERVICE, json=changed)
        assert answer.status_code == 200, answer.text

        def repaired() -> bool:
            spec = body(api, SERVICE)["spec"]
            return "selector" not in spec and spec["ports"][0]["targetPort"] == PORT

        wait_for(repaired, what="the changed Service repaired")

        # A Service of that name with another cluster IP is deleted and made again.
        assert api.delete(SERVICE).status_code == 200
        impostor = {
            "metadata": {"name": "kubernetes"},
            "spec": {"clusterIP": "None", "ports": [{"port": 443}]},
        }
        made = api.post("/api/v1/namespaces/default/services", json=impostor)
        assert made.status_code in (201, 409), made.text  # 409: the master was first
        wait_for(
            lambda: (body(api, SERVICE) or {}).get("spec", {}).get("clusterIP") == "172.30.0.1",
            what="the headless impostor replaced",
        )

        # (The endpoints controller deletes a deleted Service's Endpoints; made again too.)
        wait_for(lambda: holds(api, ADVERTISED), what="the endpoints back")
        endpoints = body(api, ENDPOINTS)
        endpoints["subsets"][0]["addresses"] = [{"ip": "198.51.100.66"}]
        assert api.put(ENDPOINTS, json=endpoints).status_code == 200
        assert api.delete(SLICE).status_code == 200
        wait_for(lambda: holds(api, ADVERTISED), what="the endpoints and slice repaired")


def test_endpoints_follow_the_live_masters(
    first: MasterProcess, etcd: EtcdProcess, tmp_path: Path, prefix: str
) -> None:
    with client_for(first.kubeconfig) as api:
        wait_for(lambda: holds(api, ADVERTISED), what="the first master in the endpoints")
        # A second master on the same state (PKI, tokens) and etcd, as `cluster up` runs them.
        second = advertising(etcd, tmp_path / "master", prefix, SECOND)
        try:
            wait_for(lambda: holds(api, ADVERTISED, SECOND), what="both masters")
        finally:
            second.stop()  # SIGTERM: it revokes its lease and writes itself out
        wait_for(lambda: holds(api, ADVERTISED), timeout=10, what="the stopped master gone")
        asyncio.run(_no_lease_left_but(etcd, prefix, ADVERTISED))
        # A master that crashes cannot write itself out: its lease expires (15 s ttl).
        crashed = advertising(etcd, tmp_path / "master", prefix, SECOND)
        try:
            wait_for(lambda: holds(api, ADVERTISED, SECOND), what="both masters again")
            crashed.kill()
            wait_for(lambda: holds(api, ADVERTISED), timeout=60, what="the crashed master gone")
        finally:
            crashed.stop()
        asyncio.run(_no_lease_left_but(etcd, prefix, ADVERTISED))


async def _no_lease_left_but(etcd: EtcdProcess, prefix: str, address: str) -> None:
    store = EtcdStore(etcd.endpoint)
    await store.connect()
    try:
        kvs, _ = await store.list(f"{prefix}masterleases/")
    finally:
        await store.close()
    assert [kv.key.rsplit("/", 1)[1] for kv in kvs] == [address]


def test_the_certificate_names_the_service(first: MasterProcess) -> None:
    """A pod verifying the master as kubernetes.default.svc (or by the cluster IP) succeeds."""
    _, ca, _ = kubeconfig_parts(first.kubeconfig)
    context = ssl.create_default_context(cadata=ca.decode())
    for name in ("kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "172.30.0.1"):
        with (
            socket.create_connection(("127.0.0.1", first.port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname=name) as tls,
        ):
            assert tls.version() is not None
    with (
        socket.create_connection(("127.0.0.1", first.port), timeout=10) as raw,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        context.wrap_socket(raw, server_hostname="kubernetes.example.com")


@pytest.mark.usefixtures("kubectl")
def test_kubectl_gets_the_kubernetes_service(first: MasterProcess) -> None:
    with client_for(first.kubeconfig) as api:
        wait_for(lambda: holds(api, ADVERTISED), what="the master in the endpoints")
    result = run_kubectl(first.kubeconfig, "get", "svc", "kubernetes")
    assert result.returncode == 0, result.stderr
    header, row = result.stdout.splitlines()
    assert header.split()[:5] == ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)"]
    assert row.split()[:5] == ["kubernetes", "ClusterIP", "172.30.0.1", "<none>", "443/TCP"]
    result = run_kubectl(first.kubeconfig, "get", "endpoints", "kubernetes")
    assert result.returncode == 0, result.stderr
    assert f"{ADVERTISED}:{PORT}" in result.stdout


def test_a_bad_advertise_address_names_the_flag(tmp_path: Path) -> None:
    for value, why in (("127.0.0.1", "loopback"), ("not-an-ip", "does not appear")):
        result = subprocess.run(
            [*MASTER, "--state-dir", str(tmp_path), "--advertise-address", value],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode != 0, result.stdout
        assert "Invalid value for --advertise-address" in result.stderr, result.stderr
        assert why in result.stderr, result.stderr
