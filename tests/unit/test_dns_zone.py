"""The zone index and lookups: the records of the Kubernetes DNS specification (schema
1.1.0), NODATA vs NXDOMAIN, CNAME chasing, and incremental updates reported per name."""

from __future__ import annotations

import ipaddress

import pytest

from podnet.dns.lookup import NOERROR, NXDOMAIN, SERVFAIL, resolve
from podnet.dns.records import AAAA, CNAME, PTR, SOA, SRV, TXT, A, Record
from podnet.dns.zone import ZoneIndex
from podnet.testing.dns import endpoint_slice, pod, service

SVC = "web.default.svc.cluster.local"
HL = "db.default.svc.cluster.local"
NETWORKS = [ipaddress.ip_network("10.128.0.0/14"), ipaddress.ip_network("172.30.0.0/16")]


def index(changes: list[set[str]] | None = None) -> ZoneIndex:
    zone = ZoneIndex(reverse_networks=NETWORKS)
    if changes is not None:
        zone.on_change = changes.append
    return zone


def headless(zone: ZoneIndex) -> None:
    zone.put_service(service("default", "db", None, [("pg", 5432, "TCP"), ("", 9, "UDP")]))
    zone.put_slice(
        endpoint_slice(
            "default",
            "db-a",
            "db",
            [("10.128.0.5", "db-0", True), ("10.128.0.6", None, True), ("10.128.0.7", None, False)],
            [("pg", 5432, "TCP"), ("", 9, "UDP")],
        )
    )


def data(zone: ZoneIndex, name: str, qtype: int) -> list[tuple[str | int, ...]]:
    result = resolve(zone, name, qtype)
    assert result is not None
    return [r.data for r in result.answers]


def test_cluster_ip_service_a_srv_ptr() -> None:
    zone = index()
    zone.put_service(
        service("default", "web", "172.30.0.10", [("http", 80, "TCP"), ("", 81, "TCP")])
    )
    assert data(zone, SVC, A) == [("172.30.0.10",)]
    srv = resolve(zone, f"_http._tcp.{SVC}", SRV)
    assert srv is not None
    assert [r.data for r in srv.answers] == [(0, 100, 80, SVC)]
    assert srv.additional == [Record(SVC, A, ("172.30.0.10",))]  # the target's address
    assert data(zone, "10.0.30.172.in-addr.arpa", PTR) == [(SVC,)]
    # Unnamed ports have no SRV record; the SRV name's parent exists (NODATA).
    assert resolve(zone, f"_81._tcp.{SVC}", SRV).rcode == NXDOMAIN  # type: ignore[union-attr]
    assert resolve(zone, f"_tcp.{SVC}", SRV).rcode == NOERROR  # type: ignore[union-attr]


def test_names_are_case_insensitive() -> None:
    zone = index()
    zone.put_service(service("default", "web"))
    assert data(zone, "WEB.Default.SVC.cluster.LOCAL.", A) == [("172.30.0.10",)]


def test_headless_service_endpoints_hostnames_srv_and_ptr() -> None:
    zone = index()
    headless(zone)
    # One A per ready endpoint; the not-ready one is left out.
    assert sorted(data(zone, HL, A)) == [("10.128.0.5",), ("10.128.0.6",)]
    assert data(zone, f"db-0.{HL}", A) == [("10.128.0.5",)]
    assert data(zone, f"10-128-0-6.{HL}", A) == [("10.128.0.6",)]  # no hostname: dashed IP
    assert resolve(zone, f"10-128-0-7.{HL}", A).rcode == NXDOMAIN  # type: ignore[union-attr]
    srv = sorted(data(zone, f"_pg._tcp.{HL}", SRV))
    assert srv == [(0, 50, 5432, f"10-128-0-6.{HL}"), (0, 50, 5432, f"db-0.{HL}")]
    assert data(zone, "5.0.128.10.in-addr.arpa", PTR) == [(f"db-0.{HL}",)]


def test_headless_without_ready_endpoints_is_nxdomain_and_publish_not_ready() -> None:
    zone = index()
    zone.put_service(service("default", "db", None))
    zone.put_slice(endpoint_slice("default", "db-a", "db", [("10.128.0.7", None, False)]))
    assert resolve(zone, HL, A).rcode == NXDOMAIN  # type: ignore[union-attr]
    zone.put_service(service("default", "db", None, publishNotReadyAddresses=True))
    assert data(zone, HL, A) == [("10.128.0.7",)]


def test_slices_of_one_service_merge_and_follow_relabelling() -> None:
    zone = index()
    zone.put_service(service("default", "db", None))
    zone.put_slice(endpoint_slice("default", "s1", "db", [("10.128.0.5", None, True)]))
    zone.put_slice(endpoint_slice("default", "s2", "db", [("10.128.0.6", None, True)]))
    assert len(data(zone, HL, A)) == 2
    zone.put_slice(endpoint_slice("default", "s2", "other", [("10.128.0.6", None, True)]))
    assert data(zone, HL, A) == [("10.128.0.5",)]
    zone.remove_slice(("default", "s1"))
    assert resolve(zone, HL, A).rcode == NXDOMAIN  # type: ignore[union-attr]


