"""Unique-value claims: which values of an object no other object of its kind may hold.

The registry writes one claim key per value in the same etcd transaction as the object
(the key must be absent to create it), so two concurrent writers, or two masters, can
never both win. Claimed today:

- HostSubnet ``subnet`` (the kind's ``unique_field``) and ``hostIP``: one subnet per
  host, one HostSubnet per host address;
- Node ``InternalIP`` addresses (``status.addresses``): a node cannot register with
  another node's address, which would make the master give one IP a second HostSubnet.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podnet.model import errors
from podnet.model.kinds import HOST_SUBNET, NODE, Kind
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
    return out


def _same(kind: Kind, other: Kind) -> bool:
    return (kind.group, kind.plural) == (other.group, other.plural)


async def raise_if_claimed(
    store: Store, kind: Kind, key: str, name: str, wanted: Mapping[str, Claim]
) -> None:
    """Raise the error for the first of ``wanted`` (claim key -> claim) that another
    object holds; return when none is (the transaction failed for another reason)."""
    for claim_key, claim in wanted.items():
        holder = await store.get(claim_key)
        if holder is None or holder.value == key.encode():
            continue
        owner = holder.value.decode().rsplit("/", 1)[-1]
        message = f'{kind.plural} "{name}": {claim.field} {claim.value} is already used by {owner}'
        if claim.field == kind.unique_field:
            # The subnet claim's answer since the beginning (the allocator expects it).
            raise errors.ApiError(message, 409, "AlreadyExists", kind.plural, name)
        # As kube answers a taken unique value (a Service's clusterIP): 422, Duplicate.
        cause = errors.FieldError(claim.field, message, "FieldValueDuplicate")
        raise errors.ApiError(message, 422, "Invalid", kind.kind, name, [cause])
