"""Attacks from inside pods on a real local cluster (issue 8, findings 1 and 7).

One 3-node vxlan cluster in networkpolicy mode (etcd, master, real agents, pods wired by
the real CNI plugin), torn down in a finalizer even when a test fails. In namespace
``sec``: an ``attacker`` and ``target1`` on node1, ``target2`` on node2, a ``victim`` on
node3, and a policy that lets only the victim reach the targets.

- Tunnel safety: the attacker (denied by the policy) sends hand-made VXLAN frames whose
  inner packet forges the victim's address, to its own node's VTEP, to another node's
  and, nested, to a remote gateway; the outside host on the underlay does the same. The
  targets' receivers see none of it, while the same frame from a real peer node (the
  control) arrives and real cross-node traffic still flows.
- Pod anti-spoofing: the attacker sends raw Ethernet frames forging the victim's IP, and
  its IP and MAC, to a target on its node and to one across the tunnel; none arrives,
  while the victim's own frame, sent the same way, does.
- Pod sandbox: from inside a pod, podnet's secrets (tokens, kubeconfigs, keys) cannot be
  read, no node's CNI socket answers, and the pod does not run as root unless asked.

Every send is a few datagrams and every wait is bounded.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

import pytest

from podnet import netns
from podnet.cluster import lifecycle, nodes, pods, underlay
from podnet.cluster.state import ClusterState
from podnet.dataplane.interface import pod_mac
from podnet.model.kinds import HOST_SUBNET, NETWORK_POLICY
from podnet.model.underlaymac import UNDERLAY_MAC_ANNOTATION
from podnet.testing import planeview, spoof
from podnet.testing.e2e import TEST_DATAPLANE, wait_for
from podnet.testing.lab import link_mac
from podnet.testing.underlayforge import Spoof
from podnet.testing.underlayforge import inject as forge
from podnet.testing.vxlan import Forgery, Receiver, inject

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(900)]

NS = "sec"
TARGET_PORT = 19999
# A kept sleep, the window of a negative check: a forged frame that got through would reach
# the receiver within milliseconds of being sent; none may have come before the control,
# which ends the receiver. It cannot fail a correct data plane, only widen the window.
LATE = 1.5
ECHO_PORT = 8080
PLACEMENT = {"attacker": "node1", "target1": "node1", "target2": "node2", "victim": "node3"}
ROLES = {"attacker": "attacker", "target1": "target", "target2": "target", "victim": "victim"}
ONLY_VICTIM = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"name": "only-victim", "namespace": NS},
    "spec": {
        "podSelector": {"matchLabels": {"role": "target"}},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "victim"}}}]}],
    },
}


@dataclass
class Cluster:
    state_dir: Path
    state: ClusterState

    def pod_ns(self, name: str) -> str:
        return self.state.pods[f"{NS}/{name}"].netns

    def pod_ip(self, name: str) -> IPv4Address:
        return IPv4Address(self.state.pods[f"{NS}/{name}"].ip)

    def node_ip(self, node: str) -> IPv4Address:
        return IPv4Address(self.state.nodes[node].ip)


def udp_echo(src_ns: str, ip: IPv4Address, port: int = ECHO_PORT) -> bool:
    """Whether the echo server at ``ip:port`` answers a datagram from ``src_ns``."""
    argv = [sys.executable, "-m", "podnet.testing.probe", json.dumps([[str(ip), "udp", port]])]
    done = netns.run(src_ns, argv, timeout=30)
    return done.returncode == 0 and json.loads(done.stdout) == [True]


def udp_denied(src_ns: str, ip: IPv4Address) -> bool:
    return not udp_echo(src_ns, ip)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state_dir = tmp_path_factory.mktemp("pn-attacks")
    try:
        spec = lifecycle.ClusterSpec(
            nodes=3, tunnel="vxlan", plugin="networkpolicy", dataplane=TEST_DATAPLANE
        )
        lifecycle.cluster_up(state_dir, spec, say=print)
        for name, node in PLACEMENT.items():
            pods.run_pod(state_dir, name, NS, node, {"role": ROLES[name]})
        with pods.admin_api(state_dir) as api:
            api.create(NETWORK_POLICY, ONLY_VICTIM, namespace=NS)
        state = ClusterState.load(state_dir)
        assert state is not None
        yield Cluster(state_dir, state)
    finally:
        lifecycle.cluster_down(state_dir, say=print)


# --- finding 1: VXLAN injection -------------------------------------------------------


def gateway(cluster: Cluster, node: str) -> IPv4Address:
    """``node``'s pods' gateway address (on br0 for linux, tun0 for ovs)."""
    return planeview.gateway(cluster.state, node)


def frame(cluster: Cluster, node: str, to: IPv4Address, target: str, token: str) -> Forgery:
    """A frame for ``node``'s VTEP, sent to ``to``, forging the victim toward ``target``:
    the tunnel id, UDP port and inner MAC the node's real peers use (``planeview.tunnel``)."""
    vni, port, mac = planeview.tunnel(cluster.state_dir, cluster.state, node)
    victim = cluster.pod_ip("victim")
    return Forgery(to, port, vni, mac, victim, cluster.pod_ip(target), TARGET_PORT, token)


