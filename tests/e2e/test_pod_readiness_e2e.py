"""Pods of a real local cluster (etcd, master, a real agent, pods wired by the real CNI
plugin): readiness reported through the API, the pod's resolv.conf, its service
variables, and the ``dns`` of a real CNI ADD result.

One 1-node cluster for the module, torn down in a finalizer even when a test fails; after
``cluster down`` no /etc/netns directory of its pods is left (the runtime's GC).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any

import pytest

from podnet import netns
from podnet.cluster import lifecycle, pods
from podnet.cluster.podresolv import ETC_NETNS
from podnet.cluster.readiness import ReadinessCheck
from podnet.cluster.state import ClusterState, PodRecord
from podnet.cluster.underlay import tcp_listens
from podnet.model.kinds import CLUSTER_NETWORK, ENDPOINTS, HOST_SUBNET, POD, SERVICE
from podnet.testing.e2e import TEST_DATAPLANE, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(600)]

NS = "rd"


def fast(tcp_port: int | None = None, command: str | None = None) -> ReadinessCheck:
    """A check that flips on one result: every 0.2 s for a port; every 2 s for a command,
    which starts a shell and three programs in the pod's sandbox and on a loaded machine
    takes longer than 0.2 s (it would then fail every time, as a timed-out probe does)."""
    if command is not None:
        return ReadinessCheck(tcp_port, command, period=2.0, timeout=2.0, failures=1)
    return ReadinessCheck(tcp_port, command, period=0.2, timeout=0.2, failures=1)


@dataclass
class Cluster:
    state_dir: Path
    gateway: str
    service_ip: str
    netns_seen: set[str]

    def state(self) -> ClusterState:
        state = ClusterState.load(self.state_dir)
        assert state is not None
        return state

    def pod(self, name: str) -> PodRecord:
        record = pods.find_pod(self.state(), name, NS)
        self.netns_seen.add(record.netns)
        return record

    def run(self, name: str, **options: Any) -> PodRecord:
        pods.run_pod(self.state_dir, name, NS, "node1", {"app": name}, **options)
        return self.pod(name)


def port_80_service(name: str, selector: dict[str, str]) -> dict[str, Any]:
    """A Service ``name`` in NS: its port 80 to port 8080 of the pods ``selector`` picks."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"selector": selector, "ports": [{"port": 80, "targetPort": 8080}]},
    }


