"""The chaos test's pure invariant checks: each difference is named, nothing else is."""

from __future__ import annotations

import random
from typing import Any

from podnet.cluster.state import ClusterState, EtcdMemberRecord, MasterRecord, NodeRecord
from podnet.testing.chaos import Sandbox
from podnet.testing.chaoscheck import _diff, api_problems, duplicate_problems, sandbox_mac
from podnet.testing.chaoskill import Victim, pick, victims


def sandbox(name: str, ip: str, node: str = "node1", has_object: bool = True) -> Sandbox:
    return Sandbox(name, node, f"ns-{name}", f"cid-{name}", ip, has_object)


def pod(name: str, ip: str | None, node: str = "node1") -> dict[str, Any]:
    status = {"podIP": ip} if ip else {}
    return {"metadata": {"name": name}, "spec": {"nodeName": node}, "status": status}


def test_diff_names_leaked_and_missing() -> None:
    assert _diff("veths", {"a", "b"}, {"a", "b"}) == []
    assert _diff("veths", {"a", "x"}, {"a", "b"}) == [
        "veths: leaked ['x']",
        "veths: missing ['b']",
    ]


def test_sandbox_mac_is_0a58_and_the_address() -> None:
    assert sandbox_mac("10.128.2.5") == "0a:58:0a:80:02:05"


def test_duplicates_across_nodes() -> None:
    live = [
        sandbox("a", "10.128.0.2"),
        sandbox("b", "10.128.0.2", "node2"),
        sandbox("c", "1.1.1.1"),
    ]
    assert duplicate_problems(live) == ["address 10.128.0.2 held by 2 sandboxes"]


def test_api_agrees_when_every_live_pod_shows_its_ip_and_node() -> None:
    live = [sandbox("a", "10.128.0.2"), sandbox("b", "10.128.2.2", "node2")]
    objects = [pod("a", "10.128.0.2"), pod("b", "10.128.2.2", "node2"), pod("gone", None)]
    assert api_problems(objects, live) == []


def test_api_disagreements_are_named() -> None:
    live = [sandbox("a", "10.128.0.2"), sandbox("b", "10.128.0.3"), sandbox("c", "10.128.0.4")]
    objects = [pod("a", "10.128.0.9"), pod("c", "10.128.0.4", "node2"), pod("old", "10.128.0.5")]
    assert api_problems(objects, live) == [
        "API: pod a shows 10.128.0.9 on node1, runs 10.128.0.2 on node1",
        "API: pod b shows no Pod object, runs 10.128.0.3 on node1",
        "API: pod c shows 10.128.0.4 on node2, runs 10.128.0.4 on node1",
        "API: deleted pod old still shows 10.128.0.5",
    ]


def test_api_sandbox_without_object_is_only_checked_for_claims() -> None:
    live = [sandbox("a", "10.128.0.2", has_object=False)]
    assert api_problems([], live) == []
    assert api_problems([pod("x", "10.128.0.7"), pod("y", "10.128.0.7")], live) == [
        "API: deleted pod x still shows 10.128.0.7",
        "API: deleted pod y still shows 10.128.0.7",
    ]


def test_victims_cover_agents_masters_and_members() -> None:
    state = ClusterState(
        nodes={n: NodeRecord(n, i, f"ns{i}", f"10.0.0.{i}") for i, n in enumerate(["n1", "n2"])},
        masters=[MasterRecord(1, 1001), MasterRecord(2, 1002)],
        etcd_members=[EtcdMemberRecord(f"etcd{i}", 2000 + i, 3000 + i) for i in (1, 2, 3)],
    )
    assert [str(v) for v in victims(state)] == [
        "agent of n1",
        "agent of n2",
        "master 1",
        "master 2",
        "etcd 1",
        "etcd 2",
        "etcd 3",
    ]
    picked = {pick(random.Random(seed), state).kind for seed in range(50)}
    assert picked == {"agent", "master", "etcd"}
    assert Victim("etcd", index=2) in victims(state)


def test_wait_exited_returns_once_the_killed_process_is_a_zombie_or_gone() -> None:
    import os
    import signal
    import subprocess

    from podnet.cluster.state import process_state, wait_exited

    assert process_state(os.getpid()) == "R"
    child = subprocess.Popen(["sleep", "30"])
    assert process_state(child.pid) not in ("", "Z")
    os.kill(child.pid, signal.SIGKILL)
    wait_exited(child.pid)  # reaps our own child
    assert process_state(child.pid) == ""
    child.returncode = -9  # already reaped: keep Popen from waiting on a recycled PID
