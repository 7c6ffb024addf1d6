"""Underlay injection for tests: a host on the underlay sends VXLAN whose *outer* source is
forged, written frame by frame on a packet socket (no address or route changes on the
attacker, so its ARP and the switch's view of it stay as they are).

``python -m podnet.testing.underlayforge IFACE SRC_MAC DST_MAC OUTER_SRC TO PORT VNI
INNER_DST_MAC SRC DST DPORT TOKEN`` sends, from interface ``IFACE`` of the namespace it
runs in, Ethernet ``SRC_MAC -> DST_MAC`` carrying IPv4 ``OUTER_SRC -> TO`` UDP ``PORT``
with the VXLAN frame of ``podnet.testing.vxlan`` inside (``COPIES`` copies, 0.1 s apart).
Forge ``OUTER_SRC`` alone (``SRC_MAC`` the attacker's own) or both it and ``SRC_MAC``.
"""

from __future__ import annotations

import socket
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address

from podnet import netns
from podnet.testing.vxlan import (
    COPIES,
    ETH_P_IP,
    INNER_SOURCE_PORT,
    Forgery,
    checksum,
    inner_ipv4_udp,
    vxlan_frame,
)


@dataclass(frozen=True)
class Spoof:
    """A ``Forgery`` sent as a whole Ethernet frame: the outer addresses are chosen."""

    iface: str  # the attacker's interface on the underlay
    src_mac: str  # outer Ethernet source (the attacker's own, or a peer's: forged)
    dst_mac: str  # outer Ethernet destination (the target node's underlay MAC)
    outer_src: IPv4Address  # outer IPv4 source (a peer node's address: forged)
    forgery: Forgery

    def argv(self) -> list[str]:
        """The command that sends it (run it inside the attacker's namespace)."""
        f = self.forgery
        values = (self.iface, self.src_mac, self.dst_mac, self.outer_src, f.to, f.port, f.vni)
        inner = (f.dst_mac, f.src, f.dst, f.dport, f.token)
        return [sys.executable, "-m", __name__, *map(str, values), *map(str, inner)]


def frame(spoof: Spoof) -> bytes:
    """The whole Ethernet frame: outer IPv4/UDP (checksum 0, as VTEPs send) and VXLAN."""
    f = spoof.forgery
    packet = inner_ipv4_udp(f.src, f.dst, f.dport, f.token.encode())
    payload = vxlan_frame(f.vni, f.dst_mac, packet)
    udp = struct.pack("!HHHH", INNER_SOURCE_PORT, f.port, 8 + len(payload), 0) + payload
    source, to = spoof.outer_src.packed, f.to.packed
    head = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 2, 0, 64, 17, 0, source, to)
    head = head[:10] + struct.pack("!H", checksum(head)) + head[12:]
    macs = _mac(spoof.dst_mac) + _mac(spoof.src_mac)
    return macs + struct.pack("!H", ETH_P_IP) + head + udp


def _mac(text: str) -> bytes:
    return bytes.fromhex(text.replace(":", ""))


def send(spoof: Spoof) -> None:
    """Write ``COPIES`` copies of the frame on ``spoof.iface`` of this namespace."""
    data = frame(spoof)
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as sock:
        sock.bind((spoof.iface, 0))
        for _ in range(COPIES):
            sock.send(data)
            time.sleep(0.1)


ETH_P_ARP = 0x0806


def arp_reply(src_mac: str, dst_mac: str, sender: IPv4Address, target: IPv4Address) -> bytes:
    """An Ethernet frame with an ARP reply "``sender`` is at ``src_mac``" to ``target``."""
    arp = struct.pack("!HHBBH", 1, ETH_P_IP, 6, 4, 2)
    arp += _mac(src_mac) + sender.packed + _mac(dst_mac) + target.packed
    return _mac(dst_mac) + _mac(src_mac) + struct.pack("!H", ETH_P_ARP) + arp


def write_frames(ns: str, iface: str, data: bytes, copies: int = COPIES) -> None:
    """Write ``data`` on ``iface`` of namespace ``ns`` ``copies`` times, 0.1 s apart."""
    with netns.entered(ns):
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    with sock:
        sock.bind((iface, 0))
        for _ in range(copies):
            sock.send(data)
            time.sleep(0.1)


def inject(ns: str, spoof: Spoof) -> None:
    """Send ``spoof`` from namespace ``ns`` (a host on the underlay)."""
    done = netns.run(ns, spoof.argv(), timeout=30)
    assert done.returncode == 0, f"sending from {ns} failed: {done.stderr}"


def main(argv: Sequence[str]) -> int:
    """Send one spoofed frame (see the module docstring)."""
    if len(argv) != 12:
        print(__doc__, file=sys.stderr)
        return 2
    iface, src_mac, dst_mac, outer_src, to, port, vni, inner_mac, src, dst, dport, token = argv
    forgery = Forgery(
        IPv4Address(to),
        int(port),
        int(vni),
        inner_mac,
        IPv4Address(src),
        IPv4Address(dst),
        int(dport),
        token,
    )
    send(Spoof(iface, src_mac, dst_mac, IPv4Address(outer_src), forgery))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
