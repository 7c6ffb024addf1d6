"""The local cluster on the ovs data plane, for real: ``cluster status`` asks each node's
own OVS, ``cluster up`` after an agent crash adopts the running daemons (or starts the
one that died), and ``cluster down`` leaves no OVS process and no OVS file behind.

One 1-node cluster (etcd, master, a real agent whose OVS runs in the node namespace),
torn down in a finalizer even when a test fails.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from podnet import netns
from podnet.cluster import lifecycle, nodes
from podnet.cluster.ovsnodes import node_ovs_base, release_stray_instance, running
from podnet.cluster.ovsstatus import flow_count, node_dataplane_status
from podnet.dataplane.ovs.instance import OVSDB_SERVER, VSWITCHD
from podnet.testing import planeview
from podnet.testing.e2e import load_state
from podnet.testing.ovsnode import ovs_node

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(600)]


def _status(state_dir: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "podnet", "cluster", "status", "--state-dir", str(state_dir)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def _exited(pidfd: int) -> bool:
    """Whether the process behind ``pidfd`` has exited (waits up to 10 s for it)."""
    return bool(select.select([pidfd], [], [], 10)[0])


def _kill(pid: int) -> None:
    """SIGKILL a daemon of ours by PID (through a pidfd) and wait until it is gone."""
    pidfd = os.pidfd_open(pid)
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        assert _exited(pidfd), f"pid {pid} survived SIGKILL"
    finally:
        os.close(pidfd)


def test_status_crash_restart_and_down_leave_nothing() -> None:
    state_dir = Path(tempfile.mkdtemp(prefix="pnc-", dir="/tmp")) / "c"  # short: OVS sockets
    spec = lifecycle.ClusterSpec(nodes=1, dataplane="ovs")
    base = node_ovs_base(state_dir, "node1")
    daemons: dict[int, bytes] = {}
    namespaces: list[str] = []
    try:
        lifecycle.cluster_up(state_dir, spec, say=print)
        state = load_state(state_dir)
        namespaces = list(state.namespaces)
        first = running(base)
        assert set(first) == {OVSDB_SERVER, VSWITCHD}
        version = subprocess.run(
            ["ovs-vswitchd", "--version"], capture_output=True, text=True, check=True
        ).stdout.split()[3]

        # status: the version vswitchd reports and br0's flows, as ovs-ofctl counts them
        plane = node_dataplane_status(state_dir, "ovs", "node1")
        flows = planeview.br0_flows(state_dir, "node1")
        assert plane.healthy and plane.version == version, plane
        assert plane.flows == flow_count(flows) > 20, plane
        shown = _status(state_dir)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert f"data plane: ovs {version}, br0 {plane.flows} flows" in shown.stdout

        # an agent crash: the daemons live on; `cluster up` starts the agent, which
        # adopts them (same PIDs) and changes no flow
        node = state.nodes["node1"]
        nodes.stop_agent(node, signal.SIGKILL, timeout=5)
        assert running(base) == first
        lifecycle.cluster_up(state_dir, spec, say=print)
        assert running(base) == first
        assert planeview.br0_flows(state_dir, "node1") == flows

        # agent and vswitchd dead: status says so (exit 1); `cluster up` brings both back
        state = load_state(state_dir)
        nodes.stop_agent(state.nodes["node1"], signal.SIGKILL, timeout=5)
        _kill(first[VSWITCHD])
        assert node_dataplane_status(state_dir, "ovs", "node1").problem == "ovs-vswitchd DOWN"
        shown = _status(state_dir)
        assert shown.returncode == 1
        assert "data plane: ovs ovs-vswitchd DOWN (ovsdb-server pid" in shown.stdout
        lifecycle.cluster_up(state_dir, spec, say=print)
        again = running(base)
        assert again[OVSDB_SERVER] == first[OVSDB_SERVER]
        assert again[VSWITCHD] != first[VSWITCHD]
        assert planeview.br0_flows(state_dir, "node1") == flows
        assert node_dataplane_status(state_dir, "ovs", "node1").healthy

        # down: both daemons ended by PID, their files and the namespaces gone
        state = load_state(state_dir)
        daemons = planeview.switch_pids(state_dir, state)
        assert sorted(daemons) == sorted(again.values())
    finally:
        lifecycle.cluster_down(state_dir, say=print)
    assert not planeview.switches_left(daemons), "OVS daemons left"
    assert not base.exists() and not state_dir.exists()
    state_dir.parent.rmdir()
    assert namespaces and not [name for name in namespaces if netns.exists(name)]


def test_a_state_dir_too_long_for_ovs_sockets_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    state_dir = tmp_path / ("x" * 60)
    with pytest.raises(lifecycle.ClusterError, match="longer than 107 bytes"):
        lifecycle.cluster_up(state_dir, lifecycle.ClusterSpec(nodes=2, dataplane="ovs"))
    assert not (state_dir / "state.json").exists()  # nothing recorded, so nothing started


def test_an_instance_outside_the_node_namespace_is_stopped_not_adopted() -> None:
    """Daemons running in another namespace than the node's (the node's was removed and
    made again) are stopped and their files removed, so the agent starts fresh ones."""

    async def scenario() -> None:
        async with ovs_node("pnstray") as switch:
            said: list[str] = []
            pids = running(switch.base)
            assert len(pids) == 2
            assert not release_stray_instance(switch.base, switch.ns, said.append)
            assert running(switch.base) == pids and said == []
            pidfds = [os.pidfd_open(pid) for pid in pids.values()]
            try:
                other = f"{switch.ns}-new"  # never created: like a namespace made again
                assert release_stray_instance(switch.base, other, said.append)
                assert all(_exited(pidfd) for pidfd in pidfds)
            finally:
                for pidfd in pidfds:
                    os.close(pidfd)
            assert running(switch.base) == {} and not switch.base.exists()
            assert len(said) == 1 and "stopped" in said[0]

    asyncio.run(scenario())
