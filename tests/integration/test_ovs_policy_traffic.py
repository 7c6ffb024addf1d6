"""NetworkPolicy on the ovs data plane, three ways: real packets, ``ofproto/trace`` and
``evaluate`` must agree for every pair of pods, port and protocol.

Two lab nodes (``podnet.testing.lab``: namespaces of this run only, removed also on
failure), each with its own OVS (``OvsDataPlane``: userspace datapath, VXLAN between the
nodes) and two pods serving TCP and UDP echo on ports 80 and 81. Each case compiles a
rule set (named ports, an ipBlock with an except, a port range, ingress and egress,
deny-all) and applies it with ``sync_policy``. Then every ordered pair is probed from
inside the pods (a fresh source port each time: a new connection, whose replies must get
back through conntrack), traced with ``oftrace.ovs_verdict`` on the nodes it crosses,
and judged by ``evaluate``. A pod that passes egress but not the peer's ingress on the
same node stays blocked on every retransmission (the probe's TCP connect retries).
"""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

import pytest

from podnet import netns
from podnet.dataplane.interface import NodeNetwork
from podnet.dataplane.ovs.backend import OvsDataPlane
from podnet.dataplane.ovs.daemons import stop_instance
from podnet.dataplane.ovs.oftrace import TracedNode, ovs_verdict
from podnet.model.network import NETWORKPOLICY
from podnet.policy.compile import compile_rules
from podnet.policy.evaluate import evaluate
from podnet.policy.model import RuleSet
from podnet.testing.lab import Lab, built_lab
from podnet.testing.netpol import policy, sel
from podnet.testing.probe import SourcePorts, probe_pairs

pytestmark = [pytest.mark.root]

Obj = dict[str, Any]
PODS = {"x/a": (1, 10), "y/a": (1, 11), "x/b": (2, 10), "y/b": (2, 11)}  # node, host part
SERVICES = [("tcp", 80), ("tcp", 81), ("udp", 80), ("udp", 81)]
SOURCE_PORTS = SourcePorts(start=random.randint(10000, 32767))


@dataclass
class OvsCluster:
    lab: Lab
    planes: dict[int, OvsDataPlane] = field(default_factory=dict)
    netns_of: dict[str, str] = field(default_factory=dict)
    ip_of: dict[str, IPv4Address] = field(default_factory=dict)
    traced: list[TracedNode] = field(default_factory=list)
    servers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def base(self, i: int) -> Path:
        return Path("/tmp") / f"{self.lab.run}-o{i}"  # short: unix socket paths

    def rules(
        self, policies: list[Obj], labels: dict[str, dict[str, str]] | None = None
    ) -> RuleSet:
        pods = []
        for key, (node, _) in PODS.items():
            ns, name = key.split("/")
            ports = [{"name": f"serve-{port}-{proto}", "containerPort": port,
                      "protocol": proto.upper()} for proto, port in SERVICES]  # fmt: skip
            pods.append({
                "metadata": {"namespace": ns, "name": name,
                             "labels": (labels or {}).get(key, {"pod": name})},
                "spec": {"nodeName": f"node-{node}", "containers": [{"name": "c", "ports": ports}]},
                "status": {"phase": "Running", "podIP": str(self.ip_of[key])},
            })  # fmt: skip
        spaces = [{"metadata": {"name": n, "labels": {"ns": n}}} for n in ("x", "y")]
        addresses = [(f"node-{i}", str(a)) for i in (1, 2)
                     for a in (self.lab.node_ip(i), self.lab.network(i).gateway.ip)]  # fmt: skip
        return compile_rules(NETWORKPOLICY, pods, spaces, [], policies, node_addresses=addresses)

    async def check(self, rules: RuleSet) -> dict[tuple[str, str, str, int], bool]:
        """Apply ``rules``; assert packets, traces and evaluate agree; the verdicts."""
        for i, plane in self.planes.items():
            await plane.sync_policy(network(self.lab, i), rules)
        real = probe_pairs(self.netns_of, self.ip_of, SERVICES, SOURCE_PORTS)
        wrong, verdicts = [], {}
        for (src, dst, proto, port), passed in sorted(real.items()):
            a, b = self.ip_of[src], self.ip_of[dst]
            want = evaluate(rules, a, b, proto.upper(), port).allowed
            traced = await ovs_verdict(self.traced, a, b, proto.upper(), port)
            verdicts[(src, dst, proto, port)] = want
            if not passed == traced.allowed == want:
                steps = [f"{n}: {s}" for n, t in traced.traces for s in t.steps if s.table >= 20]
                wrong.append(f"{src}->{dst} {proto}/{port}: packet {passed}, trace "
                             f"{traced.allowed}, evaluate {want}: " + "; ".join(steps))  # fmt: skip
        assert not wrong, "\n".join(wrong)
        return verdicts


