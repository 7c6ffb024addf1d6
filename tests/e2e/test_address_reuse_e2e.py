"""Issue 19, finding 4, repeated with real traffic: an address released outside a DEL
must not hand the next pod the old Pod's policy identity.

A 1-node cluster in networkpolicy mode (etcd, master, agent, linux data plane, pods wired
by the real CNI plugin) whose node subnet is a /29: five pod addresses. ``vault/safe``
admits only namespaces labelled ``team=a`` (``friends``). ``friends/a``, ``friends/a2``
and two fillers in ``vault`` take the other four addresses. Then ``friends/a``'s address
is released behind its Pod's back, in one of the two ways the node does it:

- ``gc``: the runtime's CNI GC lists every attachment but ``a``'s;
- ``restart``: the agent stops, ``a``'s host veth disappears (a half-torn sandbox; on
  ovs its switch port too), and the agent's start-up cleanup releases the address it
  held.

``a``'s Pod object is left as it was (Running). ``strangers/b`` (``team=b``) is then
started on the node: the only free address is ``a``'s old one. Once the node holds the
rule set the API's objects compile to, ``b`` must not reach ``safe`` (it did, as ``a``,
before the fix), while it reaches ``a2`` (its address has an owner: ``b`` itself) and
``a2`` still reaches ``safe``; ``b``'s own status shows the address and ``a``'s does not.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podnet import netns
from podnet.cluster import lifecycle, nodes, pods
from podnet.cluster.state import PodRecord
from podnet.dataplane.ovs.tables import BRIDGE
from podnet.dataplane.wiring import host_veth_name
from podnet.model.kinds import NAMESPACE, NETWORK_POLICY, POD
from podnet.policy.trace import fetch_objects
from podnet.testing import planeview
from podnet.testing.chaos import quick_api
from podnet.testing.cniexec import run_cni
from podnet.testing.e2e import TEST_DATAPLANE, load_state, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(600)]

ECHO_PORT = 8080
COOLDOWN = "5"  # seconds; the agent's IPAM cool-down (30 s by default)
TEAMS = {"friends": "a", "strangers": "b", "vault": "v"}
FRIENDS_ONLY = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"name": "friends-only", "namespace": "vault"},
    "spec": {
        "podSelector": {},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}]}],
    },
}
FILLERS = (("safe", "vault"), ("a", "friends"), ("a2", "friends"), ("f0", "vault"), ("f1", "vault"))


@pytest.fixture
def cluster(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """The cluster with its five pods and the policy; the agent rests released
    addresses ``COOLDOWN`` seconds (it inherits the environment)."""
    monkeypatch.setenv("PODNET_IPAM_COOLDOWN_SECONDS", COOLDOWN)
    state_dir = tmp_path_factory.mktemp("pn-reuse")
    try:
        spec = lifecycle.ClusterSpec(
            nodes=1,
            plugin="networkpolicy",
            dataplane=TEST_DATAPLANE,
            master_args=("--cluster-network", "10.128.0.0/14:3"),  # a /29 per node
        )
        lifecycle.cluster_up(state_dir, spec, say=print)
        with pods.admin_api(state_dir) as api:
            for ns, team in TEAMS.items():
                body = {"metadata": {"name": ns, "labels": {"team": team}}}
                api.create(NAMESPACE, body)
            api.create(NETWORK_POLICY, FRIENDS_ONLY, namespace="vault")
        for name, ns in FILLERS:
            pods.run_pod(state_dir, name, ns, "node1")
        yield state_dir
    finally:
        lifecycle.cluster_down(state_dir, say=print)


def udp_echo(src_ns: str, ip: str) -> bool:
    """Whether the echo server at ``ip`` answers a datagram from ``src_ns``."""
    argv = [sys.executable, "-m", "podnet.testing.probe", json.dumps([[ip, "udp", ECHO_PORT]])]
    done = netns.run(src_ns, argv, timeout=30)
    return done.returncode == 0 and json.loads(done.stdout) == [True]


def record(state_dir: Path, ns: str, name: str) -> PodRecord:
    return load_state(state_dir).pods[f"{ns}/{name}"]


def pod_object(state_dir: Path, ns: str, name: str) -> dict[str, Any]:
    with pods.admin_api(state_dir) as api:
        found: dict[str, Any] = api.get(POD, ns, name)
    return found


def shown_ip(state_dir: Path, ns: str, name: str) -> str | None:
    return (pod_object(state_dir, ns, name).get("status") or {}).get("podIP")


def release_by_gc(state_dir: Path, victim: PodRecord) -> None:
    """The runtime's CNI GC, naming every attachment but the victim's."""
    state = load_state(state_dir)
    valid = [
        {"containerID": p.container_id, "ifname": "eth0"}
        for p in state.pods.values()
        if p.key != victim.key
    ]
    extra = {"cniVersion": "1.1.0", "cni.dev/valid-attachments": valid}
    answer = run_cni(state_dir, "node1", {"CNI_COMMAND": "GC"}, extra)
    assert answer.ok, answer.text


def release_by_restart(state_dir: Path, victim: PodRecord) -> None:
    """The agent stops, the victim's host veth goes, the agent starts again: its
    start-up cleanup releases the address the half-torn sandbox held."""
    state = load_state(state_dir)
    node = state.nodes["node1"]
    nodes.stop_agent(node, signal.SIGTERM, timeout=10)
    veth = host_veth_name(victim.container_id, "eth0")
    argv = ["ip", "-n", node.netns, "link", "del", veth]
    subprocess.run(argv, check=True, capture_output=True, timeout=30)
    if state.dataplane == "ovs":  # OVSDB keeps a port whose device is gone
        planeview.vsctl(state_dir, "node1", "--if-exists", "del-port", BRIDGE, veth)
    nodes.start_agent(state, node, state_dir)
    nodes.wait_agent_ready(node, state_dir, quick_api(state_dir))


def start_b(state_dir: Path) -> PodRecord | None:
    """``strangers/b`` on the node, or None while no address is free (rolled back)."""
    try:
        return pods.run_pod(state_dir, "b", "strangers", "node1")
    except pods.PodError:
        return None


def node_holds_the_apis_rules(state_dir: Path) -> bool:
    with pods.admin_api(state_dir) as api:
        rules = fetch_objects(api).ruleset()
    return not planeview.policy_behind(state_dir, load_state(state_dir), rules)


@pytest.mark.parametrize("release", [release_by_gc, release_by_restart], ids=["gc", "restart"])
def test_a_released_address_gives_the_next_pod_its_own_identity(
    cluster: Path, release: Any
) -> None:
    a, a2, safe = (
        record(cluster, ns, n) for n, ns in (("a", "friends"), ("a2", "friends"), ("safe", "vault"))
    )
    old_ip = a.ip
    wait_for(lambda: udp_echo(a.netns, safe.ip), 60, "the friend a to reach the vault")
    assert start_b(cluster) is None, "the /29 should be full"

    release(cluster, a)
    b = wait_for(lambda: start_b(cluster), 90, "b started once an address is free", interval=1.0)
    assert b.ip == old_ip, f"b got {b.ip}, not a's old {old_ip}: the test did not set up reuse"

    wait_for(lambda: udp_echo(b.netns, a2.ip), 60, "b (its address owned) to reach a2")
    wait_for(lambda: node_holds_the_apis_rules(cluster), 60, "the node to hold the API's rules")
    assert udp_echo(a2.netns, safe.ip), "the policy still admits friends"
    for _ in range(3):
        assert not udp_echo(b.netns, safe.ip), "b reached the vault with a's identity"
    assert shown_ip(cluster, "strangers", "b") == b.ip, "b's own status was not written"
    assert shown_ip(cluster, "friends", "a") != old_ip, "a's Pod still shows the address"
