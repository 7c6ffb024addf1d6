"""Pod wiring for the ovs data plane: the kernel part (blocking; on a node-namespace
thread) and the pod's identity kept in its OVS port.

The veth is the linux data plane's (``linux.pods``: born in the pod namespace with its MAC
and MTU, then address and routes inside), named the same way, but not enslaved to a
Linux bridge: its host end becomes an OVS port of br0, and the node's kernel is kept
off it (``keep_out_of_the_host``). Inside the pod, transmit checksum
offload is turned off: the userspace datapath reads the host end with a packet socket,
which hands over a TCP segment whose checksum the sender left to the "hardware", and
nothing on the way would ever fill it in (ICMP works either way, TCP does not).

The pod's identity (container id, ifname, address, gateway, MTU, sandbox) is written to
the OVS port's external_ids in the same transaction that adds the port, so a restarted
agent reads the wired pods back from the database (``attachment_of``).
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import socket
import struct
from collections.abc import Mapping
from ipaddress import IPv4Address, IPv4Interface
from pathlib import Path

from podnet import netns
from podnet.dataplane.interface import DataPlaneError, PodAttachment, PodNetwork, pod_mac
from podnet.dataplane.linux import rtnl
from podnet.dataplane.linux.netlink import Netlink
from podnet.dataplane.linux.pods import configure_pod
from podnet.dataplane.linux.rtnl import NetlinkBatch
from podnet.dataplane.wiring import is_host_veth_name

log = logging.getLogger(__name__)

SIOCETHTOOL = 0x8946
ETHTOOL_STXCSUM = 0x17  # set transmit checksum offload
NO_MASTER = 0  # the host end is OVS's port, on no Linux bridge
IDENTITY = "podnet"  # external_ids key whose value marks a podnet pod port (the format)
IDENTITY_VERSION = "1"
KEYS = ("container_id", "ifname", "address", "gateway", "mtu", "sandbox")


def identity(pod: PodNetwork) -> dict[str, str]:
    """The external_ids of ``pod``'s OVS port."""
    return {
        IDENTITY: IDENTITY_VERSION,
        "container_id": pod.container_id,
        "ifname": pod.ifname,
        "address": str(pod.address),
        "gateway": str(pod.gateway),
        "mtu": str(pod.mtu),
        "sandbox": pod.netns,
        "namespace": pod.namespace,
        "name": pod.name,
    }


def attachment_of(host_ifname: str, ids: Mapping[str, str]) -> PodAttachment | None:
    """The attachment recorded in a port's external_ids (None if not a whole identity)."""
    if ids.get(IDENTITY) != IDENTITY_VERSION or any(key not in ids for key in KEYS):
        return None
    try:
        address, gateway = IPv4Interface(ids["address"]), IPv4Address(ids["gateway"])
        mtu = int(ids["mtu"])
    except ValueError:
        return None
    return PodAttachment(
        container_id=ids["container_id"],
        host_ifname=host_ifname,
        ifname=ids["ifname"],
        mac=pod_mac(address.ip),
        sandbox=ids["sandbox"],
        address=address,
        gateway=gateway,
        mtu=mtu,
    )


def wire(pod: PodNetwork, host: str) -> None:
    """The veth (a leftover of the same name replaced), the pod side configured, and
    checksum offload off in the pod; on failure the veth is removed again."""
    unwire(host)  # a leftover of a crash (its OVS port is replaced after this)
    fd = _open_netns(pod.netns)
    try:
        peer = rtnl.PeerEnd(pod.ifname, fd, pod.mac)
        _run([rtnl.create_veth(host, NO_MASTER, pod.mtu, peer)])
    finally:
        os.close(fd)
    try:
        keep_out_of_the_host(host)
        configure_pod(pod)
        checksum_offload_off(pod.netns, pod.ifname)
    except BaseException:
        try:
            unwire(host)
        except DataPlaneError as err:  # keep the first error; set-up removes strays
            log.warning("removing %s after a failed attach: %s", host, err)
        raise


def unwire(host: str) -> None:
    """Delete the veth (its pod end goes with it); fine if it is gone."""
    _run([rtnl.delete_link(host)])


def _run(requests: list[rtnl.Request]) -> None:
    """``requests`` on a netlink socket of the calling thread's namespace (one per call:
    pods are wired on several threads at once)."""
    links = NetlinkBatch()
    try:
        links.run(requests)
    finally:
        links.close()


def remove_stray_veths(nl: Netlink, ports: set[str]) -> list[str]:
    """Delete podnet-named veths that are not among ``ports`` (br0's); their names."""
    stray = [
        link.name
        for link in nl.links()
        if link.kind == "veth" and is_host_veth_name(link.name) and link.name not in ports
    ]
    for name in stray:
        log.info("removing stray pod veth %s", name)
        nl.delete(name)
    return stray


def keep_out_of_the_host(host: str) -> None:
    """The host end is OVS's port, but the node's kernel sees its frames too: it must
    not answer the pod's ARP for the gateway (the pod would then send to this end's MAC
    and the kernel would route a second copy of each packet), route what it receives on
    it, or speak IPv6 on it."""
    for path, value in (
        (f"/proc/sys/net/ipv4/conf/{host}/arp_ignore", "8"),
        (f"/proc/sys/net/ipv4/conf/{host}/forwarding", "0"),
        (f"/proc/sys/net/ipv6/conf/{host}/disable_ipv6", "1"),
    ):
        try:
            Path(path).write_text(value)
        except OSError as err:
            raise DataPlaneError(f"setting {path}: {err}") from err


def checksum_offload_off(sandbox: str, ifname: str) -> None:
    """``ethtool -K <ifname> tx off`` inside the pod namespace (one ioctl)."""
    try:
        with netns.entered(sandbox):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except OSError as err:
        raise DataPlaneError(f"entering pod namespace {sandbox}: {err}") from err
    with sock:
        value = ctypes.create_string_buffer(struct.pack("II", ETHTOOL_STXCSUM, 0))
        request = struct.pack("16sP", ifname.encode(), ctypes.addressof(value))
        try:
            fcntl.ioctl(sock.fileno(), SIOCETHTOOL, request)
        except OSError as err:
            raise DataPlaneError(f"turning tx checksum offload off on {ifname}: {err}") from err


def _open_netns(sandbox: str) -> int:
    try:
        return os.open(sandbox, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as err:
        raise DataPlaneError(f"opening pod namespace {sandbox}: {err}") from err
