"""Issue 8, finding 2: what a node's own token could do, tried against a real master.

Each test replays one attack from the issue with a node token and checks that the master
refuses it and that nothing changed.
"""

from __future__ import annotations

import concurrent.futures
import ipaddress
from typing import Any

import httpx
import pytest

from podnet.api.auth import ensure_node_token
from podnet.testing.api import client_for, node, pod
from podnet.testing.e2e import wait_for
from podnet.testing.processes import MasterProcess

MERGE = {"Content-Type": "application/merge-patch+json"}
PODS = "/api/v1/namespaces/default/pods"
HS = "/apis/network.openshift.io/v1/hostsubnets"
MIRROR = "kubernetes.io/config.mirror"


def node_client(master: MasterProcess, name: str) -> httpx.Client:
    return client_for(
        master.kubeconfig, token=ensure_node_token(master.state_dir / "tokens.csv", name)
    )


def mirror_pod(name: str, node_name: str, **meta: Any) -> dict[str, Any]:
    body = pod(name, node_name=node_name)
    body["metadata"] = {"name": name, "annotations": {MIRROR: "x"}, **meta}
    return body


def wait_hostsubnet(api: httpx.Client, name: str, timeout: float = 20.0) -> dict[str, Any]:
    def allocated() -> dict[str, Any] | None:
        answer = api.get(f"{HS}/{name}")
        return (
            dict(answer.json())
            if answer.status_code == 200 and answer.json().get("subnet")
            else None
        )

    return dict(wait_for(allocated, timeout, f"a HostSubnet for {name}"))


def register(master: MasterProcess, name: str, ip: str) -> dict[str, Any]:
    """Register a Node with its own token, as the agent does, and wait for its subnet."""
    with node_client(master, name) as api:
        answer = api.post("/api/v1/nodes", json=node(name, ip))
        assert answer.status_code == 201, answer.text
    with client_for(master.kubeconfig) as admin:
        return wait_hostsubnet(admin, name)


def host(subnet: str, index: int) -> str:
    return str(ipaddress.ip_network(subnet)[index])


def test_node_cannot_relabel_its_own_pod(master: MasterProcess) -> None:
    """Finding: a node relabelled its own pod into a policy's allowed set."""
    register(master, "n1", "192.0.2.1")
    with client_for(master.kubeconfig) as admin:
        created = admin.post(PODS, json=pod("web", node_name="n1", labels={"role": "denied"}))
        assert created.status_code == 201
    relabel = {"metadata": {"labels": {"role": "allowed"}}}
    with node_client(master, "n1") as n1:
        patched = n1.patch(f"{PODS}/web", json=relabel, headers=MERGE)
        assert patched.status_code == 403, patched.text
        assert "pods/status" in patched.json()["message"]
        whole = n1.get(f"{PODS}/web").json()
        whole["metadata"]["labels"] = {"role": "allowed"}
        assert n1.put(f"{PODS}/web", json=whole).status_code == 403
        # Through the status subresource the labels are ignored, as in Kubernetes.
        status = {**relabel, "status": {"phase": "Running"}}
        answer = n1.patch(f"{PODS}/web/status", json=status, headers=MERGE)
        assert answer.status_code == 200, answer.text
    with client_for(master.kubeconfig) as admin:
        stored = admin.get(f"{PODS}/web").json()
    assert stored["metadata"]["labels"] == {"role": "denied"}
    assert stored["status"]["phase"] == "Running"


def test_node_creates_only_unlabelled_mirror_pods_bound_to_itself(master: MasterProcess) -> None:
    """Finding: a node created pods with arbitrary labels."""
    with node_client(master, "n1") as n1:
        labelled = mirror_pod("a", "n1", labels={"role": "allowed"})
        answer = n1.post(PODS, json=labelled)
        assert answer.status_code == 403 and "labels" in answer.json()["message"]
        plain = n1.post(PODS, json=pod("b", node_name="n1"))
        assert plain.status_code == 403 and MIRROR in plain.json()["message"]
        elsewhere = n1.post(PODS, json=mirror_pod("c", "n2"))
        assert elsewhere.status_code == 403
        owned = mirror_pod(
            "d",
            "n1",
            ownerReferences=[{"apiVersion": "v1", "kind": "Deployment", "name": "x", "uid": "1"}],
        )
        assert n1.post(PODS, json=owned).status_code == 403
        assert n1.post(PODS, json=mirror_pod("ok", "n1")).status_code == 201
        assert n1.delete(f"{PODS}/ok").status_code == 200
    with client_for(master.kubeconfig) as admin:
        names = [p["metadata"]["name"] for p in admin.get(PODS).json()["items"]]
    assert names == []


