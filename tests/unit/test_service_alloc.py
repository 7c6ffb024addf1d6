"""Service cluster IP and node port allocation: the pure pickers, and the registry's
transaction on the in-memory store (claims, races, refusals, release)."""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Sequence
from typing import Any

import pytest

from podnet.api.registry import Registry
from podnet.api.servicealloc import (
    PortRange,
    ServiceRanges,
    free_ip,
    free_port,
    kubernetes_service_ip,
    parse_cidrs,
    random_ip,
)
from podnet.model.errors import ApiError
from podnet.model.kinds import CLUSTER_NETWORK, NAMESPACE, SERVICE
from podnet.model.network import NetworkConfig
from podnet.store.base import Absent, Condition, Operation, Put, StoreUnavailable
from podnet.store.memory import MemoryStore

NET = ipaddress.ip_network("172.30.0.0/29")  # hosts .1-.6; .1 is the kubernetes service's


# --- pure -----------------------------------------------------------------------------------


def test_free_ip_never_picks_network_broadcast_or_the_kubernetes_address() -> None:
    rng = random.Random(7)
    picked = {free_ip(NET, [], rng) for _ in range(400)}
    assert picked == {f"172.30.0.{i}" for i in range(2, 7)}
    assert {random_ip(NET, rng) for _ in range(400)} == picked
    assert kubernetes_service_ip(NET) == "172.30.0.1"
    taken = ["172.30.0.2", "172.30.0.3", "172.30.0.5", "172.30.0.6", "10.0.0.1"]
    assert {free_ip(NET, taken, rng) for _ in range(50)} == {"172.30.0.4"}
    assert free_ip(NET, [*taken, "172.30.0.4"], rng) is None


def test_free_port_and_ranges() -> None:
    rng = random.Random(3)
    ports = PortRange.parse("30000-30004")
    assert {free_port(ports, [30001, 30003, 80], rng) for _ in range(200)} == {30000, 30002, 30004}
    assert free_port(ports, range(30000, 30005), rng) is None
    assert str(PortRange.parse("30000-32767")) == "30000-32767" and 32767 in PortRange(30000, 32767)
    for bad in ("x", "3-2", "0-10", "30000-70000"):
        with pytest.raises(ValueError, match=bad):
            PortRange.parse(bad)
    assert parse_cidrs("") == ()
    assert parse_cidrs("192.0.2.0/24, 198.51.100.7/32") == (
        ipaddress.ip_network("192.0.2.0/24"),
        ipaddress.ip_network("198.51.100.7/32"),
    )
    with pytest.raises(ValueError, match="nope"):
        parse_cidrs("192.0.2.0/24,nope")


# --- through the registry ----------------------------------------------------------------------


class PlantingStore(MemoryStore):
    """A store where another writer claims ``steal`` values first: on a commit that
    takes such a claim, the claim is written for another object just before."""

    def __init__(self) -> None:
        super().__init__()
        self.steal: int = 0
        self.stolen: list[str] = []

    async def commit(self, conditions: Sequence[Condition], ops: Sequence[Operation]) -> int | None:
        for cond in conditions:
            if self.steal and isinstance(cond, Absent) and "/claims/" in cond.key:
                self.steal -= 1
                self.stolen.append(cond.key)
                await super().commit([], [Put(cond.key, b"/t/core/services/other/thief")])
                break
        return await super().commit(conditions, ops)


def make_registry(store: MemoryStore | None = None, **ranges: Any) -> Registry:
    return Registry(store or MemoryStore(), prefix="/t/", services=ServiceRanges(**ranges))


@pytest.fixture
async def registry() -> Registry:
    reg = make_registry(PlantingStore())
    await reg.create(NAMESPACE, {"metadata": {"name": "default"}})
    return reg


def svc(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"ports": [{"port": 80}], **spec}}


async def claim_keys(registry: Registry) -> list[str]:
    kvs, _ = await registry.store.list("/t/claims/")
    return sorted(kv.key.removeprefix("/t/claims/core/services/") for kv in kvs)


async def create(registry: Registry, obj: dict[str, Any]) -> dict[str, Any]:
    return await registry.create(SERVICE, obj, "default")


async def refused(registry: Registry, obj: dict[str, Any], code: int = 422) -> ApiError:
    before = await registry.store.list("/t/")
    with pytest.raises(ApiError) as err:
        await create(registry, obj)
    assert err.value.code == code, err.value.message
    after = await registry.store.list("/t/")
    assert [kv.key for kv in after[0]] == [kv.key for kv in before[0]], "something was stored"
    return err.value


