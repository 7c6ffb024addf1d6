"""SubnetAllocator: next-fit order, wrap-around reuse, marks, grow, exhaustion, scale."""

from __future__ import annotations

import tracemalloc
from ipaddress import IPv4Network

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podnet.controllers.config import (
    ClusterNetworkEntry,
    NetworkConfig,
    change_errors,
    parse_cluster_network_flag,
    parse_cluster_networks,
    uses_vnids,
)
from podnet.controllers.subnets import SubnetAllocator, SubnetsExhausted

Net = IPv4Network


def entry(flag: str) -> ClusterNetworkEntry:
    return parse_cluster_network_flag(flag)


def allocator(*flags: str) -> SubnetAllocator:
    return SubnetAllocator([entry(f) for f in flags])


def test_default_network_is_512_slash_23s_in_order() -> None:
    alloc = allocator("10.128.0.0/14:9")
    assert alloc.total == 512
    first = [alloc.allocate() for _ in range(3)]
    assert first == [Net("10.128.0.0/23"), Net("10.128.2.0/23"), Net("10.128.4.0/23")]
    assert alloc.available == 509


def test_entries_are_tried_in_order_then_wrap() -> None:
    alloc = allocator("10.200.0.0/25:6", "10.100.0.0/25:5")  # 2 x /26, then 4 x /27
    got = [alloc.allocate() for _ in range(6)]
    assert got == [
        Net("10.200.0.0/26"),
        Net("10.200.0.64/26"),
        Net("10.100.0.0/27"),
        Net("10.100.0.32/27"),
        Net("10.100.0.64/27"),
        Net("10.100.0.96/27"),
    ]
    with pytest.raises(SubnetsExhausted, match="no subnets available"):
        alloc.allocate()


def test_released_subnet_is_reused_only_after_the_cursor_wraps() -> None:
    alloc = allocator("10.1.0.0/24:6")  # four /26
    a, b, _c = (alloc.allocate() for _ in range(3))
    alloc.release(a)
    assert alloc.allocate() == Net("10.1.0.192/26")  # the cursor moves on first
    assert alloc.allocate() == a  # then wraps to the freed one
    alloc.release(b)
    assert alloc.allocate() == b


def test_marked_subnets_are_skipped_and_outside_ones_remembered() -> None:
    alloc = allocator("10.1.0.0/24:6")
    alloc.mark_allocated(Net("10.1.0.0/26"))
    alloc.mark_allocated(Net("192.168.0.0/24"))  # outside: remembered, no slot used
    alloc.mark_allocated(Net("10.1.0.0/26"))  # idempotent
    assert alloc.is_allocated(Net("192.168.0.0/24"))
    assert alloc.available == 3
    assert alloc.allocate() == Net("10.1.0.64/26")


def test_a_misaligned_mark_blocks_every_slot_it_overlaps() -> None:
    alloc = allocator("10.1.0.0/24:6")
    alloc.mark_allocated(Net("10.1.0.0/25"))  # covers two /26 slots
    assert alloc.available == 2
    assert {alloc.allocate(), alloc.allocate()} == {Net("10.1.0.128/26"), Net("10.1.0.192/26")}
    alloc.release(Net("10.1.0.0/25"))
    assert alloc.available == 2


def test_grow_keeps_marks_and_cursor() -> None:
    alloc = allocator("10.1.0.0/25:6")  # two /26
    first = alloc.allocate()
    alloc.mark_allocated(Net("10.1.0.128/26"))  # outside now, inside after the grow
    alloc.allocate()
    with pytest.raises(SubnetsExhausted):
        alloc.allocate()
    alloc.grow([entry("10.1.0.0/24:6")])
    assert alloc.total == 4 and alloc.available == 1
    assert alloc.allocate() == Net("10.1.0.192/26")
    assert alloc.is_allocated(first)


def test_grow_refuses_a_shrink_or_a_new_length() -> None:
    alloc = allocator("10.1.0.0/24:6")
    with pytest.raises(ValueError, match="only grow"):
        alloc.grow([entry("10.1.0.0/25:6")])
    with pytest.raises(ValueError, match="hostSubnetLength"):
        alloc.grow([entry("10.1.0.0/23:5")])


