"""A node's network values for unit tests: the usual cluster network (10.128.0.0/14),
service network (172.30.0.0/16) and MTU (1450), with the node's own name, IP and subnet."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

from podnet.dataplane.interface import NodeNetwork


def node_network(name: str, ip: str, subnet: str) -> NodeNetwork:
    """``NodeNetwork`` of node ``name`` at ``ip`` with pod subnet ``subnet``."""
    return NodeNetwork(
        name,
        IPv4Address(ip),
        IPv4Network(subnet),
        (IPv4Network("10.128.0.0/14"),),
        IPv4Network("172.30.0.0/16"),
        1450,
    )
