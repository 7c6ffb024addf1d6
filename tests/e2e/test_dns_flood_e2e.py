"""A DNS flood from one pod, repeated for real (issue 19, finding 5): a one-node local
cluster (etcd, master, the real agent with NetworkPolicy), a ``flooder`` pod sending
UDP queries to its node's DNS as fast as it can, and a ``victim`` pod on the same node
asking for a service meanwhile.

Before per-client limits and the DNS's own thread, the flood took the agent's loop:
most of the victim's queries went unanswered, and policy changes waited behind it.
Now: every one of the victim's queries is answered, the flooder is limited (its
dropped queries counted in the agent's ``/metrics``), and the agent applies a
NetworkPolicy created during the flood before the flood ends. The timing goals (victim
p99, policy programming p99) are measured by ``bench/bench_dns_flood.py``.

One cluster for the module, torn down in a finalizer even when a test fails.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any

import pytest

from podnet.cluster import lifecycle, nodes, pods
from podnet.cluster.state import ClusterState
from podnet.dns import ratelimit
from podnet.model.kinds import HOST_SUBNET, NETWORK_POLICY, SERVICE
from podnet.testing.dnsflood import Flood, counter, metrics, probe, restart_agent
from podnet.testing.e2e import TEST_DATAPLANE, cluster_down_with_logs, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(600)]

NS = "flood"
WEB = f"web.{NS}.svc.cluster.local"
METRICS_PORT = 9153
FLOOD_SECONDS = 20.0
LIMITED = 'podnet_dns_client_limited_total{limit="uncached_qps"}'


@dataclass
class Cluster:
    state_dir: Path
    gateway: str
    node_netns: str
    victim: str  # network namespaces of the two pods
    flooder: str

    def policy_note(self) -> dict[str, Any]:
        path = nodes.node_paths(self.state_dir, "node1").agent_dir / "policy.json"
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            return {}


def service(name: str) -> dict[str, Any]:
    ports = [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]
    spec = {"selector": {"app": name}, "ports": ports}
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec}


def allow_all(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"podSelector": {}, "ingress": [{}]},
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state_dir = tmp_path_factory.mktemp("pn-flood") / "state"
    try:
        spec = lifecycle.ClusterSpec(nodes=1, plugin="networkpolicy", dataplane=TEST_DATAPLANE)
        lifecycle.cluster_up(state_dir, spec, say=print)
        with pods.admin_api(state_dir) as api:
            pods.ensure_namespace(api, NS)
            api.create(SERVICE, service("web"), NS)
            subnet = IPv4Network(api.get(HOST_SUBNET, None, "node1")["subnet"])
        victim = pods.run_pod(state_dir, "victim", NS, "node1", {"app": "victim"})
        flooder = pods.run_pod(state_dir, "flooder", NS, "node1", {"app": "flooder"})
        restart_agent(state_dir, "node1", ["--metrics-address", f"127.0.0.1:{METRICS_PORT}"])
        state = ClusterState.load(state_dir)
        assert state is not None
        found = Cluster(
            state_dir,
            str(subnet.network_address + 1),
            state.nodes["node1"].netns,
            victim.netns,
            flooder.netns,
        )
        wait_for(
            lambda: probe(found.victim, found.gateway, WEB, 1)[0] is not None,
            60,
            "the restarted agent's DNS answering",
        )
        metrics(found.node_netns, METRICS_PORT)
        wait_for(lambda: found.policy_note().get("applied_at"), 60, "the first policy apply")
        yield found
    finally:
        cluster_down_with_logs(state_dir)


def test_a_flood_from_one_pod_leaves_another_pods_queries_and_policy_alone(
    cluster: Cluster,
) -> None:
    before = counter(metrics(cluster.node_netns, METRICS_PORT), LIMITED)
    # ever-new names: none is in any cache, so each costs the server a full answer
    flood = Flood(cluster.flooder, cluster.gateway, FLOOD_SECONDS, [WEB], fresh=True)
    try:
        time.sleep(2.0)  # the flood is on
        changes = cluster.policy_note().get("changes", 0)
        with pods.admin_api(cluster.state_dir) as api:
            api.create(NETWORK_POLICY, allow_all("during-flood"), NS)
        wait_for(
            lambda: cluster.policy_note().get("changes", 0) > changes,
            FLOOD_SECONDS / 2,
            "the policy created during the flood applied",
        )
        # 20 queries, one at a time, each sent once with 2 s to answer: a query dropped
        # (the old server's socket overflowing with the flood) is never answered
        answers = probe(cluster.victim, cluster.gateway, WEB, 20, 2.0, 0.05)
        assert flood.process.poll() is None, ("the probes outlasted the flood", answers)
        sent = flood.result()
    finally:
        flood.stop()
    assert None not in answers, f"victim queries unanswered: {answers}"
    limited = counter(metrics(cluster.node_netns, METRICS_PORT), LIMITED) - before
    assert limited > 0, "no query of the flooder was limited"
    # the bucket let through at most its 2 s and its rate over the flood's time
    rate = ratelimit.DEFAULT_UNCACHED_QPS
    allowed = rate * ratelimit.BURST_SECONDS + rate * (FLOOD_SECONDS + 1)
    assert sent["answered"] <= allowed < sent["sent"], sent
