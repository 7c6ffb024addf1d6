"""Unique-value claims: which values of an object no other object of its kind may hold.

The registry writes one claim key per value in the same etcd transaction as the object
(the key must be absent to create it), so two concurrent writers, or two masters, can
never both win. Claimed today:

- HostSubnet ``subnet`` (the kind's ``unique_field``) and ``hostIP``: one subnet per
  host, one HostSubnet per host address;
- Node ``InternalIP`` addresses (``status.addresses``): a node cannot register with
  another node's address, which would make the master give one IP a second HostSubnet;
- Service ``spec.clusterIP`` (not "None", the headless form), each ``nodePort`` and
  ``healthCheckNodePort``: the master allocates them (``podnet.api.serviceallocator``)
  and a second holder is refused. As in Kubernetes, a node port number belongs to one
  Service whatever the protocol; inside it, TCP 53 and UDP 53 share one (one claim);
- Service ``externalIP:port`` with its protocol (each of ``spec.externalIPs`` with each
  of ``spec.ports``): the service proxies send that address and port to one Service's
  endpoints, so a second Service, in any namespace, that names the same one would
  silently take the first one's traffic. Unlike a node port, the protocol is part of the
  claim: 192.0.2.1:53/TCP and 192.0.2.1:53/UDP may belong to two Services.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podnet.model import errors
from podnet.model.kinds import HOST_SUBNET, NODE, SERVICE, Kind
from podnet.model.schemas_common import DUPLICATE
from podnet.store.base import Store


@dataclass(frozen=True)
class Claim:
    """One claimed value: ``field`` names it in messages, ``path`` is its key suffix."""

    field: str
    value: str
    path: str


def _node_ips(obj: Mapping[str, Any]) -> list[str]:
    status = obj.get("status")
    addresses = status.get("addresses") if isinstance(status, Mapping) else None
    out = []
    for addr in addresses or []:
        if isinstance(addr, Mapping) and addr.get("type") == "InternalIP" and addr.get("address"):
            out.append(str(addr["address"]))
    return sorted(set(out))


CLUSTER_IP = "clusterIP/"  # claim path prefixes of a Service's values
NODE_PORT = "nodePort/"
EXTERNAL_IP = "externalIP/"


def cluster_ip_path(ip: str) -> str:
    return f"{CLUSTER_IP}{ip}"


def node_port_path(port: int) -> str:
    return f"{NODE_PORT}{port}"


def external_ip_path(ip: str, port: int, protocol: str) -> str:
    """The claim path of ``ip:port/protocol`` (the address in its canonical form)."""
    return f"{EXTERNAL_IP}{_canonical(ip)}/{protocol}/{port}"


def _canonical(ip: str) -> str:
    try:
        return str(ipaddress.ip_address(ip))
    except ValueError:
        return ip  # validation refuses it before any claim is written


def _external_claims(spec: Mapping[str, Any]) -> list[Claim]:
    """One claim per externalIP, port and protocol (a value named twice, once)."""
    out: dict[str, Claim] = {}
    for i, ip in enumerate(spec.get("externalIPs") or []):
        for _, port in _ports(spec):
            number, protocol = port.get("port"), str(port.get("protocol") or "TCP")
            if not isinstance(number, int) or not ip:
                continue
            path = external_ip_path(str(ip), number, protocol)
            value = f"{_canonical(str(ip))}:{number}/{protocol}"
            out.setdefault(path, Claim(f"spec.externalIPs[{i}]", value, path))
    return list(out.values())


def _service_claims(obj: Mapping[str, Any]) -> list[Claim]:
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return []
    out = []
    ip = spec.get("clusterIP")
    if ip and ip != "None":
        out.append(Claim("spec.clusterIP", str(ip), cluster_ip_path(str(ip))))
    numbers = [(f"spec.ports[{i}].nodePort", p.get("nodePort")) for i, p in _ports(spec)]
    numbers.append(("spec.healthCheckNodePort", spec.get("healthCheckNodePort")))
    for field, number in numbers:
        if isinstance(number, int) and number:
            out.append(Claim(field, str(number), node_port_path(number)))
    return out + _external_claims(spec)


def _ports(spec: Mapping[str, Any]) -> list[tuple[int, Mapping[str, Any]]]:
    return [(i, p) for i, p in enumerate(spec.get("ports") or []) if isinstance(p, Mapping)]


def claims(kind: Kind, obj: Mapping[str, Any]) -> list[Claim]:
    """Every unique value ``obj`` holds, as claims (possibly none)."""
    out: list[Claim] = []
    if kind.unique_field and obj.get(kind.unique_field):
        value = str(obj[kind.unique_field])
        # The key layout of the original subnet claims, kept for stored data.
        out.append(Claim(kind.unique_field, value, value.replace("/", "_")))
    if _same(kind, HOST_SUBNET) and obj.get("hostIP"):
        value = str(obj["hostIP"])
        out.append(Claim("hostIP", value, f"hostIP/{value}"))
    if _same(kind, NODE):
        out.extend(Claim("InternalIP", ip, f"InternalIP/{ip}") for ip in _node_ips(obj))
    if _same(kind, SERVICE):
        out.extend(_service_claims(obj))
    return out


def _same(kind: Kind, other: Kind) -> bool:
    return (kind.group, kind.plural) == (other.group, other.plural)


async def taken_claims(
    store: Store, key: str, wanted: Mapping[str, Claim]
) -> dict[str, tuple[Claim, str]]:
    """The claims of ``wanted`` (claim key -> claim) that another object holds, with the
    holder's object key."""
    out = {}
    for claim_key, claim in wanted.items():
        holder = await store.get(claim_key)
        if holder is not None and holder.value != key.encode():
            out[claim_key] = (claim, holder.value.decode())
    return out


def claim_error(kind: Kind, name: str, claim: Claim, holder_key: str) -> errors.ApiError:
    """The answer to a write whose ``claim`` the object at ``holder_key`` holds."""
    parts = holder_key.rsplit("/", 2)
    owner = "/".join(parts[-2:]) if kind.namespaced else parts[-1]
    if claim.field == kind.unique_field:
        # The subnet claim's answer since the beginning (the allocator expects it).
        message = f'{kind.plural} "{name}": {claim.field} {claim.value} is already used by {owner}'
        return errors.ApiError(message, 409, "AlreadyExists", kind.plural, name)
    # As kube answers a taken unique value (a Service's clusterIP): 422, Duplicate.
    why = f"Duplicate value: {claim.value} is already used by {owner}"
    return errors.invalid(kind.kind, name, [errors.FieldError(claim.field, why, DUPLICATE)])


async def raise_if_claimed(
    store: Store, kind: Kind, key: str, name: str, wanted: Mapping[str, Claim]
) -> None:
    """Raise the error for the first of ``wanted`` (claim key -> claim) that another
    object holds; return when none is (the transaction failed for another reason)."""
    for claim, holder_key in (await taken_claims(store, key, wanted)).values():
        raise claim_error(kind, name, claim, holder_key)
