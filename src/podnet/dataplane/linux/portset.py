"""The anti-spoofing set ``bridge podnet pod_ports``, changed over raw nfnetlink.

One nftables transaction (a batch: begin, the element change, end) per call and no
``nft`` process, so an attach or detach pays well under a millisecond for it. The request
is fixed, so it is encoded here (``rtnl`` explains why not pyroute2); the unit tests
check it against pyroute2's encoding of the same message.
"""

from __future__ import annotations

import errno
import struct
from collections.abc import Iterable

from podnet.dataplane.linux.desired import NFT_TABLE, POD_PORTS_SET, PodPort
from podnet.dataplane.linux.nftables import element_key
from podnet.dataplane.linux.rtnl import (
    NETLINK_NETFILTER,
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_REQUEST,
    NetlinkBatch,
    Request,
    RequestFailed,
    attr,
    attr_str,
    nested,
)

NFPROTO_BRIDGE = 7
NFNL_SUBSYS_NFTABLES = 10
NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END = 0x10, 0x11
NFT_MSG_NEWSETELEM, NFT_MSG_DELSETELEM = 12, 14
NFTA_SET_ELEM_LIST_TABLE, NFTA_SET_ELEM_LIST_SET, NFTA_SET_ELEM_LIST_ELEMENTS = 1, 2, 3
NFTA_LIST_ELEM, NFTA_SET_ELEM_KEY, NFTA_DATA_VALUE = 1, 1, 1
_NFGENMSG = struct.Struct("!BBH")  # family, version, resource id (big endian)


def nfgenmsg(family: int, resource: int = 0) -> bytes:
    """The nfnetlink header: address family and, in batch markers, the subsystem."""
    return _NFGENMSG.pack(family, 0, resource)


def element_change(command: str, ports: Iterable[PodPort]) -> Request:
    """Add (``"add"``: present ones are fine) or delete (``"del"``) ``pod_ports``
    elements, as one message."""
    chosen = sorted(set(ports))
    elements = b"".join(
        nested(NFTA_LIST_ELEM, nested(NFTA_SET_ELEM_KEY, attr(NFTA_DATA_VALUE, element_key(p))))
        for p in chosen
    )
    body = nfgenmsg(NFPROTO_BRIDGE)
    body += attr_str(NFTA_SET_ELEM_LIST_TABLE, NFT_TABLE)
    body += attr_str(NFTA_SET_ELEM_LIST_SET, POD_PORTS_SET)
    body += attr(NFTA_SET_ELEM_LIST_ELEMENTS, elements)
    adding = command == "add"
    kind = NFT_MSG_NEWSETELEM if adding else NFT_MSG_DELSETELEM
    flags = NLM_F_REQUEST | NLM_F_ACK | (NLM_F_CREATE if adding else 0)
    what = f"{command} {POD_PORTS_SET} elements {[p.element() for p in chosen]}"
    return Request(what, (NFNL_SUBSYS_NFTABLES << 8) | kind, flags, body)


def transaction(change: Request) -> list[Request]:
    """``change`` wrapped in batch begin/end: one nftables transaction."""
    marker = nfgenmsg(0, NFNL_SUBSYS_NFTABLES)
    begin = Request("starting an nftables batch", NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, marker)
    end = Request("ending an nftables batch", NFNL_MSG_BATCH_END, NLM_F_REQUEST, marker)
    return [begin, change, end]


class PodPortSet:
    """The ``pod_ports`` set of this namespace. Open it in the node namespace; use it
    from one thread."""

    def __init__(self) -> None:
        self._socket = NetlinkBatch(NETLINK_NETFILTER)

    def add(self, ports: Iterable[PodPort]) -> None:
        """Add elements (present ones are fine)."""
        self._send("add", ports)

    def delete(self, ports: Iterable[PodPort]) -> bool:
        """Delete elements; False (nothing deleted) if one of them was not there."""
        try:
            self._send("del", ports)
        except RequestFailed as err:
            if err.code == errno.ENOENT:
                return False
            raise
        return True

    def close(self) -> None:
        """Release the socket."""
        self._socket.close()

    def _send(self, command: str, ports: Iterable[PodPort]) -> None:
        chosen = list(ports)
        if chosen:
            self._socket.run(transaction(element_change(command, chosen)))
