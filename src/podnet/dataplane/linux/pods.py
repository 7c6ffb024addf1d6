"""Pod wiring for the linux backend (blocking; runs in the node-namespace thread).

A pod's host veth end is named from its container id and ifname, sits on br0, and keeps
the pod's identity in its ifalias, so the kernel alone tells a restarted agent which
pods are wired. The anti-spoofing element is added before the veth exists and removed
after it is gone, so a pod port never forwards without its entry.
"""

from __future__ import annotations

import errno
import logging

from pyroute2 import NetlinkError

from podnet.dataplane.desired import (
    BRIDGE,
    NFT_TABLE,
    PodPort,
    host_veth_name,
    is_host_veth_name,
    parse_pod_alias,
    pod_alias,
)
from podnet.dataplane.interface import DataPlaneError, PodAttachment, PodNetwork
from podnet.dataplane.linux import nftables
from podnet.dataplane.linux.netlink import Link, Netlink
from podnet.dataplane.linux.nftables import PodPortSet

log = logging.getLogger(__name__)


def bridge_index(nl: Netlink) -> int:
    """br0's index; DataPlaneError if the node is not set up."""
    bridge = nl.link(BRIDGE)
    if bridge is None or bridge.kind != "bridge":
        raise DataPlaneError(f"{BRIDGE} is missing: the node is not set up")
    return bridge.index


def attach(nl: Netlink, ports: PodPortSet, pod: PodNetwork, bridge: int) -> PodAttachment:
    """Wire ``pod`` on bridge index ``bridge``; on failure remove whatever this call
    created, then raise."""
    host = host_veth_name(pod.container_id, pod.ifname)
    port = PodPort(host, pod.mac, pod.address.ip)
    created = False
    try:
        ports.add([port])
        _create_veth(nl, ports, pod, host, bridge)
        created = True
        with Netlink.opened_in(pod.netns) as inside:
            inside.configure_pod(pod)
        nl.change_named(host, ifalias=pod_alias(pod))
    except BaseException as err:
        _undo(nl, ports, host, port, created)
        if isinstance(err, DataPlaneError):
            raise DataPlaneError(f"attaching {pod.container_id}/{pod.ifname}: {err}") from err
        raise
    return attachment(pod, host)


def _create_veth(nl: Netlink, ports: PodPortSet, pod: PodNetwork, host: str, bridge: int) -> None:
    try:
        nl.create_pod_veth(host, pod, bridge)
    except DataPlaneError as err:
        cause = err.__cause__
        if not (isinstance(cause, NetlinkError) and cause.code == errno.EEXIST):
            raise
        if nl.link(host) is None:  # the pod side exists: not ours to remove
            raise
        log.info("replacing %s, left by an earlier attach of %s", host, pod.container_id)
        detach(nl, ports, pod.container_id, pod.ifname)
        ports.add([PodPort(host, pod.mac, pod.address.ip)])
        nl.create_pod_veth(host, pod, bridge)


def attachment(pod: PodNetwork, host: str) -> PodAttachment:
    """What ``attach`` reports for ``pod`` wired on ``host``."""
    return PodAttachment(
        container_id=pod.container_id,
        host_ifname=host,
        ifname=pod.ifname,
        mac=pod.mac,
        sandbox=pod.netns,
        address=pod.address,
        gateway=pod.gateway,
        mtu=pod.mtu,
    )


def _undo(nl: Netlink, ports: PodPortSet, host: str, port: PodPort, created: bool) -> None:
    """Remove the veth if this attach made it, and the element unless a veth of that
    name (made earlier, not by this call) still needs it."""
    try:
        if created:
            nl.delete(host)
        if created or nl.link(host) is None:
            ports.delete([port])
    except DataPlaneError as err:  # keep the original error; resync repairs the rest
        log.warning("cleanup after a failed attach of %s: %s", host, err)


def detach(nl: Netlink, ports: PodPortSet, container_id: str, ifname: str) -> None:
    """Remove the pod's veth (its peer goes with it) and its anti-spoofing entries.
    Whatever is already gone is fine."""
    host = host_veth_name(container_id, ifname)
    link = nl.link(host)
    known = _port_of(link) if link is not None else None
    nl.delete(host)
    if known is None or not ports.delete([known]):
        _drop_ports_of(ports, host)  # identity unknown: look at the set itself


def _drop_ports_of(ports: PodPortSet, host: str) -> None:
    table = nftables.podnet_tables().get(f"bridge {NFT_TABLE}")
    if table is None:
        return
    listed = (nftables.parse_element(e) for e in nftables.pod_ports_in(table))
    ports.delete([p for p in listed if p is not None and p.host_ifname == host])


def _port_of(link: Link) -> PodPort | None:
    found = parse_pod_alias(link.alias, link.name, link.mtu)
    return PodPort.of(found) if found is not None else None


def pod_links(nl: Netlink, bridge: Link | None = None) -> list[Link]:
    """br0's ports that carry podnet's veth names."""
    bridge = bridge or nl.link(BRIDGE)
    if bridge is None:
        return []
    return [
        link
        for link in nl.links()
        if link.master == bridge.index and link.kind == "veth" and is_host_veth_name(link.name)
    ]


def attached(nl: Netlink) -> list[PodAttachment]:
    """The pods wired on this node, read from the host veths' ifaliases."""
    found = (parse_pod_alias(link.alias, link.name, link.mtu) for link in pod_links(nl))
    return sorted((a for a in found if a is not None), key=lambda a: a.host_ifname)


def attached_ports(nl: Netlink) -> set[PodPort]:
    """The anti-spoofing entries the wired pods need."""
    return {PodPort.of(a) for a in attached(nl)}


def remove_orphans(nl: Netlink, bridge: Link) -> None:
    """Delete podnet-named veths on br0 that carry no identity (a crash mid-attach)."""
    for link in pod_links(nl, bridge):
        if parse_pod_alias(link.alias, link.name, link.mtu) is None:
            log.info("removing orphan pod port %s", link.name)
            nl.delete(link.name)
