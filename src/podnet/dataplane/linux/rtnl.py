"""Raw netlink for the pod hot path: fixed requests, encoded here, sent several per ``send``.

Why not pyroute2 here: its 0.9 synchronous API costs about 1 ms per request (an event
loop runs for each call) and about 1 ms more to encode a veth request; that was most of a
CNI ADD. The requests an attach or detach needs are few and fixed, so they are built with
``struct`` and sent as one batch per step; the kernel processes a batch in order within
the ``send`` call. Only what comes back is read: each request's ack (an errno) and, for a
link lookup, the link's index from the fixed ``ifinfomsg`` header. Dumps, node set-up and
resync stay on pyroute2 (``netlink.py``), where a millisecond does not matter.

A ``NetlinkBatch`` socket works in the namespace it was opened in, like any socket; it is
not thread-safe (one per worker thread).
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import struct
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Interface, IPv4Network
from pathlib import Path

from podnet import netns
from podnet.dataplane.interface import DataPlaneError

NETLINK_ROUTE = 0
NETLINK_NETFILTER = 12
NLMSG_ERROR = 2
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_ECHO = 0x8
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
NEW = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL

RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK, RTM_SETLINK = 16, 17, 18, 19
RTM_NEWADDR, RTM_NEWROUTE = 20, 24
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_MASTER = 1, 3, 4, 10
IFLA_LINKINFO, IFLA_IFALIAS, IFLA_NET_NS_FD = 18, 20, 28
IFLA_INFO_KIND, IFLA_INFO_DATA, VETH_INFO_PEER = 1, 2, 1
IFLA_INFO_SLAVE_KIND, IFLA_INFO_SLAVE_DATA, IFLA_BRPORT_MODE = 4, 5, 4
IFA_ADDRESS, IFA_LOCAL = 1, 2
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_TABLE = 1, 4, 5, 15
IFF_UP = 0x1
AF_UNSPEC, AF_INET = 0, 2
RT_TABLE_MAIN, RTPROT_STATIC, RT_SCOPE_UNIVERSE, RTN_UNICAST = 254, 4, 0, 1

_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, port id
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_IFADDR = struct.Struct("=BBBBI")  # ifaddrmsg: family, prefixlen, flags, scope, index
_RTMSG = struct.Struct("=BBBBBBBBI")  # rtmsg: family, dst/src len, tos, table, proto...
_ATTR = struct.Struct("=HH")
_ERRNO = struct.Struct("=i")
RECV_SIZE = 65536
TIMEOUT = 10.0
ABSENT = (errno.ENODEV, errno.ENOENT, errno.ESRCH)


class RequestFailed(DataPlaneError):
    """The kernel refused a request; ``code`` is the errno."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what}: {os.strerror(code)} (errno {code})")
        self.code = code


@dataclass(frozen=True)
class Request:
    """One netlink message: ``body`` is the family header and its attributes."""

    what: str  # for the error message, e.g. "creating veth pn1234 with eth0"
    type: int
    flags: int
    body: bytes
    tolerate: tuple[int, ...] = ()  # errnos that count as success

    @property
    def acked(self) -> bool:
        return bool(self.flags & NLM_F_ACK)


# --- encoding -------------------------------------------------------------------------


def _pad(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 4)


def attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    return _pad(_ATTR.pack(_ATTR.size + len(payload), kind) + payload)


def attr_str(kind: int, text: str) -> bytes:
    """A NUL-terminated string attribute."""
    return attr(kind, text.encode() + b"\0")


def attr_u32(kind: int, value: int) -> bytes:
    """A 32-bit attribute in host byte order."""
    return attr(kind, struct.pack("=I", value))


def nested(kind: int, *attrs: bytes) -> bytes:
    """An attribute holding ``attrs``."""
    return attr(kind, b"".join(attrs))


def mac_bytes(mac: str) -> bytes:
    """``0a:58:...`` as its six bytes."""
    return bytes.fromhex(mac.replace(":", ""))


def ifinfo(index: int = 0, up: bool = False) -> bytes:
    """An ``ifinfomsg``; ``up`` sets IFF_UP (in a create, the new link comes up)."""
    flag = IFF_UP if up else 0
    return _IFINFO.pack(AF_UNSPEC, 0, index, flag, flag)


@dataclass(frozen=True)
class PeerEnd:
    """The pod end of a veth being created: its name, namespace (an open fd) and MAC."""

    ifname: str
    netns_fd: int
    mac: str


