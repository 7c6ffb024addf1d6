"""Services on a real local cluster: etcd, master (cluster IPs, node ports, endpoints
controller), three agents running the nftables service proxy, pods wired by the real CNI
plugin, and real traffic from pods, nodes and the underlay's external host.

One 3-node cluster for the module (``--external-ip-cidrs 203.0.113.0/24``), torn down in
a finalizer even when a test fails. Namespace ``svc`` holds ``web1..3`` (one per node,
label ``app=web`` and ``id=web<k>``) serving "who am I" on TCP 8080 (the answer is
``<pod> <peer address>``), and the clients ``c1..c3`` (one per node). Each test makes
its own Services (and pods, removed again), so the tests do not depend on each other.
A client is a bounded loop of connections (``podnet.testing.servicelab``'s client) that
counts who answered and which errors it met. Changes are awaited on the traffic itself,
with a bounded wait; no test measures time (``bench/bench_services.py`` does).
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from ipaddress import IPv4Network
from typing import Any

import pytest

from podnet import netns
from podnet.client import StatusError
from podnet.cluster import lifecycle, nodes, pods
from podnet.cluster.readiness import ReadinessCheck
from podnet.model.kinds import CLUSTER_NETWORK, POD, SERVICE
from podnet.testing.e2e import TEST_DATAPLANE, cluster_down_with_logs, wait_for
from podnet.testing.servicecluster import (
    SETTLE,
    Cluster,
    answers_from,
    extra_pods,
    listening,
    nft_table,
    table_changes,
)
from podnet.testing.servicelab import Result

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(600)]

NS = "svc"
NODES = 3
PORT = 8080
EXTERNAL_CIDR = IPv4Network("203.0.113.0/24")
IPERF_PORT = 5201
STREAM_SECONDS = 20  # long enough for two agents to be killed, restarted and resynced


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state_dir = tmp_path_factory.mktemp("pn-svc")
    try:
        spec = lifecycle.ClusterSpec(
            nodes=NODES,
            master_args=("--external-ip-cidrs", str(EXTERNAL_CIDR)),
            dataplane=TEST_DATAPLANE,
        )
        lifecycle.cluster_up(state_dir, spec, say=print)
        found = Cluster(state_dir, NS)
        for k in range(1, NODES + 1):
            found.whoami(f"web{k}", k, {"app": "web", "id": f"web{k}"})
            pods.run_pod(state_dir, f"c{k}", NS, f"node{k}", {"role": "client"})
        yield found
    finally:
        cluster_down_with_logs(state_dir)


def all_web() -> set[str]:
    return {f"web{k}" for k in range(1, NODES + 1)}


# --- ClusterIP --------------------------------------------------------------------------


def test_cluster_ip_spreads_over_endpoints_on_three_nodes(cluster: Cluster) -> None:
    ip = cluster.service("spread", {"app": "web"})["spec"]["clusterIP"]
    for k in range(1, NODES + 1):
        answers_from(cluster, f"c{k}", ip, all_web(), 30)
    for k in range(1, NODES + 1):
        result = cluster.from_pod(f"c{k}", ip, count=300)
        counts = result.by_pod()
        assert result.errors == {}, result
        assert set(counts) == all_web() and sum(counts.values()) == 300, counts
        assert max(counts.values()) <= 150, f"c{k}: one endpoint got more than half: {counts}"


def test_agent_sigkill_during_iperf3_through_a_cluster_ip(cluster: Cluster) -> None:
    """Both agents on the path (client's and server's node) are killed and restarted
    while iperf3 streams through the cluster IP: the stream goes on, every interval
    carries data, and neither node's service table changes (handles included)."""
    with extra_pods(cluster) as made:
        command = ("iperf3", "-s", "-p", str(IPERF_PORT))
        pods.run_pod(cluster.state_dir, "ipf", NS, "node3", {"app": "ipf"}, command=command)
        made.append("ipf")
        target = [{"port": IPERF_PORT, "targetPort": IPERF_PORT, "protocol": "TCP"}]
        ip = cluster.service("ipf", {"app": "ipf"}, ports=target)["spec"]["clusterIP"]
        client = cluster.pod("c1")

        def iperf(seconds: int, *extra: str) -> list[str]:
            argv = ["iperf3", "-c", ip, "-p", str(IPERF_PORT), "--connect-timeout", "2000"]
            argv += ["-t", str(seconds), *extra]
            return netns.command(client.netns, argv)

        def short_run_works() -> bool:
            done = subprocess.run(iperf(1), capture_output=True, text=True, timeout=30)
            return done.returncode == 0

        wait_for(short_run_works, SETTLE, "a short iperf3 run through the cluster IP", 0.5)
        state = cluster.state()
        restarted = [state.nodes["node1"], state.nodes["node3"]]
        before = {node.name: nft_table(node.netns) for node in restarted}
        applied = {node.name: applied_count(cluster, node.name) for node in restarted}
        stream = subprocess.Popen(
            iperf(STREAM_SECONDS, "-i", "1", "-J"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(lambda: established(client.netns, ip), 15, "the iperf3 stream", 0.05)
            for node in restarted:
                nodes.stop_agent(node, signal.SIGKILL, timeout=5)
            for node in restarted:
                nodes.start_agent(state, node, cluster.state_dir)
            with cluster.api() as api:
                for node in restarted:
                    nodes.wait_agent_ready(node, cluster.state_dir, api)
            for node in restarted:
                wait_for(
                    lambda n=node.name: applied_count(cluster, n) > applied[n],
                    SETTLE,
                    f"{node.name}'s restarted agent applying its services",
                )
            assert stream.poll() is None, "the agents restarted after the stream had ended"
            out, err = stream.communicate(timeout=60)
        finally:
            if stream.poll() is None:
                stream.kill()
                stream.wait(10)
        assert stream.returncode == 0, err + out[-2000:]
        report = json.loads(out)
        carried = [interval["sum"]["bytes"] for interval in report["intervals"]]
        assert len(carried) >= STREAM_SECONDS and all(carried), carried
        assert report["end"]["sum_received"]["bytes"] > 0
        for node in restarted:
            changes = table_changes(before[node.name], nft_table(node.netns))
            assert not changes, f"{node.name}'s table changed: {changes}"


def applied_count(cluster: Cluster, node: str) -> int:
    """How many times the agent of ``node`` logged applying its service table."""
    log = nodes.node_paths(cluster.state_dir, node).agent_log
    return log.read_text(errors="replace").count("services applied:")


def established(namespace: str, ip: str) -> bool:
    argv = ["ss", "-Htn", "state", "established", "dst", f"{ip}:{IPERF_PORT}"]
    return len(netns.run(namespace, argv).stdout.splitlines()) >= 2  # control + data


def test_named_target_port_is_resolved_per_pod(cluster: Cluster) -> None:
    with extra_pods(cluster) as made:
        for name, node, number in (("np1", 1, 8080), ("np2", 2, 9090)):
            ports = [("http", number, "TCP")]
            cluster.whoami(name, node, {"app": "named"}, port=number, ports=ports)
            made.append(name)
        ports = [{"port": 80, "targetPort": "http", "protocol": "TCP"}]
        ip = cluster.service("named", {"app": "named"}, ports=ports)["spec"]["clusterIP"]
        result = answers_from(cluster, "c3", ip, {"np1", "np2"}, 40)
        assert result.errors == {}
        with cluster.api() as api:
            subsets = api.get("endpoints", NS, "named")["subsets"]
        numbers = {(a["ip"], s["ports"][0]["port"]) for s in subsets for a in s["addresses"]}
        assert numbers == {(cluster.pod("np1").ip, 8080), (cluster.pod("np2").ip, 9090)}


def test_traffic_follows_scaling_readiness_and_labels(cluster: Cluster) -> None:
    check = ReadinessCheck(tcp_port=9091, period=0.2, timeout=0.2, failures=1)
    with extra_pods(cluster) as made:
        for name, node in (("f1", 1), ("f2", 2)):
            cluster.whoami(name, node, {"app": "follow"})
            made.append(name)
        cluster.whoami("f3", 3, {"app": "follow"}, readiness=check)
        made.append("f3")
        ip = cluster.service("follow", {"app": "follow"})["spec"]["clusterIP"]
        answers_from(cluster, "c1", ip, {"f1", "f2"}, 40)  # f3 is not ready
        with listening(cluster.pod("f3"), 9091):
            answers_from(cluster, "c1", ip, {"f1", "f2", "f3"}, 60)  # readiness flips
        answers_from(cluster, "c1", ip, {"f1", "f2"}, 40)  # and back
        pods.delete_pod(cluster.state_dir, "f2", NS)  # scale down
        answers_from(cluster, "c1", ip, {"f1"}, 10)
        cluster.whoami("f4", 2, {"app": "follow"})  # scale up
        made.append("f4")
        answers_from(cluster, "c1", ip, {"f1", "f4"}, 40)
        with cluster.api() as api:  # a label change takes f1 out, and back in
            api.patch(POD, NS, "f1", {"metadata": {"labels": {"app": "moved"}}})
            answers_from(cluster, "c1", ip, {"f4"}, 10)
            api.patch(POD, NS, "f1", {"metadata": {"labels": {"app": "follow"}}})
            answers_from(cluster, "c1", ip, {"f1", "f4"}, 40)


# --- traffic policies ---------------------------------------------------------------------


def test_session_affinity_client_ip_holds_one_backend(cluster: Cluster) -> None:
    ip = cluster.service("sticky", {"app": "web"}, sessionAffinity="ClientIP")["spec"]["clusterIP"]
    for k in range(1, NODES + 1):
        wait_for(lambda c=f"c{k}": cluster.from_pod(c, ip).answers, SETTLE, "a first answer")
        result = cluster.from_pod(f"c{k}", ip, count=60)
        assert result.errors == {} and len(result.by_pod()) == 1, result


def test_no_endpoints_refuses_and_the_service_still_exists(cluster: Cluster) -> None:
    ip = cluster.service("nobody", {"app": "matches-nothing"})["spec"]["clusterIP"]

    def refused() -> bool:
        result = cluster.from_pod("c2", ip, count=5)
        return result.errors == {"refused": 5} and not result.answers

    wait_for(refused, SETTLE, "connections to an endpointless service refused")
    with cluster.api() as api:
        assert api.get(SERVICE, NS, "nobody")["spec"]["clusterIP"] == ip
        assert not api.get("endpoints", NS, "nobody").get("subsets")


def test_hairpin_a_pod_reaches_itself_through_its_service(cluster: Cluster) -> None:
    ip = cluster.service("hairpin", {"id": "web2"})["spec"]["clusterIP"]
    result = answers_from(cluster, "web2", ip, {"web2"}, 5)
    assert sum(result.by_pod().values()) == 5


def test_node_port_from_every_node_pods_and_the_external_host(cluster: Cluster) -> None:
    made = cluster.service("np", {"app": "web"}, type="NodePort")
    port = made["spec"]["ports"][0]["nodePort"]
    ext_ns, _ = cluster.external()
    sources = [cluster.node_ns(k) for k in range(1, NODES + 1)] + [ext_ns]
    for k in range(1, NODES + 1):
        target = cluster.node_ip(k)
        for source in sources:

            def answered(source: str = source, target: str = target) -> Result | None:
                result = cluster.from_netns(source, target, port, count=6)
                return result if not result.errors and result.answers else None

            wait_for(answered, SETTLE, f"{source} -> {target}:{port}")
        from_pod = cluster.from_pod("c1", target, port, count=6)
        assert not from_pod.errors and set(from_pod.by_pod()) <= all_web(), from_pod


def test_external_traffic_policy_local_keeps_the_source_and_stays_local(cluster: Cluster) -> None:
    made = cluster.service("local", {"id": "web1"}, type="NodePort", externalTrafficPolicy="Local")
    port = made["spec"]["ports"][0]["nodePort"]
    ext_ns, ext_ip = cluster.external()

    def from_outside() -> Result | None:
        result = cluster.from_netns(ext_ns, cluster.node_ip(1), port, count=5)
        return result if not result.errors and result.answers else None

    result: Result = wait_for(from_outside, SETTLE, "node1's node port from outside")
    assert result.answers == {f"web1 {ext_ip}": 5}, "the backend sees the real client"
    for k in (2, 3):  # no local endpoint: no answer (the node port is programmed there)
        wait_for(lambda k=k: f". {port} :" in nft_text(cluster.node_ns(k)), SETTLE, "node port")
        silent = cluster.from_netns(ext_ns, cluster.node_ip(k), port, count=2)
        assert not silent.answers and silent.errors, silent


def nft_text(namespace: str) -> str:
    return netns.run(namespace, ["nft", "list", "table", "ip", "podnet_services"]).stdout


def test_external_ips_answer_from_outside_masqueraded(cluster: Cluster) -> None:
    external = str(EXTERNAL_CIDR.network_address + 10)
    cluster.service("extip", {"app": "web"}, externalIPs=[external])
    ext_ns, ext_ip = cluster.external()
    route = ["ip", "route", "replace", f"{external}/32", "via", cluster.node_ip(2)]
    netns.run(ext_ns, route, check=True)  # the external host's own route, in its namespace
    try:

        def answered() -> Result | None:
            result = cluster.from_netns(ext_ns, external, 80, count=30)
            return result if not result.errors and result.answers else None

        result: Result = wait_for(answered, SETTLE, f"the external IP {external}")
        assert set(result.by_pod()) <= all_web() and len(result.by_pod()) >= 2, result
        assert ext_ip not in result.peers(), "Cluster policy masquerades outside clients"
    finally:
        netns.run(ext_ns, ["ip", "route", "del", f"{external}/32"])


# --- bad input ----------------------------------------------------------------------------


def test_bad_services_are_refused_clearly_and_change_nothing(cluster: Cluster) -> None:
    with cluster.api() as api:
        network = IPv4Network(api.get(CLUSTER_NETWORK, None, "default")["serviceNetwork"])
    taken_ip = str(network.network_address + 250)
    first = cluster.service("first", {"app": "web"}, type="NodePort", clusterIP=taken_ip)
    taken_port = first["spec"]["ports"][0]["nodePort"]
    for k in range(1, NODES + 1):  # programmed on every node
        answers_from(cluster, f"c{k}", taken_ip, all_web(), 30)
    with cluster.api() as api:
        before = names(api)
    tables = {k: nft_table(cluster.node_ns(k)) for k in range(1, NODES + 1)}
    nodeport = [{"port": 80, "targetPort": PORT, "protocol": "TCP"}]
    cases = [
        ({"clusterIP": taken_ip}, "spec.clusterIP", f"already used by {NS}/first"),
        ({"clusterIP": "10.1.2.3"}, "spec.clusterIP", "valid range"),
        ({"type": "NodePort", "ports": [{**nodeport[0], "nodePort": taken_port}]},
         "spec.ports[0].nodePort", f"already used by {NS}/first"),
        ({"type": "NodePort", "ports": [{**nodeport[0], "nodePort": 80}]},
         "spec.ports[0].nodePort", "30000-32767"),
        ({"externalIPs": ["198.51.100.1"]}, "spec.externalIPs[0]", str(EXTERNAL_CIDR)),
    ]  # fmt: skip
    for spec, field, words in cases:
        with pytest.raises(StatusError) as refused:
            cluster.service("bad", {"app": "web"}, **spec)
        error = refused.value
        assert error.code == 422, error
        causes = {c.get("field") for c in error.details.get("causes", [])}
        assert field in causes and words in error.message, (spec, error.message, causes)
    with cluster.api() as api:
        assert names(api) == before, "a refused Service was stored"
    for k in range(1, NODES + 1):
        changes = table_changes(tables[k], nft_table(cluster.node_ns(k)))
        assert not changes, f"node{k}'s table changed: {changes}"
    answers_from(cluster, "c1", taken_ip, all_web(), 30)  # the first one still works


def names(api: Any) -> list[str]:
    return sorted(item["metadata"]["name"] for item in api.list(SERVICE, NS)["items"])