async def test_each_type_gets_what_it_needs(registry: Registry) -> None:
    plain = (await create(registry, svc("plain")))["spec"]
    assert ipaddress.ip_address(plain["clusterIP"]) in ipaddress.ip_network("172.30.0.0/16")
    assert plain["clusterIPs"] == [plain["clusterIP"]] and plain["ipFamilies"] == ["IPv4"]
    assert "nodePort" not in plain["ports"][0]
    node_port = (await create(registry, svc("np", type="NodePort")))["spec"]
    assert node_port["ports"][0]["nodePort"] in PortRange(30000, 32767)
    balancer = (await create(registry, svc("lb", type="LoadBalancer")))["spec"]
    assert balancer["ports"][0]["nodePort"] in PortRange(30000, 32767)
    bare = await create(
        registry, svc("bare", type="LoadBalancer", allocateLoadBalancerNodePorts=False)
    )
    assert "nodePort" not in bare["spec"]["ports"][0]
    headless = (await create(registry, svc("headless", clusterIP="None")))["spec"]
    assert headless["clusterIP"] == "None" and headless["ipFamilies"] == ["IPv4"]
    external = await create(
        registry,
        {
            "metadata": {"name": "ext"},
            "spec": {"type": "ExternalName", "externalName": "db.example.com"},
        },
    )
    assert "clusterIP" not in external["spec"] and "ipFamilies" not in external["spec"]
    ips = {s["clusterIP"] for s in (plain, node_port, balancer, bare["spec"])}
    assert len(ips) == 4
    expected = [f"clusterIP/{ip}" for ip in ips]
    expected += [f"nodePort/{s['ports'][0]['nodePort']}" for s in (node_port, balancer)]
    assert await claim_keys(registry) == sorted(expected)


async def test_requested_values_are_honoured_or_refused(registry: Registry) -> None:
    made = await create(
        registry,
        svc("a", type="NodePort", clusterIP="172.30.9.9", ports=[{"port": 80, "nodePort": 30080}]),
    )
    assert (
        made["spec"]["clusterIP"] == "172.30.9.9" and made["spec"]["ports"][0]["nodePort"] == 30080
    )
    # As in Kubernetes, a node port is one Service's whatever the protocol; inside it,
    # TCP 53 and UDP 53 share one (given, or chosen once).
    udp = svc("udp", type="NodePort", ports=[{"port": 53, "protocol": "UDP", "nodePort": 30080}])
    err = await refused(registry, udp)
    assert err.causes[0].reason == "FieldValueDuplicate" and "default/a" in err.message
    dns = [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53}]
    shared = (await create(registry, svc("dns", type="NodePort", ports=dns)))["spec"]["ports"]
    assert shared[0]["nodePort"] == shared[1]["nodePort"]
    assert f"nodePort/{shared[0]['nodePort']}" in await claim_keys(registry)

    err = await refused(registry, svc("b", clusterIP="172.30.9.9"))
    assert err.causes[0].field == "spec.clusterIP" and err.causes[0].reason == "FieldValueDuplicate"
    assert "already used by default/a" in err.message
    err = await refused(
        registry, svc("b", type="NodePort", ports=[{"port": 80, "nodePort": 30080}])
    )
    assert err.causes[0].field == "spec.ports[0].nodePort"
    assert err.causes[0].reason == "FieldValueDuplicate"
    for ip in ("10.0.0.1", "172.30.0.0", "172.30.255.255"):
        err = await refused(registry, svc("b", clusterIP=ip))
        assert err.causes[0].field == "spec.clusterIP" and "valid range" in err.message
        assert "172.30.0.0/16" in err.message
    err = await refused(registry, svc("b", type="NodePort", ports=[{"port": 80, "nodePort": 8080}]))
    assert err.causes[0].field == "spec.ports[0].nodePort" and "30000-32767" in err.message
    err = await refused(registry, svc("b", ipFamilies=["IPv6"]))
    assert err.causes[0].field == "spec.ipFamilies[0]"
    # The kubernetes service's address is never chosen, but may be asked for.
    assert (await create(registry, svc("kubernetes", clusterIP="172.30.0.1")))["spec"][
        "clusterIP"
    ] == "172.30.0.1"


