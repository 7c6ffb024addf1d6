"""A thin pyroute2 wrapper: typed snapshots, errno-tolerant ensure/delete helpers (node
set-up, remote nodes and listings; the pod hot path uses ``rtnl``).

A ``Netlink`` works in the namespace its socket was opened in, whichever thread uses
it later; it is not thread-safe, so the backend uses each one from a single thread.
Errors become ``DataPlaneError`` with what was being done; "already there" on create and
"not there" on delete are not errors.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Interface, IPv4Network
from typing import Any

from pyroute2 import IPRoute, NetlinkError

from podnet.dataplane.interface import DataPlaneError
from podnet.dataplane.linux.desired import (
    NO_GATEWAY,
    ROUTE_PROTO,
    FdbEntry,
    NeighEntry,
    RouteEntry,
)

IFF_UP = 0x1
RTNH_F_ONLINK = 0x4
NUD_PERMANENT = 0x80
NUD_NOARP = 0x40
NTF_SELF = 0x2
AF_INET = 2
MAIN_TABLE = 254
SCOPE_LINK = 253
_ABSENT = (errno.ENODEV, errno.ENOENT, errno.ESRCH, errno.EADDRNOTAVAIL)


@dataclass(frozen=True)
class Link:
    """What podnet reads of a network interface."""

    index: int
    name: str
    kind: str
    mtu: int
    mac: str
    up: bool
    master: int
    alias: str
    info: Mapping[str, Any] = field(default_factory=dict)  # IFLA_INFO_DATA attributes


def nl_call(
    what: str, fn: Callable[..., Any], *args: Any, tolerate: tuple[int, ...] = (), **kwargs: Any
) -> Any:
    """Call ``fn``; netlink/OS errors become ``DataPlaneError`` saying ``what`` failed,
    except the errnos in ``tolerate``, which return None."""
    try:
        return fn(*args, **kwargs)
    except NetlinkError as err:
        if err.code in tolerate:
            return None
        raise DataPlaneError(f"{what}: {os.strerror(err.code)} (errno {err.code})") from err
    except OSError as err:
        if err.errno in tolerate:
            return None
        raise DataPlaneError(f"{what}: {err}") from err


class Netlink:
    """One rtnetlink socket in one namespace, with the operations podnet needs."""

    def __init__(self, ipr: IPRoute) -> None:
        self.ipr = ipr

    @classmethod
    def open(cls) -> Netlink:
        """A socket in the calling thread's current namespace."""
        return cls(nl_call("opening a netlink socket", IPRoute))

    def close(self) -> None:
        """Release the socket."""
        self.ipr.close()

    # --- links ---------------------------------------------------------------------

    def link(self, name: str) -> Link | None:
        """The link called ``name``, or None."""
        msgs = nl_call(f"reading link {name}", self.ipr.link, "get", ifname=name, tolerate=_ABSENT)
        return _link(msgs[0]) if msgs else None

    def link_at(self, index: int) -> Link | None:
        """The link with ``index``, or None."""
        msgs = nl_call(f"reading link {index}", self.ipr.link, "get", index=index, tolerate=_ABSENT)
        return _link(msgs[0]) if msgs else None

    def links(self) -> list[Link]:
        """Every link in the namespace."""
        return [_link(m) for m in nl_call("listing links", self.ipr.link, "dump")]

    def create(self, name: str, kind: str, **attrs: Any) -> Link:
        """Create link ``name`` of ``kind`` with ``attrs``; return it."""
        nl_call(f"creating {kind} {name}", self.ipr.link, "add", ifname=name, kind=kind, **attrs)
        return self.require(name)

    def require(self, name: str) -> Link:
        """The link called ``name``; DataPlaneError if it is missing."""
        link = self.link(name)
        if link is None:
            raise DataPlaneError(f"link {name} does not exist")
        return link

    def change(self, link: Link, **attrs: Any) -> None:
        """Change attributes (mtu, address, state, ifalias...) of an existing link."""
        if attrs:
            what = f"setting {sorted(attrs)} on {link.name}"
            nl_call(what, self.ipr.link, "set", index=link.index, **attrs)

    def delete(self, name: str) -> bool:
        """Delete link ``name``; False if it was not there."""
        link = self.link(name)
        if link is None:
            return False
        nl_call(f"deleting link {name}", self.ipr.link, "del", index=link.index, tolerate=_ABSENT)
        return True

    # --- addresses -------------------------------------------------------------------

    def ipv4_addresses(self, index: int) -> set[IPv4Interface]:
        """The IPv4 addresses on link ``index``."""
        msgs = nl_call("listing addresses", self.ipr.addr, "dump", family=AF_INET, index=index)
        return {_address(m) for m in msgs if m["index"] == index}

    def owner_of(self, ip: IPv4Address) -> int | None:
        """Index of the link holding address ``ip``, or None."""
        msgs = nl_call("listing addresses", self.ipr.addr, "dump", family=AF_INET)
        owners = [int(m["index"]) for m in msgs if _address(m).ip == ip]
        return owners[0] if owners else None

    def add_address(self, index: int, address: IPv4Interface) -> None:
        """Add ``address`` to link ``index`` (fine if present)."""
        ip, plen = str(address.ip), address.network.prefixlen
        nl_call(
            f"adding {address}",
            self.ipr.addr,
            "add",
            index=index,
            address=ip,
            prefixlen=plen,
            tolerate=(errno.EEXIST,),
        )

    def delete_address(self, index: int, address: IPv4Interface) -> None:
        """Remove ``address`` from link ``index`` (fine if absent)."""
        ip, plen = str(address.ip), address.network.prefixlen
        nl_call(
            f"deleting {address}",
            self.ipr.addr,
            "del",
            index=index,
            address=ip,
            prefixlen=plen,
            tolerate=_ABSENT,
        )

    # --- routes, neighbours, fdb ------------------------------------------------------

    def owned_routes(self, names: Mapping[int, str]) -> list[RouteEntry]:
        """podnet's IPv4 routes (protocol ``ROUTE_PROTO``) in the main table."""
        msgs = nl_call("listing routes", self.ipr.route, "dump", family=AF_INET)
        return [
            _route(m, names)
            for m in msgs
            if m["proto"] == ROUTE_PROTO and m.get_attr("RTA_TABLE") == MAIN_TABLE
        ]

    def put_route(self, entry: RouteEntry, index: int, *, replace: bool) -> None:
        """Add (or replace) a podnet route; ``index`` is ``entry.dev``'s index."""
        attrs: dict[str, Any] = {
            "dst": str(entry.dst),
            "oif": index,
            "proto": ROUTE_PROTO,
            "table": MAIN_TABLE,
            **_next_hop(entry),
        }
        if entry.onlink:
            attrs["flags"] = RTNH_F_ONLINK
        if entry.prefsrc is not None:
            attrs["prefsrc"] = str(entry.prefsrc)
        command = "replace" if replace else "add"
        nl_call(
            f"{command} route {entry.dst} via {entry.gateway}", self.ipr.route, command, **attrs
        )

    def delete_route(self, entry: RouteEntry, index: int) -> None:
        """Delete one podnet route (fine if gone)."""
        attrs = {"dst": str(entry.dst), "oif": index, **_next_hop(entry)}
        nl_call(
            f"deleting route {entry.dst}",
            self.ipr.route,
            "del",
            proto=ROUTE_PROTO,
            table=MAIN_TABLE,
            tolerate=_ABSENT,
            **attrs,
        )

    def neighbours(self, link: Link) -> list[NeighEntry]:
        """podnet's permanent IPv4 neighbour entries on ``link``."""
        what = f"listing neighbours on {link.name}"
        msgs = nl_call(what, self.ipr.neigh, "dump", family=AF_INET, ifindex=link.index)
        return [
            NeighEntry(IPv4Address(m.get_attr("NDA_DST")), m.get_attr("NDA_LLADDR"), link.name)
            for m in msgs
            if m["ifindex"] == link.index
            and m["state"] & NUD_PERMANENT
            and m.get_attr("NDA_PROTOCOL") == ROUTE_PROTO
        ]

    def put_neighbour(self, entry: NeighEntry, index: int) -> None:
        """Add or replace a permanent neighbour entry."""
        nl_call(
            f"setting neighbour {entry.ip}",
            self.ipr.neigh,
            "replace",
            dst=str(entry.ip),
            lladdr=entry.mac,
            ifindex=index,
            state=NUD_PERMANENT,
            protocol=ROUTE_PROTO,
        )

    def delete_neighbour(self, entry: NeighEntry, index: int) -> None:
        """Delete a neighbour entry (fine if gone)."""
        nl_call(
            f"deleting neighbour {entry.ip}",
            self.ipr.neigh,
            "del",
            dst=str(entry.ip),
            ifindex=index,
            tolerate=_ABSENT,
        )

    def fdb_entries(self, link: Link) -> list[FdbEntry]:
        """The permanent unicast forwarding entries of VXLAN link ``link``."""
        msgs = nl_call(f"listing fdb of {link.name}", self.ipr.fdb, "dump", ifindex=link.index)
        return [
            FdbEntry(m.get_attr("NDA_LLADDR"), IPv4Address(m.get_attr("NDA_DST")), link.name)
            for m in msgs
            if m["ifindex"] == link.index and m["state"] & NUD_PERMANENT and m.get_attr("NDA_DST")
        ]

    def put_fdb(self, entry: FdbEntry, index: int) -> None:
        """Add or replace a VXLAN forwarding entry (on the device itself: NTF_SELF)."""
        nl_call(
            f"setting fdb {entry.mac}",
            self.ipr.fdb,
            "replace",
            ifindex=index,
            lladdr=entry.mac,
            dst=str(entry.dst),
            state=NUD_PERMANENT | NUD_NOARP,
            flags=NTF_SELF,
        )

    def delete_fdb(self, entry: FdbEntry, index: int) -> None:
        """Delete a VXLAN forwarding entry (fine if gone)."""
        nl_call(
            f"deleting fdb {entry.mac}",
            self.ipr.fdb,
            "del",
            ifindex=index,
            lladdr=entry.mac,
            dst=str(entry.dst),
            tolerate=_ABSENT,
        )


