"""VnidAllocator: the range, next-fit, reference counts, exhaustion."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podnet.controllers.vnids import (
    GLOBAL_VNID,
    MAX_VNID,
    MIN_VNID,
    VnidAllocator,
    VnidsExhausted,
)


def test_range_starts_at_10_and_skips_global_and_reserved() -> None:
    alloc = VnidAllocator()
    assert [alloc.allocate() for _ in range(3)] == [10, 11, 12]
    assert MIN_VNID == 10 and MAX_VNID == 2**24 - 1 and GLOBAL_VNID == 0
    alloc.mark(GLOBAL_VNID)
    alloc.mark(5)
    assert alloc.available == MAX_VNID - MIN_VNID + 1 - 3  # global/reserved use no range slot


def test_refcounts_free_only_at_zero() -> None:
    alloc = VnidAllocator()
    vnid = alloc.allocate()
    alloc.mark(vnid)  # a second namespace joins
    assert alloc.users(vnid) == 2
    assert alloc.release(vnid) is False
    assert alloc.release(vnid) is True
    assert alloc.users(vnid) == 0
    assert alloc.release(vnid) is False  # unknown: nothing to do


def test_next_fit_reuses_only_after_wrap_and_exhausts() -> None:
    alloc = VnidAllocator(10, 13)
    assert [alloc.allocate() for _ in range(3)] == [10, 11, 12]
    alloc.release(10)
    assert alloc.allocate() == 13
    assert alloc.allocate() == 10
    with pytest.raises(VnidsExhausted, match="no VNIDs available"):
        alloc.allocate()


def test_marked_vnids_are_skipped() -> None:
    alloc = VnidAllocator()
    alloc.mark(10)
    alloc.mark(11)
    assert alloc.allocate() == 12


def test_the_top_of_the_range_wraps_to_the_bottom() -> None:
    fresh = VnidAllocator(MAX_VNID - 1, MAX_VNID)
    assert fresh.allocate() == MAX_VNID - 1
    assert fresh.allocate() == MAX_VNID
    fresh.release(MAX_VNID - 1)
    assert fresh.allocate() == MAX_VNID - 1


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(st.just("new"), st.tuples(st.sampled_from("jr"), st.integers(0, 30))),
        max_size=100,
    )
)
def test_refcounts_match_a_model(script: list[object]) -> None:
    """Allocate, join (mark) and release in any order; counts equal a simple model."""
    alloc = VnidAllocator(10, 17)
    users: dict[int, int] = {}
    for step in script:
        if step == "new":
            try:
                vnid = alloc.allocate()
            except VnidsExhausted:
                assert len(users) == 8
                continue
            assert vnid not in users
            users[vnid] = 1
        elif users:
            assert isinstance(step, tuple)
            vnid = sorted(users)[step[1] % len(users)]
            if step[0] == "j":
                alloc.mark(vnid)
                users[vnid] += 1
            else:
                freed = alloc.release(vnid)
                users[vnid] -= 1
                assert freed == (users[vnid] == 0)
                if not users[vnid]:
                    del users[vnid]
        assert alloc.available == 8 - len(users)
        assert all(alloc.users(v) == n for v, n in users.items())
