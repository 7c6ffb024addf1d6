"""``PolicySync`` against an in-memory API and the fake data plane.

``FakeApi`` holds objects per kind and serves ``watch`` as the real client does: a
``LISTED`` with everything, then every change. After each change the fake data plane's
rule set must reach the fingerprint of ``compile_rules`` over the API's objects.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

import pytest

from podnet.agent.policies import PolicySync, host_ip, network_plugin
from podnet.client import LISTED, WatchEvent
from podnet.controllers.config import MULTITENANT, NETWORKPOLICY, SUBNET
from podnet.dataplane.fake import FakeDataPlane
from podnet.dataplane.interface import DataPlaneError, NodeNetwork
from podnet.model.kinds import HOST_SUBNET, NAMESPACE, NET_NAMESPACE, NETWORK_POLICY, POD, Kind
from podnet.policy.compile import compile_rules, hostsubnet_addresses
from podnet.policy.incremental import PODS
from podnet.policy.model import RuleSet
from podnet.reconcile import APPLIED, PARTIAL, ReconcileMetrics
from podnet.testing.e2e import eventually

Obj = dict[str, Any]
LOCAL = NodeNetwork(
    "node-a",
    IPv4Address("192.0.2.10"),
    IPv4Network("10.128.0.0/24"),
    (IPv4Network("10.128.0.0/14"),),
    IPv4Network("172.30.0.0/16"),
    1450,
)


class FakeApi:
    """Objects by kind and ``namespace/name``; ``watch`` lists, then streams changes.

    A kind in ``held`` does not list until ``release`` (a slow watch)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Obj]] = defaultdict(dict)
        self.watched: list[str] = []
        self.held: dict[str, asyncio.Event] = {}
        self._queues: dict[str, list[asyncio.Queue[WatchEvent]]] = defaultdict(list)

    async def watch(self, kind: Kind) -> AsyncIterator[WatchEvent]:
        self.watched.append(kind.plural)
        if kind.plural in self.held:
            await self.held[kind.plural].wait()
        queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
        self._queues[kind.plural].append(queue)
        yield self.listing(kind)
        while True:
            yield await queue.get()

    def listing(self, kind: Kind) -> WatchEvent:
        return WatchEvent(
            LISTED, items=tuple(copy.deepcopy(list(self.objects[kind.plural].values())))
        )

    def hold(self, kind: Kind) -> None:
        self.held[kind.plural] = asyncio.Event()

    def release(self, kind: Kind) -> None:
        self.held[kind.plural].set()

    def put(self, kind: Kind, obj: Obj) -> None:
        key = _key(obj)
        verb = "MODIFIED" if key in self.objects[kind.plural] else "ADDED"
        self.objects[kind.plural][key] = obj
        self._send(kind, WatchEvent(verb, copy.deepcopy(obj)))

    def delete(self, kind: Kind, obj: Obj) -> None:
        self.objects[kind.plural].pop(_key(obj), None)
        self._send(kind, WatchEvent("DELETED", copy.deepcopy(obj)))

    def relist(self, kind: Kind) -> None:
        """What the client emits after a 410: a fresh listing."""
        self._send(kind, self.listing(kind))

    def _send(self, kind: Kind, event: WatchEvent) -> None:
        for queue in self._queues[kind.plural]:
            queue.put_nowait(event)

    def expected(self, plugin: str) -> RuleSet:
        """``compile_rules`` over everything the API holds."""
        pods, namespaces, netnamespaces, policies = (
            self.objects[k.plural].values() for k in (POD, NAMESPACE, NET_NAMESPACE, NETWORK_POLICY)
        )
        hostsubnets = list(self.objects[HOST_SUBNET.plural].values())
        ips = [hs["hostIP"] for hs in hostsubnets]
        addresses = [pair for hs in hostsubnets for pair in hostsubnet_addresses(hs)]
        return compile_rules(
            plugin,
            pods,
            namespaces,
            netnamespaces,
            policies,
            node_ips=ips,
            node_addresses=addresses,
            pod_networks=LOCAL.cluster_networks,
        )


def _key(obj: Obj) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


