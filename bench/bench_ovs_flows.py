"""NetworkPolicy as OpenFlow at scale: flows of one node as policies grow, against
OpenShift SDN's per-pair rendering of the same objects, and the time to render them.

Run: .venv/bin/python bench/bench_ovs_flows.py [--pods 5000] [--nodes 50]
     [--policies 250 500 750 1000]

The objects are ``bench_policy``'s (pods in 50 namespaces and 20 apps, 5 teams, spread
evenly over the nodes; policies allowing ingress to one app from the next app in a
team's namespaces on a port and on the named port ``http``, a third of them also
limiting egress to an ipBlock with an except), twice: each policy with a port of its
own, so no two rules share a conjunction (every policy costs its own flows), and with
ports from a set of 100, as in ``bench_policy``. Compiled once per size with
``compile_rules``; for node 0 (``--pods`` / ``--nodes`` local pods) it prints, per
policy count:

- the flows of tables 21 and 80 (``policyflows``) and the conjunction actions they hold
  (a flow shared by many conjunctions lists each of them), the flow text size;
- OpenShift SDN's count for the same objects: its networkpolicy plugin writes, per rule,
  one flow per (local target pod, peer) pair and port (a peer being a pod IP or an
  ipBlock network), so per rule |local targets| x |peers| x |ports|;
- the render time from scratch, wall and CPU (median of 5; the compile is not counted);
- ``change``: CPU ms of ``policy_groups`` after one policy's port changed, through the
  node's kept state, as the agent renders (median of 6).

Installing a change on a real switch through the data plane: ``bench_ovs_policy_latency``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench_policy import APPS, NAMESPACES, TEAMS, pod_object, policy_object
from podnet.dataplane.ovs.flow import Flow
from podnet.dataplane.ovs.networkpolicy import NetworkPolicyFlows
from podnet.dataplane.ovs.policyflows import LocalView, policy_flows, policy_groups
from podnet.model.network import NETWORKPOLICY
from podnet.policy.compile import compile_rules
from podnet.policy.model import RuleSet

NODE = "node0"


def pods(count: int, nodes: int) -> list[dict[str, Any]]:
    """``count // nodes`` pods per node, node k's at 10.<128 + k // 256>.<k % 256>.<10 + i>:
    every node holds pods of every namespace and app, as a scheduler spreads them."""
    per_node = count // nodes
    found = []
    for i in range(count):
        node, slot = divmod(i, per_node)
        ip = f"10.{128 + node // 256}.{node % 256}.{10 + slot}"
        found.append(pod_object(i, f"node{node}", ip))
    return found


def namespaces() -> list[dict[str, Any]]:
    return [
        {"metadata": {"name": f"ns{k}", "labels": {"team": f"t{k % TEAMS}"}}}
        for k in range(NAMESPACES)
    ]


def ruleset(
    pod_objs: list[dict[str, Any]], policies: int, port_of: Callable[[int], int]
) -> RuleSet:
    objs = [policy_object(j, port_of(j)) for j in range(policies)]
    return compile_rules(NETWORKPOLICY, pod_objs, namespaces(), [], objs,
                         node_addresses=[(NODE, "10.0.0.1")])  # fmt: skip


def view(rules: RuleSet) -> LocalView:
    local = [e.ip for e in rules.endpoints if e.node == NODE]
    return LocalView(NODE, {ip: 3 + i for i, ip in enumerate(local)}, rules.resident(NODE))


def openshift_flows(rules: RuleSet, local: frozenset[IPv4Address]) -> int:
    """Per rule: local targets x peers x ports, as OpenShift SDN renders NetworkPolicy."""
    total = 0
    for rule in rules.rules:
        targets = rule.targets & local
        if not targets:
            continue
        isolated = rules.egress_isolated if rule.direction == "egress" else rules.ingress_isolated
        targets &= isolated
        peers = 1 if rule.peers.every_address else len(rule.peers.pods) + len(rule.peers.blocks)
        ports = 1 if rule.ports.every_packet else len(rule.ports.ranges) + len(rule.ports.named)
        total += len(targets) * peers * ports
    return total


def conjunction_actions(flows: list[Flow]) -> int:
    return sum(f.actions.count("conjunction(") for f in flows)


def median_ms(work: Callable[[], object], runs: int = 5) -> tuple[float, float]:
    """Median wall and CPU time of ``work``, in ms (CPU: the machine may be busy)."""
    wall, cpu = [], []
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), time.process_time()
        work()
        wall.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
    return statistics.median(wall), statistics.median(cpu)


def table(pod_objs: list[dict[str, Any]], counts: list[int], port_of: Callable[[int], int]) -> None:
    print(f"{'policies':>8} {'rules':>6} {'flows':>7} {'conj acts':>10} {'text KB':>8} "
          f"{'openshift':>10} {'ratio':>7} {'render ms':>10} {'cpu ms':>7} "
          f"{'change':>7}")  # fmt: skip
    for count in counts:
        rules = ruleset(pod_objs, count, port_of)
        here = view(rules)
        flows = policy_flows(here, rules)
        pairs = openshift_flows(rules, frozenset(here.pods))
        text = sum(len(f.text()) + 1 for f in flows)
        ms, cpu = median_ms(lambda: NetworkPolicyFlows(here, rules).flows())  # noqa: B023
        change = change_cpu_ms(pod_objs, count, port_of, rules)
        actions, ratio = conjunction_actions(flows), pairs / len(flows)
        print(f"{count:8d} {len(rules.rules):6d} {len(flows):7d} {actions:10d} {text / 1024:8.0f} "
              f"{pairs:10d} {ratio:7.1f} {ms:10.1f} {cpu:7.1f} {change:7.1f}")  # fmt: skip


def change_cpu_ms(
    pod_objs: list[dict[str, Any]], count: int, port_of: Callable[[int], int], rules: RuleSet
) -> float:
    """Median CPU ms of ``policy_groups`` after one policy's port changed, rendering the
    two rule sets in turn through the node's kept state (as an agent renders)."""
    changed = ruleset(pod_objs, count, lambda j: port_of(j) if j else 9999)
    here = view(rules)
    policy_groups(here, rules)
    times = []
    for _ in range(3):
        for now in (changed, rules):
            start = time.process_time()
            policy_groups(here, now)
            times.append((time.process_time() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for option, default in (("--pods", 5000), ("--nodes", 50)):
        parser.add_argument(option, type=int, default=default)
    counts = [250, 500, 750, 1000]
    parser.add_argument("--policies", type=int, nargs="+", default=counts)
    args = parser.parse_args()
    pod_objs = pods(args.pods, args.nodes)
    print(f"{args.pods} pods on {args.nodes} nodes, {NAMESPACES} namespaces, {APPS} apps; "
          f"node {NODE}'s tables 21 and 80")  # fmt: skip
    print("each policy a port of its own (no two rules share a conjunction):")
    table(pod_objs, args.policies, lambda j: 8000 + j)
    print("ports from a set of 100 (rules with equal peers and ports share one):")
    table(pod_objs, args.policies, lambda j: 8000 + j % 100)


if __name__ == "__main__":
    main()
