"""HostLocalStore: allocation order, files on disk, release, locking and concurrency."""

from __future__ import annotations

import fcntl
import itertools
import multiprocessing
import os
import re
import stat
import threading
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv4Interface
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from podnet.ipam import hostlocal
from podnet.ipam.config import IpamConfigError, IpamError, RangeSet, parse_ipam_config
from podnet.ipam.hostlocal import Allocation, HostLocalStore, IpamConflict, IpamExhausted
from podnet.ipam.reservations import IpamArgumentError, IpamLockTimeout

V4 = IPv4Address


def sets(*range_sets: list[dict[str, str]]) -> tuple[RangeSet, ...]:
    return parse_ipam_config({"ranges": list(range_sets)}).range_sets


SMALL = sets([{"subnet": "10.1.2.0/29"}])  # usable .2-.6, gateway .1


@pytest.fixture
def store(tmp_path: Path) -> HostLocalStore:
    return HostLocalStore(tmp_path, "net")


def one(store: HostLocalStore, cid: str, ifname: str = "eth0", rs: Any = SMALL, **kw: Any) -> str:
    (alloc,) = store.allocate(cid, ifname, rs, **kw)
    return str(alloc.address.ip)


def on_disk(store: HostLocalStore) -> dict[str, bytes]:
    skip = {"lock"}
    return {
        p.name: p.read_bytes()
        for p in store.path.iterdir()
        if p.name not in skip and not p.name.startswith("last_reserved_ip.")
    }


def cursor(store: HostLocalStore, index: int = 0) -> str:
    return (store.path / f"last_reserved_ip.{index}").read_text()


# --- order and layout --------------------------------------------------------------


def test_round_robin_skips_gateway_and_writes_reference_layout(store: HostLocalStore) -> None:
    allocs = store.allocate("c1", "eth0", SMALL)
    assert allocs == [Allocation(IPv4Interface("10.1.2.2/29"), V4("10.1.2.1"), 0)]
    assert [one(store, f"c{i}") for i in range(2, 6)] == [
        "10.1.2.3",
        "10.1.2.4",
        "10.1.2.5",
        "10.1.2.6",
    ]
    path = store.path / "10.1.2.2"
    assert path.read_bytes() == b"c1\r\neth0"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert cursor(store) == "10.1.2.6"
    assert (store.path / "lock").exists()
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o755


def test_round_robin_continues_from_cursor_not_lowest_free(store: HostLocalStore) -> None:
    for i in range(3):
        one(store, f"c{i}")  # .2 .3 .4
    store.release("c0", "eth0")  # .2 free, cursor still .4
    assert one(store, "d1") == "10.1.2.5"
    assert one(store, "d2") == "10.1.2.6"
    assert one(store, "d3") == "10.1.2.2"  # wrapped around past the end


def test_wrap_around_tries_the_cursor_itself_last(store: HostLocalStore) -> None:
    names = [one(store, f"c{i}") for i in range(5)]
    store.release("c4", "eth0")  # frees .6, which is also the cursor
    assert names[-1] == cursor(store) == "10.1.2.6"
    assert one(store, "again") == "10.1.2.6"


def test_cursor_outside_the_set_restarts_at_range_start(store: HostLocalStore) -> None:
    store.path.mkdir(parents=True)
    (store.path / "last_reserved_ip.0").write_text("192.168.9.9")
    assert one(store, "c") == "10.1.2.2"
    (store.path / "last_reserved_ip.0").write_text("garbage")
    assert one(store, "d") == "10.1.2.3"


def test_range_start_end_and_gateway_in_the_middle(store: HostLocalStore) -> None:
    rs = sets(
        [
            {
                "subnet": "10.1.2.0/24",
                "rangeStart": "10.1.2.10",
                "rangeEnd": "10.1.2.13",
                "gateway": "10.1.2.11",
            }
        ]
    )
    got = [one(store, f"c{i}", rs=rs) for i in range(3)]
    assert got == ["10.1.2.10", "10.1.2.12", "10.1.2.13"]
    with pytest.raises(IpamExhausted):
        store.allocate("c9", "eth0", rs)