def tokens(receiver: Receiver) -> list[str]:
    return [line.split(" ", 1)[1] for line in receiver.lines()]


def test_policy_denies_the_attacker_and_lets_the_victim_in(cluster: Cluster) -> None:
    attacker, victim = cluster.pod_ns("attacker"), cluster.pod_ns("victim")
    for target in ("target1", "target2"):
        ip = cluster.pod_ip(target)
        denied = functools.partial(udp_denied, attacker, ip)
        wait_for(denied, 60, f"the policy to deny the attacker {target}")
        assert udp_echo(victim, ip), f"the victim reaches {target}"


def test_forged_vxlan_to_another_node_is_dropped(cluster: Cluster) -> None:
    test_policy_denies_the_attacker_and_lets_the_victim_in(cluster)
    attacker, outside = cluster.pod_ns("attacker"), cluster.state.external
    assert outside is not None
    node2 = cluster.node_ip("node2")
    receiver = Receiver(cluster.pod_ns("target2"), TARGET_PORT, stop="control")
    inject(attacker, frame(cluster, "node2", node2, "target2", "pod-to-remote-vtep"))
    gateway2 = gateway(cluster, "node2")
    inject(attacker, frame(cluster, "node2", gateway2, "target2", "nested-in-tunnel"))
    inject(outside.netns, frame(cluster, "node2", node2, "target2", "outside-host"))
    time.sleep(LATE)
    control = frame(cluster, "node2", node2, "target2", "control")
    inject(cluster.state.nodes["node3"].netns, control)
    assert tokens(receiver) == ["control"], "only the peer node's frame may arrive"


def test_forged_vxlan_to_the_own_node_is_dropped(cluster: Cluster) -> None:
    test_policy_denies_the_attacker_and_lets_the_victim_in(cluster)
    attacker = cluster.pod_ns("attacker")
    node1 = cluster.node_ip("node1")
    receiver = Receiver(cluster.pod_ns("target1"), TARGET_PORT, stop="control")
    inject(attacker, frame(cluster, "node1", node1, "target1", "pod-to-own-vtep"))
    gateway1 = gateway(cluster, "node1")
    inject(attacker, frame(cluster, "node1", gateway1, "target1", "pod-to-own-gateway"))
    time.sleep(LATE)
    # The control comes from the victim's own node, as the victim's real traffic would:
    # ovs also checks that a peer sends only its own pods' addresses (tun_src vs nw_src).
    inject(cluster.state.nodes["node3"].netns, frame(cluster, "node1", node1, "target1", "control"))
    assert tokens(receiver) == ["control"]