def _link(msg: Any) -> Link:
    linkinfo = msg.get_attr("IFLA_LINKINFO")
    kind, info = "", {}
    if linkinfo is not None:
        kind = linkinfo.get_attr("IFLA_INFO_KIND") or ""
        data = linkinfo.get_attr("IFLA_INFO_DATA")
        if data is not None and hasattr(data, "get_attrs"):
            info = {name: value for name, value in data["attrs"] if name != "UNKNOWN"}
    return Link(
        index=int(msg["index"]),
        name=msg.get_attr("IFLA_IFNAME"),
        kind=kind,
        mtu=int(msg.get_attr("IFLA_MTU") or 0),
        mac=msg.get_attr("IFLA_ADDRESS") or "",
        up=bool(msg["flags"] & IFF_UP),
        master=int(msg.get_attr("IFLA_MASTER") or 0),
        alias=msg.get_attr("IFLA_IFALIAS") or "",
        info=info,
    )


def _next_hop(entry: RouteEntry) -> dict[str, Any]:
    """The gateway, or for a route onto the device itself, link scope."""
    if entry.gateway == NO_GATEWAY:
        return {"scope": SCOPE_LINK}
    return {"gateway": str(entry.gateway)}


def _route(msg: Any, names: Mapping[int, str]) -> RouteEntry:
    dst = IPv4Network(f"{msg.get_attr('RTA_DST') or '0.0.0.0'}/{msg['dst_len']}")
    prefsrc = msg.get_attr("RTA_PREFSRC")
    return RouteEntry(
        dst=dst,
        gateway=IPv4Address(msg.get_attr("RTA_GATEWAY") or "0.0.0.0"),
        dev=names.get(int(msg.get_attr("RTA_OIF") or 0), "?"),
        onlink=bool(msg["flags"] & RTNH_F_ONLINK),
        prefsrc=IPv4Address(prefsrc) if prefsrc else None,
    )


def _address(msg: Any) -> IPv4Interface:
    ip = msg.get_attr("IFA_LOCAL") or msg.get_attr("IFA_ADDRESS")
    return IPv4Interface(f"{ip}/{msg['prefixlen']}")