def test_network_and_broadcast_never_handed_out(store: HostLocalStore) -> None:
    rs = sets(
        [
            {
                "subnet": "10.1.2.0/30",
                "rangeStart": "10.1.2.0",
                "rangeEnd": "10.1.2.3",
                "gateway": "10.1.2.2",
            }
        ]
    )
    assert one(store, "a", rs=rs) == "10.1.2.1"
    with pytest.raises(IpamExhausted):
        store.allocate("b", "eth0", rs)


def test_exhaustion_message_matches_the_reference(store: HostLocalStore) -> None:
    for i in range(5):
        one(store, f"c{i}")
    with pytest.raises(IpamExhausted) as err:
        store.allocate("late", "eth0", SMALL)
    assert str(err.value) == "no IP addresses available in range set: 10.1.2.1-10.1.2.6"
    assert err.value.range_set_index == 0
    assert len(on_disk(store)) == 5


def test_one_address_per_range_set_with_separate_cursors(store: HostLocalStore) -> None:
    rs = sets([{"subnet": "10.1.2.0/29"}], [{"subnet": "10.1.3.0/29"}, {"subnet": "10.1.4.0/30"}])
    allocs = store.allocate("c", "eth0", rs)
    assert allocs == [
        Allocation(IPv4Interface("10.1.2.2/29"), V4("10.1.2.1"), 0),
        Allocation(IPv4Interface("10.1.3.2/29"), V4("10.1.3.1"), 1),
    ]
    assert (cursor(store, 0), cursor(store, 1)) == ("10.1.2.2", "10.1.3.2")


def test_all_or_nothing_rolls_back_this_calls_files(store: HostLocalStore) -> None:
    rs = sets([{"subnet": "10.1.2.0/29"}], [{"subnet": "10.1.3.0/30"}])  # set 1 holds only .2
    one(store, "owner", rs=sets([{"subnet": "10.1.3.0/30"}]))
    before = on_disk(store)
    with pytest.raises(IpamExhausted) as err:
        store.allocate("c", "eth0", rs)
    assert err.value.range_set_index == 1
    assert str(err.value) == "no IP addresses available in range set: 10.1.3.1-10.1.3.2"
    assert on_disk(store) == before


# --- requested IPs -------------------------------------------------------------------


def test_requested_ip_is_reserved_and_moves_the_cursor(store: HostLocalStore) -> None:
    assert one(store, "a", requested=[V4("10.1.2.5")]) == "10.1.2.5"
    assert cursor(store) == "10.1.2.5"
    assert one(store, "b") == "10.1.2.6"


def test_requested_ip_taken_is_a_conflict(store: HostLocalStore) -> None:
    one(store, "a")
    with pytest.raises(
        IpamConflict,
        match=re.escape(
            "requested IP address 10.1.2.2 is not available in range set 10.1.2.1-10.1.2.6"
        ),
    ):
        store.allocate("b", "eth0", SMALL, requested=[V4("10.1.2.2")])
    with pytest.raises(IpamConflict, match="gateway"):
        store.allocate("b", "eth0", SMALL, requested=[V4("10.1.2.1")])
    assert list(on_disk(store)) == ["10.1.2.2"]


def test_requested_ip_out_of_range_or_twice_in_one_set(store: HostLocalStore) -> None:
    with pytest.raises(
        IpamConfigError,
        match=r"requested IP 10.9.9.9 is not in any range set \(10.1.2.1-10.1.2.6\)",
    ):
        store.allocate("b", "eth0", SMALL, requested=[V4("10.9.9.9")])
    with pytest.raises(IpamConfigError, match="both in range set 0"):
        store.allocate("b", "eth0", SMALL, requested=[V4("10.1.2.3"), V4("10.1.2.4")])
    assert not store.path.exists()  # refused before touching the disk


