"""The agent publishes its node's underlay MAC, so its peers can check the Ethernet source
of its VXLAN (``podnet.dataplane.vteppeers``).

The MAC is the one of the interface that holds the node IP (never OVS's ``br-phy``,
which holds the node IP too, with the uplink's MAC: the data planes' uplink). It
goes on the agent's own Node as ``podnet.io/underlay-mac`` (a merge patch: NodeRestriction
lets a node write only its own Node, and only a usable MAC there); the HostSubnet
controller copies it to the node's HostSubnet. Published at every start, so a changed
NIC is published again; an interface without a usable MAC publishes nothing, and the
peers check this node by address alone.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address
from typing import Any

from podnet.agent.nodestatus import NodePatcher
from podnet.client import with_retry
from podnet.model.kinds import NODE
from podnet.model.underlaymac import UNDERLAY_MAC_ANNOTATION, normal_mac

log = logging.getLogger("podnet.agent.underlaymac")
SKIPPED = ("br-phy",)  # OVS's underlay bridge: holds the node IP beside the uplink


@dataclass(frozen=True)
class Interface:
    """One interface of the node's namespace: its name, MAC and IPv4 addresses."""

    name: str
    mac: str
    addresses: frozenset[IPv4Address]


def choose_mac(interfaces: Iterable[Interface], node_ip: IPv4Address) -> str | None:
    """The usable MAC of the interface holding ``node_ip`` (not br-phy); None when there
    is none."""
    for interface in sorted(interfaces, key=lambda i: i.name):
        if interface.name not in SKIPPED and node_ip in interface.addresses:
            return normal_mac(interface.mac)
    return None


def read_interfaces() -> list[Interface]:
    """The interfaces of this thread's network namespace (pyroute2)."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        addresses: dict[int, set[IPv4Address]] = {}
        for msg in ipr.get_addr(family=socket.AF_INET):
            address = msg.get_attr("IFA_LOCAL") or msg.get_attr("IFA_ADDRESS")
            if address:
                addresses.setdefault(int(msg["index"]), set()).add(IPv4Address(address))
        return [_interface(link, addresses) for link in ipr.get_links()]


def _interface(link: Any, addresses: dict[int, set[IPv4Address]]) -> Interface:
    name = str(link.get_attr("IFLA_IFNAME") or "")
    mac = str(link.get_attr("IFLA_ADDRESS") or "")
    return Interface(name, mac, frozenset(addresses.get(int(link["index"]), set())))


async def publish_underlay_mac(api: NodePatcher, node: str, node_ip: IPv4Address) -> str | None:
    """Write this node's underlay MAC on its Node (removing a stale one when there is
    none now; transient failures retried for a minute); the MAC published, or None."""
    # pyroute2 runs an event loop of its own: not on the agent's
    mac = choose_mac(await asyncio.to_thread(read_interfaces), node_ip)
    patch = {"metadata": {"annotations": {UNDERLAY_MAC_ANNOTATION: mac}}}
    await with_retry(lambda: api.patch(NODE, None, node, patch), "publishing the underlay MAC")
    if mac is None:
        log.warning(
            "no usable underlay MAC for %s: peers check this node by address alone", node_ip
        )
    else:
        log.info("published underlay MAC %s (%s)", mac, UNDERLAY_MAC_ANNOTATION)
    return mac
