"""br0's OpenFlow tables, registers and fixed ports: OpenShift SDN's layout and roles.

A packet enters at ``CLASSIFY`` and is sorted by where it came from: the tunnel
(``VXLAN_IN``: the sender must be a known node; its VNID comes from ``tun_id``), a pod
(``POD_IN``: per-pod anti-spoofing of MAC and IP, the pod's VNID loaded into
``REG_SRC_VNID``) or the host through ``tun0`` (``HOST_IN``: a local pod's packet back from
a service's DNAT on the host passes ``EGRESS_POLICY`` again, its destination now the
endpoint). ``EGRESS_POLICY`` judges pods isolated for egress (NetworkPolicy, with
conntrack). ``ROUTE`` then sorts by destination: ARP (``ARP_LOCAL``/``ARP_REMOTE``), the
service network (``SERVICE``: to ``tun0``, where the host's nftables service proxy applies),
a local pod (``LOCAL``: its VNID into ``REG_DST_VNID`` and its port into ``REG_OUT_PORT``,
then ``ISOLATION``), another node's subnet (``REMOTE``: ``vxlan0`` with the VNID in
``tun_id``), or anything else (``EGRESS``: ``tun0``, where the host masquerades). ``NOTE``
holds the version note, written last.
"""

from __future__ import annotations

from typing import Final

CLASSIFY: Final = 0
VXLAN_IN: Final = 10
POD_IN: Final = 20
EGRESS_POLICY: Final = 21
HOST_IN: Final = 25
ROUTE: Final = 30
ARP_LOCAL: Final = 40
ARP_REMOTE: Final = 50
SERVICE: Final = 60
LOCAL: Final = 70
ISOLATION: Final = 80
REMOTE: Final = 90
EGRESS: Final = 100
NOTE: Final = 253

REG_SRC_VNID: Final = "reg0"  # the sender's VNID (0: global, the host, the outside)
REG_DST_VNID: Final = "reg1"  # the local destination pod's VNID
REG_OUT_PORT: Final = "reg2"  # the local destination pod's ofport
UNASSIGNED_VNID: Final = 1  # reg0/reg1 of a pod whose project has no VNID yet: it meets
# only VNID 0 (two unassigned pods do not meet each other). One of the reserved 1-9 that
# the master never allocates (projects get 10 to 2^24-1), and within VXLAN's 24-bit VNI,
# so it crosses to another node as itself, never as some project's VNID.

# Conntrack (zone 0, shared with the policy tables): CLASSIFY tracks every IP packet
# first (``ct(table=0)``), so tables 21 and 80 see ``+trk`` already. A connection a pod
# opened through the host (a service: DNATed by the host's nftables, it comes back from
# tun0 with the pod's address) is committed with ``CT_MARK_VIA_HOST``; ROUTE sends its
# replies back to tun0, so the host's conntrack undoes the DNAT.
CT_MARK_VIA_HOST: Final = 0x1

VXLAN_PORT: Final = 1  # ofport of vxlan0
TUN_PORT: Final = 2  # ofport of tun0, the gateway: the host's side of br0
FIRST_POD_PORT: Final = 3  # pods get ofports from here up

BRIDGE: Final = "br0"
VXLAN: Final = "vxlan0"
TUN: Final = "tun0"