def create_veth(host: str, master: int, mtu: int, peer: PeerEnd) -> Request:
    """A veth whose host end is up on ``master`` and whose peer is born in the pod
    namespace with its MAC and MTU: one request (moving a link later costs ~20 ms). The
    peer cannot come up in the same request (the kernel refuses: ENOTCONN)."""
    peer_header = ifinfo()
    peer_attrs = (
        attr_str(IFLA_IFNAME, peer.ifname)
        + attr_u32(IFLA_NET_NS_FD, peer.netns_fd)
        + attr(IFLA_ADDRESS, mac_bytes(peer.mac))
        + attr_u32(IFLA_MTU, mtu)
    )
    info = nested(
        IFLA_LINKINFO,
        attr_str(IFLA_INFO_KIND, "veth"),
        nested(IFLA_INFO_DATA, attr(VETH_INFO_PEER, peer_header + peer_attrs)),
    )
    body = ifinfo(up=True) + attr_str(IFLA_IFNAME, host) + attr_u32(IFLA_MTU, mtu)
    body += attr_u32(IFLA_MASTER, master) + info
    return Request(f"creating veth {host} with {peer.ifname}", RTM_NEWLINK, NEW, body)


def bridge_port_hairpin(name: str) -> Request:
    """Hairpin mode on bridge port ``name``: a frame may leave by the port it came in. A
    pod's packet to itself through a service is DNATed while bridged (br_netfilter) and
    must go back out of its own port."""
    mode = nested(IFLA_INFO_SLAVE_DATA, attr(IFLA_BRPORT_MODE, b"\x01"))
    info = nested(IFLA_LINKINFO, attr_str(IFLA_INFO_SLAVE_KIND, "bridge"), mode)
    body = ifinfo() + attr_str(IFLA_IFNAME, name) + info
    return Request(f"setting hairpin mode on {name}", RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, body)


def set_link(name: str, *, up: bool = False, alias: str | None = None) -> Request:
    """Bring link ``name`` up and/or set its ifalias (the kernel finds it by name)."""
    body = ifinfo(up=up) + attr_str(IFLA_IFNAME, name)
    if alias is not None:
        body += attr(IFLA_IFALIAS, alias.encode())
    return Request(f"setting link {name}", RTM_SETLINK, NLM_F_REQUEST | NLM_F_ACK, body)


def get_link(name: str) -> Request:
    """Look link ``name`` up (the answer carries its index); absent is not an error."""
    body = ifinfo() + attr_str(IFLA_IFNAME, name)
    return Request(f"reading link {name}", RTM_GETLINK, NLM_F_REQUEST | NLM_F_ACK, body, ABSENT)


def delete_link(name: str) -> Request:
    """Delete link ``name`` (a veth's peer goes with it); absent is not an error."""
    body = ifinfo() + attr_str(IFLA_IFNAME, name)
    return Request(f"deleting link {name}", RTM_DELLINK, NLM_F_REQUEST | NLM_F_ACK, body, ABSENT)


def add_address(index: int, address: IPv4Interface) -> Request:
    """Add ``address`` to link ``index`` (fine if present)."""
    body = _IFADDR.pack(AF_INET, address.network.prefixlen, 0, RT_SCOPE_UNIVERSE, index)
    body += attr(IFA_LOCAL, address.ip.packed) + attr(IFA_ADDRESS, address.ip.packed)
    return Request(f"adding {address}", RTM_NEWADDR, NEW, body, (errno.EEXIST,))


def add_route(dst: IPv4Network, gateway: IPv4Address, oif: int) -> Request:
    """A static route to ``dst`` via ``gateway`` on link ``oif`` (fine if present)."""
    header = (AF_INET, dst.prefixlen, 0, 0, RT_TABLE_MAIN, RTPROT_STATIC)
    body = _RTMSG.pack(*header, RT_SCOPE_UNIVERSE, RTN_UNICAST, 0)
    if dst.prefixlen:
        body += attr(RTA_DST, dst.network_address.packed)
    body += attr(RTA_GATEWAY, gateway.packed) + attr_u32(RTA_OIF, oif)
    body += attr_u32(RTA_TABLE, RT_TABLE_MAIN)
    what = f"adding pod route {dst} via {gateway}"
    return Request(what, RTM_NEWROUTE, NEW, body, (errno.EEXIST,))


def link_index(reply: bytes) -> int:
    """The index in a link message's ``ifinfomsg`` (the body after the netlink header)."""
    return int(_IFINFO.unpack_from(reply)[2])


# --- the socket -----------------------------------------------------------------------


@dataclass
class _Pending:
    request: Request
    error: int = 0
    answered: bool = False
    reply: bytes | None = None


