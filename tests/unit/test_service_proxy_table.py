"""The service proxy's pure parts: compiling Services and EndpointSlices, rendering the
nftables table, the transaction between two tables, and reading a listing back."""

from __future__ import annotations

from ipaddress import IPv4Address
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from podnet.dataplane.linux.servicenft import (
    ENDPOINT_DIGESTS,
    NO_ENDPOINT_IPS,
    NO_ENDPOINT_NODE_PORTS,
    NODE_PORTS,
    SERVICE_IPS,
    Chain,
    EndpointGroup,
    ServiceNft,
    digest,
    duration,
)
from podnet.dataplane.linux.serviceports import PICKED
from podnet.dataplane.linux.servicescript import parse_duration, parse_listing, transaction
from podnet.dataplane.linux.servicetable import ServiceRenderer
from podnet.services.compile import ServiceCompiler, compile_services
from podnet.services.model import Endpoint, ServicePort, ServiceTable, table_problems
from podnet.testing.nodenetwork import node_network

Obj = dict[str, Any]
NODE = node_network("node-1", "198.51.100.11", "10.128.0.0/23")


def service(name: str, ip: str | None, *ports: Obj, ns: str = "default", **spec: Any) -> Obj:
    default = [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]
    body = {"clusterIP": ip or "None", "ports": list(ports) or default, **spec}
    return {"metadata": {"namespace": ns, "name": name}, "spec": body}


def endpoint_slice(
    svc: str, name: str, *endpoints: Obj, ns: str = "default", port_name: str = "http"
) -> Obj:
    return {
        "metadata": {
            "namespace": ns,
            "name": name,
            "labels": {"kubernetes.io/service-name": svc},
        },
        "addressType": "IPv4",
        "endpoints": list(endpoints),
        "ports": [{"name": port_name, "port": 8080, "protocol": "TCP"}],
    }


def ep(ip: str, node: str = "node-2", ready: bool | None = True) -> Obj:
    conditions = {} if ready is None else {"ready": ready}
    return {"addresses": [ip], "nodeName": node, "conditions": conditions}


# --- compile -----------------------------------------------------------------------------------


def test_ready_endpoints_of_the_matching_port_with_local_ones_marked() -> None:
    slices = [
        endpoint_slice(
            "web",
            "web-1",
            ep("10.128.0.5", "node-1"),
            ep("10.128.2.5"),
            ep("10.128.2.6", ready=False),
        ),
        endpoint_slice("web", "web-2", ep("10.128.2.7", ready=None), ep("10.128.2.5")),
        endpoint_slice("web", "other-port", ep("10.128.2.9"), port_name="metrics"),
        endpoint_slice("other", "other-1", ep("10.128.2.10")),
    ]
    (port,) = compile_services([service("web", "172.30.0.10")], slices, "node-1").ports
    assert port.key == "default/web/tcp/http" and port.cluster_ip == IPv4Address("172.30.0.10")
    assert port.endpoints == (
        Endpoint(IPv4Address("10.128.0.5"), 8080, local=True),
        Endpoint(IPv4Address("10.128.2.5"), 8080),
        Endpoint(IPv4Address("10.128.2.7"), 8080),  # no ready condition: ready
    )


