"""The controllers' own identity (group ``system:podnet:controllers``): what the master's
controllers use when they run as their own process, and nothing else.

The rules are checked both ways: every call the real controllers make in a busy run
(recorded over the in-process API) is allowed, and what lies outside is refused."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from podnet.api.auth import parse_token_file
from podnet.api.authorizer import RequestAttributes, allowed_by_rules, authorize, rules_for
from podnet.api.identity import User
from podnet.api.params import DeleteOptions
from podnet.api.pki import ensure_pki
from podnet.api.registry import Registry
from podnet.api.roles import CONTROLLERS_RULES
from podnet.cli.main import cli
from podnet.client.objectapi import Listing
from podnet.client.watch import ResourceVersion, WatchEvent
from podnet.controllers.config import MULTITENANT, NetworkConfig
from podnet.controllers.inprocess import InProcessApi
from podnet.controllers.leaselock import ApiLeaseElector
from podnet.controllers.manager import ControllerManager
from podnet.model.kinds import (
    CLUSTER_NETWORK,
    ENDPOINT_SLICE,
    ENDPOINTS,
    EVENT,
    HOST_SUBNET,
    LEASE,
    NAMESPACE,
    NET_NAMESPACE,
    NETWORK_POLICY,
    NODE,
    POD,
    SERVICE,
    Kind,
)
from podnet.testing.e2e import eventually

CONTROLLERS = User("system:podnet:controllers:c1", ("system:podnet:controllers",))
Obj = dict[str, Any]
Call = tuple[str, Kind, str | None, str | None, str | None]  # verb, kind, sub, ns, name


class RecordingApi:
    """The in-process API, recording each call as the authorizer would see it."""

    def __init__(self, api: InProcessApi) -> None:
        self.api = api
        self.calls: set[Call] = set()

    async def list(self, kind: Kind, namespace: str | None = None) -> Listing:
        self.calls.add(("list", kind, None, namespace, None))
        return await self.api.list(kind, namespace)

    def watch(
        self, kind: Kind, since: ResourceVersion, namespace: str | None = None
    ) -> AsyncIterator[WatchEvent]:
        self.calls.add(("watch", kind, None, namespace, None))
        return self.api.watch(kind, since, namespace)

    async def get(self, kind: Kind, namespace: str | None, name: str) -> Obj:
        self.calls.add(("get", kind, None, namespace, name))
        return await self.api.get(kind, namespace, name)

    async def create(self, kind: Kind, obj: Obj, namespace: str | None = None) -> Obj:
        ns = namespace or obj["metadata"].get("namespace")
        self.calls.add(("create", kind, None, ns, None))
        return await self.api.create(kind, obj, namespace)

    async def update(self, kind: Kind, obj: Obj) -> Obj:
        self.calls.add(("update", kind, None, *_where(obj)))
        return await self.api.update(kind, obj)

    async def update_status(self, kind: Kind, obj: Obj) -> Obj:
        self.calls.add(("update", kind, "status", *_where(obj)))
        return await self.api.update_status(kind, obj)

    async def delete(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        *,
        resource_version: ResourceVersion | None = None,
    ) -> None:
        self.calls.add(("delete", kind, None, namespace, name))
        await self.api.delete(kind, namespace, name, resource_version=resource_version)

    async def namespaces_in_use(self, kind: Kind) -> set[str]:
        self.calls.add(("list", kind, None, None, None))  # as the HTTPS API does it
        return await self.api.namespaces_in_use(kind)

    async def finalize_namespace(self, name: str) -> None:
        self.calls.add(("get", NAMESPACE, None, None, name))  # as the HTTPS API does it
        self.calls.add(("update", NAMESPACE, "finalize", None, name))
        await self.api.finalize_namespace(name)


def _where(obj: Obj) -> tuple[str | None, str | None]:
    return obj["metadata"].get("namespace"), obj["metadata"]["name"]


def _node(name: str, ip: str) -> Obj:
    status = {"addresses": [{"type": "InternalIP", "address": ip}]}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "status": status}


async def _busy_run(registry: Registry, api: RecordingApi) -> None:
    """Leader election through a Lease, a node that gets a subnet and goes NotReady, a
    namespace with a Service and a pod that gets Endpoints, then is deleted."""
    elector = ApiLeaseElector(api, "c1", duration=15)
    manager = ControllerManager(api, NetworkConfig.default(MULTITENANT), elector)
    task = asyncio.create_task(manager.run())
    try:
        await eventually(lambda: manager.ready, 20)
        await registry.create(NODE, _node("n1", "192.0.2.1"))
        await registry.create(NAMESPACE, {"metadata": {"name": "shop"}})
        pod = {
            "metadata": {"name": "web-1", "labels": {"app": "web"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
            "status": {"podIP": "10.128.0.5", "conditions": [{"type": "Ready", "status": "True"}]},
        }
        await registry.create(POD, pod, "shop")
        service = {"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}}}
        service["spec"]["ports"] = [{"port": 80, "targetPort": 8080}]
        await registry.create(SERVICE, service, "shop")
        await eventually(lambda: _exists(registry, ENDPOINT_SLICE, "shop"), 20)
        await eventually(lambda: _exists(registry, HOST_SUBNET, None), 20)
        await registry.delete(NAMESPACE, None, "shop")
        # the controller deletes the pod gracefully; its node (played here) finalizes it
        await eventually(lambda: _terminating(registry, "shop", "web-1"), 20)
        await registry.delete(POD, "shop", "web-1", options=DeleteOptions(grace_period_seconds=0))
        await eventually(lambda: _gone(registry, "shop"), 20)
    finally:
        await manager.stop()
        await task


async def _exists(registry: Registry, kind: Kind, namespace: str | None) -> bool:
    items, _ = await registry.list(kind, namespace)
    return bool(items)


async def _terminating(registry: Registry, namespace: str, name: str) -> bool:
    items, _ = await registry.list(POD, namespace)
    return any(
        p["metadata"]["name"] == name and p["metadata"].get("deletionTimestamp") for p in items
    )


async def _gone(registry: Registry, name: str) -> bool:
    items, _ = await registry.list(NAMESPACE)
    return all(n["metadata"]["name"] != name for n in items)


async def test_every_call_of_the_controllers_is_allowed(
    registry: Registry, api: InProcessApi
) -> None:
    recording = RecordingApi(api)
    await _busy_run(registry, recording)
    refused = [
        call
        for call in recording.calls
        if not allowed_by_rules(CONTROLLERS, call[0], call[1].group, _resource(call), *call[3:])
    ]
    assert refused == []
    used = {(verb, kind.plural) for verb, kind, *_ in recording.calls}
    for needed in [
        ("create", "hostsubnets"),
        ("create", "netnamespaces"),
        ("create", "endpointslices"),
        ("update", "namespaces"),  # through namespaces/finalize
        ("delete", "pods"),
        ("update", "leases"),
        ("watch", "leases"),
    ]:
        assert needed in used  # the run really exercised these


def _resource(call: Call) -> str:
    _, kind, sub, *_ = call
    return f"{kind.plural}/{sub}" if sub else kind.plural


@pytest.mark.parametrize(
    ("verb", "kind", "sub", "ns", "name"),
    [
        ("create", POD, None, "shop", None),  # no workloads of its own
        ("update", POD, None, "shop", "p"),
        ("update", POD, "status", "shop", "p"),
        ("get", POD, None, "shop", "p"),
        ("update", NODE, None, None, "n1"),  # a Node's spec or labels
        ("patch", NODE, "status", None, "n1"),
        ("delete", NODE, None, None, "n1"),
        ("create", NODE, None, None, None),
        ("delete", NAMESPACE, None, None, "shop"),
        ("update", NAMESPACE, None, None, "shop"),
        ("delete", CLUSTER_NETWORK, None, None, "default"),
        ("create", SERVICE, None, "shop", None),
        ("update", SERVICE, None, "shop", "web"),
        ("create", NETWORK_POLICY, None, "shop", None),
        ("patch", ENDPOINTS, None, "shop", "web"),
        ("deletecollection", ENDPOINTS, None, "shop", None),
        ("get", EVENT, None, "default", "e"),
        ("create", EVENT, None, "shop", None),  # events about nodes go to default only
        ("get", LEASE, None, "kube-node-lease", "n1"),  # a node's heartbeat
        ("update", LEASE, None, "kube-node-lease", "n1"),
        ("update", LEASE, None, "kube-system", "another-lock"),
        ("get", LEASE, None, "kube-system", "another-lock"),
        ("create", LEASE, None, "kube-node-lease", None),
        ("update", NET_NAMESPACE, "status", None, "shop"),
        ("*", POD, None, "shop", None),
        ("escalate", HOST_SUBNET, None, None, None),
    ],
)
def test_the_controllers_may_do_nothing_else(
    verb: str, kind: Kind, sub: str | None, ns: str | None, name: str | None
) -> None:
    attrs = RequestAttributes(verb, kind, ns, name, sub, {}, {})
    reason = authorize(CONTROLLERS, attrs)
    assert reason is not None and reason.startswith("the controllers may not")


def test_the_controllers_rules_are_exactly_the_table() -> None:
    review_rule = rules_for(User("nobody", ()))
    assert rules_for(CONTROLLERS) == (*review_rule, *CONTROLLERS_RULES)
    assert not any(rule.wildcard for rule in CONTROLLERS_RULES)
    assert not any("patch" in rule.verbs for rule in CONTROLLERS_RULES)


def test_controllers_credentials_issue_one_token_of_the_group(tmp_path: Path) -> None:
    state = tmp_path / "master"
    ensure_pki(state / "pki", ["127.0.0.1"])
    token_file, ca_file = tmp_path / "controllers.token", tmp_path / "ca.pem"
    args = ["controllers-credentials", "c1", "--state-dir", str(state)]
    args += ["--token-file", str(token_file), "--ca-file", str(ca_file)]
    first = CliRunner().invoke(cli, args)
    assert first.exit_code == 0, first.output
    token = token_file.read_text().strip()
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert ca_file.read_bytes() == (state / "pki" / "ca.crt").read_bytes()
    users = parse_token_file((state / "tokens.csv").read_text())
    assert users[token] == CONTROLLERS  # exactly this user, in exactly this group
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 0 and token_file.read_text().strip() == token  # no second token
    assert len(parse_token_file((state / "tokens.csv").read_text())) == 1
    empty = CliRunner().invoke(cli, [*args[:1], "", *args[2:]])
    assert empty.exit_code == 1 and "must not be empty" in empty.output
