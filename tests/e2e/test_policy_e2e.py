"""Isolation and NetworkPolicy on a real local cluster, decided by real traffic.

A 3-node cluster per mode (etcd, master, agents on the linux data plane, pods wired by
the real CNI plugin), torn down in a finalizer even when a test fails.

- networkpolicy: namespaces x, y, z with pods a, b, c, spread over the 3 nodes (a pod's
  node is its index within the namespace plus the namespace's, mod 3), each serving TCP
  and UDP echo on ports 80 and 81 under the names of ``podnet.testing.netpol``. Every
  case of that table (and a few ipBlock cases written for the real addresses) is
  applied through the API, with its label changes made to the running pods; once every
  node's kernel holds the rule set the API's objects compile to, every ordered pair of
  pods is probed on TCP and UDP 80 and 81 from inside the pods. The traffic must match
  the case's expected matrix and ``podnet trace``'s verdict (``evaluate`` on the same
  compiled rule set) for every pair, port and protocol.
- multitenant: projects a, b and default; the matrix before and after join, isolate and
  global, through the real ``podnet adm pod-network`` commands.

Probes are bounded: each batch runs concurrently with a 1.5 s timeout per probe.
"""

from __future__ import annotations

import contextlib
import json
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

import pytest

from podnet import netns
from podnet.cluster import lifecycle, nodes, pods
from podnet.cluster.state import ClusterState
from podnet.controllers.config import plugin_name
from podnet.model.kinds import NAMESPACE, NETWORK_POLICY, POD
from podnet.policy.evaluate import evaluate
from podnet.policy.model import RuleSet
from podnet.policy.trace import fetch_objects
from podnet.testing import planeview
from podnet.testing.cli import run_kubectl, run_podnet
from podnet.testing.e2e import TEST_DATAPLANE
from podnet.testing.netpol import CASES, KEYS, NAMESPACES, Case, container_ports, expected
from podnet.testing.probe import SourcePorts, probe_pairs

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(1800)]

SERVICES = [("TCP", 80), ("TCP", 81), ("UDP", 80), ("UDP", 81)]
SYNC_TIMEOUT = 30.0
SOURCE_PORTS = SourcePorts(start=random.randint(10000, 32767))  # fresh 5-tuples (see probe)
Verdicts = dict[tuple[str, str, str, int], bool]


# --- the cluster --------------------------------------------------------------------------


@dataclass
class Cluster:
    state_dir: Path
    plugin: str

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "master" / "admin.kubeconfig"

    def state(self) -> ClusterState:
        found = ClusterState.load(self.state_dir)
        assert found is not None
        return found

    def api(self) -> Any:
        return pods.admin_api(self.state_dir)

    def rules(self) -> RuleSet:
        """What ``podnet trace`` computes: the API's objects compiled."""
        with self.api() as api:
            return fetch_objects(api).ruleset()

    def behind(self, rules: RuleSet) -> list[str]:
        """The nodes whose data plane does not hold ``rules`` rendered for them yet (linux:
        the nftables table, ovs: br0's tables 21 and 80; see ``planeview``)."""
        return planeview.policy_behind(self.state_dir, self.state(), rules)

    def converge(self) -> RuleSet:
        """Wait until every node's kernel holds the rules the API's objects compile to."""
        deadline = time.monotonic() + SYNC_TIMEOUT
        while True:
            rules = self.rules()
            late = self.behind(rules)
            if not late:
                return rules
            if time.monotonic() > deadline:
                pytest.fail(f"policy tables of {late} still differ after {SYNC_TIMEOUT} s")
            time.sleep(0.1)

    def ip(self, key: str) -> IPv4Address:
        ns, name = key.split("/")
        pod = pods.find_pod(self.state(), name, ns)
        assert pod.ip
        return IPv4Address(pod.ip)

    def probe(self, keys: Sequence[str], services: Sequence[tuple[str, int]]) -> Verdicts:
        """Every ordered pair of distinct pods on every service, one batch per source."""
        state = self.state()
        netns_of = {}
        for key in keys:
            ns, name = key.split("/")
            netns_of[key] = pods.find_pod(state, name, ns).netns
        return probe_pairs(netns_of, {k: self.ip(k) for k in keys}, services, SOURCE_PORTS)

    def traced(
        self, rules: RuleSet, keys: Sequence[str], services: Sequence[tuple[str, int]]
    ) -> Verdicts:
        address = {k: self.ip(k) for k in keys}
        return {
            (s, d, p, n): evaluate(rules, address[s], address[d], p, n).allowed
            for s in keys
            for d in keys
            if s != d
            for p, n in services
        }


