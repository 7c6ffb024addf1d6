"""Issue 19, finding 6: what the controllers' token could do, tried against a real master.

Each test replays an attack made with the controllers' identity (group
``system:podnet:controllers``) and checks that the master refuses it (403) and that
nothing changed, while the master's own controllers, which act as that identity too,
still keep Endpoints and EndpointSlices and clear deleted Namespaces.
"""

from __future__ import annotations

from typing import Any

import httpx

from podnet.api.auth import ensure_controllers_token
from podnet.testing.api import client_for, pod
from podnet.testing.e2e import wait_for
from podnet.testing.processes import MasterProcess

SLICES = "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
POLICIES = "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies"
MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
SERVICE_NAME = "kubernetes.io/service-name"
OUTSIDE = "203.0.113.9"  # the attacker's host, outside the cluster
POD_IP = "10.128.0.5"


def controllers_client(master: MasterProcess) -> httpx.Client:
    token = ensure_controllers_token(master.state_dir / "tokens.csv", "stolen")
    return client_for(master.kubeconfig, token=token)


def namespace(admin: httpx.Client, name: str) -> None:
    answer = admin.post("/api/v1/namespaces", json={"metadata": {"name": name}})
    assert answer.status_code == 201, answer.text


def serving_pod(admin: httpx.Client, ns: str, name: str, ip: str) -> None:
    """A pod labelled app=web with address ``ip``, Ready (written as the admin)."""
    made = admin.post(f"/api/v1/namespaces/{ns}/pods", json=pod(name, ns, labels={"app": "web"}))
    assert made.status_code == 201, made.text
    body = made.json()
    body["status"] = {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    answer = admin.put(f"/api/v1/namespaces/{ns}/pods/{name}/status", json=body)
    assert answer.status_code == 200, answer.text


def web_service(admin: httpx.Client, ns: str) -> None:
    spec = {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}
    answer = admin.post(
        f"/api/v1/namespaces/{ns}/services", json={"metadata": {"name": "web"}, "spec": spec}
    )
    assert answer.status_code == 201, answer.text


def managed_slice(admin: httpx.Client, ns: str) -> dict[str, Any]:
    """The endpoints controller's slice of ``ns/web``, once it holds the pod's address."""

    def written() -> dict[str, Any] | None:
        answer = admin.get(SLICES.format(ns=ns), params={"labelSelector": f"{SERVICE_NAME}=web"})
        for item in answer.json().get("items", []):
            addresses = {a for e in item.get("endpoints") or [] for a in e["addresses"]}
            if POD_IP in addresses:
                return dict(item)
        return None

    return dict(wait_for(written, 30, "the endpoints controller's slice of web"))


def injected_slice(managed_by: str) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "web-mitm",
            "labels": {SERVICE_NAME: "web", MANAGED_BY: managed_by},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [OUTSIDE], "conditions": {"ready": True}}],
        "ports": [{"name": "", "port": 8080, "protocol": "TCP"}],
    }


def test_the_controllers_token_cannot_redirect_a_services_traffic(master: MasterProcess) -> None:
    """The CVE-2020-8554 pattern: an EndpointSlice (or Endpoints) for default/web that
    sends its connections to an outside host. Refused however it is labelled, as a new
    slice or as an edit of the controller's own; the controller's slice is unchanged."""
    with client_for(master.kubeconfig) as admin, controllers_client(master) as stolen:
        serving_pod(admin, "default", "web-1", POD_IP)
        web_service(admin, "default")
        before = managed_slice(admin, "default")  # the in-process controller still works
        for managed_by in ("endpointslice-controller.k8s.io", "attacker", ""):
            answer = stolen.post(SLICES.format(ns="default"), json=injected_slice(managed_by))
            assert answer.status_code == 403, answer.text
        edited = {**before, "endpoints": [*before["endpoints"], {"addresses": [OUTSIDE]}]}
        answer = stolen.put(
            f"{SLICES.format(ns='default')}/{before['metadata']['name']}", json=edited
        )
        assert answer.status_code == 403, answer.text
        assert "no pod's in namespace default" in answer.json()["message"]
        endpoints = admin.get("/api/v1/namespaces/default/endpoints/web").json()
        endpoints["subsets"][0]["addresses"].append({"ip": OUTSIDE})
        answer = stolen.put("/api/v1/namespaces/default/endpoints/web", json=endpoints)
        assert answer.status_code == 403, answer.text
        after = admin.get(f"{SLICES.format(ns='default')}/{before['metadata']['name']}").json()
        assert after["endpoints"] == before["endpoints"]
        assert admin.get(f"{SLICES.format(ns='default')}/web-mitm").status_code == 404


def test_the_controllers_token_cannot_delete_in_a_live_namespace(master: MasterProcess) -> None:
    """Deleting a NetworkPolicy (and isolation with it), a pod or a Service of a live
    namespace: 403, and each is still there. Once the Namespace is deleted, the master's
    controllers (the same identity) clear it."""
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "isolate"},
        "spec": {"podSelector": {}},
    }
    with client_for(master.kubeconfig) as admin, controllers_client(master) as stolen:
        namespace(admin, "tenant-a")
        answer = admin.post(POLICIES.format(ns="tenant-a"), json=policy)
        assert answer.status_code == 201, answer.text
        made = admin.post("/api/v1/namespaces/tenant-a/pods", json=pod("a1", "tenant-a"))
        assert made.status_code == 201, made.text
        web_service(admin, "tenant-a")
        for path in (
            f"{POLICIES.format(ns='tenant-a')}/isolate",
            "/api/v1/namespaces/tenant-a/pods/a1",
            "/api/v1/namespaces/tenant-a/services/web",
        ):
            answer = stolen.delete(path)
            assert answer.status_code == 403, answer.text
            assert "only in a namespace that is terminating" in answer.json()["message"]
            assert admin.get(path).status_code == 200, f"{path} was deleted"
        assert admin.delete("/api/v1/namespaces/tenant-a/pods/a1").status_code in (200, 202)
        assert admin.delete("/api/v1/namespaces/tenant-a").status_code in (200, 202)

        def cleared() -> bool:
            return admin.get(f"{POLICIES.format(ns='tenant-a')}/isolate").status_code == 404

        wait_for(cleared, 30, "the namespace controller to delete the terminating one's policy")