def test_underlay_injection_forging_a_peer_s_address_is_dropped(cluster: Cluster) -> None:
    """Issue 19, finding 7: the outside host writes VXLAN whose outer source is node3's
    address, to node2. With its own MAC: dropped by node2, since node3 published its
    underlay MAC (through the real master: Node, HostSubnet, agent). With node3's MAC as
    well (what no node can tell from node3: the residual risk, see the lab tests in
    tests/integration/test_underlay_injection.py): dropped by the local cluster's
    underlay switch, whose ports take only their own host's MAC (port security)."""
    test_policy_denies_the_attacker_and_lets_the_victim_in(cluster)
    outside = cluster.state.external
    assert outside is not None
    uplink = underlay.uplink_name(cluster.state)
    node2, node3 = cluster.state.nodes["node2"], cluster.state.nodes["node3"]
    node3_mac = link_mac(node3.netns, uplink)
    with pods.admin_api(cluster.state_dir) as api:
        published = api.get(HOST_SUBNET, None, "node3")["metadata"]["annotations"]
    assert published.get(UNDERLAY_MAC_ANNOTATION) == node3_mac
    inner = frame(cluster, "node2", cluster.node_ip("node2"), "target2", "control")

    def spoofed(src_mac: str, token: str) -> Spoof:
        forgery = replace(inner, token=token)
        return Spoof(
            uplink, src_mac, link_mac(node2.netns, uplink), cluster.node_ip("node3"), forgery
        )

    receiver = Receiver(cluster.pod_ns("target2"), TARGET_PORT, stop="control")
    forge(outside.netns, spoofed(link_mac(outside.netns, uplink), "forged-peer-address"))
    forge(outside.netns, spoofed(node3_mac, "forged-peer-address-and-mac"))
    time.sleep(LATE)
    forge(node3.netns, spoofed(node3_mac, "control"))
    assert list(dict.fromkeys(tokens(receiver))) == ["control"]


# --- anti-spoofing of a pod's IP and MAC -----------------------------------------------


def gateway_mac(cluster: Cluster, pod: str, node: str) -> str:
    """The MAC ``pod`` resolves its gateway to (the next hop of its cross-node frames)."""
    ns, gw = cluster.pod_ns(pod), str(gateway(cluster, node))
    netns.run(ns, ["ping", "-c", "1", "-W", "2", gw], timeout=10)
    entries = json.loads(netns.run(ns, ["ip", "-j", "neigh", "show", gw], timeout=10).stdout)
    mac = next((e.get("lladdr") for e in entries if e.get("lladdr")), None)
    assert mac, f"{pod} has no neighbour entry for its gateway {gw}: {entries}"
    return str(mac)


def test_a_pod_forging_another_pods_ip_reaches_nobody(cluster: Cluster) -> None:
    """The victim's IP opens the policy; forged by the attacker (with its own MAC or the
    victim's too) it must not, on the attacker's node or across the tunnel."""
    test_policy_denies_the_attacker_and_lets_the_victim_in(cluster)
    attacker, victim = cluster.pod_ns("attacker"), cluster.pod_ns("victim")
    victim_ip = cluster.pod_ip("victim")
    own_mac, victim_mac = pod_mac(cluster.pod_ip("attacker")), pod_mac(victim_ip)
    for target, node in (("target1", "node1"), ("target2", "node2")):
        ip = cluster.pod_ip(target)
        # on its own node the attacker addresses the target's MAC; across, the gateway's
        to_mac = pod_mac(ip) if node == "node1" else gateway_mac(cluster, "attacker", "node1")
        receiver = Receiver(cluster.pod_ns(target), TARGET_PORT, stop="control")
        for src_mac, token in ((own_mac, "forged-ip"), (victim_mac, "forged-ip-and-mac")):
            frame = spoof.Frame("eth0", to_mac, src_mac, victim_ip, ip, TARGET_PORT, token)
            spoof.inject(attacker, frame)
        time.sleep(LATE)
        # The control: the victim's own frame, sent the same raw way (the policy admits it).
        via = gateway_mac(cluster, "victim", "node3")
        real = spoof.Frame("eth0", via, victim_mac, victim_ip, ip, TARGET_PORT, "control")
        spoof.inject(victim, real)
        seen = [line.split(" ", 1) for line in receiver.lines()]
        assert seen == [[str(victim_ip), "control"]], f"{target}: only the victim's frame"


def test_a_pod_forging_another_pods_mac_reaches_nobody(cluster: Cluster) -> None:
    """The attacker's own IP behind another pod's MAC, to the victim (which no policy
    isolates), is dropped; the same frame with the attacker's own MAC arrives."""
    attacker, own_ip = cluster.pod_ns("attacker"), cluster.pod_ip("attacker")
    victim_ip = cluster.pod_ip("victim")
    via = gateway_mac(cluster, "attacker", "node1")
    for forged in (pod_mac(cluster.pod_ip("target1")), pod_mac(victim_ip)):
        receiver = Receiver(cluster.pod_ns("victim"), TARGET_PORT, stop="control")
        frame = spoof.Frame("eth0", via, forged, own_ip, victim_ip, TARGET_PORT, "forged-mac")
        spoof.inject(attacker, frame)
        time.sleep(LATE)
        own = pod_mac(own_ip)
        spoof.inject(
            attacker, spoof.Frame("eth0", via, own, own_ip, victim_ip, TARGET_PORT, "control")
        )
        seen = [line.split(" ", 1) for line in receiver.lines()]
        assert seen == [[str(own_ip), "control"]], f"{forged}: only the genuine frame"


