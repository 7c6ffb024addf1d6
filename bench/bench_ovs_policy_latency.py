"""NetworkPolicy change → flows installed on a real OVS node, at 5,000 pods / 1,000 policies.

Run (root): .venv/bin/python bench/bench_ovs_policy_latency.py [--pods 5000] [--nodes 50]
            [--policies 1000] [--changes 60]

One node of a lab (``podnet.testing.lab``: an underlay, the node in a namespace of its
own, removed afterwards) runs ``OvsDataPlane`` (its own ovsdb-server and ovs-vswitchd,
userspace datapath) with ``--pods / --nodes`` local pods attached through the plane
(real pod namespaces and veths). The API objects are ``bench_policy``'s (pods in 50
namespaces and 20 apps, policies allowing ingress to one app from the next on a port and
on the named port ``http``, a third also limiting egress), fed to the agent's
incremental compiler (``PolicyCompiler``) as the agent's watches would.

Each change edits one policy's port (policies taken round-robin, so most changes touch
rules of the node's pods and some touch none), then times, as the agent does:
``rules()`` (the incremental compile) and ``sync_policy`` (render, diff by group, one
bundle to ovs-vswitchd, which returns once the switch holds the flows; the time inside
``ovs-ofctl`` is shown apart). Printed: p50 and p99 of each and of their sum (goal: p99
< 100 ms), the bundles' size, the first full install, and, in the
same run, the floor: a bare one-flow bundle through the same runner (ratios to it).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench_ovs_flows import namespaces
from bench_ovs_flows import pods as spread_pods
from bench_policy import percentile, policy_object
from podnet import netns
from podnet.dataplane.ovs.backend import OvsDataPlane
from podnet.dataplane.ovs.daemons import stop_instance
from podnet.model.network import NETWORKPOLICY
from podnet.policy.incremental import PolicyCompiler
from podnet.policy.slim import NAMESPACES, PODS, POLICIES
from podnet.testing.lab import built_lab

LAB_NODE = 1
BASE_PORT = 8000


def api_pods(count: int, nodes: int, node_name: str) -> list[dict[str, Any]]:
    """``bench_ovs_flows``'s spread; its node0 (10.128.0.10...) is the lab's node."""
    found = spread_pods(count, nodes)
    for obj in found:
        if obj["spec"]["nodeName"] == "node0":
            obj["spec"]["nodeName"] = node_name
    return found


def stats(values: list[float]) -> str:
    return (f"p50 {percentile(values, 50):6.1f} ms  p99 {percentile(values, 99):6.1f} ms  "
            f"max {max(values):6.1f} ms")  # fmt: skip


async def bench(args: argparse.Namespace) -> None:
    base = Path(tempfile.mkdtemp(prefix="bopl-", dir="/tmp"))
    async with built_lab("bopl", nodes=1) as lab:
        node = lab.network(LAB_NODE)
        with netns.entered(lab.node_ns(LAB_NODE)):
            plane = OvsDataPlane(base / "ovs")
        try:
            await run(args, lab, node, plane)
        finally:
            await plane.close()
            stop_instance(base / "ovs", remove=True)
            shutil.rmtree(base, ignore_errors=True)


async def run(args: argparse.Namespace, lab: Any, node: Any, plane: OvsDataPlane) -> None:
    start = time.perf_counter()
    await plane.setup_node(node)
    local = args.pods // args.nodes
    for i in range(local):
        _, pod = lab.pod(LAB_NODE, 10 + i, f"p{i}")
        await plane.attach_pod(pod)
    print(f"node set up, {local} pods attached: {time.perf_counter() - start:.1f} s")

    compiler = PolicyCompiler(NETWORKPOLICY)
    compiler.replace(PODS, api_pods(args.pods, args.nodes, node.node_name))
    compiler.replace(NAMESPACES, namespaces())
    compiler.replace(
        POLICIES, [policy_object(j, BASE_PORT + j % 100) for j in range(args.policies)]
    )
    compiler.set_node_addresses([(node.node_name, str(node.node_ip)),
                                 (node.node_name, str(node.gateway.ip))])  # fmt: skip
    start = time.perf_counter()
    rules = compiler.rules()
    compiled = time.perf_counter() - start
    start = time.perf_counter()
    await plane.sync_policy(node, rules)
    first = time.perf_counter() - start
    flows = len((await plane.runner.dump_flows("br0")).splitlines())
    gc.freeze()  # as the agent does once its first rules are applied (agent/policies.py)
    print(f"{args.pods} pods, {args.policies} policies: full compile {compiled * 1000:.0f} ms, "
          f"first install {first * 1000:.0f} ms, {flows} flows on br0")  # fmt: skip

    bundles: list[str] = []
    in_ofctl: list[float] = []  # seconds in ovs-ofctl per bundle
    send = plane.runner.bundle

    async def counted(bridge: str, text: str) -> None:
        bundles.append(text)
        start = time.perf_counter()
        await send(bridge, text)
        in_ofctl.append(time.perf_counter() - start)

    plane.runner.bundle = counted  # type: ignore[method-assign]  # FlowSync calls it
    compile_ms, sync_ms, total_ms, ofctl_ms = [], [], [], []
    for k in range(args.changes):
        j = (k * 37) % args.policies  # round-robin over policies, spread over apps
        changed = policy_object(j, BASE_PORT + 200 + k)
        start = time.perf_counter()
        compiler.put(POLICIES, changed)
        rules = compiler.rules()
        mid = time.perf_counter()
        before = len(in_ofctl)
        await plane.sync_policy(node, rules)
        end = time.perf_counter()
        ofctl_ms.append(sum(in_ofctl[before:]) * 1000)
        compile_ms.append((mid - start) * 1000)
        sync_ms.append((end - mid) * 1000)
        total_ms.append((end - start) * 1000)

    plane.runner.bundle = send  # type: ignore[method-assign]
    sent = len(bundles)
    lines = sum(text.count("\n") for text in bundles)
    floor = []
    for k in range(args.changes):
        cookie = f"0x7e0000000000{k:04x}"  # a table no packet reaches
        line = f"cookie={cookie},table=250,priority=1,ip,nw_dst=192.0.2.{k % 250} actions=drop"
        start = time.perf_counter()
        await plane.runner.bundle("br0", f"add {line}\n")
        floor.append((time.perf_counter() - start) * 1000)
        await plane.runner.bundle("br0", f"delete cookie={cookie}/-1\n")
    base = statistics.median(floor)
    print(f"one policy changed, {args.changes} changes: {sent} bundles sent "
          f"({lines} lines: deletes by cookie and adds)")  # fmt: skip
    print(f"  incremental compile   {stats(compile_ms)}")
    print(f"  sync_policy           {stats(sync_ms)}")
    print(f"    of which ovs-ofctl  {stats(ofctl_ms)}  (the rest: render and diff in the agent)")
    p99 = percentile(total_ms, 99)
    verdict = "meets" if p99 < 100 else "MISSES"
    print(f"  change -> installed   {stats(total_ms)}  ({verdict} the 100 ms goal)")
    print(f"  floor: a bare one-flow bundle, p50 {base:.1f} ms; change -> installed p50 is "
          f"{statistics.median(total_ms) / base:.1f}x the floor")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--policies", type=int, default=1000)
    parser.add_argument("--changes", type=int, default=60)
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
