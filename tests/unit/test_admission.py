"""Registry-backed admission (pod addresses), unique claims, and the event limits."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from podnet.api.admission import Admission
from podnet.api.authorizer import RequestAttributes
from podnet.api.events import (
    EventLimits,
    EventQuota,
    EventSweeper,
    TooManyRequests,
    admit_event,
    check_size,
)
from podnet.api.identity import User
from podnet.api.registry import Registry
from podnet.api.watchcache import WatchCache
from podnet.model.errors import ApiError
from podnet.model.kinds import EVENT, HOST_SUBNET, NAMESPACE, NODE, POD
from podnet.store.memory import MemoryStore

ADMIN = User("admin", ("system:masters",))
N1 = User("system:node:n1", ("system:nodes",))


@pytest.fixture
async def registry() -> Registry:
    reg = Registry(MemoryStore(), prefix="/t/")
    await reg.create(NAMESPACE, {"metadata": {"name": "default"}})
    return reg


def node(name: str, ip: str) -> dict[str, Any]:
    addresses = [{"type": "InternalIP", "address": ip}]
    return {"metadata": {"name": name}, "status": {"addresses": addresses}}


def hostsubnet(name: str, ip: str, subnet: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "host": name, "hostIP": ip, "subnet": subnet}


# ---- claims ------------------------------------------------------------------------------


async def test_node_ip_is_claimed_released_and_moved(registry: Registry) -> None:
    await registry.create(NODE, node("n1", "192.0.2.1"))
    with pytest.raises(ApiError) as err:
        await registry.create(NODE, node("n2", "192.0.2.1"))
    assert err.value.code == 422 and "already used by n1" in err.value.message
    assert err.value.causes[0].reason == "FieldValueDuplicate"
    await registry.create(NODE, node("n2", "192.0.2.2"))
    moved = await registry.get(NODE, None, "n2")
    moved["status"]["addresses"][0]["address"] = "192.0.2.1"
    with pytest.raises(ApiError) as err:
        await registry.update(NODE, moved, None, "n2", "status")
    assert err.value.code == 422
    n1 = await registry.get(NODE, None, "n1")
    n1["status"]["addresses"][0]["address"] = "192.0.2.9"
    await registry.update(NODE, n1, None, "n1", "status")  # frees .1
    await registry.update(NODE, moved, None, "n2", "status")
    await registry.delete(NODE, None, "n2")
    await registry.create(NODE, node("n3", "192.0.2.1"))  # released with the Node


async def test_hostsubnet_host_ip_and_subnet_are_unique(registry: Registry) -> None:
    await registry.create(HOST_SUBNET, hostsubnet("a", "192.0.2.1", "10.128.0.0/23"))
    with pytest.raises(ApiError) as err:
        await registry.create(HOST_SUBNET, hostsubnet("b", "192.0.2.1", "10.128.2.0/23"))
    assert err.value.code == 422 and "hostIP" in err.value.message
    with pytest.raises(ApiError) as err:
        await registry.create(HOST_SUBNET, hostsubnet("b", "192.0.2.2", "10.128.0.0/23"))
    assert err.value.code == 409 and err.value.reason == "AlreadyExists"
    await registry.create(HOST_SUBNET, hostsubnet("b", "192.0.2.2", "10.128.2.0/23"))


# ---- pod addresses -----------------------------------------------------------------------


def attrs(verb: str, new: Any, old: Any = None, sub: str | None = None) -> RequestAttributes:
    name = (new or old)["metadata"]["name"]
    return RequestAttributes(verb, POD, "default", name, sub, new, old)


def pod(name: str, ip: str | None = None, host_ip: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if ip:
        status.update(podIP=ip, podIPs=[{"ip": ip}])
    if host_ip:
        status["hostIP"] = host_ip
    meta = {"name": name, "namespace": "default"}
    return {"metadata": meta, "spec": {"nodeName": "n1"}, "status": status}


@pytest.fixture(params=["watch cache", "etcd read"])
async def admission(request: pytest.FixtureRequest, registry: Registry) -> AsyncIterator[Admission]:
    """Admission answering "who holds this address" from the watch cache's index, and
    without a cache (a read of every pod): the same verdicts."""
    if request.param == "etcd read":
        yield Admission(registry, EventLimits())
        return
    cache = WatchCache(registry)
    await cache.start()
    try:
        yield Admission(registry, EventLimits(), cache)
    finally:
        await cache.stop()


async def test_pod_ips_must_be_the_nodes_and_unused(
    registry: Registry, admission: Admission
) -> None:
    await registry.create(HOST_SUBNET, hostsubnet("n1", "192.0.2.1", "10.128.0.0/23"))
    await registry.create(POD, pod("held", "10.128.0.7"), "default")
    ok = pod("p", "10.128.0.5", "192.0.2.1")
    await admission.admit(N1, attrs("create", ok))
    for bad, code in (
        (pod("p", "10.128.2.5"), 403),  # another node's subnet
        (pod("p", "10.128.0.5", "192.0.2.2"), 403),  # another node's hostIP
        (pod("p", "10.128.0.7"), 409),  # another pod's address
        (pod("p", "not-an-ip"), 403),
    ):
        with pytest.raises(ApiError) as err:
            await admission.admit(N1, attrs("update", bad, pod("p"), "status"))
        assert err.value.code == code, bad
    # An unchanged address is not looked up again; the admin is not checked at all.
    await admission.admit(N1, attrs("update", pod("held", "10.128.0.7"), pod("held", "10.128.0.7")))
    await admission.admit(ADMIN, attrs("update", pod("p", "10.200.0.1"), pod("p")))


async def test_an_address_is_free_again_once_its_holder_lets_go(
    registry: Registry, admission: Admission, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim follows the holder: a second address in podIPs counts, a changed status
    frees the old one, a deleted pod frees its own. With the cache, no pod is read from
    etcd for it (that read cost seconds at 150,000 pods, on every pod a node starts)."""
    await registry.create(HOST_SUBNET, hostsubnet("n1", "192.0.2.1", "10.128.0.0/23"))
    held = pod("held", "10.128.0.7")
    held["status"]["podIPs"].append({"ip": "10.128.0.8"})
    await registry.create(POD, held, "default")
    if admission.cache is not None:
        real_list = registry.list

        async def no_pod_list(kind: Any, *args: Any, **kwargs: Any) -> Any:
            assert kind is not POD, "admission read every pod"
            return await real_list(kind, *args, **kwargs)

        monkeypatch.setattr(registry, "list", no_pod_list)

    async def refused(ip: str) -> bool:
        try:
            await admission.admit(N1, attrs("update", pod("p", ip), pod("p"), "status"))
        except ApiError as exc:
            assert exc.code == 409 and "default/held" in exc.message
            return True
        return False

    assert await refused("10.128.0.7") and await refused("10.128.0.8")
    moved = await registry.get(POD, "default", "held")
    moved["status"] = {"podIP": "10.128.0.9", "podIPs": [{"ip": "10.128.0.9"}]}
    await registry.update(POD, moved, "default", "held", "status")
    assert not await refused("10.128.0.7") and not await refused("10.128.0.8")
    assert await refused("10.128.0.9")
    await registry.delete(POD, "default", "held")
    assert not await refused("10.128.0.9")