async def test_external_ips_only_inside_the_configured_cidrs() -> None:
    none_allowed = make_registry()
    await none_allowed.create(NAMESPACE, {"metadata": {"name": "default"}})
    err = await refused(none_allowed, svc("x", externalIPs=["192.0.2.10"]))
    assert err.causes[0].field == "spec.externalIPs[0]" and "--external-ip-cidrs" in err.message
    allowed = make_registry(none_allowed.store, external_ip_cidrs=parse_cidrs("192.0.2.0/24"))
    made = await allowed.create(SERVICE, svc("x", externalIPs=["192.0.2.10"]), "default")
    assert made["spec"]["externalIPs"] == ["192.0.2.10"]
    err = await refused(allowed, svc("y", externalIPs=["198.51.100.1"]))
    assert "outside the allowed CIDRs (192.0.2.0/24)" in err.message
    # Stored under other settings, the Service stays editable; only new IPs are checked.
    relabelled = await none_allowed.patch(
        SERVICE, "default", "x", {"metadata": {"labels": {"a": "b"}}}
    )
    assert relabelled["metadata"]["labels"] == {"a": "b"}
    with pytest.raises(ApiError, match="--external-ip-cidrs"):
        await none_allowed.patch(
            SERVICE, "default", "x", {"spec": {"externalIPs": ["192.0.2.10", "192.0.2.11"]}}
        )


async def test_the_cluster_networks_service_network_wins() -> None:
    registry = make_registry()
    config = NetworkConfig.default()
    config.service_network = ipaddress.IPv4Network("10.96.0.0/24")
    await registry.create(CLUSTER_NETWORK, config.to_object())
    await registry.create(NAMESPACE, {"metadata": {"name": "default"}})
    made = await registry.create(SERVICE, svc("a"), "default")
    assert ipaddress.ip_address(made["spec"]["clusterIP"]) in config.service_network


async def test_a_value_another_writer_took_first_is_chosen_again(registry: Registry) -> None:
    store = registry.store
    assert isinstance(store, PlantingStore)
    store.steal = 3  # the first three choices are claimed by "another master"
    made = await create(registry, svc("a", type="NodePort"))
    spec = made["spec"]
    assert len(store.stolen) == 3
    mine = [f"clusterIP/{spec['clusterIP']}", f"nodePort/{spec['ports'][0]['nodePort']}"]
    theirs = [k.removeprefix("/t/claims/core/services/") for k in store.stolen]
    assert not set(mine) & set(theirs)
    assert await claim_keys(registry) == sorted(mine + theirs)
    for key in store.stolen:  # the other writer's claims are untouched
        kv = await store.get(key)
        assert kv is not None and kv.value == b"/t/core/services/other/thief"


async def test_a_requested_value_another_writer_took_first_is_refused(registry: Registry) -> None:
    store = registry.store
    assert isinstance(store, PlantingStore)
    store.steal = 1
    with pytest.raises(ApiError) as err:
        await create(registry, svc("a", clusterIP="172.30.1.1"))
    assert err.value.code == 422 and err.value.causes[0].reason == "FieldValueDuplicate"
    assert "other/thief" in err.value.message
    assert await registry.store.get("/t/core/services/default/a") is None


async def test_a_failed_transaction_leaves_no_claim(registry: Registry) -> None:
    await create(registry, svc("a", clusterIP="172.30.1.1"))
    before = await claim_keys(registry)
    # The name is taken: the transaction fails as a whole, the new IP is not claimed.
    err = await refused(registry, svc("a", clusterIP="172.30.1.2"), 409)
    assert err.reason == "AlreadyExists"
    assert await claim_keys(registry) == before

    class Unavailable(MemoryStore):
        async def commit(
            self, conditions: Sequence[Condition], ops: Sequence[Operation]
        ) -> int | None:
            raise StoreUnavailable("etcd went away")

    broken = make_registry(Unavailable())
    await MemoryStore.commit(
        broken.store, [], [Put("/t/core/namespaces/default", b'{"metadata":{"name":"default"}}')]
    )
    with pytest.raises(ApiError) as unavailable:
        await broken.create(SERVICE, svc("b", type="NodePort"), "default")
    assert unavailable.value.code == 503
    assert [kv.key for kv in (await broken.store.list("/t/"))[0]] == ["/t/core/namespaces/default"]


