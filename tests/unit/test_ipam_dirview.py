"""The store's exact view without reading every file: inotify says what changed."""

from __future__ import annotations

import shutil
from ipaddress import IPv4Address
from pathlib import Path

import pytest

from podnet.ipam import hostlocal
from podnet.ipam.config import RangeSet, parse_ipam_config
from podnet.ipam.dirview import DirWatch
from podnet.ipam.hostlocal import HostLocalStore

WIDE = parse_ipam_config({"ranges": [[{"subnet": "10.2.0.0/23"}]]}).range_sets


def fill(store: HostLocalStore, count: int, sets: tuple[RangeSet, ...] = WIDE) -> None:
    for i in range(count):
        store.allocate(f"c{i}", "eth0", sets)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = hostlocal.read_at

    def counting(dfd: int, name: str) -> str | None:
        seen.append(name)
        return real(dfd, name)

    monkeypatch.setattr(hostlocal, "read_at", counting)
    return seen


def test_release_find_and_listing_read_no_file_when_nothing_changed(
    tmp_path: Path, reads: list[str]
) -> None:
    store = HostLocalStore(tmp_path, "net")
    fill(store, 100)
    reads.clear()
    assert store.release("c7", "eth0") == [IPv4Address("10.2.0.9")]
    assert store.find("c8", "eth0") == [IPv4Address("10.2.0.10")]
    assert len(store.allocations()) == 99
    assert reads == []


def test_what_another_writer_changed_is_read_and_nothing_else(
    tmp_path: Path, reads: list[str]
) -> None:
    store = HostLocalStore(tmp_path, "net")
    fill(store, 50)
    (store.path / "10.2.0.5").write_bytes(b"other\r\neth0")  # c3's, in place, same inode
    (store.path / "10.2.0.6").unlink()
    (store.path / "10.2.0.6").write_bytes(b"c3\r\neth0")  # c4's, freed and reused by c3
    reads.clear()
    assert store.release("c3", "eth0") == [IPv4Address("10.2.0.6")]
    assert sorted(reads) == ["10.2.0.5", "10.2.0.6"]
    assert store.find("other", "eth0") == [IPv4Address("10.2.0.5")]


def test_add_reads_a_name_another_writer_freed_and_reused_and_nothing_else(
    tmp_path: Path, reads: list[str]
) -> None:
    store = HostLocalStore(tmp_path, "net")
    fill(store, 50)
    other = HostLocalStore(tmp_path, "net")
    assert other.release("c3", "eth0") == [IPv4Address("10.2.0.5")]
    other.allocate("new", "eth0", WIDE, requested=[IPv4Address("10.2.0.5")])  # same name
    reads.clear()
    (alloc,) = store.allocate("new", "eth0", WIDE)
    assert alloc.address.ip == IPv4Address("10.2.0.5")  # the pair's own, not a second one
    assert set(reads) == {"10.2.0.5"}


def test_without_inotify_every_file_is_read(
    tmp_path: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def unavailable(path: Path) -> DirWatch:
        raise OSError(24, "no inotify instance left")

    monkeypatch.setattr(hostlocal, "DirWatch", unavailable)
    store = HostLocalStore(tmp_path, "net")
    fill(store, 20)
    (store.path / "10.2.0.5").write_bytes(b"c9\r\neth0")
    reads.clear()
    assert store.release("c9", "eth0") == [IPv4Address("10.2.0.5"), IPv4Address("10.2.0.11")]
    assert len(reads) == 20


def test_a_replaced_directory_is_read_again(tmp_path: Path) -> None:
    store = HostLocalStore(tmp_path, "net")
    fill(store, 5)
    shutil.rmtree(store.path)
    store.path.mkdir()
    (store.path / "10.2.0.9").write_bytes(b"c1\r\neth0")
    assert store.find("c1", "eth0") == [IPv4Address("10.2.0.9")]
    assert store.allocations() == [(IPv4Address("10.2.0.9"), "c1", "eth0")]


def test_the_watch_names_changes_and_notices_its_directory_gone(tmp_path: Path) -> None:
    watch = DirWatch(tmp_path)
    (tmp_path / "a").write_text("x")
    (tmp_path / "b").write_text("y")
    (tmp_path / "a").unlink()
    assert watch.changes() == {"a", "b"}
    assert watch.changes() == set()
    shutil.rmtree(tmp_path)
    assert watch.changes() is None and watch.lost
    watch.close()
