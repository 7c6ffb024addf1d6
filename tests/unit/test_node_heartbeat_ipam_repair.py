"""Unit tests for issue 8's node-side crash safety: atomic reservation files, damaged-file
repair, GC's attachment list, the Lease heartbeat objects, and node lifecycle decisions.
(The real-process tests are in tests/integration/test_node_crash_safety.py.)"""

from __future__ import annotations

import os
from ipaddress import IPv4Address, IPv4Interface
from pathlib import Path
from typing import Any

import pytest

from podnet.agent.heartbeat import lease_object, micro_time, renewed
from podnet.agent.ipamrepair import plan_repairs, repair_damaged
from podnet.api.registry import Registry
from podnet.cni.types import CniError, parse_network_config
from podnet.controllers.inprocess import InProcessApi
from podnet.controllers.nodelifecycle import (
    REASON_UNKNOWN,
    NodeLifecycleController,
    ready_condition,
    ready_transition,
    with_ready,
)
from podnet.dataplane.interface import PodAttachment
from podnet.ipam import atomic
from podnet.ipam.config import parse_ipam_config
from podnet.ipam.hostlocal import HostLocalStore
from podnet.ipam.reservations import well_formed
from podnet.model.kinds import LEASE, NAMESPACE, NODE
from podnet.model.schemas_coordination import NODE_LEASE_NAMESPACE
from podnet.model.validation import validate
from podnet.store.memory import MemoryStore
from podnet.testing.e2e import eventually

SETS = parse_ipam_config({"ranges": [[{"subnet": "10.1.2.0/29"}]]}).range_sets
V4 = IPv4Address


# ---- IPAM files ---------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> HostLocalStore:
    return HostLocalStore(tmp_path, "net")