def _service(service_network: str) -> dict[str, Any]:
    ip = str(IPv4Network(service_network).network_address + 200)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web-front", "namespace": NS},
        "spec": {
            "clusterIP": ip,
            "selector": {"app": "web"},
            "ports": [
                {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                {"name": "dns", "port": 53, "protocol": "UDP"},
            ],
        },
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state_dir = tmp_path_factory.mktemp("pn-ready")
    seen: set[str] = set()
    try:
        lifecycle.cluster_up(
            state_dir, lifecycle.ClusterSpec(nodes=1, dataplane=TEST_DATAPLANE), say=print
        )
        with pods.admin_api(state_dir) as api:
            pods.ensure_namespace(api, NS)
            network = api.get(CLUSTER_NETWORK, None, "default")
            created = api.create(SERVICE, _service(network["serviceNetwork"]), namespace=NS)
            subnet = IPv4Network(api.get(HOST_SUBNET, None, "node1")["subnet"])
        yield Cluster(
            state_dir, str(subnet.network_address + 1), created["spec"]["clusterIP"], seen
        )
    finally:
        lifecycle.cluster_down(state_dir, say=print)
        leftover = sorted(name for name in seen if (ETC_NETNS / name).exists())
        assert not leftover, f"cluster down left /etc/netns entries: {leftover}"


def pod_object(cluster: Cluster, name: str) -> dict[str, Any]:
    with pods.admin_api(cluster.state_dir) as api:
        return dict(api.get(POD, NS, name))


def condition(cluster: Cluster, name: str, kind: str = "Ready") -> str | None:
    status = pod_object(cluster, name).get("status") or {}
    found = [c for c in status.get("conditions") or [] if c.get("type") == kind]
    return str(found[0]["status"]) if found else None


def wait_condition(cluster: Cluster, name: str, value: str, kind: str = "Ready") -> None:
    wait_for(lambda: condition(cluster, name, kind) == value, 30, f"{name} {kind}={value}")


def expected_resolv_conf(gateway: str) -> str:
    return (
        f"nameserver {gateway}\n"
        f"search {NS}.svc.cluster.local svc.cluster.local cluster.local\n"
        "options ndots:5\n"
    )


def test_a_pod_without_a_check_is_ready_once_running(cluster: Cluster) -> None:
    cluster.run("plain")
    wait_condition(cluster, "plain", "True")
    assert condition(cluster, "plain", "ContainersReady") == "True"
    assert pods.find_pod(cluster.state(), "plain", NS).prober is None


def test_the_pod_resolves_through_the_cluster_dns(cluster: Cluster) -> None:
    pod = cluster.run("resolver")
    own = ETC_NETNS / pod.netns / "resolv.conf"
    assert own.read_text() == expected_resolv_conf(cluster.gateway)
    host_before = Path("/etc/resolv.conf").read_bytes()
    seen = pods.exec_pod(cluster.state_dir, "resolver", ["cat", "/etc/resolv.conf"], NS)
    assert seen.returncode == 0 and seen.stdout == expected_resolv_conf(cluster.gateway)
    assert Path("/etc/resolv.conf").read_bytes() == host_before, "the host's file is untouched"
    pid = pod.process.pid if pod.process else 0
    root_view = Path(f"/proc/{pid}/root/etc/resolv.conf")
    assert root_view.read_text() == expected_resolv_conf(cluster.gateway), "the pod process too"
    # the pod's user can neither rewrite nor replace it (attack: point the pod elsewhere)
    for attack in ("echo nameserver 6.6.6.6 > /etc/resolv.conf", f"rm -f {own}"):
        tried = pods.exec_pod(cluster.state_dir, "resolver", ["sh", "-c", attack], NS)
        assert tried.returncode != 0, attack
    assert own.read_text() == expected_resolv_conf(cluster.gateway)
    pods.delete_pod(cluster.state_dir, "resolver", NS)
    assert not own.exists() and not own.parent.exists(), "removed with the pod"


def test_the_pod_gets_its_namespace_service_variables(cluster: Cluster) -> None:
    pod = cluster.run("envpod")
    assert pod.process is not None
    raw = Path(f"/proc/{pod.process.pid}/environ").read_bytes().split(b"\0")
    env = dict(item.decode().split("=", 1) for item in raw if b"=" in item)
    ip = cluster.service_ip
    assert env["WEB_FRONT_SERVICE_HOST"] == ip
    assert env["WEB_FRONT_SERVICE_PORT"] == "80"
    assert env["WEB_FRONT_SERVICE_PORT_HTTP"] == "80"
    assert env["WEB_FRONT_SERVICE_PORT_DNS"] == "53"
    assert env["WEB_FRONT_PORT"] == f"tcp://{ip}:80"
    assert env["WEB_FRONT_PORT_53_UDP"] == f"udp://{ip}:53"
    assert env["WEB_FRONT_PORT_53_UDP_ADDR"] == ip
    assert not any(k.startswith("KUBECONFIG") for k in env), "nothing of the caller's"
    shown = pods.exec_pod(cluster.state_dir, "envpod", ["env"], NS).stdout.splitlines()
    assert f"WEB_FRONT_SERVICE_HOST={ip}" in shown, "pod exec gets them too"


@contextlib.contextmanager
def listener(pod: PodRecord, port: int) -> Iterator[subprocess.Popen[bytes]]:
    """An echo server on ``port`` inside the pod's namespace, stopped by PID."""
    argv = [sys.executable, "-m", "podnet.cluster.echo", "--port", str(port)]
    process = subprocess.Popen(netns.command(pod.netns, argv), start_new_session=True)
    try:
        wait_for(lambda: tcp_listens(pod.netns, port), 15, f"listener on {port}")
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def endpoint_ips(cluster: Cluster, name: str) -> tuple[list[str], list[str]]:
    """The ready and not-ready addresses of the Endpoints ``name``."""
    from podnet.client import StatusError

    try:
        with pods.admin_api(cluster.state_dir) as api:
            subsets = api.get(ENDPOINTS, NS, name).get("subsets") or []
    except StatusError:
        return [], []
    ready = [a["ip"] for s in subsets for a in s.get("addresses") or []]
    not_ready = [a["ip"] for s in subsets for a in s.get("notReadyAddresses") or []]
    return ready, not_ready


def test_tcp_readiness_follows_the_port_and_endpoints_follow(cluster: Cluster) -> None:
    with pods.admin_api(cluster.state_dir) as api:
        api.create(SERVICE, port_80_service("gate", {"app": "tcpgate"}), namespace=NS)
    pod = cluster.run("tcpgate", readiness=fast(tcp_port=9091))
    assert pod.prober is not None and pod.prober.alive()
    wait_condition(cluster, "tcpgate", "False")
    container = pod_object(cluster, "tcpgate")["spec"]["containers"][0]
    assert container["readinessProbe"]["tcpSocket"] == {"port": 9091}
    not_ready: tuple[list[str], list[str]] = ([], [pod.ip])
    wait_for(lambda: endpoint_ips(cluster, "gate") == not_ready, 30, "a notReady address")
    with listener(pod, 9091):
        wait_condition(cluster, "tcpgate", "True")
        assert condition(cluster, "tcpgate", "ContainersReady") == "True"
        ready: tuple[list[str], list[str]] = ([pod.ip], [])
        wait_for(lambda: endpoint_ips(cluster, "gate") == ready, 30, "a ready address")
    wait_condition(cluster, "tcpgate", "False")
    wait_for(lambda: endpoint_ips(cluster, "gate") == not_ready, 30, "notReady again")
    with listener(pod, 9091):
        wait_condition(cluster, "tcpgate", "True")


def test_command_readiness_runs_in_the_pod_as_its_user(cluster: Cluster) -> None:
    flag = Path("/tmp") / f"pn-ready-{uuid.uuid4().hex[:8]}"  # in the pod's own /tmp
    # The check passes only as the pod's user (its command is PID 2 of the pod's PID
    # namespace), in the pod's network namespace (lo and eth0) and its sandbox (the pod's
    # resolv.conf and /tmp), once the pod has written the flag.
    where = (
        'test "$(id -u)" != 0 && test "$(id -u)" = "$(stat -c %u /proc/2)"'
        ' && test "$(grep -c : /proc/net/dev)" = 2'
        f' && grep -q "nameserver {cluster.gateway}" /etc/resolv.conf'
    )
    cluster.run("cmdgate", readiness=fast(command=f"{where} && test -f {flag}"))
    wait_condition(cluster, "cmdgate", "False")
    assert not flag.exists(), "the host's /tmp is not the pod's"
    touched = pods.exec_pod(cluster.state_dir, "cmdgate", ["touch", str(flag)], NS)
    assert touched.returncode == 0, touched.stderr
    wait_condition(cluster, "cmdgate", "True")
    pods.exec_pod(cluster.state_dir, "cmdgate", ["rm", str(flag)], NS)
    wait_condition(cluster, "cmdgate", "False")


def test_a_dead_process_is_not_ready_and_its_prober_ends(cluster: Cluster) -> None:
    pod = cluster.run("mortal", readiness=fast(tcp_port=8080))
    wait_condition(cluster, "mortal", "True")
    assert pod.process is not None and pod.prober is not None
    os.kill(pod.process.pid, signal.SIGKILL)
    wait_condition(cluster, "mortal", "False")
    prober = pod.prober
    wait_for(lambda: not prober.alive(), 15, "the prober's exit")
    statuses = pod_object(cluster, "mortal")["status"]["containerStatuses"]
    assert statuses[0]["ready"] is False and "terminated" in statuses[0]["state"]


def test_deleting_a_pod_stops_its_prober_and_removes_its_files(cluster: Cluster) -> None:
    pod = cluster.run("brief", readiness=fast(tcp_port=8080))
    wait_condition(cluster, "brief", "True")
    assert pod.prober is not None and (ETC_NETNS / pod.netns / "resolv.conf").exists()
    pods.delete_pod(cluster.state_dir, "brief", NS)
    assert not pod.prober.alive()
    assert not (ETC_NETNS / pod.netns).exists()
    assert not netns.exists(pod.netns)


def test_the_real_cni_result_carries_dns(cluster: Cluster) -> None:
    state = cluster.state()
    name = f"{state.prefix()}-p-dnscheck"
    record = PodRecord("dnscheck", NS, "node1", name, uuid.uuid4().hex * 2)
    state.record_netns(name, cluster.state_dir)
    netns.create(name)
    try:
        result = pods.cni_call(cluster.state_dir, record, "ADD")
        assert result["dns"] == {
            "nameservers": [cluster.gateway],
            "search": [f"{NS}.svc.cluster.local", "svc.cluster.local", "cluster.local"],
            "options": ["ndots:5"],
        }
        assert json.dumps(result).count("ndots") == 1
    finally:
        pods.cni_call(cluster.state_dir, record, "DEL")
        netns.remove(name)


def test_trace_and_describe_through_a_service(cluster: Cluster) -> None:
    from podnet.testing.cli import run_podnet

    service = port_80_service("echo", {"role": "echo"})
    with pods.admin_api(cluster.state_dir) as api:
        api.create(SERVICE, service, namespace=NS)
    backends = [
        pods.run_pod(cluster.state_dir, name, NS, "node1", {"role": "echo"})
        for name in ("echo1", "echo2")
    ]
    cluster.run("tracer")
    ips = sorted(b.ip for b in backends)
    wait_for(lambda: sorted(endpoint_ips(cluster, "echo")[0]) == ips, 30, "two endpoints")
    admin = cluster.state_dir / "master" / "admin.kubeconfig"
    flags = ("--port", "80", "--probe", "--state-dir", str(cluster.state_dir))
    traced = run_podnet(admin, "trace", f"{NS}/tracer", f"svc/{NS}/echo", *flags)
    assert traced.returncode == 0, traced.stdout + traced.stderr
    lines = traced.stdout.splitlines()
    assert lines[0].startswith(f"service {NS}/echo: {NS}/tracer -> ")
    assert "endpoints: 2 ready (picked at random), 0 not ready" in lines
    assert "ALLOWED: every ready endpoint agrees" in lines
    probed = [line for line in lines if "probe: connected (data plane agrees)" in line]
    assert len(probed) == 3, traced.stdout  # each endpoint, then the cluster IP
    described = run_podnet(admin, "describe", "svc", "echo", "-n", NS)
    assert described.returncode == 0, described.stderr
    shown = next(line for line in described.stdout.splitlines() if line.startswith("Endpoints:"))
    assert sorted(shown.split()[1].split(",")) == sorted(f"{ip}:8080" for ip in ips)


def test_a_pod_resolves_a_service_by_its_short_name(cluster: Cluster) -> None:
    """The pod's resolv.conf (search list, ndots) with the node's DNS server and glibc."""
    service = port_80_service("named", {"role": "named"})
    with pods.admin_api(cluster.state_dir) as api:
        ip = api.create(SERVICE, service, namespace=NS)["spec"]["clusterIP"]
    cluster.run("asker")

    def answer(name: str) -> list[str]:
        done = pods.exec_pod(cluster.state_dir, "asker", ["getent", "hosts", name], NS)
        return done.stdout.split()[:1] if done.returncode == 0 else []

    for name in ("named", f"named.{NS}", f"named.{NS}.svc.cluster.local"):
        assert wait_for(functools.partial(answer, name), 15, f"{name} resolved") == [ip]
    assert answer("no-such-service") == []
