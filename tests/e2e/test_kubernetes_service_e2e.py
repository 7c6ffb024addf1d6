"""``default/kubernetes`` in a real local cluster: the Service exists with the first
service address and its endpoints hold the master's underlay address (its relay on the
external host, ``podnet.cluster.masteraccess``); pods get ``KUBERNETES_SERVICE_HOST`` and
``_PORT``; the cluster DNS answers its name through the pod's resolv.conf (glibc); and a
pod reaches the API through it, verifying the master's certificate by the Service's name.
The relay's address answers nothing but the API (attack: another port is refused)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from ipaddress import IPv4Network
from pathlib import Path

import pytest

from podnet.cluster import lifecycle, pods
from podnet.model.kinds import CLUSTER_NETWORK, ENDPOINTS, SERVICE
from podnet.testing.api import kubeconfig_parts
from podnet.testing.e2e import TEST_DATAPLANE, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(600)]

NS = "kk"
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
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    state_dir = tmp_path_factory.mktemp("pn-kube-svc")
    try:
        lifecycle.cluster_up(
            state_dir, lifecycle.ClusterSpec(nodes=1, dataplane=TEST_DATAPLANE), say=print
        )
        with pods.admin_api(state_dir) as api:
            network = IPv4Network(api.get(CLUSTER_NETWORK, None, "default")["serviceNetwork"])
        yield state_dir, str(network.network_address + 1)
    finally:
        lifecycle.cluster_down(state_dir, say=print)


def test_pods_find_the_kubernetes_service(cluster: tuple[Path, str]) -> None:
    state_dir, first = cluster
    with pods.admin_api(state_dir) as api:
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
    pods.run_pod(state_dir, "asker", NS, "node1", {"app": "asker"})
    shown = pods.exec_pod(state_dir, "asker", ["env"], NS).stdout.splitlines()
    assert f"KUBERNETES_SERVICE_HOST={first}" in shown
    assert "KUBERNETES_SERVICE_PORT=443" in shown and "KUBERNETES_SERVICE_PORT_HTTPS=443" in shown
    assert f"KUBERNETES_PORT_443_TCP=tcp://{first}:443" in shown
    for name in ("kubernetes.default.svc.cluster.local", "kubernetes.default"):
        found = pods.exec_pod(state_dir, "asker", ["getent", "hosts", name], NS)
        assert found.returncode == 0, found.stderr
        assert found.stdout.split()[0] == first, found.stdout
    _, ca, _ = kubeconfig_parts(state_dir / "master" / "admin.kubeconfig")
    for url in ("https://kubernetes.default.svc/healthz", f"https://{first}/version"):
        argv = [sys.executable, "-c", HEALTHZ, url, ca.decode()]
        answered = pods.exec_pod(state_dir, "asker", argv, NS)
        assert answered.returncode == 0, answered.stdout + answered.stderr
        assert answered.stdout.startswith("200 "), answered.stdout
    # The master's address on the underlay relays the API port and nothing else.
    for port in ("22", "2379"):
        argv = [sys.executable, "-c", CONNECT, MASTER, port]
        tried = pods.exec_pod(state_dir, "asker", argv, NS)
        assert tried.stdout.strip() == "refused", tried.stdout + tried.stderr
