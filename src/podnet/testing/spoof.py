"""Hand-made Ethernet frames from inside a pod: what a pod does to forge its addresses.

``python -m podnet.testing.spoof IFNAME DST_MAC SRC_MAC SRC_IP DST_IP DPORT TOKEN`` sends,
on ``IFNAME`` of the namespace it runs in (an AF_PACKET socket, so any source MAC and IP),
``COPIES`` frames 0.1 s apart: Ethernet ``SRC_MAC -> DST_MAC``, IPv4 + UDP
``SRC_IP -> DST_IP:DPORT`` carrying ``TOKEN``. The receiving side is
``podnet.testing.vxlan``'s ``Receiver``. Sent with the pod's own addresses it is the
control: the same path, nothing forged.
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
from podnet.testing.vxlan import COPIES, ETH_P_IP, inner_ipv4_udp


@dataclass(frozen=True)
class Frame:
    """One frame to send from a pod's interface."""

    ifname: str
    dst_mac: str
    src_mac: str
    src: IPv4Address
    dst: IPv4Address
    dport: int
    token: str

    def argv(self) -> list[str]:
        values = [self.ifname, self.dst_mac, self.src_mac, self.src, self.dst, self.dport]
        return [sys.executable, "-m", __name__, *map(str, values), self.token]


def _mac(text: str) -> bytes:
    return bytes.fromhex(text.replace(":", ""))


def send(frame: Frame) -> None:
    """Send ``COPIES`` copies of ``frame`` from this namespace."""
    packet = inner_ipv4_udp(frame.src, frame.dst, frame.dport, frame.token.encode())
    data = _mac(frame.dst_mac) + _mac(frame.src_mac) + struct.pack("!H", ETH_P_IP) + packet
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as sock:
        sock.bind((frame.ifname, 0))
        for _ in range(COPIES):
            sock.send(data)
            time.sleep(0.1)


def inject(ns: str, frame: Frame) -> None:
    """Send ``frame`` from pod namespace ``ns``."""
    done = netns.run(ns, frame.argv(), timeout=30)
    assert done.returncode == 0, f"sending from {ns} failed: {done.stderr}"


def main(argv: Sequence[str]) -> int:
    """Send one frame (see the module docstring)."""
    if len(argv) != 7:
        print(__doc__, file=sys.stderr)
        return 2
    ifname, dst_mac, src_mac, src, dst, dport, token = argv
    send(Frame(ifname, dst_mac, src_mac, IPv4Address(src), IPv4Address(dst), int(dport), token))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
