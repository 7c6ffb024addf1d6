"""One OpenFlow flow as a value, its ``ovs-ofctl`` text, and cookies that name its object.

Every flow belongs to one object (the node's own set-up, a remote node, a pod, a policy,
the version note), named by its cookie: the high byte says the kind, the rest is a digest
of the object's key. A change to one object is then one bundle of
``delete cookie=C/-1`` plus the object's new flows, and nothing else moves.

The text is what ``ovs-ofctl -O OpenFlow13 add-flows`` reads: ports by number, never by
name (``diff-flows`` cannot resolve names).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import IntEnum

COOKIE_MASK = "-1"  # a cookie match on every bit: ``cookie=0x.../-1``


class Kind(IntEnum):
    """What an object's flows are for; the cookie's high byte."""

    NODE = 0x01  # the node's own pipeline: classification, routing, defaults
    REMOTE_NODE = 0x02  # one other node: tunnel source check and routes
    POD = 0x03  # one local pod: anti-spoofing, ARP, delivery, its VNID
    ISOLATION = 0x04  # multitenant: one VNID's rules
    POLICY = 0x05  # networkpolicy: one conjunction (rules sharing peers and ports)
    POLICY_POD = 0x06  # networkpolicy: one pod's isolation state
    POLICY_MATCH = 0x07  # networkpolicy: one shared match (a peer, a port block)
    NOTE = 0x7F  # the version note, written last


def cookie(kind: Kind, key: str) -> int:
    """The cookie of object ``key`` of ``kind``: the kind, then 56 bits of a digest."""
    digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:7], "big")
    return (int(kind) << 56) | digest


def kind_of(value: int) -> Kind:
    """The kind a cookie was made for."""
    return Kind(value >> 56)


@dataclass(frozen=True, order=True)
class Flow:
    """``table``, ``priority``, a match and actions in ``ovs-ofctl`` syntax, and a cookie.

    ``match`` is comma-separated fields (``ip,in_port=3,nw_src=10.128.0.5``), empty to
    match everything; ``actions`` is the action list (``goto_table:30``, ``drop``).
    """

    table: int
    priority: int
    match: str
    actions: str
    cookie: int = 0

    def text(self) -> str:
        """The flow as one ``add-flows`` line."""
        fields = [f"cookie={self.cookie:#x}", f"table={self.table}", f"priority={self.priority}"]
        if self.match:
            fields.append(self.match)
        return ",".join(fields) + f" actions={self.actions}"


def flows_text(flows: list[Flow]) -> str:
    """Lines for ``ovs-ofctl add-flows``/``replace-flows``, in a stable order."""
    return "".join(flow.text() + "\n" for flow in sorted(flows))
