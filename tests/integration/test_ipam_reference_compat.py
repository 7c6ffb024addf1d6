"""HostLocalStore and the reference host-local plugin (Go) sharing one data dir.

The reference binary is run IPAM-only: host-local never enters CNI_NETNS, so any path
will do and no network set-up happens.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from ipaddress import IPv4Address, ip_interface
from pathlib import Path
from typing import Any

import pytest

from podnet.ipam.config import RangeSet, load_ipam_config
from podnet.ipam.hostlocal import HostLocalStore, IpamConflict, IpamExhausted
from podnet.testing import tools

HOST_LOCAL = Path("/usr/lib/cni/host-local")
NETWORK = "compat"


@pytest.fixture(autouse=True)
def _reference_plugin() -> None:
    """The reference plugin is required: a missing one fails these tests, never skips."""
    tools.require("host-local")


V4 = IPv4Address


def netconf(data_dir: Path, ranges: list[list[dict[str, str]]]) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "bridge",
        "ipam": {"type": "host-local", "dataDir": str(data_dir), "ranges": ranges},
    }


def reference(
    command: str, conf: dict[str, Any], cid: str, ifname: str = "eth0", cni_args: str = ""
) -> dict[str, Any]:
    """Run the Go plugin; return its JSON answer plus "rc"."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": "/nonexistent/netns",
        "CNI_IFNAME": ifname,
        "CNI_PATH": str(HOST_LOCAL.parent),
        "CNI_ARGS": cni_args,
    }
    proc = subprocess.run(
        [str(HOST_LOCAL)],
        input=json.dumps(conf),
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
    )
    answer: dict[str, Any] = json.loads(proc.stdout) if proc.stdout.strip() else {}
    answer["rc"] = proc.returncode
    return answer


def ref_add(
    conf: dict[str, Any], cid: str, ifname: str = "eth0", cni_args: str = ""
) -> list[IPv4Address]:
    answer = reference("ADD", conf, cid, ifname, cni_args)
    assert answer["rc"] == 0, answer
    return [V4(str(ip_interface(ip["address"]).ip)) for ip in answer["ips"]]


def ref_del(conf: dict[str, Any], cid: str, ifname: str = "eth0") -> None:
    answer = reference("DEL", conf, cid, ifname)
    assert answer["rc"] == 0, answer


class Side:
    """Our store with the same config the reference gets."""

    def __init__(self, conf: dict[str, Any]) -> None:
        req = load_ipam_config(conf)
        self.sets: tuple[RangeSet, ...] = req.config.range_sets
        self.store = HostLocalStore(req.config.data_dir, req.network)

    def add(
        self, cid: str, ifname: str = "eth0", requested: tuple[IPv4Address, ...] = ()
    ) -> list[IPv4Address]:
        return [a.address.ip for a in self.store.allocate(cid, ifname, self.sets, requested)]


SMALL = [[{"subnet": "10.1.2.0/29"}]]  # usable .2-.6


@pytest.fixture
def conf(tmp_path: Path) -> dict[str, Any]:
    return netconf(tmp_path, SMALL)


def reservations(tmp_path: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in (tmp_path / NETWORK).iterdir()
        if p.name != "lock" and not p.name.startswith("last_reserved_ip.")
    }


def test_same_file_format(tmp_path: Path, conf: dict[str, Any]) -> None:
    ours = Side(conf)
    (theirs,) = ref_add(conf, "ref-1")
    (mine,) = ours.add("pod-1")
    files = reservations(tmp_path)
    assert files == {str(theirs): b"ref-1\r\neth0", str(mine): b"pod-1\r\neth0"}
    assert stat.S_IMODE((tmp_path / NETWORK / str(mine)).stat().st_mode) == 0o600
    assert (tmp_path / NETWORK / "last_reserved_ip.0").read_bytes() == str(mine).encode()


def test_cursor_is_shared_and_order_is_identical(tmp_path: Path) -> None:
    conf = netconf(tmp_path, [[{"subnet": "10.1.2.0/28", "gateway": "10.1.2.5"}]])
    ours = Side(conf)
    got = []
    for i in range(6):
        got += ref_add(conf, f"ref-{i}")
        got += ours.add(f"pod-{i}")
    expected = [V4(f"10.1.2.{n}") for n in [1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13]]
    assert got == expected  # one sequence, gateway .5 skipped by both
    assert (tmp_path / NETWORK / "last_reserved_ip.0").read_text() == "10.1.2.13"


def test_neither_side_hands_out_the_others_addresses(tmp_path: Path, conf: dict[str, Any]) -> None:
    ours = Side(conf)
    theirs = ref_add(conf, "ref-1") + ref_add(conf, "ref-2")
    mine = ours.add("pod-1") + ours.add("pod-2") + ours.add("pod-3")
    assert not set(theirs) & set(mine)
    with pytest.raises(IpamExhausted) as err:
        ours.add("pod-4")
    answer = reference("ADD", conf, "ref-3")
    assert answer["rc"] != 0
    assert answer["msg"] == f"failed to allocate for range 0: {err.value}"
    assert len(reservations(tmp_path)) == 5


