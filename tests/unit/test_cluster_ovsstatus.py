"""cluster status's data plane line and the OVS pieces of the local cluster, without OVS."""

from __future__ import annotations

from pathlib import Path

from podnet.cluster.ovsnodes import node_ovs_base, running, stop_ovs
from podnet.cluster.ovsstatus import (
    DataPlaneStatus,
    flow_count,
    node_dataplane_status,
    ovs_status,
    vswitchd_version,
)
from podnet.cluster.state import ClusterState, NodeRecord
from podnet.dataplane import registry

DUMP = """\
 cookie=0x1, priority=100,ip actions=goto_table:20
 cookie=0x1, table=20, priority=0 actions=drop
 cookie=0x7fe3b0c44298fc1c, table=253, priority=0 actions=note:70.6f.64
"""


def test_flow_count_counts_flows_only() -> None:
    assert flow_count(DUMP) == 3
    assert flow_count("OFPST_FLOW reply (OF1.3) (xid=0x2):\n" + DUMP + "\n") == 3
    assert flow_count("") == 0


def test_version_is_the_last_word_of_the_reply() -> None:
    assert vswitchd_version("ovs-vswitchd (Open vSwitch) 3.1.0\n") == "3.1.0"
    assert vswitchd_version("") == "?"


def test_status_lines() -> None:
    assert DataPlaneStatus("linux").text() == "linux"
    pids = {"ovsdb-server": 10, "ovs-vswitchd": 11}
    good = DataPlaneStatus("ovs", pids, "3.1.0", 42)
    assert good.healthy
    assert good.text() == "ovs 3.1.0, br0 42 flows (ovsdb-server pid 10, ovs-vswitchd pid 11)"
    down = DataPlaneStatus("ovs", {"ovsdb-server": 10}, problem="ovs-vswitchd DOWN")
    assert not down.healthy
    assert down.text() == "ovs ovs-vswitchd DOWN (ovsdb-server pid 10)"


def test_a_node_without_daemons_is_down(tmp_path: Path) -> None:
    status = ovs_status(tmp_path / "ovs")
    assert status.problem == "ovsdb-server and ovs-vswitchd DOWN"
    assert status.text() == "ovs ovsdb-server and ovs-vswitchd DOWN"
    assert node_dataplane_status(tmp_path, "linux", "node1") == DataPlaneStatus("linux")
    assert not node_dataplane_status(tmp_path, "ovs", "node1").healthy


def test_a_pidfile_of_another_process_is_not_a_daemon(tmp_path: Path) -> None:
    """A recycled PID in a pidfile (here: this test's own) is neither shown nor stopped."""
    base = node_ovs_base(tmp_path, "node1")
    (base / "run").mkdir(parents=True)
    for daemon in ("ovsdb-server", "ovs-vswitchd"):
        (base / "run" / f"{daemon}.pid").write_text(f"{Path('/proc/self').resolve().name}\n")
    assert running(base) == {}
    said: list[str] = []
    state = ClusterState(nodes={"node1": NodeRecord("node1", 1, "pn-x-node1", "192.0.2.1")})
    assert stop_ovs(state, tmp_path, said.append) == []
    assert not base.exists() and said == [f"removed {base}"]


def test_the_instance_is_where_the_factory_puts_it(tmp_path: Path) -> None:
    agent_dir = tmp_path / "nodes" / "node2" / "agent"
    assert node_ovs_base(tmp_path, "node2") == registry.ovs_base(agent_dir) == agent_dir / "ovs"


def test_dns_binds_to_the_device_of_the_gateway() -> None:
    assert registry.implementation("linux").gateway_device == "br0"
    assert registry.implementation("ovs").gateway_device == "tun0"
