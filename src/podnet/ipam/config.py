"""Host-local IPAM configuration: parse and validate the ``ipam`` section of a CNI config.

The accepted shape is the reference host-local plugin's (containernetworking/plugins):
``ranges`` is a list of range sets, each a list of ``{subnet, rangeStart, rangeEnd,
gateway}``; the legacy top-level ``subnet/rangeStart/rangeEnd/gateway`` becomes range set
0, and ``runtimeConfig.ipRanges`` is put in front of both, as the reference does.
Defaults also follow the reference: gateway and rangeStart are the first address after
the network address (.1), rangeEnd is the last address before the IPv4 broadcast (the
last address of an IPv6 subnet), dataDir is ``/var/lib/cni/networks``.

Every problem raises ``IpamConfigError`` naming the field, e.g.
``ranges[0][0].rangeStart 10.1.3.5 is outside subnet 10.1.2.0/24``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import (
    IPv4Address,
    IPv4Network,
    IPv6Address,
    IPv6Network,
    ip_address,
    ip_interface,
    ip_network,
)
from pathlib import Path
from typing import Any

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network

DEFAULT_DATA_DIR = Path("/var/lib/cni/networks")


class IpamError(Exception):
    """Base of every IPAM failure (config, exhaustion, conflict, locking)."""


class IpamConfigError(IpamError, ValueError):
    """The IPAM config (or a requested IP in it) is invalid; permanent, do not retry."""


@dataclass(frozen=True)
class Range:
    """One allocatable range: ``range_start..range_end`` (inclusive) inside ``subnet``."""

    subnet: IPNetwork
    range_start: IPAddress
    range_end: IPAddress
    gateway: IPAddress

    def contains(self, ip: IPAddress) -> bool:
        """True if ``ip`` lies between rangeStart and rangeEnd (same family)."""
        same_family = ip.version == self.subnet.version
        return same_family and int(self.range_start) <= int(ip) <= int(self.range_end)

    def unusable(self) -> frozenset[IPAddress]:
        """Addresses never handed out: the network address and, for IPv4, broadcast."""
        if isinstance(self.subnet, IPv4Network):
            return frozenset({self.subnet.network_address, self.subnet.broadcast_address})
        return frozenset({self.subnet.network_address})

    def __str__(self) -> str:
        return f"{self.range_start}-{self.range_end}"


@dataclass(frozen=True)
class RangeSet:
    """Ranges of one family; an allocation takes one address from one of them."""

    ranges: tuple[Range, ...]

    @property
    def version(self) -> int:
        """4 or 6."""
        return self.ranges[0].subnet.version

    def range_for(self, ip: IPAddress) -> Range | None:
        """The range holding ``ip``, if any."""
        return next((r for r in self.ranges if r.contains(ip)), None)

    def contains(self, ip: IPAddress) -> bool:
        """True if some range of the set holds ``ip``."""
        return self.range_for(ip) is not None

    def skipped(self) -> frozenset[IPAddress]:
        """Every gateway of the set plus each range's network/broadcast address."""
        out: set[IPAddress] = set()
        for r in self.ranges:
            out |= r.unusable() | {r.gateway}
        return frozenset(out)

    def candidates(self, last: IPAddress | None) -> Iterator[tuple[IPAddress, Range]]:
        """Round-robin order: everything after ``last``, wrapping, ``last`` itself last.

        Without a usable ``last`` (missing, or outside the set) the walk starts at the
        first range's rangeStart, as the reference does. Skipped addresses never appear.
        """
        skip = self.skipped()
        for r, lo, hi in self._segments(last):
            for value in range(lo, hi + 1):
                ip = _make_ip(r, value)
                if ip not in skip:
                    yield ip, r

    def _segments(self, last: IPAddress | None) -> list[tuple[Range, int, int]]:
        ranges = self.ranges
        k, first = 0, int(ranges[0].range_start)
        found = self.range_for(last) if last is not None else None
        if last is not None and found is not None:
            k = ranges.index(found)
            first = int(last) + 1
            if last == found.range_end:
                k = (k + 1) % len(ranges)
                first = int(ranges[k].range_start)
        head = ranges[k]
        rest = [ranges[(k + i) % len(ranges)] for i in range(1, len(ranges))]
        return [
            (head, first, int(head.range_end)),
            *((r, int(r.range_start), int(r.range_end)) for r in rest),
            (head, int(head.range_start), first - 1),
        ]

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.ranges)


