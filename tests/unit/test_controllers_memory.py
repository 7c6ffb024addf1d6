"""The master's controllers over the in-memory store, with the real validation.

The controllers get the master's in-process object API (the registry and a watch cache);
the tests act as users straight on the registry.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator
from ipaddress import IPv4Network
from typing import Any

import pytest

from podnet.api.registry import Registry
from podnet.api.watchcache import WatchCache
from podnet.client.backoff import Backoff
from podnet.client.errors import ServerError
from podnet.controllers import namespaces as namespaces_module
from podnet.controllers.base import changes
from podnet.controllers.cache import ObjectCache
from podnet.controllers.clusternetwork import ClusterNetworkError, ensure_cluster_network
from podnet.controllers.config import MULTITENANT, NetworkConfig, parse_cluster_networks
from podnet.controllers.hostsubnets import HostSubnetController
from podnet.controllers.inprocess import InProcessApi
from podnet.controllers.manager import ControllerManager
from podnet.controllers.namespaces import NamespaceCleanupController, ensure_namespace
from podnet.controllers.netnamespaces import (
    CHANGE_NETWORK_ANNOTATION,
    CHANGE_NETWORK_ERROR_ANNOTATION,
)
from podnet.controllers.objects import ASSIGN_SUBNET_ANNOTATION, NODE_UID_ANNOTATION
from podnet.controllers.workqueue import KeyedQueue
from podnet.model.errors import ApiError
from podnet.model.kinds import (
    CLUSTER_NETWORK,
    EVENT,
    HOST_SUBNET,
    NAMESPACE,
    NET_NAMESPACE,
    NODE,
    POD,
    SERVICE,
    Kind,
)
from podnet.store.base import Delete
from podnet.testing.e2e import eventually

Obj = dict[str, Any]


def node(name: str, ip: str | None) -> Obj:
    status = {"addresses": [{"type": "InternalIP", "address": ip}]} if ip else {}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "status": status}


_HOST_IPS = itertools.count()


def hostsubnet(name: str, subnet: str | None, annotations: dict[str, str] | None = None) -> Obj:
    obj: Obj = {
        "apiVersion": "network.openshift.io/v1",
        "kind": "HostSubnet",
        "metadata": {"name": name, "annotations": annotations or {}},
        "host": name,
        # A fresh address each time: a hostIP is unique across HostSubnets (a claim).
        "hostIP": f"198.51.100.{next(_HOST_IPS) % 250 + 1}",
    }
    if subnet:
        obj["subnet"] = subnet
    return obj


async def subnets(registry: Registry) -> dict[str, Obj]:
    items, _ = await registry.list(HOST_SUBNET)
    return {h["metadata"]["name"]: h for h in items}


async def get_or_none(
    registry: Registry, kind: Any, name: str, ns: str | None = None
) -> Obj | None:
    try:
        return await registry.get(kind, ns, name)
    except ApiError:
        return None


async def start_hostsubnets(
    api: InProcessApi, flag: str = "10.128.0.0/14:9"
) -> HostSubnetController:
    config = NetworkConfig.default()
    config.cluster_networks = parse_cluster_networks([flag])
    cluster_network = await ensure_cluster_network(api, config)
    await ensure_namespace(api, "default")  # where Events go
    controller = HostSubnetController(api, cluster_network, resync_period=None)
    await controller.start()
    return controller


@pytest.fixture
async def running(api: InProcessApi) -> AsyncIterator[HostSubnetController]:
    controller = await start_hostsubnets(api)
    yield controller
    await controller.stop()


# ---- HostSubnets ---------------------------------------------------------------------------


async def test_node_add_ip_change_delete_and_readd(
    registry: Registry, running: HostSubnetController
) -> None:
    created = await registry.create(NODE, node("n1", "192.0.2.1"))
    hs = await eventually(lambda: get_or_none(registry, HOST_SUBNET, "n1"))
    assert hs["host"] == "n1" and hs["hostIP"] == "192.0.2.1"
    assert hs["subnet"] == "10.128.0.0/23"
    assert hs["metadata"]["annotations"][NODE_UID_ANNOTATION] == created["metadata"]["uid"]

    await registry.patch(
        NODE,
        None,
        "n1",
        {"status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.99"}]}},
        subresource="status",
    )

    async def moved() -> Obj | None:
        current = await get_or_none(registry, HOST_SUBNET, "n1")
        return current if current and current["hostIP"] == "192.0.2.99" else None

    after = await eventually(moved)
    assert after["subnet"] == hs["subnet"] and after["metadata"]["uid"] == hs["metadata"]["uid"]

    await registry.delete(NODE, None, "n1")
    await eventually(lambda: _absent(registry, "n1"))
    assert not running.allocator.is_allocated(IPv4Network(hs["subnet"]))

    await registry.create(NODE, node("n1", "192.0.2.1"))
    again = await eventually(lambda: get_or_none(registry, HOST_SUBNET, "n1"))
    assert again["subnet"] == "10.128.2.0/23"  # next-fit: the old one waits for a wrap


async def _absent(registry: Registry, name: str) -> bool:
    return await get_or_none(registry, HOST_SUBNET, name) is None


async def test_the_node_s_underlay_mac_follows_it_to_its_hostsubnet(
    registry: Registry, running: HostSubnetController
) -> None:
    """Issue 19, finding 7: the MAC a node publishes on its Node reaches its HostSubnet
    (where the peers read it), follows a change and goes when the node removes it."""
    mac_of = "podnet.io/underlay-mac"
    first = node("n1", "192.0.2.1")
    first["metadata"]["annotations"] = {mac_of: "02:00:00:00:00:01"}
    await registry.create(NODE, first)

    async def mac_is(want: str | None) -> Obj | None:
        current = await get_or_none(registry, HOST_SUBNET, "n1")
        found = (current or {}).get("metadata", {}).get("annotations", {}).get(mac_of)
        return current if current is not None and found == want else None

    await eventually(lambda: mac_is("02:00:00:00:00:01"))
    await registry.patch(
        NODE, None, "n1", {"metadata": {"annotations": {mac_of: "02:00:00:00:00:02"}}}
    )
    await eventually(lambda: mac_is("02:00:00:00:00:02"))
    await registry.patch(NODE, None, "n1", {"metadata": {"annotations": {mac_of: None}}})
    await eventually(lambda: mac_is(None))


async def test_node_without_internal_ip_is_skipped_until_it_has_one(
    registry: Registry, running: HostSubnetController, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    await registry.create(NODE, node("bare", None))
    await eventually(lambda: _logged(caplog, "bare has no InternalIP"))
    assert await get_or_none(registry, HOST_SUBNET, "bare") is None
    await registry.patch(
        NODE,
        None,
        "bare",
        {"status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.7"}]}},
        subresource="status",
    )
    await eventually(lambda: get_or_none(registry, HOST_SUBNET, "bare"))


async def _logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return text in caplog.text


async def test_start_marks_existing_and_removes_orphans(
    registry: Registry, api: InProcessApi
) -> None:
    real = await registry.create(NODE, node("real", "192.0.2.1"))
    await registry.create(NODE, node("legacy", "192.0.2.2"))
    reborn = await registry.create(NODE, node("reborn", "192.0.2.3"))
    uid = real["metadata"]["uid"]
    await registry.create(
        HOST_SUBNET,
        {**hostsubnet("real", "10.128.0.0/23", {NODE_UID_ANNOTATION: uid}), "hostIP": "192.0.2.1"},
    )
    await registry.create(HOST_SUBNET, hostsubnet("legacy", "10.128.2.0/23"))  # no uid: adopted
    stale = await registry.create(
        HOST_SUBNET, hostsubnet("reborn", "10.128.4.0/23", {NODE_UID_ANNOTATION: "an-old-uid"})
    )
    await registry.create(HOST_SUBNET, hostsubnet("ghost", "10.128.6.0/23"))  # no node at all
    await registry.create(
        HOST_SUBNET, hostsubnet("f5", "10.128.8.0/23", {ASSIGN_SUBNET_ANNOTATION: "true"})
    )
    controller = await start_hostsubnets(api)
    try:
        left = await subnets(registry)
        assert set(left) == {"real", "legacy", "reborn", "f5"}
        assert left["real"]["subnet"] == "10.128.0.0/23"
        assert left["legacy"]["subnet"] == "10.128.2.0/23"
        assert left["legacy"]["hostIP"] == "192.0.2.2"
        assert left["legacy"]["metadata"]["annotations"][NODE_UID_ANNOTATION]
        # reborn's stale HostSubnet was replaced by one for the current Node
        assert left["reborn"]["metadata"]["uid"] != stale["metadata"]["uid"]
        notes = left["reborn"]["metadata"]["annotations"]
        assert notes[NODE_UID_ANNOTATION] == reborn["metadata"]["uid"]
        used = {h["subnet"] for h in left.values()}
        assert len(used) == 4
        assert controller.allocator.available == controller.allocator.total - 4
    finally:
        await controller.stop()


async def test_assign_subnet_for_a_host_that_is_not_a_node(
    registry: Registry, running: HostSubnetController
) -> None:
    await registry.create(HOST_SUBNET, hostsubnet("f5-1", None, {ASSIGN_SUBNET_ANNOTATION: "true"}))

    async def assigned() -> str | None:
        hs = await get_or_none(registry, HOST_SUBNET, "f5-1")
        return hs.get("subnet") if hs else None

    subnet = IPv4Network(await eventually(assigned))
    assert subnet.prefixlen == 23 and running.allocator.is_allocated(subnet)
    await registry.create(NODE, node("n1", "192.0.2.1"))  # churn: f5-1 must survive it
    await eventually(lambda: get_or_none(registry, HOST_SUBNET, "n1"))
    await running.queue.wait_idle()
    assert "f5-1" in await subnets(registry)


async def test_exhaustion_sets_condition_event_log_and_recovers(
    registry: Registry, api: InProcessApi, caplog: pytest.LogCaptureFixture
) -> None:
    controller = await start_hostsubnets(api, "10.200.0.0/24:6")  # four /26
    try:
        for i in range(5):
            await registry.create(NODE, node(f"ex-{i}", f"192.0.2.{i + 1}"))
        await eventually(lambda: _waiting(controller))
        await controller.queue.wait_idle()
        victim = next(iter(controller.waiting))
        assert len(await subnets(registry)) == 4
        assert "no subnets available" in caplog.text
        assert any(r.levelno == logging.ERROR and victim in r.getMessage() for r in caplog.records)
        cond = _condition(await registry.get(NODE, None, victim))
        assert (cond["status"], cond["reason"]) == ("True", "NoSubnetsAvailable")
        assert "no subnets available" in cond["message"]
        events, _ = await registry.list(EVENT, "default")
        assert [e["involvedObject"]["name"] for e in events] == [victim]
        assert events[0]["reason"] == "NoSubnetsAvailable"

        donor = next(n for n in await subnets(registry) if n != victim)
        await registry.delete(NODE, None, donor)
        await eventually(lambda: get_or_none(registry, HOST_SUBNET, victim))
        cleared = await eventually(lambda: _condition_is(registry, victim, "False"))
        assert cleared["reason"] == "SubnetAllocated"
        assert len((await registry.list(EVENT, "default"))[0]) == 1  # no second event
    finally:
        await controller.stop()


async def _waiting(controller: HostSubnetController) -> bool:
    return bool(controller.waiting)


def _condition(obj: Obj) -> Obj:
    return next(c for c in obj["status"]["conditions"] if c["type"] == "NetworkUnavailable")


async def _condition_is(registry: Registry, name: str, status: str) -> Obj | None:
    cond = _condition(await registry.get(NODE, None, name))
    return cond if cond["status"] == status else None


async def test_cluster_network_grow_through_the_api_feeds_the_allocator(
    registry: Registry, api: InProcessApi
) -> None:
    controller = await start_hostsubnets(api, "10.200.0.0/25:6")  # two /26
    try:
        for i in range(3):
            await registry.create(NODE, node(f"g-{i}", f"192.0.2.{i + 1}"))
        await eventually(lambda: _waiting(controller))
        await registry.patch(
            CLUSTER_NETWORK,
            None,
            "default",
            {"clusterNetworks": [{"CIDR": "10.200.0.0/24", "hostSubnetLength": 6}]},
        )
        await eventually(lambda: _count(registry, 3))
        assert not controller.waiting
    finally:
        await controller.stop()


async def _count(registry: Registry, n: int) -> bool:
    return len(await subnets(registry)) == n


# ---- ClusterNetwork ------------------------------------------------------------------------


async def test_ensure_cluster_network_creates_grows_and_refuses(api: InProcessApi) -> None:
    config = NetworkConfig.default()
    created = await ensure_cluster_network(api, config)
    assert created["clusterNetworks"] == [{"CIDR": "10.128.0.0/14", "hostSubnetLength": 9}]
    assert (await ensure_cluster_network(api, config))["metadata"]["resourceVersion"] == (
        created["metadata"]["resourceVersion"]
    )
    grown = NetworkConfig.default()
    grown.cluster_networks = parse_cluster_networks(["10.128.0.0/13:9"])
    assert (await ensure_cluster_network(api, grown))["clusterNetworks"][0]["CIDR"] == (
        "10.128.0.0/13"
    )
    # restarting with the old flags keeps the grown network
    kept = await ensure_cluster_network(api, config)
    assert kept["clusterNetworks"][0]["CIDR"] == "10.128.0.0/13"
    shrunk = NetworkConfig.default()
    shrunk.cluster_networks = parse_cluster_networks(["10.0.0.0/16:8"])
    with pytest.raises(ClusterNetworkError, match="only grow"):
        await ensure_cluster_network(api, shrunk)
    moved = NetworkConfig.default()
    moved.service_network = IPv4Network("172.31.0.0/16")
    with pytest.raises(ClusterNetworkError, match="serviceNetwork"):
        await ensure_cluster_network(api, moved)


# ---- NetNamespaces through the manager -----------------------------------------------------


@pytest.fixture
async def manager(api: InProcessApi) -> AsyncIterator[ControllerManager]:
    mgr = ControllerManager(api, NetworkConfig.default(MULTITENANT), resync_period=None)
    task = asyncio.create_task(mgr.run())
    await eventually(lambda: _ready(mgr))
    yield mgr
    await mgr.stop()
    await task


async def _ready(mgr: ControllerManager) -> bool:
    return mgr.ready


async def netids(registry: Registry) -> dict[str, int]:
    items, _ = await registry.list(NET_NAMESPACE)
    return {n["netname"]: n["netid"] for n in items}


async def change(registry: Registry, name: str, request: str) -> Obj:
    await registry.patch(
        NET_NAMESPACE,
        None,
        name,
        {"metadata": {"annotations": {CHANGE_NETWORK_ANNOTATION: request}}},
    )

    async def answered() -> Obj | None:
        obj = await registry.get(NET_NAMESPACE, None, name)
        notes = obj["metadata"].get("annotations") or {}
        return None if CHANGE_NETWORK_ANNOTATION in notes else obj

    return await eventually(answered)


async def test_vnids_default_join_isolate_global_and_release(
    registry: Registry, manager: ControllerManager
) -> None:
    for name in ("a", "b", "c"):
        await registry.create(NAMESPACE, {"metadata": {"name": name}})
    ids = await eventually(lambda: _netids_for(registry, {"default", "a", "b", "c"}))
    assert ids["default"] == 0
    assert len({ids["a"], ids["b"], ids["c"]}) == 3 and min(ids["a"], ids["b"], ids["c"]) >= 10
    vnids = manager.netnamespaces.vnids  # type: ignore[union-attr]

    old_b = ids["b"]
    await change(registry, "b", "join:a")
    await change(registry, "c", "join:a")
    ids = await netids(registry)
    assert ids["b"] == ids["c"] == ids["a"] and vnids.users(ids["a"]) == 3
    assert vnids.users(old_b) == 0

    await change(registry, "b", "isolate")
    ids = await netids(registry)
    assert ids["b"] not in (ids["a"], 0) and vnids.users(ids["a"]) == 2

    await registry.delete(NAMESPACE, None, "c")
    await eventually(lambda: _gone(registry, "c"))
    assert vnids.users(ids["a"]) == 1
    await change(registry, "a", "isolate")  # already alone: keeps its VNID
    assert (await netids(registry))["a"] == ids["a"]

    done = await change(registry, "a", "global")
    assert done["netid"] == 0 and vnids.users(ids["a"]) == 0

    refused = await change(registry, "b", "join:nope")
    assert "nope" in refused["metadata"]["annotations"][CHANGE_NETWORK_ERROR_ANNOTATION]
    assert refused["netid"] == ids["b"]
    fixed = await change(registry, "b", "global")
    assert CHANGE_NETWORK_ERROR_ANNOTATION not in (fixed["metadata"].get("annotations") or {})
    refused = await change(registry, "default", "isolate")
    assert refused["netid"] == 0


async def _netids_for(registry: Registry, names: set[str]) -> dict[str, int] | None:
    ids = await netids(registry)
    return ids if names <= set(ids) else None


async def _gone(registry: Registry, name: str) -> bool:
    return name not in await netids(registry)


async def test_deleted_namespace_loses_its_objects(
    registry: Registry, manager: ControllerManager
) -> None:
    await registry.create(NAMESPACE, {"metadata": {"name": "x"}})
    await registry.create(
        POD, {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}, "x"
    )
    await registry.create(
        SERVICE, {"metadata": {"name": "s"}, "spec": {"ports": [{"port": 80}]}}, "x"
    )
    await registry.create(NAMESPACE, {"metadata": {"name": "y"}})
    await registry.create(
        POD, {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}, "y"
    )
    await registry.delete(NAMESPACE, None, "x")
    await eventually(lambda: _empty(registry, "x"))
    assert len((await registry.list(POD, "y"))[0]) == 1


async def test_objects_of_a_namespace_that_is_gone_entirely_are_removed(
    registry: Registry, api: InProcessApi
) -> None:
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    for ns in ("ghost", "alive"):
        await registry.create(NAMESPACE, {"metadata": {"name": ns}})
        await registry.create(POD, pod, ns)
    # The Namespace vanishes without finalization (a write that raced it, an etcd restore).
    await registry.store.commit([], [Delete(registry.key(NAMESPACE, None, "ghost"))])
    controller = NamespaceCleanupController(api, resync_period=None)
    await controller.start()
    try:
        await eventually(lambda: _empty(registry, "ghost"))
        await controller.queue.wait_idle()
        assert len((await registry.list(POD, "alive"))[0]) == 1
    finally:
        await controller.stop()


async def test_a_failed_orphan_sweep_is_retried_and_never_ends_the_controller(
    registry: Registry, api: InProcessApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep whose cluster-wide read fails (it times out under load) is logged and
    tried again; the controller stays up (a failed task would end the leader's term)."""
    monkeypatch.setattr(namespaces_module, "SWEEP_RETRY_SECONDS", 0.01)
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    await registry.create(NAMESPACE, {"metadata": {"name": "ghost"}})
    await registry.create(POD, pod, "ghost")
    await registry.store.commit([], [Delete(registry.key(NAMESPACE, None, "ghost"))])
    failures = [TimeoutError("read timed out"), TimeoutError("again")]
    real_read = api.namespaces_in_use

    async def flaky_read(kind: Kind) -> set[str]:
        if kind is POD and failures:
            raise failures.pop(0)
        return await real_read(kind)

    monkeypatch.setattr(api, "namespaces_in_use", flaky_read)
    controller = NamespaceCleanupController(api, resync_period=None)
    await controller.start()
    try:
        await eventually(lambda: _empty(registry, "ghost"))
        assert failures == []
        assert all(not task.done() for task in controller._tasks)
    finally:
        await controller.stop()


