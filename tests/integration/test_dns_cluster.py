"""The cluster DNS of a real local cluster: etcd, master, two nodes whose real agents
serve DNS, pods started by ``podnet pod run`` (their resolv.conf names their node's
gateway) asking through glibc and dig. Services and EndpointSlices come from the API and
the endpoints controller, so this covers the agent's watches end to end.

One cluster for the module, torn down in a finalizer even when a test fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any

import pytest

from podnet.cluster import lifecycle, pods
from podnet.cluster.state import ClusterState
from podnet.model.kinds import HOST_SUBNET, SERVICE
from podnet.testing.e2e import TEST_DATAPLANE, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(600)]

NS = "dnsx"
WEB = f"web.{NS}.svc.cluster.local"


def service_object(namespace: str, name: str, selector: dict[str, str], **spec: Any) -> Any:
    ports = [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]
    body = {"selector": selector, "ports": ports, **spec}
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": body}


@dataclass
class Cluster:
    state_dir: Path
    gateways: dict[str, str]  # node -> its pod-subnet gateway
    ips: dict[str, str]  # service or pod name -> address

    def run(self, pod: str, argv: list[str]) -> str:
        done = pods.exec_pod(self.state_dir, pod, argv, NS, timeout=30)
        return done.stdout if done.returncode == 0 else f"exit {done.returncode}: {done.stderr}"

    def ahosts(self, pod: str, name: str) -> list[str]:
        out = self.run(pod, ["getent", "ahostsv4", name])
        return sorted({line.split()[0] for line in out.splitlines() if "STREAM" in line})

    def dig(self, pod: str, *args: str) -> str:
        return self.run(pod, ["dig", "+tries=1", "+time=2", *args])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state_dir = tmp_path_factory.mktemp("pn-dns")
    try:
        lifecycle.cluster_up(
            state_dir, lifecycle.ClusterSpec(nodes=2, dataplane=TEST_DATAPLANE), say=print
        )
        ips: dict[str, str] = {}
        with pods.admin_api(state_dir) as api:
            for namespace in (NS, "other"):
                pods.ensure_namespace(api, namespace)
            for name, selector, extra in (
                ("web", {"app": "b"}, {}),
                ("hl", {"tier": "hl"}, {"clusterIP": "None"}),
            ):
                made = api.create(SERVICE, service_object(NS, name, selector, **extra), NS)
                ips[name] = made["spec"].get("clusterIP", "")
            alias = {"type": "ExternalName", "externalName": WEB, "ports": []}
            api.create(SERVICE, service_object(NS, "alias", {}, **alias), NS)
            made = api.create(SERVICE, service_object("other", "db", {"app": "db"}), "other")
            ips["db"] = made["spec"]["clusterIP"]
            subnets = {n: api.get(HOST_SUBNET, None, n)["subnet"] for n in ("node1", "node2")}
            gateways = {
                node: str(IPv4Network(subnet).network_address + 1)
                for node, subnet in subnets.items()
            }
        for pod, node in (("a", "node1"), ("b", "node2")):
            record = pods.run_pod(state_dir, pod, NS, node, {"app": pod, "tier": "hl"})
            ips[pod] = str(record.ip)
        yield Cluster(state_dir, gateways, ips)
    finally:
        lifecycle.cluster_down(state_dir, say=print)


def test_pods_resolve_services_through_their_nodes_dns(cluster: Cluster) -> None:
    web = cluster.ips["web"]
    for pod in ("a", "b"):  # node1's pod asks node1's DNS, node2's pod node2's
        wait_for(lambda pod=pod: cluster.ahosts(pod, "web") == [web], 30, f"web from {pod}")
    assert cluster.ahosts("a", WEB) == [web]
    assert cluster.ahosts("a", "db.other") == [cluster.ips["db"]]  # another namespace
    assert cluster.ahosts("a", "alias") == [web]  # ExternalName chased in the zone
    srv = cluster.dig("a", "+short", "SRV", f"_http._tcp.{WEB}")
    assert srv.split() == ["0", "100", "80", f"{WEB}."]
    assert cluster.dig("a", "+short", "-x", web).split() == [f"{WEB}."]
    assert "status: NXDOMAIN" in cluster.dig("a", f"nope.{NS}.svc.cluster.local")
    nodata = cluster.dig("a", "AAAA", WEB)
    assert "status: NOERROR" in nodata and "ANSWER: 0" in nodata


def test_headless_follows_the_endpoints_controller(cluster: Cluster) -> None:
    both = sorted([cluster.ips["a"], cluster.ips["b"]])
    wait_for(lambda: cluster.ahosts("a", "hl") == both, 30, "headless endpoints")
    b = cluster.ips["b"]
    host = f"{b.replace('.', '-')}.hl.{NS}.svc.cluster.local"
    assert cluster.ahosts("b", host) == [b]
    assert cluster.dig("b", "+short", "-x", b).split() == [f"{host}."]
    pod_name = f"{b.replace('.', '-')}.{NS}.pod.cluster.local"
    assert cluster.ahosts("a", pod_name) == [b]


def test_a_new_service_is_answered(cluster: Cluster) -> None:
    with pods.admin_api(cluster.state_dir) as api:
        made = api.create(SERVICE, service_object(NS, "late", {"app": "none"}), NS)
    ip = made["spec"]["clusterIP"]
    for pod in ("a", "b"):
        wait_for(lambda pod=pod: cluster.ahosts(pod, "late") == [ip], 10, f"late from {pod}")


def test_a_pod_gets_no_answer_from_another_nodes_dns(cluster: Cluster) -> None:
    own = cluster.dig("b", f"@{cluster.gateways['node2']}", WEB)
    assert "ANSWER SECTION" in own
    other = cluster.dig("b", f"@{cluster.gateways['node1']}", WEB)
    assert "ANSWER SECTION" not in other and "status:" not in other, other
    state = ClusterState.load(cluster.state_dir)
    assert state is not None and len(state.nodes) == 2
