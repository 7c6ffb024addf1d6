"""The rule table, NodeRestriction, access reviews and the proxy and router identities."""

from __future__ import annotations

from typing import Any

import pytest

from podnet.api.access_review import access_review, rules_review
from podnet.api.authorizer import RequestAttributes, allowed_by_rules, authorize, rules_for
from podnet.api.identity import User
from podnet.api.noderestriction import MIRROR_ANNOTATION, forbidden_node_label
from podnet.model.errors import ApiError
from podnet.model.kinds import EVENT, HOST_SUBNET, NODE, POD, SERVICE, Kind

ADMIN = User("admin", ("system:masters",))
N1 = User("system:node:n1", ("system:nodes",))
PROXY = User("system:podnet:proxy:n1", ("system:podnet:proxies",))
ROUTER = User("system:podnet:router:r1", ("system:podnet:routers",))
NOBODY = User("alice", ())
# Kinds that later features add; the rules name them by (group, plural) already.
LEASE = Kind("coordination.k8s.io", "v1", "Lease", "leases", True)
ROUTE = Kind("route.openshift.io", "v1", "Route", "routes", True, subresources=("status",))
SLICE = Kind("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", True)
ENDPOINTS = Kind("", "v1", "Endpoints", "endpoints", True)


def req(
    verb: str,
    kind: Kind,
    name: str | None = None,
    *,
    ns: str | None = None,
    sub: str | None = None,
    new: dict[str, Any] | None = None,
    old: dict[str, Any] | None = None,
) -> RequestAttributes:
    return RequestAttributes(verb, kind, ns, name, sub, new, old)


def mirror(node: str = "n1", **meta: Any) -> dict[str, Any]:
    metadata = {"name": "p", "namespace": "ns", "annotations": {MIRROR_ANNOTATION: "h"}, **meta}
    return {"metadata": metadata, "spec": {"nodeName": node, "containers": [{"name": "c"}]}}


# ---- pods ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "words"),
    [
        (mirror(labels={"role": "db"}), "labels"),
        ({**mirror(), "metadata": {"name": "p"}}, MIRROR_ANNOTATION),
        (mirror("n2"), '"n2"'),
        (mirror(ownerReferences=[{"apiVersion": "v1", "kind": "Node", "name": "n2"}]), "owner"),
        (
            mirror(
                ownerReferences=[
                    {"apiVersion": "v1", "kind": "Node", "name": "n1", "controller": True},
                    {"apiVersion": "v1", "kind": "Node", "name": "n1", "controller": True},
                ]
            ),
            "owner",
        ),
        (
            mirror(
                ownerReferences=[
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": "n1",
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ]
            ),
            "blockOwnerDeletion",
        ),
        ({**mirror(), "spec": {"nodeName": "n1", "serviceAccountName": "x"}}, "service account"),
        (
            {**mirror(), "spec": {"nodeName": "n1", "volumes": [{"name": "v", "secret": {}}]}},
            "secrets",
        ),
    ],
)
def test_node_pod_create_refusals(pod: dict[str, Any], words: str) -> None:
    reason = authorize(N1, req("create", POD, ns="ns", new=pod))
    assert reason is not None and words in reason


def test_node_creates_an_owned_mirror_pod() -> None:
    owner = {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u", "controller": True}
    assert authorize(N1, req("create", POD, ns="ns", new=mirror(ownerReferences=[owner]))) is None
    assert authorize(N1, req("create", POD, ns="ns", new=mirror())) is None


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"labels": {"role": "allowed"}}, "labels"),
        ({"annotations": {"a": "b"}}, "annotations"),
        ({"ownerReferences": [{"name": "x"}]}, "ownerReferences"),
        ({"finalizers": ["x"]}, "finalizers"),
    ],
)
def test_status_write_may_change_nothing_but_status(change: dict[str, Any], words: str) -> None:
    old = mirror()
    new = {**old, "metadata": {**old["metadata"], **change}, "status": {"phase": "Running"}}
    reason = authorize(N1, req("update", POD, "p", ns="ns", sub="status", new=new, old=old))
    assert reason is not None and words in reason
    spec = {**old, "spec": {**old["spec"], "containers": []}}
    assert authorize(N1, req("patch", POD, "p", ns="ns", sub="status", new=spec, old=old))
    ok = {**old, "status": {"phase": "Running"}}
    assert authorize(N1, req("patch", POD, "p", ns="ns", sub="status", new=ok, old=old)) is None


