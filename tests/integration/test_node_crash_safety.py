"""Issue 8, findings 4 and 5 on the node side, against real processes: a real etcd, a real
``podnet master``, a real ``podnet node`` (fake data plane) and the real CNI shim.

- an agent SIGKILLed with 20 ADDs in flight, and damaged IPAM files (0 bytes, garbage)
  planted in its directory: it starts again, serves, reports the repair, and no address
  is leaked or handed out twice;
- CNI GC with ``cni.dev/valid-attachments`` null, missing or not a list is refused with a
  spec error and removes nothing;
- a node whose agent dies goes Ready=Unknown within the grace period of its last Lease
  renewal, and Ready=True again once a new agent renews it;
- a NetworkPolicy created right after a master outage is applied within the watch
  backoff's cap (plus slack), read from the agent's policy note.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any

import pytest
from test_agent_fake_dataplane import NODE, Agent, Shim

from podnet.client import WATCH_BACKOFF
from podnet.cni.build import install_shim
from podnet.ipam.reservations import parse_owner, well_formed
from podnet.master import node_credentials
from podnet.store.etcd_process import EtcdProcess
from podnet.testing.api import client_for, namespace
from podnet.testing.cli import run_kubectl
from podnet.testing.e2e import wait_for
from podnet.testing.processes import MasterProcess, launch_master

GRACE = 6.0  # the master's node-monitor grace period in these tests
LEASE_SECONDS = 4  # the agent renews every second


def _wait(condition: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    return wait_for(condition, timeout, what)


def _start_agent(master: MasterProcess, root: Path) -> Agent:
    kubeconfig = node_credentials(master.state_dir, NODE, master.server, root / "node.kubeconfig")
    return Agent(root, kubeconfig).start()


@pytest.fixture
def fast_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """Short lease and grace for the processes started after it (they inherit the env)."""
    monkeypatch.setenv("PODNET_NODE_MONITOR_GRACE", str(GRACE))
    monkeypatch.setenv("PODNET_NODE_LEASE_SECONDS", str(LEASE_SECONDS))


@pytest.fixture
def agent(master: MasterProcess, tmp_path: Path) -> Iterator[Agent]:
    running = _start_agent(master, tmp_path / "agent")
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def shim(agent: Agent) -> Shim:
    return Shim(install_shim(agent.root / "shim-bin", sys.executable), agent.socket)


def _subnet(master: MasterProcess) -> IPv4Network:
    with client_for(master.kubeconfig) as api:
        hostsubnet = api.get(f"/apis/network.openshift.io/v1/hostsubnets/{NODE}").json()
    return IPv4Network(hostsubnet["subnet"])


def _reservations(agent: Agent) -> dict[str, str]:
    return {
        p.name: p.read_bytes().decode() for p in agent.ipam_dir.iterdir() if p.name[0].isdigit()
    }


def _attached(agent: Agent) -> dict[str, str]:
    """address -> container ID of every attachment in the fake data plane."""
    return {p["address"].split("/")[0]: p["container_id"] for p in agent.fake_state()["pods"]}


def _assert_ipam_matches_attachments(agent: Agent) -> None:
    files = _reservations(agent)
    assert all(well_formed(text) for text in files.values()), files
    attached = _attached(agent)
    assert len(attached) == len(agent.fake_state()["pods"])  # no address attached twice
    assert {ip: parse_owner(text)[0] for ip, text in files.items()} == attached


# ---- finding 4: IPAM crash safety ---------------------------------------------------------


def test_sigkill_with_twenty_adds_in_flight_and_damaged_files(
    master: MasterProcess, agent: Agent, shim: Shim
) -> None:
    for i in range(3):
        assert shim.add(f"cid-live-{i}", f"live-{i}")[0] == 0
    results: list[tuple[int, Any]] = []

    def add(i: int) -> None:
        results.append(shim.add(f"cid-flight-{i}", f"flight-{i}"))

    threads = [threading.Thread(target=add, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    _wait(lambda: len(_reservations(agent)) >= 6, "some ADDs to reserve an address", 30)
    assert agent.signal(signal.SIGKILL) == -signal.SIGKILL
    for thread in threads:
        thread.join(90)
    assert len(results) == 20
    assert all(code in (0, 1) for code, _ in results)

    subnet = _subnet(master)
    hosts = list(subnet.hosts())
    empty, garbage = str(hosts[-1]), str(hosts[-2])
    (agent.ipam_dir / empty).write_bytes(b"")  # what a kill between create and write left
    (agent.ipam_dir / garbage).write_bytes(b"\x00\xff\r\n \t\x01")
    live_ip = next(ip for ip, cid in _attached(agent).items() if cid == "cid-live-0")
    (agent.ipam_dir / live_ip).write_bytes(b"")  # a live pod's own file, torn
    (agent.ipam_dir / ".podnet-tmp-0123456789ab").write_bytes(b"half")  # a killed writer's

    agent.start()
    log = agent.log()
    assert f"IPAM file {empty} was empty and no pod has that address; removed" in log
    assert f"IPAM file {garbage} was garbled" in log
    assert f"IPAM file {live_ip} was empty; rewritten for cid-live-0/eth0" in log
    assert not (agent.ipam_dir / empty).exists() and not (agent.ipam_dir / garbage).exists()
    assert not (agent.ipam_dir / ".podnet-tmp-0123456789ab").exists()
    assert _reservations(agent)[live_ip] == "cid-live-0\r\neth0"
    _assert_ipam_matches_attachments(agent)

    code, out = shim.add("cid-after", "after")
    assert code == 0, out
    new_ip = out["ips"][0]["address"].split("/")[0]
    assert list(_attached(agent)).count(new_ip) == 1
    _assert_ipam_matches_attachments(agent)
    with client_for(master.kubeconfig) as api:
        events = api.get("/api/v1/namespaces/default/events").json()["items"]
    repairs = [e for e in events if e.get("reason") == "IPAMFileRepaired"]
    assert len(repairs) >= 3 and all(e["involvedObject"]["name"] == NODE for e in repairs)


def test_damaged_file_found_at_gc_is_repaired_not_fatal(agent: Agent, shim: Shim) -> None:
    assert shim.add("cid-keep", "keep")[0] == 0
    (agent.ipam_dir / "10.255.255.254").write_bytes(b"")  # outside the subnet, no pod
    shim.cni_version = "1.1.0"
    valid = [{"containerID": "cid-keep", "ifname": "eth0"}]
    code, out, _ = shim.run(
        {"CNI_COMMAND": "GC"}, shim.config(**{"cni.dev/valid-attachments": valid})
    )
    assert (code, out) == (0, None)
    assert "GC: IPAM file 10.255.255.254 was empty" in agent.log()
    assert not (agent.ipam_dir / "10.255.255.254").exists()
    _assert_ipam_matches_attachments(agent)
    assert list(_attached(agent).values()) == ["cid-keep"]


# ---- finding 5: GC with a null list ------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        {"cni.dev/valid-attachments": None},
        {"cni.dev/valid-attachments": None, "cni.dev/attachments": None},
        {"cni.dev/valid-attachments": None, "cni.dev/attachments": []},
        {"cni.dev/valid-attachments": {}},
        {"cni.dev/valid-attachments": "all"},
        {"cni.dev/valid-attachments": [], "cni.dev/attachments": [{"containerID": "x"}]},
        {"cni.dev/valid-attachments": [None]},
        {},
    ],
    ids=["null", "both-null", "null-and-empty", "object", "string", "differ", "null-item", "none"],
)
def test_gc_without_a_valid_list_is_refused_and_removes_nothing(
    agent: Agent, shim: Shim, extra: dict[str, Any]
) -> None:
    for name in ("a", "b"):
        assert shim.add(f"cid-{name}", name)[0] == 0
    before = (_reservations(agent), agent.fake_state()["pods"])
    shim.cni_version = "1.1.0"
    code, out, _ = shim.run({"CNI_COMMAND": "GC"}, shim.config(**extra))
    assert code == 1 and out["code"] == 7, out
    assert {"cniVersion", "code", "msg"} <= out.keys()
    assert (_reservations(agent), agent.fake_state()["pods"]) == before


# ---- finding 4: heartbeat ----------------------------------------------------------------


def _time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _node_and_lease(master: MasterProcess) -> tuple[dict[str, Any], dict[str, Any]]:
    with client_for(master.kubeconfig) as api:
        node = api.get(f"/api/v1/nodes/{NODE}").json()
        lease = api.get(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NODE}")
    return node, lease.json()


def _ready(node: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in node["status"]["conditions"] if c["type"] == "Ready")


def test_a_silent_node_goes_unknown_within_the_grace_and_ready_again(
    fast_heartbeat: None, etcd: EtcdProcess, tmp_path: Path, prefix: str, kubectl: str
) -> None:
    master = launch_master(etcd, tmp_path / "master", prefix)
    running = None
    try:
        running = _start_agent(master, tmp_path / "agent")
        node, lease = _node_and_lease(master)
        assert _ready(node)["status"] == "True"
        assert lease["spec"]["holderIdentity"] == NODE
        assert lease["spec"]["leaseDurationSeconds"] == LEASE_SECONDS
        first = lease["spec"]["renewTime"]
        _wait(lambda: _node_and_lease(master)[1]["spec"]["renewTime"] != first, "a renewal", 10)

        running.signal(signal.SIGKILL)
        _wait(lambda: _ready(_node_and_lease(master)[0])["status"] != "True", "NotReady")
        node, lease = _node_and_lease(master)
        ready = _ready(node)
        assert (ready["status"], ready["reason"]) == ("Unknown", "NodeStatusUnknown")
        silent = _time(ready["lastTransitionTime"]) - _time(lease["spec"]["renewTime"])
        # within the grace of the last renewal (whole seconds on the condition, so +1)
        assert GRACE - 2 <= silent <= GRACE + 1, silent
        with client_for(master.kubeconfig) as api:
            events = api.get("/api/v1/namespaces/default/events").json()["items"]
        assert any(e.get("reason") == "NodeNotReady" for e in events)

        running.start()
        _wait(lambda: _ready(_node_and_lease(master)[0])["status"] == "True", "Ready again")
        node, lease = _node_and_lease(master)
        assert _time(lease["spec"]["renewTime"]) > _time(ready["lastTransitionTime"])
        ready_again = _ready(node)["lastTransitionTime"]
        # Renewals keep it Ready: wait (on the master's record) until renewals have gone on
        # for longer than a grace period, then it must still be Ready since ``ready_again``.
        past_a_grace = _time(ready_again) + GRACE + 2
        _wait(
            lambda: _time(_node_and_lease(master)[1]["spec"]["renewTime"]) >= past_a_grace,
            "renewals for longer than a grace period",
            GRACE * 4,
        )
        ready = _ready(_node_and_lease(master)[0])
        assert (ready["status"], ready["lastTransitionTime"]) == ("True", ready_again)
        with client_for(master.kubeconfig) as api:
            table = api.get("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")
        assert [i["metadata"]["name"] for i in table.json()["items"]] == [NODE]
        shown = run_kubectl(master.kubeconfig, "get", "leases", "-n", "kube-node-lease")
        assert shown.returncode == 0, shown.stderr
        header, row = shown.stdout.splitlines()
        assert header.split()[:2] == ["NAME", "HOLDER"] and row.split()[:2] == [NODE, NODE]
    finally:
        if running is not None:
            running.stop()
        master.stop()


# ---- finding 4: watches after a master outage --------------------------------------------


def _note(agent: Agent) -> dict[str, Any]:
    path = agent.root / "state" / "policy.json"
    return json.loads(path.read_text()) if path.exists() else {}


OUTAGE_FAILURES = 8  # 0.2 s doubling 8 times, uncapped, would be 51 s


def _watch_pauses(agent: Agent, plural: str) -> list[float]:
    """The pauses the agent's reflector logged before watching ``plural`` again."""
    pattern = rf"watch of {plural} failed .*; again in ([0-9.]+)s"
    return [float(found) for found in re.findall(pattern, agent.log())]


