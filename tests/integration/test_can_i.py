"""``kubectl auth can-i`` (kubectl 1.32) against the master, as the admin and as a node.

kubectl finds authorization.k8s.io through discovery and posts a SelfSubjectAccessReview
(or a SelfSubjectRulesReview for ``--list``) in protobuf; the answer comes from the same
rules that the API enforces.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from podnet.api.auth import ensure_proxy_token, ensure_router_token
from podnet.master import node_credentials
from podnet.testing.api import client_for
from podnet.testing.cli import run_kubectl
from podnet.testing.processes import MasterProcess

pytestmark = pytest.mark.usefixtures("kubectl")
SSAR = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


def can_i(kubeconfig: Path, *args: str) -> str:
    result = run_kubectl(kubeconfig, "auth", "can-i", *args)
    answer = result.stdout.strip().splitlines()[0] if result.stdout.strip() else ""
    assert answer.split(" ")[0] in ("yes", "no"), result.stderr
    assert (result.returncode == 0) == answer.startswith("yes")
    return answer.split(" ")[0]


NODE_ANSWERS = [
    (["update", "pods", "--subresource=status"], "yes"),
    (["create", "pods"], "yes"),  # mirror pods only, which admission then checks
    (["update", "pods"], "no"),
    (["patch", "pods"], "no"),
    (["delete", "pods"], "yes"),
    (["create", "nodes"], "yes"),
    (["update", "nodes/n1"], "yes"),
    (["update", "nodes/n2"], "no"),
    (["delete", "nodes/n1"], "no"),
    (["create", "events"], "yes"),
    (["list", "events"], "no"),
    (["get", "leases/n1", "-n", "kube-node-lease"], "yes"),
    (["get", "leases/n2", "-n", "kube-node-lease"], "no"),
    (["list", "leases", "-n", "kube-node-lease"], "no"),
    (["list", "hostsubnets"], "yes"),
    (["create", "hostsubnets"], "no"),
    (["delete", "namespaces"], "no"),
]


def test_can_i_as_a_node(master: MasterProcess, tmp_path: Path) -> None:
    kubeconfig = node_credentials(master.state_dir, "n1", master.server, tmp_path / "n1.kc")
    answers = [(args, can_i(kubeconfig, *args)) for args, _ in NODE_ANSWERS]
    assert answers == NODE_ANSWERS


@pytest.mark.parametrize(
    "args", [["update", "pods", "--subresource=status"], ["create", "nodes"], ["*", "*"]]
)
def test_can_i_as_the_admin(master: MasterProcess, args: list[str]) -> None:
    assert can_i(master.kubeconfig, *args) == "yes"


def test_can_i_list_shows_the_enforced_rules(master: MasterProcess, tmp_path: Path) -> None:
    kubeconfig = node_credentials(master.state_dir, "n1", master.server, tmp_path / "n1.kc")
    result = run_kubectl(kubeconfig, "auth", "can-i", "--list", "-n", "kube-node-lease")
    assert result.returncode == 0, result.stderr
    rows = {" ".join(line.split()) for line in result.stdout.splitlines()}
    assert "nodes [] [n1] [patch update]" in rows
    assert "pods/status [] [] [get list watch patch update]" in rows  # kubectl merges verbs
    assert "pods [] [] [get list watch create delete]" in rows
    assert "leases.coordination.k8s.io [] [n1] [delete get patch update]" in rows
    assert not any(row.startswith("events ") and "list" in row for row in rows)
    admin = run_kubectl(master.kubeconfig, "auth", "can-i", "--list")
    assert admin.returncode == 0 and "*.*" in admin.stdout


def test_access_review_json_for_proxy_and_router(master: MasterProcess) -> None:
    tokens = master.state_dir / "tokens.csv"

    def review(token: str, verb: str, resource: str, group: str = "", sub: str = "") -> bool:
        attrs = {"verb": verb, "resource": resource, "group": group, "subresource": sub}
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs},
        }
        with client_for(master.kubeconfig, token=token) as api:
            answer = api.post(SSAR, json=body)
        assert answer.status_code == 201, answer.text
        return bool(answer.json()["status"]["allowed"])

    proxy, router = ensure_proxy_token(tokens, "node1"), ensure_router_token(tokens, "r1")
    assert review(proxy, "watch", "endpointslices", "discovery.k8s.io")
    assert review(proxy, "list", "nodes")
    assert not review(proxy, "update", "services")
    assert not review(proxy, "list", "pods")
    assert review(router, "list", "routes", "route.openshift.io")
    assert review(router, "update", "routes", "route.openshift.io", "status")
    assert not review(router, "update", "routes", "route.openshift.io")
    assert not review(router, "list", "nodes")
    # The proxy's token really is refused a write, not only in the review.
    with client_for(master.kubeconfig, token=proxy) as api:
        assert api.get("/api/v1/services").status_code == 200
        assert api.get("/api/v1/pods").status_code == 403
        assert api.post("/api/v1/namespaces", json={"metadata": {"name": "x"}}).status_code == 403


def test_access_review_rejects_garbage(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        assert api.post(SSAR, json={"spec": {}}).status_code == 422
        assert api.post(SSAR, json={"kind": "Pod", "spec": {}}).status_code == 400
        assert api.post(SSAR, json=[1]).status_code == 400
        bad = {"spec": {"resourceAttributes": {"verb": 5, "resource": "pods"}}}
        assert api.post(SSAR, json=bad).status_code == 422
    with client_for(master.kubeconfig, token=None) as anonymous:
        assert anonymous.post(SSAR, json={"spec": {}}).status_code == 401


def test_discovery_lists_the_authorization_group(master: MasterProcess) -> None:
    with client_for(master.kubeconfig) as api:
        groups = [g["name"] for g in api.get("/apis").json()["groups"]]
        assert "authorization.k8s.io" in groups
        resources = api.get("/apis/authorization.k8s.io/v1").json()["resources"]
    assert {r["name"] for r in resources} == {"selfsubjectaccessreviews", "selfsubjectrulesreviews"}