def network(lab: Lab, i: int) -> NodeNetwork:
    return lab.network(i, isolation=True)


@pytest.fixture
async def cluster() -> AsyncIterator[OvsCluster]:
    async with built_lab("pnv", nodes=2) as lab:
        the = OvsCluster(lab)
        try:
            for i in (1, 2):
                with netns.entered(lab.node_ns(i)):
                    the.planes[i] = OvsDataPlane(the.base(i))
                await the.planes[i].setup_node(network(lab, i))
            for i in (1, 2):
                await the.planes[i].sync_remote_nodes(network(lab, i), [lab.remote(3 - i)])
            pods: dict[int, dict[IPv4Address, tuple[int, str]]] = {1: {}, 2: {}}
            for key, (node, host) in PODS.items():
                ns, pod = lab.pod(node, host, key.replace("/", "-"))
                attached = await the.planes[node].attach_pod(pod)
                ofport = await the.planes[node].ports.ofport(attached.host_ifname)
                pods[node][pod.address.ip] = (ofport, attached.mac)
                the.netns_of[key], the.ip_of[key] = ns, pod.address.ip
                argv = [sys.executable, "-m", "podnet.cluster.echo", "--port", "80", "--port", "81"]
                the.servers.append(
                    subprocess.Popen(netns.command(ns, argv), stdout=subprocess.DEVNULL)
                )
            the.traced = [
                TracedNode(f"node-{i}", the.planes[i].runner, lab.node_ip(i), pods[i])
                for i in (1, 2)
            ]
            for key in PODS:  # the echo servers are up (bounded wait): no policy, all pass
                assert any(reaches_all(the, key) for _ in range(20)), key
            yield the
        finally:
            for server in the.servers:
                server.terminate()
                server.wait(timeout=10)
            for plane in the.planes.values():
                await plane.close()
            for i in (1, 2):
                stop_instance(the.base(i), remove=True)
                shutil.rmtree(the.base(i), ignore_errors=True)


def reaches_all(cluster: OvsCluster, src: str) -> bool:
    """Whether ``src`` reaches every other pod on TCP 81."""
    targets = [(str(cluster.ip_of[dst]), "tcp", 81) for dst in PODS if dst != src]
    argv = [sys.executable, "-m", "podnet.testing.probe", json.dumps(targets)]
    done = netns.run(cluster.netns_of[src], argv, timeout=30)
    return done.returncode == 0 and all(json.loads(done.stdout))