@dataclass(frozen=True)
class Route:
    """A route handed to the container: ``dst`` via ``gw`` (None: the range's gateway)."""

    dst: IPNetwork
    gw: IPAddress | None = None


@dataclass(frozen=True)
class IpamConfig:
    """The validated ``ipam`` section."""

    range_sets: tuple[RangeSet, ...]
    routes: tuple[Route, ...] = ()
    data_dir: Path = DEFAULT_DATA_DIR
    resolv_conf: str | None = None


@dataclass(frozen=True)
class IpamRequest:
    """What one CNI call asks of IPAM: network name, config and requested IPs."""

    network: str
    config: IpamConfig
    requested: tuple[IPAddress, ...] = ()


def _make_ip(r: Range, value: int) -> IPAddress:
    return IPv4Address(value) if r.subnet.version == 4 else IPv6Address(value)


def _field(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _string(obj: Mapping[str, Any], path: str, name: str) -> str | None:
    value = obj.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise IpamConfigError(f"{_field(path, name)} must be a string, got {value!r}")
    return value


def _parse_subnet(text: str, where: str) -> IPNetwork:
    try:
        return ip_network(text, strict=True)
    except ValueError:
        pass
    try:
        loose = ip_network(text, strict=False)
    except ValueError:
        raise IpamConfigError(f"{where} {text!r} is not a valid CIDR subnet") from None
    raise IpamConfigError(
        f"{where} {text} has host bits set (the network address is {loose.network_address})"
    )


def _parse_ip_in(obj: Mapping[str, Any], path: str, name: str, net: IPNetwork) -> IPAddress | None:
    text = _string(obj, path, name)
    if text is None:
        return None
    where = _field(path, name)
    try:
        ip = ip_address(text)
    except ValueError:
        raise IpamConfigError(f"{where} {text!r} is not a valid IP address") from None
    if ip.version != net.version:
        raise IpamConfigError(f"{where} {ip} is not IPv{net.version} like subnet {net}")
    if ip not in net:
        raise IpamConfigError(f"{where} {ip} is outside subnet {net}")
    return ip


def _default(value: IPAddress | None, fallback: IPAddress) -> IPAddress:
    return fallback if value is None else value


def _last_address(net: IPNetwork) -> IPAddress:
    if isinstance(net, IPv4Network):
        return net.broadcast_address - 1
    return net.broadcast_address


def parse_range(obj: Any, path: str) -> Range:
    """Parse one ``{subnet, rangeStart, rangeEnd, gateway}``; ``path`` prefixes errors."""
    if not isinstance(obj, Mapping):
        raise IpamConfigError(f"{path or 'ipam'} must be an object, got {obj!r}")
    text = _string(obj, path, "subnet")
    if text is None:
        raise IpamConfigError(f"{_field(path, 'subnet')} is required")
    net = _parse_subnet(text, _field(path, "subnet"))
    if net.prefixlen > net.max_prefixlen - 2:
        raise IpamConfigError(f"{_field(path, 'subnet')} {net} is too small to allocate from")
    first = net.network_address + 1
    gateway = _default(_parse_ip_in(obj, path, "gateway", net), first)
    start = _default(_parse_ip_in(obj, path, "rangeStart", net), first)
    end = _default(_parse_ip_in(obj, path, "rangeEnd", net), _last_address(net))
    if int(start) > int(end):
        raise IpamConfigError(f"{_field(path, 'rangeStart')} {start} is after rangeEnd {end}")
    return Range(subnet=net, range_start=start, range_end=end, gateway=gateway)


def _overlap(a: Range, b: Range) -> bool:
    if a.subnet.version != b.subnet.version:
        return False
    return int(a.range_start) <= int(b.range_end) and int(b.range_start) <= int(a.range_end)


def parse_range_set(obj: Any, path: str) -> RangeSet:
    """Parse a list of ranges of one family that must not overlap each other."""
    if not isinstance(obj, list):
        raise IpamConfigError(f"{path} must be a list of ranges, got {obj!r}")
    if not obj:
        raise IpamConfigError(f"{path} is an empty range set")
    ranges = tuple(parse_range(item, f"{path}[{j}]") for j, item in enumerate(obj))
    for j, r in enumerate(ranges):
        if r.subnet.version != ranges[0].subnet.version:
            raise IpamConfigError(
                f"{path}[{j}] mixes IPv{r.subnet.version} into an IPv"
                f"{ranges[0].subnet.version} range set"
            )
        for k in range(j):
            if _overlap(ranges[k], r):
                raise IpamConfigError(f"{path}[{k}] ({ranges[k]}) overlaps {path}[{j}] ({r})")
    return RangeSet(ranges)


def _labelled_sets(
    ipam: Mapping[str, Any], runtime_ip_ranges: Sequence[Any] | None
) -> list[tuple[str, RangeSet]]:
    sets: list[tuple[str, RangeSet]] = []
    for i, raw in enumerate(runtime_ip_ranges or ()):
        sets.append(
            (f"runtimeConfig.ipRanges[{i}]", parse_range_set(raw, f"runtimeConfig.ipRanges[{i}]"))
        )
    if _string(ipam, "", "subnet") is not None:
        sets.append(("the top-level subnet", RangeSet((parse_range(ipam, ""),))))
    raw_sets = ipam.get("ranges") or []
    if not isinstance(raw_sets, list):
        raise IpamConfigError(f"ranges must be a list of range sets, got {raw_sets!r}")
    for i, raw in enumerate(raw_sets):
        sets.append((f"ranges[{i}]", parse_range_set(raw, f"ranges[{i}]")))
    return sets


def _check_disjoint(sets: list[tuple[str, RangeSet]]) -> None:
    for j, (label_b, b) in enumerate(sets):
        for label_a, a in sets[:j]:
            if any(_overlap(ra, rb) for ra in a.ranges for rb in b.ranges):
                raise IpamConfigError(f"{label_a} ({a}) overlaps {label_b} ({b})")


def parse_routes(raw: Any) -> tuple[Route, ...]:
    """Parse ``routes: [{dst, gw?}]``."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise IpamConfigError(f"routes must be a list, got {raw!r}")
    routes = []
    for i, obj in enumerate(raw):
        path = f"routes[{i}]"
        if not isinstance(obj, Mapping):
            raise IpamConfigError(f"{path} must be an object, got {obj!r}")
        dst_text = _string(obj, path, "dst")
        if dst_text is None:
            raise IpamConfigError(f"{path}.dst is required")
        try:
            dst = ip_network(dst_text, strict=False)
        except ValueError:
            raise IpamConfigError(f"{path}.dst {dst_text!r} is not a valid CIDR") from None
        routes.append(Route(dst=dst, gw=_route_gateway(obj, path, dst)))
    return tuple(routes)


def _route_gateway(obj: Mapping[str, Any], path: str, dst: IPNetwork) -> IPAddress | None:
    text = _string(obj, path, "gw")
    if text is None:
        return None
    try:
        gw = ip_address(text)
    except ValueError:
        raise IpamConfigError(f"{path}.gw {text!r} is not a valid IP address") from None
    if gw.version != dst.version:
        raise IpamConfigError(f"{path}.gw {gw} is not IPv{dst.version} like dst {dst}")
    return gw


def parse_ipam_config(
    ipam: Mapping[str, Any], runtime_ip_ranges: Sequence[Any] | None = None
) -> IpamConfig:
    """Validate the ``ipam`` object of a network config; raise ``IpamConfigError``."""
    if not isinstance(ipam, Mapping):
        raise IpamConfigError(f"ipam must be an object, got {ipam!r}")
    sets = _labelled_sets(ipam, runtime_ip_ranges)
    if not sets:
        raise IpamConfigError("no IP ranges specified (set ranges or subnet)")
    _check_disjoint(sets)
    data_dir = _string(ipam, "", "dataDir")
    return IpamConfig(
        range_sets=tuple(s for _, s in sets),
        routes=parse_routes(ipam.get("routes")),
        data_dir=Path(data_dir) if data_dir else DEFAULT_DATA_DIR,
        resolv_conf=_string(ipam, "", "resolvConf"),
    )


def validate_network_name(name: Any) -> str:
    """The network name is a directory under dataDir: non-empty, no ``/``, not a dot name."""
    if not isinstance(name, str) or not name or "/" in name or name in (".", "..") or "\0" in name:
        raise IpamConfigError(f"network name {name!r} cannot be used as a directory name")
    return name


def _parse_requested(text: Any, where: str) -> IPAddress:
    if not isinstance(text, str):
        raise IpamConfigError(f"{where} must be a string, got {text!r}")
    try:
        # runtimeConfig.ips entries may carry a prefix ("10.1.2.5/24"); only the IP counts.
        return ip_interface(text.strip()).ip
    except ValueError:
        raise IpamConfigError(f"{where} {text!r} is not a valid IP address") from None


def _cni_args_ips(cni_args: str) -> list[IPAddress]:
    out: list[IPAddress] = []
    for pair in filter(None, cni_args.split(";")):
        key, sep, value = pair.partition("=")
        if not sep:
            raise IpamConfigError(f"CNI_ARGS: invalid pair {pair!r}")
        if key == "IP":
            out += [_parse_requested(v, "CNI_ARGS IP") for v in value.split(",") if v]
    return out


def _list_at(obj: Any, *keys: str) -> list[Any]:
    for key in keys:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj if isinstance(obj, list) else []


def parse_requested_ips(netconf: Mapping[str, Any], cni_args: str = "") -> tuple[IPAddress, ...]:
    """Requested static IPs: ``IP=`` in CNI_ARGS, ``args.cni.ips``, ``runtimeConfig.ips``.

    Duplicates collapse (the reference keeps them in a map); order is kept.
    """
    ips = _cni_args_ips(cni_args)
    ips += [_parse_requested(v, "args.cni.ips") for v in _list_at(netconf, "args", "cni", "ips")]
    ips += [
        _parse_requested(v, "runtimeConfig.ips") for v in _list_at(netconf, "runtimeConfig", "ips")
    ]
    return tuple(dict.fromkeys(ips))


def load_ipam_config(netconf: Mapping[str, Any], cni_args: str = "") -> IpamRequest:
    """Parse a whole network config (as the plugin receives it on stdin) for IPAM."""
    if not isinstance(netconf, Mapping):
        raise IpamConfigError(f"network config must be an object, got {netconf!r}")
    ipam = netconf.get("ipam")
    if ipam is None:
        raise IpamConfigError("IPAM config missing 'ipam' key")
    runtime = netconf.get("runtimeConfig")
    ip_ranges = runtime.get("ipRanges") if isinstance(runtime, Mapping) else None
    if ip_ranges is not None and not isinstance(ip_ranges, list):
        raise IpamConfigError(f"runtimeConfig.ipRanges must be a list, got {ip_ranges!r}")
    return IpamRequest(
        network=validate_network_name(netconf.get("name")),
        config=parse_ipam_config(ipam, ip_ranges),
        requested=parse_requested_ips(netconf, cni_args),
    )