def test_node_cannot_take_another_pods_ip(master: MasterProcess) -> None:
    """Finding: a node set a podIP that belongs to another node's pod."""
    hs1 = register(master, "n1", "192.0.2.1")
    hs2 = register(master, "n2", "192.0.2.2")
    theirs, mine = host(hs2["subnet"], 5), host(hs1["subnet"], 5)
    with client_for(master.kubeconfig) as admin:
        for name, bound in (("theirs", "n2"), ("mine", "n1"), ("other", "n1")):
            assert admin.post(PODS, json=pod(name, node_name=bound)).status_code == 201
    with node_client(master, "n2") as n2:
        status = {"status": {"podIP": theirs, "podIPs": [{"ip": theirs}], "hostIP": "192.0.2.2"}}
        assert n2.patch(f"{PODS}/theirs/status", json=status, headers=MERGE).status_code == 200
    with node_client(master, "n1") as n1:
        stolen = {"status": {"podIP": theirs, "podIPs": [{"ip": theirs}]}}
        answer = n1.patch(f"{PODS}/mine/status", json=stolen, headers=MERGE)
        assert answer.status_code == 403 and "HostSubnet" in answer.json()["message"]
        wrong_host = {"status": {"podIP": mine, "hostIP": "192.0.2.2"}}
        assert n1.patch(f"{PODS}/mine/status", json=wrong_host, headers=MERGE).status_code == 403
        good = {"status": {"podIP": mine, "podIPs": [{"ip": mine}], "hostIP": "192.0.2.1"}}
        assert n1.patch(f"{PODS}/mine/status", json=good, headers=MERGE).status_code == 200
        twice = n1.patch(f"{PODS}/other/status", json=good, headers=MERGE)
        assert twice.status_code == 409 and "default/mine" in twice.json()["message"]
        assert n1.patch(f"{PODS}/theirs/status", json=good, headers=MERGE).status_code == 403
    with client_for(master.kubeconfig) as admin:
        ips = {
            p["metadata"]["name"]: p.get("status", {}).get("podIP")
            for p in admin.get(PODS).json()["items"]
        }
    assert ips == {"theirs": theirs, "mine": mine, "other": None}


@pytest.mark.parametrize(
    "label",
    [
        "node-restriction.kubernetes.io/trusted",
        "team.node-restriction.kubernetes.io/x",
        "kubernetes.io/made-up",
    ],
)
def test_node_cannot_set_restricted_labels(master: MasterProcess, label: str) -> None:
    """Finding: a node set ``node-restriction.kubernetes.io/`` labels on its Node."""
    with node_client(master, "n1") as n1:
        body = node("n1", "192.0.2.1")
        body["metadata"]["labels"] = {label: "yes"}
        assert n1.post("/api/v1/nodes", json=body).status_code == 403
        ok = node("n1", "192.0.2.1")
        ok["metadata"]["labels"] = {"kubernetes.io/hostname": "n1", "rack": "r1"}
        assert n1.post("/api/v1/nodes", json=ok).status_code == 201
        add = {"metadata": {"labels": {label: "yes"}}}
        answer = n1.patch("/api/v1/nodes/n1", json=add, headers=MERGE)
        assert answer.status_code == 403 and label in answer.json()["message"]
    with client_for(master.kubeconfig) as admin:
        assert admin.patch("/api/v1/nodes/n1", json=add, headers=MERGE).status_code == 200
    with node_client(master, "n1") as n1:
        remove = {"metadata": {"labels": {label: None}}}
        assert n1.patch("/api/v1/nodes/n1", json=remove, headers=MERGE).status_code == 403
        taint = {"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}
        assert n1.patch("/api/v1/nodes/n1", json=taint, headers=MERGE).status_code == 403
    with client_for(master.kubeconfig) as admin:
        labels = admin.get("/api/v1/nodes/n1").json()["metadata"]["labels"]
    assert labels == {"kubernetes.io/hostname": "n1", "rack": "r1", label: "yes"}


def test_node_cannot_register_with_another_nodes_ip(master: MasterProcess) -> None:
    """Finding: a node registered with another node's IP (a second HostSubnet, same hostIP)."""
    register(master, "n1", "192.0.2.1")
    with node_client(master, "n2") as n2:
        answer = n2.post("/api/v1/nodes", json=node("n2", "192.0.2.1"))
        assert answer.status_code == 422, answer.text
        assert "192.0.2.1 is already used by n1" in answer.json()["message"]
        assert n2.post("/api/v1/nodes", json=node("n2", "192.0.2.2")).status_code == 201
        moved = {"status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.1"}]}}
        again = n2.patch("/api/v1/nodes/n2/status", json=moved, headers=MERGE)
        assert again.status_code == 422, again.text
    with client_for(master.kubeconfig) as admin:
        wait_hostsubnet(admin, "n2")
        host_ips = [h["hostIP"] for h in admin.get(HS).json()["items"]]
        assert sorted(host_ips) == ["192.0.2.1", "192.0.2.2"]
        twin = {
            "metadata": {"name": "x"},
            "host": "x",
            "hostIP": "192.0.2.1",
            "subnet": "10.131.254.0/23",
        }
        assert admin.post(HS, json=twin).status_code == 422