def test_requested_ip_failure_in_second_set_rolls_back_first(store: HostLocalStore) -> None:
    rs = sets([{"subnet": "10.1.2.0/29"}], [{"subnet": "10.1.3.0/29"}])
    one(store, "x", rs=sets([{"subnet": "10.1.3.0/29"}]), requested=[V4("10.1.3.4")])
    with pytest.raises(IpamConflict):
        store.allocate("c", "eth0", rs, requested=[V4("10.1.3.4")])
    assert list(on_disk(store)) == ["10.1.3.4"]


# --- idempotent re-ADD ---------------------------------------------------------------


def test_re_add_returns_the_same_address(store: HostLocalStore) -> None:
    first = store.allocate("c", "eth0", SMALL)
    assert store.allocate("c", "eth0", SMALL) == first
    assert store.allocate("c", "eth0", SMALL, requested=[V4("10.1.2.2")]) == first
    assert list(on_disk(store)) == ["10.1.2.2"]
    assert one(store, "c", "eth1") == "10.1.2.3"  # another interface is another attachment
    with pytest.raises(IpamConflict, match=re.escape("already holds 10.1.2.2")):
        store.allocate("c", "eth0", SMALL, requested=[V4("10.1.2.5")])


def test_re_add_sees_reservations_made_by_another_store(tmp_path: Path) -> None:
    ours, theirs = HostLocalStore(tmp_path, "net"), HostLocalStore(tmp_path, "net")
    one(ours, "warm-up")
    ip = one(theirs, "c")
    assert one(ours, "c") == ip
    assert one(ours, "next") == "10.1.2.4"  # and it skipped theirs


def test_a_stale_view_never_returns_someone_elses_address(store: HostLocalStore) -> None:
    one(store, "c")  # 10.1.2.2 owned by c in the store's view
    # Replace the owner in place (same inode): a listing cannot see this.
    (store.path / "10.1.2.2").write_bytes(b"other\r\neth0")
    assert one(store, "c") == "10.1.2.3"
    assert store.find("other", "eth0") == [V4("10.1.2.2")]


