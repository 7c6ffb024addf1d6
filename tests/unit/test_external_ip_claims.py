"""externalIP:port/protocol is a unique claim across namespaces (issue 19, finding 8):
a second Service naming a taken one is refused and changes nothing; updates move the
claims, deletes release them, and none leaks."""

from __future__ import annotations

from typing import Any

import pytest

from podnet.api.registry import Registry
from podnet.api.servicealloc import ServiceRanges, parse_cidrs
from podnet.model.errors import ApiError
from podnet.model.kinds import NAMESPACE, SERVICE
from podnet.store.memory import MemoryStore

CLAIMS = "/t/claims/core/services/"


@pytest.fixture
async def registry() -> Registry:
    ranges = ServiceRanges(external_ip_cidrs=parse_cidrs("192.0.2.0/24"))
    reg = Registry(MemoryStore(), prefix="/t/", services=ranges)
    for name in ("tenant-a", "tenant-b"):
        await reg.create(NAMESPACE, {"metadata": {"name": name}})
    return reg


def svc(name: str, ips: list[str], *ports: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"ports": list(ports) or [{"port": 80}], "externalIPs": ips},
    }


async def external_claims(registry: Registry) -> dict[str, str]:
    kvs, _ = await registry.store.list(f"{CLAIMS}externalIP/")
    return {kv.key.removeprefix(f"{CLAIMS}externalIP/"): kv.value.decode() for kv in kvs}


async def test_a_second_service_in_another_namespace_is_refused(registry: Registry) -> None:
    await registry.create(SERVICE, svc("web", ["192.0.2.10"]), "tenant-a")
    assert await external_claims(registry) == {"192.0.2.10/TCP/80": "/t/core/services/tenant-a/web"}
    before, _ = await registry.store.list("/t/")
    with pytest.raises(ApiError) as err:
        await registry.create(SERVICE, svc("thief", ["192.0.2.10"]), "tenant-b")
    assert err.value.code == 422
    assert err.value.causes[0].field == "spec.externalIPs[0]"
    assert "192.0.2.10:80/TCP is already used by tenant-a/web" in err.value.message
    after, _ = await registry.store.list("/t/")
    assert [kv.key for kv in after] == [kv.key for kv in before], "a refused Service left keys"


async def test_another_port_or_protocol_is_another_claim(registry: Registry) -> None:
    await registry.create(SERVICE, svc("dns", ["192.0.2.10"], {"port": 53}), "tenant-a")
    udp = {"port": 53, "protocol": "UDP"}
    await registry.create(SERVICE, svc("dns-udp", ["192.0.2.10"], udp), "tenant-b")
    await registry.create(SERVICE, svc("web", ["192.0.2.10"], {"port": 80}), "tenant-b")
    assert await external_claims(registry) == {
        "192.0.2.10/TCP/53": "/t/core/services/tenant-a/dns",
        "192.0.2.10/UDP/53": "/t/core/services/tenant-b/dns-udp",
        "192.0.2.10/TCP/80": "/t/core/services/tenant-b/web",
    }


async def test_an_update_cannot_take_a_claim_and_moves_its_own(registry: Registry) -> None:
    await registry.create(SERVICE, svc("web", ["192.0.2.10"]), "tenant-a")
    await registry.create(SERVICE, svc("other", ["192.0.2.11"]), "tenant-b")
    with pytest.raises(ApiError) as err:
        await registry.patch(
            SERVICE, "tenant-b", "other", {"spec": {"externalIPs": ["192.0.2.11", "192.0.2.10"]}}
        )
    assert err.value.code == 422 and "already used by tenant-a/web" in err.value.message
    stored = await registry.get(SERVICE, "tenant-b", "other")
    assert stored["spec"]["externalIPs"] == ["192.0.2.11"]
    # Moving to a new port releases the old claim in the same write.
    await registry.patch(SERVICE, "tenant-b", "other", {"spec": {"ports": [{"port": 8080}]}})
    assert await external_claims(registry) == {
        "192.0.2.10/TCP/80": "/t/core/services/tenant-a/web",
        "192.0.2.11/TCP/8080": "/t/core/services/tenant-b/other",
    }
    await registry.patch(SERVICE, "tenant-a", "web", {"spec": {"externalIPs": None}})
    # The released address is free for the other tenant now.
    await registry.patch(SERVICE, "tenant-b", "other", {"spec": {"externalIPs": ["192.0.2.10"]}})
    assert await external_claims(registry) == {
        "192.0.2.10/TCP/8080": "/t/core/services/tenant-b/other"
    }
    await registry.delete(SERVICE, "tenant-b", "other")
    await registry.delete(SERVICE, "tenant-a", "web")
    assert (await registry.store.list("/t/claims/"))[0] == [], "a claim leaked"