def test_cross_node_pod_traffic_still_flows(cluster: Cluster) -> None:
    victim = cluster.pod_ns("victim")
    assert udp_echo(victim, cluster.pod_ip("target2"))
    assert udp_echo(victim, cluster.pod_ip("target1"))
    assert udp_echo(cluster.pod_ns("target2"), cluster.pod_ip("attacker")), "attacker is open"


# --- finding 7: pods are sandboxed ------------------------------------------------------

PROBE = """
import json, os, socket, sys
found = {}
for path in sys.argv[1:]:
    try:
        if path.endswith(".sock"):
            s = socket.socket(socket.AF_UNIX); s.settimeout(3); s.connect(path); s.close()
        else:
            open(path, "rb").read(1)
        found[path] = "ok"
    except OSError as exc:
        found[path] = type(exc).__name__
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "found": found}))
"""


def secrets(cluster: Cluster) -> list[Path]:
    """podnet's secret files and sockets, as the host sees them (each exists)."""
    master = cluster.state_dir / "master"
    found = [p for p in master.rglob("*") if p.is_file()]
    for node in ("node1", "node2"):
        paths = nodes.node_paths(cluster.state_dir, node)
        found += [paths.kubeconfig, paths.socket]
    found.append(cluster.state_dir / "state.json")
    assert all(p.exists() for p in found), found
    assert any(p.name.endswith(".key") for p in found), "the master's private keys"
    # tokens live hashed in etcd; the admin's is in its kubeconfig
    assert any(p.name == "admin.kubeconfig" for p in found), "the master's admin kubeconfig"
    return found


def look_from(cluster: Cluster, pod: str, paths: list[Path]) -> dict[str, Any]:
    done = pods.exec_pod(
        cluster.state_dir, pod, [sys.executable, "-c", PROBE, *map(str, paths)], NS, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_pods_cannot_read_secrets_or_call_cni_sockets(cluster: Cluster) -> None:
    paths = secrets(cluster)
    seen = look_from(cluster, "attacker", paths)
    reached = [path for path, how in seen["found"].items() if how == "ok"]
    assert reached == [], f"a pod reached {reached}"


def test_pods_run_unprivileged_by_default(cluster: Cluster) -> None:
    seen = look_from(cluster, "attacker", [])
    assert seen["uid"] != 0 and seen["gid"] != 0
    done = pods.exec_pod(cluster.state_dir, "attacker", ["id", "-u"], NS)
    assert done.returncode == 0 and done.stdout.strip() != "0"
    process = cluster.state.pods[f"{NS}/attacker"].process
    assert process is not None
    status = Path(f"/proc/{process.pid}/status").read_text()
    uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
    assert uid != "0", "the pod's own process (the echo server) is not root either"


def test_a_privileged_pod_is_root_but_still_sees_no_secrets(cluster: Cluster) -> None:
    pods.run_pod(cluster.state_dir, "admin", NS, "node1", {"role": "admin"}, privileged=True)
    try:
        seen = look_from(cluster, "admin", secrets(cluster))
        assert seen["uid"] == 0
        assert [p for p, how in seen["found"].items() if how == "ok"] == []
    finally:
        pods.delete_pod(cluster.state_dir, "admin", NS)


def test_unprivileged_echo_still_serves_low_ports(cluster: Cluster) -> None:
    pods.run_pod(
        cluster.state_dir, "web", NS, "node2", {"role": "web"}, ports=[("http", 80, "TCP")]
    )
    try:
        state = ClusterState.load(cluster.state_dir)
        assert state is not None
        ip = IPv4Address(state.pods[f"{NS}/web"].ip)
        assert udp_echo(cluster.pod_ns("victim"), ip, 80)
        done = pods.exec_pod(cluster.state_dir, "web", ["ping", "-c", "1", "-W", "2", str(ip)], NS)
        assert done.returncode == 0, f"ping works unprivileged: {done.stderr}"
    finally:
        pods.delete_pod(cluster.state_dir, "web", NS)