@pytest.fixture(params=[True, False], ids=["inotify", "no-inotify"])
def inotify(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Run with the inotify view, or as a store does when it gets no inotify instance."""
    if not request.param:

        def unavailable(path: Path) -> Any:
            raise OSError(24, "no inotify instance left")

        monkeypatch.setattr(hostlocal, "DirWatch", unavailable)
    return bool(request.param)


def test_re_add_sees_a_reservation_rewritten_in_place(tmp_path: Path, inotify: bool) -> None:
    store = HostLocalStore(tmp_path, "net")
    one(store, "a")
    (store.path / "10.1.2.2").write_bytes(b"c\r\neth0")  # same inode, now c's
    assert one(store, "c") == "10.1.2.2"  # c's own address, not a second one
    assert store.release("c", "eth0") == [V4("10.1.2.2")]
    assert on_disk(store) == {}


def test_re_add_sees_a_name_another_store_freed_and_reused(tmp_path: Path, inotify: bool) -> None:
    ours, theirs = HostLocalStore(tmp_path, "net"), HostLocalStore(tmp_path, "net")
    for i in range(5):
        one(ours, f"c{i}")  # .2-.6: full, and ours has seen .2 as c0's
    assert theirs.release("c0", "eth0") == [V4("10.1.2.2")]
    assert one(theirs, "x", requested=[V4("10.1.2.2")]) == "10.1.2.2"  # same name, now x's
    assert one(ours, "x") == "10.1.2.2"  # x's own address: not exhausted, not a second one
    with pytest.raises(IpamExhausted):
        ours.allocate("c0", "eth0", SMALL)  # c0 holds nothing any more
    assert ours.find("x", "eth0") == [V4("10.1.2.2")]


# --- release, find, allocations ------------------------------------------------------


def test_release_frees_and_is_idempotent(store: HostLocalStore) -> None:
    one(store, "a")
    one(store, "b")
    one(store, "a", "eth1")
    assert store.find("a", "eth0") == [V4("10.1.2.2")]
    assert store.release("a", "eth0") == [V4("10.1.2.2")]
    assert store.release("a", "eth0") == []
    assert store.release("never", "eth0") == []
    assert store.find("a", "eth0") == []
    assert sorted(on_disk(store)) == ["10.1.2.3", "10.1.2.4"]


def test_release_removes_every_file_of_the_pair(store: HostLocalStore) -> None:
    rs = sets([{"subnet": "10.1.2.0/29"}], [{"subnet": "10.1.3.0/29"}])
    store.allocate("a", "eth0", rs)
    assert store.release("a", "eth0") == [V4("10.1.2.2"), V4("10.1.3.2")]
    assert on_disk(store) == {}


def test_legacy_id_only_files(store: HostLocalStore) -> None:
    store.path.mkdir(parents=True)
    (store.path / "10.1.2.5").write_text("old\n")
    (store.path / "10.1.2.6").write_text("both")
    assert one(store, "both") == "10.1.2.6"  # a legacy reservation is the container's
    (store.path / "10.1.2.3").write_bytes(b"both\r\neth0")
    assert store.allocations() == [
        (V4("10.1.2.3"), "both", "eth0"),
        (V4("10.1.2.5"), "old", ""),
        (V4("10.1.2.6"), "both", ""),
    ]
    assert store.find("both", "eth0") == [V4("10.1.2.3")]  # exact match wins, as in the reference
    assert store.find("old", "eth0") == [V4("10.1.2.5")]
    assert store.release("old", "eth7") == [V4("10.1.2.5")]
    assert store.release("both", "eth0") == [V4("10.1.2.3")]
    assert store.release("both", "eth0") == [V4("10.1.2.6")]  # then the legacy one
    assert on_disk(store) == {}


def test_legacy_files_release_by_the_ifname_allocations_reports(store: HostLocalStore) -> None:
    one(store, "c", "eth1")
    (store.path / "10.1.2.5").write_text("c")
    (ip, cid, ifname) = store.allocations()[1]
    assert (ip, cid, ifname) == (V4("10.1.2.5"), "c", "")
    assert store.release(cid, ifname) == [ip]
    assert store.find("c", "eth1") == [V4("10.1.2.2")]
    with pytest.raises(IpamArgumentError):
        store.allocate("c", "", SMALL)


def test_allocations_skip_lock_cursor_and_foreign_names(store: HostLocalStore) -> None:
    one(store, "a")
    (store.path / "fd00::5").write_bytes(b"v6\r\neth0")
    (store.path / "subdir").mkdir()
    assert store.allocations() == [(V4("10.1.2.2"), "a", "eth0")]
    assert store.release("v6", "eth0") == []  # not IPv4, but the file is released
    assert not (store.path / "fd00::5").exists()


@pytest.mark.parametrize(
    ("cid", "ifname"), [("", "eth0"), ("a b", "eth0"), (" ", ""), ("a", "et h0"), ("a", "e\r\n")]
)
def test_bad_container_id_or_ifname(store: HostLocalStore, cid: str, ifname: str) -> None:
    with pytest.raises(IpamArgumentError):
        store.allocate(cid, ifname, SMALL)
    with pytest.raises(IpamError):
        store.release(cid, ifname)


def test_ipv6_range_set_is_refused(store: HostLocalStore) -> None:
    with pytest.raises(IpamConfigError, match="IPv6"):
        store.allocate("a", "eth0", sets([{"subnet": "fd00::/64"}]))
    with pytest.raises(IpamConfigError, match="no range sets"):
        store.allocate("a", "eth0", ())


def test_bad_network_name(tmp_path: Path) -> None:
    with pytest.raises(IpamConfigError):
        HostLocalStore(tmp_path, "../x")


# --- locking -------------------------------------------------------------------------


@pytest.fixture
def held_flock(store: HostLocalStore) -> Iterator[int]:
    store.path.mkdir(parents=True)
    fd = os.open(store.path / "lock", os.O_RDONLY | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield fd
    finally:
        os.close(fd)


def test_operations_wait_for_the_flock(store: HostLocalStore, held_flock: int) -> None:
    done = threading.Event()

    def add() -> None:
        one(store, "a")
        done.set()

    worker = threading.Thread(target=add)
    worker.start()
    assert not done.wait(0.3)  # blocked by the flock another holder has
    assert on_disk(store) == {}
    fcntl.flock(held_flock, fcntl.LOCK_UN)
    assert done.wait(5)
    worker.join()
    assert list(on_disk(store)) == ["10.1.2.2"]


def test_lock_timeout(tmp_path: Path, held_flock: int) -> None:
    quick = HostLocalStore(tmp_path, "net", lock_timeout=0.1)
    with pytest.raises(IpamLockTimeout, match="timed out waiting for the flock"):
        quick.allocate("a", "eth0", SMALL)


# --- speed: ADD must not re-read existing reservations -------------------------------


def test_add_reads_only_new_files(store: HostLocalStore, monkeypatch: pytest.MonkeyPatch) -> None:
    rs = sets([{"subnet": "10.2.0.0/23"}])
    for i in range(300):
        one(store, f"c{i}", rs=rs)
    reads: list[str] = []
    real = hostlocal.read_at

    def counting(dfd: int, name: str) -> str | None:
        reads.append(name)
        return real(dfd, name)

    monkeypatch.setattr(hostlocal, "read_at", counting)
    one(store, "new", rs=rs)
    assert reads == ["last_reserved_ip.0"]
    HostLocalStore(store.path.parent, "net").allocate("other", "eth0", rs)  # another writer
    reads.clear()
    one(store, "new2", rs=rs)
    assert reads == ["10.2.1.47", "last_reserved_ip.0"]  # just the newcomer, then the cursor


# --- concurrency ---------------------------------------------------------------------


WIDE = sets([{"subnet": "10.3.0.0/24"}])


def assert_consistent(store: HostLocalStore, ips: list[str], owners: set[str]) -> None:
    assert len(ips) == len(set(ips))
    disk = on_disk(store)
    assert sorted(disk) == sorted(ips)
    assert {v.decode() for v in disk.values()} == {f"{o}\r\neth0" for o in owners}


@pytest.mark.parametrize("shared", [True, False], ids=["one-store", "store-per-thread"])
def test_fifty_threads_get_distinct_addresses(tmp_path: Path, shared: bool) -> None:
    common = HostLocalStore(tmp_path, "net")
    barrier = threading.Barrier(50)
    got: dict[str, str] = {}

    def work(n: int) -> None:
        st_ = common if shared else HostLocalStore(tmp_path, "net")
        barrier.wait()
        got[f"t{n}"] = one(st_, f"t{n}", rs=WIDE)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(got) == 50
    assert_consistent(common, list(got.values()), set(got))
    assert sorted(got.values(), key=V4) == [f"10.3.0.{i}" for i in range(2, 52)]


def _process_worker(data_dir: str, worker: int, count: int, barrier: Any, results: Any) -> None:
    store = HostLocalStore(Path(data_dir), "net")
    rs = sets([{"subnet": "10.3.0.0/24"}])
    barrier.wait()
    for k in range(count):
        cid = f"p{worker}-{k}"
        (alloc,) = store.allocate(cid, "eth0", rs)
        results.put((cid, str(alloc.address.ip)))
        if k % 5 == 4:
            store.release(f"p{worker}-{k - 1}", "eth0")
            results.put((f"p{worker}-{k - 1}", None))


def test_four_processes_get_distinct_addresses(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    procs = [
        ctx.Process(target=_process_worker, args=(str(tmp_path), w, 40, barrier, results))
        for w in range(4)
    ]
    for p in procs:
        p.start()
    events = [results.get(timeout=60) for _ in range(4 * (40 + 8))]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    live: dict[str, str] = {}
    for cid, ip in events:
        if ip is None:
            del live[cid]
        else:
            assert ip not in live.values(), f"{ip} handed out twice"
            live[cid] = ip
    store = HostLocalStore(tmp_path, "net")
    assert len(live) == 4 * 32
    assert_consistent(store, list(live.values()), set(live))


def _allocate_in_child(store: HostLocalStore) -> None:
    store.allocate("forked", "eth0", SMALL)


def test_fork_while_a_thread_holds_the_store(store: HostLocalStore) -> None:
    ctx = multiprocessing.get_context("fork")
    with store._mutex:  # as if another thread were mid-operation when the fork happens
        child = ctx.Process(target=_allocate_in_child, args=(store,))
        child.start()
        child.join(20)
    assert child.exitcode == 0
    assert store.find("forked", "eth0") == [V4("10.1.2.2")]


# --- property: any sequence of operations keeps disk and model in step ---------------

MIXED = sets([{"subnet": "10.0.0.0/29"}, {"subnet": "10.0.1.0/30"}])  # 6 usable, two ranges
USABLE = [IPv4Address(int(ip)) for ip, _ in MIXED[0].candidates(None)]
OWNERS = st.tuples(st.sampled_from("abcdefgh"), st.sampled_from(["eth0", "eth1"]))


class StoreMachine(RuleBasedStateMachine):
    """Two stores on one directory (as two processes would be) against a simple model."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.stores = [HostLocalStore(root, "net"), HostLocalStore(root, "net")]
        self.model: dict[IPv4Address, tuple[str, str]] = {}
        self.last: IPv4Address | None = None

    def held(self, owner: tuple[str, str]) -> IPv4Address | None:
        return next((ip for ip, o in self.model.items() if o == owner), None)

    def expected_next(self) -> IPv4Address | None:
        order = (IPv4Address(int(ip)) for ip, _ in MIXED[0].candidates(self.last))
        return next((ip for ip in order if ip not in self.model), None)

    @rule(owner=OWNERS, which=st.integers(0, 1))
    def allocate(self, owner: tuple[str, str], which: int) -> None:
        held, expected = self.held(owner), self.expected_next()
        try:
            (alloc,) = self.stores[which].allocate(*owner, MIXED)
        except IpamExhausted:
            assert held is None and expected is None
            return
        ip = alloc.address.ip
        if held is not None:
            assert ip == held
            return
        assert ip == expected  # exact round-robin order
        self.model[ip], self.last = owner, ip

    @rule(owner=OWNERS, ip=st.sampled_from(USABLE), which=st.integers(0, 1))
    def allocate_requested(self, owner: tuple[str, str], ip: IPv4Address, which: int) -> None:
        held = self.held(owner)
        try:
            (alloc,) = self.stores[which].allocate(*owner, MIXED, requested=[ip])
        except IpamConflict:
            assert (held is not None and held != ip) or (held is None and ip in self.model)
            return
        assert alloc.address.ip == ip
        assert held in (None, ip)
        if held is None:
            assert ip not in self.model
            self.model[ip], self.last = owner, ip

    @rule(owner=OWNERS, which=st.integers(0, 1))
    def release(self, owner: tuple[str, str], which: int) -> None:
        freed = self.stores[which].release(*owner)
        assert freed == sorted(ip for ip, o in self.model.items() if o == owner)
        for ip in freed:
            del self.model[ip]

    @invariant()
    def disk_matches_model(self) -> None:
        store = self.stores[0]
        if not store.path.exists():
            return
        expected = {str(ip): f"{c}\r\n{i}".encode() for ip, (c, i) in self.model.items()}
        assert on_disk(store) == expected
        assert self.stores[1].allocations() == sorted(
            (ip, c, i) for ip, (c, i) in self.model.items()
        )


def test_state_machine(tmp_path: Path, inotify: bool) -> None:
    counter = itertools.count()

    class Machine(StoreMachine):
        def __init__(self) -> None:
            super().__init__(tmp_path / f"run{next(counter)}")

    run_state_machine_as_test(
        Machine,
        settings=settings(max_examples=60, stateful_step_count=40, deadline=None),
    )
