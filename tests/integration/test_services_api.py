"""Service allocation against real etcd: two masters racing, and a real master's answers
to good and bad Services (what is stored is read back from etcd itself)."""

from __future__ import annotations

import asyncio
import ipaddress
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from podnet.api.registry import Registry
from podnet.api.servicealloc import PortRange, ServiceRanges
from podnet.model.kinds import NAMESPACE, SERVICE
from podnet.store.etcd import EtcdStore
from podnet.store.etcd_process import EtcdProcess
from podnet.testing.api import client_for
from podnet.testing.e2e import wait_for
from podnet.testing.processes import MasterProcess, launch_master

SERVICES = "/api/v1/namespaces/default/services"
NODE_PORTS = "31000-31019"


@pytest.fixture
async def stores(etcd: EtcdProcess) -> AsyncIterator[list[EtcdStore]]:
    """Two etcd connections: two masters' stores."""
    opened = [EtcdStore(etcd.endpoint) for _ in range(2)]
    for store in opened:
        await store.connect()
    yield opened
    for store in opened:
        await store.close()


def svc(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"ports": [{"port": 80}], **spec}}


async def test_two_masters_racing_never_hand_out_one_value_twice(
    stores: list[EtcdStore], prefix: str
) -> None:
    """Small ranges, so the two collide often: every clash is re-chosen, never shared."""
    ranges = ServiceRanges(ipaddress.ip_network("172.30.0.0/24"), PortRange(30000, 30199))
    masters = [Registry(store, prefix=prefix, services=ranges) for store in stores]
    await masters[0].create(NAMESPACE, {"metadata": {"name": "default"}})

    async def make(registry: Registry, name: str) -> dict[str, Any]:
        return await registry.create(SERVICE, svc(name, type="NodePort"), "default")

    made = await asyncio.gather(
        *(make(masters[i % 2], f"s{i}") for i in range(160)), return_exceptions=True
    )
    failed = [m for m in made if isinstance(m, BaseException)]
    assert failed == [], failed[:3]
    items, _ = await masters[1].list(SERVICE, "default")
    ips = [s["spec"]["clusterIP"] for s in items]
    ports = [s["spec"]["ports"][0]["nodePort"] for s in items]
    assert len(items) == 160 and len(set(ips)) == 160 and len(set(ports)) == 160
    assert all(p in ranges.node_ports for p in ports)
    assert "172.30.0.1" not in ips  # kept for the kubernetes service
    # Every value has exactly one claim, pointing at its holder, and nothing else does.
    kvs, _ = await stores[0].list(f"{prefix}claims/core/services/")
    holders = {
        kv.key.removeprefix(f"{prefix}claims/core/services/"): kv.value.decode() for kv in kvs
    }
    expected = {}
    for s in items:
        key = f"{prefix}core/services/default/{s['metadata']['name']}"
        expected[f"clusterIP/{s['spec']['clusterIP']}"] = key
        expected[f"nodePort/{s['spec']['ports'][0]['nodePort']}"] = key
    assert holders == expected
    # Deleting from either master releases; the other then hands the values out again.
    await asyncio.gather(*(masters[i % 2].delete(SERVICE, "default", f"s{i}") for i in range(160)))
    assert (await stores[1].list(f"{prefix}claims/"))[0] == []


@pytest.fixture
def services_master(etcd: EtcdProcess, tmp_path: Path, prefix: str) -> Iterator[MasterProcess]:
    process = launch_master(
        etcd,
        tmp_path / "master",
        prefix,
        *("--service-network", "172.30.0.0/16"),
        *("--service-node-port-range", NODE_PORTS, "--external-ip-cidrs", "192.0.2.0/24"),
    )
    try:
        yield process
    finally:
        process.stop()


async def stored_keys(etcd: EtcdProcess, prefix: str) -> dict[str, bytes]:
    """The Services' keys and claims in etcd, but the masters' own default/kubernetes."""
    store = EtcdStore(etcd.endpoint)
    await store.connect()
    try:
        kvs, _ = await store.list(prefix)
    finally:
        await store.close()
    masters = {
        f"{prefix}core/services/default/kubernetes",
        f"{prefix}claims/core/services/clusterIP/172.30.0.1",
    }
    assert masters <= {kv.key for kv in kvs}, "the masters keep default/kubernetes"
    return {kv.key: kv.value for kv in kvs if "/services/" in kv.key and kv.key not in masters}


def refused(api: httpx.Client, body: dict[str, Any], field: str, code: int = 422) -> str:
    answer = api.post(SERVICES, json=body)
    assert answer.status_code == code, answer.text
    status = answer.json()
    causes = {c["field"]: c for c in status["details"]["causes"]}
    assert field in causes, status
    return str(status["message"])


