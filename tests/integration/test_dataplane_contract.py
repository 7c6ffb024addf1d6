"""The DataPlane contract (``podnet.dataplane.interface``), checked against every
implementation registered in ``podnet.dataplane.registry``.

Each test runs once per registered name, through the registry's own factory, with the
harness of ``podnet.testing.harnesses`` (``linux``: in a lab namespace of its own,
removed afterwards, root required; ``fake``: in memory). The promises: every method is
idempotent, so calling it again changes nothing; ``check_node`` reports drift and
``setup_node`` repairs it; remote nodes are matched exactly; pods are wired as asked and
leave nothing behind; a restarted plane finds the state its predecessor built.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from ipaddress import IPv4Address
from pathlib import Path

import pytest

from podnet.dataplane import registry
from podnet.dataplane.interface import TUNNELS, DataPlaneRejected, DataPlaneStatus, RemoteNode
from podnet.model.network import MULTITENANT, NETWORKPOLICY, SUBNET
from podnet.policy.compile import compile_rules
from podnet.policy.model import RuleSet
from podnet.services.model import Endpoint, ServicePort, ServiceTable
from podnet.testing.dataplanes import Harness, PodView
from podnet.testing.harnesses import harness_class, opened

Obj = dict[str, object]


def implementations() -> list[object]:
    """Every registered name; one that needs root is marked ``root`` (required, never
    skipped: tests/conftest.py). A name without a harness fails in the fixture."""
    params: list[object] = []
    for name in registry.names():
        try:
            root = harness_class(name).needs_root
        except LookupError:
            root = False
        params.append(pytest.param(name, marks=[pytest.mark.root] if root else [], id=name))
    return params


@pytest.fixture(params=implementations())
async def dp(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    async with opened(request.param, tmp_path / "state") as harness:
        yield harness


async def ready(dp: Harness, tunnel: str = "vxlan", **overrides: object) -> None:
    """Set the node up, with nodes 2 and 3 as remotes."""
    node = dp.network(tunnel, **overrides)
    await dp.plane.setup_node(node)
    await dp.plane.sync_remote_nodes(node, [dp.remote(2), dp.remote(3)])


def ok(status: DataPlaneStatus) -> bool:
    assert status.ok == (not status.problems), status
    return status.ok


# --- the node's own set-up ---------------------------------------------------------------


@pytest.mark.parametrize("tunnel", TUNNELS)
async def test_setup_node_is_idempotent(dp: Harness, tunnel: str) -> None:
    node = dp.network(tunnel)
    untouched = await dp.snapshot()
    assert not ok(await dp.plane.check_node(node)), "a fresh node is not set up"
    assert await dp.snapshot() == untouched, "check_node changes nothing"
    await dp.plane.setup_node(node)
    assert ok(await dp.plane.check_node(node))
    before = await dp.snapshot()
    await dp.plane.setup_node(node)
    assert await dp.snapshot() == before
    assert ok(await dp.plane.check_node(node))


async def test_check_node_reports_drift_and_setup_node_repairs_it(dp: Harness) -> None:
    await ready(dp)
    pod = dp.pod(10, "a")
    await dp.plane.attach_pod(pod)
    node = dp.network()
    await dp.drift_node()
    status = await dp.plane.check_node(node)
    assert not ok(status) and status.problems
    await dp.plane.setup_node(node)
    assert ok(await dp.plane.check_node(node))
    assert await dp.pod_view(pod) == PodView.wanted(pod), "the repair left the pod alone"


async def test_a_changed_network_is_a_drift_and_setup_moves_to_it(dp: Harness) -> None:
    await ready(dp)
    for changed in (dp.network("host-gw"), dp.network(isolation=True), dp.network(mtu=1400)):
        assert not ok(await dp.plane.check_node(changed)), changed
        await dp.plane.setup_node(changed)
        assert ok(await dp.plane.check_node(changed)), changed
        assert not ok(await dp.plane.check_node(dp.network())), changed
        await dp.plane.setup_node(dp.network())


# --- remote nodes ---------------------------------------------------------------------


def routed(*remotes: RemoteNode) -> dict[object, IPv4Address]:
    return {r.subnet: r.node_ip for r in remotes}


@pytest.mark.parametrize("tunnel", TUNNELS)
async def test_sync_remote_nodes_adds_replaces_removes(dp: Harness, tunnel: str) -> None:
    node, r2, r3 = dp.network(tunnel), dp.remote(2), dp.remote(3)
    await dp.plane.setup_node(node)
    await dp.plane.sync_remote_nodes(node, [r2])
    assert await dp.remote_routes() == routed(r2)
    await dp.plane.sync_remote_nodes(node, [r2, r3])
    assert await dp.remote_routes() == routed(r2, r3)
    moved = RemoteNode(r3.name, IPv4Address("198.51.100.33"), r3.subnet)
    await dp.plane.sync_remote_nodes(node, [r2, moved])
    assert await dp.remote_routes() == routed(r2, moved)
    await dp.plane.sync_remote_nodes(node, [moved])
    assert await dp.remote_routes() == routed(moved)
    await dp.plane.sync_remote_nodes(node, [])
    assert await dp.remote_routes() == {}
    assert ok(await dp.plane.check_node(node))


@pytest.mark.parametrize("tunnel", TUNNELS)
async def test_sync_remote_nodes_is_idempotent_and_repairs_drift(dp: Harness, tunnel: str) -> None:
    await ready(dp, tunnel)
    node, remotes = dp.network(tunnel), [dp.remote(2), dp.remote(3)]
    before = await dp.snapshot()
    await dp.plane.sync_remote_nodes(node, remotes)
    assert await dp.snapshot() == before
    await dp.drift_remote(dp.remote(3))
    assert await dp.remote_routes() == routed(dp.remote(2))
    await dp.plane.sync_remote_nodes(node, remotes)
    assert await dp.remote_routes() == routed(*remotes)


# --- pods ------------------------------------------------------------------------------


async def test_attach_pod_wires_ip_mac_routes_and_mtu(dp: Harness) -> None:
    await ready(dp)
    a, b = dp.pod(10, "a"), dp.pod(11, "b")
    wired = [await dp.plane.attach_pod(p) for p in (a, b)]
    for pod, attachment in zip((a, b), wired, strict=True):
        assert (attachment.container_id, attachment.ifname) == (pod.container_id, pod.ifname)
        assert (attachment.address, attachment.gateway) == (pod.address, pod.gateway)
        assert (attachment.mac, attachment.mtu, attachment.sandbox) == (
            pod.mac,
            pod.mtu,
            pod.netns,
        )
        assert await dp.pod_view(pod) == PodView.wanted(pod)
    assert sorted(await dp.plane.attached_pods(), key=str) == sorted(wired, key=str)
    assert len({w.host_ifname for w in wired}) == 2
    assert ok(await dp.plane.check_node(dp.network()))


async def test_detach_pod_is_idempotent_and_leaves_nothing(dp: Harness) -> None:
    await ready(dp)
    a, b = dp.pod(10, "a"), dp.pod(11, "b")
    await dp.plane.attach_pod(a)
    kept = await dp.plane.attach_pod(b)
    assert await dp.leftovers(a), "the view sees a wired pod"
    for _ in range(2):
        await dp.plane.detach_pod(a.container_id, a.ifname, a.netns)
        assert await dp.leftovers(a) == []
    await dp.plane.detach_pod(a.container_id, a.ifname, None)
    assert await dp.plane.attached_pods() == [kept]
    assert await dp.pod_view(b) == PodView.wanted(b)
    assert ok(await dp.plane.check_node(dp.network()))
    again = await dp.plane.attach_pod(a)  # the same pod and address, added after its DEL
    assert await dp.pod_view(a) == PodView.wanted(a)
    assert sorted(await dp.plane.attached_pods(), key=str) == sorted([kept, again], key=str)


# --- policy -------------------------------------------------------------------------------


def pod_object(dp: Harness, name: str, host: int) -> Obj:
    ip = dp.network().subnet.network_address + host
    meta = {"namespace": "x", "name": name, "labels": {"pod": name}}
    spec = {"nodeName": dp.network().node_name, "containers": [{"name": "c"}]}
    return {"metadata": meta, "spec": spec, "status": {"phase": "Running", "podIP": str(ip)}}


def rule_sets(dp: Harness) -> tuple[list[RuleSet], list[RuleSet]]:
    """(empty rule sets: nothing to enforce, rule sets with rules in them)."""
    pods = [pod_object(dp, "a", 10), pod_object(dp, "b", 11)]
    namespaces: list[Obj] = [{"metadata": {"name": "x", "labels": {"ns": "x"}}}]
    deny = {"metadata": {"namespace": "x", "name": "deny"}, "spec": {"podSelector": {}}}
    netns_x = {"metadata": {"name": "x"}, "netname": "x", "netid": 10}
    empty = [
        compile_rules(SUBNET, pods, namespaces, [], []),
        compile_rules(NETWORKPOLICY, pods, namespaces, [], []),
    ]
    full = [
        compile_rules(NETWORKPOLICY, pods, namespaces, [], [deny]),
        compile_rules(MULTITENANT, pods, namespaces, [netns_x], []),
    ]
    return empty, full


async def test_sync_policy_applies_empty_and_full_rule_sets_idempotently(dp: Harness) -> None:
    await ready(dp, isolation=True)
    node = dp.network(isolation=True)
    for pod in (dp.pod(10, "a"), dp.pod(11, "b")):
        await dp.plane.attach_pod(pod)
    empty, full = rule_sets(dp)
    assert all(rules.size().rules == 0 for rules in empty)
    for rules in [*empty, *full, empty[0]]:
        await dp.plane.sync_policy(node, rules)
        assert await dp.policy_in_force() == (rules.size().rules > 0), rules.plugin
        before = await dp.snapshot()
        await dp.plane.sync_policy(node, rules)
        assert await dp.snapshot() == before, rules.plugin
    assert ok(await dp.plane.check_node(node))


# --- services -----------------------------------------------------------------------------


def service_table(dp: Harness, *names: str, ip_of: dict[str, int] | None = None) -> ServiceTable:
    """One TCP port per name, on cluster IP .10, .11... of the service network (or the
    host given in ``ip_of``), each with one local endpoint."""
    network, subnet = dp.network().service_network, dp.network().subnet
    ports = []
    for k, name in enumerate(names):
        host = (ip_of or {}).get(name, 10 + k)
        endpoint = Endpoint(subnet.network_address + 10 + k, 8080, local=True)
        ports.append(
            ServicePort(
                "x", name, "", "tcp", 80, network.network_address + host, endpoints=(endpoint,)
            )
        )
    return ServiceTable(tuple(ports))


async def test_sync_services_is_idempotent_and_survives_a_restart(dp: Harness) -> None:
    await ready(dp)
    node = dp.network()
    for table in (service_table(dp, "a", "b"), service_table(dp, "a", "c")):
        await dp.plane.sync_services(node, table)
        assert await dp.services_in_force()
        before = await dp.snapshot()
        await dp.plane.sync_services(node, table)
        assert await dp.snapshot() == before
    restarted = await dp.open()  # as the agent starts: check, set up (a no-op), sync
    assert ok(await restarted.check_node(node))
    await restarted.setup_node(node)
    await restarted.sync_services(node, table)
    assert await dp.snapshot() == before
    await restarted.sync_services(node, ServiceTable())
    assert not await dp.services_in_force()
    assert ok(await restarted.check_node(node))


async def test_sync_services_refuses_two_services_on_one_address(dp: Harness) -> None:
    await ready(dp)
    node = dp.network()
    await dp.plane.sync_services(node, service_table(dp, "a"))
    before = await dp.snapshot()
    clash = service_table(dp, "a", "b", ip_of={"a": 10, "b": 10})
    with pytest.raises(DataPlaneRejected):
        await dp.plane.sync_services(node, clash)
    assert await dp.snapshot() == before


# --- restart and teardown -------------------------------------------------------------------


async def test_a_restarted_plane_finds_everything_and_changes_nothing(dp: Harness) -> None:
    await ready(dp)
    wired = [await dp.plane.attach_pod(dp.pod(10 + k, f"r{k}")) for k in range(3)]
    before = await dp.snapshot()
    node = dp.network()
    restarted = await dp.open()
    assert ok(await restarted.check_node(node))
    assert sorted(await restarted.attached_pods(), key=str) == sorted(wired, key=str)
    await restarted.setup_node(node)
    await restarted.sync_remote_nodes(node, [dp.remote(2), dp.remote(3)])
    assert await dp.snapshot() == before


async def test_a_sandbox_gone_while_the_plane_was_down_is_not_attached_after(dp: Harness) -> None:
    """A runtime removed a pod's network namespace without a DEL while the agent was down:
    the restarted plane (check, and set-up when the check finds a problem, as the agent
    starts) no longer lists the pod, so the agent's start-up cleanup releases its address,
    and nothing of it is left."""
    await ready(dp)
    kept, lost = dp.pod(10, "kept"), dp.pod(11, "lost")
    for pod in (kept, lost):
        await dp.plane.attach_pod(pod)
    await dp.drift_sandbox_gone(lost)
    node = dp.network()
    restarted = await dp.open()
    if not ok(await restarted.check_node(node)):
        await restarted.setup_node(node)
    assert [a.container_id for a in await restarted.attached_pods()] == [kept.container_id]
    assert await dp.leftovers(lost) == []
    assert await dp.pod_view(kept) == PodView.wanted(kept)


async def test_teardown_leaves_nothing(dp: Harness) -> None:
    await ready(dp, isolation=True)
    node = dp.network(isolation=True)
    pods = [dp.pod(10 + k, f"t{k}") for k in range(3)]
    for pod in pods:
        await dp.plane.attach_pod(pod)
    empty, full = rule_sets(dp)
    await dp.plane.sync_policy(node, full[0])
    for pod in pods:
        await dp.plane.detach_pod(pod.container_id, pod.ifname, pod.netns)
    await dp.plane.sync_remote_nodes(node, [])
    await dp.plane.sync_policy(node, empty[1])
    assert await dp.plane.attached_pods() == []
    assert [left for pod in pods for left in await dp.leftovers(pod)] == []
    assert await dp.remote_routes() == {}
    assert not await dp.policy_in_force()
    assert ok(await dp.plane.check_node(node))


# --- the egress firewall -----------------------------------------------------------------


async def test_sync_egress_firewall_applies_replaces_and_removes_idempotently(
    dp: Harness,
) -> None:
    from podnet.egress.nodetable import NodeFirewall

    await ready(dp)
    node = dp.network()
    a, b = (IPv4Address(str(node.gateway.ip + k)) for k in (10, 11))
    denied = ((int(IPv4Address("192.0.2.0")), int(IPv4Address("192.0.2.255"))),)
    first = NodeFirewall({10: denied}, {a: 10})
    await dp.plane.sync_egress_firewall(node, first)
    assert await dp.egress_firewalled() == {str(a)}
    before = await dp.snapshot()
    await dp.plane.sync_egress_firewall(node, first)  # the same again: nothing changes
    assert await dp.snapshot() == before
    second = NodeFirewall({10: denied, 11: ((0, 2**32 - 1),)}, {a: 10, b: 11})
    await dp.plane.sync_egress_firewall(node, second)
    assert await dp.egress_firewalled() == {str(a), str(b)}
    await dp.plane.sync_egress_firewall(node, NodeFirewall())
    assert await dp.egress_firewalled() == set()  # no firewalled pod: no table
    assert ok(await dp.plane.check_node(node))
