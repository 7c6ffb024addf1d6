"""Node tokens, and garbage in: always a 4xx Status with a message, never a 500 or a write."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from podnet.api.auth import ensure_node_token
from podnet.store.etcd_process import EtcdProcess
from podnet.testing.api import client_for, node, pod
from podnet.testing.processes import MasterProcess, launch_master

HS = "/apis/network.openshift.io/v1/hostsubnets"


def node_token(master: MasterProcess, name: str) -> str:
    return ensure_node_token(master.state_dir / "tokens.csv", name)


def test_node_token_may_touch_only_its_own_node(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as admin:
        assert admin.post("/api/v1/nodes", json=node("n2", "192.0.2.2")).status_code == 201
    with client_for(master.kubeconfig, token=node_token(master, "n1")) as n1:
        assert n1.post("/api/v1/nodes", json=node("n1", "192.0.2.1")).status_code == 201
        own = n1.patch(
            "/api/v1/nodes/n1",
            json={"metadata": {"labels": {"a": "b"}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert own.status_code == 200
        other = n1.patch(
            "/api/v1/nodes/n2",
            json={"metadata": {"labels": {"a": "b"}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert other.status_code == 403
        assert other.json()["reason"] == "Forbidden"
        assert "n2" in other.json()["message"]
        assert n1.delete("/api/v1/nodes/n2").status_code == 403
        assert n1.post("/api/v1/nodes", json=node("n3", "192.0.2.3")).status_code == 403
        assert n1.get("/api/v1/nodes").status_code == 200
        assert n1.get(HS).status_code == 200
        assert n1.post("/api/v1/namespaces", json={"metadata": {"name": "x"}}).status_code == 403
        mirror = pod("p1", node_name="n1")
        mirror["metadata"] = {"name": "p1", "annotations": {"kubernetes.io/config.mirror": "x"}}
        mine = n1.post("/api/v1/namespaces/default/pods", json=mirror)
        assert mine.status_code == 201, mine.text
        theirs = n1.post("/api/v1/namespaces/default/pods", json=pod("p2", node_name="n2"))
        assert theirs.status_code == 403
    with client_for(master.kubeconfig) as admin:
        assert "labels" not in admin.get("/api/v1/nodes/n2").json()["metadata"]


@pytest.mark.parametrize(
    ("body", "content_type", "code", "words"),
    [
        (b"{not json", "application/json", 400, "not valid JSON"),
        (b"[1, 2, 3]", "application/json", 400, "JSON object"),
        (b"", "application/json", 400, "empty"),
        (b"a: [b", "application/yaml", 400, "not valid YAML"),
        (b"<xml/>", "application/xml", 415, "unknown format"),
        (
            json.dumps(
                {
                    "metadata": {"name": "x"},
                    "host": "x",
                    "hostIP": "1.2.3.4",
                    "subnet": "10.128.0.0/23",
                    "bogus": 1,
                }
            ).encode(),
            "application/json",
            422,
            "bogus",
        ),
        (
            json.dumps(
                {"metadata": {"name": "x"}, "host": "x", "hostIP": 5, "subnet": "10.128.0.0/23"}
            ).encode(),
            "application/json",
            422,
            "hostIP",
        ),
        (
            json.dumps(
                {
                    "metadata": {"name": "x"},
                    "host": "x",
                    "hostIP": "1.2.3.4",
                    "subnet": "10.128.0.0/33",
                }
            ).encode(),
            "application/json",
            422,
            "subnet",
        ),
        (
            json.dumps(
                {
                    "metadata": {"name": "Bad_Name"},
                    "host": "Bad_Name",
                    "hostIP": "1.2.3.4",
                    "subnet": "10.128.0.0/23",
                }
            ).encode(),
            "application/json",
            422,
            "name",
        ),
        (
            json.dumps({"kind": "Pod", "metadata": {"name": "x"}}).encode(),
            "application/json",
            400,
            "Pod",
        ),
    ],
)
def test_garbage_is_refused_with_a_message(
    master: MasterProcess, body: bytes, content_type: str, code: int, words: str
) -> None:
    with client_for(master.kubeconfig) as api:
        answer = api.post(HS, content=body, headers={"Content-Type": content_type})
        assert answer.status_code == code, answer.text
        status = answer.json()
        assert status["kind"] == "Status" and status["code"] == code
        assert words in status["message"]
        assert api.get(HS).json()["items"] == []


def test_huge_body_is_refused(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        huge = {"metadata": {"name": "x", "annotations": {"a": "x" * (4 * 1024 * 1024)}}}
        answer = api.post("/api/v1/namespaces", json=huge)
        assert answer.status_code == 413
        assert api.get("/api/v1/namespaces/x").status_code == 404


def test_invalid_cluster_network_change_is_refused(master: MasterProcess) -> None:
    path = "/apis/network.openshift.io/v1/clusternetworks/default"
    with client_for(master.kubeconfig) as api:
        current = api.get(path).json()
        shrunk = json.loads(json.dumps(current))
        shrunk["clusterNetworks"][0]["CIDR"] = "10.128.0.0/16"
        answer = api.put(path, json=shrunk)
        assert answer.status_code == 422
        assert "clusterNetworks" in answer.json()["message"]
        moved = json.loads(json.dumps(current))
        moved["serviceNetwork"] = "172.31.0.0/16"
        assert api.put(path, json=moved).status_code == 422
        relength = json.loads(json.dumps(current))
        relength["clusterNetworks"][0]["hostSubnetLength"] = 8
        assert api.put(path, json=relength).status_code == 422
        assert api.get(path).json() == current


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
field_names = st.sampled_from(
    ["metadata", "host", "hostIP", "subnet", "egressIPs", "egressCIDRs", "apiVersion", "kind"]
)


@pytest.fixture(scope="module")
def fuzz_master(
    etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MasterProcess]:
    process = launch_master(etcd, tmp_path_factory.mktemp("fuzz"), "/podnet-fuzz/")
    try:
        yield process
    finally:
        process.stop()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=st.dictionaries(field_names, json_values, max_size=6))
def test_fuzzed_hostsubnets_never_cause_a_server_error(
    fuzz_master: MasterProcess, body: dict
) -> None:  # type: ignore[type-arg]
    with client_for(fuzz_master.kubeconfig) as api:
        answer = api.post(HS, json=body)
        assert answer.status_code < 500, answer.text
        if answer.status_code >= 400:
            status = answer.json()
            assert status["kind"] == "Status" and status["message"]
        else:
            api.delete(f"{HS}/{answer.json()['metadata']['name']}")


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.binary(max_size=200))
def test_fuzzed_bytes_never_cause_a_server_error(fuzz_master: MasterProcess, raw: bytes) -> None:
    with client_for(fuzz_master.kubeconfig) as api:
        answer = api.post(
            "/api/v1/namespaces", content=raw, headers={"Content-Type": "application/json"}
        )
        assert answer.status_code < 500, answer.text
        if answer.status_code == 201:
            api.delete(f"/api/v1/namespaces/{answer.json()['metadata']['name']}")