def test_del_by_either_side_frees_the_others_allocation(
    tmp_path: Path, conf: dict[str, Any]
) -> None:
    ours = Side(conf)
    (mine,) = ours.add("pod-1")
    ref_del(conf, "pod-1")
    assert str(mine) not in reservations(tmp_path)
    assert ours.store.allocations() == []
    (theirs,) = ref_add(conf, "ref-1")
    assert ours.store.release("ref-1", "eth0") == [theirs]
    assert reservations(tmp_path) == {}
    assert ref_add(conf, "ref-1", cni_args=f"IP={theirs}") == [
        theirs
    ]  # free again for the reference


def test_reference_del_of_unknown_and_our_release_twice(conf: dict[str, Any]) -> None:
    ours = Side(conf)
    ours.add("pod-1")
    ref_del(conf, "pod-1")
    ref_del(conf, "pod-1")
    assert ours.store.release("pod-1", "eth0") == []


def test_requested_ips_conflict_across_sides(conf: dict[str, Any]) -> None:
    ours = Side(conf)
    (theirs,) = ref_add(conf, "ref-1", cni_args="IgnoreUnknown=1;IP=10.1.2.4")
    assert theirs == V4("10.1.2.4")
    with pytest.raises(IpamConflict, match=re.escape("10.1.2.4 is not available")):
        ours.add("pod-1", requested=(theirs,))
    (mine,) = ours.add("pod-1", requested=(V4("10.1.2.6"),))
    answer = reference("ADD", conf, "ref-2", cni_args=f"IP={mine}")
    assert answer["rc"] != 0
    assert (
        "requested IP address 10.1.2.6 is not available in range set 10.1.2.1-10.1.2.6"
        in answer["msg"]
    )


def test_each_side_recognises_the_others_reservation_for_a_pair(conf: dict[str, Any]) -> None:
    ours = Side(conf)
    (mine,) = ours.add("pod-1")
    answer = reference("ADD", conf, "pod-1")
    assert answer["rc"] != 0 and "duplicate allocation is not allowed" in answer["msg"]
    (theirs,) = ref_add(conf, "ref-1")
    assert ours.add("ref-1") == [theirs]  # our idempotent re-ADD adopts the reference's file
    assert ours.store.find("pod-1", "eth0") == [mine]


def test_two_range_sets_share_both_cursors(tmp_path: Path) -> None:
    conf = netconf(tmp_path, [[{"subnet": "10.1.2.0/29"}], [{"subnet": "10.1.3.0/29"}]])
    ours = Side(conf)
    assert ref_add(conf, "ref-1") == [V4("10.1.2.2"), V4("10.1.3.2")]
    assert ours.add("pod-1") == [V4("10.1.2.3"), V4("10.1.3.3")]
    assert ref_add(conf, "ref-2") == [V4("10.1.2.4"), V4("10.1.3.4")]
    ref_del(conf, "pod-1")
    assert ours.store.allocations() == [
        (V4("10.1.2.2"), "ref-1", "eth0"),
        (V4("10.1.2.4"), "ref-2", "eth0"),
        (V4("10.1.3.2"), "ref-1", "eth0"),
        (V4("10.1.3.4"), "ref-2", "eth0"),
    ]


def test_concurrent_reference_processes_and_our_threads(tmp_path: Path) -> None:
    conf = netconf(tmp_path, [[{"subnet": "10.4.0.0/26"}]])
    ours = Side(conf)
    start = threading.Barrier(24)

    def theirs(i: int) -> tuple[str, IPv4Address]:
        start.wait()
        (ip,) = ref_add(conf, f"ref-{i}")
        return f"ref-{i}", ip

    def mine(i: int) -> tuple[str, IPv4Address]:
        start.wait()
        (ip,) = ours.add(f"pod-{i}")
        return f"pod-{i}", ip

    with ThreadPoolExecutor(24) as pool:
        futures = [pool.submit(theirs, i) for i in range(12)] + [
            pool.submit(mine, i) for i in range(12)
        ]
        got = dict(f.result(timeout=60) for f in futures)
    assert len(set(got.values())) == 24
    files = reservations(tmp_path)
    assert files == {str(ip): f"{cid}\r\neth0".encode() for cid, ip in got.items()}
    assert sorted(ip for ip, _, _ in ours.store.allocations()) == sorted(got.values())


def test_legacy_id_only_files_mean_the_same_to_both(tmp_path: Path, conf: dict[str, Any]) -> None:
    ours = Side(conf)
    ours.add("pod-1")  # creates the directory
    (tmp_path / NETWORK / "10.1.2.5").write_text("old-1")
    (tmp_path / NETWORK / "10.1.2.6").write_text("old-2")
    answer = reference("ADD", conf, "old-1")
    assert answer["rc"] != 0 and "10.1.2.5 has been allocated to old-1" in answer["msg"]
    assert ours.add("old-1") == [V4("10.1.2.5")]
    ref_del(conf, "old-2", "eth9")
    assert ours.store.release("old-1", "eth0") == [V4("10.1.2.5")]
    assert sorted(reservations(tmp_path)) == ["10.1.2.2"]
