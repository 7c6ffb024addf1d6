"""Port ranges as OpenFlow bitwise matches: a range is a few aligned prefix blocks.

OpenFlow matches ``tp_dst`` only as ``value/mask``, so a NetworkPolicy range such as
80-1023 becomes the smallest list of aligned blocks covering exactly that range
(``80/0xfff0``, ``96/0xffe0``, ...): at most 2 x 16 - 2 = 30 blocks for any range,
usually a handful.
"""

from __future__ import annotations

from podnet.policy.model import PortRange

PORT_BITS = 16
FULL_MASK = (1 << PORT_BITS) - 1


def port_blocks(first: int, last: int) -> list[tuple[int, int]]:
    """The aligned (value, mask) blocks covering ``first``..``last`` inclusive, in order."""
    if not 0 <= first <= last <= FULL_MASK:
        raise ValueError(f"bad port range {first}-{last}")
    blocks = []
    start = first
    while start <= last:
        size = start & -start if start else 1 << PORT_BITS  # the largest aligned block here
        while start + size - 1 > last:
            size >>= 1
        blocks.append((start, FULL_MASK & ~(size - 1)))
        start += size
    return blocks


def port_matches(span: PortRange) -> list[str]:
    """``ovs-ofctl`` match texts for a ``PortRange``: ``tcp`` (every port),
    ``tcp,tp_dst=80`` or ``tcp,tp_dst=0x50/0xfff0``."""
    protocol = span.protocol.lower()
    if span.is_every_port():
        return [protocol]
    found = []
    for value, mask in port_blocks(span.first, span.last):
        if mask == FULL_MASK:
            found.append(f"{protocol},tp_dst={value}")
        else:
            found.append(f"{protocol},tp_dst={value:#x}/{mask:#x}")
    return found