def test_concurrent_registrations_with_one_ip_have_one_winner(master: MasterProcess) -> None:
    """The IP claim is in the Node's own transaction: racing registrations cannot both win."""
    names = [f"racer{i}" for i in range(8)]
    tokens = {n: ensure_node_token(master.state_dir / "tokens.csv", n) for n in names}

    def attempt(name: str) -> int:
        with client_for(master.kubeconfig, token=tokens[name]) as api:
            return api.post("/api/v1/nodes", json=node(name, "192.0.2.77")).status_code

    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        codes = list(pool.map(attempt, names))
    assert sorted(codes) == [201] + [422] * 7
    with client_for(master.kubeconfig) as admin:
        assert len(admin.get("/api/v1/nodes").json()["items"]) == 1


def test_node_uses_only_its_own_lease(master: MasterProcess) -> None:
    leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"

    def lease(name: str) -> dict[str, Any]:
        spec = {"holderIdentity": name, "leaseDurationSeconds": 40}
        return {"metadata": {"name": name, "namespace": "kube-node-lease"}, "spec": spec}

    with client_for(master.kubeconfig) as admin:
        assert admin.post(leases, json=lease("n2")).status_code == 201
    with node_client(master, "n1") as n1:
        assert n1.post(leases, json=lease("n1")).status_code == 201
        own = n1.get(f"{leases}/n1")
        assert own.status_code == 200
        assert n1.put(f"{leases}/n1", json=own.json()).status_code == 200
        assert n1.post(leases, json=lease("n3")).status_code == 403
        assert n1.get(f"{leases}/n2").status_code == 403
        assert n1.put(f"{leases}/n2", json=lease("n2")).status_code == 403
        assert n1.delete(f"{leases}/n2").status_code == 403
        assert n1.get(leases).status_code == 403
        elsewhere = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
        assert (
            n1.post(elsewhere, json={**lease("n1"), "metadata": {"name": "n1"}}).status_code == 403
        )


def test_node_cannot_take_the_controllers_lease_or_finalize(master: MasterProcess) -> None:
    """The out-of-process controllers' lock and the finalize subresource are not a node's."""
    leases = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
    lock = {
        "metadata": {"name": "podnet-controllers", "namespace": "kube-system"},
        "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 15},
    }
    namespace = {"metadata": {"name": "victim"}, "spec": {"finalizers": ["kubernetes"]}}
    with client_for(master.kubeconfig) as admin:
        assert admin.post("/api/v1/namespaces", json=namespace).status_code == 201
    with node_client(master, "n1") as n1:
        assert n1.post(leases, json=lock).status_code == 403
        assert n1.get(f"{leases}/podnet-controllers").status_code == 403
        assert n1.put(f"{leases}/podnet-controllers", json=lock).status_code == 403
        finalize = "/api/v1/namespaces/victim/finalize"
        assert n1.put(finalize, json={**namespace, "spec": {"finalizers": []}}).status_code == 403
    with client_for(master.kubeconfig) as admin:
        assert admin.get(f"{leases}/podnet-controllers").status_code == 404
        live = admin.get("/api/v1/namespaces/victim").json()
        assert live["spec"]["finalizers"] == ["kubernetes"]
