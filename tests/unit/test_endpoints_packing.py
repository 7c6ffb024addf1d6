"""Slice packing: every endpoint in exactly one slice of at most ``size``, and one pod
added or removed changes at most one slice (kube's reconciler keeps slices stable)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_endpoints_desired import pod, service

from podnet.controllers.endpointsdesired import PortsKey, desired_endpoints
from podnet.controllers.endpointslicepacking import pack
from podnet.controllers.endpointslicesdesired import MAX_ENDPOINTS_PER_SLICE, desired_slices

Obj = dict[str, Any]
SIZE = 3
KEY: PortsKey = (("http", "TCP", 8080, ""),)
PORTS = [{"name": "http", "port": 8080, "protocol": "TCP"}]


def name_for(address_type: str, key: PortsKey, index: int) -> str:
    return f"s-{address_type}-{index}"


def endpoints(ips: set[int]) -> list[Obj]:
    return [{"addresses": [f"10.0.0.{i}"], "conditions": {"ready": True}} for i in sorted(ips)]


def as_slices(chunks: list[Any]) -> list[Obj]:
    return [
        {"metadata": {"name": name}, "addressType": t, "ports": PORTS, "endpoints": members}
        for t, _key, name, members in chunks
    ]


def packed(ips: set[int], current: list[Obj]) -> list[Obj]:
    return as_slices(pack({("IPv4", KEY): endpoints(ips)}, current, name_for, SIZE))


def contents(slices: list[Obj]) -> dict[str, list[str]]:
    return {s["metadata"]["name"]: [e["addresses"][0] for e in s["endpoints"]] for s in slices}


@settings(max_examples=100, deadline=None)
@given(
    start=st.sets(st.integers(1, 40), max_size=20),
    change=st.integers(1, 40),
)
def test_one_pod_more_or_less_changes_at_most_one_slice(start: set[int], change: int) -> None:
    before = packed(start, [])
    after_ips = start ^ {change}
    after = packed(after_ips, before)
    placed = [ip for members in contents(after).values() for ip in members]
    assert sorted(placed) == sorted(f"10.0.0.{i}" for i in after_ips)  # each exactly once
    assert all(0 < len(members) <= SIZE for members in contents(after).values())
    old, new = contents(before), contents(after)
    changed = {n for n in old.keys() | new.keys() if old.get(n) != new.get(n)}
    assert len(changed) <= 1, (old, new)


def test_existing_slices_are_refilled_before_new_ones() -> None:
    first = packed({1, 2, 3, 4, 5, 6}, [])
    assert contents(first) == {
        "s-IPv4-0": ["10.0.0.1", "10.0.0.2", "10.0.0.3"],
        "s-IPv4-1": ["10.0.0.4", "10.0.0.5", "10.0.0.6"],
    }
    second = packed({2, 3, 4, 5, 6, 7}, first)  # 1 gone, 7 new: 7 takes 1's place
    assert contents(second)["s-IPv4-0"] == ["10.0.0.2", "10.0.0.3", "10.0.0.7"]
    assert contents(second)["s-IPv4-1"] == contents(first)["s-IPv4-1"]


def test_pods_sharing_an_address_are_two_endpoints() -> None:
    """Two host-network pods on one node have the node's address: both are endpoints."""
    svc = service()
    pods = [pod("a", "192.0.2.1"), pod("b", "192.0.2.1")]
    (one,) = desired_slices(svc, pods).values()
    assert [e["targetRef"]["name"] for e in one["endpoints"]] == ["a", "b"]
    (again,) = desired_slices(svc, pods, [one]).values()
    assert again == one
    (subset,) = desired_endpoints(svc, pods)["subsets"]
    assert [a["targetRef"]["name"] for a in subset["addresses"]] == ["a", "b"]


def test_a_service_of_many_pods_gains_one_pod_in_one_slice() -> None:
    svc = service()
    count = 3 * MAX_ENDPOINTS_PER_SLICE - 10
    pods = [pod(f"p{i}", f"10.1.{i // 250}.{i % 250 + 1}") for i in range(count)]
    before = desired_slices(svc, pods)
    pods.append(pod("new", "10.1.0.0"))  # sorts first: a fresh chunking would shift all
    after = desired_slices(svc, pods, before.values())
    changed = [n for n in after if after[n] != before.get(n)]
    assert len(changed) == 1 and set(after) == set(before)