def test_external_name_is_a_cname_chased_in_zone_and_handed_out_of_zone() -> None:
    zone = index()
    zone.put_service(service("default", "web"))
    zone.put_service(service("default", "alias", type="ExternalName", externalName=SVC))
    zone.put_service(
        service("default", "out", type="ExternalName", externalName="www.Example.com.")
    )
    inside = resolve(zone, "alias.default.svc.cluster.local", A)
    assert inside is not None and inside.external is None
    assert [(r.rtype, r.data) for r in inside.answers] == [(CNAME, (SVC,)), (A, ("172.30.0.10",))]
    outside = resolve(zone, "out.default.svc.cluster.local", A)
    assert outside is not None and outside.external == "www.example.com"
    assert [r.data for r in outside.answers] == [("www.example.com",)]
    # Asked for the CNAME itself: the CNAME, nothing else.
    assert data(zone, "out.default.svc.cluster.local", CNAME) == [("www.example.com",)]


def test_cname_loops_end_in_servfail() -> None:
    zone = index()
    a, b = "a.default.svc.cluster.local", "b.default.svc.cluster.local"
    zone.put_service(service("default", "a", type="ExternalName", externalName=b))
    zone.put_service(service("default", "b", type="ExternalName", externalName=a))
    result = resolve(zone, a, A)
    assert result is not None and result.rcode == SERVFAIL and not result.answers


def test_nodata_and_nxdomain_carry_the_soa() -> None:
    zone = index()
    zone.put_service(service("default", "web"))
    nodata = resolve(zone, SVC, AAAA)
    assert nodata is not None and nodata.rcode == NOERROR and not nodata.answers
    assert [r.rtype for r in nodata.authority] == [SOA]
    assert nodata.authority[0].name == "cluster.local"
    for empty_non_terminal in ("default.svc.cluster.local", "svc.cluster.local"):
        assert resolve(zone, empty_non_terminal, A).rcode == NOERROR  # type: ignore[union-attr]
    missing = resolve(zone, "nope.default.svc.cluster.local", A)
    assert missing is not None and missing.rcode == NXDOMAIN
    assert missing.authority[0].data[-1] == zone.ttl  # the SOA minimum: negative TTL
    reverse = resolve(zone, "99.0.128.10.in-addr.arpa", PTR)
    assert reverse is not None and reverse.rcode == NXDOMAIN
    assert reverse.authority[0].name == "10.in-addr.arpa"


def test_names_outside_the_zones_are_not_answered() -> None:
    zone = index()
    assert resolve(zone, "www.example.com", A) is None
    assert resolve(zone, "1.1.168.192.in-addr.arpa", PTR) is None  # not a cluster range


def test_schema_version_soa_ns_at_the_apex() -> None:
    zone = index()
    assert data(zone, "dns-version.cluster.local", TXT) == [("1.1.0",)]
    assert data(zone, "cluster.local", SOA)[0][0] == "ns.dns.cluster.local"


def test_pod_records_follow_pods() -> None:
    zone = index()
    zone.put_pod(pod("team", "p1", "10.128.0.9"))
    name = "10-128-0-9.team.pod.cluster.local"
    assert data(zone, name, A) == [("10.128.0.9",)]
    assert resolve(zone, "10-128-0-9.other.pod.cluster.local", A).rcode == NXDOMAIN  # type: ignore[union-attr]
    zone.put_pod(pod("team", "p1", "10.128.0.9", phase="Succeeded"))
    assert resolve(zone, name, A).rcode == NXDOMAIN  # type: ignore[union-attr]


def test_invalid_objects_give_no_records() -> None:
    zone = index()
    before = zone.size
    zone.put_service(service("Bad_NS", "web"))
    zone.put_service(service("default", "ext", type="ExternalName", externalName="not a name"))
    zone.put_slice(endpoint_slice("default", "s", "-bad-", [("10.128.0.5", None, True)]))
    zone.put_pod(pod("default", "p", "not-an-ip"))
    assert zone.size == before
    assert resolve(zone, "ext.default.svc.cluster.local", A).rcode == NXDOMAIN  # type: ignore[union-attr]