@pytest.mark.parametrize("tmpfile", [True, False], ids=["O_TMPFILE", "named-temp"])
def test_reservations_are_created_whole_and_exclusive(
    store: HostLocalStore, monkeypatch: pytest.MonkeyPatch, tmpfile: bool
) -> None:
    if not tmpfile:
        monkeypatch.setattr(atomic, "_O_TMPFILE", 0)
    (a,) = store.allocate("a", "eth0", SETS)
    assert (store.path / str(a.address.ip)).read_bytes() == b"a\r\neth0"
    assert os.stat(store.path / str(a.address.ip)).st_mode & 0o777 == 0o600
    dfd = os.open(store.path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert not atomic.create_exclusive(dfd, str(a.address.ip), b"other\r\neth0")
    finally:
        os.close(dfd)
    assert (store.path / str(a.address.ip)).read_bytes() == b"a\r\neth0"
    assert not [p for p in store.path.iterdir() if p.name.startswith(atomic.TEMP_PREFIX)]


def test_a_write_failing_midway_leaves_no_reservation(
    store: HostLocalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def torn(fd: int, data: bytes, mode: int) -> None:
        os.write(fd, data[:1])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic, "_write_all", torn)
    with pytest.raises(OSError):
        store.allocate("a", "eth0", SETS)
    assert sorted(p.name for p in store.path.iterdir() if p.name[0].isdigit()) == []


@pytest.mark.parametrize("text", ["", "   ", "a b\r\neth0", "a\r\net h0", "\x00 \x01"])
def test_damaged_files_are_listed_apart_and_never_reused(store: HostLocalStore, text: str) -> None:
    assert not well_formed(text)
    store.path.mkdir(parents=True)
    (store.path / "10.1.2.2").write_text(text)
    assert store.allocations() == []
    assert store.damaged() == {V4("10.1.2.2"): text.strip()}
    (a,) = store.allocate("b", "eth0", SETS)
    assert a.address.ip != V4("10.1.2.2")


def test_repair_and_discard_only_touch_damaged_files(store: HostLocalStore) -> None:
    store.path.mkdir(parents=True)
    (store.path / "10.1.2.2").write_bytes(b"")
    (store.path / "10.1.2.3").write_bytes(b"\x00\x01 x")
    (store.path / "10.1.2.4").write_bytes(b"ok\r\neth0")
    assert store.repair(V4("10.1.2.2"), "pod", "eth0")
    assert store.discard(V4("10.1.2.3"))
    assert not store.discard(V4("10.1.2.4")) and not store.repair(V4("10.1.2.4"), "x", "eth0")
    assert store.allocations() == [(V4("10.1.2.2"), "pod", "eth0"), (V4("10.1.2.4"), "ok", "eth0")]
    assert store.damaged() == {}


def test_stale_temporary_files_are_removed_on_first_look(store: HostLocalStore) -> None:
    store.path.mkdir(parents=True)
    (store.path / f"{atomic.TEMP_PREFIX}abc").write_bytes(b"a\r\neth0")
    assert store.allocations() == []
    assert not (store.path / f"{atomic.TEMP_PREFIX}abc").exists()


def _attachment(cid: str, ip: str) -> PodAttachment:
    return PodAttachment(
        container_id=cid,
        host_ifname="veth1",
        ifname="eth0",
        mac="0a:58:0a:01:02:02",
        sandbox="/ns",
        address=IPv4Interface(f"{ip}/29"),
        gateway=IPv4Address("10.1.2.1"),
        mtu=1450,
    )


def test_plan_repairs_gives_each_damaged_address_to_its_attachment() -> None:
    damaged = {V4("10.1.2.2"): "", V4("10.1.2.3"): "junk junk"}
    plan = plan_repairs(damaged, [_attachment("pod", "10.1.2.2"), _attachment("x", "10.1.2.6")])
    assert (
        list(plan.rewrite) == [V4("10.1.2.2")]
        and plan.rewrite[V4("10.1.2.2")].container_id == "pod"
    )
    assert plan.discard == [V4("10.1.2.3")]


async def test_repair_damaged_reports_each_repair(store: HostLocalStore) -> None:
    store.path.mkdir(parents=True)
    (store.path / "10.1.2.2").write_bytes(b"")
    (store.path / "10.1.2.3").write_bytes(b"")
    reports: list[str] = []
    await repair_damaged(store, [_attachment("pod", "10.1.2.2")], reports.append, "start-up")
    assert reports == [
        "start-up: IPAM file 10.1.2.2 was empty; rewritten for pod/eth0, which has that address",
        "start-up: IPAM file 10.1.2.3 was empty and no pod has that address; removed",
    ]


# ---- GC's list ----------------------------------------------------------------------------


def _gc(**extra: Any) -> str:
    import json

    return json.dumps({"cniVersion": "1.1.0", "name": "podnet", "type": "podnet", **extra})


@pytest.mark.parametrize(
    "extra",
    [
        {"cni.dev/valid-attachments": None},
        {"cni.dev/attachments": None},
        {"cni.dev/valid-attachments": {"containerID": "a", "ifname": "eth0"}},
        {
            "cni.dev/valid-attachments": [],
            "cni.dev/attachments": [{"containerID": "a", "ifname": "b"}],
        },
    ],
)
def test_gc_list_null_wrong_or_ambiguous_is_error_7(extra: dict[str, Any]) -> None:
    with pytest.raises(CniError) as info:
        parse_network_config(_gc(**extra), "GC")
    assert info.value.code == 7


def test_gc_list_forms_that_are_accepted() -> None:
    same = [{"containerID": "a", "ifname": "eth0"}]
    both = parse_network_config(
        _gc(**{"cni.dev/valid-attachments": same, "cni.dev/attachments": same}), "GC"
    )
    assert [(a.container_id, a.ifname) for a in both.valid_attachments or ()] == [("a", "eth0")]
    assert (
        parse_network_config(_gc(**{"cni.dev/valid-attachments": []}), "GC").valid_attachments == ()
    )
    assert parse_network_config(_gc(), "GC").valid_attachments is None  # GC refuses it later


# ---- Lease and node lifecycle -------------------------------------------------------------


def test_lease_objects_validate_and_renewal_keeps_the_holder() -> None:
    now = micro_time()
    lease = validate(LEASE, lease_object("n1", 40, now))
    assert lease["spec"] == {
        "holderIdentity": "n1",
        "leaseDurationSeconds": 40,
        "acquireTime": now,
        "renewTime": now,
    }
    later = renewed(lease, "n1", 40, "2030-01-01T00:00:00.000001Z")
    assert later["spec"]["acquireTime"] == now and "leaseTransitions" not in later["spec"]
    taken = renewed(lease, "n2", 40, "2030-01-01T00:00:00.000001Z")
    assert taken["spec"]["leaseTransitions"] == 1 and taken["spec"]["holderIdentity"] == "n2"


@pytest.mark.parametrize(
    "spec", [{"leaseDurationSeconds": 0}, {"renewTime": "soon"}, {"holderIdentity": 5}, {"x": 1}]
)
def test_bad_leases_are_refused(spec: dict[str, Any]) -> None:
    obj = lease_object("n1", 40, micro_time())
    obj["spec"] = spec
    if spec == {"x": 1}:
        validate(LEASE, obj)  # spec is Kubernetes' (open): unknown fields pass
        return
    with pytest.raises(Exception, match="invalid"):
        validate(LEASE, obj)


def _node(status: str | None, reason: str = "PodnetReady") -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": status, "reason": reason}] if status else []
    return {"metadata": {"name": "n1"}, "status": {"conditions": conditions}}


@pytest.mark.parametrize(
    ("node", "silent", "heard", "want"),
    [
        (_node("True"), 39.9, False, None),
        (_node("True"), 40.0, False, "Unknown"),
        (_node("False"), 41, False, "Unknown"),
        (_node(None), 1000, False, None),  # never Ready: still starting
        (_node("Unknown", REASON_UNKNOWN), 1, False, None),  # not heard by this leader
        (_node("Unknown", REASON_UNKNOWN), 1, True, "True"),
        (_node("Unknown", "SomethingElse"), 1, True, None),
        (_node("Unknown", REASON_UNKNOWN), 50, True, None),
    ],
)
def test_ready_transition(
    node: dict[str, Any], silent: float, heard: bool, want: str | None
) -> None:
    change = ready_transition(node, silent, 40.0, heard)
    assert (change[0] if change else None) == want


def test_with_ready_keeps_transition_time_when_status_stays() -> None:
    node = _node("True")
    node["status"]["conditions"][0]["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    assert with_ready(node, ("True", "PodnetReady", "m")) is None
    changed = with_ready(node, ("Unknown", REASON_UNKNOWN, "m"))
    assert changed is not None
    cond = ready_condition(changed)
    assert cond is not None and cond["lastTransitionTime"] != "2020-01-01T00:00:00Z"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_controller_marks_a_silent_node_and_a_renewing_one_ready() -> None:
    registry = Registry(MemoryStore(), prefix="/t/")
    for ns in ("default", NODE_LEASE_NAMESPACE):
        await registry.create(
            NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        )
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n1"},
        "status": _node("True")["status"],
    }
    await registry.create(NODE, node)
    await registry.create(LEASE, lease_object("n1", 40, micro_time()), NODE_LEASE_NAMESPACE)
    clock = Clock()
    async with InProcessApi.standalone(registry) as api:
        await _mark_and_recover(registry, NodeLifecycleController(api, grace=40.0, clock=clock))


async def _mark_and_recover(registry: Registry, controller: NodeLifecycleController) -> None:
    clock = controller.clock
    assert isinstance(clock, Clock)
    await controller.start()
    try:
        assert await controller.check("n1") is None
        clock.now += 40
        assert (await controller.check("n1") or ("",))[0] == "Unknown"
        stored = await registry.get(NODE, None, "n1")
        assert (ready_condition(stored) or {}).get("reason") == REASON_UNKNOWN
        lease = await registry.get(LEASE, NODE_LEASE_NAMESPACE, "n1")
        await registry.update(
            LEASE, renewed(lease, "n1", 40, micro_time()), NODE_LEASE_NAMESPACE, "n1"
        )
        await eventually(lambda: "n1" in controller._heard, what="the renewal to be heard")
        assert (await controller.check("n1") or ("",))[0] == "True"
    finally:
        await controller.stop()