async def test_packets_traces_and_evaluate_agree(cluster: OvsCluster) -> None:
    assert all((await cluster.check(cluster.rules([]))).values())

    y_b = cluster.ip_of["y/b"]
    deny_x = policy("x", "deny-all", {}, types=["Ingress"])
    named = policy("y", "from-x-b", sel(pod="a"), ingress=[{
        "from": [{"namespaceSelector": sel(ns="x"), "podSelector": sel(pod="b")}],
        "ports": [{"port": "serve-81-udp", "protocol": "UDP"}, {"port": 80}]}])  # fmt: skip
    tcp_80_81 = {"port": 80, "endPort": 81, "protocol": "TCP"}
    egress_range = policy("y", "egress-80-81", sel(pod="b"), types=["Egress"],
                          egress=[{"ports": [tcp_80_81]}])  # fmt: skip
    block = policy("x", "from-block", sel(pod="a"), ingress=[
        {"from": [{"ipBlock": {"cidr": "10.128.0.0/14", "except": [f"{y_b}/32"]}}]}])  # fmt: skip
    every = [deny_x, named, egress_range, block]
    verdicts = await cluster.check(cluster.rules(every))
    assert verdicts[("y/a", "x/a", "tcp", 80)] and not verdicts[("y/b", "x/a", "tcp", 80)]
    assert verdicts[("x/b", "y/a", "udp", 81)] and not verdicts[("x/b", "y/a", "udp", 80)]
    assert not verdicts[("y/a", "x/b", "tcp", 80)]  # deny-all in x
    assert verdicts[("x/b", "y/b", "tcp", 80)]  # y/b egress-isolated, its replies pass
    assert not verdicts[("y/b", "x/b", "udp", 80)]  # not TCP: y/b's egress drops it
    assert not verdicts[("x/a", "y/a", "tcp", 80)]  # one node: egress passes, ingress not

    await cluster.check(cluster.rules(every, {"y/a": {"pod": "b"}}))  # y/a loses "from-x-b"
    assert all((await cluster.check(cluster.rules([]))).values())


async def cached_from(cluster: OvsCluster, node: int, key: str) -> set[str]:
    """The ufids of the flows ``node``'s datapath caches for IPv4 packets from ``key``."""
    dump = await cluster.planes[node].runner.appctl("dpctl/dump-flows", "-m")
    source = re.compile(rf"ipv4\(src={re.escape(str(cluster.ip_of[key]))}[,/)]")
    return {line.split(",", 1)[0] for line in dump.splitlines() if source.search(line)}


def udp_reaches(cluster: OvsCluster, src: str, dst: str, port: int) -> bool:
    """One UDP echo probe from ``src`` to ``dst`` (a fresh source port)."""
    target = [[str(cluster.ip_of[dst]), "udp", port, SOURCE_PORTS.take()]]
    argv = [sys.executable, "-m", "podnet.testing.probe", json.dumps(target)]
    done = netns.run(cluster.netns_of[src], argv, timeout=30)
    assert done.returncode == 0, done.stderr
    return bool(json.loads(done.stdout) == [True])


async def test_no_cached_verdict_outlives_a_policy_change(cluster: OvsCluster) -> None:
    """x/a may send only TCP to x/b, so its UDP/81 datagrams are dropped, and the datapath
    caches that drop (with the port in its match, from the port rule). Then x/a may send
    anything: once ``sync_policy`` returns, none of the flows cached before is left (a
    kept one would answer the next datagram with the old drop until the revalidators get
    to it), and the next datagram passes."""

    async def apply(policies: list[Obj]) -> None:
        rules = cluster.rules(policies)
        for i, plane in cluster.planes.items():
            await plane.sync_policy(network(cluster.lab, i), rules)

    tcp_only = [{"to": [{"podSelector": sel(pod="b")}], "ports": [{"port": 81}]}]
    await apply([policy("x", "egress", sel(pod="a"), types=["Egress"], egress=tcp_only)])
    assert not udp_reaches(cluster, "x/a", "x/b", 81)
    before = await cached_from(cluster, 1, "x/a")
    assert before, "the dropped datagrams left no flow in the datapath"

    await apply([policy("x", "egress", sel(pod="a"), types=["Egress"], egress=[{}])])
    assert not before & await cached_from(cluster, 1, "x/a")
    assert udp_reaches(cluster, "x/a", "x/b", 81)
