"""How a pod's process ended, as the kubelet reports it, and the proc connector's exit
events (parsed from hand-built datagrams; a real one from the kernel)."""

from __future__ import annotations

import os
import select
import signal
import socket
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

from podnet.cluster.podexit import (
    CN_IDX_PROC,
    NETLINK_CONNECTOR,
    PROC_EVENT_EXIT,
    UNKNOWN,
    Ended,
    exits,
    listen_request,
    terminated_status,
)
from podnet.cluster.podwatch import PodWatcher, open_exit_events, register
from podnet.cluster.state import ProcessRecord


def exit_message(pid: int, tgid: int, status: int, what: int = PROC_EVENT_EXIT) -> bytes:
    event = struct.pack("=IIQ", what, 0, 0) + struct.pack("=IIII", pid, tgid, status, 17)
    cn = struct.pack("=IIIIHH", 1, 1, 0, 0, len(event), 0) + event
    return struct.pack("=IHHII", 16 + len(cn), 3, 0, 0, 0) + cn


def test_wait_statuses_become_exit_codes() -> None:
    assert Ended.from_wait_status(3 << 8) == Ended(3)
    assert Ended.from_wait_status(0) == Ended(0)
    assert Ended.from_wait_status(signal.SIGKILL) == Ended(137, signal.SIGKILL)


def test_exits_of_processes_only() -> None:
    data = exit_message(10, 10, 3 << 8) + exit_message(11, 10, 0) + exit_message(12, 12, 0, 1)
    assert exits(data) == [(10, 3 << 8, 0)], "a thread's exit and a fork event are skipped"
    assert exits(data[:20]) == [], "a cut datagram yields nothing"
    assert exits(b"") == []


def test_terminated_status_follows_the_exit_code() -> None:
    failed = terminated_status(Ended(137, 9), "t0", "t1")
    assert failed["phase"] == "Failed"
    state = failed["containerStatuses"][0]["state"]["terminated"]
    assert state == {
        "exitCode": 137,
        "reason": "Error",
        "signal": 9,
        "startedAt": "t0",
        "finishedAt": "t1",
    }
    assert {c["type"]: c["status"] for c in failed["conditions"]} == {
        "ContainersReady": "False",
        "Ready": "False",
    }
    done = terminated_status(Ended(0), "t0", "t1")
    assert done["phase"] == "Succeeded"
    assert done["containerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
    lost = terminated_status(UNKNOWN, "t0", "t1")
    assert lost["phase"] == "Failed"
    assert lost["containerStatuses"][0]["state"]["terminated"]["reason"] == "ContainerStatusUnknown"
    kept = terminated_status(
        Ended(0), "t0", "t1", {"conditions": [{"type": "PodScheduled", "status": "True"}]}
    )
    assert "PodScheduled" in {c["type"] for c in kept["conditions"]}


@pytest.mark.root
def test_the_kernel_reports_a_real_exit() -> None:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
    with sock:
        sock.bind((0, CN_IDX_PROC))
        sock.send(listen_request(sock.getsockname()[0]))
        child = subprocess.Popen(["sh", "-c", "exit 7"])
        child.wait(10)
        seen = None
        for _ in range(1000):  # bounded: other processes of the machine exit too
            readable, _, _ = select.select([sock], [], [], 5)
            assert readable, "no process event within 5 s"
            found = {pid: status for pid, status, _ in exits(sock.recv(65536))}
            if child.pid in found:
                seen = found[child.pid]
                break
        assert seen is not None and Ended.from_wait_status(seen) == Ended(7)


class RecordingApi:
    """The node's client, as the watcher uses it: get a Pod, patch its status."""

    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    def get(self, kind: object, namespace: str, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": namespace}, "status": {}}

    def patch(
        self, kind: object, namespace: str, name: str, body: dict[str, Any], **_: Any
    ) -> None:
        self.patches.append(body["status"])


@pytest.mark.root
def test_the_watcher_reports_each_exit_code_once(tmp_path: Path) -> None:
    api = RecordingApi()
    watcher = PodWatcher(api, tmp_path, open_exit_events())
    children = {code: subprocess.Popen(["sleep", f"0.{code}"]) for code in (1, 2)}
    for code, child in children.items():
        register(tmp_path, "ns", f"p{code}", ProcessRecord.of(child.pid, "sleep"))
    watcher.rescan()
    assert len(watcher.watched) == 2
    os.kill(children[2].pid, signal.SIGTERM)
    for _ in range(500):  # each turn waits at most RESCAN
        watcher.turn()
        if len(api.patches) == 2:
            break
    for child in children.values():
        child.wait(10)
    ends = sorted(p["containerStatuses"][0]["state"]["terminated"]["exitCode"] for p in api.patches)
    assert ends == [0, 128 + signal.SIGTERM]
    assert sorted(p.name for p in tmp_path.joinpath("pods").iterdir()) == [
        "ns_p1.done",
        "ns_p2.done",
    ]
    watcher.rescan()
    watcher.turn(0.05)
    assert len(api.patches) == 2, "reported once"
    # A process that ended before its registration was read keeps its exit code.
    early = subprocess.Popen(["sh", "-c", "read x; exit 6"], stdin=subprocess.PIPE)
    record = ProcessRecord.of(early.pid, "sh")
    early.communicate(b"\n", timeout=10)
    register(tmp_path, "ns", "early", record)
    for _ in range(500):
        watcher.rescan()
        watcher.turn()
        if len(api.patches) == 3:
            break
    assert api.patches[2]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 6
    watcher.events.close()
