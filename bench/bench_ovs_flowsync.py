"""FlowSync on a real ovs-vswitchd (userspace datapath): how long a sync takes at scale.

Run (root): .venv/bin/python bench/bench_ovs_flowsync.py [--flows 10000] [--runs 20]

One private OVS in a throwaway namespace (``podnet.testing.ovsnode``), ``--flows`` flows
in groups of 10 (a pod's worth), plus the node's group and the note. Measured, each
``--runs`` times: a fresh replace of the whole table, a restarted agent's resync that
finds the right flows (the issue's goal: < 2 s), a one-group change (one bundle), a sync
with nothing to change, a dump, and (up to 5 times) SIGKILL of ovs-vswitchd until the
supervisor has restarted it and the flows are back. Prints median and max in ms;
everything is removed afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import time
from collections.abc import Awaitable

from podnet.dataplane.ovs import tables
from podnet.dataplane.ovs.daemons import VSWITCHD, running_pid
from podnet.dataplane.ovs.flow import Flow, Kind, cookie
from podnet.dataplane.ovs.flowsync import FlowSync, note_flow
from podnet.testing.ovsnode import OvsNode, ovs_node

PER_GROUP = 10


def desired(flows: int, vnid_of_first: int = 0) -> list[Flow]:
    out = [Flow(tables.CLASSIFY, 0, "", "drop", cookie(Kind.NODE, "node")), note_flow(b"\x01")]
    for g in range(flows // PER_GROUP):
        key, vnid = cookie(Kind.POD, f"pod{g}"), vnid_of_first if g == 0 else g
        for i in range(PER_GROUP):
            address = f"10.{g // 250}.{g % 250}.{i + 1}"
            out.append(
                Flow(tables.POD_IN, 100 + i, f"ip,in_port={3 + g},nw_src={address}",
                     f"load:{vnid}->NXM_NX_REG0[],goto_table:{tables.EGRESS_POLICY}", key)
            )  # fmt: skip
    return out


async def timed(step: Awaitable[object]) -> float:
    start = time.perf_counter()  # a coroutine does nothing until awaited
    await step
    return (time.perf_counter() - start) * 1000


async def vswitchd_restart(node: OvsNode, table: list[Flow]) -> float:
    """From SIGKILL of ovs-vswitchd to its flows programmed again, through the
    supervisor (pidfd) and a FlowSync that forgets and replaces."""
    sync = FlowSync(node.runner)
    await sync.sync(table)
    back: asyncio.Queue[float] = asyncio.Queue()

    async def reprogram(_daemon: str) -> None:
        sync.forget()
        await sync.sync(table)
        await back.put(time.perf_counter())

    supervisor = asyncio.create_task(node.daemons.supervise(reprogram))
    await asyncio.sleep(0.1)  # let it open its pidfds
    pid = running_pid(node.daemons.paths, VSWITCHD)
    assert pid is not None
    killed = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    done = await asyncio.wait_for(back.get(), 30)
    supervisor.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await supervisor
    return (done - killed) * 1000


async def main(flows: int, runs: int) -> None:
    table, changed = desired(flows), desired(flows, vnid_of_first=99)
    results: dict[str, list[float]] = {}
    async with ovs_node("ovbench") as node:
        for _ in range(runs):
            await node.runner.replace_flows("br0", "")
            sync = FlowSync(node.runner)
            results.setdefault("fresh replace", []).append(await timed(sync.sync(table)))
            restarted = FlowSync(node.runner)
            results.setdefault("restart resync, nothing to change", []).append(
                await timed(restarted.sync(table))
            )
            results.setdefault("one-group change (bundle)", []).append(
                await timed(restarted.sync(changed))
            )
            results.setdefault("nothing changed", []).append(await timed(restarted.sync(changed)))
            results.setdefault("dump-flows", []).append(await timed(node.runner.dump_flows("br0")))
        count = len((await node.runner.dump_flows("br0")).splitlines())
        results["vswitchd SIGKILL -> flows back"] = [
            await vswitchd_restart(node, table) for _ in range(min(runs, 5))
        ]
    print(f"{count} flows on br0 ({node.daemons.datapath} datapath), {runs} runs, ms")
    for name, values in results.items():
        print(f"  {name:36} median {statistics.median(values):8.1f}   max {max(values):8.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flows", type=int, default=10000)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main(args.flows, args.runs))
