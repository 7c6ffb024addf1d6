"""FlowSync and the ovs-ofctl runner against a real ovs-vswitchd (userspace datapath).

Packets injected with ``packet-out`` (through the table) raise flow counters, so a flow
that was rewritten (counters reset) is told apart from one left alone.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
from collections.abc import AsyncIterator

import pytest

from podnet.dataplane.interface import DataPlaneError, DataPlaneRejected
from podnet.dataplane.ovs import tables
from podnet.dataplane.ovs.daemons import VSWITCHD, running_pid
from podnet.dataplane.ovs.flow import Flow, Kind, cookie
from podnet.dataplane.ovs.flowsync import FlowSync, note_flow
from podnet.testing.ovsnode import OvsNode, ovs_node

pytestmark = [pytest.mark.root]
GROUPS = 20


@pytest.fixture
async def node() -> AsyncIterator[OvsNode]:
    async with ovs_node("ovf") as the_node:
        yield the_node


def pod_flows(i: int, vnid: int = 0) -> list[Flow]:
    """Pod ``i``'s group: its traffic counted in table 0, its delivery in table 70."""
    key = cookie(Kind.POD, f"pod{i}")
    return [
        Flow(0, 100, f"ip,nw_src=10.0.0.{i + 1}", f"load:{vnid}->NXM_NX_REG0[],goto_table:70", key),
        Flow(tables.LOCAL, 100, f"ip,nw_src=10.0.0.{i + 1}", "drop", key),
    ]


def desired(changed: int = -1, note: bytes = b"\x01") -> list[Flow]:
    flows = [Flow(0, 0, "", "drop", cookie(Kind.NODE, "node")), note_flow(note)]
    for i in range(GROUPS):
        flows += pod_flows(i, vnid=7 if i == changed else 0)
    return flows


def ofctl(node: OvsNode, *args: str) -> str:
    return subprocess.run(
        ["ovs-ofctl", "-O", "OpenFlow13", *args],
        env=node.daemons.paths.env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout


def send_packets(node: OvsNode) -> None:
    """One IPv4 packet from each pod address through the flow table."""
    for i in range(GROUPS):
        header = f"450000140001000040000000{0x0A000001 + i:08x}0a000002"  # src 10.0.0.i+1
        packet = f"ffffffffffff0200000000010800{header}"  # broadcast, from 02:..:01, IPv4
        ofctl(node, "packet-out", "br0", f"in_port=controller packet={packet} actions=table")


def counters(node: OvsNode) -> dict[str, int]:
    """n_packets per flow (its cookie, table and match)."""
    found = {}
    for line in ofctl(node, "--no-names", "dump-flows", "br0").splitlines()[1:]:
        packets = re.search(r"n_packets=(\d+)", line)
        assert packets is not None, line
        key = re.sub(r"duration=[^,]*, |n_packets=\d+, |n_bytes=\d+, ", "", line).strip()
        found[key] = int(packets.group(1))
    return found


async def test_apply_then_a_restarted_agent_changes_nothing(node: OvsNode) -> None:
    assert (await FlowSync(node.runner).sync(desired())).mode == "replace"
    send_packets(node)
    dump, before = await node.runner.dump_flows("br0"), counters(node)
    assert len(dump.splitlines()) == 2 + 2 * GROUPS
    assert sum(before.values()) == 2 * GROUPS  # each packet counted in table 0 and 70
    again = FlowSync(node.runner)  # the agent restarted
    assert (await again.sync(desired())).mode == "replace"
    assert await node.runner.dump_flows("br0") == dump, "byte-identical"
    assert counters(node) == before, "no flow was rewritten"
    assert (await again.sync(desired())).mode == "none"
    assert await again.note_ok(desired())


async def test_a_group_change_touches_only_that_group(node: OvsNode) -> None:
    sync = FlowSync(node.runner)
    await sync.sync(desired())
    send_packets(node)
    before = counters(node)
    result = await sync.sync(desired(changed=3))
    assert (result.mode, result.groups) == ("bundle", 1)
    after = counters(node)
    changed_cookie = f"cookie={cookie(Kind.POD, 'pod3'):#x},"
    assert {k: v for k, v in after.items() if changed_cookie not in k} == {
        k: v for k, v in before.items() if changed_cookie not in k
    }
    mine = [k for k in after if changed_cookie in k]
    assert len(mine) == 2 and any("load:0x7->NXM_NX_REG0[]" in k for k in mine)
    assert all(after[k] == 0 for k in mine), "the changed group was rewritten"


async def test_a_refused_flow_changes_nothing(node: OvsNode) -> None:
    sync = FlowSync(node.runner)
    await sync.sync(desired())
    dump = await node.runner.dump_flows("br0")
    bad = [*desired(changed=2), Flow(5, 1, "ip", "group:99", cookie(Kind.POD, "bad"))]
    with pytest.raises(DataPlaneRejected, match="OFPBAC_BAD_OUT_GROUP"):
        await sync.sync(bad)
    assert await node.runner.dump_flows("br0") == dump, "the bundle was rolled back whole"
    with pytest.raises(DataPlaneRejected, match="unknown action"):
        await node.runner.bundle("br0", "add table=0,priority=1,ip actions=bogus\n")
    assert await node.runner.dump_flows("br0") == dump


async def test_flows_come_back_after_vswitchd_is_killed(node: OvsNode) -> None:
    sync = FlowSync(node.runner)
    await sync.sync(desired())
    dump = await node.runner.dump_flows("br0")
    restarted: asyncio.Queue[str] = asyncio.Queue()

    async def reprogram(daemon: str) -> None:
        sync.forget()
        await sync.sync(desired())
        await restarted.put(daemon)

    supervisor = asyncio.create_task(node.daemons.supervise(reprogram))
    try:
        pid = running_pid(node.daemons.paths, VSWITCHD)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        assert await asyncio.wait_for(restarted.get(), 10) == VSWITCHD
        assert await node.runner.dump_flows("br0") == dump
    finally:
        supervisor.cancel()
        with pytest.raises(asyncio.CancelledError):
            await supervisor


async def test_a_switch_that_is_away_is_a_transient_error(node: OvsNode) -> None:
    await node.daemons.stop()
    with pytest.raises(DataPlaneError) as caught:
        await node.runner.replace_flows("br0", "")
    assert not isinstance(caught.value, DataPlaneRejected)
    with pytest.raises(DataPlaneError, match="cannot reach"):
        await node.runner.appctl("ofproto/trace", "br0", "ip")


async def test_appctl_traces_and_refuses_unknown_commands(node: OvsNode) -> None:
    await FlowSync(node.runner).sync(desired())
    trace = await node.runner.appctl("ofproto/trace", "br0", "in_port=1,ip,nw_src=10.0.0.1")
    assert "goto_table:70" in trace and "Datapath actions: drop" in trace
    with pytest.raises(DataPlaneRejected, match="not a valid command"):
        await node.runner.appctl("no/such-command")
