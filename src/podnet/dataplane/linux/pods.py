"""Pod wiring for the linux backend (blocking; runs on a pod worker thread in the node
namespace).

A pod's host veth end is named from its container id and ifname, sits on br0, and keeps
the pod's identity in its ifalias, written last, so the kernel alone tells a restarted
agent which pods are completely wired. The anti-spoofing element is added before the veth
exists, so a new pod's first frames pass. On detach it goes just before the veth (the pod
is being torn down; a frame it still sends is dropped), so that once the veth is reported
gone, nothing of the pod is left.

Attach and detach use raw netlink batches (``rtnl``): an attach is four short exchanges
(element; veth; pod side in two; identity), a detach two. Listings use pyroute2.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass, field
from ipaddress import IPv4Network

from podnet.dataplane.interface import DataPlaneError, PodAttachment, PodNetwork
from podnet.dataplane.linux import nftables, rtnl
from podnet.dataplane.linux.desired import (
    BRIDGE,
    NFT_TABLE,
    PodPort,
    host_veth_name,
    is_host_veth_name,
    parse_pod_alias,
    pod_alias,
)
from podnet.dataplane.linux.netlink import Link, Netlink
from podnet.dataplane.linux.portset import PodPortSet
from podnet.dataplane.linux.rtnl import NetlinkBatch, RequestFailed

log = logging.getLogger(__name__)

DEFAULT_ROUTE = IPv4Network("0.0.0.0/0")


@dataclass
class PodSockets:
    """One pod worker thread's sockets, opened in the node namespace."""

    links: NetlinkBatch = field(default_factory=NetlinkBatch)
    ports: PodPortSet = field(default_factory=PodPortSet)

    def close(self) -> None:
        """Release both sockets."""
        self.links.close()
        self.ports.close()


def bridge_index(nl: Netlink) -> int:
    """br0's index; DataPlaneError if the node is not set up."""
    bridge = nl.link(BRIDGE)
    if bridge is None or bridge.kind != "bridge":
        raise DataPlaneError(f"{BRIDGE} is missing: the node is not set up")
    return bridge.index


def attach(sockets: PodSockets, pod: PodNetwork, bridge: int) -> PodAttachment:
    """Wire ``pod`` on bridge index ``bridge``; on failure remove whatever this call
    created, then raise."""
    host = host_veth_name(pod.container_id, pod.ifname)
    port = PodPort(host, pod.mac, pod.address.ip)
    created = False
    try:
        sockets.ports.add([port])
        _create_veth(sockets, pod, host, bridge)
        created = True
        configure_pod(pod)
        sockets.links.run([rtnl.set_link(host, alias=pod_alias(pod))])
    except BaseException as err:
        _undo(sockets, host, port, created)
        if isinstance(err, DataPlaneError):
            raise DataPlaneError(f"attaching {pod.container_id}/{pod.ifname}: {err}") from err
        raise
    return attachment(pod, host)


def _create_veth(sockets: PodSockets, pod: PodNetwork, host: str, bridge: int) -> None:
    try:
        _new_veth(sockets.links, host, pod, bridge)
    except RequestFailed as err:
        if err.code != errno.EEXIST or not link_exists(sockets.links, host):
            raise  # the pod side exists: not ours to remove
        log.info("replacing %s, left by an earlier attach of %s", host, pod.container_id)
        detach(sockets, host, None)
        sockets.ports.add([PodPort(host, pod.mac, pod.address.ip)])
        _new_veth(sockets.links, host, pod, bridge)


def _new_veth(links: NetlinkBatch, host: str, pod: PodNetwork, bridge: int) -> None:
    try:
        fd = os.open(pod.netns, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as err:
        raise DataPlaneError(f"opening pod namespace {pod.netns}: {err}") from err
    try:
        peer = rtnl.PeerEnd(pod.ifname, fd, pod.mac)
        links.run([rtnl.create_veth(host, bridge, pod.mtu, peer), rtnl.bridge_port_hairpin(host)])
    finally:
        os.close(fd)


def link_exists(links: NetlinkBatch, name: str) -> bool:
    """Whether link ``name`` exists in the socket's namespace."""
    return links.run([rtnl.get_link(name)])[0] is not None


def configure_pod(pod: PodNetwork) -> None:
    """In the pod namespace: lo and the interface up, address, default route and extra
    routes via the gateway (the MAC and MTU were set when the veth was born)."""
    with NetlinkBatch.opened_in(pod.netns) as inside:
        ups = [rtnl.set_link("lo", up=True), rtnl.set_link(pod.ifname, up=True)]
        reply = inside.run([*ups, rtnl.get_link(pod.ifname)])[-1]
        if reply is None:
            raise DataPlaneError(f"link {pod.ifname} does not exist in {pod.netns}")
        index = rtnl.link_index(reply)
        routes = [rtnl.add_route(dst, pod.gateway, index) for dst in (DEFAULT_ROUTE, *pod.routes)]
        inside.run([rtnl.add_address(index, pod.address), *routes])


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


def _undo(sockets: PodSockets, host: str, port: PodPort, created: bool) -> None:
    """Remove the veth if this attach made it, and the element unless a veth of that
    name (made earlier, not by this call) still needs it."""
    try:
        if created:
            sockets.links.run([rtnl.delete_link(host)])
        if created or not link_exists(sockets.links, host):
            sockets.ports.delete([port])
    except DataPlaneError as err:  # keep the original error; resync repairs the rest
        log.warning("cleanup after a failed attach of %s: %s", host, err)


def detach(sockets: PodSockets, host: str, known: PodPort | None) -> None:
    """Remove the anti-spoofing entry of veth ``host``, then the veth (its peer goes
    with it). Whatever is already gone is fine."""
    drop_entry(sockets.ports, host, known)
    sockets.links.run([rtnl.delete_link(host)])


def start_detach(sockets: PodSockets, host: str, known: PodPort | None) -> rtnl.LinkDeletion:
    """``detach`` in two steps: the entry goes now; the returned deletion of the veth is
    to be sent (see ``rtnl.LinkDeletion``)."""
    drop_entry(sockets.ports, host, known)
    return rtnl.LinkDeletion(host)


def drop_entry(ports: PodPortSet, host: str, known: PodPort | None) -> None:
    """Delete ``known``, the anti-spoofing entry of ``host`` when the caller knows it;
    otherwise (or if it is not there) whatever the set holds for ``host``."""
    if known is None or not ports.delete([known]):
        _drop_ports_of(ports, host)  # identity unknown: look at the set itself


def _drop_ports_of(ports: PodPortSet, host: str) -> None:
    table = nftables.podnet_tables().get(f"bridge {NFT_TABLE}")
    if table is None:
        return
    listed = (nftables.parse_element(e) for e in nftables.pod_ports_in(table))
    ports.delete([p for p in listed if p is not None and p.host_ifname == host])


def known_port(nl: Netlink, container_id: str, ifname: str) -> PodPort | None:
    """The anti-spoofing entry recorded in the pod's host veth (None if it is gone or
    carries no identity)."""
    link = nl.link(host_veth_name(container_id, ifname))
    return _port_of(link) if link is not None else None


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
