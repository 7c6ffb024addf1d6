"""The underlay: a namespace whose bridge plays the physical network, and an outside host.

``pn-<id>-underlay`` holds the bridge ``br-underlay`` (MTU 1500). Every node, and the
"external host" ``pn-<id>-ext`` (on the underlay but not a node, the target of the NAT
test), hangs off it with a veth pair that is created with each end directly in its own
namespace, so the root namespace never sees a link, an address or a route of ours.

Addresses come from the underlay CIDR (default 192.168.100.0/24), inside namespaces only:
node ``k`` is ``.10+k`` and the external host ``.250``.

The bridge has port security, as a managed switch would (``dataplane.linux.portsecurity``):
each port takes frames only with the MAC of the host plugged into it, so no host on the
underlay (the external host above all) can forge a node's MAC, and with it the node's
VXLAN, whose outer source address and MAC its peers check.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import time
from collections.abc import Iterator
from ipaddress import IPv4Interface, IPv4Network
from pathlib import Path

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from podnet import netns
from podnet.cluster.state import ClusterState, ExternalHost, spawn
from podnet.dataplane.linux import portsecurity

DEFAULT_UNDERLAY = "192.168.100.0/24"
BRIDGE = "br-underlay"
MTU = 1500
EXTERNAL_OFFSET = 250
ECHO_PORT = 8080


def underlay_netns(state: ClusterState) -> str:
    return f"{state.prefix()}-underlay"


def external_netns(state: ClusterState) -> str:
    return f"{state.prefix()}-ext"


def uplink_name(state: ClusterState) -> str:
    """The underlay link's name inside a node (or the external host)."""
    return f"{state.prefix()}-eth0"


def node_address(state: ClusterState, index: int) -> IPv4Interface:
    """Node ``index``'s underlay address (with the underlay's prefix length)."""
    network = IPv4Network(state.underlay_cidr)
    return IPv4Interface(f"{network.network_address + 10 + index}/{network.prefixlen}")


def external_address(state: ClusterState) -> IPv4Interface:
    network = IPv4Network(state.underlay_cidr)
    return IPv4Interface(f"{network.network_address + EXTERNAL_OFFSET}/{network.prefixlen}")


@contextlib.contextmanager
def netlink(namespace: str) -> Iterator[IPRoute]:
    """A netlink socket opened inside ``namespace`` (it stays there)."""
    with netns.entered(namespace):
        ipr = IPRoute()
    try:
        yield ipr
    finally:
        ipr.close()


def create_netns(state: ClusterState, state_dir: Path, name: str) -> None:
    """Record ``name`` in the state, then create it (idempotent)."""
    state.record_netns(name, state_dir)
    netns.create(name)


def ensure_underlay(state: ClusterState, state_dir: Path) -> None:
    """The underlay namespace and its bridge, up (idempotent)."""
    name = underlay_netns(state)
    create_netns(state, state_dir, name)
    with netlink(name) as ipr:
        if not ipr.link_lookup(ifname=BRIDGE):
            ipr.link("add", ifname=BRIDGE, kind="bridge")
        index = ipr.link_lookup(ifname=BRIDGE)[0]
        ipr.link("set", index=index, mtu=MTU, state="up")


def plug(state: ClusterState, namespace: str, bridge_port: str, address: IPv4Interface) -> None:
    """Connect ``namespace`` to the underlay bridge: a veth whose inner end is the uplink
    with ``address``, whose outer end ``bridge_port`` is a port of the bridge that takes
    only the uplink's MAC (port security)."""
    inner = uplink_name(state)
    with netlink(underlay_netns(state)) as ipr:
        if not ipr.link_lookup(ifname=bridge_port):
            peer = {"ifname": inner, "net_ns_fd": str(netns.path(namespace))}
            ipr.link("add", ifname=bridge_port, kind="veth", peer=peer)
        port = ipr.link_lookup(ifname=bridge_port)[0]
        bridge = ipr.link_lookup(ifname=BRIDGE)[0]
        ipr.link("set", index=port, master=bridge, mtu=MTU, state="up")
    with netlink(namespace) as ipr:
        index = ipr.link_lookup(ifname=inner)[0]
        ipr.link("set", index=index, mtu=MTU, state="up")
        mac = str(ipr.get_links(index)[0].get_attr("IFLA_ADDRESS"))
        with contextlib.suppress(NetlinkError):  # EEXIST: already there
            ipr.addr(
                "add", index=index, address=str(address.ip), prefixlen=address.network.prefixlen
            )
    with netns.entered(underlay_netns(state)):
        portsecurity.allow(bridge_port, mac)


def ensure_external_host(state: ClusterState, state_dir: Path) -> ExternalHost:
    """The external host on the underlay, running an echo server (idempotent)."""
    name = external_netns(state)
    create_netns(state, state_dir, name)
    address = external_address(state)
    plug(state, name, f"{state.prefix()}-ext", address)
    host = state.external or ExternalHost(name, str(address.ip))
    state.external = host
    if host.echo is None or not host.echo.alive():
        argv = [sys.executable, "-m", "podnet.cluster.echo", "--port", str(ECHO_PORT)]
        host.echo = spawn(netns.command(name, argv), external_log(state_dir), "podnet.cluster.echo")
    state.save(state_dir)
    deadline = time.monotonic() + 15
    while not tcp_listens(name, ECHO_PORT):
        if time.monotonic() > deadline or not host.echo.alive():
            raise RuntimeError(f"external echo server not listening; see {external_log(state_dir)}")
        time.sleep(0.05)
    return host


def external_log(state_dir: Path) -> Path:
    """The external echo server's log: one line per TCP connection, with the peer."""
    return state_dir / "external" / "echo.log"


def tcp_listens(namespace: str, port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port`` in ``namespace``."""
    with netns.entered(namespace):
        sock = socket.socket()
    with sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0
