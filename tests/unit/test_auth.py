"""Bearer-token authentication and the admin / node authorization rules."""

from __future__ import annotations

import hmac
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from podnet.api import auth
from podnet.api.auth import (
    RequestAttributes,
    TokenFile,
    User,
    add_token,
    authorize,
    ensure_admin_token,
    ensure_node_token,
    forbidden_message,
    parse_token_file,
    require_authorized,
)
from podnet.model.errors import ApiError
from podnet.model.kinds import (
    ALL_KINDS,
    EVENT,
    HOST_SUBNET,
    NAMESPACE,
    NET_NAMESPACE,
    NODE,
    POD,
    SERVICE,
    Kind,
)

ADMIN = User("admin", ("system:masters",))
N1 = User("system:node:n1", ("system:nodes",))
ALICE = User("alice", ("developers",))


# ------------------------------------------------------------------------ users


def test_user_roles() -> None:
    assert ADMIN.is_admin and ADMIN.node_name is None
    assert N1.node_name == "n1" and not N1.is_admin
    assert ALICE.node_name is None and not ALICE.is_admin
    # The name alone does not make a node: kube also requires the group.
    assert User("system:node:n1", ()).node_name is None
    assert User("system:node:", ("system:nodes",)).node_name is None


# ----------------------------------------------------------------- token file


def _write(path: Path, text: str) -> None:
    path.write_text(text)


def test_parse_quoted_groups_and_skip_comments() -> None:
    text = (
        "# comment\n"
        "\n"
        'tok1,admin,uid1,"system:masters,extra"\n'
        "tok2,system:node:n1,uid2,system:nodes\n"
        "tok3,bob,uid3\n"
    )
    table = parse_token_file(text)
    assert table == {
        "tok1": User("admin", ("system:masters", "extra")),
        "tok2": User("system:node:n1", ("system:nodes",)),
        "tok3": User("bob", ()),
    }


@pytest.mark.parametrize("line", ["tok,user\n", ",user,uid\n", "tok,,uid\n"])
def test_parse_rejects_short_or_empty_rows(line: str) -> None:
    with pytest.raises(ValueError, match=":1"):
        parse_token_file(line)


def test_authenticate_known_token(tmp_path: Path) -> None:
    path = tmp_path / "tokens.csv"
    _write(path, 'secret-a,admin,1,"system:masters"\nsecret-n,system:node:n1,2,system:nodes\n')
    tokens = TokenFile(path)
    assert tokens.authenticate("Bearer secret-a") == ADMIN
    assert tokens.authenticate("bearer  secret-n ") == N1


@pytest.mark.parametrize(
    "header",
    [None, "", "Bearer", "Bearer ", "Basic c2VjcmV0LWE=", "secret-a", "Bearer secret-b",
     "Bearer secret-a extra", "Bearer secret-"],
)  # fmt: skip
def test_authenticate_rejects_with_401(tmp_path: Path, header: str | None) -> None:
    path = tmp_path / "tokens.csv"
    _write(path, "secret-a,admin,1,system:masters\n")
    with pytest.raises(ApiError) as err:
        TokenFile(path).authenticate(header)
    assert err.value.code == 401
    assert err.value.status()["reason"] == "Unauthorized"


def test_missing_file_means_no_tokens_until_created(tmp_path: Path) -> None:
    path = tmp_path / "tokens.csv"
    tokens = TokenFile(path)
    with pytest.raises(ApiError):
        tokens.authenticate("Bearer x")
    _write(path, "x,admin,1,system:masters\n")
    assert tokens.authenticate("Bearer x") == ADMIN


def test_malformed_file_fails_at_startup(tmp_path: Path) -> None:
    path = tmp_path / "tokens.csv"
    _write(path, "only-a-token\n")
    with pytest.raises(ValueError):
        TokenFile(path)


def test_constant_time_compare_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tokens.csv"
    _write(path, "secret-a,admin,1,system:masters\n")
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    tokens = TokenFile(path)
    assert tokens.authenticate("Bearer secret-a") == ADMIN
    with pytest.raises(ApiError):
        tokens.authenticate("Bearer wrong")
    assert calls[0] == (b"secret-a", b"secret-a")
    assert calls[1][0] == b"wrong" and len(calls) == 2


def test_reload_on_change(tmp_path: Path) -> None:
    path = tmp_path / "tokens.csv"
    _write(path, "old,admin,1,system:masters\n")
    tokens = TokenFile(path)
    assert tokens.authenticate("Bearer old") == ADMIN
    # Same size, new content; force a distinct mtime in case the clock is coarse.
    _write(path, "new,admin,1,system:masters\n")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert tokens.authenticate("Bearer new") == ADMIN
    with pytest.raises(ApiError):
        tokens.authenticate("Bearer old")


