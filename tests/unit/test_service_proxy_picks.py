"""The service table's picks through the ``endpoints`` map: what an endpoint change and a
new number of endpoints cost, a group read back by its digest, and which entries may lead
to a chain that picks through the map (its key is the packet's destination)."""

from __future__ import annotations

from ipaddress import IPv4Address

from test_service_proxy_table import NODE, chain_of, port, table

from podnet.dataplane.linux.servicenft import SERVICE_IPS, EndpointGroup, ServiceNft
from podnet.dataplane.linux.serviceports import PICKED
from podnet.dataplane.linux.servicescript import transaction
from podnet.dataplane.linux.servicetable import ServiceRenderer


def test_only_the_cluster_ip_leads_to_a_pick_through_the_endpoints_map() -> None:
    """The map is keyed by the packet's destination: a node port's or external IP's
    packet must never reach a chain that DNATs through it."""
    ports = [
        port("a", 1, (5, True), (6, False), node_port=30001, external_local=True),
        port("b", 2, (5, False), node_port=30002, external_ips=(IPv4Address("203.0.113.7"),)),
        port(
            "c", 3, (5, True), (6, False), node_port=30003, external_local=True, internal_local=True
        ),
        port("d", 4, (5, True), (6, False), affinity_seconds=60, external_local=True),
    ]
    rendered = ServiceRenderer(NODE).render(table(*ports))
    picking = {name for name, chain in rendered.chains.items() if PICKED in chain.rules}
    assert len(picking) == 3
    referrers = [
        (name, element)
        for name, found in rendered.sets.items()
        for element in found.elements or ()
        if element.rsplit(" ", 1)[-1] in picking
    ]
    assert {name for name, _ in referrers} == {SERVICE_IPS}
    assert {e.split(" : ")[0] for _, e in referrers} == set(rendered.groups)
    assert not [r for c in rendered.chains.values() for r in c.rules if r.split()[-1] in picking]
    assert not any(name.startswith("svc/default/empty/") for name in rendered.chains)


def test_an_endpoint_change_changes_map_elements_only() -> None:
    renderer = ServiceRenderer(NODE)
    ports = [port(f"s{i}", i, (5, True), (6, False)) for i in range(1, 50)]
    before = renderer.render(table(*ports))
    old = before.groups["172.30.0.8 . tcp . 80"]
    ports[7] = port("s8", 8, (5, True), (7, False))
    after = renderer.render(table(*ports))
    new = after.groups["172.30.0.8 . tcp . 80"]
    target = "ip podnet_services"
    assert transaction(before, after).splitlines() == [
        f"delete element {target} endpoint_digests {{ {old.marker('172.30.0.8 . tcp . 80')} }}",
        f"delete element {target} endpoints {{ 172.30.0.8 . tcp . 80 . 0x00000001 }}",
        f"add element {target} endpoint_digests {{ {new.marker('172.30.0.8 . tcp . 80')} }}",
        f"add element {target} endpoints {{ 172.30.0.8 . tcp . 80 . 0x00000001 : "
        "10.128.2.7 . 8080 }",
    ]  # no rule, no chain, no verdict: the kernel validates nothing
    assert transaction(after, after) == ""
    assert after.chains.keys() == before.chains.keys()


def test_a_new_number_of_endpoints_adds_one_chain_and_repoints_one_element() -> None:
    renderer = ServiceRenderer(NODE)
    ports = [port(f"s{i}", i, (5, True), (6, False)) for i in range(1, 50)]
    before = renderer.render(table(*ports))
    old = chain_of(before, "svc/default/s8/tcp/80/").name
    ports[7] = port("s8", 8, (5, True))
    after = renderer.render(table(*ports))
    new = chain_of(after, "svc/default/s8/tcp/80/").name
    prefix = "172.30.0.8 . tcp . 80"
    markers = [group.marker(prefix) for group in (before.groups[prefix], after.groups[prefix])]
    target = "ip podnet_services"
    assert transaction(before, after).splitlines() == [
        f"add chain {target} {new}",
        f"delete element {target} endpoint_digests {{ {markers[0]} }}",
        f"delete element {target} service_ips {{ {prefix} : goto {old} }}",
        f"delete element {target} endpoints {{ {prefix} . 0x00000001 }}",
        f"add rule {target} {new} ip saddr != @cluster_networks meta mark set meta mark | "
        "0x00004000",
        f"add rule {target} {new} ct mark set numgen random mod 1",
        f"add rule {target} {new} {PICKED}",
        f"add element {target} endpoint_digests {{ {markers[1]} }}",
        f"add element {target} service_ips {{ {prefix} : goto {new} }}",
        f"flush chain {target} {old}",
        f"delete chain {target} {old}",
    ]
    assert after.chains.keys() - before.chains.keys() == {new}


def test_a_group_read_back_is_replaced_whole_when_its_digest_differs() -> None:
    renderer = ServiceRenderer(NODE)
    want = renderer.render(table(port("a", 1, (5, True), (6, False)), port("b", 2, (7, False))))
    prefix = "172.30.0.1 . tcp . 80"
    stale = EndpointGroup(3, "00000000")  # as read back: count and digest, no targets
    read = ServiceNft(want.sets, want.chains, {**want.groups, prefix: stale})
    gone = ServiceNft(want.sets, want.chains, {**want.groups, "172.30.0.9 . tcp . 80": stale})
    target = "ip podnet_services"
    assert transaction(read, want).splitlines() == [
        f"delete element {target} endpoints {{ "
        + ", ".join(f"{prefix} . 0x0000000{i}" for i in range(3))
        + " }",
        f"add element {target} endpoints {{ {prefix} . 0x00000000 : 10.128.0.5 . 8080, "
        f"{prefix} . 0x00000001 : 10.128.2.6 . 8080 }}",
    ]
    same = {p: EndpointGroup(g.count, g.digest) for p, g in want.groups.items()}
    assert transaction(ServiceNft(want.sets, want.chains, same), want) == ""
    assert transaction(gone, want).splitlines()[0] == (
        f"delete element {target} endpoints {{ "
        + ", ".join(f"172.30.0.9 . tcp . 80 . 0x0000000{i}" for i in range(3))
        + " }"
    )
