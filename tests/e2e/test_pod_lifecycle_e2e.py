"""Pod lifecycle on a real local cluster (etcd, master, agent, CNI, kernel), one 1-node
cluster for the module.

Issue 19, finding 1's lifecycle half: a Pod deleted with ``kubectl delete`` is
terminating while its sandbox runs and answers; when its grace runs out with no CNI DEL,
the node detaches the sandbox (its address answers no more, its IPAM reservation is
gone) and removes the Pod; a force-deleted Pod's orphaned sandbox is detached at once.
``podnet pod delete`` (the runtime's DEL, later) still succeeds.

A pod whose process ends: its node's exit watcher writes it not Ready, Succeeded or
Failed with the exit code, and the pod leaves its Service's endpoints; one watcher serves
every pod of the node.

``default/kubernetes`` (issue 17): the Service exists with the first service address and
its endpoints hold the master's underlay address (its relay on the external host,
``podnet.cluster.masteraccess``); pods get ``KUBERNETES_SERVICE_HOST`` and ``_PORT``; the
cluster DNS answers its name through the pod's resolv.conf (glibc); and a pod reaches the
API through it, verifying the master's certificate by the Service's name. The relay's
address answers nothing but the API (attack: another port is refused).

The parts use namespaces of their own (``life``, ``ex``, ``kk``) and share the cluster
(each bring-up is a cluster's worth of processes and seconds).
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import Iterator
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any

import pytest

from podnet.cluster import lifecycle, pods
from podnet.cluster.state import ClusterState
from podnet.model.kinds import CLUSTER_NETWORK, ENDPOINTS, POD, SERVICE
from podnet.testing import lab
from podnet.testing.api import kubeconfig_parts
from podnet.testing.chaoscheck import ipam_files
from podnet.testing.cli import run_kubectl
from podnet.testing.e2e import TEST_DATAPLANE, load_state, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(600)]

NS = "life"
EXIT_NS = "ex"


KUBE_NS = "kk"
HEALTHZ = (
    "import ssl,sys,urllib.request\n"
    "context = ssl.create_default_context(cadata=sys.argv[2])\n"
    "with urllib.request.urlopen(sys.argv[1], context=context, timeout=10) as answer:\n"
    "    print(answer.status, answer.read().decode())\n"
)
CONNECT = (
    "import socket,sys\n"
    "s=socket.socket(); s.settimeout(5)\n"
    "try:\n    s.connect((sys.argv[1], int(sys.argv[2])))\n"
    "except ConnectionRefusedError:\n    print('refused')\n"
    "except OSError as e:\n    print(type(e).__name__)\n"
    "else:\n    print('connected')\n"
)
MASTER = "192.168.100.241"  # master 1 on the default underlay


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("pn-life")
    try:
        spec = lifecycle.ClusterSpec(nodes=1, dataplane=TEST_DATAPLANE)
        lifecycle.cluster_up(directory, spec, say=print)
        pods.run_pod(directory, "client", NS, "node1")
        with pods.admin_api(directory) as api:
            pods.ensure_namespace(api, EXIT_NS)
            service = {
                "metadata": {"name": "mortals", "namespace": EXIT_NS},
                "spec": {
                    "selector": {"role": "mortal"},
                    "ports": [{"port": 80, "targetPort": 8080}],
                },
            }
            api.create(SERVICE, service, namespace=EXIT_NS)
        yield directory
    finally:
        watcher_log = directory / "nodes" / "node1" / "podwatch.log"
        if watcher_log.exists():
            print(watcher_log.read_text()[-4000:])
        lifecycle.cluster_down(directory, say=print)


def _kubeconfig(state_dir: Path) -> Path:
    return state_dir / "master" / "admin.kubeconfig"


def _pod(state_dir: Path, name: str) -> dict[str, Any] | None:
    with pods.admin_api(state_dir) as api:
        found = api.list(POD, namespace=NS)["items"]
    return next((p for p in found if p["metadata"]["name"] == name), None)


@pytest.mark.parametrize("force", [False, True], ids=["grace-runs-out", "force"])
def test_a_deleted_pods_sandbox_is_detached_by_its_node(state_dir: Path, force: bool) -> None:
    name = "forced" if force else "lingering"
    victim = pods.run_pod(state_dir, name, NS, "node1")
    client = load_state(state_dir).pods[f"{NS}/client"].netns
    try:
        assert lab.reaches(client, victim.ip), "the victim answers before its deletion"
        flags = ["--force", "--grace-period=0"] if force else ["--grace-period=4", "--wait=false"]
        done = run_kubectl(_kubeconfig(state_dir), "delete", "pod", name, "-n", NS, *flags)
        assert done.returncode == 0, done.stderr
        if not force:
            terminating = _pod(state_dir, name)
            assert terminating is not None and terminating["metadata"]["deletionTimestamp"]
            assert lab.reaches(client, victim.ip), "within its grace, the pod still runs"
        wait_for(lambda: _pod(state_dir, name) is None, 60, "the Pod removed")
        wait_for(lambda: not lab.ping(client, victim.ip, count=1), 60, "the sandbox detached")
        assert not lab.ping(client, victim.ip, count=3)
        assert victim.ip not in ipam_files(state_dir, "node1")[0], "its address released"
    finally:
        pods.delete_pod(state_dir, name, NS, say=lambda _: None)  # the runtime's DEL: fine


# --- a pod whose process ends ----------------------------------------------------------


def pod_status(state_dir: Path, name: str) -> dict[str, Any]:
    with pods.admin_api(state_dir) as api:
        return dict(api.get(POD, EXIT_NS, name).get("status") or {})


def ready(status: dict[str, Any]) -> str | None:
    found = [c["status"] for c in status.get("conditions") or [] if c["type"] == "Ready"]
    return found[0] if found else None


def addresses(state_dir: Path) -> list[str]:
    """Ready and not-ready addresses of the Service's Endpoints."""
    with pods.admin_api(state_dir) as api:
        subsets = api.get(ENDPOINTS, EXIT_NS, "mortals").get("subsets") or []
    kinds = ("addresses", "notReadyAddresses")
    return sorted(a["ip"] for s in subsets for k in kinds for a in s.get(k) or [])