# ---- nodes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("label", "forbidden"),
    [
        ("node-restriction.kubernetes.io/trusted", True),
        ("a.node-restriction.kubernetes.io/x", True),
        ("kubernetes.io/made-up", True),
        ("k8s.io/x", True),
        ("sub.k8s.io/x", True),
        ("kubernetes.io/hostname", False),
        ("topology.kubernetes.io/zone", False),
        ("node.kubernetes.io/anything", False),
        ("x.kubelet.kubernetes.io/y", False),
        ("rack", False),
        ("example.com/team", False),
    ],
)
def test_node_label_restrictions(label: str, forbidden: bool) -> None:
    assert forbidden_node_label(label) is forbidden
    new = {"metadata": {"name": "n1", "labels": {label: "v"}}}
    old = {"metadata": {"name": "n1"}}
    created = authorize(N1, req("create", NODE, new=new))
    added = authorize(N1, req("patch", NODE, "n1", new=new, old=old))
    removed = authorize(N1, req("patch", NODE, "n1", new=old, old=new))
    assert all((r is not None) is forbidden for r in (created, added, removed))
    assert authorize(ADMIN, req("patch", NODE, "n1", new=new, old=old)) is None


def test_node_may_not_change_its_taints() -> None:
    old = {"metadata": {"name": "n1"}, "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}}
    new = {"metadata": {"name": "n1"}, "spec": {}}
    reason = authorize(N1, req("update", NODE, "n1", new=new, old=old))
    assert reason is not None and "taints" in reason


# ---- leases and events -------------------------------------------------------------------


def lease(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "kube-node-lease"}}


@pytest.mark.parametrize("verb", ["get", "update", "patch", "delete"])
def test_node_uses_only_its_own_lease(verb: str) -> None:
    own = req(verb, LEASE, "n1", ns="kube-node-lease", new=lease("n1"), old=lease("n1"))
    assert authorize(N1, own) is None
    other = req(verb, LEASE, "n2", ns="kube-node-lease", new=lease("n2"), old=lease("n2"))
    assert authorize(N1, other) is not None
    elsewhere = req(verb, LEASE, "n1", ns="default", new=lease("n1"), old=lease("n1"))
    assert authorize(N1, elsewhere) is not None


def test_node_creates_only_its_own_lease_and_never_lists() -> None:
    assert authorize(N1, req("create", LEASE, ns="kube-node-lease", new=lease("n1"))) is None
    assert authorize(N1, req("create", LEASE, ns="kube-node-lease", new=lease("n2")))
    for verb in ("list", "watch", "deletecollection"):
        assert authorize(N1, req(verb, LEASE, ns="kube-node-lease")) is not None


def test_node_events_report_only_itself() -> None:
    forged = {"metadata": {"name": "e"}, "source": {"host": "n2"}}
    assert authorize(N1, req("create", EVENT, ns="ns", new=forged)) is not None
    own = {"metadata": {"name": "e"}, "source": {"host": "n1"}}
    assert authorize(N1, req("create", EVENT, ns="ns", new=own)) is None


# ---- proxy and router ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("user", "verb", "kind", "sub", "allowed"),
    [
        (PROXY, "list", SERVICE, None, True),
        (PROXY, "watch", ENDPOINTS, None, True),
        (PROXY, "watch", SLICE, None, True),
        (PROXY, "get", NODE, None, True),
        (PROXY, "update", SERVICE, None, False),
        (PROXY, "create", SLICE, None, False),
        (PROXY, "list", POD, None, False),
        (PROXY, "list", ROUTE, None, False),
        (ROUTER, "watch", ROUTE, None, True),
        (ROUTER, "list", SERVICE, None, True),
        (ROUTER, "get", ENDPOINTS, None, True),
        (ROUTER, "update", ROUTE, "status", True),
        (ROUTER, "patch", ROUTE, "status", True),
        (ROUTER, "update", ROUTE, None, False),
        (ROUTER, "create", ROUTE, None, False),
        (ROUTER, "delete", ROUTE, None, False),
        (ROUTER, "list", NODE, None, False),
        (ROUTER, "list", SLICE, None, True),  # the router may follow EndpointSlices
        (ROUTER, "create", SLICE, None, False),
    ],
)
def test_proxy_and_router_rules(
    user: User, verb: str, kind: Kind, sub: str | None, allowed: bool
) -> None:
    attrs = req(verb, kind, "x", ns="ns" if kind.namespaced else None, sub=sub, new={}, old={})
    assert (authorize(user, attrs) is None) is allowed


def test_a_user_without_a_role_may_only_ask() -> None:
    assert authorize(NOBODY, req("get", POD, "p", ns="ns")) is not None
    assert allowed_by_rules(
        NOBODY, "create", "authorization.k8s.io", "selfsubjectaccessreviews", None, None
    )


# ---- access reviews -----------------------------------------------------------------------


def ssar(**attrs: str) -> dict[str, Any]:
    return {"kind": "SelfSubjectAccessReview", "spec": {"resourceAttributes": attrs}}


@pytest.mark.parametrize(
    ("user", "attrs", "allowed"),
    [
        (N1, {"verb": "update", "resource": "pods", "subresource": "status"}, True),
        (N1, {"verb": "update", "resource": "pods"}, False),
        (N1, {"verb": "update", "resource": "nodes", "name": "n1"}, True),
        (N1, {"verb": "update", "resource": "nodes", "name": "n2"}, False),
        (N1, {"verb": "*", "resource": "*"}, False),
        (ADMIN, {"verb": "*", "resource": "*", "group": "*"}, True),
        (PROXY, {"verb": "list", "resource": "endpointslices", "group": "discovery.k8s.io"}, True),
    ],
)
def test_access_review_answers_from_the_rules(
    user: User, attrs: dict[str, str], allowed: bool
) -> None:
    answer = access_review(user, ssar(**attrs))
    assert answer["status"]["allowed"] is allowed
    assert answer["apiVersion"] == "authorization.k8s.io/v1"