class NetlinkBatch:
    """A raw netlink socket that sends a batch of requests at once and reads the acks."""

    def __init__(self, protocol: int = NETLINK_ROUTE, timeout: float = TIMEOUT) -> None:
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, protocol)
        except OSError as err:
            raise DataPlaneError(f"opening a netlink socket: {err}") from err
        sock.settimeout(timeout)
        sock.bind((0, 0))
        self._sock = sock
        self._seq = 0

    @classmethod
    @contextmanager
    def opened_in(cls, target: str | Path) -> Iterator[NetlinkBatch]:
        """An rtnetlink socket inside namespace ``target`` (entered only to open it)."""
        if not Path(target).exists():
            raise DataPlaneError(f"network namespace {target} does not exist")
        try:
            with netns.entered(target):
                batch = cls()
        except OSError as err:
            raise DataPlaneError(f"entering namespace {target}: {err}") from err
        try:
            yield batch
        finally:
            batch.close()

    def close(self) -> None:
        """Release the socket."""
        self._sock.close()

    def run(self, requests: Sequence[Request]) -> list[bytes | None]:
        """Send ``requests`` in one ``send``; wait for every ack. Returns each request's
        reply body (a lookup's answer), None where there is none or the errno was
        tolerated. ``RequestFailed`` for the first request that failed."""
        pending = self._send(requests)
        self._receive(pending)
        for item in pending.values():
            if item.error and item.error not in item.request.tolerate:
                raise RequestFailed(item.request.what, item.error)
        return [item.reply for item in pending.values()]

    def _send(self, requests: Sequence[Request]) -> dict[int, _Pending]:
        pending: dict[int, _Pending] = {}
        data = b""
        for request in requests:
            self._seq = (self._seq + 1) & 0xFFFFFFFF
            size = _HEADER.size + len(request.body)
            data += _HEADER.pack(size, request.type, request.flags, self._seq, 0) + request.body
            pending[self._seq] = _Pending(request, answered=not request.acked)
        try:
            self._sock.send(data)
        except OSError as err:
            raise DataPlaneError(f"{requests[0].what}: {err}") from err
        return pending

    def _receive(self, pending: dict[int, _Pending]) -> None:
        while not all(item.answered for item in pending.values()):
            try:
                data = self._sock.recv(RECV_SIZE)
            except OSError as err:  # includes the timeout
                what = next(i.request.what for i in pending.values() if not i.answered)
                raise DataPlaneError(f"{what}: no answer from the kernel: {err}") from err
            for seq, kind, body in _messages(data):
                _record(pending, seq, kind, body)


def _messages(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(seq, type, body) of each message in one datagram."""
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, kind, _, seq, _ = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size:
            return
        yield seq, kind, data[offset + _HEADER.size : offset + length]
        offset += (length + 3) & ~3


def _record(pending: dict[int, _Pending], seq: int, kind: int, body: bytes) -> None:
    """File one answer under its request. An unknown sequence number is a late answer to
    an exchange that timed out: ignored. (An nftables batch refused as a whole is
    answered under its first message, the batch begin: known.)"""
    item = pending.get(seq)
    if item is None:
        return
    if kind != NLMSG_ERROR:
        if item.reply is None:
            item.reply = body
        return
    code = -_ERRNO.unpack_from(body)[0]
    item.answered = True
    item.error = item.error or code
    if code:
        item.reply = None


class LinkDeletion:
    """Deleting one link, on a socket of its own, with an early answer.

    The kernel unlists and closes the link (and a veth's peer), takes it off its bridge
    and, asked with NLM_F_ECHO, reports the deletion within 1-2 ms; then, still inside
    the ``send`` call, it waits ~15-20 ms for an RCU barrier and for the last references
    before it acks. That wait frees memory only: the link is gone for everyone already.
    So ``send`` runs on a worker thread while ``gone`` (on the event loop) returns at the
    echo. Create it in the link's namespace. Its two users (the thread that sends, the
    coroutine that waits) each call ``done_with`` once; the last one closes the socket.
    """

    def __init__(self, name: str) -> None:
        self.request = delete_link(name)
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC)
        except OSError as err:
            raise DataPlaneError(f"opening a netlink socket: {err}") from err
        sock.bind((0, 0))
        sock.setblocking(False)  # a send to the kernel never waits for room; recv polls
        self._sock = sock
        self._users = 2
        self._users_lock = threading.Lock()
        size = _HEADER.size + len(self.request.body)
        flags = self.request.flags | NLM_F_ECHO
        self._data = _HEADER.pack(size, self.request.type, flags, 1, 0) + self.request.body

    def send(self) -> None:
        """Run the deletion (blocking: returns after the kernel's clean-up)."""
        try:
            self._sock.send(self._data)
        except OSError as err:
            raise DataPlaneError(f"{self.request.what}: {err}") from err

    async def gone(self) -> None:
        """Return once the link is deleted (or was absent); ``RequestFailed`` if the
        kernel refused."""
        loop = asyncio.get_running_loop()
        while True:
            data = await loop.sock_recv(self._sock, RECV_SIZE)
            for _, kind, body in _messages(data):
                if kind == RTM_DELLINK:
                    return
                if kind == NLMSG_ERROR:
                    code = -_ERRNO.unpack_from(body)[0]
                    if code and code not in self.request.tolerate:
                        raise RequestFailed(self.request.what, code)
                    return

    def done_with(self) -> None:
        """One user is finished with the socket; the last one closes it."""
        with self._users_lock:
            self._users -= 1
            last = self._users == 0
        if last:
            self._sock.close()