def test_updates_report_exactly_the_names_they_change() -> None:
    changes: list[set[str]] = []
    zone = index(changes)
    zone.put_service(service("default", "web", "172.30.0.10", [("http", 80, "TCP")]))
    first = changes.pop()
    assert {SVC, f"_http._tcp.{SVC}", "10.0.30.172.in-addr.arpa"} <= first
    assert "default.svc.cluster.local" in first  # existence flipped: NXDOMAIN -> NODATA
    zone.put_service(service("default", "web", "172.30.0.10", [("http", 80, "TCP")]))
    assert changes == []  # nothing changed, nothing reported
    zone.put_service(service("default", "web", "172.30.0.11", [("http", 80, "TCP")]))
    assert changes.pop() == {SVC, "10.0.30.172.in-addr.arpa", "11.0.30.172.in-addr.arpa"}
    zone.put_service(service("default", "other", "172.30.0.12", []))
    assert "default.svc.cluster.local" not in changes.pop()  # existed already
    zone.remove_service(("default", "web"))
    gone = changes.pop()
    assert SVC in gone and "default.svc.cluster.local" not in gone
    assert resolve(zone, SVC, A).rcode == NXDOMAIN  # type: ignore[union-attr]


def test_shared_records_are_counted_per_source() -> None:
    zone = index()
    for name in ("a", "b"):
        zone.put_service(service("default", name, None))
        zone.put_slice(endpoint_slice("default", name, name, [("10.128.0.5", None, True)]))
    ptr = "5.0.128.10.in-addr.arpa"
    assert len(data(zone, ptr, PTR)) == 2
    zone.remove_service(("default", "a"))
    assert data(zone, ptr, PTR) == [("10-128-0-5.b.default.svc.cluster.local",)]
    zone.remove_service(("default", "b"))
    assert resolve(zone, ptr, PTR).rcode == NXDOMAIN  # type: ignore[union-attr]


def test_ipv6_cluster_ip_gives_aaaa_and_nibble_ptr() -> None:
    zone = ZoneIndex(reverse_networks=[ipaddress.ip_network("fd00:30::/64")])
    zone.put_service(service("default", "web", "fd00:30::a"))
    assert data(zone, SVC, AAAA) == [("fd00:30::a",)]
    reverse = ipaddress.ip_address("fd00:30::a").reverse_pointer
    assert data(zone, reverse, PTR) == [(SVC,)]
    assert zone.apex_of(reverse) == "0.0.0.0.0.0.0.0.0.3.0.0.0.0.d.f.ip6.arpa"


def test_pod_names_shared_addresses_namespace_existence_and_change_reports() -> None:
    changes: list[set[str]] = []
    zone = index(changes)
    name = "10-128-0-9.team.pod.cluster.local"
    zone.put_pod(pod("team", "p1", "10.128.0.9"))
    assert changes.pop() == {name, "team.pod.cluster.local", "pod.cluster.local"}
    zone.put_pod(pod("team", "p2", "10.128.0.9"))  # a second pod with the address
    assert changes == []  # nothing anyone can ask changed
    assert resolve(zone, "team.pod.cluster.local", A).rcode == NOERROR  # type: ignore[union-attr]
    zone.remove_pod(("team", "p1"))
    assert data(zone, name, A) == [("10.128.0.9",)]
    zone.put_pod(pod("team", "p2", "10.128.0.10"))  # readdressed
    assert changes.pop() == {name, "10-128-0-10.team.pod.cluster.local"}
    zone.remove_pod(("team", "p2"))
    assert changes.pop() == {
        "10-128-0-10.team.pod.cluster.local",
        "team.pod.cluster.local",
        "pod.cluster.local",
    }
    for gone in (name, "team.pod.cluster.local", "pod.cluster.local"):
        assert resolve(zone, gone, A).rcode == NXDOMAIN, gone  # type: ignore[union-attr]
    zone.put_pod(pod("team", "p6", "fd00::9"))
    assert data(zone, "fd00--9.team.pod.cluster.local", AAAA) == [("fd00::9",)]
    assert resolve(zone, "1-2-3.team.pod.cluster.local", A).rcode == NXDOMAIN  # type: ignore[union-attr]


def test_pod_record_modes_insecure_and_disabled() -> None:
    insecure = ZoneIndex(pod_records="insecure")  # any well-formed name, no pods needed
    assert data(insecure, "10-128-0-9.team.pod.cluster.local", A) == [("10.128.0.9",)]
    assert resolve(insecure, "team.pod.cluster.local", A).rcode == NOERROR  # type: ignore[union-attr]
    assert resolve(insecure, "x.team.pod.cluster.local", A).rcode == NXDOMAIN  # type: ignore[union-attr]
    assert resolve(insecure, "10-128-0-9.Bad_NS.pod.cluster.local", A).rcode == NXDOMAIN  # type: ignore[union-attr]
    disabled = ZoneIndex(pod_records="disabled")
    disabled.put_pod(pod("team", "p1", "10.128.0.9"))
    for name in ("10-128-0-9.team.pod.cluster.local", "pod.cluster.local"):
        assert resolve(disabled, name, A).rcode == NXDOMAIN  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="one of verified, insecure, disabled"):
        ZoneIndex(pod_records="sometimes")
