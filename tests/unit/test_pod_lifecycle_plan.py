"""The node's pod-lifecycle plan (``podnet.agent.orphans``), the IPAM cool-down, and the
status writer's preconditions (a retried write never re-creates a deleted Pod)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

from podnet.agent.orphans import (
    GRACE_OVER,
    ORPHAN,
    KnownPod,
    known_pod,
    local_ips,
    next_deadline,
    plan_lifecycle,
)
from podnet.agent.podstatus import PodRef
from podnet.ipam import cooldown
from podnet.ipam.config import RangeSet, parse_range
from podnet.ipam.cooldown import Cooldown
from podnet.ipam.hostlocal import HostLocalStore

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
WEB, DB, NEW = PodRef("shop", "web"), PodRef("shop", "db"), PodRef("shop", "new")


def never(ref: PodRef) -> bool:
    return False


def test_orphans_and_run_out_graces_are_torn_down_then_finalized() -> None:
    pods = {
        WEB: KnownPod("u-web", NOW - timedelta(seconds=1)),  # grace over
        DB: KnownPod("u-db", NOW + timedelta(seconds=10)),  # terminating, sandbox up
        PodRef("shop", "done"): KnownPod("u-done", NOW + timedelta(seconds=10)),  # no sandbox
        PodRef("shop", "live"): KnownPod("u-live", None),
    }
    attachments = [
        (("c-web", "eth0"), WEB, None),
        (("c-db", "eth0"), DB, None),
        (("c-gone", "eth0"), PodRef("shop", "gone"), None),  # Pod deleted
        (("c-new", "eth0"), NEW, 95.0),  # 5 s old, never seen: its mirror may come
        (("c-old", "eth0"), PodRef("shop", "old"), 10.0),  # 90 s old
    ]
    plan = plan_lifecycle(pods, attachments, NOW, 100.0, never)
    assert plan.teardown == [
        (("c-web", "eth0"), GRACE_OVER),
        (("c-gone", "eth0"), ORPHAN),
        (("c-old", "eth0"), ORPHAN),
    ]
    assert plan.finalize == [(PodRef("shop", "done"), "u-done"), (WEB, "u-web")]
    seen = plan_lifecycle(pods, attachments, NOW, 100.0, never, seen={NEW}.__contains__)
    assert (("c-new", "eth0"), ORPHAN) in seen.teardown  # seen, then deleted: no settling
    pending = plan_lifecycle(pods, attachments, NOW, 100.0, {PodRef("shop", "old")}.__contains__)
    assert (("c-old", "eth0"), ORPHAN) not in pending.teardown
    assert next_deadline(pods.values(), NOW) == NOW + timedelta(seconds=10)


def test_known_pod_and_local_ips() -> None:
    obj: dict[str, Any] = {
        "metadata": {"uid": "u", "deletionTimestamp": "garbage"},
        "status": {"podIP": "10.128.0.5", "podIPs": [{"ip": "10.128.0.5"}, {"ip": "10.1.0.9"}]},
    }
    assert known_pod(obj).deadline is not None and known_pod(obj).deadline < NOW  # unreadable
    assert local_ips(obj, IPv4Network("10.128.0.0/24")) == {IPv4Address("10.128.0.5")}


def test_released_addresses_rest_and_the_record_survives_a_restart(tmp_path: Path) -> None:
    clock = [1000.0]
    path = tmp_path / "cooldown.json"
    rest = Cooldown(path, 30.0, lambda: clock[0])
    rest.released([IPv4Address("10.128.0.2")])
    assert Cooldown(path, 30.0, lambda: clock[0]).resting() == {IPv4Address("10.128.0.2")}
    clock[0] += 31
    assert rest.resting() == set()
    path.write_text("{not json")
    assert Cooldown(path, 30.0, lambda: clock[0]).resting() == set()  # damaged: ignored


def test_the_cooldown_record_is_appended_to_and_compacted(tmp_path: Path) -> None:
    """Each release appends a line (no rewrite of the whole file per CNI DEL); a torn last
    line (a crash mid-write) is skipped; the last line of an address wins; the file is
    rewritten with the live entries once dead lines pass the slack."""
    clock = [1000.0]
    path = tmp_path / "cooldown"
    rest = Cooldown(path, 30.0, lambda: clock[0])
    rest.released([IPv4Address("10.128.0.2")])
    first = path.stat().st_ino
    rest.released([IPv4Address("10.128.0.3")])
    assert path.stat().st_ino == first and len(path.read_text().split()) == 6
    with path.open("a") as handle:
        handle.write("10.128.0.4 1099")  # torn mid-write: its time cut short, no end mark
    clock[0] += 20
    rest.released([IPv4Address("10.128.0.2")])  # again: rests until 1050
    clock[0] += 15  # 1035: .3 (until 1030) has ended, .2 rests
    again = Cooldown(path, 30.0, lambda: clock[0])
    assert again.resting() == {IPv4Address("10.128.0.2")}  # not .4: its line is torn
    for i in range(cooldown.COMPACT_SLACK + 100):
        clock[0] += 1
        again.released([IPv4Address(f"10.129.{i // 250}.{i % 250 + 1}")])
    lines = [line for line in path.read_text().splitlines() if line]
    assert len(lines) < 100  # rewritten: expired and torn lines gone
    assert Cooldown(path, 30.0, lambda: clock[0]).resting() == again.resting()


def test_ipam_skips_resting_addresses_round_robin(tmp_path: Path) -> None:
    store = HostLocalStore(tmp_path / "ipam", "podnet")
    sets = [RangeSet((parse_range({"subnet": "10.128.0.0/29"}, "t"),))]
    first = store.allocate("a", "eth0", sets)[0].address.ip
    store.release("a", "eth0")
    others = {store.allocate(f"x{i}", "eth0", sets, avoid={first})[0].address.ip for i in range(4)}
    assert first not in others and len(others) == 4
    assert store.allocate("y", "eth0", sets)[0].address.ip == first  # rested: free again
    names = {p.name for p in (tmp_path / "ipam" / "podnet").iterdir()}
    assert {n for n in names if not n[0].isdigit()} <= {"lock", "last_reserved_ip.0"}