def test_reload_sees_tokens_added_by_add_token(tmp_path: Path) -> None:
    path = tmp_path / "tokens.csv"
    admin = ensure_admin_token(path)
    tokens = TokenFile(path)
    node = ensure_node_token(path, "n1")
    assert tokens.authenticate(f"Bearer {node}") == N1
    assert tokens.authenticate(f"Bearer {admin}") == ADMIN


def test_token_removed_from_the_file_stops_working(tmp_path: Path) -> None:
    path = tmp_path / "tokens.csv"
    _write(path, "gone,admin,1,system:masters\nkept,system:node:n1,2,system:nodes\n")
    tokens = TokenFile(path)
    assert tokens.authenticate("Bearer gone") == ADMIN
    _write(path, "kept,system:node:n1,2,system:nodes\n")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    revoked = threading.Event()
    for _ in range(20 * 60):  # the file is re-checked within RECHECK_SECONDS; bound: a minute
        try:
            tokens.authenticate("Bearer gone")
        except ApiError as err:
            assert err.code == 401
            revoked.set()
            break
        revoked.wait(auth.RECHECK_SECONDS / 20)
    assert revoked.is_set()
    assert tokens.authenticate("Bearer kept") == N1


def test_broken_reload_keeps_previous_tokens(tmp_path: Path) -> None:
    path = tmp_path / "tokens.csv"
    _write(path, "good,admin,1,system:masters\n")
    tokens = TokenFile(path)
    _write(path, "broken-line-without-user\n")
    os.utime(path, ns=(0, 10**18))
    assert tokens.authenticate("Bearer good") == ADMIN
    _write(path, "fixed,admin,1,system:masters\n")
    os.utime(path, ns=(0, 10**18 + 1))
    assert tokens.authenticate("Bearer fixed") == ADMIN


def test_add_token_is_idempotent_per_user_and_private(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "tokens.csv"
    admin = ensure_admin_token(path)
    assert len(admin) >= 40
    assert ensure_admin_token(path) == admin
    n1, n2 = ensure_node_token(path, "n1"), ensure_node_token(path, "n2")
    assert len({admin, n1, n2}) == 3
    assert ensure_node_token(path, "n1") == n1
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    table = parse_token_file(path.read_text())
    assert table[admin] == ADMIN
    assert table[n2] == User("system:node:n2", ("system:nodes",))
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []


def test_add_token_quotes_multiple_groups(tmp_path: Path) -> None:
    path = tmp_path / "tokens.csv"
    token = add_token(path, "ops", ["g1", "g2"])
    assert f"{token},ops," in path.read_text() and '"g1,g2"' in path.read_text()
    assert TokenFile(path).authenticate(f"Bearer {token}") == User("ops", ("g1", "g2"))


def test_add_token_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "tokens.csv"
    threads = [threading.Thread(target=ensure_node_token, args=(path, f"n{i}")) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    names = {u.name for u in parse_token_file(path.read_text()).values()}
    assert names == {f"system:node:n{i}" for i in range(16)}


def test_ensure_node_token_rejects_empty_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        ensure_node_token(tmp_path / "t.csv", "")


# --------------------------------------------------------------- authorization


def _pod(node: str | None, name: str = "p") -> dict[str, Any]:
    spec = {"nodeName": node} if node is not None else {}
    annotations = {"kubernetes.io/config.mirror": "x"}
    return {"metadata": {"name": name, "namespace": "ns", "annotations": annotations}, "spec": spec}


def _node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}}


def _req(
    verb: str,
    kind: Kind | None,
    name: str | None = None,
    *,
    namespace: str | None = None,
    sub: str | None = None,
    new: dict[str, Any] | None = None,
    old: dict[str, Any] | None = None,
    path: str = "",
) -> RequestAttributes:
    return RequestAttributes(verb, kind, namespace, name, sub, new, old, path)


ALL_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.plural)
@pytest.mark.parametrize("verb", ALL_VERBS)
def test_admin_may_do_everything(kind: Kind, verb: str) -> None:
    assert authorize(ADMIN, _req(verb, kind, "x", new=_node("x"), old=_node("x"))) is None


@pytest.mark.parametrize(
    "kind",
    [k for k in ALL_KINDS if k.plural not in ("events", "leases", "routes")],
    ids=lambda k: k.plural,
)
@pytest.mark.parametrize("verb", ["get", "list", "watch"])
def test_node_reads_every_kind_but_events_leases_and_routes(kind: Kind, verb: str) -> None:
    assert authorize(N1, _req(verb, kind)) is None