def test_types_traffic_policies_and_affinity() -> None:
    ports = [{"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053}]
    services = [
        service("np", "172.30.0.1", *ports, type="NodePort", externalTrafficPolicy="Local"),
        service("cip", "172.30.0.2", *ports, type="ClusterIP", internalTrafficPolicy="Local"),
        service("sticky", "172.30.0.3", sessionAffinity="ClientIP"),
        service(
            "short",
            "172.30.0.4",
            sessionAffinity="ClientIP",
            sessionAffinityConfig={"clientIP": {"timeoutSeconds": 60}},
        ),
        service("name", None, type="ExternalName", externalName="example.com"),
        service("headless", None),
        service("ext", "172.30.0.5", externalIPs=["203.0.113.7", "bogus"]),
    ]
    found = {p.name: p for p in compile_services(services, [], "node-1").ports}
    assert set(found) == {"np", "cip", "sticky", "short", "ext"}  # no ExternalName, headless
    assert found["np"].node_port == 30053 and found["np"].external_local
    assert found["cip"].node_port is None and found["cip"].internal_local
    assert found["np"].protocol == "udp" and found["np"].key == "default/np/udp/dns"
    assert (found["sticky"].affinity_seconds, found["short"].affinity_seconds) == (10800, 60)
    assert found["ext"].external_ips == (IPv4Address("203.0.113.7"),)


def test_the_incremental_compiler_recompiles_only_what_changed() -> None:
    compiler = ServiceCompiler("node-1")
    compiler.replace_services([service("a", "172.30.0.1"), service("b", "172.30.0.2")])
    compiler.replace_slices([endpoint_slice("a", "a-1", ep("10.128.2.1"))])
    first = compiler.table()
    assert compiler.table() is first  # nothing changed: the same value
    b_before = next(p for p in first.ports if p.name == "b")
    compiler.put_slice(endpoint_slice("a", "a-1", ep("10.128.2.2")))
    second = compiler.table()
    assert next(p for p in second.ports if p.name == "b") is b_before  # untouched
    changed = next(p for p in second.ports if p.name == "a")
    assert changed.endpoints[0].ip == IPv4Address("10.128.2.2")
    compiler.remove_service(service("a", "172.30.0.1"))
    assert [p.name for p in compiler.table().ports] == ["b"]


NAMES = st.sampled_from(["a", "a-b", "ab", "b"])  # "a/..." sorts after "a-b/..."
SLICE_CHANGES = st.lists(
    st.tuples(
        st.sampled_from(["put-service", "remove-service", "put-slice", "remove-slice"]),
        NAMES,
        st.sampled_from(["1", "2"]),
        st.lists(st.integers(2, 9), max_size=3),
    ),
    max_size=25,
)


@given(SLICE_CHANGES)
@settings(max_examples=60, deadline=None)
def test_incremental_compile_equals_a_full_compile(changes: list[Any]) -> None:
    """Any sequence of changes gives the table a compile of the final objects gives."""
    compiler = ServiceCompiler("node-1")
    services: dict[str, Obj] = {}
    slices: dict[str, Obj] = {}
    for verb, name, slice_id, hosts in changes:
        svc = service(name, f"172.30.0.{sum(map(ord, name)) % 250}")
        piece = endpoint_slice(name, f"{name}-{slice_id}", *(ep(f"10.128.2.{h}") for h in hosts))
        if verb == "put-service":
            services[name] = svc
            compiler.put_service(svc)
        elif verb == "remove-service":
            services.pop(name, None)
            compiler.remove_service(svc)
        elif verb == "put-slice":
            slices[f"{name}-{slice_id}"] = piece
            compiler.put_slice(piece)
        else:
            slices.pop(f"{name}-{slice_id}", None)
            compiler.remove_slice(piece)
        table = compiler.table()
        assert table == compile_services(services.values(), slices.values(), "node-1")
        keys = [p.key for p in table.ports]
        assert keys == sorted(keys)  # the order backends rely on


def test_table_problems_name_clashes_and_stray_cluster_ips() -> None:
    one = ServicePort("x", "a", "", "tcp", 80, IPv4Address("172.30.0.1"), node_port=30001)
    clash = ServicePort("x", "b", "", "tcp", 80, IPv4Address("172.30.0.1"), node_port=30001)
    stray = ServicePort("x", "c", "", "tcp", 80, IPv4Address("10.0.0.1"))
    problems = table_problems(ServiceTable((one, clash, stray)), NODE.service_network)
    assert len(problems) == 3, problems
    assert table_problems(ServiceTable((one,)), NODE.service_network) == []
    assert table_problems(ServiceTable((clash, one)))  # unsorted


# --- rendering and transactions ------------------------------------------------------------------


def port(name: str, host: int, *endpoints: tuple[int, bool], **options: Any) -> ServicePort:
    found = tuple(
        Endpoint(IPv4Address(f"10.128.{0 if local else 2}.{h}"), 8080, local)
        for h, local in endpoints
    )
    return ServicePort(
        "default",
        name,
        "",
        options.pop("protocol", "tcp"),
        80,
        IPv4Address(f"172.30.0.{host}"),
        endpoints=found,
        **options,
    )


def table(*ports: ServicePort) -> ServiceTable:
    return ServiceTable(tuple(sorted(ports, key=lambda p: p.key)))


def test_each_service_costs_map_elements_not_rules() -> None:
    small = ServiceRenderer(NODE).render(table(port("a", 1, (5, True))))
    many = ServiceRenderer(NODE).render(
        table(*(port(f"s{i}", i, (5, True), (6, False)) for i in range(1, 200)))
    )
    hooked = [c for c in many.chains.values() if c.hook is not None]
    assert [c.rules for c in hooked] == [
        c.rules for c in small.chains.values() if c.hook is not None
    ]  # the hooks' rules do not grow: one vmap lookup per packet
    assert len(many.sets[SERVICE_IPS].elements or ()) == 199
    svc = chain_of(many, "svc/default/s7/tcp/80/").rules
    assert svc[1:] == ("ct mark set numgen random mod 2", PICKED)  # a pick, then the map
    assert many.groups["172.30.0.7 . tcp . 80"].targets == (
        "10.128.0.5 . 8080",
        "10.128.2.6 . 8080",
    )  # the picks' endpoints, in the endpoints map
    assert len(many.groups) == 199 and len(many.sets[ENDPOINT_DIGESTS].elements or ()) == 199
    assert not any("{" in rule for c in many.chains.values() for rule in c.rules)  # no
    # anonymous set: each would be read by every later nft run


def chain_of(rendered: ServiceNft, prefix: str) -> Chain:
    """The one chain whose name starts with ``prefix`` (its tail is a content digest)."""
    (found,) = [c for name, c in rendered.chains.items() if name.startswith(prefix)]
    assert found.name == prefix + digest(found.rules)
    return found


def test_no_endpoints_reject_and_external_local_without_local_endpoint_drops() -> None:
    empty = port("empty", 1, node_port=30001)
    far = port("far", 2, (5, False), node_port=30002, external_local=True)
    rendered = ServiceRenderer(NODE).render(table(empty, far))
    assert rendered.sets[NO_ENDPOINT_IPS].elements == {
        "172.30.0.1 . tcp . 80 : goto reject_service"
    }
    assert rendered.sets[NO_ENDPOINT_NODE_PORTS].elements == {"tcp . 30001 : goto reject_service"}
    ext, svc = (
        chain_of(rendered, "ext/default/far/tcp/80/"),
        chain_of(rendered, "svc/default/far/tcp/80/"),
    )
    assert rendered.sets[NODE_PORTS].elements == {f"tcp . 30002 : goto {ext.name}"}
    assert ext.rules == (  # its own pods: the cluster IP's endpoints
        f"ip saddr {NODE.subnet} meta l4proto tcp dnat to 10.128.2.5:8080",
        "drop",
    )
    assert svc.rules[-1] == PICKED  # keyed by the cluster IP: not reachable from a node port
    sticky = port("far", 2, (5, False), node_port=30002, external_local=True, affinity_seconds=9)
    rendered = ServiceRenderer(NODE).render(table(sticky))
    ext, svc = (
        chain_of(rendered, "ext/default/far/tcp/80/"),
        chain_of(rendered, "svc/default/far/tcp/80/"),
    )
    assert ext.rules == (f"ip saddr {NODE.subnet} goto {svc.name}", "drop")  # its affinity


def test_affinity_remembers_the_client_per_endpoint() -> None:
    sticky = port("sticky", 3, (5, True), (6, False), affinity_seconds=600)
    rendered = ServiceRenderer(NODE).render(table(sticky))
    chain = "ep/svc/default/sticky/tcp/80/10.128.0.5-8080/600"
    assert rendered.chains[chain].rules == (
        "update @aff/svc/default/sticky/tcp/80/10.128.0.5-8080/600 { ip saddr }",
        "meta l4proto tcp dnat to 10.128.0.5:8080",
    )
    assert chain_of(rendered, "svc/default/sticky/tcp/80/").rules[1:] == (
        "ip saddr @aff/svc/default/sticky/tcp/80/10.128.0.5-8080/600 goto " + chain,
        "ip saddr @aff/svc/default/sticky/tcp/80/10.128.2.6-8080/600 goto "
        "ep/svc/default/sticky/tcp/80/10.128.2.6-8080/600",
        "ct mark set numgen random mod 2",
        "ct mark 0x00000000 goto " + chain,
        "ct mark 0x00000001 goto ep/svc/default/sticky/tcp/80/10.128.2.6-8080/600",
    )
    aff = rendered.sets["aff/svc/default/sticky/tcp/80/10.128.0.5-8080/600"]
    assert (aff.timeout, aff.elements, aff.flags) == (600, None, "dynamic,timeout")
    assert duration(600) == "10m" and parse_duration("10m") == 600
    assert parse_duration(duration(93784)) == 93784 and duration(10800) == "3h"


def test_a_removed_service_leaves_its_map_element_before_its_chain() -> None:
    renderer = ServiceRenderer(NODE)
    sticky = port("sticky", 3, (5, True), affinity_seconds=60)
    before = renderer.render(table(port("a", 1, (5, True)), sticky))
    after = renderer.render(table(port("a", 1, (5, True))))
    script = transaction(before, after).splitlines()
    element = next(i for i, line in enumerate(script) if line.startswith("delete element"))
    chain = next(i for i, line in enumerate(script) if line.startswith("delete chain"))
    aff = next(i for i, line in enumerate(script) if line.startswith("delete set"))
    assert element < aff < chain
    assert transaction(after, ServiceRenderer(NODE).render(ServiceTable())) == (
        "delete table ip podnet_services\n"
    )
    assert transaction(None, ServiceRenderer(NODE).render(ServiceTable())) == ""


LISTING = """table ip podnet_services {
\tset aff/svc/default/c/tcp/80/10.128.0.5-8080 {
\t\ttype ipv4_addr
\t\tsize 65535
\t\tflags dynamic,timeout
\t\ttimeout 10m
\t\telements = { 10.128.2.9 expires 9m58s }
\t}

\tset endpoint_digests {
\t\ttype ipv4_addr . inet_proto . inet_service . mark . mark
\t\telements = { 172.30.0.10 . tcp . 80 . 0x00000002 . 0x0a1b2c3d }
\t}

\tmap service_ips {
\t\ttype ipv4_addr . inet_proto . inet_service : verdict
\t\telements = { 172.30.0.11 . udp . 53 : goto svc/default/b/udp/53,
\t\t\t     172.30.0.10 . tcp . 80 : goto svc/default/a/tcp/http }
\t}

\tchain prerouting {
\t\ttype nat hook prerouting priority dstnat; policy accept;
\t\tjump services
\t}

\tchain services {
\t\tcomment "e084ea95de97"
\t}

\tchain svc/default/b/udp/53 {
\t\tmeta l4proto udp dnat to 10.128.0.5:8080
\t}
}
"""


def test_a_listing_reads_back_sets_elements_and_chains() -> None:
    read = parse_listing(LISTING)
    assert read is not None
    aff = read.sets["aff/svc/default/c/tcp/80/10.128.0.5-8080"]
    assert (aff.timeout, aff.elements) == (600, None)  # the packet path's entries: not ours
    assert read.sets[SERVICE_IPS].elements == {
        "172.30.0.11 . udp . 53 : goto svc/default/b/udp/53",
        "172.30.0.10 . tcp . 80 : goto svc/default/a/tcp/http",
    }
    assert read.chains["prerouting"].hook == (
        "type nat hook prerouting priority dstnat; policy accept;"
    )
    assert read.chains["svc/default/b/udp/53"].rules == (
        "meta l4proto udp dnat to 10.128.0.5:8080",
    )
    assert read.groups == {"172.30.0.10 . tcp . 80": EndpointGroup(2, "0a1b2c3d")}
    assert parse_listing("table ip podnet_services {\n}\n") is None


SPECS = st.lists(
    st.tuples(
        st.integers(1, 12),
        st.lists(st.tuples(st.integers(2, 6), st.booleans()), max_size=3, unique_by=lambda e: e),
        st.sampled_from([None, 60]),
        st.sampled_from([None, 30001]),
    ),
    max_size=8,
    unique_by=lambda s: s[0],
)


def build(specs: list[Any]) -> ServiceTable:
    return table(
        *(
            port(f"s{h}", h, *eps, affinity_seconds=aff, node_port=(np + h) if np else None)
            for h, eps, aff, np in specs
        )
    )


@given(SPECS, SPECS)
@settings(max_examples=80, deadline=None)
def test_a_transaction_touches_only_what_differs(a: list[Any], b: list[Any]) -> None:
    want_a, want_b = ServiceRenderer(NODE).render(build(a)), ServiceRenderer(NODE).render(build(b))
    assert transaction(want_b, want_b) == ""
    script = transaction(want_a, want_b) if want_a.chains else ""
    touched = {
        line.split()[4]
        for line in script.splitlines()
        if line.split()[:2] in (["flush", "chain"], ["add", "rule"])
    }
    changed = {
        name
        for name in set(want_a.chains) | set(want_b.chains)
        if want_a.chains.get(name) != want_b.chains.get(name)
    }
    assert touched <= changed
