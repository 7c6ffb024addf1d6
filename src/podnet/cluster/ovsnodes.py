"""The nodes' Open vSwitch instances, as the local cluster sees them from outside.

An agent running the ``ovs`` data plane starts its node's ``ovsdb-server`` and
``ovs-vswitchd`` under ``<state dir>/nodes/<name>/agent/ovs`` and leaves them running
when it exits, so that a restarted agent adopts them and traffic never stops. The
cluster therefore owns their end: ``cluster down`` stops them by the PID of their
pidfiles (checked to be this instance's daemon, see ``podnet.dataplane.ovs.instance``)
and removes their database, sockets and logs, before the namespaces go.

``cluster up`` after a crash starts the agents again, and they adopt the daemons. The
one case where adopting would be wrong is a node namespace that was removed and created
again: its daemons would still run in the old, unnamed namespace. They are stopped and
their files removed first (``release_stray``), so the agent starts a fresh instance in
the node's namespace.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

from podnet import netns
from podnet.cluster.nodes import node_paths
from podnet.cluster.state import ClusterState
from podnet.dataplane.ovs.instance import DAEMONS, OvsPaths, running_pid, stop_instance
from podnet.dataplane.registry import ovs_base

Say = Callable[[str], None]


def node_ovs_base(state_dir: Path, node: str) -> Path:
    """Where the agent of ``node`` keeps its OVS instance (as the registry's factory)."""
    return ovs_base(node_paths(state_dir, node).agent_dir)


def check_ovs_paths(state_dir: Path, nodes: int) -> None:
    """OvsUnavailable unless the OVS sockets of nodes 1..``nodes`` fit a unix socket path
    (the agents would fail one by one otherwise)."""
    OvsPaths(node_ovs_base(state_dir, f"node{nodes}").absolute()).check()


def running(base: Path) -> dict[str, int]:
    """The instance's daemons that run, by name: their PIDs."""
    paths = OvsPaths(base)
    found = {daemon: running_pid(paths, daemon) for daemon in DAEMONS}
    return {daemon: pid for daemon, pid in found.items() if pid is not None}


def _node_names(state: ClusterState, state_dir: Path) -> Iterator[str]:
    """The recorded nodes, and any node directory the state lost track of."""
    names = set(state.nodes)
    folder = state_dir / "nodes"
    if folder.is_dir():
        names.update(entry.name for entry in folder.iterdir() if entry.is_dir())
    yield from sorted(names)


def stop_ovs(state: ClusterState, state_dir: Path, say: Say) -> list[int]:
    """Stop every node's OVS daemons by PID and remove their files; the PIDs stopped."""
    stopped: list[int] = []
    for name in _node_names(state, state_dir):
        base = node_ovs_base(state_dir, name)
        if not base.exists():
            continue
        pids = running(base)
        stop_instance(base, remove=True)
        for daemon, pid in pids.items():
            say(f"{name} {daemon} stopped (pid {pid})")
        stopped += pids.values()
        say(f"removed {base}")
    return stopped


def _netns_inode(target: Path) -> int | None:
    try:
        return os.stat(target).st_ino
    except OSError:
        return None


def release_strays(state: ClusterState, state_dir: Path, say: Say) -> None:
    """``release_stray`` for every recorded node of an ovs cluster (before the nodes'
    namespaces are ensured and their agents started)."""
    if state.dataplane == "ovs":
        for node in state.nodes.values():
            release_stray(state_dir, node.name, node.netns, say)


def release_stray(state_dir: Path, node: str, namespace: str, say: Say) -> bool:
    """Stop and remove ``node``'s OVS instance if its daemons run outside the node's
    namespace (it was removed and made again while they ran); True if it did."""
    return release_stray_instance(node_ovs_base(state_dir, node), namespace, say, node)


def release_stray_instance(base: Path, namespace: str, say: Say, node: str = "") -> bool:
    """``release_stray`` for the instance under ``base``."""
    pids = running(base)
    wanted = _netns_inode(netns.path(namespace))
    if not pids or all(
        _netns_inode(Path(f"/proc/{pid}/ns/net")) == wanted for pid in pids.values()
    ):
        return False
    stop_instance(base, remove=True)
    listed = ", ".join(f"{daemon} pid {pid}" for daemon, pid in pids.items())
    say(f"{node or base}: OVS ran outside {namespace} ({listed}): stopped, a fresh one will start")
    return True
