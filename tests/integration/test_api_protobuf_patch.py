"""kubectl's typed commands (protobuf bodies) and the three patch formats, on a real master."""

from __future__ import annotations

import json
from typing import Any

import pytest

from podnet.testing.api import client_for, namespace, pod
from podnet.testing.cli import run_kubectl
from podnet.testing.processes import MasterProcess
from podnet.testing.protobuf import field, vfield

NS = "/api/v1/namespaces"
PODS = "/api/v1/namespaces/default/pods"
PROTOBUF = {"Content-Type": "application/vnd.kubernetes.protobuf"}
kubectl_only = pytest.mark.usefixtures("kubectl")


def envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    type_meta = field(1, api_version) + field(2, kind)
    return b"k8s\x00" + field(1, type_meta) + field(2, raw) + field(3, "") + field(4, "")


def namespace_pb(name: str, labels: dict[str, str]) -> bytes:
    entries = b"".join(field(11, field(1, k) + field(2, v)) for k, v in labels.items())
    meta = field(1, name) + field(2, "") + field(6, "") + field(8, b"") + entries
    return envelope("v1", "Namespace", field(1, meta) + field(2, b"") + field(3, b""))


@kubectl_only
def test_kubectl_create_namespace_and_label(master: MasterProcess) -> None:
    made = run_kubectl(master.kubeconfig, "create", "namespace", "made-by-kubectl")
    assert made.returncode == 0, made.stderr
    assert "namespace/made-by-kubectl created" in made.stdout
    labelled = run_kubectl(master.kubeconfig, "label", "namespace", "made-by-kubectl", "team=a")
    assert labelled.returncode == 0, labelled.stderr
    noted = run_kubectl(master.kubeconfig, "annotate", "namespace", "made-by-kubectl", "note=x")
    assert noted.returncode == 0, noted.stderr
    patched = run_kubectl(
        master.kubeconfig,
        "patch",
        "namespace",
        "made-by-kubectl",
        "--type=json",
        '-p=[{"op":"add","path":"/metadata/labels/tier","value":"web"}]',
    )
    assert patched.returncode == 0, patched.stderr
    shown = run_kubectl(master.kubeconfig, "get", "namespace", "made-by-kubectl", "-o", "json")
    meta = json.loads(shown.stdout)["metadata"]
    assert meta["labels"] == {"team": "a", "tier": "web"}
    assert meta["annotations"] == {"note": "x"}
    again = run_kubectl(master.kubeconfig, "create", "namespace", "made-by-kubectl")
    assert again.returncode != 0 and "AlreadyExists" in again.stderr


