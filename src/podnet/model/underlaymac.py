"""A node's underlay MAC: the annotation a node publishes about itself, and what a usable
value is (pure).

A node writes ``podnet.io/underlay-mac`` on its own Node (NodeRestriction lets a node
write only its own Node, and only a usable MAC here); the HostSubnet controller copies a
usable value to the node's HostSubnet, where the other nodes' agents read it and check
the Ethernet source of that node's VXLAN against it (``podnet.dataplane.vteppeers``).
OVN-Kubernetes publishes its nodes' gateway MACs the same way, as Node annotations.
"""

from __future__ import annotations

import re

UNDERLAY_MAC_ANNOTATION = "podnet.io/underlay-mac"
_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")


def mac_problem(text: object) -> str | None:
    """Why ``text`` is not a usable underlay MAC (None if it is): six lower-case hex
    pairs with colons, unicast, not all zeros."""
    if not isinstance(text, str) or not _MAC.fullmatch(text):
        return f"{text!r} is not a MAC address (six lower-case hex pairs with colons)"
    if int(text[:2], 16) & 1:
        return f"{text} is a multicast MAC address"
    if text == "00:00:00:00:00:00":
        return f"{text} is the zero MAC address"
    return None


def normal_mac(text: object) -> str | None:
    """``text`` lower-cased if it is a usable underlay MAC, else None."""
    if not isinstance(text, str):
        return None
    lowered = text.strip().lower()
    return lowered if mac_problem(lowered) is None else None


def annotated_mac(obj: object) -> str | None:
    """The usable underlay MAC an object's annotation holds, or None."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    notes = meta.get("annotations") if isinstance(meta, dict) else None
    return normal_mac(notes.get(UNDERLAY_MAC_ANNOTATION)) if isinstance(notes, dict) else None
