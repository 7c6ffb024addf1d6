"""Hand-made VXLAN frames for tunnel-safety tests: inject one, and watch for its inner packet.

``python -m podnet.testing.vxlan send TO PORT VNI DST_MAC SRC_IP DST_IP DPORT TOKEN`` sends,
from whatever namespace it runs in, a UDP datagram to ``TO:PORT`` whose payload is a
VXLAN header (``VNI``) and an inner Ethernet + IPv4 + UDP packet ``SRC_IP -> DST_IP:DPORT``
carrying ``TOKEN``: what an attacker does to forge a source address past anti-spoofing.
It sends ``COPIES`` copies, 0.1 s apart (bounded).

``python -m podnet.testing.vxlan receive PORT SECONDS STOP`` binds UDP ``PORT``, prints
``ready``, then one line ``<source ip> <payload>`` per datagram, and exits when a payload
equals ``STOP`` or after ``SECONDS``.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address

from podnet import netns

COPIES = 3
VXLAN_FLAGS = 0x08  # "I": the VNI is valid
ETH_P_IP = 0x0800
INNER_SOURCE_PORT = 40000


def checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of ``data``."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def inner_ipv4_udp(src: IPv4Address, dst: IPv4Address, dport: int, payload: bytes) -> bytes:
    """An IPv4 + UDP packet (UDP checksum 0, which IPv4 allows)."""
    udp = struct.pack("!HHHH", INNER_SOURCE_PORT, dport, 8 + len(payload), 0) + payload
    head = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0, src.packed, dst.packed
    )
    head = head[:10] + struct.pack("!H", checksum(head)) + head[12:]
    return head + udp


def vxlan_frame(vni: int, dst_mac: str, packet: bytes, src_mac: str = "0e:00:00:00:00:01") -> bytes:
    """The UDP payload of a VXLAN packet: header (RFC 7348) and an inner Ethernet frame."""
    header = struct.pack("!B3xI", VXLAN_FLAGS, vni << 8)
    macs = bytes.fromhex(dst_mac.replace(":", "")) + bytes.fromhex(src_mac.replace(":", ""))
    return header + macs + struct.pack("!H", ETH_P_IP) + packet


@dataclass(frozen=True)
class Forgery:
    """One injected frame: where the outer datagram goes and what the inner packet says."""

    to: IPv4Address  # outer destination (a node's VTEP address)
    port: int  # outer UDP port (the tunnel's)
    vni: int
    dst_mac: str  # the inner frame's destination (the receiving node's vxlan0 MAC)
    src: IPv4Address  # forged inner source
    dst: IPv4Address  # inner destination (the target pod)
    dport: int  # inner UDP port (the target's receiver)
    token: str

    def argv(self) -> list[str]:
        """The command that sends it (run it inside the attacker's namespace)."""
        values = (self.to, self.port, self.vni, self.dst_mac, self.src, self.dst, self.dport)
        return [sys.executable, "-m", __name__, "send", *map(str, values), self.token]


SO_NO_CHECK = 11  # linux/socket.h; the socket module does not export it


def send(forgery: Forgery) -> None:
    """Send ``COPIES`` copies of the frame from this namespace."""
    packet = inner_ipv4_udp(forgery.src, forgery.dst, forgery.dport, forgery.token.encode())
    frame = vxlan_frame(forgery.vni, forgery.dst_mac, packet)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        # UDP checksum 0, as real VTEPs send (kernel vxlan, OVS): a checksum left to a
        # veth's offload arrives unfinished, and OVS's userspace tunnel drops such frames.
        sock.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
        for _ in range(COPIES):
            # An ICMP error from an earlier copy can fail a send: refused anyway.
            with contextlib.suppress(OSError):
                sock.sendto(frame, (str(forgery.to), forgery.port))
            time.sleep(0.1)


def receive(port: int, seconds: float, stop: str) -> None:
    """Print ``ready``, then ``<source> <payload>`` per datagram until ``stop`` (a payload,
    or ``from:<address>``: a datagram from that source) or timeout."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("0.0.0.0", port))
        print("ready", flush=True)
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([sock], [], [], left)[0]:
                break
            data, peer = sock.recvfrom(2048)
            text = data.decode(errors="replace")
            print(f"{peer[0]} {text if text.isprintable() else data.hex()}", flush=True)
            if text == stop or stop == f"from:{peer[0]}":
                break


class Receiver:
    """A ``receive`` process in namespace ``ns``; ``lines()`` waits for it to end."""

    def __init__(self, ns: str, port: int, stop: str, seconds: float = 20.0) -> None:
        argv = [sys.executable, "-m", __name__, "receive", str(port), str(seconds), stop]
        self.seconds = seconds
        self.process = subprocess.Popen(
            netns.command(ns, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], 15)
        first = self.process.stdout.readline() if ready else ""
        if first.strip() != "ready":
            self.process.kill()
            self.process.wait(timeout=5)
            raise AssertionError(f"receiver in {ns} did not start: {first!r}")

    def lines(self) -> list[str]:
        """Every datagram seen (``<source> <payload>``), once the receiver has ended."""
        try:
            out, _ = self.process.communicate(timeout=self.seconds + 10)
        finally:
            self.process.kill()  # a no-op once it has exited
        return [line for line in out.splitlines() if line.strip()]


def inject(ns: str, forgery: Forgery) -> None:
    """Send ``forgery`` from namespace ``ns`` (a pod, a node or the outside host)."""
    done = netns.run(ns, forgery.argv(), timeout=30)
    assert done.returncode == 0, f"sending from {ns} failed: {done.stderr}"


def main(argv: Sequence[str]) -> int:
    """``send ...`` or ``receive ...`` (see the module docstring)."""
    if argv and argv[0] == "send" and len(argv) == 9:
        to, port, vni, mac, src, dst, dport, token = argv[1:]
        values = (IPv4Address(to), int(port), int(vni), mac, IPv4Address(src))
        send(Forgery(*values, IPv4Address(dst), int(dport), token))
        return 0
    if argv and argv[0] == "receive" and len(argv) == 4:
        receive(int(argv[1]), float(argv[2]), argv[3])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
