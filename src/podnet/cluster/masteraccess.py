"""How pods of the local cluster reach the masters: through ``default/kubernetes``.

The masters listen on the root namespace's loopback only (network-safety rule), which no
pod can reach. So each master gets an address on the underlay, held by the external
host's namespace (``pn-<id>-ext``, a project namespace, not the root one): master ``k``
is ``.240+k`` (at most ``MAX_ADVERTISED`` masters; more get none). There a relay
(``podnet.cluster.relay --netns <ext> --host <address>``) listens on
``<address>:ADVERTISED_PORT`` and forwards to that master's loopback port, and nothing
else. Each master runs with ``--advertise-address <its address> --advertise-port
ADVERTISED_PORT``, so the endpoints of ``default/kubernetes`` hold the live masters'
underlay addresses, and a pod's connection to ``kubernetes.default.svc:443`` is
DNATed by its node's service proxy to one of them (masqueraded to the node's address,
as traffic leaving the cluster is) and relayed to that master. Every master's serving
certificate names all the masters' addresses (one shared PKI directory).
"""

from __future__ import annotations

import contextlib
import socket
import sys
import time
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

from pyroute2.netlink.exceptions import NetlinkError

from podnet import netns
from podnet.cluster.state import ClusterState, MasterRecord, spawn
from podnet.cluster.underlay import external_netns, netlink, uplink_name

MASTER_OFFSET = 240
MAX_ADVERTISED = 9  # .241-.249: .250 is the external host
ADVERTISED_PORT = 6443


def master_address(state: ClusterState, record: MasterRecord) -> IPv4Address | None:
    """Master ``record``'s underlay address, or None (no underlay yet, or too many)."""
    if not state.underlay_cidr or not 1 <= record.index <= MAX_ADVERTISED:
        return None
    return IPv4Network(state.underlay_cidr).network_address + MASTER_OFFSET + record.index


def advertise_args(state: ClusterState, record: MasterRecord) -> list[str]:
    """The flags that make master ``record`` advertise its underlay address (none
    without one), and put every master's address in the shared certificate."""
    own = master_address(state, record)
    if own is None:
        return []
    args = ["--advertise-address", str(own), "--advertise-port", str(ADVERTISED_PORT)]
    for other in state.masters:
        address = master_address(state, other)
        if address is not None and address != own:
            args += ["--host", str(address)]
    return args


def relay_log(state_dir: Path, record: MasterRecord) -> Path:
    return state_dir / "external" / f"master{record.index}-relay.log"


def relay_needle(state: ClusterState, address: IPv4Address) -> str:
    return f"--netns {external_netns(state)} --host {address} "


def ensure_master_relays(state: ClusterState, state_dir: Path) -> list[str]:
    """Each master's address on the external host and its relay there (idempotent);
    the addresses, for the caller to say."""
    namespace = external_netns(state)
    prefix = IPv4Network(state.underlay_cidr).prefixlen
    out = []
    for record in state.masters:
        address = master_address(state, record)
        if address is None:
            continue
        with netlink(namespace) as ipr:
            index = ipr.link_lookup(ifname=uplink_name(state))[0]
            with contextlib.suppress(NetlinkError):  # EEXIST: already there
                ipr.addr("add", index=index, address=str(address), prefixlen=prefix)
        if record.relay is None or not record.relay.alive():
            argv = [sys.executable, "-m", "podnet.cluster.relay", "--netns", namespace]
            argv += ["--host", str(address), "--port", str(ADVERTISED_PORT)]
            argv += ["--target-port", str(record.port)]
            record.relay = spawn(argv, relay_log(state_dir, record), relay_needle(state, address))
            state.save(state_dir)
        _wait_listening(namespace, address, record, state_dir)
        out.append(f"{address}:{ADVERTISED_PORT}")
    return out


def _wait_listening(
    namespace: str, address: IPv4Address, record: MasterRecord, state_dir: Path
) -> None:
    deadline = time.monotonic() + 15
    while not _listens(namespace, address):
        if time.monotonic() > deadline or record.relay is None or not record.relay.alive():
            log = relay_log(state_dir, record)
            raise RuntimeError(f"the relay of master {record.index} did not start; see {log}")
        time.sleep(0.05)


def _listens(namespace: str, address: IPv4Address) -> bool:
    with netns.entered(namespace):
        sock = socket.socket()
    with sock:
        sock.settimeout(1)
        return sock.connect_ex((str(address), ADVERTISED_PORT)) == 0