def test_protobuf_namespace_unknown_kind_and_garbage(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        body = namespace_pb("from-protobuf", {"team": "b"})
        created = api.post(NS, content=body, headers=PROTOBUF)
        assert created.status_code == 201, created.text
        meta = api.get(f"{NS}/from-protobuf").json()["metadata"]
        assert meta["labels"] == {"team": "b"} and "creationTimestamp" in meta
        unknown = api.post(PODS, content=envelope("v1", "Pod", b""), headers=PROTOBUF)
        assert unknown.status_code == 415
        assert "protobuf is not supported for Pod" in unknown.json()["message"]
        for garbage in (b"k8s\x00\x0a\xff", b"JSON", body[:-3], b"k8s\x00" + b"\xff" * 11):
            answer = api.post(NS, content=garbage, headers=PROTOBUF)
            assert answer.status_code == 400, (garbage, answer.text)
        names = {n["metadata"]["name"] for n in api.get(NS).json()["items"]}
        assert "from-protobuf" in names and len(names) == len(api.get(NS).json()["items"])


def _patch(api: Any, path: str, ctype: str, body: Any) -> Any:
    content = json.dumps(body)
    return api.patch(path, content=content, headers={"Content-Type": f"application/{ctype}"})


def test_json_patch(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        assert api.post(PODS, json=pod("jp", labels={"a": "1"})).status_code == 201
        ops = [
            {"op": "test", "path": "/metadata/labels/a", "value": "1"},
            {"op": "add", "path": "/metadata/labels/b", "value": "2"},
            {"op": "remove", "path": "/metadata/labels/a"},
        ]
        answer = _patch(api, f"{PODS}/jp", "json-patch+json", ops)
        assert answer.status_code == 200, answer.text
        assert answer.json()["metadata"]["labels"] == {"b": "2"}
        before = api.get(f"{PODS}/jp").json()
        failing = [
            [{"op": "test", "path": "/metadata/labels/b", "value": "nope"}],
            [{"op": "remove", "path": "/metadata/labels/missing"}],
            [{"op": "replace", "path": "/metadata", "value": "x"}],
            [{"op": "add", "path": "/metadata/resourceVersion", "value": "1"}],
        ]
        for ops in failing:
            assert _patch(api, f"{PODS}/jp", "json-patch+json", ops).status_code in (409, 422)
        for malformed in ({"op": "add"}, [{"path": "/x"}], [{"op": "jump", "path": "/x"}], [1]):
            assert _patch(api, f"{PODS}/jp", "json-patch+json", malformed).status_code == 400
        # Each copy doubles the object: refused long before memory runs out.
        bomb = [{"op": "add", "path": "/metadata/annotations", "value": {"a": "x" * 1000}}]
        bomb += [{"op": "copy", "from": "/metadata", "path": f"/metadata/m{i}"} for i in range(40)]
        assert _patch(api, f"{PODS}/jp", "json-patch+json", bomb).status_code in (400, 413, 422)
        assert api.get(f"{PODS}/jp").json() == before


def test_strategic_merge_patch(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        assert api.post(NS, json=namespace("smp", labels={"a": "1", "b": "2"})).status_code == 201
        patch = {"metadata": {"labels": {"a": None, "c": "3"}, "$setElementOrder/x": []}}
        answer = _patch(api, f"{NS}/smp", "strategic-merge-patch+json", patch)
        assert answer.status_code == 200, answer.text
        assert answer.json()["metadata"]["labels"] == {"b": "2", "c": "3"}
        replace = {"metadata": {"labels": {"$patch": "replace", "only": "this"}}}
        answer = _patch(api, f"{NS}/smp", "strategic-merge-patch+json", replace)
        assert answer.json()["metadata"]["labels"] == {"only": "this"}
        delete = {"metadata": {"labels": {"$patch": "delete"}}}
        answer = _patch(api, f"{NS}/smp", "strategic-merge-patch+json", delete)
        assert "labels" not in answer.json()["metadata"] or not answer.json()["metadata"]["labels"]
        bad = {"metadata": {"labels": {"$patch": "explode"}}}
        assert _patch(api, f"{NS}/smp", "strategic-merge-patch+json", bad).status_code == 422
        for wrong in ([1], "x", {"metadata": []}):
            answer = _patch(api, f"{NS}/smp", "merge-patch+json", wrong)
            assert answer.status_code in (400, 422), answer.text


SERVICE = """
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: default}}
spec:
  selector: {{app: web}}
  ports:
  - {{name: http, port: 80, targetPort: {http}}}
  - {{name: https, port: 443, targetPort: 8443}}
"""


@kubectl_only
def test_kubectl_apply_twice_merges_keyed_lists(master: MasterProcess) -> None:
    """Re-apply sends a strategic merge patch of the changed port only; both ports stay."""
    for target in (8080, 9090):
        done = run_kubectl(master.kubeconfig, "apply", "-f", "-", stdin=SERVICE.format(http=target))
        assert done.returncode == 0, done.stderr
    with client_for(master.kubeconfig) as api:
        ports = api.get("/api/v1/namespaces/default/services/web").json()["spec"]["ports"]
    assert [(p["name"], p["port"], p["targetPort"]) for p in ports] == [
        ("http", 80, 9090),
        ("https", 443, 8443),
    ]


@kubectl_only
def test_kubectl_create_service_clusterip(master: MasterProcess) -> None:
    """The Service arrives as protobuf; decoded, it meets the same validation as JSON."""
    made = run_kubectl(master.kubeconfig, "create", "service", "clusterip", "api", "--tcp=80:8080")
    assert made.returncode == 0, made.stderr  # its port is named "80-8080", a DNS label
    with client_for(master.kubeconfig) as api:
        spec = api.get("/api/v1/namespaces/default/services/api").json()["spec"]
    assert spec["selector"] == {"app": "api"} and spec["type"] == "ClusterIP"
    assert [(p["name"], p["port"], p["targetPort"], p["protocol"]) for p in spec["ports"]] == [
        ("80-8080", 80, 8080, "TCP")
    ]


def test_protobuf_service_with_int_or_string_ports(master: MasterProcess) -> None:
    target_int = vfield(1, 0) + vfield(2, 8080)
    target_name = vfield(1, 1) + field(3, "metrics")
    ports = field(1, field(1, "http") + field(2, "TCP") + vfield(3, 80) + field(4, target_int))
    ports += field(1, field(1, "stats") + field(2, "TCP") + vfield(3, 9000) + field(4, target_name))
    spec = ports + field(2, field(1, "app") + field(2, "web")) + field(4, "ClusterIP")
    raw = field(1, field(1, "pb-svc")) + field(2, spec)
    with client_for(master.kubeconfig) as api:
        services = "/api/v1/namespaces/default/services"
        created = api.post(services, content=envelope("v1", "Service", raw), headers=PROTOBUF)
        assert created.status_code == 201, created.text
        got = api.get(f"{services}/pb-svc").json()["spec"]
    assert got["selector"] == {"app": "web"} and got["type"] == "ClusterIP"
    assert [(p["name"], p["port"], p["targetPort"]) for p in got["ports"]] == [
        ("http", 80, 8080),
        ("stats", 9000, "metrics"),
    ]