def test_overlapping_entries_are_refused() -> None:
    with pytest.raises(ValueError, match="overlaps"):
        allocator("10.0.0.0/16:8", "10.0.1.0/24:4")


def test_a_slash_8_of_slash_24s_is_lazy() -> None:
    """Slots are never materialised: memory follows what is used, not the 65,536 slots.
    (How fast it allocates is measured in bench/bench_latencies.py, not asserted here.)"""
    tracemalloc.start()
    try:
        alloc = allocator("10.0.0.0/8:8")
        nets = [alloc.allocate() for _ in range(1000)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert alloc.total == 65536 and alloc.available == 65536 - 1000
    assert nets == [Net(f"10.{i // 256}.{i % 256}.0/24") for i in range(1000)]
    assert peak < 2_000_000  # 1,000 used: ~0.6 MB; a bare set of 65,536 slots is 4 MB more
    # The worst case: everything used but the slot just behind the cursor.
    full = allocator("10.0.0.0/14:8")  # 1024 slots
    nets = [full.allocate() for _ in range(full.total)]
    full.release(nets[0])
    assert full.allocate() == nets[0]
    with pytest.raises(SubnetsExhausted):
        full.allocate()


def test_config_round_trip_and_flags() -> None:
    config = NetworkConfig.default("multitenant")
    obj = config.to_object()
    assert obj["clusterNetworks"] == [{"CIDR": "10.128.0.0/14", "hostSubnetLength": 9}]
    assert obj["serviceNetwork"] == "172.30.0.0/16" and obj["vxlanPort"] == 4789
    assert NetworkConfig.from_object(obj) == config
    assert uses_vnids(config.plugin_name)
    assert parse_cluster_networks(["10.1.0.0/16:8,10.2.0.0/16:8"])[1].cidr == Net("10.2.0.0/16")
    with pytest.raises(ValueError, match="CIDR:hostSubnetLength"):
        parse_cluster_network_flag("10.1.0.0/16")
    with pytest.raises(ValueError, match="does not fit"):
        parse_cluster_network_flag("10.1.0.0/24:9")


def test_change_rules() -> None:
    old = NetworkConfig.default()
    grown = NetworkConfig.from_object(
        {
            **old.to_object(),
            "clusterNetworks": [
                {"CIDR": "10.128.0.0/13", "hostSubnetLength": 9},
                {"CIDR": "10.200.0.0/16", "hostSubnetLength": 8},
            ],
        }
    )
    assert change_errors(old, grown) == []
    shrunk = NetworkConfig.from_object(
        {
            **old.to_object(),
            "clusterNetworks": [
                {"CIDR": "10.128.0.0/15", "hostSubnetLength": 9},
            ],
        }
    )
    assert "only grow" in change_errors(old, shrunk)[0]
    moved = NetworkConfig.from_object({**old.to_object(), "serviceNetwork": "172.31.0.0/16"})
    assert "serviceNetwork" in change_errors(old, moved)[0]


# ---- properties ---------------------------------------------------------------------------

ops = st.lists(st.one_of(st.just("alloc"), st.integers(0, 40)), max_size=120)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_never_a_duplicate_or_overlapping_subnet(script: list[str | int]) -> None:
    alloc = allocator("10.0.0.0/26:3", "10.9.0.0/27:2")  # 8 x /29, then 8 x /30
    held: list[IPv4Network] = []
    for step in script:
        if step == "alloc":
            try:
                held.append(alloc.allocate())
            except SubnetsExhausted:
                assert len(held) == alloc.total
        elif held:
            alloc.release(held.pop(int(step) % len(held)))
        assert alloc.available == alloc.total - len(held)
        for i, left in enumerate(held):
            assert all(not left.overlaps(right) for right in held[i + 1 :])


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 15), st.integers(0, 15))
def test_next_fit_and_wrap_around(count: int, victim: int) -> None:
    alloc = allocator("10.0.0.0/26:2")  # 16 x /30
    got = [alloc.allocate() for _ in range(count)]
    assert got == sorted(got)  # in address order from a fresh cursor
    if victim < count:
        alloc.release(got[victim])
        rest = [alloc.allocate() for _ in range(alloc.available)]
        # every never-used slot comes before the released one
        assert rest[-1] == got[victim]
        assert len(set(rest) | set(got)) == 16