def pod(ns: str, name: str, ip: str, **labels: str) -> Obj:
    return {
        "metadata": {"namespace": ns, "name": name, "labels": labels, "uid": f"u-{name}",
                     "annotations": {"note": "not needed by compile"}},
        "spec": {"nodeName": "node-a", "containers": [
            {"name": "c", "image": "i", "ports": [{"name": "http", "containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": ip},
    }  # fmt: skip


def namespace(name: str, **labels: str) -> Obj:
    return {"metadata": {"name": name, "labels": labels}}


def netnamespace(name: str, netid: int) -> Obj:
    return {"metadata": {"name": name}, "netname": name, "netid": netid}


def hostsubnet(name: str, ip: str) -> Obj:
    return {"metadata": {"name": name}, "host": name, "hostIP": ip, "subnet": "10.128.1.0/24"}


def allow(ns: str, name: str, target: str, peer: str) -> Obj:
    spec = {"podSelector": {"matchLabels": {"app": target}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": peer}}}],
                         "ports": [{"port": "http"}]}]}  # fmt: skip
    return {"metadata": {"namespace": ns, "name": name}, "spec": spec}


def from_team(ns: str, name: str, team: str) -> Obj:
    spec = {
        "podSelector": {},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": team}}}]}],
    }
    return {"metadata": {"namespace": ns, "name": name}, "spec": spec}


def populate(api: FakeApi) -> None:
    for ns, vnid in (("x", 10), ("y", 11)):
        api.put(NAMESPACE, namespace(ns, team=ns))
        api.put(NET_NAMESPACE, netnamespace(ns, vnid))
        for i in range(4):
            api.put(POD, pod(ns, f"{ns}{i}", f"10.128.{vnid - 10}.{i + 2}", app=f"a{i % 2}"))
    api.put(HOST_SUBNET, hostsubnet("node-a", "192.0.2.10"))
    api.put(NETWORK_POLICY, allow("x", "allow-a0", "a0", "a1"))


@pytest.fixture
async def dataplane() -> FakeDataPlane:
    fake = FakeDataPlane()
    await fake.setup_node(LOCAL)
    return fake


@pytest.fixture
def api() -> FakeApi:
    found = FakeApi()
    populate(found)
    return found


class Running:
    """A ``PolicySync`` with its tasks; cancelled at the end of the test."""

    def __init__(self, sync: PolicySync) -> None:
        self.sync = sync
        self.tasks = [asyncio.create_task(body(), name=name) for name, body in sync.tasks()]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@pytest.fixture
async def running(api: FakeApi, dataplane: FakeDataPlane) -> AsyncIterator[Running]:
    sync = PolicySync(api, dataplane, LOCAL, NETWORKPOLICY, resync_period=60, coalesce=0.02)
    started = Running(sync)
    try:
        yield started
    finally:
        await started.stop()


async def converged(api: FakeApi, dataplane: FakeDataPlane, plugin: str = NETWORKPOLICY) -> None:
    """Wait until the fake data plane holds ``compile_rules`` over the API's objects."""
    want = api.expected(plugin).fingerprint()
    what = f"the data plane to reach {want}"
    await eventually(lambda: dataplane.state.policy_fingerprint == want, what=what)


async def settled(sync: PolicySync, loops: int = 5) -> None:
    """A kept sleep, the window of a negative check: a few coalescing periods (time is
    what coalescing is about) in which no further apply may happen."""
    await asyncio.sleep(sync.coalesce * loops)


# ---- the sync loop -------------------------------------------------------------------------


async def test_nothing_is_applied_until_every_watch_has_listed(
    api: FakeApi, dataplane: FakeDataPlane
) -> None:
    api.hold(NETWORK_POLICY)
    sync = PolicySync(api, dataplane, LOCAL, NETWORKPOLICY, resync_period=60, coalesce=0.01)
    started = Running(sync)
    try:
        await eventually(lambda: len(api.watched) >= 5, what="every watch to start")
        await settled(sync)
        assert not sync.ready()
        assert "sync_policy" not in dataplane.calls and not sync.synced.is_set()
        api.release(NETWORK_POLICY)
        await converged(api, dataplane)
        assert sync.synced.is_set() and sync.applied == 1
        assert dataplane.calls.count("sync_policy") == 1
        assert sync.last_rules is dataplane.state.policy
    finally:
        await started.stop()


async def test_every_kind_of_change_reaches_the_data_plane(
    api: FakeApi, dataplane: FakeDataPlane, running: Running
) -> None:
    await converged(api, dataplane)
    changes = [
        lambda: api.put(NETWORK_POLICY, from_team("y", "from-team-x", "x")),
        lambda: api.put(POD, pod("x", "x1", "10.128.0.3", app="a0")),  # relabelled
        lambda: api.put(NAMESPACE, namespace("y", team="x")),
        lambda: api.put(NET_NAMESPACE, netnamespace("y", 10)),
        lambda: api.put(HOST_SUBNET, hostsubnet("node-b", "192.0.2.11")),
        lambda: api.delete(POD, pod("y", "y2", "10.128.1.4")),
        lambda: api.delete(NETWORK_POLICY, allow("x", "allow-a0", "a0", "a1")),
        lambda: api.delete(HOST_SUBNET, hostsubnet("node-b", "192.0.2.11")),
    ]
    for change in changes:
        change()
        await converged(api, dataplane)
    assert running.sync.applied == dataplane.policy_changes >= 1 + len(changes)


async def test_a_burst_of_changes_is_one_apply(
    api: FakeApi, dataplane: FakeDataPlane, running: Running
) -> None:
    await converged(api, dataplane)
    before = dataplane.calls.count("sync_policy")
    for i in range(20):
        api.put(NETWORK_POLICY, allow("x", f"burst-{i}", f"a{i % 2}", "a1"))
    await converged(api, dataplane)
    await settled(running.sync)
    assert dataplane.calls.count("sync_policy") == before + 1
    assert len(dataplane.state.policy.policies) == 21  # type: ignore[union-attr]
    assert running.sync.last_latency is not None and running.sync.applied_at is not None


async def test_a_relisting_replaces_the_kind(
    api: FakeApi, dataplane: FakeDataPlane, running: Running
) -> None:
    await converged(api, dataplane)
    api.objects[NETWORK_POLICY.plural].clear()  # deleted while the watch was down
    api.objects[POD.plural].pop("x/x0")
    api.relist(NETWORK_POLICY)
    api.relist(POD)
    await converged(api, dataplane)
    assert dataplane.state.policy is not None and dataplane.state.policy.policies == ()


async def test_failed_apply_is_retried_and_resync_reapplies_the_same_rules(
    api: FakeApi, dataplane: FakeDataPlane
) -> None:
    dataplane.fail_next["sync_policy"] = DataPlaneError("nft: busy")
    sync = PolicySync(api, dataplane, LOCAL, NETWORKPOLICY, resync_period=0.1, coalesce=0.01)
    started = Running(sync)
    try:
        await converged(api, dataplane)
        calls = dataplane.calls.count("sync_policy")
        assert calls >= 2
        await eventually(lambda: dataplane.calls.count("sync_policy") >= calls + 2, what="resyncs")
        assert sync.applied == 1 and dataplane.policy_changes == 1  # the same object again
        assert sync.last_rules is dataplane.state.policy
    finally:
        await started.stop()


async def test_subnet_mode_applies_the_empty_rule_set_and_watches_nothing(
    api: FakeApi, dataplane: FakeDataPlane
) -> None:
    sync = PolicySync(api, dataplane, LOCAL, SUBNET, resync_period=60, coalesce=0.01)
    assert [name for name, _ in sync.tasks()] == ["policy-sync"]
    started = Running(sync)
    try:
        await sync.synced.wait()
        assert dataplane.state.policy == compile_rules(SUBNET, [], [], [], [])
        assert api.watched == []
    finally:
        await started.stop()


async def test_multitenant_mode_watches_and_keeps_what_it_reads(
    api: FakeApi, dataplane: FakeDataPlane
) -> None:
    sync = PolicySync(api, dataplane, LOCAL, MULTITENANT, resync_period=60, coalesce=0.01)
    started = Running(sync)
    try:
        await converged(api, dataplane, MULTITENANT)
        assert sorted(api.watched) == ["hostsubnets", "netnamespaces", "pods"]
        api.put(NET_NAMESPACE, netnamespace("y", 0))  # made global
        await converged(api, dataplane, MULTITENANT)
        kept = sync.compiler.objects(PODS)["x/x0"]
        assert "annotations" not in kept["metadata"] and "image" not in str(kept)
    finally:
        await started.stop()


async def test_the_applied_change_is_logged(
    api: FakeApi, dataplane: FakeDataPlane, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "podnet.agent.policies")
    sync = PolicySync(api, dataplane, LOCAL, NETWORKPOLICY, resync_period=60, coalesce=0.01)
    started = Running(sync)
    try:
        await converged(api, dataplane)
        await sync.synced.wait()
    finally:
        await started.stop()
    assert "policy rules applied (networkpolicy): 8 pods, 1 policies, 1 rules" in caplog.text


def test_plugin_names_host_ips_and_plugin_changes(dataplane: FakeDataPlane) -> None:
    assert network_plugin({"pluginName": "redhat/openshift-ovs-multitenant"}) == MULTITENANT
    assert network_plugin({}) == SUBNET
    with pytest.raises(ValueError):
        network_plugin({"pluginName": "calico"})
    assert host_ip({"hostIP": "192.0.2.1"}) == "192.0.2.1"
    assert host_ip({"hostIP": "fe80::1"}) is None and host_ip({}) is None
    sync = PolicySync(FakeApi(), dataplane, LOCAL, MULTITENANT, resync_period=60)
    assert sync.plugin_change({"pluginName": MULTITENANT}) == []
    change = {"pluginName": NETWORKPOLICY}
    assert sync.plugin_change(change) == [f"pluginName: {MULTITENANT} -> {NETWORKPOLICY}"]
    assert sync.plugin_change(change) == []  # said once


# ---- the fake data plane's checks ------------------------------------------------------------


def rule_sets() -> Iterator[tuple[str, RuleSet]]:
    api = FakeApi()
    populate(api)
    good = api.expected(NETWORKPOLICY)
    policy = good.policies[0]
    yield "unknown plugin", replace(good, plugin="calico")
    yield "not sorted by IP", replace(good, endpoints=good.endpoints[::-1])
    yield "VNID map", replace(good, isolation=api.expected(MULTITENANT).isolation)
    yield "policies outside", replace(api.expected(MULTITENANT), policies=good.policies)
    yield "share a key", replace(good, policies=(policy, policy))
    yield "other targets", replace(good, policies=(replace(policy, targets=frozenset()),))
    yield "ingress_isolated", replace(good, ingress_isolated=frozenset())
    yield "egress_isolated", replace(good, egress_isolated=policy.targets)


async def test_fake_refuses_rule_sets_a_backend_could_not_render(
    dataplane: FakeDataPlane,
) -> None:
    for problem, bad in rule_sets():
        with pytest.raises(DataPlaneError, match=problem):
            await dataplane.sync_policy(LOCAL, bad)
    assert dataplane.state.policy is None and dataplane.policy_changes == 0
    with pytest.raises(DataPlaneError, match="not set up"):
        await FakeDataPlane().sync_policy(LOCAL, compile_rules(SUBNET, [], [], [], []))


async def test_fake_keeps_the_policy_fingerprint_across_restarts(tmp_path: Path) -> None:
    first = FakeDataPlane(state_file=tmp_path / "fake.json")
    await first.setup_node(LOCAL)
    api = FakeApi()
    populate(api)
    rules = api.expected(NETWORKPOLICY)
    await first.sync_policy(LOCAL, rules)
    again = FakeDataPlane(state_file=tmp_path / "fake.json")
    assert again.state.policy_fingerprint == rules.fingerprint()
    assert again.count("sync_policy") == 1


# ---- a policy the data plane refuses ---------------------------------------------------------


async def test_a_refused_policy_is_left_out_and_the_rest_applies(
    api: FakeApi, dataplane: FakeDataPlane, tmp_path: Path
) -> None:
    for i in range(12):
        api.put(NETWORK_POLICY, allow("x", f"allow-{i:02d}", f"a{i % 2}", "a1"))
    api.put(NETWORK_POLICY, from_team("y", "from-team-x", "x"))
    dataplane.refuse.add("x/allow-07")  # its rendering is refused, as nft would
    metrics, records = ReconcileMetrics(), []
    note = tmp_path / "policy.json"
    sync = PolicySync(
        api, dataplane, LOCAL, NETWORKPOLICY, resync_period=60, coalesce=0.01,
        status_path=note, metrics=metrics, report=records.append,
    )  # fmt: skip
    started = Running(sync)
    try:
        await asyncio.wait_for(sync.synced.wait(), 20)
        held = dataplane.state.policy
        assert held is not None and sync.loop.left_out == {"x/allow-07"}
        want = api.expected(NETWORKPOLICY)
        assert [p.key for p in held.policies] == [p.key for p in want.policies]
        for have, full in zip(held.policies, want.policies, strict=True):
            assert have.rules == (() if have.key == "x/allow-07" else full.rules), have.key
        assert held.ingress_isolated == want.ingress_isolated  # its pods stay isolated
        assert records[-1].result == PARTIAL and records[-1].left_out == ("x/allow-07",)
        assert "x/allow-07" in records[-1].error
        value = metrics.registry.get_sample_value
        assert value("podnet_reconcile_permanent_errors_total", {"loop": "policy"}) == 1
        assert value("podnet_reconcile_left_out", {"loop": "policy"}) == 1
        written = json.loads(note.read_text())
        assert written["result"] == PARTIAL and written["left_out"] == ["x/allow-07"]

        dataplane.refuse.clear()  # fixed, say by a new agent: the next change applies all
        api.put(POD, pod("x", "x9", "10.128.0.99", app="a0"))
        await converged(api, dataplane)
        assert sync.loop.left_out == frozenset() and records[-1].result == APPLIED
    finally:
        await started.stop()
