"""Set and map element changes as one nf_tables netlink batch, without libnftables.

libnftables (nft 1.0.6) fetches every chain of the table before it deletes an element:
at 5,000 service chains that is ~0.5 MB of netlink and 7-15 ms a change, most of an
endpoint change's cost. An endpoint change is only elements of the ``endpoints`` map and
the ``endpoint_digests`` set (``servicescript``), whose key and data types are fixed, so
its batch is built here directly: one transaction (BATCH_BEGIN ... BATCH_END), every
message acknowledged, any error failing the whole batch as nft's would.

``element_batch`` turns the element lines of an nft script into the batch (None when a
line is not one this module encodes: the script then goes to libnftables). Values are
laid out as nft lays out concatenations: each field in 4-byte registers, addresses and
ports in network order, marks in host order.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
from collections.abc import Callable

from podnet.dataplane.interface import DataPlaneError
from podnet.dataplane.linux import nftables

NETLINK_NETFILTER = 12
NFNL_SUBSYS_NFTABLES = 10
BATCH_BEGIN, BATCH_END = 0x10, 0x11
NEWSETELEM, DELSETELEM = 12, 14
NLM_F_REQUEST, NLM_F_ACK, NLM_F_CREATE = 0x1, 0x4, 0x400
NLMSG_ERROR = 2
NLA_F_NESTED = 0x8000
LIST_TABLE, LIST_SET, LIST_ELEMENTS, LIST_ELEM = 1, 2, 3, 1
ELEM_KEY, ELEM_DATA, DATA_VALUE = 1, 2, 1
PROTOCOLS = {"tcp": socket.IPPROTO_TCP, "udp": socket.IPPROTO_UDP, "sctp": 132}
MAX_ELEMENTS = 512  # a larger change (a resync's repair) goes through libnftables


def _address(text: str) -> bytes:
    return ipaddress.IPv4Address(text).packed


def _protocol(text: str) -> bytes:
    return struct.pack("B3x", PROTOCOLS[text])


def _port(text: str) -> bytes:
    return struct.pack("!H2x", int(text))


def _mark(text: str) -> bytes:
    return struct.pack("=I", int(text, 16))


FIELDS: dict[str, Callable[[str], bytes]] = {
    "ipv4_addr": _address,
    "inet_proto": _protocol,
    "inet_service": _port,
    "mark": _mark,
}


def encoder(type_text: str) -> Callable[[str], tuple[bytes, bytes | None]] | None:
    """For a set or map type as nft prints it (``ipv4_addr . mark : ipv4_addr .
    inet_service``), a function from an element's text to its key and data bytes; None
    for a type with a field this module does not know (a verdict, an interval)."""
    key_type, _, data_type = type_text.partition(" : ")
    key_fields = key_type.split(" . ")
    data_fields = data_type.split(" . ") if data_type else []
    if not set(key_fields + data_fields) <= FIELDS.keys():
        return None

    def encode(element: str) -> tuple[bytes, bytes | None]:
        key_text, _, data_text = element.partition(" : ")
        key = _values(key_fields, key_text)
        return key, _values(data_fields, data_text) if data_fields and data_text else None

    return encode


def _values(fields: list[str], text: str) -> bytes:
    parts = text.split(" . ")
    if len(parts) != len(fields):
        raise ValueError(f"{text!r} does not have the fields {' . '.join(fields)}")
    return b"".join(FIELDS[f](part) for f, part in zip(fields, parts, strict=True))


def element_batch(
    script: str, table: str, types: dict[str, str]
) -> list[tuple[int, str, list[tuple[bytes, bytes | None]]]] | None:
    """(message type, set, elements) for each line of ``script`` when every line adds or
    deletes elements of a set of ``table`` (``ip <name>``) whose type, from ``types`` (set
    name: type; plain sets and maps only, no intervals), this module encodes; else None."""
    found = []
    count = 0
    for line in script.splitlines():
        words = line.split(" ", 5)
        if len(words) < 6 or words[1] != "element" or " ".join(words[2:4]) != table:
            return None
        verb, name, body = words[0], words[4], words[5]
        encode = encoder(types.get(name, ""))
        if encode is None or verb not in ("add", "delete") or not body.startswith("{ "):
            return None
        try:
            elements = [encode(e.strip()) for e in body[2:-2].split(",")]
        except (ValueError, KeyError):
            return None  # not a value this module lays out (nft will say what is wrong)
        count += len(elements)
        found.append((NEWSETELEM if verb == "add" else DELSETELEM, name, elements))
    return found if 0 < count <= MAX_ELEMENTS else None


def _attr(kind: int, payload: bytes) -> bytes:
    size = 4 + len(payload)
    return struct.pack("=HH", size, kind) + payload + b"\0" * (-size % 4)


def _message(kind: int, flags: int, seq: int, family: int, res_id: int, body: bytes) -> bytes:
    head = struct.pack("=IHHII", 16 + 4 + len(body), kind, flags, seq, 0)
    return head + struct.pack("!BBH", family, 0, res_id) + body


def _elements_message(
    verb: int, seq: int, table: str, name: str, elements: list[tuple[bytes, bytes | None]]
) -> bytes:
    listed = b""
    for key, data in elements:
        inner = _attr(ELEM_KEY | NLA_F_NESTED, _attr(DATA_VALUE, key))
        if data is not None and verb == NEWSETELEM:
            inner += _attr(ELEM_DATA | NLA_F_NESTED, _attr(DATA_VALUE, data))
        listed += _attr(LIST_ELEM | NLA_F_NESTED, inner)
    body = (
        _attr(LIST_TABLE, table.encode() + b"\0")
        + _attr(LIST_SET, name.encode() + b"\0")
        + _attr(LIST_ELEMENTS | NLA_F_NESTED, listed)
    )
    flags = NLM_F_REQUEST | NLM_F_ACK | (NLM_F_CREATE if verb == NEWSETELEM else 0)
    kind = (NFNL_SUBSYS_NFTABLES << 8) | verb
    return _message(kind, flags, seq, socket.AF_INET, 0, body)


class ElementBatches:
    """A netfilter netlink socket (made on the node thread: it takes the thread's
    network namespace) that runs element batches as one transaction each."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self._sock.bind((0, 0))
        self._sock.settimeout(nftables.TIMEOUT)
        self._seq = 0

    def run(
        self, table: str, batch: list[tuple[int, str, list[tuple[bytes, bytes | None]]]]
    ) -> None:
        """Send ``batch`` (from ``element_batch``) for ``table`` (its name) and wait for
        every message's answer; an error raises as nft's would (the batch is void)."""
        first = self._seq + 1
        messages = [_message(BATCH_BEGIN, NLM_F_REQUEST, first, 0, NFNL_SUBSYS_NFTABLES, b"")]
        for offset, (verb, name, elements) in enumerate(batch, start=1):
            messages.append(_elements_message(verb, first + offset, table, name, elements))
        last = first + len(batch) + 1
        messages.append(_message(BATCH_END, NLM_F_REQUEST, last, 0, NFNL_SUBSYS_NFTABLES, b""))
        self._seq = last
        try:
            self._sock.sendall(b"".join(messages))
            failures = self._answers(set(range(first + 1, last)))
        except OSError as err:
            raise DataPlaneError(f"element batch failed to run: {err}") from err
        if failures:
            raise nftables.nft_error(f"element batch failed: Error: {'; '.join(failures)}")

    def _answers(self, waiting: set[int]) -> list[str]:
        """Read one answer per message in ``waiting`` (sequence numbers); the errors."""
        failures = []
        while waiting:
            data = self._sock.recv(65536)
            while len(data) >= 16:
                size, kind, _, seq, _ = struct.unpack_from("=IHHII", data)
                if kind == NLMSG_ERROR and seq in waiting:
                    (code,) = struct.unpack_from("=i", data, 16)
                    waiting.discard(seq)
                    if code:
                        failures.append(f"{os.strerror(-code)} ({errno.errorcode.get(-code)})")
                data = data[(size + 3) & ~3 :] if size else b""
        return failures

    def close(self) -> None:
        """Close the socket."""
        self._sock.close()
