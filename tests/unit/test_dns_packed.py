"""The zone index keeps a slice's endpoints packed in one string (``SliceInfo.packed``):
unpacked they are exactly the endpoints read from the whole object, so a headless
service's records are the same."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from podnet.dns.records import PTR, A, Record, _endpoint, slice_info
from podnet.dns.zone import ZoneIndex
from podnet.testing.dns import endpoint_slice, service

ENTRIES = st.lists(
    st.fixed_dictionaries(
        {
            "addresses": st.lists(
                st.sampled_from(["10.128.0.5", "10.128.0.6", "fd00::1", "FD00::0:2", "bad"]),
                max_size=3,
            ),
            "conditions": st.sampled_from([{}, {"ready": True}, {"ready": False}, None]),
        },
        optional={"hostname": st.sampled_from(["db-0", "DB-1", "", "not a label", "x" * 70])},
    ),
    max_size=6,
)


@given(ENTRIES)
@settings(max_examples=150, deadline=None)
def test_packed_endpoints_are_the_endpoints_of_the_whole_object(entries: list[Any]) -> None:
    obj = endpoint_slice("default", "db-a", "db", [], [("pg", 5432, "TCP")])
    obj["endpoints"] = entries
    info = slice_info(obj)
    assert info is not None
    assert info.endpoints == tuple(e for e in map(_endpoint, entries) if e)


def test_headless_records_come_from_the_packed_endpoints() -> None:
    zone = ZoneIndex()
    zone.put_service(service("default", "db", None, [("pg", 5432, "TCP")]))
    zone.put_slice(
        endpoint_slice(
            "default",
            "db-a",
            "db",
            [("10.128.0.5", "db-0", True), ("10.128.0.6", None, True), ("10.128.0.7", None, False)],
            [("pg", 5432, "TCP")],
        )
    )
    name = "db.default.svc.cluster.local"
    assert set(zone.records(name)) == {
        Record(name, A, ("10.128.0.5",)),
        Record(name, A, ("10.128.0.6",)),
    }
    assert set(zone.records("5.0.128.10.in-addr.arpa")) == {
        Record("5.0.128.10.in-addr.arpa", PTR, (f"db-0.{name}",))
    }
    assert set(zone.records(f"10-128-0-6.{name}")) == {
        Record(f"10-128-0-6.{name}", A, ("10.128.0.6",))
    }