def ready_addresses(state_dir: Path) -> list[str]:
    with pods.admin_api(state_dir) as api:
        subsets = api.get(ENDPOINTS, EXIT_NS, "mortals").get("subsets") or []
    return sorted(a["ip"] for s in subsets for a in s.get("addresses") or [])


def terminated(state_dir: Path, name: str) -> dict[str, Any] | None:
    status = pod_status(state_dir, name)
    statuses = status.get("containerStatuses") or [{}]
    found = (statuses[0].get("state") or {}).get("terminated")
    return found if found and status.get("phase") in ("Succeeded", "Failed") else None


def test_a_killed_pod_is_failed_and_leaves_the_endpoints(state_dir: Path) -> None:
    pod = pods.run_pod(state_dir, "victim", EXIT_NS, "node1", {"role": "mortal"})
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
    pods.delete_pod(state_dir, "victim", EXIT_NS)


def exiting(flag: Path, code: int) -> list[str]:
    """A command that runs until ``flag`` exists (in the pod's own /tmp), then exits with
    ``code``."""
    return ["sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done; exit {code}"]


def touch(state_dir: Path, name: str, flag: Path) -> None:
    """Write ``flag`` inside the pod (each pod has its own /tmp)."""
    done = pods.exec_pod(state_dir, name, ["touch", str(flag)], EXIT_NS)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("code", "phase", "reason"), [(3, "Failed", "Error"), (0, "Succeeded", "Completed")]
)
def test_the_exit_code_decides_the_phase(
    state_dir: Path, code: int, phase: str, reason: str
) -> None:
    flag = Path("/tmp") / f"pn-exit-{uuid.uuid4().hex[:8]}"
    name = f"ends-{code}"
    try:
        pods.run_pod(
            state_dir, name, EXIT_NS, "node1", {"role": "other"}, command=exiting(flag, code)
        )
        wait_for(lambda: ready(pod_status(state_dir, name)) == "True", 30, f"{name} Ready")
        touch(state_dir, name, flag)
        end = wait_for(lambda: terminated(state_dir, name), 30, f"{name} reported ended")
        assert end["exitCode"] == code and end["reason"] == reason and "signal" not in end
        status = pod_status(state_dir, name)
        assert status["phase"] == phase and ready(status) == "False"
    finally:
        pods.delete_pod(state_dir, name, EXIT_NS)