async def test_the_orphan_sweep_reads_namespaces_from_cache_keys_not_a_list_of_every_object(
    registry: Registry, api: InProcessApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """150,000 pods decoded every resync stalled the master for seconds and doubled its
    heap: the sweep asks only which namespaces hold objects, answered from the watch
    cache's keys. A cluster-wide list here fails the test."""
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    for ns in ("a", "a-b", "a0", "ghost"):
        await registry.create(NAMESPACE, {"metadata": {"name": ns}})
        for name in ("p", "q"):
            await registry.create(POD, pod | {"metadata": {"name": name}}, ns)
    await registry.store.commit([], [Delete(registry.key(NAMESPACE, None, "ghost"))])
    assert await api.namespaces_in_use(POD) == {"a", "a-b", "a0", "ghost"}
    assert await api.namespaces_in_use(SERVICE) == set()
    real_list = api.list

    async def no_cluster_wide_list(kind: Kind, namespace: str | None = None) -> Any:
        assert namespace or not kind.namespaced, f"the sweep listed every {kind.plural}"
        return await real_list(kind, namespace)

    monkeypatch.setattr(api, "list", no_cluster_wide_list)
    controller = NamespaceCleanupController(api, resync_period=None)
    await controller.start()
    try:
        await eventually(lambda: _empty(registry, "ghost"))
        assert await api.namespaces_in_use(POD) == {"a", "a-b", "a0"}
        assert all(not task.done() for task in controller._tasks)
    finally:
        await controller.stop()


async def _empty(registry: Registry, ns: str) -> bool:
    pods, _ = await registry.list(POD, ns)
    services, _ = await registry.list(SERVICE, ns)
    return not pods and not services


# ---- manager and informer ------------------------------------------------------------------


class FlakyLeader:
    """An elector whose leadership the test can take away."""

    def __init__(self) -> None:
        self.identity = "flaky"
        self.lost = asyncio.Event()
        self.terms = 0

    async def acquire(self) -> None:
        self.lost = asyncio.Event()
        self.terms += 1

    async def release(self) -> None:
        return None


async def test_manager_stops_on_lost_leadership_and_campaigns_again(
    registry: Registry, api: InProcessApi, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    elector = FlakyLeader()
    mgr = ControllerManager(api, NetworkConfig.default(), elector, resync_period=None)
    task = asyncio.create_task(mgr.run())
    try:
        await eventually(lambda: _ready(mgr))
        assert await get_or_none(registry, NAMESPACE, "default") is not None
        elector.lost.set()
        await eventually(lambda: _terms(elector, 2))
        await eventually(lambda: _ready(mgr))
        await registry.create(NODE, node("late", "192.0.2.5"))
        await eventually(lambda: get_or_none(registry, HOST_SUBNET, "late"))
        assert "lost leadership" in caplog.text
    finally:
        await mgr.stop()
        await task
    assert not mgr.ready


async def _terms(elector: FlakyLeader, n: int) -> bool:
    return elector.terms >= n


async def test_manager_refuses_a_refused_configuration(api: InProcessApi) -> None:
    await ensure_cluster_network(api, NetworkConfig.default())
    config = NetworkConfig.default()
    config.service_network = IPv4Network("172.31.0.0/16")
    mgr = ControllerManager(api, config, resync_period=None)
    with pytest.raises(ClusterNetworkError):
        await asyncio.wait_for(mgr.run(), 5)


async def test_controller_stream_relists_after_compaction(
    registry: Registry, api: InProcessApi
) -> None:
    for name, ip in (("a", "192.0.2.1"), ("b", "192.0.2.2")):
        await registry.create(NODE, node(name, ip))
    stream = changes(api, NODE, None)
    seen = [await anext(stream) for _ in range(3)]
    assert [c for c, _ in seen] == ["SYNC", "SYNC", "SYNCED"]
    await registry.delete(NODE, None, "a")
    await registry.create(NODE, node("c", "192.0.2.3"))
    await compact(registry, api.cache)
    await registry.create(NODE, node("d", "192.0.2.4"))
    await compact(registry, api.cache)
    after = [await anext(stream) for _ in range(5)]
    kinds = [(c, o["metadata"].get("name")) for c, o in after]
    assert kinds == [
        ("DELETED", "a"),  # vanished between the two listings
        ("SYNC", "b"),
        ("SYNC", "c"),
        ("SYNC", "d"),
        ("SYNCED", None),
    ]
    assert after[0][1]["metadata"]["resourceVersion"] == after[-1][1]["metadata"]["resourceVersion"]
    await registry.create(NODE, node("e", "192.0.2.5"))
    assert (await anext(stream))[0] == "ADDED"
    await stream.aclose()  # type: ignore[attr-defined]


async def compact(registry: Registry, cache: WatchCache) -> None:
    """Compact the store and drop the compacted events from the cache, as the master does."""
    revision = await registry.store.revision()
    await registry.store.compact(revision)
    cache.forget_before(revision)


# ---- work queue and cache ------------------------------------------------------------------


async def test_keyed_queue_is_serial_per_key_dedupes_and_retries() -> None:
    running: set[str] = set()
    calls: list[str] = []
    failures = {"flaky": 2}
    first_a = asyncio.Event()  # the first "a" runs until the test lets it finish

    async def handle(key: str) -> None:
        assert key not in running, "two workers on one key"
        running.add(key)
        calls.append(key)
        if key == "a" and calls.count("a") == 1:
            await first_a.wait()
        await asyncio.sleep(0)
        running.discard(key)
        if failures.get(key):
            failures[key] -= 1
            raise ServerError("etcd is busy", 503, "ServiceUnavailable")

    queue = KeyedQueue("test", handle, workers=4, backoff=Backoff(0.01, 0.02))
    for key in ["a", "a", "a", "b", "flaky"]:
        queue.add(key)
    queue.start()
    await eventually(lambda: "a" in running, what="the first a to run")
    queue.add("a")  # while "a" runs: once more afterwards, not concurrently
    first_a.set()
    await eventually(lambda: _calls(calls, "flaky", 3))
    await queue.wait_idle()
    await queue.stop()
    assert calls.count("a") == 2 and calls.count("b") == 1


async def _calls(calls: list[str], key: str, n: int) -> bool:
    return calls.count(key) == n


def test_object_cache_never_goes_back() -> None:
    cache = ObjectCache()
    v2 = {"metadata": {"name": "x", "resourceVersion": "2"}}
    v1 = {"metadata": {"name": "x", "resourceVersion": "1"}}
    assert cache.put(v2) == (True, None)
    assert cache.put(v1) == (False, v2)  # a stale watch event after our own write
    assert cache.remove("x", 5) == v2
    assert cache.put({"metadata": {"name": "x", "resourceVersion": "4"}})[0] is False
    assert cache.put({"metadata": {"name": "x", "resourceVersion": "6"}})[0] is True
