"""The egress firewall's nftables table on a real kernel (``podnet.dataplane.linux.egressnft``):
after any sequence of changes applied one by one (only what differs), the table holds
exactly what the whole table rendered for the last firewall holds, in a namespace of its
own per run."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv4Network
from typing import Any

import pytest

from podnet import netns
from podnet.dataplane.interface import NodeNetwork
from podnet.dataplane.linux import nftables
from podnet.dataplane.linux.egressnft import TABLE_KEY, EgressFirewallNft, render
from podnet.egress.nodetable import NodeFirewall

pytestmark = pytest.mark.root

NODE = NodeNetwork(
    "node-a",
    IPv4Address("192.0.2.10"),
    IPv4Network("10.128.0.0/23"),
    (IPv4Network("10.128.0.0/14"),),
    IPv4Network("172.30.0.0/16"),
    1450,
)
A, B, C = (IPv4Address(f"10.128.0.{k}") for k in (5, 6, 7))


def span(first: str, last: str) -> tuple[int, int]:
    return int(IPv4Address(first)), int(IPv4Address(last))


@pytest.fixture
def namespaces() -> Iterator[tuple[str, str]]:
    run = f"pneg{uuid.uuid4().hex[:8]}"  # unique per run, removed by exact name
    made = [f"{run}-1", f"{run}-2"]
    for name in made:
        netns.create(name)
    try:
        yield made[0], made[1]
    finally:
        for name in made:
            netns.remove(name)


def table(ns: str) -> dict[str, Any]:
    """The table's sets, map and chains as comparable values (None: no table)."""
    listed = netns.run(ns, ["nft", "-j", "list", "table", *TABLE_KEY.split()], timeout=30)
    if listed.returncode != 0:
        return {}
    found: dict[str, Any] = {}
    for item in json.loads(listed.stdout)["nftables"]:
        for kind in ("set", "map"):
            if kind in item:
                found[f"{kind} {item[kind]['name']}"] = json.dumps(item[kind].get("elem"))
        if "rule" in item:
            rule = item["rule"]
            exprs = [e for e in rule["expr"] if "counter" not in e]
            found.setdefault(f"chain {rule['chain']}", []).append(json.dumps(exprs))
    return found


STEPS = [
    NodeFirewall({10: (span("192.0.2.0", "192.0.2.255"),)}, {A: 10}),
    NodeFirewall({10: (span("192.0.2.0", "192.0.2.127"),), 11: ((0, 2**32 - 1),)}, {A: 10, B: 11}),
    NodeFirewall({11: ((0, 2**32 - 1),), 12: ()}, {A: 11, C: 12}),  # a pod moves network
    NodeFirewall({12: (span("198.51.100.7", "198.51.100.7"),)}, {C: 12}),
    NodeFirewall(),  # nothing firewalled: no table
    NodeFirewall({10: (span("203.0.113.0", "203.0.113.255"),)}, {B: 10}),
]


def test_changes_one_by_one_leave_what_the_whole_table_holds(
    namespaces: tuple[str, str],
) -> None:
    step_ns, whole_ns = namespaces
    sync = EgressFirewallNft()
    for index, firewall in enumerate(STEPS):
        with netns.entered(step_ns):
            sync.sync(NODE, firewall)
            assert not sync.sync(NODE, firewall)  # the same again: nothing to do
        with netns.entered(whole_ns):
            text = render(NODE, firewall)
            if text is None:
                nftables.delete_tables([TABLE_KEY])
            else:
                nftables.replace_tables([text])
        assert table(step_ns) == table(whole_ns), f"step {index}"
    assert table(step_ns)  # the last step firewalls B
