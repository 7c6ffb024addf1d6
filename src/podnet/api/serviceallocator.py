"""The master's Service allocator: fills a Service's cluster IP and node ports, inside
the registry's write, as kube-apiserver's Service REST storage does.

The registry calls ``allocate`` after validation and admission, then writes the object
and a claim key per cluster IP and node port in one etcd transaction (the claim must be
absent). So a value is never held twice: not across two masters, not across a crash
(there is no moment when the object exists without its claims, or the reverse). When
the transaction fails because another writer claimed a value this allocator chose, the
registry asks again and a new value is chosen; a value the user asked for is refused
with 422 FieldValueDuplicate. Deleting the Service deletes its claims in its own
transaction, which releases the values.

Choosing: a few random probes (one etcd read each) find a free value at once in a
sparse range; past them, the claims are listed and a random free value is taken, so a
nearly full range is still served, and a full one answers with a clear error.
"""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from podnet.api.claims import NODE_PORT, Claim, cluster_ip_path, node_port_path
from podnet.api.masterservice import reserved_ip_problems
from podnet.api.servicealloc import (
    Network,
    ServiceRanges,
    free_ip,
    free_port,
    kubernetes_service_ip,
    node_ports_held,
    ports_wanting_node_port,
    random_ip,
    requested_problems,
    wants_cluster_ip,
    wants_health_check_port,
)
from podnet.model import errors
from podnet.model.kinds import CLUSTER_NETWORK, SERVICE, Kind
from podnet.model.network import CLUSTER_NETWORK_NAME
from podnet.model.schemas_names import quote
from podnet.model.servicerules import needs_cluster_ip
from podnet.store.base import Store

Obj = dict[str, Any]
T = TypeVar("T")
RANDOM_PROBES = 8


def _family(network: Network) -> str:
    return f"IPv{network.version}"


class Objects(Protocol):
    """What the allocator reads through: the registry."""

    store: Store

    async def get(self, kind: Kind, namespace: str | None, name: str) -> Obj: ...

    def claim_key(self, kind: Kind, claim: Claim) -> str: ...


class ServiceAllocator:
    """Chooses the values a Service needs; the registry claims them in its transaction."""

    def __init__(
        self, registry: Objects, ranges: ServiceRanges, rng: random.Random | None = None
    ) -> None:
        self.registry = registry
        self.ranges = ranges
        self.rng = rng or random.SystemRandom()

    async def service_network(self) -> Network:
        """The ClusterNetwork's serviceNetwork, or the configured one before it exists."""
        try:
            cn = await self.registry.get(CLUSTER_NETWORK, None, CLUSTER_NETWORK_NAME)
        except errors.ApiError as exc:
            if exc.code != 404:
                raise
            return self.ranges.service_network
        return ipaddress.ip_network(cn["serviceNetwork"], strict=False)

    async def allocate(self, new: Obj, old: Obj | None) -> tuple[Obj, set[str]]:
        """``new`` with its missing cluster IP and node ports filled (a copy), and the
        claim paths of the values chosen here. Raises 422 for requested values that the
        ranges refuse."""
        spec = new.get("spec") or {}
        old_spec = (old or {}).get("spec")
        if old is not None and spec == old_spec:
            return new, set()  # a status or metadata change: nothing to check or choose
        network = await self.service_network()
        problems = requested_problems(spec, old_spec, self.ranges, network)
        problems += self._family_problems(spec, network)
        problems += reserved_ip_problems(new, old_spec, kubernetes_service_ip(network))
        if problems:
            raise errors.invalid(SERVICE.kind, new["metadata"]["name"], problems)
        spec = {**spec, "ports": [dict(p) for p in spec.get("ports") or []]}
        if not spec["ports"]:
            del spec["ports"]
        chosen: set[str] = set()
        if wants_cluster_ip(spec):
            ip = await self._choose_ip(network)
            spec["clusterIP"], spec["clusterIPs"] = ip, [ip]
            chosen.add(cluster_ip_path(ip))
        if needs_cluster_ip(spec.get("type")) and not spec.get("ipFamilies"):
            spec["ipFamilies"] = [_family(network)]
        for i in ports_wanting_node_port(spec):
            port = spec["ports"][i]
            # TCP 53 and UDP 53 share one node port, as kube allocates them.
            number = _node_port_of(spec, port.get("port")) or await self._choose_port(spec)
            port["nodePort"] = number
            chosen.add(node_port_path(number))
        if wants_health_check_port(spec):
            spec["healthCheckNodePort"] = await self._choose_port(spec)
            chosen.add(node_port_path(spec["healthCheckNodePort"]))
        return {**new, "spec": spec}, chosen

    @staticmethod
    def _family_problems(spec: dict[str, Any], network: Network) -> list[errors.FieldError]:
        families = spec.get("ipFamilies") or []
        if families and families[0] != _family(network):
            why = (
                f"Invalid value: {quote(families[0])}: not configured on this cluster "
                f"(the service network is {network})"
            )
            return [errors.FieldError("spec.ipFamilies[0]", why)]
        return []

    def _claim_prefix(self, path: str) -> str:
        return self.registry.claim_key(SERVICE, Claim("", "", path))

    async def _free(self, path: str) -> bool:
        return await self.registry.store.get(self._claim_prefix(path)) is None

    async def _claimed(self, path: str) -> list[str]:
        """The values claimed under ``path`` (a prefix), from one listing."""
        prefix = self._claim_prefix(path)
        kvs, _ = await self.registry.store.list(prefix)
        return [kv.key[len(prefix) :] for kv in kvs]

    async def _choose(
        self,
        guess: Callable[[], T | None],
        path: Callable[[T], str],
        listed: str,
        pick_free: Callable[[list[str]], T | None],
        full: str,
    ) -> T:
        """A few random ``guess``es checked against their claims, then a free value
        picked from one listing of the claims under ``listed``; 500 when none is left."""
        for _ in range(RANDOM_PROBES):
            value = guess()
            if value is not None and await self._free(path(value)):
                return value
        found = pick_free(await self._claimed(listed))
        if found is None:
            raise errors.ApiError(f"failed to allocate {full}", 500, "InternalError")
        return found

    async def _choose_ip(self, network: Network) -> str:
        return await self._choose(
            lambda: random_ip(network, self.rng),
            cluster_ip_path,
            cluster_ip_path(""),
            lambda claimed: free_ip(network, [ip for ip in claimed if _is_ip(ip)], self.rng),
            f"a serviceIP: range is full (the service network {network} has no free address)",
        )

    async def _choose_port(self, spec: dict[str, Any]) -> int:
        ports = self.ranges.node_ports
        mine = set(node_ports_held(spec))

        def guess() -> int | None:
            number = self.rng.randint(ports.low, ports.high)
            return None if number in mine else number

        def pick_free(claimed: list[str]) -> int | None:
            taken = {int(p) for p in claimed if p.isdigit()} | mine
            return free_port(ports, taken, self.rng)

        return await self._choose(
            guess,
            node_port_path,
            NODE_PORT,
            pick_free,
            f"a nodePort: range is full (no free port in {ports}, "
            "set by --service-node-port-range)",
        )


def _node_port_of(spec: dict[str, Any], port: int | None) -> int | None:
    """The node port another port with this number (another protocol) already has."""
    for other in spec.get("ports") or []:
        if other.get("port") == port and other.get("nodePort"):
            return int(other["nodePort"])
    return None


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