def test_a_real_master_allocates_refuses_and_releases(
    services_master: MasterProcess, etcd: EtcdProcess, prefix: str
) -> None:
    with client_for(services_master.kubeconfig) as api:
        kept_by_masters = f"{SERVICES}/kubernetes"
        wait_for(lambda: api.get(kept_by_masters).status_code == 200, what="default/kubernetes")
        made = api.post(SERVICES, json=svc("web", type="NodePort", externalIPs=["192.0.2.10"]))
        assert made.status_code == 201, made.text
        spec = made.json()["spec"]
        ip, node_port = spec["clusterIP"], spec["ports"][0]["nodePort"]
        assert ipaddress.ip_address(ip) in ipaddress.ip_network("172.30.0.0/16")
        assert node_port in PortRange.parse(NODE_PORTS)
        before = asyncio.run(stored_keys(etcd, prefix))
        assert set(before) == {
            f"{prefix}core/services/default/web",
            f"{prefix}claims/core/services/clusterIP/{ip}",
            f"{prefix}claims/core/services/nodePort/{node_port}",
            f"{prefix}claims/core/services/externalIP/192.0.2.10/TCP/80",
        }

        message = refused(api, svc("b", clusterIP=ip), "spec.clusterIP")
        assert "already used by default/web" in message
        taken = [{"port": 80, "nodePort": node_port}]
        refused(api, svc("b", type="NodePort", ports=taken), "spec.ports[0].nodePort")
        assert "valid range" in refused(api, svc("b", clusterIP="10.1.2.3"), "spec.clusterIP")
        outside = [{"port": 80, "nodePort": 30000}]
        message = refused(api, svc("b", type="NodePort", ports=outside), "spec.ports[0].nodePort")
        assert NODE_PORTS in message
        message = refused(api, svc("b", externalIPs=["198.51.100.1"]), "spec.externalIPs[0]")
        assert "192.0.2.0/24" in message and "--external-ip-cidrs" in message
        bad_type = svc("b", type="ExternalName", clusterIP="172.30.5.5", externalName="x.example")
        refused(api, bad_type, "spec.clusterIP")
        refused(api, svc("b", externalTrafficPolicy="Local"), "spec.externalTrafficPolicy")
        assert asyncio.run(stored_keys(etcd, prefix)) == before, "a refused Service left keys"

        current = api.get(f"{SERVICES}/web").json()
        changed = {
            **current,
            "spec": {**current["spec"], "clusterIP": "172.30.7.7", "clusterIPs": None},
        }
        answer = api.put(f"{SERVICES}/web", json=changed)
        assert answer.status_code == 422 and "field is immutable" in answer.text, answer.text
        # A replace without the allocated values keeps them (kubectl replace of a manifest).
        bare = {
            "metadata": {"name": "web"},
            "spec": {"type": "NodePort", "ports": [{"port": 80}], "externalIPs": ["192.0.2.10"]},
        }
        kept = api.put(f"{SERVICES}/web", json=bare)
        assert kept.status_code == 200, kept.text
        assert kept.json()["spec"]["clusterIP"] == ip
        assert kept.json()["spec"]["ports"][0]["nodePort"] == node_port
        assert asyncio.run(stored_keys(etcd, prefix)).keys() == before.keys()

        table = api.get(
            SERVICES, headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
        )
        columns = [c["name"] for c in table.json()["columnDefinitions"]]
        assert columns == [
            "Name",
            "Type",
            "Cluster-Ip",
            "External-Ip",
            "Port(S)",
            "Age",
            "Selector",
        ]
        rows = {r["cells"][0]: r["cells"] for r in table.json()["rows"]}
        assert sorted(rows) == ["kubernetes", "web"]
        cells = rows["web"]
        assert cells[:5] == ["web", "NodePort", ip, "192.0.2.10", f"80:{node_port}/TCP"]

        assert api.delete(f"{SERVICES}/web").status_code == 200
        assert asyncio.run(stored_keys(etcd, prefix)) == {}


def test_an_external_ip_and_port_belong_to_one_service_in_all_namespaces(
    services_master: MasterProcess, etcd: EtcdProcess, prefix: str
) -> None:
    """Finding 8 of issue 19: a Service in another namespace naming a taken
    externalIP:port/protocol would silently take its traffic; it is refused (422, the
    holder named) and stores nothing."""
    with client_for(services_master.kubeconfig) as api:
        made = api.post(SERVICES, json=svc("web", externalIPs=["192.0.2.20"]))
        assert made.status_code == 201, made.text
        answer = api.post("/api/v1/namespaces", json={"metadata": {"name": "tenant-b"}})
        assert answer.status_code == 201, answer.text
        before = asyncio.run(stored_keys(etcd, prefix))
        thief = api.post(
            "/api/v1/namespaces/tenant-b/services", json=svc("thief", externalIPs=["192.0.2.20"])
        )
        assert thief.status_code == 422, thief.text
        assert "192.0.2.20:80/TCP is already used by default/web" in thief.text
        assert asyncio.run(stored_keys(etcd, prefix)) == before, "a refused Service left keys"
        udp = svc("dns", externalIPs=["192.0.2.20"], ports=[{"port": 80, "protocol": "UDP"}])
        answer = api.post("/api/v1/namespaces/tenant-b/services", json=udp)
        assert answer.status_code == 201, answer.text
        assert api.delete(f"{SERVICES}/web").status_code == 200
        assert api.delete("/api/v1/namespaces/tenant-b/services/dns").status_code == 200
        assert asyncio.run(stored_keys(etcd, prefix)) == {}


def test_bad_service_flags_name_the_flag(tmp_path: Path) -> None:
    for flag, value in (
        ("--service-node-port-range", "32767-30000"),
        ("--external-ip-cidrs", "192.0.2.0/24,x"),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "podnet", "master", "--state-dir", str(tmp_path), flag, value],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode != 0, result.stdout
        assert f"Invalid value for {flag}: " in result.stderr, result.stderr
        assert value.split(",")[-1] in result.stderr
