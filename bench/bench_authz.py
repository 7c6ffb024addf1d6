"""Authorization per second with many nodes: ``podnet.api.authorizer.authorize`` on what
5,000 agents send while registering (read their HostSubnet, renew their Lease, write
their Node's status), the nodes taking turns as they do against one master.

Run: .venv/bin/python bench/bench_authz.py [--nodes 5000] [--rounds 20] [--runs 5]

Prints requests authorized per second (process CPU time, median of ``--runs``). Issue 9
(scalebench): the node rules were an LRU cache of 4,096 entries keyed by node name, so
with 5,000 nodes taking turns every request built them again; they are now built once
for all nodes, indexed by (verb, group, resource).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from podnet.api.authorizer import RequestAttributes, authorize
from podnet.api.identity import NODES_GROUP, User, node_user
from podnet.model.kinds import HOST_SUBNET, LEASE, NODE
from podnet.model.schemas_coordination import NODE_LEASE_NAMESPACE


def requests_of(node: str) -> list[RequestAttributes]:
    """What one agent asks while it registers and heartbeats."""
    node_obj: dict[str, Any] = {"metadata": {"name": node}, "status": {}}
    lease: dict[str, Any] = {"metadata": {"name": node, "namespace": NODE_LEASE_NAMESPACE}}
    return [
        RequestAttributes("get", HOST_SUBNET, None, node, None, None, None),
        RequestAttributes("watch", HOST_SUBNET, None, None, None, None, None),
        RequestAttributes("get", LEASE, NODE_LEASE_NAMESPACE, node, None, None, None),
        RequestAttributes("update", LEASE, NODE_LEASE_NAMESPACE, node, None, lease, lease),
        RequestAttributes("update", NODE, None, node, "status", node_obj, node_obj),
    ]


def one_run(work: list[tuple[User, RequestAttributes]], rounds: int) -> float:
    """Requests authorized per CPU second."""
    start = time.process_time()
    for _ in range(rounds):
        for user, attrs in work:
            if authorize(user, attrs) is not None:
                raise AssertionError(f"{user.name} denied {attrs}")
    return rounds * len(work) / (time.process_time() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    names = [f"node-{i:05d}" for i in range(args.nodes)]
    users = {name: User(node_user(name), (NODES_GROUP,)) for name in names}
    # Round-robin over the nodes, request by request, as a registration storm arrives.
    per_node = {name: requests_of(name) for name in names}
    work = [(users[n], per_node[n][k]) for k in range(5) for n in names]
    rates = [one_run(work, args.rounds) for _ in range(args.runs)]
    print(
        f"authorize: {statistics.median(rates):,.0f} requests/s (CPU), {args.nodes} nodes "
        f"taking turns, median of {args.runs} (min {min(rates):,.0f}, max {max(rates):,.0f})"
    )


if __name__ == "__main__":
    main()
