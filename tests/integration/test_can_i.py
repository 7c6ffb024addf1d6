"""``kubectl auth can-i`` (kubectl 1.32) against the master, as the admin, a node and the
controllers' own identity (and that identity's token refused what lies outside its rules).

kubectl finds authorization.k8s.io through discovery and posts a SelfSubjectAccessReview
(or a SelfSubjectRulesReview for ``--list``) in protobuf; the answer comes from the same
rules that the API enforces.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from podnet.api.auth import ensure_proxy_token, ensure_router_token
from podnet.kubeconfig import write_kubeconfig
from podnet.master import controllers_credentials, node_credentials
from podnet.testing.api import client_for
from podnet.testing.cli import DISCOVERY_ROWS, can_i_rows, run_kubectl
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


def _controllers_kubeconfig(master: MasterProcess, tmp_path: Path) -> tuple[Path, str]:
    """A kubeconfig with the controllers' own token (``podnet controllers-credentials``)."""
    token_file, ca_file = tmp_path / "controllers.token", tmp_path / "ca.pem"
    controllers_credentials(master.state_dir, "c1", token_file, ca_file)
    token = token_file.read_text().strip()
    kubeconfig = tmp_path / "controllers.kc"
    write_kubeconfig(kubeconfig, master.server, ca_file.read_bytes(), token, user="controllers")
    return kubeconfig, token


def test_can_i_list_as_the_controllers_shows_exactly_their_rules(
    master: MasterProcess, tmp_path: Path
) -> None:
    kubeconfig, _ = _controllers_kubeconfig(master, tmp_path)
    result = run_kubectl(kubeconfig, "auth", "can-i", "--list", "-n", "kube-system")
    assert result.returncode == 0, result.stderr
    assert can_i_rows(result.stdout) == DISCOVERY_ROWS | {
        "endpoints [] [] [create delete get list update watch]",
        "endpointslices.discovery.k8s.io [] [] [create delete get list update watch]",
        "hostsubnets.network.openshift.io [] [] [create delete get list update watch]",
        "netnamespaces.network.openshift.io [] [] [create delete get list update watch]",
        "clusternetworks.network.openshift.io [] [] [create get list update watch]",
        "namespaces [] [] [create get list watch]",
        "selfsubjectaccessreviews.authorization.k8s.io [] [] [create]",
        "selfsubjectrulesreviews.authorization.k8s.io [] [] [create]",
        "pods [] [] [delete list watch]",
        "services [] [] [delete list watch]",
        "events [] [] [delete list]",
        "egressnetworkpolicies.network.openshift.io [] [] [delete list]",
        "networkpolicies.networking.k8s.io [] [] [delete list]",
        "routes.route.openshift.io [] [] [delete list]",
        "nodes [] [] [get list watch]",
        "leases.coordination.k8s.io [] [podnet-controllers] [get update]",
        "leases.coordination.k8s.io [] [] [create delete list watch]",
        "namespaces/finalize [] [] [update]",
        "nodes/status [] [] [update]",
    }, result.stdout
    assert can_i(kubeconfig, "create", "events", "-n", "default") == "yes"
    assert can_i(kubeconfig, "create", "events", "-n", "shop") == "no"
    assert can_i(kubeconfig, "get", "leases/other-lock", "-n", "kube-system") == "no"
    assert can_i(kubeconfig, "*", "*") == "no"


def test_the_controllers_token_is_refused_everything_else(
    master: MasterProcess, tmp_path: Path
) -> None:
    _, token = _controllers_kubeconfig(master, tmp_path)
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    node = {"metadata": {"name": "n9"}}
    with client_for(master.kubeconfig) as admin:
        assert admin.post("/api/v1/namespaces", json={"metadata": {"name": "shop"}}).is_success
        assert admin.post("/api/v1/nodes", json=node).is_success
    with client_for(master.kubeconfig, token=token) as api:
        assert api.get("/api/v1/nodes").status_code == 200  # what it needs works
        assert api.get("/apis/network.openshift.io/v1/hostsubnets").status_code == 200
        refused = [
            api.post("/api/v1/namespaces/shop/pods", json=pod),
            api.get("/api/v1/namespaces/shop/pods/p"),
            api.put("/api/v1/nodes/n9", json=node),
            api.delete("/api/v1/nodes/n9"),
            api.delete("/api/v1/namespaces/shop"),
            api.delete("/apis/network.openshift.io/v1/clusternetworks/default"),
            api.post("/api/v1/namespaces/shop/services", json={"metadata": {"name": "s"}}),
            api.get("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n9"),
            api.get("/api/v1/namespaces/default/events/e1"),  # it lists them, reads none
            api.patch(
                "/api/v1/namespaces/shop/endpoints/web",
                json={},
                headers={"Content-Type": "application/merge-patch+json"},
            ),
        ]
    assert [answer.status_code for answer in refused] == [403] * len(refused)
    assert all("the controllers may not" in answer.text for answer in refused)
