"""The router's identity (group ``system:podnet:routers``): exactly its rules, each way
out refused; ``podnet router-credentials``; nodes do not read routes (keys); the
master's host for routes without one (``podnet.api.routehosts``)."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from podnet.api.auth import parse_token_file
from podnet.api.authorizer import RequestAttributes, authorize, rules_for
from podnet.api.identity import User
from podnet.api.pki import ensure_pki
from podnet.api.registry import Registry
from podnet.api.roles import ROUTER_RULES
from podnet.cli.main import cli
from podnet.model.errors import ApiError
from podnet.model.kinds import (
    ENDPOINT_SLICE,
    ENDPOINTS,
    EVENT,
    KINDS,
    LEASE,
    NAMESPACE,
    NODE,
    POD,
    ROUTE,
    SERVICE,
    Kind,
)
from podnet.model.routenames import DEFAULT_ROUTE_SUFFIX
from podnet.store.memory import MemoryStore

ROUTER = User("system:podnet:router:r1", ("system:podnet:routers",))
NODE_USER = User("system:node:n1", ("system:nodes",))
Obj = dict[str, Any]


def allowed(user: User, verb: str, kind: Kind, sub: str | None = None, ns: str = "shop") -> bool:
    attrs = RequestAttributes(verb, kind, ns if kind.namespaced else None, "x", sub, {}, {})
    return authorize(user, attrs) is None


READS = ("get", "list", "watch")


@pytest.mark.parametrize("kind", [ROUTE, SERVICE, ENDPOINTS, ENDPOINT_SLICE])
@pytest.mark.parametrize("verb", READS)
@pytest.mark.parametrize("ns", ["shop", "default", "kube-system"])
def test_the_router_reads_its_kinds_in_every_namespace(verb: str, kind: Kind, ns: str) -> None:
    assert allowed(ROUTER, verb, kind, ns=ns)


@pytest.mark.parametrize("verb", ["update", "patch"])
def test_the_router_writes_route_status(verb: str) -> None:
    assert allowed(ROUTER, verb, ROUTE, "status")


OTHER_KINDS = [k for k in KINDS.kinds if k not in (ROUTE, SERVICE, ENDPOINTS, ENDPOINT_SLICE)]
SECRETS = Kind("", "v1", "Secret", "secrets", True)  # podnet serves none; still refused


@pytest.mark.parametrize(
    ("verb", "kind", "sub"),
    [
        ("create", ROUTE, None),  # no route of its own
        ("update", ROUTE, None),  # not a route's spec
        ("patch", ROUTE, None),
        ("delete", ROUTE, None),
        ("deletecollection", ROUTE, None),
        ("create", ROUTE, "status"),
        ("delete", ROUTE, "status"),
        ("*", ROUTE, None),
        ("update", SERVICE, None),
        ("patch", SERVICE, "status"),
        ("create", ENDPOINTS, None),
        ("update", ENDPOINT_SLICE, None),
        ("delete", ENDPOINT_SLICE, None),
        *[(verb, SECRETS, None) for verb in ("get", "list", "watch", "create")],
        *[(verb, kind, None) for kind in OTHER_KINDS for verb in ("get", "list", "create")],
        ("update", POD, "status"),
        ("update", NODE, "status"),
        ("update", NAMESPACE, "finalize"),
    ],
)
def test_the_router_may_do_nothing_else(verb: str, kind: Kind, sub: str | None) -> None:
    attrs = RequestAttributes(verb, kind, "shop" if kind.namespaced else None, "x", sub, {}, {})
    reason = authorize(ROUTER, attrs)
    assert reason is not None and reason.startswith("a router may not")


def test_the_router_rules_are_exactly_the_table() -> None:
    review_rule = rules_for(User("nobody", ()))
    assert rules_for(ROUTER) == (*review_rule, *ROUTER_RULES)
    assert not any(rule.wildcard for rule in ROUTER_RULES)
    writes = [
        (rule.group, sorted(rule.resources)) for rule in ROUTER_RULES if "update" in rule.verbs
    ]
    assert writes == [("route.openshift.io", ["routes/status"])]


def test_a_node_reads_no_route_but_the_rest_as_before() -> None:
    for verb in READS:
        assert not allowed(NODE_USER, verb, ROUTE)
        assert not allowed(NODE_USER, verb, ROUTE, "status")
    assert allowed(NODE_USER, "list", SERVICE) and allowed(NODE_USER, "watch", ENDPOINT_SLICE)
    assert not allowed(NODE_USER, "list", EVENT) and not allowed(NODE_USER, "get", LEASE)


# ---- podnet router-credentials -------------------------------------------------------------


def test_router_credentials_issue_one_token_of_the_group(tmp_path: Path) -> None:
    state = tmp_path / "master"
    ensure_pki(state / "pki", ["127.0.0.1"])
    token_file, ca_file, kubeconfig = tmp_path / "r.token", tmp_path / "ca.pem", tmp_path / "r.kc"
    args = ["router-credentials", "r1", "--state-dir", str(state)]
    args += ["--token-file", str(token_file), "--ca-file", str(ca_file)]
    args += ["-o", str(kubeconfig), "--server", "https://127.0.0.1:6443"]
    first = CliRunner().invoke(cli, args)
    assert first.exit_code == 0, first.output
    token = token_file.read_text().strip()
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(kubeconfig.stat().st_mode) == 0o600
    assert ca_file.read_bytes() == (state / "pki" / "ca.crt").read_bytes()
    users = parse_token_file((state / "tokens.csv").read_text())
    assert users == {token: ROUTER}  # exactly this user, in exactly this group
    config = yaml.safe_load(kubeconfig.read_text())
    assert config["users"][0]["user"]["token"] == token
    assert config["users"][0]["name"] == ROUTER.name
    assert config["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:6443"
    again = CliRunner().invoke(cli, args[:8])
    assert again.exit_code == 0 and token_file.read_text().strip() == token  # no second token
    assert len(parse_token_file((state / "tokens.csv").read_text())) == 1


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ([], "give --token-file and --ca-file, or -o and --server"),
        (["--token-file", "t"], "give --token-file and --ca-file together"),
        (["-o", "k"], "give -o/--kubeconfig and --server together"),
        (["--server", "https://x"], "give -o/--kubeconfig and --server together"),
    ],
)
def test_router_credentials_usage_errors(tmp_path: Path, extra: list[str], words: str) -> None:
    state = tmp_path / "master"
    ensure_pki(state / "pki", ["127.0.0.1"])
    result = CliRunner().invoke(
        cli, ["router-credentials", "r1", "--state-dir", str(state), *extra]
    )
    assert result.exit_code != 0 and words in result.output
    assert not (state / "tokens.csv").exists()  # nothing issued


def test_router_credentials_refuse_an_empty_name(tmp_path: Path) -> None:
    state = tmp_path / "master"
    ensure_pki(state / "pki", ["127.0.0.1"])
    args = ["router-credentials", "", "--state-dir", str(state)]
    args += ["--token-file", str(tmp_path / "t"), "--ca-file", str(tmp_path / "c")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and "must not be empty" in result.output


# ---- generated hosts -------------------------------------------------------------------------


def route(name: str, host: str | None = None) -> Obj:
    spec: Obj = {"to": {"name": "web"}}
    if host is not None:
        spec["host"] = host
    return {"metadata": {"name": name}, "spec": spec}


async def _with_namespace(registry: Registry, name: str = "shop") -> Registry:
    await registry.create(NAMESPACE, {"metadata": {"name": name}})
    return registry


async def test_a_route_without_a_host_gets_name_namespace_suffix() -> None:
    registry = await _with_namespace(Registry(MemoryStore(), prefix="/t/"))
    made = await registry.create(ROUTE, route("web"), "shop")
    assert made["spec"]["host"] == f"web-shop.{DEFAULT_ROUTE_SUFFIX}"
    dotted = await registry.create(ROUTE, route("v1.api", ""), "shop")
    assert dotted["spec"]["host"] == f"v1-api-shop.{DEFAULT_ROUTE_SUFFIX}"
    given = await registry.create(ROUTE, route("own", "www.example.com"), "shop")
    assert given["spec"]["host"] == "www.example.com"
    cleared = await registry.update(
        ROUTE, {**given, "spec": {**given["spec"], "host": ""}}, "shop", "own"
    )
    assert cleared["spec"]["host"] == f"own-shop.{DEFAULT_ROUTE_SUFFIX}"
    stored = await registry.get(ROUTE, "shop", "web")
    assert stored["spec"]["host"] == made["spec"]["host"]


async def test_the_suffix_is_configurable_and_checked() -> None:
    registry = await _with_namespace(
        Registry(MemoryStore(), prefix="/t/", route_suffix="apps.test")
    )
    assert (await registry.create(ROUTE, route("web"), "shop"))["spec"][
        "host"
    ] == "web-shop.apps.test"
    for bad in ("", "Apps", "a..b"):
        with pytest.raises(ValueError, match="route suffix"):
            Registry(MemoryStore(), prefix="/t/", route_suffix=bad)


async def test_a_generated_host_that_is_too_long_is_refused_and_nothing_stored() -> None:
    registry = await _with_namespace(Registry(MemoryStore(), prefix="/t/"))
    name = "x" * 60  # "<name>-shop" is 65 characters: not a DNS label
    with pytest.raises(ApiError) as caught:
        await registry.create(ROUTE, route(name), "shop")
    assert caught.value.code == 422
    [cause] = caught.value.causes
    assert cause.field == "spec.host" and "set spec.host" in cause.message
    assert "no more than 63 characters" in cause.message
    assert (await registry.list(ROUTE, "shop"))[0] == []


def test_master_refuses_a_bad_route_suffix(tmp_path: Path) -> None:
    args = ["master", "--state-dir", str(tmp_path), "--route-suffix", "bad_suffix"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0 and "--route-suffix" in result.output


# ---- a router writes its own status.ingress entry only --------------------------------------


def with_ingress(*entries: Obj) -> Obj:
    return {"metadata": {"name": "web", "namespace": "shop"}, "status": {"ingress": list(entries)}}


def status_write(user: User, new: Obj, old: Obj, verb: str = "patch") -> str | None:
    attrs = RequestAttributes(verb, ROUTE, "shop", "web", "status", new, old)
    return authorize(user, attrs)


OTHER = {"routerName": "other", "host": "www.example.com"}
MINE = {"routerName": "r1", "host": "www.example.com"}


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (with_ingress(), with_ingress(MINE)),  # first entry
        (with_ingress(OTHER), with_ingress(OTHER, MINE)),  # beside another router's
        (with_ingress(MINE, OTHER), with_ingress({**MINE, "host": "x.example.com"}, OTHER)),
        (with_ingress(OTHER, MINE), with_ingress(OTHER)),  # its own removed
        (with_ingress(OTHER), with_ingress(OTHER)),
    ],
)
def test_a_router_may_write_its_own_entry(old: Obj, new: Obj) -> None:
    assert status_write(ROUTER, new, old) is None
    assert status_write(ROUTER, new, old, "update") is None


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        (with_ingress(), with_ingress(OTHER), "only write its own status.ingress entry"),
        (with_ingress(OTHER), with_ingress(), "only write its own"),  # removing another's
        (with_ingress(OTHER), with_ingress({**OTHER, "host": "evil.com"}), "only write its own"),
        (
            with_ingress(OTHER, {**OTHER, "routerName": "third"}),
            with_ingress({**OTHER, "routerName": "third"}, OTHER),
            "only write its own",
        ),  # the others' order
        (with_ingress(), with_ingress(MINE, MINE), 'one entry for router "r1", not 2'),
        (with_ingress(), {"status": {"ingress": [OTHER, "junk"]}}, "only write its own"),
    ],
)
def test_a_router_may_not_write_another_routers_entry(old: Obj, new: Obj, why: str) -> None:
    reason = status_write(ROUTER, new, old)
    assert reason is not None and why in reason
    admin = User("admin", ("system:masters",))
    assert status_write(admin, new, old) is None  # the admin may


def test_a_router_identity_without_a_router_name_writes_nothing() -> None:
    nameless = User("somebody", ("system:podnet:routers",))
    assert nameless.router_name is None and ROUTER.router_name == "r1"
    reason = status_write(nameless, with_ingress(MINE), with_ingress())
    assert reason == "a router's user name must be system:podnet:router:<name>"
    assert allowed(nameless, "list", ROUTE)  # its reads are the rules' alone
