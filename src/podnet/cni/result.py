"""The result of a CNI ADD, version-neutral, with its rendering in each spec version
(``format_result``) and its reading from any of them (``parse_result``, e.g. a
prevResult).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from podnet.cni.fields import get_field, invalid, objects, required, strings
from podnet.cni.validate import SUPPORTED_VERSIONS, check_version

# Versions whose results carry "version": "4"|"6" in each ip.
LEGACY_VERSIONS = frozenset({"0.3.0", "0.3.1", "0.4.0"})
# Interface mtu and the route attributes after gw are new in 1.1.0.
EXTRAS_SINCE = "1.1.0"
ROUTE_EXTRAS = ("mtu", "advmss", "priority", "table", "scope")


@dataclass(frozen=True)
class Interface:
    """An interface of a result; ``sandbox`` is the netns path for pod-side ones."""

    name: str
    mac: str = ""
    mtu: int | None = None  # 1.1.0 only
    sandbox: str = ""


@dataclass(frozen=True)
class IPConfig:
    """An address in CIDR form; ``interface`` indexes ``CniResult.interfaces``."""

    address: str
    gateway: str | None = None
    interface: int | None = None

    @property
    def version(self) -> str:
        """The IP version as the 0.3.x/0.4.0 formats spell it: "4" or "6"."""
        return str(ipaddress.ip_interface(self.address).version)


@dataclass(frozen=True)
class Route:
    """A route; the attributes after ``gw`` exist in spec 1.1.0 only."""

    dst: str
    gw: str | None = None
    mtu: int | None = None
    advmss: int | None = None
    priority: int | None = None
    table: int | None = None
    scope: int | None = None


@dataclass(frozen=True)
class DNS:
    """DNS settings of a result."""

    nameservers: tuple[str, ...] = ()
    domain: str = ""
    search: tuple[str, ...] = ()
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class CniResult:
    """The version-neutral result of ADD; ``format_result`` renders one version."""

    interfaces: tuple[Interface, ...] = ()
    ips: tuple[IPConfig, ...] = ()
    routes: tuple[Route, ...] = ()
    dns: DNS = field(default_factory=DNS)


def _format_interface(iface: Interface, extras: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"name": iface.name}
    if iface.mac:
        out["mac"] = iface.mac
    if iface.mtu and extras:
        out["mtu"] = iface.mtu
    if iface.sandbox:
        out["sandbox"] = iface.sandbox
    return out


def _format_ip(ip: IPConfig, legacy: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"version": ip.version} if legacy else {}
    out["address"] = ip.address
    if ip.gateway:
        out["gateway"] = ip.gateway
    if ip.interface is not None:
        out["interface"] = ip.interface
    return out


def _format_route(route: Route, extras: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"dst": route.dst}
    if route.gw:
        out["gw"] = route.gw
    if extras:
        out.update({k: getattr(route, k) for k in ROUTE_EXTRAS if getattr(route, k) is not None})
    return out


def _format_dns(dns: DNS) -> dict[str, Any]:
    out = {"nameservers": list(dns.nameservers), "domain": dns.domain}
    out.update({"search": list(dns.search), "options": list(dns.options)})
    return {key: value for key, value in out.items() if value}


def format_result(result: CniResult, cni_version: str) -> dict[str, Any]:
    """Render ``result`` in the format of ``cni_version`` (the request config's)."""
    check_version("ADD", {"cniVersion": cni_version})
    legacy = cni_version in LEGACY_VERSIONS
    extras = SUPPORTED_VERSIONS.index(cni_version) >= SUPPORTED_VERSIONS.index(EXTRAS_SINCE)
    out: dict[str, Any] = {"cniVersion": cni_version}
    if result.interfaces:
        out["interfaces"] = [_format_interface(i, extras) for i in result.interfaces]
    if result.ips:
        out["ips"] = [_format_ip(ip, legacy) for ip in result.ips]
    if result.routes:
        out["routes"] = [_format_route(r, extras) for r in result.routes]
    out["dns"] = _format_dns(result.dns)
    return out


def _parse_ip(item: Mapping[str, Any]) -> IPConfig:
    address = required(item, "address", "result")
    try:
        ipaddress.ip_interface(address)
    except ValueError:
        raise invalid("result", f'bad ip address "{address}"') from None
    gateway = get_field(item, "gateway", str, "result")
    return IPConfig(address, gateway, get_field(item, "interface", int, "result"))


def _parse_route(item: Mapping[str, Any]) -> Route:
    ints = {k: get_field(item, k, int, "result") for k in ROUTE_EXTRAS}
    return Route(required(item, "dst", "result"), get_field(item, "gw", str, "result"), **ints)


def _parse_interface(item: Mapping[str, Any]) -> Interface:
    return Interface(
        required(item, "name", "result"),
        get_field(item, "mac", str, "result") or "",
        get_field(item, "mtu", int, "result"),
        get_field(item, "sandbox", str, "result") or "",
    )


def _parse_dns(data: Mapping[str, Any]) -> DNS:
    dns = get_field(data, "dns", dict, "result") or {}
    lists = {k: strings(dns, k, "result") for k in ("nameservers", "search", "options")}
    return DNS(domain=get_field(dns, "domain", str, "result") or "", **lists)


def parse_result(data: Mapping[str, Any]) -> CniResult:
    """Read a result in any supported version's format (e.g. a prevResult); raise CniError(7)."""
    return CniResult(
        interfaces=tuple(_parse_interface(i) for i in objects(data, "interfaces", "result")),
        ips=tuple(_parse_ip(i) for i in objects(data, "ips", "result")),
        routes=tuple(_parse_route(r) for r in objects(data, "routes", "result")),
        dns=_parse_dns(data),
    )
