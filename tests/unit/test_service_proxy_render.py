"""The renderer is incremental: after any sequence of tables (unchanged ports kept as the
same objects, as the compiler keeps them, or rebuilt equal, or changed, added, removed)
it gives what a fresh renderer gives for the last table, and the UDP endpoints; and the
transaction from the table before, which looks only at what the render touched, is the
one a comparison of the whole tables gives."""

from __future__ import annotations

import dataclasses
from ipaddress import IPv4Address
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from podnet.dataplane.linux.servicescript import transaction
from podnet.dataplane.linux.servicetable import ServiceNft, ServiceRenderer
from podnet.services.model import Endpoint, ServicePort, ServiceTable
from podnet.testing.nodenetwork import node_network

NODE = node_network("node-1", "198.51.100.11", "10.128.0.0/23")


def port(name: str, protocol: str, hosts: list[int]) -> ServicePort:
    endpoints = tuple(sorted(Endpoint(IPv4Address(f"10.128.2.{h}"), 53) for h in set(hosts)))
    ip = IPv4Address(f"172.30.0.{ord(name[0])}")
    options: dict[str, Any] = {
        "c": {"affinity_seconds": 60},  # endpoint chains and affinity sets
        "d": {"node_port": 30053, "external_ips": (IPv4Address("203.0.113.7"),)},
    }.get(name, {})
    return ServicePort("default", name, "", protocol, 53, ip, endpoints=endpoints, **options)


STEPS = st.lists(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c", "d"]),
            st.sampled_from(["put", "copy", "remove"]),
            st.sampled_from(["tcp", "udp"]),
            st.lists(st.integers(2, 5), max_size=3),
        ),
        max_size=3,
    ),
    max_size=8,
)


@given(STEPS)
@settings(max_examples=100, deadline=None)
def test_incremental_render_equals_a_fresh_render(steps: list[list[Any]]) -> None:
    renderer = ServiceRenderer(NODE)
    ports: dict[str, ServicePort] = {}
    before: ServiceNft | None = None
    for changes in steps:
        for name, verb, protocol, hosts in changes:
            if verb == "put":
                ports[name] = port(name, protocol, hosts)
            elif verb == "copy" and name in ports:
                ports[name] = dataclasses.replace(ports[name])  # equal, not the same
            else:
                ports.pop(name, None)
        table = ServiceTable(tuple(ports[k] for k in sorted(ports)))
        rendered = renderer.render(table)
        assert rendered == ServiceRenderer(NODE).render(table)
        if before is not None and before.chains:  # whole tables compared (no serial):
            whole = transaction(dataclasses.replace(before, serial=None), rendered)
            assert transaction(before, rendered) == whole
        before = rendered
        udp = {(str(e.ip), e.port) for p in table.ports if p.protocol == "udp" for e in p.endpoints}
        assert renderer.udp_endpoints() == udp


def test_a_port_replaced_by_another_on_the_same_cluster_ip_keeps_its_endpoint_group() -> None:
    """Endpoint groups are keyed by address, protocol and port: a Service deleted and
    another made with its cluster IP, in one render, must leave the new one's group."""
    renderer = ServiceRenderer(NODE)
    old, new = port("b", "tcp", [2]), dataclasses.replace(port("b", "tcp", [2]), name="c")
    before = renderer.render(ServiceTable((old,)))
    after = renderer.render(ServiceTable((new,)))
    assert after == ServiceRenderer(NODE).render(ServiceTable((new,)))
    assert after.groups.keys() == before.groups.keys() == {"172.30.0.98 . tcp . 53"}
    assert " endpoints {" not in transaction(before, after)  # the same picks stay