async def test_a_full_range_is_a_clear_error_and_stores_nothing() -> None:
    registry = make_registry(service_network=NET, node_ports=PortRange(30000, 30001))
    await registry.create(NAMESPACE, {"metadata": {"name": "default"}})
    ips = {
        (await registry.create(SERVICE, svc(f"s{i}"), "default"))["spec"]["clusterIP"]
        for i in range(5)
    }
    assert ips == {f"172.30.0.{i}" for i in range(2, 7)}
    err = await refused(registry, svc("s5"), 500)
    assert "range is full" in err.message and "172.30.0.0/29" in err.message
    await registry.delete(SERVICE, "default", "s0")
    await registry.create(SERVICE, svc("s5", clusterIP="None", type="NodePort"), "default")
    await registry.create(SERVICE, svc("s6", clusterIP="None", type="NodePort"), "default")
    err = await refused(registry, svc("s7", clusterIP="None", type="NodePort"), 500)
    assert "nodePort" in err.message and "30000-30001" in err.message


async def test_updates_allocate_and_release(registry: Registry) -> None:
    made = await create(registry, svc("a"))
    ip = made["spec"]["clusterIP"]
    to_node_port = await registry.patch(SERVICE, "default", "a", {"spec": {"type": "NodePort"}})
    node_port = to_node_port["spec"]["ports"][0]["nodePort"]
    assert to_node_port["spec"]["clusterIP"] == ip
    assert await claim_keys(registry) == [f"clusterIP/{ip}", f"nodePort/{node_port}"]
    # kubectl replace sends the object without the allocated values: they are kept.
    replaced = dict(to_node_port, spec={"type": "NodePort", "ports": [{"port": 80}]})
    kept = await registry.update(SERVICE, replaced, "default", "a")
    assert kept["spec"]["clusterIP"] == ip and kept["spec"]["ports"][0]["nodePort"] == node_port
    with pytest.raises(ApiError, match="field is immutable") as err:
        await registry.patch(
            SERVICE, "default", "a", {"spec": {"clusterIP": "172.30.3.3", "clusterIPs": None}}
        )
    assert err.value.code == 422 and err.value.causes[0].field == "spec.clusterIP"
    back = await registry.patch(SERVICE, "default", "a", {"spec": {"type": "ClusterIP"}})
    assert "nodePort" not in back["spec"]["ports"][0]
    assert await claim_keys(registry) == [f"clusterIP/{ip}"]
    external = await registry.patch(
        SERVICE, "default", "a", {"spec": {"type": "ExternalName", "externalName": "x.example"}}
    )
    assert "clusterIP" not in external["spec"] and await claim_keys(registry) == []
    again = await registry.patch(SERVICE, "default", "a", {"spec": {"type": "ClusterIP"}})
    assert await claim_keys(registry) == [f"clusterIP/{again['spec']['clusterIP']}"]
    await registry.delete(SERVICE, "default", "a")
    assert await claim_keys(registry) == []


async def test_health_check_node_port_for_local_load_balancers(registry: Registry) -> None:
    local = svc("lb", type="LoadBalancer", externalTrafficPolicy="Local")
    made = (await create(registry, local))["spec"]
    check, node_port = made["healthCheckNodePort"], made["ports"][0]["nodePort"]
    assert check in PortRange(30000, 32767) and check != node_port
    assert f"nodePort/{check}" in await claim_keys(registry)
    err = await refused(
        registry, svc("b", type="NodePort", ports=[{"port": 80, "nodePort": check}])
    )
    assert err.causes[0].reason == "FieldValueDuplicate"
    err = await refused(registry, svc("b", healthCheckNodePort=31000))
    assert "externalTrafficPolicy" in err.causes[0].message
    # Cluster policy: the health check port goes, and its claim with it.
    kept = await registry.patch(
        SERVICE, "default", "lb", {"spec": {"externalTrafficPolicy": "Cluster"}}
    )
    assert "healthCheckNodePort" not in kept["spec"]
    assert f"nodePort/{check}" not in await claim_keys(registry)
    assert f"nodePort/{node_port}" in await claim_keys(registry)


async def test_status_updates_keep_the_spec_and_show_the_ingress(registry: Registry) -> None:
    made = await create(registry, svc("lb", type="LoadBalancer"))
    status = {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}
    updated = await registry.update(SERVICE, {**made, "status": status}, "default", "lb", "status")
    assert updated["spec"] == made["spec"] and updated["status"] == status
    cells = {c.name: c.read(updated) for c in SERVICE.columns}
    assert cells["EXTERNAL-IP"] == "203.0.113.7"
    assert cells["PORT(S)"] == f"80:{made['spec']['ports'][0]['nodePort']}/TCP"
    assert await claim_keys(registry) == sorted(
        [
            f"clusterIP/{made['spec']['clusterIP']}",
            f"nodePort/{made['spec']['ports'][0]['nodePort']}",
        ]
    )
