"""``podnet.dataplane.ovs.ovsdb`` against a real private ovsdb-server and ovs-vswitchd.

Bridges with their settings, ports of each type with the ofport they asked for, ports
that cannot be added (removed again, a clear error), external_ids, a reconnect after the
server restarts, and two nodes' connections in one process kept apart.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import AsyncIterator

import pytest

from podnet.dataplane.interface import DataPlaneError, DataPlaneRejected
from podnet.dataplane.ovs.daemons import OVSDB_SERVER, running_pid
from podnet.testing.lab import ip
from podnet.testing.ovsnode import OvsNode, ovs_node

pytestmark = [pytest.mark.root]


@pytest.fixture
async def node() -> AsyncIterator[OvsNode]:
    async with ovs_node("ovb") as the_node:
        yield the_node


def vsctl(node: OvsNode, *args: str) -> str:
    """What ``ovs-vsctl`` (a second opinion) reads from the node's database."""
    db = f"--db=unix:{node.daemons.paths.db_socket}"
    return subprocess.run(
        ["ovs-vsctl", db, *args], capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()


async def test_bridge_settings_and_external_ids(node: OvsNode) -> None:
    await node.db.ensure_bridge("br0", node.daemons.datapath, {"hwaddr": "0a:58:0a:80:00:01"})
    await node.db.ensure_bridge("br0", node.daemons.datapath)  # again: nothing breaks
    assert vsctl(node, "get", "Bridge", "br0", "fail_mode") == "secure"
    assert vsctl(node, "get", "Bridge", "br0", "protocols") == "[OpenFlow13]"
    assert vsctl(node, "get", "Bridge", "br0", "datapath_type") == node.daemons.datapath
    assert vsctl(node, "get", "Bridge", "br0", "other_config:disable-in-band") == '"true"'
    assert vsctl(node, "get", "Bridge", "br0", "other_config:hwaddr") == '"0a:58:0a:80:00:01"'
    assert await node.db.bridge_external_ids("br0") == {}
    await node.db.set_bridge_external_ids("br0", {"podnet-version": "1"})
    await node.db.set_bridge_external_ids("br0", {"podnet-node": "n1"})
    assert await node.db.bridge_external_ids("br0") == {"podnet-version": "1", "podnet-node": "n1"}
    assert await node.db.bridge_external_ids("nosuch") is None
    with pytest.raises(DataPlaneRejected, match="nosuch"):
        await node.db.set_bridge_external_ids("nosuch", {"a": "b"})


async def test_ports_of_each_type_get_their_ofport(node: OvsNode) -> None:
    ip(node.ns, "link add vpod1 type veth peer name vpod1p")
    assert await node.db.add_port("br0", "vxlan0", type="vxlan", ofport=1,
                                  options={"remote_ip": "flow", "key": "flow"}) == 1  # fmt: skip
    assert await node.db.add_port("br0", "tun0", type="internal", ofport=2) == 2
    assert await node.db.add_port("br0", "vpod1", ofport=3, external_ids={"pod": "a/b"}) == 3
    ports = {p.name: p for p in await node.db.ports("br0")}
    assert sorted(ports) == ["tun0", "vpod1", "vxlan0"]
    assert ports["vxlan0"].options == {"remote_ip": "flow", "key": "flow"}
    assert ports["vpod1"].external_ids == {"pod": "a/b"} and ports["vpod1"].error is None
    assert ports["tun0"].type == "internal"
    # the same port again, changed: brought up to date, same number
    assert await node.db.add_port("br0", "vpod1", ofport=3, external_ids={"pod": "a/c"}) == 3
    assert vsctl(node, "get", "Interface", "vpod1", "external_ids:pod") == '"a/c"'
    await node.db.delete_port("br0", "vpod1")
    await node.db.delete_port("br0", "vpod1")  # gone already: fine
    assert [p.name for p in await node.db.ports("br0")] == ["tun0", "vxlan0"]


async def test_interface_columns_are_set(node: OvsNode) -> None:
    await node.db.add_port("br0", "tun0", type="internal", ofport=2)
    await node.db.set_interface("tun0", mtu_request=1400, external_ids={"role": "gateway"})
    assert vsctl(node, "get", "Interface", "tun0", "mtu_request") == "1400"
    assert vsctl(node, "get", "Interface", "tun0", "external_ids:role") == "gateway"
    assert "mtu 1400" in ip(node.ns, "link show tun0")
    with pytest.raises(DataPlaneRejected, match="nosuch"):
        await node.db.set_interface("nosuch", mtu_request=1400)


async def test_a_port_without_a_device_is_an_error_and_removed(node: OvsNode) -> None:
    with pytest.raises(DataPlaneError, match=r"cannot open port nodev.*No such device"):
        await node.db.add_port("br0", "nodev", ofport=5)
    assert await node.db.port("nodev") is None
    assert "nodev" not in vsctl(node, "list-ports", "br0")


async def test_a_taken_ofport_is_rejected_and_the_port_removed(node: OvsNode) -> None:
    ip(node.ns, "link add vpa type veth peer name vpb")
    await node.db.add_port("br0", "vpa", ofport=3)
    with pytest.raises(DataPlaneRejected, match="asked for ofport 3 but got"):
        await node.db.add_port("br0", "vpb", ofport=3)
    assert [p.name for p in await node.db.ports("br0")] == ["vpa"]


async def test_the_connection_survives_an_ovsdb_server_restart(node: OvsNode) -> None:
    pid = running_pid(node.daemons.paths, OVSDB_SERVER)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    while running_pid(node.daemons.paths, OVSDB_SERVER) == pid:
        await asyncio.sleep(0.01)
    await node.daemons.start()  # ovsdb-server again (what the supervisor does)
    for _ in range(100):  # the connection reconnects on its own backoff
        try:
            await node.db.set_bridge_external_ids("br0", {"after": "restart"})
            break
        except DataPlaneError:
            await asyncio.sleep(0.1)
    assert vsctl(node, "get", "Bridge", "br0", "external_ids:after") == "restart"


async def test_two_nodes_in_one_process_keep_their_connections_apart(node: OvsNode) -> None:
    async with ovs_node("ovb2") as other:
        await other.db.set_bridge_external_ids("br0", {"node": "two"})
        await node.db.set_bridge_external_ids("br0", {"node": "one"})
        assert vsctl(other, "get", "Bridge", "br0", "external_ids:node") == "two"
        assert vsctl(node, "get", "Bridge", "br0", "external_ids:node") == "one"