async def test_pod_ips_need_a_hostsubnet(admission: Admission) -> None:
    with pytest.raises(ApiError) as err:
        await admission.admit(N1, attrs("create", pod("p", "10.128.0.5")))
    assert err.value.code == 403 and "no HostSubnet" in err.value.message
    await admission.admit(N1, attrs("create", pod("p")))  # no address: nothing to check


async def test_mirror_pod_owner_uid_must_be_the_nodes(registry: Registry) -> None:
    admission = Admission(registry, EventLimits())
    created = await registry.create(NODE, node("n1", "192.0.2.1"))
    owner = {"apiVersion": "v1", "kind": "Node", "name": "n1", "controller": True}
    body = pod("p")
    body["metadata"]["ownerReferences"] = [{**owner, "uid": "stale"}]
    with pytest.raises(ApiError):
        await admission.admit(N1, attrs("create", body))
    body["metadata"]["ownerReferences"] = [{**owner, "uid": created["metadata"]["uid"]}]
    await admission.admit(N1, attrs("create", body))


# ---- events ------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_limits_from_env() -> None:
    env = {"PODNET_EVENT_TTL": "2", "PODNET_EVENT_BURST": "x", "PODNET_EVENT_RATE": "-1"}
    limits = EventLimits.from_env(env)
    assert limits.ttl == 2.0 and limits.burst == EventLimits().burst
    assert limits.rate == EventLimits().rate


