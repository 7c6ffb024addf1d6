"""CRUD, optimistic concurrency, selectors and patch against a real master on real etcd."""

from __future__ import annotations

import asyncio

import httpx

from podnet.testing.api import async_client_for, client_for, namespace, node, pod
from podnet.testing.e2e import wait_for
from podnet.testing.processes import MasterProcess

PODS = "/api/v1/namespaces/default/pods"


def test_create_get_list_update_delete(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        created = api.post(PODS, json=pod("web", labels={"app": "web"}))
        assert created.status_code == 201, created.text
        meta = created.json()["metadata"]
        assert meta["uid"] and meta["creationTimestamp"] and meta["generation"] == 1
        assert int(meta["resourceVersion"]) > 0

        got = api.get(f"{PODS}/web").json()
        assert got["metadata"]["uid"] == meta["uid"]
        assert got["spec"]["containers"][0]["image"] == "busybox"

        listed = api.get(PODS).json()
        assert listed["kind"] == "PodList"
        assert [p["metadata"]["name"] for p in listed["items"]] == ["web"]
        assert int(listed["metadata"]["resourceVersion"]) >= int(meta["resourceVersion"])

        got["spec"]["containers"][0]["image"] = "busybox:2"
        updated = api.put(f"{PODS}/web", json=got)
        assert updated.status_code == 200, updated.text
        assert updated.json()["metadata"]["generation"] == 2
        assert int(updated.json()["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])

        deleted = api.delete(f"{PODS}/web")
        assert deleted.status_code == 200
        missing = api.get(f"{PODS}/web")
        assert missing.status_code == 404
        assert missing.json()["kind"] == "Status" and missing.json()["reason"] == "NotFound"
        assert api.delete(f"{PODS}/web").status_code == 404


def test_create_twice_is_already_exists(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        assert api.post("/api/v1/namespaces", json=namespace("dup")).status_code == 201
        again = api.post("/api/v1/namespaces", json=namespace("dup"))
        assert again.status_code == 409
        assert again.json()["reason"] == "AlreadyExists"


def test_stale_update_is_conflict(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        first = api.post(PODS, json=pod("p")).json()
        fresh = dict(first, metadata={**first["metadata"], "labels": {"v": "1"}})
        assert api.put(f"{PODS}/p", json=fresh).status_code == 200
        stale = dict(first, metadata={**first["metadata"], "labels": {"v": "2"}})
        answer = api.put(f"{PODS}/p", json=stale)
        assert answer.status_code == 409
        assert answer.json()["reason"] == "Conflict"
        assert api.get(f"{PODS}/p").json()["metadata"]["labels"] == {"v": "1"}


def test_merge_patch(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        api.post(PODS, json=pod("m", labels={"a": "1", "b": "2"}))
        patch = {"metadata": {"labels": {"a": None, "c": "3"}, "annotations": {"x": "y"}}}
        answer = api.patch(
            f"{PODS}/m", json=patch, headers={"Content-Type": "application/merge-patch+json"}
        )
        assert answer.status_code == 200, answer.text
        meta = api.get(f"{PODS}/m").json()["metadata"]
        assert meta["labels"] == {"b": "2", "c": "3"}
        assert meta["annotations"] == {"x": "y"}
        wrong_type = api.patch(f"{PODS}/m", content=b"{}", headers={"Content-Type": "text/plain"})
        assert wrong_type.status_code == 415


def test_label_and_field_selectors(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        api.post("/api/v1/namespaces", json=namespace("other"))
        api.post(PODS, json=pod("a1", labels={"app": "a", "tier": "fe"}, node_name="n1"))
        api.post(PODS, json=pod("a2", labels={"app": "a", "tier": "be"}, node_name="n2"))
        api.post(PODS, json=pod("b1", labels={"app": "b"}, node_name="n1"))
        api.post("/api/v1/namespaces/other/pods", json=pod("o1", "other", "n1", {"app": "a"}))

        def names(path: str, **params: str) -> list[str]:
            answer = api.get(path, params=params)
            assert answer.status_code == 200, answer.text
            return sorted(p["metadata"]["name"] for p in answer.json()["items"])

        assert names(PODS, labelSelector="app=a") == ["a1", "a2"]
        assert names(PODS, labelSelector="app=a,tier!=fe") == ["a2"]
        assert names(PODS, labelSelector="tier in (fe,be)") == ["a1", "a2"]
        assert names(PODS, labelSelector="!tier") == ["b1"]
        assert names("/api/v1/pods", fieldSelector="spec.nodeName=n1") == ["a1", "b1", "o1"]
        assert names("/api/v1/pods", fieldSelector="metadata.namespace=other") == ["o1"]
        assert names(PODS, fieldSelector="metadata.name=a2") == ["a2"]
        bad = api.get(PODS, params={"fieldSelector": "spec.image=x"})
        assert bad.status_code == 400 and "spec.image" in bad.json()["message"]
        bad = api.get(PODS, params={"labelSelector": "a in (b"})
        assert bad.status_code == 400


async def test_fifty_concurrent_creates_exactly_one_wins(master: MasterProcess) -> None:
    async with async_client_for(master.kubeconfig) as api:
        answers = await asyncio.gather(
            *(api.post("/api/v1/nodes", json=node("racer", f"192.0.2.{i + 1}")) for i in range(50))
        )
        codes = sorted(a.status_code for a in answers)
        assert codes.count(201) == 1
        assert codes.count(409) == 49
        listed = (await api.get("/api/v1/nodes")).json()["items"]
        assert [n["metadata"]["name"] for n in listed] == ["racer"]


def test_namespaced_create_needs_the_namespace(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        answer = api.post("/api/v1/namespaces/nowhere/pods", json=pod("x", "nowhere"))
        assert answer.status_code == 404
        assert "nowhere" in answer.json()["message"]


def test_discovery_health_version_metrics(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        assert api.get("/api").json()["versions"] == ["v1"]
        groups = {g["name"] for g in api.get("/apis").json()["groups"]}
        assert {"network.openshift.io", "networking.k8s.io"} <= groups
        core = {r["name"] for r in api.get("/api/v1").json()["resources"]}
        assert {"namespaces", "nodes", "pods", "services", "endpoints", "pods/status"} <= core
        network = api.get("/apis/network.openshift.io/v1").json()["resources"]
        by_name = {r["name"]: r for r in network}
        assert by_name["hostsubnets"]["namespaced"] is False
        assert by_name["egressnetworkpolicies"]["namespaced"] is True
        assert api.get("/apis/nope.example.com/v1").status_code == 404
        assert api.get("/version").json()["major"] == "1"
        assert api.get("/healthz").text == "ok"
        assert api.get("/readyz").status_code == 200
        api.get(PODS)
        metrics = api.get("/metrics").text
        assert "podnet_apiserver_requests_total" in metrics


def test_tokens_are_required(master: MasterProcess) -> None:
    with client_for(master.kubeconfig, token=None) as anonymous:
        answer = anonymous.get(PODS)
        assert answer.status_code == 401
        assert answer.json()["reason"] == "Unauthorized"
        assert anonymous.get("/healthz").status_code == 200
    with client_for(master.kubeconfig, token="not-a-real-token") as forged:
        assert forged.get(PODS).status_code == 401
    with httpx.Client(base_url=master.server, verify=False) as raw:
        assert raw.get("/api/v1/nodes").status_code == 401


def test_namespace_delete_terminates_then_finalizes(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        api.post("/api/v1/namespaces", json=namespace("doomed"))
        api.post("/api/v1/namespaces/doomed/pods", json=pod("inside", "doomed"))
        answer = api.delete("/api/v1/namespaces/doomed")
        assert answer.status_code == 200
        assert answer.json()["status"]["phase"] == "Terminating"
        late = api.post("/api/v1/namespaces/doomed/pods", json=pod("late", "doomed"))
        assert late.status_code in (403, 404)
        doomed = "/api/v1/namespaces/doomed"
        wait_for(lambda: api.get(doomed).status_code == 404, 20, "the namespace's finalizing")
        assert api.get("/api/v1/namespaces/doomed/pods").json()["items"] == []
        assert api.delete("/api/v1/namespaces/default").status_code == 403
