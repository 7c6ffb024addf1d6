"""The apps domain's DNS: ``*.<apps domain>`` names the router's address.

OpenShift asks for a wildcard DNS record, ``*.apps.<cluster domain>``, in the network
outside the cluster, pointing at the node(s) running the router; route hosts under it then
resolve for every client. The local cluster plays that outside network with the external
host (``pn-<id>-ext``), so the record is served there: this resolver listens on the
external host's loopback only (``127.0.0.1:53`` inside its namespace, UDP), and the
namespace's ``/etc/netns/<ext>/resolv.conf`` names it (``ip netns exec`` binds that file
over ``/etc/resolv.conf``).

It answers only names under the apps domain: an A record with the router's address for
any name below it (case-insensitive, TTL ``TTL``), an empty answer for other types, and
REFUSED for every other name (it is no recursive resolver). Queries it cannot parse are
dropped.

    python -m podnet.cluster.appsdns --domain apps.podnet.test --address 192.168.100.11
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
from collections.abc import Sequence
from ipaddress import IPv4Address
from types import FrameType

from dnslib import QTYPE, RCODE, RR, A, DNSError, DNSRecord

DEFAULT_DOMAIN = "apps.podnet.test"
TTL = 30
MAX_QUERY = 512


def normalized(name: str) -> str:
    """A DNS name lower-cased, without its trailing dot."""
    return name.rstrip(".").lower()


def under(name: str, domain: str) -> bool:
    """Whether ``name`` is strictly below ``domain``."""
    return normalized(name).endswith("." + normalized(domain))


def answer(query: bytes, domain: str, address: IPv4Address) -> bytes | None:
    """The answer to one query's bytes, or None for bytes that are no DNS query."""
    try:
        request = DNSRecord.parse(query)
    except (DNSError, ValueError, IndexError):
        return None
    if request.header.qr or not request.questions:
        return None
    reply = request.reply(ra=0)
    question = request.q
    name = str(question.qname)
    if not under(name, domain):
        reply.header.rcode = RCODE.REFUSED
        reply.header.aa = 0
    elif question.qtype in (QTYPE.A, QTYPE.ANY):
        reply.add_answer(RR(question.qname, QTYPE.A, rdata=A(str(address)), ttl=TTL))
    return bytes(reply.pack())


def serve(sock: socket.socket, domain: str, address: IPv4Address) -> None:
    """Answer datagrams on ``sock`` until SIGTERM or SIGINT."""
    running = [True]

    def _stop(_sig: int, _frame: FrameType | None) -> None:
        running[0] = False
        sock.close()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    while running[0]:
        try:
            query, peer = sock.recvfrom(MAX_QUERY)
        except OSError:
            break
        reply = answer(query, domain, address)
        if reply is not None:
            sock.sendto(reply, peer)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: bind and serve."""
    parser = argparse.ArgumentParser(prog="python -m podnet.cluster.appsdns")
    parser.add_argument("--domain", default=DEFAULT_DOMAIN)
    parser.add_argument("--address", type=IPv4Address, required=True, help="the router's")
    parser.add_argument("--listen", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=53)
    args = parser.parse_args(argv)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((args.listen, args.port))
    print(f"appsdns: *.{args.domain} -> {args.address} on {args.listen}:{args.port}", flush=True)
    serve(sock, args.domain, args.address)
    return 0


if __name__ == "__main__":
    sys.exit(main())