def test_access_review_non_resource_and_errors() -> None:
    body = {"spec": {"nonResourceAttributes": {"path": "/version", "verb": "get"}}}
    assert access_review(N1, body)["status"]["allowed"] is True
    body["spec"]["nonResourceAttributes"]["verb"] = "post"
    assert access_review(N1, body)["status"]["allowed"] is False
    metrics = {"spec": {"nonResourceAttributes": {"path": "/metrics", "verb": "get"}}}
    assert access_review(N1, metrics)["status"]["allowed"] is False
    assert access_review(ADMIN, metrics)["status"]["allowed"] is True
    for bad, code in (([], 400), ({"spec": {}}, 422), (ssar(verb="get"), 422)):
        with pytest.raises(ApiError) as err:
            access_review(N1, bad)
        assert err.value.code == code


def test_rules_review_lists_rules_per_namespace() -> None:
    in_lease_ns = rules_review(N1, {"spec": {"namespace": "kube-node-lease"}})["status"]
    elsewhere = rules_review(N1, {"spec": {"namespace": "default"}})["status"]
    lease_rules = [r for r in in_lease_ns["resourceRules"] if "leases" in r["resources"]]
    assert {
        "verbs": ["delete", "get", "patch", "update"],
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": ["n1"],
    } in lease_rules
    assert not [r for r in elsewhere["resourceRules"] if "leases" in r["resources"]]
    assert len(rules_for(N1)) == len(set(rules_for(N1)))


# ---- many nodes ---------------------------------------------------------------------------


def test_five_thousand_nodes_each_get_exactly_their_own_rights() -> None:
    """The rules are shared by all nodes; "own" is compared per request (no cache that a
    5,000-node cluster could overflow or mix up)."""
    names = [f"node-{i:04d}" for i in range(5000)]
    for i, own in enumerate(names):
        user = User(f"system:node:{own}", ("system:nodes",))
        other = names[(i + 1) % len(names)]
        for name, mine in ((own, True), (other, False)):
            node = {"metadata": {"name": name}}
            patch = req("patch", NODE, name, new=node, old=node)
            assert (authorize(user, patch) is None) is mine
            status = req("update", NODE, name, sub="status", new=node, old=node)
            assert (authorize(user, status) is None) is mine
            renew = req(
                "update", LEASE, name, ns="kube-node-lease", new=lease(name), old=lease(name)
            )
            assert (authorize(user, renew) is None) is mine
        assert authorize(user, req("watch", HOST_SUBNET)) is None
        assert authorize(user, req("get", HOST_SUBNET, other)) is None
        named = [rule.names for rule in rules_for(user) if rule.names]
        assert named == [frozenset({own}), frozenset({own})]


USERS = (
    ADMIN,
    N1,
    PROXY,
    ROUTER,
    NOBODY,
    User("system:node:n2", ("system:nodes", "system:podnet:proxies")),
    User("system:podnet:controllers:c1", ("system:podnet:controllers",)),
    User("system:node:", ("system:nodes",)),  # no node name: not a node
    User("system:node:n1", ()),  # not in system:nodes: not a node
)


@pytest.mark.parametrize("user", USERS, ids=lambda user: f"{user.name}/{','.join(user.groups)}")
def test_the_rule_index_answers_as_every_rule_one_by_one(user: User) -> None:
    """``allowed_by_rules`` (indexed) agrees with a scan of ``rules_for`` (the rules a
    rules review shows) on every verb, resource, name and namespace combination."""
    rules = rules_for(user)
    verbs = ("get", "list", "watch", "create", "update", "patch", "delete", "*", "escalate")
    kinds = [(k.group, k.plural) for k in (POD, NODE, EVENT, SERVICE, HOST_SUBNET, LEASE, ROUTE)]
    resources = [*kinds, ("", "pods/status"), ("", "nodes/status"), ("*", "*"), ("", "*")]
    resources += [(ROUTE.group, "routes/status"), (SLICE.group, "endpointslices")]
    resources += [("authorization.k8s.io", "selfsubjectaccessreviews")]
    agreed = 0
    for verb in verbs:
        for group, resource in resources:
            for namespace in (None, "kube-node-lease", "default"):
                for name in (None, "n1", "n2", ""):
                    expected = any(r.allows(verb, group, resource, namespace, name) for r in rules)
                    got = allowed_by_rules(user, verb, group, resource, namespace, name)
                    assert got is expected, (verb, group, resource, namespace, name)
                    agreed += expected
    assert agreed > 0  # every user may at least ask what it may do