@pytest.mark.parametrize("verb", ["get", "list", "watch"])
def test_node_may_not_read_routes(verb: str) -> None:
    """A route may hold a TLS key: only the admin and the routers read them."""
    route = next(k for k in ALL_KINDS if k.plural == "routes")
    assert authorize(N1, _req(verb, route, namespace="ns")) == "a node may not " + verb + " routes"


@pytest.mark.parametrize("verb", ["get", "list", "watch"])
def test_node_may_not_read_events(verb: str) -> None:
    assert authorize(N1, _req(verb, EVENT, namespace="ns")) is not None


@pytest.mark.parametrize("path", ["/api", "/apis/x/v1", "/version", "/healthz", "/openapi/v3"])
@pytest.mark.parametrize("user", [N1, ALICE, ADMIN], ids=lambda u: u.name)
def test_discovery_and_health_allowed_for_everyone(path: str, user: User) -> None:
    assert authorize(user, _req("get", None, path=path)) is None


@pytest.mark.parametrize("user", [N1, ALICE], ids=lambda u: u.name)
def test_metrics_and_unknown_paths_only_for_the_roles_that_need_them(user: User) -> None:
    """Issue 19, finding 9: /metrics is the admin's and the metrics readers' (kube's
    system:monitoring), not every authenticated identity's."""
    for path in ("/metrics", "/debug/pprof", "/"):
        assert authorize(user, _req("get", None, path=path)) is not None
    reader = User("prometheus", ("system:monitoring",))
    assert authorize(reader, _req("get", None, path="/metrics")) is None
    assert authorize(reader, _req("get", None, path="/debug/pprof")) is not None
    assert authorize(ADMIN, _req("get", None, path="/metrics")) is None


@pytest.mark.parametrize("user", [N1, ALICE], ids=lambda u: u.name)
def test_non_resource_writes_denied(user: User) -> None:
    assert authorize(user, _req("post", None, path="/api")) is not None
    assert authorize(ADMIN, _req("post", None, path="/api")) is None


@pytest.mark.parametrize("verb", ALL_VERBS)
def test_other_users_get_no_resources(verb: str) -> None:
    reason = authorize(ALICE, _req(verb, POD, "p", namespace="ns"))
    assert reason is not None and "admin" in reason and "nodes" in reason


@pytest.mark.parametrize("verb", ["update", "patch"])
@pytest.mark.parametrize("sub", [None, "status"])
def test_node_modifies_own_node(verb: str, sub: str | None) -> None:
    req = _req(verb, NODE, "n1", sub=sub, new=_node("n1"), old=_node("n1"))
    assert authorize(N1, req) is None


@pytest.mark.parametrize("verb", ["update", "patch"])
@pytest.mark.parametrize("sub", [None, "status"])
def test_node_may_not_modify_another_node(verb: str, sub: str | None) -> None:
    req = _req(verb, NODE, "n2", sub=sub, new=_node("n2"), old=_node("n2"))
    assert authorize(N1, req) == "a node may only modify its own Node"


def test_node_creates_only_its_own_node() -> None:
    assert authorize(N1, _req("create", NODE, new=_node("n1"))) is None
    assert authorize(N1, _req("create", NODE, new=_node("n2"))) is not None
    assert authorize(N1, _req("create", NODE, new={"metadata": {}})) is not None
    assert authorize(N1, _req("create", NODE, None)) is not None


def test_node_may_not_rename_through_body() -> None:
    assert authorize(N1, _req("update", NODE, "n1", new=_node("n2"))) is not None


@pytest.mark.parametrize("verb", ["delete", "deletecollection"])
@pytest.mark.parametrize("name", ["n1", "n2"])
def test_node_never_deletes_nodes(verb: str, name: str) -> None:
    assert authorize(N1, _req(verb, NODE, name, old=_node(name))) is not None


@pytest.mark.parametrize(
    ("verb", "sub"), [("create", None), ("update", "status"), ("patch", "status")]
)
def test_node_writes_pods_bound_to_it(verb: str, sub: str | None) -> None:
    old = None if verb == "create" else _pod("n1")
    req = _req(verb, POD, "p", namespace="ns", sub=sub, new=_pod("n1"), old=old)
    assert authorize(N1, req) is None


@pytest.mark.parametrize("verb", ["update", "patch"])
def test_node_never_updates_a_pod_itself(verb: str) -> None:
    req = _req(verb, POD, "p", namespace="ns", new=_pod("n1"), old=_pod("n1"))
    reason = authorize(N1, req)
    assert reason is not None and "pods/status" in reason


