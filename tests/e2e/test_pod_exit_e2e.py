"""A local-cluster pod whose process ends (real etcd, master, agent, CNI, kernel): its
node's exit watcher writes it not Ready, Succeeded or Failed with the exit code, and the
pod leaves its Service's endpoints; one watcher serves every pod of the node."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podnet.cluster import lifecycle, pods
from podnet.cluster.state import ClusterState
from podnet.model.kinds import ENDPOINTS, POD, SERVICE
from podnet.testing.e2e import TEST_DATAPLANE, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(600)]

NS = "ex"


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("pn-exit")
    try:
        lifecycle.cluster_up(
            directory, lifecycle.ClusterSpec(nodes=1, dataplane=TEST_DATAPLANE), say=print
        )
        with pods.admin_api(directory) as api:
            pods.ensure_namespace(api, NS)
            service = {
                "metadata": {"name": "mortals", "namespace": NS},
                "spec": {
                    "selector": {"role": "mortal"},
                    "ports": [{"port": 80, "targetPort": 8080}],
                },
            }
            api.create(SERVICE, service, namespace=NS)
        yield directory
    finally:
        watcher_log = directory / "nodes" / "node1" / "podwatch.log"
        if watcher_log.exists():
            print(watcher_log.read_text()[-4000:])
        lifecycle.cluster_down(directory, say=print)


def pod_status(state_dir: Path, name: str) -> dict[str, Any]:
    with pods.admin_api(state_dir) as api:
        return dict(api.get(POD, NS, name).get("status") or {})


def ready(status: dict[str, Any]) -> str | None:
    found = [c["status"] for c in status.get("conditions") or [] if c["type"] == "Ready"]
    return found[0] if found else None


def addresses(state_dir: Path) -> list[str]:
    """Ready and not-ready addresses of the Service's Endpoints."""
    with pods.admin_api(state_dir) as api:
        subsets = api.get(ENDPOINTS, NS, "mortals").get("subsets") or []
    kinds = ("addresses", "notReadyAddresses")
    return sorted(a["ip"] for s in subsets for k in kinds for a in s.get(k) or [])


def ready_addresses(state_dir: Path) -> list[str]:
    with pods.admin_api(state_dir) as api:
        subsets = api.get(ENDPOINTS, NS, "mortals").get("subsets") or []
    return sorted(a["ip"] for s in subsets for a in s.get("addresses") or [])


def terminated(state_dir: Path, name: str) -> dict[str, Any] | None:
    status = pod_status(state_dir, name)
    statuses = status.get("containerStatuses") or [{}]
    found = (statuses[0].get("state") or {}).get("terminated")
    return found if found and status.get("phase") in ("Succeeded", "Failed") else None


def test_a_killed_pod_is_failed_and_leaves_the_endpoints(state_dir: Path) -> None:
    pod = pods.run_pod(state_dir, "victim", NS, "node1", {"role": "mortal"})
    assert pod.process is not None
    wait_for(lambda: ready(pod_status(state_dir, "victim")) == "True", 30, "victim Ready")
    wait_for(lambda: ready_addresses(state_dir) == [pod.ip], 30, "victim in the endpoints")
    os.kill(pod.process.pid, signal.SIGKILL)
    end = wait_for(lambda: terminated(state_dir, "victim"), 30, "victim reported ended")
    assert end["exitCode"] == 137 and end["signal"] == signal.SIGKILL
    assert end["reason"] == "Error" and end["finishedAt"]
    status = pod_status(state_dir, "victim")
    assert status["phase"] == "Failed" and ready(status) == "False"
    assert status["containerStatuses"][0]["ready"] is False
    wait_for(lambda: addresses(state_dir) == [], 30, "the ended pod out of the endpoints")
    # The agent's later status writes keep it ended (it never writes Running over it).
    pods.delete_pod(state_dir, "victim", NS)


def exiting(flag: Path, code: int) -> list[str]:
    """A command that runs until ``flag`` exists, then exits with ``code``."""
    return ["sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done; exit {code}"]


@pytest.mark.parametrize(
    ("code", "phase", "reason"), [(3, "Failed", "Error"), (0, "Succeeded", "Completed")]
)
def test_the_exit_code_decides_the_phase(
    state_dir: Path, code: int, phase: str, reason: str
) -> None:
    flag = Path("/tmp") / f"pn-exit-{uuid.uuid4().hex[:8]}"
    name = f"ends-{code}"
    try:
        pods.run_pod(state_dir, name, NS, "node1", {"role": "other"}, command=exiting(flag, code))
        wait_for(lambda: ready(pod_status(state_dir, name)) == "True", 30, f"{name} Ready")
        flag.write_text("go")
        end = wait_for(lambda: terminated(state_dir, name), 30, f"{name} reported ended")
        assert end["exitCode"] == code and end["reason"] == reason and "signal" not in end
        status = pod_status(state_dir, name)
        assert status["phase"] == phase and ready(status) == "False"
    finally:
        flag.unlink(missing_ok=True)
        pods.delete_pod(state_dir, name, NS)


def test_one_watcher_serves_every_pod_of_the_node(state_dir: Path) -> None:
    flags = [Path("/tmp") / f"pn-exit-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    names = [f"many-{i}" for i in range(3)]
    try:
        for name, flag in zip(names, flags, strict=True):
            pods.run_pod(state_dir, name, NS, "node1", {"role": "many"}, command=exiting(flag, 5))
        state = ClusterState.load(state_dir)
        assert state is not None
        watcher = state.nodes["node1"].podwatch
        assert watcher is not None and watcher.alive()
        for name, flag in zip(names, flags, strict=True):
            flag.write_text("go")
            end = wait_for(lambda n=name: terminated(state_dir, n), 30, f"{name} ended")
            assert end["exitCode"] == 5
        after = ClusterState.load(state_dir)
        assert after is not None and after.nodes["node1"].podwatch == watcher, "still one"
        # A deleted pod is forgotten: its registration is gone with it.
        pods.delete_pod(state_dir, names[0], NS)
        node_dir = state_dir / "nodes" / "node1" / "pods"
        assert not any(p.name.startswith(f"{NS}_{names[0]}.") for p in node_dir.iterdir())
    finally:
        for flag in flags:
            flag.unlink(missing_ok=True)
        for name in names[1:]:
            pods.delete_pod(state_dir, name, NS)
