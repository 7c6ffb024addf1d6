"""The values the service proxy's nftables table is made of (pure): sets and maps,
chains, the endpoint groups of the ``endpoints`` map, what one service port adds, and the
names the table's parts go by. ``servicetable`` says what the table holds and renders it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

SERVICES_TABLE = "podnet_services"
TABLE_KEY = f"ip {SERVICES_TABLE}"
MASQUERADE_MARK = "0x00004000"
SERVICE_IPS, NODE_PORTS = "service_ips", "node_ports"
NO_ENDPOINT_IPS, NO_ENDPOINT_NODE_PORTS = "no_endpoint_ips", "no_endpoint_node_ports"
CLUSTER_NETWORKS, HAIRPIN, NODE_IPS = "cluster_networks", "hairpin", "node_ips"
ENDPOINTS, ENDPOINT_DIGESTS = "endpoints", "endpoint_digests"
ADDRESS_KEY = "ipv4_addr . inet_proto . inet_service"
PORT_KEY = "inet_proto . inet_service"
PICK_KEY = f"{ADDRESS_KEY} . mark"  # a cluster IP's port and the pick
TARGET = "ipv4_addr . inet_service"  # an endpoint's address and port
REJECT_CHAIN, CHECK_CHAIN, SERVICES_CHAIN = "reject_service", "endpoint_check", "services"
MANAGED = frozenset(  # the sets and maps whose elements podnet adds and deletes one by one
    (
        SERVICE_IPS,
        NODE_PORTS,
        NO_ENDPOINT_IPS,
        NO_ENDPOINT_NODE_PORTS,
        CLUSTER_NETWORKS,
        HAIRPIN,
        NODE_IPS,
        ENDPOINT_DIGESTS,
    )
)


@dataclass(frozen=True)
class NftSet:
    """A named set or map. ``elements`` None: not managed element by element (filled
    by the packet path, or the ``endpoints`` map, whose elements go by group)."""

    name: str
    type: str
    flags: str = ""
    timeout: int | None = None
    elements: frozenset[str] | None = frozenset()

    @property
    def kind(self) -> str:
        """``map`` (its type has a data part) or ``set``."""
        return ("set", "map")[" : " in self.type]

    def definition(self) -> str:
        """``{ type ...; flags ...; timeout ...; }`` without the elements."""
        timeout = duration(self.timeout) if self.timeout is not None else ""
        attrs = (("type", self.type), ("flags", self.flags), ("timeout", timeout))
        return "{ " + " ".join(f"{k} {v};" for k, v in attrs if v) + " }"


@dataclass(frozen=True)
class Chain:
    """A chain: ``hook`` is a base chain's type/hook/priority line (None: a regular one);
    ``comment`` a digest of the rules of a chain whose name does not say them (read
    back instead of the rules; ``rules`` is empty in a chain read back)."""

    name: str
    hook: str | None
    rules: tuple[str, ...]
    comment: str = ""


@dataclass(frozen=True)
class EndpointGroup:
    """The endpoints one cluster IP's port picks from: the ``endpoints`` map's elements
    ``<prefix> . <pick> : <target>``, pick 0 to count - 1, and a digest of them, kept in
    the ``endpoint_digests`` set as ``marker``. Read back from the kernel, a group knows
    only its count and digest (``joined`` None): listing 50,000 map elements takes
    seconds, the digests a fraction of one."""

    count: int
    digest: str
    joined: str | None = None  # the targets, comma-separated: one string a group, not ten

    @classmethod
    def of(cls, prefix: str, targets: tuple[str, ...]) -> EndpointGroup:
        joined = ",".join(targets)
        found = hashlib.blake2b(f"{prefix}\n{joined}".encode(), digest_size=4).hexdigest()
        return cls(len(targets), found, joined)

    @property
    def targets(self) -> tuple[str, ...] | None:
        """``address . port`` by pick (None: read back, not known)."""
        return None if self.joined is None else tuple(self.joined.split(","))

    @classmethod
    def from_marker(cls, marker: str) -> tuple[str, EndpointGroup]:
        """(prefix, group) from an ``endpoint_digests`` element as nft lists it."""
        *prefix, count, found = marker.split(" . ")
        return " . ".join(prefix), cls(int(count, 16), found.removeprefix("0x"))

    def marker(self, prefix: str) -> str:
        """The group's element in ``endpoint_digests``."""
        return f"{prefix} . 0x{self.count:08x} . 0x{self.digest}"

    def same(self, other: EndpointGroup | None) -> bool:
        """Whether ``other`` (maybe read back) has the same elements."""
        return other is self or (
            other is not None and (other.count, other.digest) == (self.count, self.digest)
        )


@dataclass(frozen=True)
class Touched:
    """The names a render may have changed since the render numbered ``since``: chains
    and sets added or removed, sets whose elements changed, endpoint groups. The
    transaction between the two looks at these only, not at 5,000 of each."""

    since: int
    chains: frozenset[str] = frozenset()
    sets: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ServiceNft:
    """The whole table: sets and maps (with their elements), chains, and the endpoint
    groups by prefix (``<cluster IP> . <protocol> . <port>``). A rendered table has a
    ``serial`` and, after the first, says what it changed since the one before."""

    sets: Mapping[str, NftSet] = field(default_factory=dict)
    chains: Mapping[str, Chain] = field(default_factory=dict)
    groups: Mapping[str, EndpointGroup] = field(default_factory=dict)
    serial: int | None = field(default=None, compare=False)
    touched: Touched | None = field(default=None, compare=False)

    def only(self, names: Touched) -> ServiceNft:
        """This table cut down to ``names`` (what a transaction needs to look at)."""
        return ServiceNft(
            {n: self.sets[n] for n in sorted(names.sets) if n in self.sets},
            {n: self.chains[n] for n in sorted(names.chains) if n in self.chains},
            {p: self.groups[p] for p in sorted(names.groups) if p in self.groups},
        )


@dataclass(frozen=True)
class PortParts:
    """What one service port adds to the table."""

    chains: tuple[Chain, ...] = ()
    sets: tuple[NftSet, ...] = ()
    elements: tuple[tuple[str, str], ...] = ()  # (set name, element)
    groups: tuple[tuple[str, EndpointGroup], ...] = ()  # (prefix, group)


def duration(seconds: int) -> str:
    """A timeout as nft prints it: ``3h``, ``1m30s``, ``1d2h``."""
    parts, left = [], seconds
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts) or "0s"


def digest(rules: tuple[str, ...]) -> str:
    """A short digest of a chain's rules (its name's tail, or its comment)."""
    return hashlib.blake2b("\n".join(rules).encode(), digest_size=6).hexdigest()