def test_one_watcher_serves_every_pod_of_the_node(state_dir: Path) -> None:
    flags = [Path("/tmp") / f"pn-exit-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    names = [f"many-{i}" for i in range(3)]
    try:
        for name, flag in zip(names, flags, strict=True):
            pods.run_pod(
                state_dir, name, EXIT_NS, "node1", {"role": "many"}, command=exiting(flag, 5)
            )
        state = ClusterState.load(state_dir)
        assert state is not None
        watcher = state.nodes["node1"].podwatch
        assert watcher is not None and watcher.alive()
        for name, flag in zip(names, flags, strict=True):
            touch(state_dir, name, flag)
            end = wait_for(lambda n=name: terminated(state_dir, n), 30, f"{name} ended")
            assert end["exitCode"] == 5
        after = ClusterState.load(state_dir)
        assert after is not None and after.nodes["node1"].podwatch == watcher, "still one"
        # A deleted pod is forgotten: its registration is gone with it.
        pods.delete_pod(state_dir, names[0], EXIT_NS)
        node_dir = state_dir / "nodes" / "node1" / "pods"
        assert not any(p.name.startswith(f"{EXIT_NS}_{names[0]}.") for p in node_dir.iterdir())
    finally:
        for flag in flags:
            flag.unlink(missing_ok=True)
        for name in names[1:]:
            pods.delete_pod(state_dir, name, EXIT_NS)


def test_pods_find_the_kubernetes_service(state_dir: Path) -> None:
    with pods.admin_api(state_dir) as api:
        network = IPv4Network(api.get(CLUSTER_NETWORK, None, "default")["serviceNetwork"])
        first = str(network.network_address + 1)
        service = wait_for(lambda: api.get(SERVICE, "default", "kubernetes"), 30, "the Service")
        assert service["spec"]["clusterIP"] == first
        assert service["spec"]["ports"][0]["port"] == 443
        subsets = wait_for(
            lambda: api.get(ENDPOINTS, "default", "kubernetes").get("subsets"), 30, "endpoints"
        )
        assert subsets == [
            {
                "addresses": [{"ip": MASTER}],
                "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
            }
        ]
    pods.run_pod(state_dir, "asker", KUBE_NS, "node1", {"app": "asker"})
    shown = pods.exec_pod(state_dir, "asker", ["env"], KUBE_NS).stdout.splitlines()
    assert f"KUBERNETES_SERVICE_HOST={first}" in shown
    assert "KUBERNETES_SERVICE_PORT=443" in shown and "KUBERNETES_SERVICE_PORT_HTTPS=443" in shown
    assert f"KUBERNETES_PORT_443_TCP=tcp://{first}:443" in shown
    for name in ("kubernetes.default.svc.cluster.local", "kubernetes.default"):
        found = pods.exec_pod(state_dir, "asker", ["getent", "hosts", name], KUBE_NS)
        assert found.returncode == 0, found.stderr
        assert found.stdout.split()[0] == first, found.stdout
    _, ca, _ = kubeconfig_parts(state_dir / "master" / "admin.kubeconfig")
    for url in ("https://kubernetes.default.svc/healthz", f"https://{first}/version"):
        argv = [sys.executable, "-c", HEALTHZ, url, ca.decode()]
        answered = pods.exec_pod(state_dir, "asker", argv, KUBE_NS)
        assert answered.returncode == 0, answered.stdout + answered.stderr
        assert answered.stdout.startswith("200 "), answered.stdout
    # The master's address on the underlay relays the API port and nothing else.
    for port in ("22", "2379"):
        argv = [sys.executable, "-c", CONNECT, MASTER, port]
        tried = pods.exec_pod(state_dir, "asker", argv, KUBE_NS)
        assert tried.stdout.strip() == "refused", tried.stdout + tried.stderr