def test_policy_applies_soon_after_a_master_outage(
    etcd: EtcdProcess, tmp_path: Path, prefix: str
) -> None:
    master = launch_master(etcd, tmp_path / "master", prefix, "--network-plugin", "networkpolicy")
    running = None
    try:
        running = _start_agent(master, tmp_path / "agent")
        with client_for(master.kubeconfig) as api:
            api.post("/api/v1/namespaces", json=namespace("shop")).raise_for_status()
        _wait(lambda: _note(running), "the first policy note", 30)
        master.stop()
        # The outage lasts until the policy watch has failed OUTAGE_FAILURES times: long
        # enough for an uncapped backoff to have grown far past the cap.
        _wait(
            lambda: len(_watch_pauses(running, "networkpolicies")) >= OUTAGE_FAILURES,
            "the policy watch to fail repeatedly",
            60,
        )
        master.start()
        policy = {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "deny-all", "namespace": "shop"},
            "spec": {"podSelector": {}},
        }
        created = time.time()
        with client_for(master.kubeconfig) as api:
            path = "/apis/networking.k8s.io/v1/namespaces/shop/networkpolicies"
            api.post(path, json=policy).raise_for_status()
        note = _wait(lambda: _note(running).get("policies") == 1 and _note(running), "apply", 60)
        delay = note["applied_at"] - created
        print(f"\npolicy applied {delay:.2f} s after its creation, after a master outage")
        # Soon, by the waits the agent chose (not by a clock): every pause between watch
        # attempts during the outage was at most the cap.
        pauses = _watch_pauses(running, "networkpolicies")
        assert len(pauses) >= OUTAGE_FAILURES and max(pauses) <= WATCH_BACKOFF.cap, pauses
    finally:
        if running is not None:
            running.stop()
        master.stop()


def test_watch_backoff_is_capped_with_full_jitter() -> None:
    delays = [WATCH_BACKOFF.delay(attempt) for attempt in range(200)]
    assert max(delays) <= 1.0 and min(delays) >= 0.0
    assert len({round(d, 3) for d in delays[10:]}) > 50  # jittered, not in step