@pytest.mark.parametrize(
    ("verb", "sub"), [("create", None), ("update", "status"), ("patch", "status")]
)
def test_node_may_not_write_pods_on_another_node(verb: str, sub: str | None) -> None:
    old = None if verb == "create" else _pod("n2")
    req = _req(verb, POD, "p", namespace="ns", sub=sub, new=_pod("n2"), old=old)
    reason = authorize(N1, req)
    assert reason is not None and '"n2"' in reason


@pytest.mark.parametrize("verb", ["update", "patch"])
def test_node_may_not_move_pod_to_itself(verb: str) -> None:
    req = _req(verb, POD, "p", namespace="ns", new=_pod("n1"), old=_pod("n2"))
    assert authorize(N1, req) is not None


def test_node_may_not_move_pod_away_or_unbind() -> None:
    away = _req("update", POD, "p", namespace="ns", sub="status", new=_pod("n2"), old=_pod("n1"))
    assert authorize(N1, away) is not None
    unbound = _req("create", POD, "p", namespace="ns", new=_pod(None))
    assert authorize(N1, unbound) is not None


def test_node_deletes_only_its_pods() -> None:
    assert authorize(N1, _req("delete", POD, "p", namespace="ns", old=_pod("n1"))) is None
    assert authorize(N1, _req("delete", POD, "p", namespace="ns", old=_pod("n2"))) is not None
    # Without the stored object the pod's node cannot be checked.
    assert authorize(N1, _req("delete", POD, "p", namespace="ns")) is not None
    assert authorize(N1, _req("deletecollection", POD, namespace="ns")) is not None


def test_node_write_without_body_denied() -> None:
    req = _req("update", POD, "p", namespace="ns", sub="status", old=_pod("n1"))
    assert authorize(N1, req) is not None


def test_node_may_not_write_other_pod_subresources() -> None:
    req = _req("create", POD, "p", namespace="ns", sub="eviction", new=_pod("n1"))
    assert authorize(N1, req) is not None


@pytest.mark.parametrize("namespace", ["default", "kube-system", "ns"])
def test_node_creates_events_anywhere(namespace: str) -> None:
    assert authorize(N1, _req("create", EVENT, namespace=namespace, new={})) is None


@pytest.mark.parametrize("verb", ["update", "patch", "delete", "deletecollection"])
def test_node_may_only_create_events(verb: str) -> None:
    assert authorize(N1, _req(verb, EVENT, "e", namespace="ns")) is not None


@pytest.mark.parametrize("kind", [NAMESPACE, SERVICE, HOST_SUBNET, NET_NAMESPACE])
@pytest.mark.parametrize("verb", ["create", "update", "patch", "delete", "deletecollection"])
def test_node_may_not_write_other_kinds(kind: Kind, verb: str) -> None:
    assert authorize(N1, _req(verb, kind, "x", new={"metadata": {"name": "x"}})) is not None


# --------------------------------------------------------------- 403 messages


def test_forbidden_message_cluster_scope() -> None:
    req = _req("update", NODE, "n2", new=_node("n2"))
    reason = authorize(N1, req)
    assert reason is not None
    assert forbidden_message(N1, req, reason) == (
        'nodes "n2" is forbidden: User "system:node:n1" cannot update resource "nodes" '
        'in API group "" at the cluster scope: a node may only modify its own Node'
    )


def test_forbidden_message_namespaced_group_and_subresource() -> None:
    req = _req("patch", POD, "p", namespace="ns", sub="status", new=_pod("n2"))
    assert forbidden_message(N1, req, "why") == (
        'pods "p" is forbidden: User "system:node:n1" cannot patch resource "pods/status" '
        'in API group "" in the namespace "ns": why'
    )
    hs = _req("list", HOST_SUBNET)
    assert forbidden_message(ALICE, hs, "why").startswith(
        'hostsubnets.network.openshift.io is forbidden: User "alice" cannot list resource '
        '"hostsubnets" in API group "network.openshift.io" at the cluster scope'
    )


def test_forbidden_message_non_resource() -> None:
    req = _req("post", None, path="/version")
    assert forbidden_message(ALICE, req, "why") == (
        'forbidden: User "alice" cannot post path "/version": why'
    )


def test_require_authorized_raises_403() -> None:
    require_authorized(N1, _req("get", NODE, "n2"))
    with pytest.raises(ApiError) as err:
        require_authorized(N1, _req("delete", NODE, "n1", old=_node("n1")))
    status = err.value.status()
    assert status["code"] == 403 and status["reason"] == "Forbidden"
    assert status["details"] == {"name": "n1", "kind": "nodes"}
    assert status["message"].startswith('nodes "n1" is forbidden: User "system:node:n1"')