def test_token_bucket_per_identity() -> None:
    clock = Clock()
    quota = EventQuota(EventLimits(rate=1.0, burst=2), clock)
    quota.take("a", None)
    quota.take("a", None)
    with pytest.raises(TooManyRequests) as err:
        quota.take("a", None)
    assert err.value.code == 429 and err.value.retry_after == 1
    assert err.value.status()["details"]["retryAfterSeconds"] == 1
    quota.take("b", None)
    clock.now += 1.0
    quota.take("a", None)


def test_stored_count_per_node() -> None:
    quota = EventQuota(EventLimits(burst=100, max_stored=3))
    quota.recount([{"source": {"host": "n1"}}, {"source": {"host": "n1"}}, {"source": "x"}])
    quota.take("system:node:n1", "n1")
    with pytest.raises(TooManyRequests) as err:
        quota.take("system:node:n1", "n1")
    assert "3 stored events" in err.value.message
    quota.take("system:node:n2", "n2")
    quota.recount([])
    quota.take("system:node:n1", "n1")


def test_size_limits_and_reporter_stamp() -> None:
    limits = EventLimits(max_bytes=300, max_message=50)
    with pytest.raises(ApiError) as err:
        check_size({"message": "x" * 400}, limits)
    assert err.value.code == 413
    with pytest.raises(ApiError) as err:
        check_size({"message": "x" * 60}, limits)
    assert err.value.code == 422
    quota = EventQuota(limits)
    event: dict[str, Any] = {"metadata": {"name": "e"}}
    admit_event(quota, N1, "create", event)
    assert event["source"] == {"host": "n1"}
    with pytest.raises(ApiError):
        admit_event(quota, N1, "create", {"metadata": {"name": "e"}, "source": "n1"})
    admin_event: dict[str, Any] = {"metadata": {"name": "e"}}
    admit_event(quota, ADMIN, "create", admin_event)
    assert "source" not in admin_event


async def test_sweeper_deletes_only_events_older_than_the_ttl(registry: Registry) -> None:
    clock = Clock()
    quota = EventQuota(EventLimits(ttl=10.0))
    sweeper = EventSweeper(registry, quota, clock)

    async def event(name: str) -> None:
        body = {"metadata": {"name": name}, "source": {"host": "n1"}}
        await registry.create(EVENT, body, "default")

    await event("old")
    assert await sweeper.sweep_once() == 0  # notes the revision that covers "old"
    clock.now += 5
    await event("young")
    assert await sweeper.sweep_once() == 0
    clock.now += 6  # "old" last written 11 s ago, "young" 6 s ago
    assert await sweeper.sweep_once() == 1
    names = [e["metadata"]["name"] for e in (await registry.list(EVENT))[0]]
    assert names == ["young"] and quota.stored == {"n1": 1}
    clock.now += 5
    assert await sweeper.sweep_once() == 1
    assert (await registry.list(EVENT))[0] == []