def disagreements(traffic: Verdicts, trace: Verdicts) -> list[str]:
    return [
        f"{src} -> {dst} {proto}/{port}: traffic {'passes' if traffic[k] else 'blocked'}, "
        f"trace says {'allowed' if trace[k] else 'denied'}"
        for k in trace
        for src, dst, proto, port in [k]
        if traffic[k] != trace[k]
    ]


def up(tmp: Path, plugin: str) -> Cluster:
    spec = lifecycle.ClusterSpec(nodes=3, plugin=plugin, dataplane=TEST_DATAPLANE)
    lifecycle.cluster_up(tmp, spec, say=print)
    return Cluster(tmp, plugin_name(plugin))


def down(state_dir: Path) -> None:
    state = ClusterState.load(state_dir)
    lifecycle.cluster_down(state_dir, say=print)
    if state is not None:
        left = [n for n in state.namespaces if netns.exists(n)]
        assert not left, f"namespaces left behind: {left}"


@pytest.fixture(scope="module")
def netpol(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """x, y, z with a, b, c each on 3 nodes, serving TCP and UDP 80 and 81 with named ports."""
    state_dir = tmp_path_factory.mktemp("pn-netpol")
    try:
        cluster = up(state_dir, "networkpolicy")
        ports = [
            (p["name"], p["containerPort"], p["protocol"])
            for c in container_ports()
            for p in c["ports"]
        ]
        for i, ns in enumerate(NAMESPACES):
            for j, name in enumerate(("a", "b", "c")):
                node = f"node{(i + j) % 3 + 1}"
                pods.run_pod(state_dir, name, ns, node, {"pod": name}, ports=ports)
        with cluster.api() as api:
            for ns in NAMESPACES:
                api.patch(NAMESPACE, None, ns, {"metadata": {"labels": {"ns": ns}}})
        yield cluster
    finally:
        down(state_dir)


# --- networkpolicy ------------------------------------------------------------------------


def relabel(cluster: Cluster, case: Case, undo: bool = False) -> None:
    """The case's pod and namespace labels on the running objects (or back to the usual)."""
    with cluster.api() as api:
        for key, labels in case.pod_labels.items():
            ns, name = key.split("/")
            usual = {"pod": name}
            want = usual if undo else labels
            drop = {k: None for k in (labels if undo else usual) if k not in want}
            api.patch(POD, ns, name, {"metadata": {"labels": {**drop, **want}}})
        for ns, labels in case.ns_labels.items():
            usual = {"ns": ns}
            want = usual if undo else labels
            drop = {k: None for k in (labels if undo else usual) if k not in want}
            api.patch(NAMESPACE, None, ns, {"metadata": {"labels": {**drop, **want}}})


def apply_policies(cluster: Cluster, policies: Sequence[dict[str, Any]]) -> None:
    with cluster.api() as api:
        for policy in policies:
            api.create(
                NETWORK_POLICY,
                {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", **policy},
            )


def remove_policies(cluster: Cluster, policies: Sequence[dict[str, Any]]) -> None:
    with cluster.api() as api:
        for policy in policies:
            meta = policy["metadata"]
            api.delete(NETWORK_POLICY, meta["namespace"], meta["name"])


def matrix_of(verdicts: Verdicts, protocol: str, port: int | None) -> str:
    rows = []
    for src in KEYS:
        bits = "".join(
            "1" if src == dst or verdicts[(src, dst, protocol, port or 0)] else "0" for dst in KEYS
        )
        rows.append(f"{src} {bits[0:3]} {bits[3:6]} {bits[6:9]}")
    return "\n".join(rows)


def run_case(
    cluster: Cluster, name: str, policies: Sequence[dict[str, Any]], case: Case | None
) -> Verdicts:
    """Apply, converge, probe, compare with trace (and the case's matrix); then remove."""
    if case is not None:
        relabel(cluster, case)
    apply_policies(cluster, policies)
    try:
        rules = cluster.converge()
        traffic = cluster.probe(KEYS, SERVICES)
        wrong = disagreements(traffic, cluster.traced(rules, KEYS, SERVICES))
        assert not wrong, f"{name}:\n" + "\n".join(wrong)
        if case is not None and case.protocol in ("TCP", "UDP") and case.port in (80, 81):
            assert matrix_of(traffic, case.protocol, case.port) == case.want, name
        return traffic
    finally:
        remove_policies(cluster, policies)
        if case is not None:
            relabel(cluster, case, undo=True)


PROBED = [c for c in CASES if not c.uses_addresses and c.protocol in ("TCP", "UDP")]


def test_there_are_at_least_thirty_probed_cases() -> None:
    assert len(PROBED) + len(ADDRESS_CASES) >= 30


@pytest.mark.parametrize("case", PROBED, ids=lambda c: c.name)
def test_policy_case_matches_trace_and_expectation(netpol: Cluster, case: Case) -> None:
    run_case(netpol, case.name, case.policies, case)


def _block_to_xa(cidr: str, excepts: list[str]) -> dict[str, Any]:
    block: dict[str, Any] = {"cidr": cidr, **({"except": excepts} if excepts else {})}
    spec = {
        "podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"ipBlock": block}]}],
    }
    return {"metadata": {"namespace": "x", "name": "from-block"}, "spec": spec}


def _block_from_xa(cidr: str, excepts: list[str]) -> dict[str, Any]:
    block: dict[str, Any] = {"cidr": cidr, **({"except": excepts} if excepts else {})}
    spec = {
        "podSelector": {"matchLabels": {"pod": "a"}},
        "policyTypes": ["Egress"],
        "egress": [
            {"to": [{"ipBlock": block}], "ports": [{"port": 80}, {"port": 81, "protocol": "UDP"}]}
        ],
    }
    return {"metadata": {"namespace": "x", "name": "to-block"}, "spec": spec}


ADDRESS_CASES: list[tuple[str, Callable[[Cluster], dict[str, Any]]]] = [
    (
        "ipblock-cluster-except-one-pod",
        lambda c: _block_to_xa("10.128.0.0/14", [f"{c.ip('y/b')}/32"]),
    ),
    ("ipblock-except-a-node-subnet", lambda c: _block_to_xa("10.128.0.0/14", ["10.128.2.0/23"])),
    ("ipblock-one-pod", lambda c: _block_to_xa(f"{c.ip('z/c')}/32", [])),
    (
        "egress-ipblock-except-with-ports",
        lambda c: _block_from_xa("10.128.0.0/14", [f"{c.ip('x/b')}/32"]),
    ),
]


@pytest.mark.parametrize("name,make", ADDRESS_CASES, ids=[n for n, _ in ADDRESS_CASES])
def test_ipblock_case_matches_trace(
    netpol: Cluster, name: str, make: Callable[[Cluster], dict[str, Any]]
) -> None:
    traffic = run_case(netpol, name, [make(netpol)], None)
    assert not all(traffic.values()), "the ipBlock policy blocked nothing"


def test_changes_at_runtime_and_no_stale_rule(netpol: Cluster) -> None:
    """Add a policy, relabel a pod into and out of it, remove it; the tables end as a
    fresh agent builds them from the same objects."""
    allow_b = {
        "metadata": {"namespace": "x", "name": "allow-b"},
        "spec": {
            "podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [
                {"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"pod": "b"}}}]}
            ],
        },
    }
    apply_policies(netpol, [allow_b])
    try:
        netpol.converge()
        before = netpol.probe(["y/c", "x/a"], [("TCP", 80)])
        assert not before[("y/c", "x/a", "TCP", 80)]
        with netpol.api() as api:
            api.patch(POD, "y", "c", {"metadata": {"labels": {"pod": "b"}}})
        netpol.converge()
        assert netpol.probe(["y/c", "x/a"], [("TCP", 80)])[("y/c", "x/a", "TCP", 80)]
        with netpol.api() as api:
            api.patch(POD, "y", "c", {"metadata": {"labels": {"pod": "c"}}})
        netpol.converge()
        assert not netpol.probe(["y/c", "x/a"], [("TCP", 80)])[("y/c", "x/a", "TCP", 80)]
        deny = {
            "metadata": {"namespace": "y", "name": "deny"},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
        }
        apply_policies(netpol, [deny])
        rules = netpol.converge()
        assert_own_node_reaches_its_pod_and_others_do_not(netpol, rules, "y/a")
        remove_policies(netpol, [deny])
        netpol.converge()
        assert_fresh_agent_builds_the_same(netpol)
    finally:
        remove_policies(netpol, [allow_b])
    netpol.converge()
    assert all(netpol.probe(KEYS, [("TCP", 80)]).values())


def assert_own_node_reaches_its_pod_and_others_do_not(
    cluster: Cluster, rules: RuleSet, key: str
) -> None:
    """``key`` is isolated both ways: its own node still reaches it (Kubernetes never
    blocks that), the other nodes do not; trace says the same from the node addresses."""
    state = cluster.state()
    ns, name = key.split("/")
    home = pods.find_pod(state, name, ns).node
    target = str(cluster.ip(key))
    for node_name, node in state.nodes.items():
        argv = [sys.executable, "-m", "podnet.testing.probe", json.dumps([[target, "tcp", 80]])]
        passed = json.loads(netns.run(node.netns, argv, timeout=30).stdout) == [True]
        assert passed == (node_name == home), f"{node_name} -> {key}: {passed}"
        assert evaluate(rules, node.ip, target, "TCP", 80).allowed == (node_name == home)


def assert_fresh_agent_builds_the_same(cluster: Cluster) -> None:
    """Each node: the table now, then its agent stopped, the table deleted, the agent
    started afresh on the same objects; the two tables must be equal."""
    state = cluster.state()
    tables = planeview.snapshots(cluster.state_dir, state)
    assert any(tables.values()), (
        "no node holds a policy table"
    )  # nodes without isolated pods hold none
    with cluster.api() as api:
        for name, node in state.nodes.items():
            before = tables[name]
            nodes.stop_agent(node)
            planeview.drop_policy(cluster.state_dir, state, name)
            nodes.start_agent(state, node, cluster.state_dir)
            nodes.wait_agent_ready(node, cluster.state_dir, api)
            cluster.converge()
            assert planeview.policy_snapshot(cluster.state_dir, state, name) == before, name
        state.save(cluster.state_dir)


# --- multitenant ---------------------------------------------------------------------------

MT_PODS = ["a/p1", "a/p2", "b/p1", "b/p2", "default/p1"]


@pytest.fixture(scope="module")
def multitenant(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state_dir = tmp_path_factory.mktemp("pn-mt")
    try:
        cluster = up(state_dir, "multitenant")
        for i, key in enumerate(MT_PODS):
            ns, name = key.split("/")
            pods.run_pod(
                state_dir, name, ns, f"node{i % 3 + 1}", {"app": name}, ports=[(None, 80, "TCP")]
            )
        yield cluster
    finally:
        down(state_dir)


def mt_matrix(cluster: Cluster) -> str:
    """Probe every pair on TCP 80 (and check trace agrees); rows as in the expectations."""
    rules = cluster.converge()
    services = [("TCP", 80)]
    traffic = cluster.probe(MT_PODS, services)
    wrong = disagreements(traffic, cluster.traced(rules, MT_PODS, services))
    assert not wrong, "\n".join(wrong)
    return "\n".join(
        f"{s} " + "".join("1" if s == d or traffic[(s, d, "TCP", 80)] else "0" for d in MT_PODS)
        for s in MT_PODS
    )


def adm(cluster: Cluster, *args: str) -> None:
    done = run_podnet(cluster.kubeconfig, "adm", "pod-network", *args)
    assert done.returncode == 0, done.stderr


EVERYONE = expected("""
    a/p1 11111
    a/p2 11111
    b/p1 11111
    b/p2 11111
    default/p1 11111
""")


def test_multitenant_join_isolate_global(multitenant: Cluster) -> None:
    isolated = expected("""
        a/p1 11001
        a/p2 11001
        b/p1 00111
        b/p2 00111
        default/p1 11111
    """)
    assert mt_matrix(multitenant) == isolated
    adm(multitenant, "join-projects", "--to", "a", "b")
    assert mt_matrix(multitenant) == EVERYONE
    adm(multitenant, "isolate-projects", "b")
    assert mt_matrix(multitenant) == isolated
    adm(multitenant, "make-projects-global", "b")
    assert mt_matrix(multitenant) == EVERYONE
    adm(multitenant, "isolate-projects", "b")
    assert mt_matrix(multitenant) == isolated


def test_a_pod_whose_object_is_deleted_reaches_nobody(multitenant: Cluster) -> None:
    """Issue 19, the fail-open: ``kubectl delete pod --force --grace-period=0`` removes the
    object while the sandbox runs on, wired. Its address has no live owner any more, so it
    reaches no project (not even its own, nor the global one) and nobody reaches it."""
    orphan = "a/orphan"
    pods.run_pod(
        multitenant.state_dir, "orphan", "a", "node1", {"app": "orphan"}, ports=[(None, 80, "TCP")]
    )
    try:
        keys = [*MT_PODS, orphan]
        multitenant.converge()
        before = multitenant.probe(keys, [("TCP", 80)])
        assert before[(orphan, "a/p1", "TCP", 80)] and before[(orphan, "default/p1", "TCP", 80)]
        assert before[("a/p2", orphan, "TCP", 80)]
        done = run_kubectl(
            multitenant.kubeconfig, "delete", "pod", "orphan", "-n", "a",
            "--force", "--grace-period=0",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        rules = multitenant.converge()
        assert multitenant.ip(orphan) not in rules.owned
        after = multitenant.probe(keys, [("TCP", 80)])
        leaks = [k for k, ok in after.items() if ok and orphan in k[:2]]
        assert not leaks, leaks
        assert after[("a/p1", "a/p2", "TCP", 80)] and after[("b/p1", "default/p1", "TCP", 80)]
    finally:
        pods.delete_pod(multitenant.state_dir, "orphan", "a", say=lambda _: None)


def test_trace_cli_probes_agree_with_the_data_plane(netpol: Cluster) -> None:
    """The real `podnet trace --probe`, one pair and the whole matrix, on the cluster."""
    to_xa = {
        "metadata": {"namespace": "x", "name": "to-xa"},
        "spec": {
            "podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}],
        },
    }
    apply_policies(netpol, [to_xa])
    try:
        netpol.converge()
        state = ("--state-dir", str(netpol.state_dir))
        allowed = run_podnet(
            netpol.kubeconfig, "trace", "x/b", "x/a", "--port", "80", "--probe", *state
        )
        assert allowed.returncode == 0, allowed.stdout + allowed.stderr
        assert "ALLOWED" in allowed.stdout and "x/to-xa/ingress/0" in allowed.stdout
        assert "probe: connected (data plane agrees)" in allowed.stdout
        denied = run_podnet(
            netpol.kubeconfig,
            "trace",
            "y/b",
            "x/a",
            "--port",
            "81",
            "--protocol",
            "udp",
            "--probe",
            *state,
        )
        assert denied.returncode == 0, denied.stdout + denied.stderr
        assert "DENIED" in denied.stdout and "probe: no answer (data plane agrees)" in denied.stdout
        matrix = ("--matrix", "-n", "x", "-n", "y", "--port", "80", "--probe")
        grid = run_podnet(netpol.kubeconfig, "trace", *matrix, *state, timeout=180)
        assert grid.returncode == 0, grid.stdout + grid.stderr
        assert "probed 30 pairs: 30 agree, 0 disagree" in grid.stdout, grid.stdout
        assert "✗" in grid.stdout  # the policy does deny some pairs
    finally:
        remove_policies(netpol, [to_xa])


# --- the egress firewall (EgressNetworkPolicy) --------------------------------------------

FIREWALL = "network.openshift.io/v1"


def reaches_outside(cluster: Cluster, key: str) -> bool:
    """A TCP echo from pod ``key`` to the external host (outside the cluster)."""
    from podnet.cluster import matrix

    state = cluster.state()
    assert state.external is not None
    pod = state.pods[key]
    source = matrix.Endpoint(pod.name, pod.node, pod.ip, pod.netns)
    return matrix.tcp_probe(source, state.external.ip).ok


def outside_matrix(cluster: Cluster, want: dict[str, bool]) -> None:
    """Wait (bounded) until every pod of ``want`` reaches the outside as it says."""
    deadline = time.monotonic() + SYNC_TIMEOUT
    while True:
        found = {key: reaches_outside(cluster, key) for key in want}
        if found == want:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"outside reachability {found}, want {want}")
        time.sleep(0.2)


def outside_through_a_service(cluster: Cluster, outside: str) -> None:
    """A selector-less Service whose Endpoints name the outside host (OpenShift SDN's known
    way around its firewall): blocked for x, which the firewall denies, open for y."""
    from podnet.cluster import matrix
    from podnet.model.kinds import ENDPOINTS, SERVICE

    ports = [{"name": "echo", "port": 8080, "protocol": "TCP"}]
    with cluster.api() as api:
        made = api.create(
            SERVICE,
            {"metadata": {"name": "outside", "namespace": "x"}, "spec": {"ports": ports}},
        )
        api.create(
            ENDPOINTS,
            {
                "metadata": {"name": "outside", "namespace": "x"},
                "subsets": [{"addresses": [{"ip": outside}], "ports": ports}],
            },
        )
    try:
        ip, state = made["spec"]["clusterIP"], cluster.state()

        def reaches(key: str) -> bool:
            pod = state.pods[key]
            source = matrix.Endpoint(pod.name, pod.node, pod.ip, pod.netns)
            return matrix.tcp_probe(source, ip, 8080).ok

        deadline = time.monotonic() + SYNC_TIMEOUT
        while not reaches("y/a"):  # the proxy has the service once y gets through
            if time.monotonic() > deadline:
                pytest.fail("y/a never reached the outside service")
            time.sleep(0.2)
        assert not reaches("x/a") and not reaches("x/c")
    finally:
        with cluster.api() as api:
            api.delete(SERVICE, "x", "outside")
            if api.list(ENDPOINTS, namespace="x")["items"]:  # a user's Endpoints stay
                with contextlib.suppress(Exception):
                    api.delete(ENDPOINTS, "x", "outside")


def firewall(rules: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "apiVersion": FIREWALL,
        "kind": "EgressNetworkPolicy",
        "metadata": {"name": "default", "namespace": "x"},
        "spec": {"egress": [{"type": t, "to": {"cidrSelector": c}} for t, c in rules]},
    }


def test_the_egress_firewall_filters_only_the_projects_way_out(netpol: Cluster) -> None:
    from podnet.model.kinds import EGRESS_NETWORK_POLICY

    state = netpol.state()
    assert state.external is not None
    outside = f"{state.external.ip}/32"
    x_pods, others = ["x/a", "x/b", "x/c"], ["y/a", "z/b"]
    outside_matrix(netpol, dict.fromkeys(x_pods + others, True))
    with netpol.api() as api:
        made = api.create(EGRESS_NETWORK_POLICY, firewall([("Deny", outside)]))
    (condition,) = made["status"]["conditions"]
    assert (condition["type"], condition["status"]) == ("Enforced", "True"), condition
    try:
        outside_matrix(netpol, {**dict.fromkeys(x_pods, False), **dict.fromkeys(others, True)})
        state_flag = ("--state-dir", str(netpol.state_dir))
        traced = run_podnet(
            netpol.kubeconfig, "trace", "x/a", state.external.ip, "--port", "8080", "--probe",
            *state_flag,
        )  # fmt: skip
        assert traced.returncode == 0, traced.stdout + traced.stderr  # the probe agrees
        assert "egress firewall x/default: DENIED by rule 0" in traced.stdout, traced.stdout
        outside_through_a_service(netpol, state.external.ip)
        rules = netpol.converge()  # pod to pod is untouched by the firewall
        traffic = netpol.probe(KEYS, [("TCP", 80)])
        assert all(traffic.values()), [k for k, v in traffic.items() if not v]
        assert not disagreements(traffic, netpol.traced(rules, KEYS, [("TCP", 80)]))
        with netpol.api() as api:  # deny all but an allowed exception, first match wins
            current = api.get(EGRESS_NETWORK_POLICY, "x", "default")
            rules_ = [("Allow", outside), ("Deny", "0.0.0.0/0")]
            api.replace(EGRESS_NETWORK_POLICY, {**current, "spec": firewall(rules_)["spec"]})
        outside_matrix(netpol, dict.fromkeys(x_pods + others, True))
        with netpol.api() as api:  # the exception goes: nothing stale lets it through
            current = api.get(EGRESS_NETWORK_POLICY, "x", "default")
            rules_ = [("Allow", "198.51.100.0/24"), ("Deny", "0.0.0.0/0")]
            api.replace(EGRESS_NETWORK_POLICY, {**current, "spec": firewall(rules_)["spec"]})
        outside_matrix(netpol, {**dict.fromkeys(x_pods, False), **dict.fromkeys(others, True)})
    finally:
        with netpol.api() as api:
            api.delete(EGRESS_NETWORK_POLICY, "x", "default")
    outside_matrix(netpol, dict.fromkeys(x_pods + others, True))
